// Skinny matrix products for CPU decode and verify: y[m, n] = sum_k x[m, k] * W[n, k] (+ b[n])
// for M = 1..~32 rows of x against a large row-major weight W [N, K].
//
// Decoding is memory-bound: every step streams all weights once. Library GEMMs pick small-M
// paths that reach about half the machine's read bandwidth here, and their result for a row
// depends on M. These kernels stream W once per call in tiles of 8 weight rows (each dotted
// with up to 3 rows of x at a time from registers), split N across threads, and accumulate every
// output element in the same k order whatever M is: a verify pass and a decode step give
// bit-identical values for the same row (a decode step and passes of up to 6 rows, 2 on a Zen
// 4, take their own path over whole weight rows, few_bf16 below, with the same bits). Plain
// C++17 + AVX-512 intrinsics, selected at run time (cpu_avx512); CPUs with AVX2 only take
// gemv_avx2.cpp, and callers fall back to the library path elsewhere (cpu_supported).
#include "gemv.h"

#include <immintrin.h>
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "cpu_features.h"
#include "threads.h"
#include "gemv_avx2.h"
#include "gemv_tiled.h"

namespace specrt {



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

// Register tiles of up to NB_MAX = 8 weight rows by MB_MAX = 3 rows of x: 24 accumulators, 3 x
// vectors and a weight vector fit the 32 vector registers. The driver (gemv_tiled.h) cuts M into
// near-equal row tiles (17 = 2 + 3 + 3 + 3 + 3 + 3) so that no tile is left with one row doing a
// load per product.
constexpr int NB_MAX = 8, MB_MAX = 3;

template <int NB, int MB>
SPECRT_AVX512 static void block_bf16(Rows<uint16_t> x, const uint16_t* w, int64_t K, int64_t k0,
                                     int64_t k1, float* state /*[NB * MB][16]*/, Prefetch pf) {
  __m512 acc[NB * MB];
#pragma GCC unroll 32
  for (int a = 0; a < NB * MB; ++a) acc[a] = _mm512_loadu_ps(state + 16 * a);
  int64_t k = k0;
  for (; k + 32 <= k1; k += 32) { pf.step(); step_bf16<NB, MB>(x.p, w, K, k, 0xffffffffu, acc); }
  if (k < k1) step_bf16<NB, MB>(x.p, w, K, k, (1u << (k1 - k)) - 1, acc);
#pragma GCC unroll 32
  for (int a = 0; a < NB * MB; ++a) _mm512_storeu_ps(state + 16 * a, acc[a]);
}

template <int NB, int MB>
SPECRT_AVX512 static void block_f32(Rows<float> x, const float* w, int64_t K, int64_t k0,
                                    int64_t k1, float* state, Prefetch pf) {
  __m512 acc[NB * MB];
#pragma GCC unroll 32
  for (int a = 0; a < NB * MB; ++a) acc[a] = _mm512_loadu_ps(state + 16 * a);
  int64_t k = k0;
  for (; k + 16 <= k1; k += 16) { pf.step(); step_f32<NB, MB>(x.p, w, K, k, 0xffff, acc); }
  if (k < k1) step_f32<NB, MB>(x.p, w, K, k, __mmask16((1u << (k1 - k)) - 1), acc);
#pragma GCC unroll 32
  for (int a = 0; a < NB * MB; ++a) _mm512_storeu_ps(state + 16 * a, acc[a]);
}

#define SPECRT_ROW(fn, NB) fn<NB, 1>, fn<NB, 2>, fn<NB, 3>
#define SPECRT_TILES(fn, T)                                                             \
  static Block<Rows<T>, T> fn##_table[NB_MAX][MB_MAX] = {                                        \
      {SPECRT_ROW(fn, 1)}, {SPECRT_ROW(fn, 2)}, {SPECRT_ROW(fn, 3)}, {SPECRT_ROW(fn, 4)},   \
      {SPECRT_ROW(fn, 5)}, {SPECRT_ROW(fn, 6)}, {SPECRT_ROW(fn, 7)}, {SPECRT_ROW(fn, 8)}};
SPECRT_TILES(block_bf16, uint16_t)
SPECRT_TILES(block_f32, float)

// --- decode steps and narrow verify passes (M <= MB_FEW) ------------------------------------
// A few rows of x take whole weight rows (few_rows, gemv_tiled.h; how many at a time below), with
// the accumulators in registers for the whole of K and the next tile (which follows this one in
// memory) prefetched as this one is consumed: the AVX2 kernels' decode design (gemv_avx2.cpp).
// Each lane sums its pairs in the same k order as block_bf16 above (32-value steps, the last
// K % 32 masked), and the 16 lanes are reduced by the same reduce16, so the bits are the tiled
// driver's. On a Zen 5 EPYC (2 threads, AVX-512 BF16) the tiled driver's decode step read the
// weights at 1.2-1.55x the streaming read's time, where the AVX2 decode path read at
// 1.02-1.2x; whole rows read 2-6-row products 1.17-1.22x faster than the tiled driver on
// the committed code (0.94-1.22x over nine runs of the variants). Wider passes stay tiled:
// whole rows in two or three row parts read 7-17 rows at 0.86-1.11x, 24 rows 0.94x, and 2
// weight rows x 7-17 rows of x at 0.75-0.93x (benchmarks/RESULTS.md, "AVX-512 on Zen 5" and
// "Zen 5: the int8 draft's decode step and narrow verify passes").
//
// Verify passes (2-6 rows of x; 2 on a Zen 4, below), and a decode step over rows of at most
// ROW_AT_A_TIME_K values, take the weight rows one at a time, in memory order: the loads then
// run through memory as one linear stream, as the streaming read's do. Four rows at a time make
// four short interleaved streams (the 0.5B's rows are 1,792 bytes), which the hardware
// prefetcher apparently does not follow (a harness over one K = 896 matrix: four rows without the
// software prefetch at 0.41-0.58 of the streaming read, one row at 0.98-1.00). On a Zen 4
// EPYC (2 threads) four rows read the 0.5B's K = 896 products at 0.80-0.85 of the streaming
// read and its decode step took 1.56x the read's time when memory was fast; one row at a
// time, 0.97-1.00 and 1.05-1.13x, bits identical (benchmarks/RESULTS.md, "Decode steps over
// whole rows in memory order"). A decode step over longer rows keeps four (NB_DEC) at a time,
// as before: one row at a time for every K measured the same (1.01-1.02x, within the noise;
// 2,048 itself was not swept), and one row's single accumulator is a chain of K / 32 dependent
// dot products, which the CPU can overlap with the next row's only while both fit its window.
// A verify pass has a chain per row of x. On an Intel Xeon with AVX-512 BF16 (2
// threads, weights in huge pages; kernel_ab, twice) four weight rows at a time read 2, 3, 4,
// 5 and 6 rows of x at 0.88-0.89, 0.83, 0.74-0.75, 0.72-0.73 and 0.69-0.71 of the streaming
// read; one at a time 1.18-1.19x, 1.13-1.14x, 1.14-1.19x, 1.09-1.13x and 1.05-1.08x that, bits
// identical (benchmarks/RESULTS.md, "A new CPU ..."; not measured on the EPYCs, whose decode
// steps measured the same either way).
//
// A Zen 4 (cpu_avx512_halves) runs each 512-bit operation as two 256-bit halves: a load then
// holds its load ports for a whole cycle, and whole rows load a vector of x for every product
// where the tiled driver's 8 x 3 tiles load 11 vectors for 24. There (2 threads, kernel_ab
// over the 1.5B's shapes) whole rows read 3, 4, 5 and 6 rows of x at 0.88, 0.85, 0.79 and 0.74
// of the streaming read and the tiled driver at 0.92, 0.92, 0.88 and 0.86 (1.04-1.16x), 2 rows
// at 0.99 against 0.93: it takes whole rows for at most MB_FEW_HALVES rows of x
// (benchmarks/RESULTS.md, "Zen 4: narrow verify passes tiled").
constexpr int NB_DEC = 4, MB_FEW = 6;   // a decode step's tile over long rows; up to 6 x rows
constexpr int MB_FEW_HALVES = 2;        // ... up to 2 on a Zen 4
constexpr int64_t ROW_AT_A_TIME_K = 2048;

// Wider passes (gemv_tiled) request the block after next into L2, not the next: on the Zen 4
// EPYC (2 threads, kernel_ab over the 1.5B's shapes, bits identical) the later request read 8,
// 9, 12 and 17 rows of x 1.08x, 1.10x, 1.05x and 1.06x faster with the streaming read at 50-53
// GB/s, 3, 5 and 8 rows 1.04x, 1.01x and 1.01x with it at 32-33; three blocks ahead measured
// as two (0.98-1.05x; benchmarks/RESULTS.md, "The bf16 verify pass's prefetch distance").
constexpr int BF16_DISTANCE = 2;

// x rows [MB, K] bf16 against NB whole weight rows w [NB, K]: the lane sums of each (weight
// row i, x row j) into sums [NB][MB][16]. Each 32-value step reads 64 bytes of each weight row
// and prefetches (into L2) as many bytes of the next tile.
template <int NB, int MB>
SPECRT_AVX512 static void rows_tile(const uint16_t* x, const uint16_t* w, int64_t K,
                                    float* sums) {
  __m512 acc[NB * MB];
#pragma GCC unroll 32
  for (int a = 0; a < NB * MB; ++a) acc[a] = _mm512_setzero_ps();
  const char* next = reinterpret_cast<const char*>(w + NB * K);
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) {
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) __builtin_prefetch(next + k * NB * 2 + j * 64, 0, 2);
    step_bf16<NB, MB>(x, w, K, k, 0xffffffffu, acc);
  }
  if (k < K) step_bf16<NB, MB>(x, w, K, k, (1u << (K - k)) - 1, acc);
#pragma GCC unroll 32
  for (int a = 0; a < NB * MB; ++a) _mm512_storeu_ps(sums + 16 * a, acc[a]);
}

using RowsTile = void (*)(const uint16_t*, const uint16_t*, int64_t, float*);
#define SPECRT_ROWS(NB)                                                                      \
  {rows_tile<NB, 1>, rows_tile<NB, 2>, rows_tile<NB, 3>, rows_tile<NB, 4>, rows_tile<NB, 5>, \
   rows_tile<NB, 6>}
static const RowsTile rows_one[MB_FEW] = SPECRT_ROWS(1);

// x [M, K] bf16 @ w [N, K].T, M <= MB_FEW (few_rows: tiles split evenly over the threads; one
// weight row a tile, but for a decode step over long rows).
static void few_bf16(const uint16_t* x, const uint16_t* w, int64_t M, int64_t N, int64_t K,
                     int threads, Vector512<Bf16Store> store) {
  const auto one = [&](int64_t n, float* sums) { rows_one[M - 1](x, w + n * K, K, sums); };
  if (M > 1 || K <= ROW_AT_A_TIME_K)                // a tile of one row is the one-row call
    return few_rows<1, MB_FEW, reduce16_all>(M, N, threads, one, one, store);
  few_rows<NB_DEC, 1, reduce16_all>(
      M, N, threads, [&](int64_t n0, float* sums) { rows_tile<NB_DEC, 1>(x, w + n0 * K, K, sums); },
      one, store);
}

void gemv_bf16(const uint16_t* x, const uint16_t* w, const uint16_t* bias, void* out, bool out_f32,
               int64_t M, int64_t N, int64_t K, int threads) {
  threads = threads_for(M * N * K, threads);
  if (!cpu_avx512()) return gemv_bf16_avx2(x, w, bias, out, out_f32, M, N, K, threads);
  const Vector512<Bf16Store> store{{bias, out, out_f32, N}};
  if (M <= (cpu_avx512_halves() ? MB_FEW_HALVES : MB_FEW))
    return few_bf16(x, w, M, N, K, threads, store);
  gemv_tiled<NB_MAX, MB_MAX, 512, 1, Ahead::next_block, BF16_DISTANCE>(
      Rows<uint16_t>{x, K}, w, M, N, K, threads, block_bf16_table, store);
}

void gemv_f32(const float* x, const float* w, const float* bias, float* out, int64_t M, int64_t N,
              int64_t K, int threads) {
  threads = threads_for(M * N * K, threads);
  if (!cpu_avx512()) return gemv_f32_avx2(x, w, bias, out, M, N, K, threads);
  gemv_tiled<NB_MAX, MB_MAX, 256>(Rows<float>{x, K}, w, M, N, K, threads, block_f32_table,
                                   F32Store{bias, out, N});
}

}  // namespace specrt
