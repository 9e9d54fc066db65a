// gemv_int8.cpp's product for CPUs without AVX-512 VNNI (AVX2): the same quantization of x
// (per row and block of 64 values, round to nearest even, -127..127), the same exact integer
// block dots, scaled and summed in fp32 in a fixed order whatever M is. Without vpdpbusd the
// weight bytes are widened to 16 bits (vpmovzxbw) and multiplied with x's values as 16-bit
// pairs into exact int32 lanes (vpmaddwd: |255 * 127| * 2 fits); the +128 the weights are
// stored with is taken back once per block (128 * the block's sum of x's values).
#include "gemv_int8_avx2.h"

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "cpu_features.h"
#include "gemv_quant.h"
#include "gemv_tiled.h"
#include "simd.h"

namespace specrt {

namespace {

// x quantized for the AVX2 blocks: per row its values as int16 [M, K], and per block of 64
// the scale [M, K / 64] and the correction [M, K / 64, 8]: -128 * the sum of its values in
// lane 0, zeros in the others (what the block's integer lanes start from).
struct Q16Rows {
  const int16_t* q;
  const float* scale;
  const int32_t* offset;
  int64_t K;
  Q16Rows rows(int64_t m) const {
    return {q + m * K, scale + m * (K / QBLOCK), offset + m * (K / QBLOCK) * 8, K};
  }
};

// 8 values of x as fp32.
SPECRT_AVX2 SPECRT_INLINE __m256 load8(const float* x) { return _mm256_loadu_ps(x); }
SPECRT_AVX2 SPECRT_INLINE __m256 load8(const uint16_t* x) {
  return avx2::widen(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x)));
}

// One row of x (K values, bf16 or fp32): per block its values as int16, its scale and its
// correction (as Q16Rows holds them). The products round under the default rounding mode (to
// nearest, ties to even, as the reference's torch.round) and are clamped to -127..127.
template <typename T>
SPECRT_AVX2 static void quantize_row16(const T* x, int64_t K, int16_t* q, float* scale,
                                       int32_t* offset) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
  for (int64_t b = 0; b < K / QBLOCK; ++b) {
    __m256 v[QBLOCK / 8];
    __m256 amax = _mm256_setzero_ps();
    int nan = 0;                       // vmaxps drops a NaN operand: seen apart
    for (int i = 0; i < QBLOCK / 8; ++i) {
      v[i] = load8(x + b * QBLOCK + 8 * i);
      amax = _mm256_max_ps(amax, _mm256_and_ps(v[i], abs_mask));
      nan |= _mm256_movemask_ps(_mm256_cmp_ps(v[i], v[i], _CMP_UNORD_Q));
    }
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, amax);
    float m = 0.0f;
    for (float l : lanes) m = std::fmax(m, l);
    const __m256 inv = _mm256_set1_ps(m > 0.0f ? 127.0f / m : 0.0f);
    __m256i sum = _mm256_setzero_si256();
    for (int i = 0; i < QBLOCK / 8; i += 2) {
      __m256i r0 = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inv));
      __m256i r1 = _mm256_cvtps_epi32(_mm256_mul_ps(v[i + 1], inv));
      r0 = _mm256_min_epi32(_mm256_max_epi32(r0, lo), hi);
      r1 = _mm256_min_epi32(_mm256_max_epi32(r1, lo), hi);
      sum = _mm256_add_epi32(sum, _mm256_add_epi32(r0, r1));
      // packs works within 128-bit halves: [r0 0-3, r1 0-3, r0 4-7, r1 4-7] -> value order
      __m256i packed = _mm256_permute4x64_epi64(_mm256_packs_epi32(r0, r1), 0xD8);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + b * QBLOCK + 8 * i), packed);
    }
    alignas(32) int32_t parts[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(parts), sum);
    int32_t total = 0;
    for (int32_t p : parts) total += p;
    scale[b] = block_scale(m, nan != 0);
    offset[b * 8] = -128 * total;
  }
}

struct Quantized16 {
  std::vector<int16_t> q;
  std::vector<float> scale;
  std::vector<int32_t> offset;
  Quantized16(const void* x, bool x_f32, int64_t M, int64_t K)
      : q(size_t(M * K)), scale(size_t(M * (K / QBLOCK))), offset(size_t(M * (K / QBLOCK) * 8)) {
    for (int64_t m = 0; m < M; ++m) {
      int16_t* qm = &q[size_t(m * K)];
      float* sm = &scale[size_t(m * (K / QBLOCK))];
      int32_t* om = &offset[size_t(m * (K / QBLOCK) * 8)];
      if (x_f32) quantize_row16(static_cast<const float*>(x) + m * K, K, qm, sm, om);
      else quantize_row16(static_cast<const uint16_t*>(x) + m * K, K, qm, sm, om);
    }
  }
  Q16Rows view(int64_t K) const { return {q.data(), scale.data(), offset.data(), K}; }
};

// 4 weight rows x 2 rows of x: 8 accumulators + a weight row's 64 widened bytes (4) + a block
// dot; x is read from L1 by the multiplies.
constexpr int NB = 4, MB = 2;

template <int NBT, int MBT>
SPECRT_AVX2 static void block_i8(Q16Rows x, const uint8_t* w, int64_t K, int64_t k0, int64_t k1,
                                 float* state /*[NBT * MBT][16]: 8 lanes used*/, Prefetch pf) {
  __m256 acc[NBT * MBT];
#pragma GCC unroll 16
  for (int a = 0; a < NBT * MBT; ++a) acc[a] = _mm256_loadu_ps(state + 16 * a);
  for (int64_t k = k0; k < k1; k += QBLOCK) {
    pf.step();
    const int64_t b = k / QBLOCK;
#pragma GCC unroll 8
    for (int i = 0; i < NBT; ++i) {
      __m256i wv[4];
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c)
        wv[c] = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + i * K + k + 16 * c)));
#pragma GCC unroll 2
      for (int j = 0; j < MBT; ++j) {
        const int16_t* xq = x.q + j * x.K + k;
        // the exact block dot, in 8 lanes: the correction, then the four 16-value products
        __m256i d = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.offset + (j * (x.K / QBLOCK) + b) * 8));
#pragma GCC unroll 4
        for (int c = 0; c < 4; ++c)
          d = _mm256_add_epi32(d, _mm256_madd_epi16(wv[c], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 16 * c))));
        acc[i * MBT + j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d),
                                           _mm256_set1_ps(x.scale[j * (x.K / QBLOCK) + b]),
                                           acc[i * MBT + j]);
      }
    }
  }
#pragma GCC unroll 16
  for (int a = 0; a < NBT * MBT; ++a) _mm256_storeu_ps(state + 16 * a, acc[a]);
}

#define SPECRT_I8_ROW2(N) block_i8<N, 1>, block_i8<N, 2>
Block<Q16Rows, uint8_t> block_table[NB][MB] = {
    {SPECRT_I8_ROW2(1)}, {SPECRT_I8_ROW2(2)}, {SPECRT_I8_ROW2(3)}, {SPECRT_I8_ROW2(4)}};

}  // namespace

void gemv_int8_avx2(const void* x, bool x_f32, const uint8_t* w, const float* w_scale,
                    const void* bias, void* out, bool out_f32, int64_t M, int64_t N, int64_t K,
                    int threads) {
  if (M > M_CHUNK) {      // in chunks, a pass each (gemv_tiled.h)
    const size_t x_row = size_t(K) * (x_f32 ? 4 : 2), out_row = size_t(N) * (out_f32 ? 4 : 2);
    for (auto [m0, mc] : near_equal_parts(M, M_CHUNK))
      gemv_int8_avx2(static_cast<const char*>(x) + m0 * x_row, x_f32, w, w_scale, bias,
                     static_cast<char*>(out) + m0 * out_row, out_f32, mc, N, K, threads);
    return;
  }
  const Quantized16 qx(x, x_f32, M, K);
  const QuantStore store{w_scale, bias, x_f32, out, out_f32, N};
  gemv_tiled<NB, MB, 1024, 1, Ahead::next_tile>(qx.view(K), w, M, N, K, threads, block_table,
                                               store, reduce16_pairwise);
}

}  // namespace specrt
