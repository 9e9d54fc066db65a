// Skinny matrix products for CPU decode and verify: y[m, n] = sum_k x[m, k] * W[n, k] (+ b[n])
// for M = 1..~32 rows of x against a large row-major weight W [N, K].
//
// Decoding is memory-bound: every step streams all weights once. Library GEMMs pick small-M
// paths that reach about half the machine's read bandwidth here, and their result for a row
// depends on M. These kernels stream W once per call in tiles of 8 weight rows (each dotted
// with up to 3 rows of x at a time from registers), split N across threads, and accumulate every
// output element in the same k order whatever M is: a verify pass and a decode step give
// bit-identical values for the same row. Plain C++17 + AVX-512 intrinsics, selected at run time
// (cpu_supported); callers fall back to the library path elsewhere.
#include "gemv.h"

#include <immintrin.h>
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "cpu_features.h"

namespace specrt {

static inline float bf16_to_f32(uint16_t v) { uint32_t u = uint32_t(v) << 16; float f; std::memcpy(&f, &u, 4); return f; }
static inline uint16_t f32_to_bf16(float f) {  // round to nearest even
  uint32_t u; std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffff) > 0x7f800000) return uint16_t((u >> 16) | 0x40);
  u += 0x7fff + ((u >> 16) & 1);
  return uint16_t(u >> 16);
}


// One k-step of a register tile: NB rows of W against MB rows of x over one vector of k.
// Each output element (row j of x, row i of W) owns one accumulator whose lanes see k in the
// same order whatever NB and MB are, so a verify pass (M = K + 1) and a decode step (M = 1)
// give bit-identical results for the same row.
template <int NB, int MB>
SPECRT_AVX512 SPECRT_INLINE void step_bf16(const uint16_t* x, const uint16_t* w, int64_t K, int64_t k,
                                           __mmask32 mask, __m512 (&acc)[NB * MB]) {
  __m512bh xv[MB];
#pragma GCC unroll 8
  for (int j = 0; j < MB; ++j) xv[j] = (__m512bh)_mm512_maskz_loadu_epi16(mask, x + j * K + k);
#pragma GCC unroll 8
  for (int i = 0; i < NB; ++i) {
    __m512bh wv = (__m512bh)_mm512_maskz_loadu_epi16(mask, w + i * K + k);
#pragma GCC unroll 8
    for (int j = 0; j < MB; ++j) acc[i * MB + j] = _mm512_dpbf16_ps(acc[i * MB + j], xv[j], wv);
  }
}

template <int NB, int MB>
SPECRT_AVX512 SPECRT_INLINE void step_f32(const float* x, const float* w, int64_t K, int64_t k,
                                          __mmask16 mask, __m512 (&acc)[NB * MB]) {
  __m512 xv[MB];
#pragma GCC unroll 8
  for (int j = 0; j < MB; ++j) xv[j] = _mm512_maskz_loadu_ps(mask, x + j * K + k);
#pragma GCC unroll 8
  for (int i = 0; i < NB; ++i) {
    __m512 wv = _mm512_maskz_loadu_ps(mask, w + i * K + k);
#pragma GCC unroll 8
    for (int j = 0; j < MB; ++j) acc[i * MB + j] = _mm512_fmadd_ps(xv[j], wv, acc[i * MB + j]);
  }
}

// The product goes through K in blocks: for each tile of NB_MAX weight rows and each block of
// k, every row tile of x (up to MB_MAX rows: 24 accumulators, 3 x vectors and a weight vector
// fit the 32 vector registers) runs over the block while it sits in L1, so the weight is read
// from memory once whatever M is. Accumulators wait in memory between blocks; that leaves the
// order of every lane's sums, and so the bits, the same for every M. M is cut into near-equal
// row tiles (17 = 2 + 3 + 3 + 3 + 3 + 3) so that no tile is left with one row doing a load
// per product.
constexpr int NB_MAX = 8, MB_MAX = 3;

// While a block is multiplied from L1, the next block is requested a few cache lines per k-step
// into L2 (prefetcht2), spread over all the row tiles' passes. Without it memory sat idle during
// the products and a verify pass cost about memory time + compute time. Measured on the
// development machine over the 1.5B target's weights (bf16, 2 threads), each pair A/B in one
// process: 1 row 72 ms (75 with the former whole-K decode tiles), 2 rows 73 (92), 9 rows 114
// (143), 17 rows 185 (215), with the prefetch (without).
// A burst of requests at the start of a block, or requests into L1, stalled on the miss queue
// and measured no better or worse.
struct Prefetch {
  const char* base = nullptr;   // first byte of the next block's first row
  int64_t row_stride = 0;       // bytes between its rows
  int64_t lines_per_row = 1;
  int64_t line = 0, end = 0;    // this pass's share of the block's cache lines
  int64_t per_step = 0;
  inline void step() {
    for (int64_t e = std::min(line + per_step, end); line < e; ++line)
      __builtin_prefetch(base + (line / lines_per_row) * row_stride + (line % lines_per_row) * 64,
                         0, 1);
  }
};
template <typename T>
using Block = void (*)(const T*, const T*, int64_t, int64_t, int64_t, float*, Prefetch);

template <int NB, int MB>
SPECRT_AVX512 static void block_bf16(const uint16_t* x, const uint16_t* w, int64_t K, int64_t k0,
                                     int64_t k1, float* state /*[NB * MB][16]*/, Prefetch pf) {
  __m512 acc[NB * MB];
#pragma GCC unroll 32
  for (int a = 0; a < NB * MB; ++a) acc[a] = _mm512_loadu_ps(state + 16 * a);
  int64_t k = k0;
  for (; k + 32 <= k1; k += 32) { pf.step(); step_bf16<NB, MB>(x, w, K, k, 0xffffffffu, acc); }
  if (k < k1) step_bf16<NB, MB>(x, w, K, k, (1u << (k1 - k)) - 1, acc);
#pragma GCC unroll 32
  for (int a = 0; a < NB * MB; ++a) _mm512_storeu_ps(state + 16 * a, acc[a]);
}

template <int NB, int MB>
SPECRT_AVX512 static void block_f32(const float* x, const float* w, int64_t K, int64_t k0,
                                    int64_t k1, float* state, Prefetch pf) {
  __m512 acc[NB * MB];
#pragma GCC unroll 32
  for (int a = 0; a < NB * MB; ++a) acc[a] = _mm512_loadu_ps(state + 16 * a);
  int64_t k = k0;
  for (; k + 16 <= k1; k += 16) { pf.step(); step_f32<NB, MB>(x, w, K, k, 0xffff, acc); }
  if (k < k1) step_f32<NB, MB>(x, w, K, k, __mmask16((1u << (k1 - k)) - 1), acc);
#pragma GCC unroll 32
  for (int a = 0; a < NB * MB; ++a) _mm512_storeu_ps(state + 16 * a, acc[a]);
}

SPECRT_AVX512 static float reduce16(const float* v) { return _mm512_reduce_add_ps(_mm512_loadu_ps(v)); }

template <typename T, Block<T> (&Blocks)[NB_MAX][MB_MAX], int KB, typename Store>
static void gemv_tiled(const T* x, const T* w, int64_t M, int64_t N, int64_t K, int threads,
                       Store store) {
  int64_t n_tiles = (N + NB_MAX - 1) / NB_MAX;
  // Row tiles of x as (first row, rows): M cut into near-equal parts of at most MB_MAX.
  std::vector<std::pair<int64_t, int>> row_tiles;
  for (int64_t m0 = 0, left = (M + MB_MAX - 1) / MB_MAX; m0 < M; --left) {
    int mb = int((M - m0) / left);
    row_tiles.emplace_back(m0, mb);
    m0 += mb;
  }
  const int64_t m_tiles = int64_t(row_tiles.size());
  #pragma omp parallel num_threads(threads)
  {
    std::vector<float> state(size_t(M) * NB_MAX * 16);    // [M][NB][16] partial sums
    #pragma omp for schedule(static)
    for (int64_t t = 0; t < n_tiles; ++t) {
      int64_t n0 = t * NB_MAX;
      int nb = int(std::min<int64_t>(NB_MAX, N - n0));
      std::fill(state.begin(), state.end(), 0.0f);
      for (int64_t k0 = 0; k0 < K; k0 += KB) {
        int64_t k1 = std::min<int64_t>(K, k0 + KB);
        // The next block: the next k range of these rows, or the next tile's first. Its lines
        // are shared out over the row tiles' passes through this block, a few per full k-step
        // (one vector of k is 64 bytes). A block shorter than one vector has no full step and
        // prefetches nothing; counting at least one step keeps the division defined.
        Prefetch pf;
        int64_t share = 0;
        int64_t nn0 = k1 < K ? n0 : n0 + NB_MAX, nk0 = k1 < K ? k1 : 0;
        if (nn0 < N) {
          int64_t nkb = std::min<int64_t>(KB, K - nk0);
          pf.base = reinterpret_cast<const char*>(w + nn0 * K + nk0);
          pf.row_stride = K * int64_t(sizeof(T));
          pf.lines_per_row = (nkb * int64_t(sizeof(T)) + 63) / 64;
          pf.end = std::min<int64_t>(NB_MAX, N - nn0) * pf.lines_per_row;
          int64_t steps = m_tiles * std::max<int64_t>(1, (k1 - k0) * int64_t(sizeof(T)) / 64);
          pf.per_step = (pf.end + steps - 1) / steps;
          share = (pf.end + m_tiles - 1) / m_tiles;
        }
        for (int64_t mt = 0; mt < m_tiles; ++mt) {
          auto [m0, mb] = row_tiles[mt];
          Prefetch mine = pf;
          if (pf.base) { mine.line = mt * share; mine.end = std::min(pf.end, (mt + 1) * share); }
          Blocks[nb - 1][mb - 1](x + m0 * K, w + n0 * K, K, k0, k1, &state[m0 * NB_MAX * 16], mine);
        }
      }
      for (auto [m0, mb] : row_tiles) {
        const float* s = &state[m0 * NB_MAX * 16];      // [NB][MB][16] for this row tile
        for (int i = 0; i < nb; ++i)
          for (int j = 0; j < mb; ++j) store(m0 + j, n0 + i, reduce16(s + 16 * (i * mb + j)));
      }
    }
  }
}

#define SPECRT_ROW(fn, NB) fn<NB, 1>, fn<NB, 2>, fn<NB, 3>
#define SPECRT_TILES(fn, T)                                                             \
  static Block<T> fn##_table[NB_MAX][MB_MAX] = {                                        \
      {SPECRT_ROW(fn, 1)}, {SPECRT_ROW(fn, 2)}, {SPECRT_ROW(fn, 3)}, {SPECRT_ROW(fn, 4)},   \
      {SPECRT_ROW(fn, 5)}, {SPECRT_ROW(fn, 6)}, {SPECRT_ROW(fn, 7)}, {SPECRT_ROW(fn, 8)}};
SPECRT_TILES(block_bf16, uint16_t)
SPECRT_TILES(block_f32, float)

void gemv_bf16(const uint16_t* x, const uint16_t* w, const uint16_t* bias, void* out, bool out_f32,
               int64_t M, int64_t N, int64_t K, int threads) {
  auto store = [&](int64_t m, int64_t n, float v) {
    if (bias) v += bf16_to_f32(bias[n]);
    if (out_f32) static_cast<float*>(out)[m * N + n] = v;
    else static_cast<uint16_t*>(out)[m * N + n] = f32_to_bf16(v);
  };
  gemv_tiled<uint16_t, block_bf16_table, 512>(x, w, M, N, K, threads, store);
}

void gemv_f32(const float* x, const float* w, const float* bias, float* out, int64_t M, int64_t N,
              int64_t K, int threads) {
  auto store = [&](int64_t m, int64_t n, float v) { out[m * N + n] = bias ? v + bias[n] : v; };
  gemv_tiled<float, block_f32_table, 256>(x, w, M, N, K, threads, store);
}

}  // namespace specrt
