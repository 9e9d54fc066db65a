// Skinny matrix products with int8 weights for a draft model on the CPU:
//   y[m, n] = s_w[n] * sum_b s_x[m, b] * sum_{k in block b} qx[m, k] * qw[n, k]  (+ bias[n])
// qw: the weight quantized per output row (symmetric, scale s_w[n] = max|W[n, :]| / 127), stored
// offset by +128 as uint8; qx: each row of x quantized per block of 64 values at call time
// (scale s_x[m, b] = max|x[m, block]| / 127, round to nearest even). The block dots are exact
// integers: vpdpbusd multiplies the unsigned weight bytes by the signed activation bytes, and
// the +128 offset is taken back per 4-value lane group (128 * the sum of those four qx, an exact
// int32 computed with the quantization, gemv_quant.h, and the accumulator vpdpbusd starts
// from). Each output element sums its blocks in the same order whatever M is, so every row's
// bits are independent of the rows beside it.
//
// Only the draft model runs this: its outputs decide which tokens are proposed, never which are
// emitted, so a quantized draft leaves greedy output identical and sampling exact. The spec is
// specrt.kernels.cpu.gemv_int8.reference_linear. CPUs without AVX-512 VNNI take
// gemv_int8_avx2.cpp (same quantization and integer dots, AVX2 instructions).
#include "gemv_int8.h"
#include "gemv_int8_avx2.h"

#include <immintrin.h>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cpu_features.h"
#include "gemv_quant.h"
#include "gemv_tiled.h"

namespace specrt {

namespace {

// 8 weight rows x 2 rows of x: 16 accumulators + per x row its bytes, lane corrections and
// scale (6) + the weight bytes and a product fit the 32 vector registers.
constexpr int NB_I8 = 8, MB_I8 = 2;

template <int NB, int MB>
SPECRT_AVX512_VNNI SPECRT_INLINE void step_i8(const QRows& x, const uint8_t* w, int64_t K, int64_t k,
                                              __m512 (&acc)[NB * MB]) {
  __m512i xv[MB], cv[MB];
  __m512 sv[MB];
#pragma GCC unroll 8
  for (int j = 0; j < MB; ++j) {
    xv[j] = _mm512_loadu_si512(x.q + j * K + k);
    cv[j] = _mm512_loadu_si512(x.corr + j * (K / 4) + k / 4);
    sv[j] = _mm512_set1_ps(x.scale[j * (K / QBLOCK) + k / QBLOCK]);
  }
#pragma GCC unroll 8
  for (int i = 0; i < NB; ++i) {
    __m512i wv = _mm512_loadu_si512(w + i * K + k);
#pragma GCC unroll 8
    for (int j = 0; j < MB; ++j) {
      __m512i d = _mm512_dpbusd_epi32(cv[j], wv, xv[j]);        // exact: correction + dot
      acc[i * MB + j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), sv[j], acc[i * MB + j]);
    }
  }
}

template <int NB, int MB>
SPECRT_AVX512_VNNI static void block_i8(QRows x, const uint8_t* w, int64_t K, int64_t k0, int64_t k1,
                                        float* state, Prefetch pf) {
  __m512 acc[NB * MB];
#pragma GCC unroll 32
  for (int a = 0; a < NB * MB; ++a) acc[a] = _mm512_loadu_ps(state + 16 * a);
  for (int64_t k = k0; k < k1; k += QBLOCK) { pf.step(); step_i8<NB, MB>(x, w, K, k, acc); }
#pragma GCC unroll 32
  for (int a = 0; a < NB * MB; ++a) _mm512_storeu_ps(state + 16 * a, acc[a]);
}

#define SPECRT_I8_ROW(NB) block_i8<NB, 1>, block_i8<NB, 2>
Block<QRows, uint8_t> block_i8_table[NB_I8][MB_I8] = {
    {SPECRT_I8_ROW(1)}, {SPECRT_I8_ROW(2)}, {SPECRT_I8_ROW(3)}, {SPECRT_I8_ROW(4)},
    {SPECRT_I8_ROW(5)}, {SPECRT_I8_ROW(6)}, {SPECRT_I8_ROW(7)}, {SPECRT_I8_ROW(8)}};

// A decode step, or the draft's first forward of a round over its one or two new tokens
// (M <= MB_DEC), takes whole weight rows, NB_DEC at a time, with the accumulators in registers
// for all of K and the next tile (it follows this one in memory) prefetched as this one is
// read, as the bf16 decode step does (gemv.cpp). Each lane sums its blocks in step_i8's order
// and goes through the same reduce16, so every output has the tiled driver's bits.
constexpr int NB_DEC = 4, MB_DEC = 2;

template <int NB, int MB>
SPECRT_AVX512_VNNI static void decode_tile_i8(const QRows& x, const uint8_t* w, int64_t K,
                                              float* sums /*[NB][MB][16]*/) {
  __m512 acc[NB * MB];
#pragma GCC unroll 8
  for (int a = 0; a < NB * MB; ++a) acc[a] = _mm512_setzero_ps();
  const char* next = reinterpret_cast<const char*>(w + NB * K);
  for (int64_t k = 0; k < K; k += QBLOCK) {                // 64 bytes of each row per step
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) __builtin_prefetch(next + k * NB + j * 64, 0, 2);
    step_i8<NB, MB>(x, w, K, k, acc);
  }
#pragma GCC unroll 8
  for (int a = 0; a < NB * MB; ++a) _mm512_storeu_ps(sums + 16 * a, acc[a]);
}

using DecodeTile = void (*)(const QRows&, const uint8_t*, int64_t, float*);
static const DecodeTile decode_full[MB_DEC] = {decode_tile_i8<NB_DEC, 1>, decode_tile_i8<NB_DEC, 2>},
                        decode_one[MB_DEC] = {decode_tile_i8<1, 1>, decode_tile_i8<1, 2>};

}  // namespace

bool cpu_supports_int8() { return cpu_avx512_vnni() || cpu_avx2(); }

void gemv_int8(const void* x, bool x_f32, const uint8_t* w, const float* w_scale,
               const void* bias, void* out, bool out_f32, int64_t M, int64_t N, int64_t K,
               int threads) {
  if (!cpu_avx512_vnni())
    return gemv_int8_avx2(x, x_f32, w, w_scale, bias, out, out_f32, M, N, K, threads);
  const QuantizedX qx(x, x_f32, M, K, 128);
  const Vector512<QuantStore> store{{w_scale, bias, x_f32, out, out_f32, N}};
  if (M <= MB_DEC)
    return few_rows<NB_DEC, MB_DEC, reduce16_all>(
        M, N, threads,
        [&](int64_t n0, float* sums) { decode_full[M - 1](qx.view, w + n0 * K, K, sums); },
        [&](int64_t n, float* sums) { decode_one[M - 1](qx.view, w + n * K, K, sums); }, store);
  gemv_tiled<NB_I8, MB_I8, 1024>(qx.view, w, M, N, K,
                                 threads, block_i8_table, store);
}

}  // namespace specrt
