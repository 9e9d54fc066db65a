// Skinny matrix products for CPU decode and verify: y[m, n] = sum_k x[m, k] * W[n, k] (+ b[n])
// for M = 1..~17 rows of x against a large row-major weight W [N, K].
//
// Decoding is memory-bound: every step streams all weights once. Library GEMMs pick small-M
// paths that reach about half the machine's read bandwidth here, and their result for a row
// depends on M. These kernels stream W exactly once per call in 4-row tiles (each tile dotted
// with 4 rows of x at a time from registers), split N across threads, and accumulate every
// output element in the same k order whatever M is: a verify pass and a decode step give
// bit-identical values for the same row. Plain C++17 + AVX-512 intrinsics, selected at run time
// (cpu_supported); callers fall back to the library path elsewhere.
#include "gemv.h"

#include <immintrin.h>
#include <cstdint>
#include <cstring>

namespace specrt {

static inline float bf16_to_f32(uint16_t v) { uint32_t u = uint32_t(v) << 16; float f; std::memcpy(&f, &u, 4); return f; }
static inline uint16_t f32_to_bf16(float f) {  // round to nearest even
  uint32_t u; std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffff) > 0x7f800000) return uint16_t((u >> 16) | 0x40);
  u += 0x7fff + ((u >> 16) & 1);
  return uint16_t(u >> 16);
}


// One register tile: NB rows of W against MB rows of x, all K. Each output element is a dot
// product accumulated in the same k order whatever M is, so a verify pass (M = K + 1) and a
// decode step (M = 1) give bit-identical results for the same row.
template <int NB, int MB>
__attribute__((target("avx512f,avx512bw,avx512bf16")))
static void tile_bf16(const uint16_t* x, const uint16_t* w, int64_t K, float* acc_out /*[MB][NB]*/) {
  __m512 acc[NB][MB];
  for (int i = 0; i < NB; ++i)
    for (int j = 0; j < MB; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 32) {
    __mmask32 mask = K - k >= 32 ? 0xffffffffu : ((1u << (K - k)) - 1);
    __m512bh wv[NB];
    for (int i = 0; i < NB; ++i) wv[i] = (__m512bh)_mm512_maskz_loadu_epi16(mask, w + i * K + k);
    for (int j = 0; j < MB; ++j) {
      __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(mask, x + j * K + k);
      for (int i = 0; i < NB; ++i) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], xv, wv[i]);
    }
  }
  for (int j = 0; j < MB; ++j)
    for (int i = 0; i < NB; ++i) acc_out[j * NB + i] = _mm512_reduce_add_ps(acc[i][j]);
}

template <int NB, int MB>
__attribute__((target("avx512f")))
static void tile_f32(const float* x, const float* w, int64_t K, float* acc_out) {
  __m512 acc[NB][MB];
  for (int i = 0; i < NB; ++i)
    for (int j = 0; j < MB; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 16) {
    __mmask16 mask = K - k >= 16 ? 0xffff : ((1u << (K - k)) - 1);
    __m512 wv[NB];
    for (int i = 0; i < NB; ++i) wv[i] = _mm512_maskz_loadu_ps(mask, w + i * K + k);
    for (int j = 0; j < MB; ++j) {
      __m512 xv = _mm512_maskz_loadu_ps(mask, x + j * K + k);
      for (int i = 0; i < NB; ++i) acc[i][j] = _mm512_fmadd_ps(xv, wv[i], acc[i][j]);
    }
  }
  for (int j = 0; j < MB; ++j)
    for (int i = 0; i < NB; ++i) acc_out[j * NB + i] = _mm512_reduce_add_ps(acc[i][j]);
}

template <typename T, void (*Tiles[4][4])(const T*, const T*, int64_t, float*), typename Store>
static void gemv_tiled(const T* x, const T* w, int64_t M, int64_t N, int64_t K, int threads,
                       Store store) {
  constexpr int NB = 4, MB = 4;
  int64_t n_tiles = (N + NB - 1) / NB;
  #pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t t = 0; t < n_tiles; ++t) {
    int64_t n0 = t * NB;
    int nb = int(N - n0 < NB ? N - n0 : NB);
    float acc[MB * NB];
    for (int64_t m0 = 0; m0 < M; m0 += MB) {
      int mb = int(M - m0 < MB ? M - m0 : MB);
      Tiles[nb - 1][mb - 1](x + m0 * K, w + n0 * K, K, acc);
      for (int j = 0; j < mb; ++j)
        for (int i = 0; i < nb; ++i) store(m0 + j, n0 + i, acc[j * nb + i]);
    }
  }
}

// Decode (M = 1): 8-row tiles keep more independent loads and accumulators in flight, which
// is what a single row needs to approach the read bandwidth (measured +10-20% over 4-row tiles
// on the development machine); rows past the last full tile go one by one.
template <typename T, typename Tile8, typename Tile1, typename Store>
static void gemv_one_row(const T* x, const T* w, int64_t N, int64_t K, int threads, Tile8 tile8,
                         Tile1 tile1, Store store) {
  constexpr int NB = 8;
  int64_t full = N / NB;
  #pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t t = 0; t < full; ++t) {
    float acc[NB];
    tile8(x, w + t * NB * K, K, acc);
    for (int i = 0; i < NB; ++i) store(0, t * NB + i, acc[i]);
  }
  for (int64_t n = full * NB; n < N; ++n) {
    float acc[1];
    tile1(x, w + n * K, K, acc);
    store(0, n, acc[0]);
  }
}

#define SPECRT_TILES(fn, T)                                                              \
  static void (*fn##_table[4][4])(const T*, const T*, int64_t, float*) = {                \
      {fn<1, 1>, fn<1, 2>, fn<1, 3>, fn<1, 4>}, {fn<2, 1>, fn<2, 2>, fn<2, 3>, fn<2, 4>}, \
      {fn<3, 1>, fn<3, 2>, fn<3, 3>, fn<3, 4>}, {fn<4, 1>, fn<4, 2>, fn<4, 3>, fn<4, 4>}};
SPECRT_TILES(tile_bf16, uint16_t)
SPECRT_TILES(tile_f32, float)

void gemv_bf16(const uint16_t* x, const uint16_t* w, const uint16_t* bias, void* out, bool out_f32,
               int64_t M, int64_t N, int64_t K, int threads) {
  auto store = [&](int64_t m, int64_t n, float v) {
    if (bias) v += bf16_to_f32(bias[n]);
    if (out_f32) static_cast<float*>(out)[m * N + n] = v;
    else static_cast<uint16_t*>(out)[m * N + n] = f32_to_bf16(v);
  };
  if (M == 1)
    gemv_one_row(x, w, N, K, threads, tile_bf16<8, 1>, tile_bf16<1, 1>, store);
  else
    gemv_tiled<uint16_t, tile_bf16_table>(x, w, M, N, K, threads, store);
}

void gemv_f32(const float* x, const float* w, const float* bias, float* out, int64_t M, int64_t N,
              int64_t K, int threads) {
  auto store = [&](int64_t m, int64_t n, float v) { out[m * N + n] = bias ? v + bias[n] : v; };
  if (M == 1)
    gemv_one_row(x, w, N, K, threads, tile_f32<8, 1>, tile_f32<1, 1>, store);
  else
    gemv_tiled<float, tile_f32_table>(x, w, M, N, K, threads, store);
}

bool cpu_supported() { return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512bf16"); }
}
