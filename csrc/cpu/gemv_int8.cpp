// Skinny matrix products with int8 weights for a draft model on the CPU:
//   y[m, n] = s_w[n] * sum_b s_x[m, b] * sum_{k in block b} qx[m, k] * qw[n, k]  (+ bias[n])
// qw: the weight quantized per output row (symmetric, scale s_w[n] = max|W[n, :]| / 127), stored
// offset by +128 as uint8; qx: each row of x quantized per block of 64 values at call time
// (scale s_x[m, b] = max|x[m, block]| / 127, round to nearest even). The block dots are exact
// integers: vpdpbusd multiplies the unsigned weight bytes by the signed activation bytes, and
// the +128 offset is taken back per 4-value lane group (128 * the sum of those four qx, an exact
// int32 computed with the quantization). Each output element sums its blocks in the same order
// whatever M is, so every row's bits are independent of the rows beside it.
//
// Only the draft model runs this: its outputs decide which tokens are proposed, never which are
// emitted, so a quantized draft leaves greedy output identical and sampling exact. The spec is
// specrt.kernels.reference.int8_linear.
#include "gemv_int8.h"

#include <immintrin.h>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cpu_features.h"
#include "gemv_tiled.h"

namespace specrt {

namespace {

constexpr int QBLOCK = 64;           // activation values per scale: one vector of bytes
// 4 weight rows x 3 rows of x: 12 accumulators + per x row its bytes, lane corrections and
// scale (9) + the weight bytes and a product fit the 32 vector registers.
constexpr int NB_I8 = 8, MB_I8 = 2;


// Rows of quantized x: bytes [M, K], lane corrections [M, K / 4], block scales [M, K / 64].
struct QRows {
  const int8_t* q;
  const int32_t* corr;
  const float* scale;
  int64_t K;
  QRows rows(int64_t m) const { return {q + m * K, corr + m * (K / 4), scale + m * (K / QBLOCK), K}; }
};

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
  const __m512i zero = _mm512_setzero_si512();
#pragma GCC unroll 8
  for (int i = 0; i < NB; ++i) {
    __m512i wv = _mm512_loadu_si512(w + i * K + k);
#pragma GCC unroll 8
    for (int j = 0; j < MB; ++j) {
      __m512i d = _mm512_sub_epi32(_mm512_dpbusd_epi32(zero, wv, xv[j]), cv[j]);   // exact
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

// 16 values of x as fp32.
SPECRT_AVX512 SPECRT_INLINE __m512 load16(const float* x) { return _mm512_loadu_ps(x); }
SPECRT_AVX512 SPECRT_INLINE __m512 load16(const uint16_t* x) {
  __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// Quantize one row of x (K values, bf16 or fp32) per block of 64: bytes, scales, and the lane
// corrections 128 * (sum of each 4 consecutive bytes), exact, by vpdpbusd with 128s. Rounding:
// cvtps2dq under the default rounding mode (to nearest, ties to even), as the reference's
// torch.round.
template <typename T>
SPECRT_AVX512_VNNI void quantize_row(const T* x, int64_t K, int8_t* q, float* scale,
                                     int32_t* corr) {
  const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
  const __m512i offset = _mm512_set1_epi8(char(0x80));       // 128 as an unsigned byte
  for (int64_t b = 0; b < K / QBLOCK; ++b) {
    __m512 v[4];
    __m512 amax = _mm512_setzero_ps();
    for (int i = 0; i < 4; ++i) {
      v[i] = load16(x + b * QBLOCK + 16 * i);
      amax = _mm512_max_ps(amax, _mm512_abs_ps(v[i]));
    }
    float m = _mm512_reduce_max_ps(amax);
    float inv = m > 0.0f ? 127.0f / m : 0.0f;
    scale[b] = m / 127.0f;
    __m512 vinv = _mm512_set1_ps(inv);
    for (int i = 0; i < 4; ++i) {
      __m512i r = _mm512_cvtps_epi32(_mm512_mul_ps(v[i], vinv));
      r = _mm512_min_epi32(_mm512_max_epi32(r, lo), hi);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + b * QBLOCK + 16 * i), _mm512_cvtepi32_epi8(r));
    }
    __m512i bytes = _mm512_loadu_si512(q + b * QBLOCK);
    _mm512_storeu_si512(corr + b * (QBLOCK / 4),
                        _mm512_dpbusd_epi32(_mm512_setzero_si512(), offset, bytes));
  }
}


}  // namespace

bool cpu_supports_int8() { return cpu_supported() && cpu_supported_vnni(); }

void gemv_int8(const void* x, bool x_f32, const uint8_t* w, const float* w_scale,
               const void* bias, void* out, bool out_f32, int64_t M, int64_t N, int64_t K,
               int threads) {
  std::vector<int8_t> q(size_t(M * K));
  std::vector<int32_t> corr(size_t(M * (K / 4)));
  std::vector<float> scale(size_t(M * (K / QBLOCK)));
  for (int64_t m = 0; m < M; ++m) {
    if (x_f32)
      quantize_row(static_cast<const float*>(x) + m * K, K, &q[m * K], &scale[m * (K / QBLOCK)],
                   &corr[m * (K / 4)]);
    else
      quantize_row(static_cast<const uint16_t*>(x) + m * K, K, &q[m * K],
                   &scale[m * (K / QBLOCK)], &corr[m * (K / 4)]);
  }
  auto store = [&](int64_t m, int64_t n, float v) {
    v *= w_scale[n];
    if (bias) v += x_f32 ? static_cast<const float*>(bias)[n]
                         : bf16_to_f32(static_cast<const uint16_t*>(bias)[n]);
    if (out_f32) static_cast<float*>(out)[m * N + n] = v;
    else static_cast<uint16_t*>(out)[m * N + n] = f32_to_bf16(v);
  };
  gemv_tiled<NB_I8, MB_I8, 1024>(QRows{q.data(), corr.data(), scale.data(), K}, w, M, N, K,
                                 threads, block_i8_table, store);
}

}  // namespace specrt
