// Skinny matrix products with int8 weights for a draft model on the CPU:
//   y[m, n] = s_w[n] * sum_b s_x[m, b] * sum_{k in block b} qx[m, k] * qw[n, k]  (+ bias[n])
// qw: the weight quantized per output row (symmetric, scale s_w[n] = max|W[n, :]| / 127), stored
// offset by +128 as uint8; qx: each row of x quantized per block of 64 values at call time
// (scale s_x[m, b] = max|x[m, block]| / 127, round to nearest even). The block dots are exact
// integers: vpdpbusd multiplies the unsigned weight bytes by the signed activation bytes, and
// the +128 offset is taken back by starting each block's sum from -128 * the sum of its qx (an
// exact int32 computed with the quantization, gemv_quant.h).
//
// With AVX-512 VNNI the weight is stored packed 16 rows to a group (below) and every output
// has the bits of the specification, specrt.kernels.cpu.gemv_int8.reference_linear: per block
// the exact integer dot, converted to fp32, times s_x (rounded), added to the row's sum in block
// order (rounded), then times s_w and + bias. So each row's bits are independent of the rows
// beside it. Where the CPU also has AMX, passes of AMX_MIN_ROWS rows or more run on its tiles
// (gemv_int8_amx.cpp: the same integer dots and fp32 steps, so the same bits). CPUs without
// VNNI take gemv_int8_avx2.cpp (row-major weights, the same integer dots, their fp32 sums in
// another fixed order).
//
// Only the draft model runs this: its outputs decide which tokens are proposed, never which are
// emitted, so a quantized draft leaves greedy output identical and sampling exact.
#include "gemv_int8.h"
#include "gemv_int8_amx.h"
#include "gemv_int8_avx2.h"

#include <immintrin.h>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cpu_features.h"
#include "threads.h"
#include "gemv_quant.h"
#include "gemv_tiled.h"

namespace specrt {

namespace {

// The weight in groups of PACK_ROWS output rows (int8_packed_rows()): in a group, each 4
// consecutive k of its 16 rows side by side,
//   w[g][k / 4][r][k % 4] = W[16 g + r][k] + 128   (rows past N: 128, a zero weight),
// so one 64-byte vector holds 4 k of 16 rows, and vpdpbusd against 4 bytes of x broadcast adds a
// 4-term dot to each row's lane. The 16 vectors of a block of 64 k leave every lane with its
// row's exact integer block dot (started from the block's correction, -128 * the sum of its 64
// q), without a horizontal sum: one int -> fp32 conversion, multiply and add per 16 vpdpbusd,
// where the row-major layout (one row a vector, 16 lanes of 4 values) converted and scaled
// after every vpdpbusd. kernel_ab against it: 1.10-1.14x at 1-5 rows, 1.6x at 9, 2.1x at 17,
// 2.3x at 48, 3.0x at 252 (benchmarks/RESULTS.md, "Zen 5: int8 weights packed 16 rows to a
// group").
//
// G groups x MB rows of x a tile: G * MB integer and as many fp32 accumulators + G weight
// vectors of the 32 registers (2 x 6: 26).
constexpr int PACK_ROWS = 16;
constexpr int G_WIDE = 2, MB_WIDE = 6;   // passes of 2 or more rows of x

// The tile's outputs: rows m0 .. m0 + MB - 1 of out, columns n0 .. n0 + 16 G - 1 (those < N):
// each lane's sum x w_scale (+ bias), fp32 or bf16 (QuantStore's arithmetic, lane by lane).
template <int G, int MB>
SPECRT_AVX512 SPECRT_INLINE void store_groups(const QuantStore& s, int64_t m0, int64_t n0,
                                              const __m512 (&acc)[G * MB]) {
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g) {
    const int64_t c0 = n0 + PACK_ROWS * g;
    if (c0 >= s.N) break;
    const int nb = int(std::min<int64_t>(PACK_ROWS, s.N - c0));
    QuantLanes l;
    load_lanes(s, c0, nb, l);
#pragma GCC unroll 8
    for (int j = 0; j < MB; ++j)
      put_scaled(acc[g * MB + j], l.scale, l.bias, nb, s.out, s.out_f32, (m0 + j) * s.N + c0);
  }
}

// G groups (16 G output rows, w: the first group) against MB rows of x (all of K), stored. With
// PF, the next G groups (they follow in memory) are requested a line per group and k-step while
// these are read: a verify pass streams the weight once and is memory-bound enough to gain.
template <int G, int MB, bool PF>
SPECRT_AVX512_VNNI static void packed_tile(const QBlocks& x, const uint8_t* w,
                                           const QuantStore& s, int64_t m0, int64_t n0) {
  const int64_t K = x.K, group = PACK_ROWS * K, B = K / QBLOCK;
  __m512 acc[G * MB];
#pragma GCC unroll 16
  for (int a = 0; a < G * MB; ++a) acc[a] = _mm512_setzero_ps();
  for (int64_t b = 0; b < B; ++b) {
    __m512i dot[G * MB];
#pragma GCC unroll 8
    for (int j = 0; j < MB; ++j) {
      const __m512i c = _mm512_set1_epi32(x.corr[j * B + b]);
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g) dot[g * MB + j] = c;
    }
    const uint8_t* wb = w + b * QBLOCK * PACK_ROWS;
#pragma GCC unroll 16
    for (int k4 = 0; k4 < QBLOCK / 4; ++k4) {
      __m512i wv[G];
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g) {
        wv[g] = _mm512_loadu_si512(wb + g * group + 64 * k4);
        if (PF) __builtin_prefetch(wb + (G + g) * group + 64 * k4, 0, 2);
      }
#pragma GCC unroll 8
      for (int j = 0; j < MB; ++j) {
        int32_t four;
        std::memcpy(&four, x.q + j * K + b * QBLOCK + 4 * k4, 4);
        const __m512i xb = _mm512_set1_epi32(four);
#pragma GCC unroll 4
        for (int g = 0; g < G; ++g) dot[g * MB + j] = _mm512_dpbusd_epi32(dot[g * MB + j], wv[g], xb);
      }
    }
#pragma GCC unroll 8
    for (int j = 0; j < MB; ++j) {
      const __m512 sc = _mm512_set1_ps(x.scale[j * B + b]);
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g)        // a product and a sum, each rounded: the reference's
        acc[g * MB + j] = _mm512_add_ps(acc[g * MB + j],
                                        _mm512_mul_ps(_mm512_cvtepi32_ps(dot[g * MB + j]), sc));
    }
  }
  store_groups<G, MB>(s, m0, n0, acc);
}

// A decode step: one group at a time (a thread's groups are one run of memory), its 16 vpdpbusd
// a block in STEP_CHAINS interleaved integer sums (added at the block's end: exact, so the same
// bits as one chain), requesting the line STEP_AHEAD bytes ahead of each it reads. In the int8
// draft's decode step against the row-major build (interleaved processes, three runs): tiles of
// 4 groups requesting the next 4, as the wider passes do, 0.93-1.22x; this 1.10-1.47x
// (benchmarks/RESULTS.md). Groups handed out 8 at a time to whichever thread is free, instead
// of one run a thread: 0.93x (benchmarks.model_ab).
constexpr int STEP_CHAINS = 4, STEP_AHEAD = 1024;

SPECRT_AVX512_VNNI static void step_group(const QBlocks& x, const uint8_t* w, const QuantStore& s,
                                          int64_t n0) {
  const int64_t B = x.K / QBLOCK;
  __m512 acc[1] = {_mm512_setzero_ps()};
  for (int64_t b = 0; b < B; ++b) {
    __m512i dot[STEP_CHAINS];
    dot[0] = _mm512_set1_epi32(x.corr[b]);
#pragma GCC unroll 4
    for (int c = 1; c < STEP_CHAINS; ++c) dot[c] = _mm512_setzero_si512();
    const uint8_t* wb = w + b * QBLOCK * PACK_ROWS;
#pragma GCC unroll 16
    for (int k4 = 0; k4 < QBLOCK / 4; ++k4) {
      __builtin_prefetch(wb + 64 * k4 + STEP_AHEAD, 0, 2);
      int32_t four;
      std::memcpy(&four, x.q + b * QBLOCK + 4 * k4, 4);
      dot[k4 % STEP_CHAINS] = _mm512_dpbusd_epi32(dot[k4 % STEP_CHAINS],
                                                  _mm512_loadu_si512(wb + 64 * k4),
                                                  _mm512_set1_epi32(four));
    }
#pragma GCC unroll 4
    for (int c = 1; c < STEP_CHAINS; ++c) dot[0] = _mm512_add_epi32(dot[0], dot[c]);
    acc[0] = _mm512_add_ps(acc[0], _mm512_mul_ps(_mm512_cvtepi32_ps(dot[0]),
                                                 _mm512_set1_ps(x.scale[b])));
  }
  store_groups<1, 1>(s, 0, n0, acc);
}

using PackedTile = void (*)(const QBlocks&, const uint8_t*, const QuantStore&, int64_t, int64_t);
#define SPECRT_P_ROW(G, PF) packed_tile<G, 1, PF>, packed_tile<G, 2, PF>, packed_tile<G, 3, PF>, \
                            packed_tile<G, 4, PF>, packed_tile<G, 5, PF>, packed_tile<G, 6, PF>
// [requests the next tile][groups - 1][rows of x - 1]
static const PackedTile wide_tiles[2][G_WIDE][MB_WIDE] = {
    {{SPECRT_P_ROW(1, false)}, {SPECRT_P_ROW(2, false)}},
    {{SPECRT_P_ROW(1, true)}, {SPECRT_P_ROW(2, true)}}};
#undef SPECRT_P_ROW

// x quantized (quantize_row, gemv_quant.h) with its lane corrections summed per block; with
// rows > M, rows M .. rows - 1 are zeros (the AMX kernel reads whole tiles of 16 rows).
struct PackedX {
  QuantizedX qx;
  std::vector<int32_t> corr;   // [rows, K / 64]
  QBlocks view;
  PackedX(const void* x, bool x_f32, int64_t M, int64_t K, int64_t rows = 0)
      : qx(x, x_f32, M, K, 128, rows), corr(size_t(std::max(M, rows) * (K / QBLOCK))) {
    for (size_t b = 0; b < corr.size(); ++b) {
      int32_t sum = 0;
      for (int i = 0; i < QBLOCK / 4; ++i) sum += qx.corr[b * (QBLOCK / 4) + i];
      corr[b] = sum;
    }
    view = QBlocks{qx.q.data(), qx.scale.data(), corr.data(), K};
  }
};

// Passes of this many rows of x or more run on AMX tiles where the CPU has them
// (gemv_int8_amx.cpp; the same bits). kernel_ab against the VNNI tiles on a Xeon with AMX:
// 0.77x at 6 rows, 0.96 at 9, 1.02 at 12, 1.04 at 17, 1.14 at 20, 1.23 at 24, 1.31 at 50, 1.26 at
// 137 (benchmarks/RESULTS.md, "AMX for the int8 draft's prompt").
constexpr int64_t AMX_MIN_ROWS = 16;

// The packed product. A decode step: its groups in one run a thread (step_group). Wider passes:
// tiles of G_WIDE groups, each running every row tile of x (near-equal parts of at most MB_WIDE
// rows) while its 32 rows' weights sit in L1 or L2. Each output element is its row's blocks
// summed in order, so its bits do not depend on M, the tiling or the threads.
SPECRT_AVX512_VNNI static void gemv_int8_packed(const void* x, bool x_f32, const uint8_t* w,
                                                const QuantStore& s, int64_t M, int64_t N,
                                                int64_t K, int threads) {
  if (M >= AMX_MIN_ROWS && cpu_amx_int8()) {
    const PackedX px(x, x_f32, M, K, (M + 15) / 16 * 16);   // whole tiles of 16 rows
    return gemv_int8_amx(px.view, w, s, M, N, K, threads);
  }
  const PackedX px(x, x_f32, M, K);
  const int64_t groups = (N + PACK_ROWS - 1) / PACK_ROWS, group = PACK_ROWS * K;
  if (M == 1) {
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t g = 0; g < groups; ++g) step_group(px.view, w + g * group, s, g * PACK_ROWS);
    return;
  }
  const auto parts = near_equal_parts(M, MB_WIDE);
  const int64_t tiles = (groups + G_WIDE - 1) / G_WIDE;
  auto tile = [&](int64_t t, bool ahead) {
    const int64_t g0 = t * G_WIDE;
    const int g = int(std::min<int64_t>(G_WIDE, groups - g0));
    ahead = ahead && groups - g0 >= 2 * G_WIDE;            // a whole tile follows
    for (auto [m0, mb] : parts)      // the first row tile requests the next tile
      wide_tiles[ahead && m0 == 0][g - 1][mb - 1](px.view.rows(m0), w + g0 * group, s, m0,
                                                  g0 * PACK_ROWS);
  };
  if (M < M_DYNAMIC) {
    // A verify pass: memory-bound enough to want the next tile requested, so each thread
    // takes one run of tiles (its next tile is its own).
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t t = 0; t < tiles; ++t) tile(t, true);
  } else {
    // A prompt's pass: compute-bound, a tile at a time to whichever thread is free.
    #pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
    for (int64_t t = 0; t < tiles; ++t) tile(t, false);
  }
}

}  // namespace

bool cpu_supports_int8() { return cpu_avx512_vnni() || cpu_avx2(); }

int int8_packed_rows() { return cpu_avx512_vnni() ? PACK_ROWS : 0; }

int int8_amx_rows() { return cpu_amx_int8() ? int(AMX_MIN_ROWS) : 0; }

void gemv_int8(const void* x, bool x_f32, const uint8_t* w, const float* w_scale,
               const void* bias, void* out, bool out_f32, int64_t M, int64_t N, int64_t K,
               int threads) {
  threads = threads_for(M * N * K, threads);
  if (!cpu_avx512_vnni())
    return gemv_int8_avx2(x, x_f32, w, w_scale, bias, out, out_f32, M, N, K, threads);
  gemv_int8_packed(x, x_f32, w, QuantStore{w_scale, bias, x_f32, out, out_f32, N}, M, N, K,
                   threads);
}

}  // namespace specrt
