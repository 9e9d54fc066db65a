// The packed int8 product (gemv_int8.cpp) for passes of many rows of x on a CPU with AMX: a
// prompt's prefill through an int8 draft (or an int8 target), which is compute-bound.
//
// The weight's packed layout, 16 output rows a group with each 4 consecutive k of the 16 rows
// side by side, is the layout an AMX B tile of 16 rows x 64 bytes holds for TDPBSUD: one 64-k
// block of a group is one tile (1 KiB), and an A tile is 16 rows of x's bytes over the same
// block. One TDPBSUD leaves C[m][n] = the exact integer dot of x row m with weight row n over
// the block (int32; at most 64 x 127 x 255 in magnitude, so no order of its additions can
// round). Added to the block's correction (-128 x the sum of x's bytes, for the stored +128),
// converted to fp32, times the block's x scale (rounded), added to the row's sum in block order
// (rounded), times the row's weight scale, + bias: the arithmetic of the VNNI kernel and of the
// specification, specrt.kernels.cpu.gemv_int8.reference_linear, so the bits are the same.
//
// Each x tile is loaded once for two groups and each weight block once for two x tiles: four
// TDPBSUD a block, all eight tile registers. It is not the TMUL that bounds this but the tile
// loads and stores and the fp32 arithmetic per block the reference prescribes (in a loop over
// blocks in L1 / L2: ~30 ns a 16 x 16 x 64 block, ~37 with one TDPBSUD a block, ~5 for the
// TDPBSUD alone). kernel_ab against the VNNI tiles (the 0.5B draft's shapes, a Xeon with AMX):
// 1.23x at 24 rows, 1.31x at 50, 1.26x at 137 (benchmarks/RESULTS.md, "AMX for the int8 draft's
// prompt").
//
// Why: the int8 draft reads the whole prompt before its first guess (`auto` prices it), and a
// 50-token prompt cost it 0.73-0.75 of a target decode step on that Xeon.
#include "gemv_int8_amx.h"

#include <immintrin.h>
#include <algorithm>
#include <cstdint>

#include "cpu_features.h"
#include "gemv_quant.h"
#include "gemv_tiled.h"

namespace specrt {

#if SPECRT_HAS_AMX
namespace {

constexpr int TILE = 16;          // rows of x (and weight rows) a tile: the packed group

// The tile registers' shapes (palette 1), all 16 rows x 64 bytes: 0-3 the sums C (16 x 16
// int32), 4-5 x's bytes A, 6-7 weight blocks B.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
  TileConfig() {
    for (int t = 0; t < 8; ++t) colsb[t] = 64, rows[t] = TILE;
  }
};

// One block's dot tile (dots [16 x 16], x rows j of `x`) into the rows' fp32 sums acc [16 x
// 16]: + the block's correction, converted, times the block's x scale (rounded), added
// (rounded): the reference's arithmetic.
SPECRT_AVX512 SPECRT_INLINE void add_block(const int32_t* dots, const QBlocks& x, int64_t b,
                                           float* acc) {
  const int64_t B = x.K / QBLOCK;
#pragma GCC unroll 16
  for (int j = 0; j < TILE; ++j) {
    const __m512i dot = _mm512_add_epi32(_mm512_load_si512(dots + TILE * j),
                                         _mm512_set1_epi32(x.corr[j * B + b]));
    _mm512_store_ps(acc + TILE * j,
                    _mm512_add_ps(_mm512_load_ps(acc + TILE * j),
                                  _mm512_mul_ps(_mm512_cvtepi32_ps(dot),
                                                _mm512_set1_ps(x.scale[j * B + b]))));
  }
}

// G groups of weight rows (w: the first group's first block; G = 1, 2) against R tiles of 16
// rows of x (x: their first row; zero rows past M), all K, four TDPBSUD a block at most: each x
// tile is loaded once for both groups and each weight block once for both x tiles. Stores the
// rows < M. With `next`, the next_groups groups after these (the thread's next unit) are
// requested a block per block: a tile load waits for the TDPBSUD before it (the tile registers
// are not renamed), so without the request a weight's first read, from memory, went a block's
// 16 lines at a time (the int8 draft's 24-token prompt, one TDPBSUD a block: 46 ms without, 36
// with).
template <int R, int G>
SPECRT_AMX_INT8 static void amx_tile(const QBlocks& x, const uint8_t* w, int64_t group,
                                     const uint8_t* next, int next_groups, const QuantStore& s,
                                     int64_t m0, int64_t M, int64_t n0) {
  const int64_t B = x.K / QBLOCK;
  alignas(64) int32_t dots[R * G][TILE * TILE];
  alignas(64) float acc[R * G][TILE * TILE] = {};
  const QBlocks x1 = R > 1 ? x.rows(TILE) : x;     // the second tile of x
  for (int64_t b = 0; b < B; ++b) {
    if (next) {
#pragma GCC unroll 16
      for (int line = 0; line < next_groups * QBLOCK * TILE / 64; ++line)
        __builtin_prefetch(next + (line / 16) * group + b * QBLOCK * TILE + 64 * (line % 16), 0,
                           3);
    }
    _tile_zero(0);
    if (G > 1) _tile_zero(1);
    if (R > 1) _tile_zero(2);
    if (R > 1 && G > 1) _tile_zero(3);
    _tile_loadd(4, x.q + b * QBLOCK, x.K);
    if (R > 1) _tile_loadd(5, x1.q + b * QBLOCK, x.K);
    _tile_loadd(6, w + b * QBLOCK * TILE, 64);
    if (G > 1) _tile_loadd(7, w + group + b * QBLOCK * TILE, 64);
    _tile_dpbsud(0, 4, 6);
    if (G > 1) _tile_dpbsud(1, 4, 7);
    if (R > 1) _tile_dpbsud(2, 5, 6);
    if (R > 1 && G > 1) _tile_dpbsud(3, 5, 7);
    _tile_stored(0, dots[0], 64);
    if (G > 1) _tile_stored(1, dots[1], 64);
    if (R > 1) _tile_stored(2, dots[G], 64);
    if (R > 1 && G > 1) _tile_stored(3, dots[G + 1], 64);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
      for (int g = 0; g < G; ++g) add_block(dots[r * G + g], r ? x1 : x, b, acc[r * G + g]);
  }
  for (int g = 0; g < G; ++g) {
    const int64_t c0 = n0 + TILE * g;
    if (c0 >= s.N) break;
    const int nb = int(std::min<int64_t>(TILE, s.N - c0));
    QuantLanes l;
    load_lanes(s, c0, nb, l);
    for (int r = 0; r < R; ++r)
      for (int64_t j = 0; j < std::min<int64_t>(TILE, M - m0 - TILE * r); ++j)
        put_scaled(_mm512_load_ps(acc[r * G + g] + TILE * j), l.scale, l.bias, nb, s.out,
                   s.out_f32, (m0 + TILE * r + j) * s.N + c0);
  }
}

}  // namespace

SPECRT_AMX_INT8 void gemv_int8_amx(const QBlocks& x, const uint8_t* w, const QuantStore& s,
                                   int64_t M, int64_t N, int64_t K, int threads) {
  const int64_t groups = (N + TILE - 1) / TILE, group = TILE * K;
  const int64_t units = (groups + 1) / 2, row_tiles = (M + TILE - 1) / TILE;
  #pragma omp parallel num_threads(threads)
  {
    const TileConfig config;           // each thread's tile registers
    _tile_loadconfig(&config);
    // One run of units (two groups) a thread, so its next unit is known (every unit costs the
    // same, but for a last one of one group).
    #pragma omp for schedule(static)
    for (int64_t u = 0; u < units; ++u) {
      const int64_t g0 = 2 * u;
      const bool two = g0 + 1 < groups;
      const uint8_t* wu = w + g0 * group;
      const int next_groups = int(std::min<int64_t>(2, groups - g0 - 2));   // <= 0: none
      const uint8_t* next = next_groups > 0 ? wu + 2 * group : nullptr;
      for (int64_t t = 0; t < row_tiles; t += 2) {
        const uint8_t* ahead = t == 0 ? next : nullptr;
        const QBlocks xt = x.rows(t * TILE);
        const int64_t m0 = t * TILE, n0 = g0 * TILE;
        with_tiles(t + 1 < row_tiles, two, [&](auto r, auto g) {
          amx_tile<decltype(r)::value, decltype(g)::value>(xt, wu, group, ahead, next_groups, s,
                                                           m0, M, n0);
        });
      }
    }
    _tile_release();
  }
}
#else
// Never called: cpu_amx_int8() is false where the compiler cannot target AMX.
void gemv_int8_amx(const QBlocks&, const uint8_t*, const QuantStore&, int64_t, int64_t, int64_t,
                   int) {}
#endif

}  // namespace specrt
