// The skinny matrix products of gemv.cpp for CPUs without AVX-512 (AVX2 + FMA): the same tiled
// driver (gemv_tiled.h: the weight streamed once per call, every output element summed in the
// same k order whatever M is), with 8-lane register tiles. A bf16 weight vector of 16 values
// is widened in registers to its even and odd halves (a shift, a mask) and multiplied with x,
// which is widened to fp32 once per call into the same even/odd order; fp32 weights are
// multiplied as they are. Each output element's 16 partial sums (8 lanes x 2 halves) wait in
// the driver's state between k-blocks and are reduced pairwise at the end. The AVX-512 and
// AVX2 kernels round differently from each other; each keeps its own bits for a row whatever M.
//
// A decode step (one row of x) takes its own path, decode_bf16: NB_DEC whole weight rows per
// tile with the accumulators in registers, x widened in registers like the weights, and the
// next tile's bytes prefetched in memory order as this tile is consumed. The lanes sum in the
// same order as the tiled driver's, so its bits are the driver's. Measured over the 1.5B
// target's matrix shapes on the AVX2 development machine (2 threads; benchmarks/RESULTS.md):
// 14.4 GB/s against 9.7 through the driver, 80% of the streaming read (its short rows, 3 KB,
// left the driver's 4 interleaved streams at ~55% of it). Passes of 2-4 rows take whole weight
// rows too (few_bf16), with the same bits.
#include "gemv_avx2.h"

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cpu_features.h"
#include "gemv_tiled.h"
#include "simd.h"

namespace specrt {

// Five or more rows of x (wide verify passes, prefill chunks) keep x in registers and stream
// the weight through them. Each output element's even and odd lane sums are independent
// chains, so a k-block runs the even chain over the whole block, then the odd one (the
// block's weight rows are read from L1 twice, each 16-value vector widened to one half per
// pass). One half holds NB x MB accumulators, MB vectors of x and the weight vector in use:
// 3 x 3 fits the 16 vector registers. Every lane sums its products in the same k order as
// the both-halves step below and decode_bf16, so the bits are theirs. A tiled kernel taking
// both halves at once (step_pair in 4 x 2 tiles) reads x from L1 in every FMA (one load per
// FMA, and its tile spills); this one measured 1.19-1.35x its speed at 9, 17 and 32 rows and
// 1.03-1.19x at 5 (benchmarks/kernel_ab.py over the 1.5B's shapes, RESULTS.md; 2x4, 2x5 and
// 4x3 tiles were slower than 3x3). 2-4 rows take whole weight rows (few_bf16).
constexpr int NB2 = 3, MB2 = 3;

// 16 bf16 weights at w (n of them valid, the rest zero) as 32-bit pairs: a half's fp32 values
// are this shifted (even) or masked (odd).
template <bool FULL>
SPECRT_AVX2 SPECRT_INLINE __m256i load_bf16x16(const uint16_t* w, int64_t n) {
  if (FULL) return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
  alignas(32) uint16_t tmp[16] = {};
  std::memcpy(tmp, w, size_t(n) * 2);
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(tmp));
}
template <int HALF>   // 0: the even values, 1: the odd ones
SPECRT_AVX2 SPECRT_INLINE __m256 half_bf16(__m256i v) {
  return _mm256_castsi256_ps(HALF == 0 ? _mm256_slli_epi32(v, 16)
                                       : _mm256_and_si256(v, _mm256_set1_epi32(int(0xffff0000u))));
}

// 16 bf16 weights at w (n of them valid, the rest zero) as fp32 even / odd halves.
template <bool FULL>
SPECRT_AVX2 SPECRT_INLINE void widen_bf16(const uint16_t* w, int64_t n, __m256& even, __m256& odd) {
  const __m256i v = load_bf16x16<FULL>(w, n);
  even = half_bf16<0>(v);
  odd = half_bf16<1>(v);
}

// One half's chain over the k-step of 16 values at k: NB weight rows against MB rows of x
// (fp32, each 16 values as 8 even then 8 odd), x held in registers for the step.
template <int NB, int MB, int HALF, bool FULL>
SPECRT_AVX2 SPECRT_INLINE void step_half(const float* x, int64_t XK, const uint16_t* w, int64_t K,
                                         int64_t k, int64_t n, __m256 (&acc)[NB * MB]) {
  __m256 xv[MB];
#pragma GCC unroll 8
  for (int j = 0; j < MB; ++j) xv[j] = _mm256_loadu_ps(x + j * XK + k + 8 * HALF);
#pragma GCC unroll 8
  for (int i = 0; i < NB; ++i) {
    const __m256 wv = half_bf16<HALF>(load_bf16x16<FULL>(w + i * K + k, n));
#pragma GCC unroll 8
    for (int j = 0; j < MB; ++j) acc[i * MB + j] = _mm256_fmadd_ps(xv[j], wv, acc[i * MB + j]);
  }
}

// One half of a k-block: its accumulators (state [NB * MB][16], this half's 8 lanes) loaded,
// run over [k0, k1), stored.
template <int NB, int MB, int HALF>
SPECRT_AVX2 SPECRT_INLINE void half_block(const float* x, int64_t XK, const uint16_t* w, int64_t K,
                                          int64_t k0, int64_t k1, float* state, Prefetch& pf) {
  __m256 acc[NB * MB];
#pragma GCC unroll 16
  for (int a = 0; a < NB * MB; ++a) acc[a] = _mm256_loadu_ps(state + 16 * a + 8 * HALF);
  int64_t k = k0;
  for (; k + 16 <= k1; k += 16) {
    if (HALF == 0) pf.step();
    step_half<NB, MB, HALF, true>(x, XK, w, K, k, 16, acc);
  }
  if (k < k1) step_half<NB, MB, HALF, false>(x, XK, w, K, k, k1 - k, acc);
#pragma GCC unroll 16
  for (int a = 0; a < NB * MB; ++a) _mm256_storeu_ps(state + 16 * a + 8 * HALF, acc[a]);
}

template <int NB, int MB>
SPECRT_AVX2 static void block_bf16(Rows<float> x, const uint16_t* w, int64_t K, int64_t k0,
                                   int64_t k1, float* state /*[NB * MB][16]*/, Prefetch pf) {
  half_block<NB, MB, 0>(x.p, x.K, w, K, k0, k1, state, pf);
  half_block<NB, MB, 1>(x.p, x.K, w, K, k0, k1, state, pf);
}

// Both halves' chains in one pass over the k-step: NB weight rows, each widened once, against
// MB rows of x read by the FMAs from L1 or L2 (the whole-row tiles of narrow passes, below).
template <int NB, int MB, bool FULL>
SPECRT_AVX2 SPECRT_INLINE void step_pair(const float* x, int64_t XK, const uint16_t* w, int64_t K,
                                         int64_t k, int64_t n, __m256 (&acc)[NB * MB * 2]) {
#pragma GCC unroll 8
  for (int i = 0; i < NB; ++i) {
    __m256 even, odd;
    widen_bf16<FULL>(w + i * K + k, n, even, odd);
#pragma GCC unroll 8
    for (int j = 0; j < MB; ++j) {
      const float* xj = x + j * XK + k;
      acc[2 * (i * MB + j)] = _mm256_fmadd_ps(_mm256_loadu_ps(xj), even, acc[2 * (i * MB + j)]);
      acc[2 * (i * MB + j) + 1] =
          _mm256_fmadd_ps(_mm256_loadu_ps(xj + 8), odd, acc[2 * (i * MB + j) + 1]);
    }
  }
}

template <int NB, int MB>
SPECRT_AVX2 static void block_f32(Rows<float> x, const float* w, int64_t K, int64_t k0,
                                  int64_t k1, float* state, Prefetch pf) {
  __m256 acc[NB * MB * 2];
#pragma GCC unroll 32
  for (int a = 0; a < NB * MB * 2; ++a) acc[a] = _mm256_loadu_ps(state + 8 * a);
  for (int64_t k = k0; k < k1; k += 16) {
    pf.step();
    // lanes of each half still inside [k, k1): a full step loads all 16
    const __m256i lo_mask = avx2::below(k1 - k), hi_mask = avx2::below(k1 - k - 8);
#pragma GCC unroll 8
    for (int i = 0; i < NB; ++i) {
      __m256 lo = _mm256_maskload_ps(w + i * K + k, lo_mask);
      __m256 hi = _mm256_maskload_ps(w + i * K + k + 8, hi_mask);
#pragma GCC unroll 8
      for (int j = 0; j < MB; ++j) {
        const float* xj = x.p + j * x.K + k;
        acc[2 * (i * MB + j)] = _mm256_fmadd_ps(_mm256_maskload_ps(xj, lo_mask), lo, acc[2 * (i * MB + j)]);
        acc[2 * (i * MB + j) + 1] =
            _mm256_fmadd_ps(_mm256_maskload_ps(xj + 8, hi_mask), hi, acc[2 * (i * MB + j) + 1]);
      }
    }
  }
#pragma GCC unroll 32
  for (int a = 0; a < NB * MB * 2; ++a) _mm256_storeu_ps(state + 8 * a, acc[a]);
}

#define SPECRT_ROW3(fn, NB) fn<NB, 1>, fn<NB, 2>, fn<NB, 3>
static Block<Rows<float>, uint16_t> block_bf16_table[NB2][MB2] = {
    {SPECRT_ROW3(block_bf16, 1)}, {SPECRT_ROW3(block_bf16, 2)}, {SPECRT_ROW3(block_bf16, 3)}};
#define SPECRT_ROW2(fn, NB) fn<NB, 1>, fn<NB, 2>
// fp32 weights (tiny test models, fp32 runs): 4 x 2 tiles, both halves at once.
constexpr int NBF = 4, MBF = 2;
static Block<Rows<float>, float> block_f32_table[NBF][MBF] = {
    {SPECRT_ROW2(block_f32, 1)}, {SPECRT_ROW2(block_f32, 2)}, {SPECRT_ROW2(block_f32, 3)}, {SPECRT_ROW2(block_f32, 4)}};

// --- a decode step (M = 1) -------------------------------------------------------------------
constexpr int NB_DEC = 4;

// One k-step of 16 values (n of them valid) of a decode tile: x widened in registers like the
// weights, against NB whole weight rows.
template <int NB, bool FULL>
SPECRT_AVX2 SPECRT_INLINE void decode_step(const uint16_t* x, const uint16_t* w, int64_t K,
                                           int64_t k, int64_t n, __m256 (&acc)[NB * 2]) {
  __m256 xe, xo;
  widen_bf16<FULL>(x + k, n, xe, xo);
#pragma GCC unroll 8
  for (int i = 0; i < NB; ++i) {
    __m256 even, odd;
    widen_bf16<FULL>(w + i * K + k, n, even, odd);
    acc[2 * i] = _mm256_fmadd_ps(xe, even, acc[2 * i]);
    acc[2 * i + 1] = _mm256_fmadd_ps(xo, odd, acc[2 * i + 1]);
  }
}

// x [K] bf16 against NB weight rows w [NB, K] (whole rows): each row's 16 lane sums (8 even,
// then 8 odd, as the driver's state holds them) into sums [NB][16]. Each 16-value step also
// prefetches (into L2) as many bytes of the next tile, which follows this one in memory.
template <int NB>
SPECRT_AVX2 static void decode_tile(const uint16_t* x, const uint16_t* w, int64_t K, float* sums) {
  __m256 acc[NB * 2];
#pragma GCC unroll 16
  for (int a = 0; a < NB * 2; ++a) acc[a] = _mm256_setzero_ps();
  const char* next = reinterpret_cast<const char*>(w + NB * K);
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
#pragma GCC unroll 8
    for (int j = 0; j < (NB + 1) / 2; ++j) __builtin_prefetch(next + k * NB * 2 + j * 64, 0, 2);
    decode_step<NB, true>(x, w, K, k, 16, acc);
  }
  if (k < K) decode_step<NB, false>(x, w, K, k, K - k, acc);   // the last K % 16, zeros past
#pragma GCC unroll 16
  for (int a = 0; a < NB * 2; ++a) _mm256_storeu_ps(sums + 8 * a, acc[a]);
}

// x [1, K] bf16 @ w [N, K].T (few_rows with one row: tiles split evenly over the threads).
static void decode_bf16(const uint16_t* x, const uint16_t* w, int64_t N, int64_t K, int threads,
                        Bf16Store store) {
  few_rows<NB_DEC, 1, reduce16_pairwise>(
      1, N, threads,
      [&](int64_t n0, float* sums) { decode_tile<NB_DEC>(x, w + n0 * K, K, sums); },
      [&](int64_t n, float* sums) { decode_tile<1>(x, w + n * K, K, sums); }, store);
}

// --- narrow verify passes (2 <= M <= MB_FEW) -------------------------------------------------
// A few rows of x take whole weight rows, as the decode step does (few_rows): NB weight rows a
// tile, the even and odd lane sums of each (weight row, x row) in registers for the whole of K,
// the next tile (which follows this one in memory) prefetched as this one is consumed. x is
// widened once per call (widen_rows) and read by the FMAs from L1 or L2. Each lane sums its
// products in the same k order as the tiled kernels and decode_tile, and the lanes are reduced
// by the same reduce16_pairwise, so the bits are theirs. 2 and 3 rows of x take 2 weight rows
// a tile (12 accumulators at 3 rows), 4 rows one (8; two would spill). On the AVX2 development
// machine (Zen 3, 2 threads; benchmarks/kernel_ab.py over the 1.5B's shapes, bits identical)
// against the tiled driver (its 4 x 2 tiles, both halves at once): 2, 3 and 4 rows of x 1.08x,
// 1.27x and 1.19x, with the streaming read at 34-38 GB/s; one weight row a tile read 3 rows at
// 0.80x of two; 5 and 6 rows whole read 0.96-1.01x and 0.85-0.86x of the 3 x 3 tiles below,
// which keep them (benchmarks/RESULTS.md, "AVX2 again: narrow verify passes over whole rows").
constexpr int MB_FEW = 4;

// x rows [MB][K16] (fp32, each 16 values as 8 even then 8 odd) against NB whole weight rows
// w [NB, K]: the lane sums of each (weight row i, x row j) into sums [NB][MB][16].
template <int NB, int MB>
SPECRT_AVX2 static void rows_tile(const float* x, int64_t K16, const uint16_t* w, int64_t K,
                                  float* sums) {
  __m256 acc[NB * MB * 2];
#pragma GCC unroll 32
  for (int a = 0; a < NB * MB * 2; ++a) acc[a] = _mm256_setzero_ps();
  const char* next = reinterpret_cast<const char*>(w + NB * K);
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    // the next tile's bytes at this tile's pace (one weight row: each line asked for twice)
#pragma GCC unroll 8
    for (int j = 0; j < (NB + 1) / 2; ++j) __builtin_prefetch(next + k * NB * 2 + j * 64, 0, 2);
    step_pair<NB, MB, true>(x, K16, w, K, k, 16, acc);
  }
  if (k < K) step_pair<NB, MB, false>(x, K16, w, K, k, K - k, acc);   // zeros past K
#pragma GCC unroll 32
  for (int a = 0; a < NB * MB * 2; ++a) _mm256_storeu_ps(sums + 8 * a, acc[a]);
}

// indexed by M - 2 (M = 1 is the decode step's)
using RowsTile = void (*)(const float*, int64_t, const uint16_t*, int64_t, float*);
static const RowsTile rows_two[2] = {rows_tile<2, 2>, rows_tile<2, 3>};
static const RowsTile rows_one[MB_FEW - 1] = {rows_tile<1, 2>, rows_tile<1, 3>, rows_tile<1, 4>};

// x [M, K] (widened, rows K16 apart) @ w [N, K].T for 2 <= M <= MB_FEW (few_rows: tiles split
// evenly over the threads).
static void few_bf16(const float* x, int64_t K16, const uint16_t* w, int64_t M, int64_t N,
                     int64_t K, int threads, Bf16Store store) {
  const auto one = [&](int64_t n, float* sums) { rows_one[M - 2](x, K16, w + n * K, K, sums); };
  if (M == 4) return few_rows<1, MB_FEW, reduce16_pairwise>(M, N, threads, one, one, store);
  few_rows<2, MB_FEW, reduce16_pairwise>(
      M, N, threads,
      [&](int64_t n0, float* sums) { rows_two[M - 2](x, K16, w + n0 * K, K, sums); }, one, store);
}

// x [M, K] bf16 -> [M, K16] fp32 in the blocks' order: each 16 values as their 8 even, then
// their 8 odd ones (zeros past K).
static std::vector<float> widen_rows(const uint16_t* x, int64_t M, int64_t K, int64_t K16) {
  std::vector<float> out(size_t(M * K16), 0.0f);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k)
      out[size_t(m * K16 + (k / 16) * 16 + (k % 2) * 8 + (k % 16) / 2)] = bf16_to_f32(x[m * K + k]);
  return out;
}

void gemv_bf16_avx2(const uint16_t* x, const uint16_t* w, const uint16_t* bias, void* out,
                    bool out_f32, int64_t M, int64_t N, int64_t K, int threads) {
  if (M > M_CHUNK) {      // in chunks, a pass each (gemv_tiled.h)
    const size_t out_row = size_t(N) * (out_f32 ? 4 : 2);
    for (auto [m0, mc] : near_equal_parts(M, M_CHUNK))
      gemv_bf16_avx2(x + m0 * K, w, bias, static_cast<char*>(out) + m0 * out_row, out_f32, mc, N,
                     K, threads);
    return;
  }
  if (M == 1) return decode_bf16(x, w, N, K, threads, Bf16Store{bias, out, out_f32, N});
  const int64_t K16 = (K + 15) / 16 * 16;
  std::vector<float> xf = widen_rows(x, M, K, K16);
  const Bf16Store store{bias, out, out_f32, N};
  if (M <= MB_FEW) return few_bf16(xf.data(), K16, w, M, N, K, threads, store);
  gemv_tiled<NB2, MB2, 512, 1, Ahead::next_tile>(Rows<float>{xf.data(), K16}, w, M, N, K, threads,
                                                block_bf16_table, store, reduce16_pairwise);
}

void gemv_f32_avx2(const float* x, const float* w, const float* bias, float* out, int64_t M,
                   int64_t N, int64_t K, int threads) {
  gemv_tiled<NBF, MBF, 256, 1, Ahead::next_tile>(Rows<float>{x, K}, w, M, N, K, threads,
                                                block_f32_table, F32Store{bias, out, N},
                                                reduce16_pairwise);
}

}  // namespace specrt
