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

struct Quantized16 {
  std::vector<int16_t> q;
  std::vector<float> scale;
  std::vector<int32_t> offset;
  Quantized16(const void* x, bool x_f32, int64_t M, int64_t K)
      : q(size_t(M * K)), scale(size_t(M * (K / QBLOCK))), offset(size_t(M * (K / QBLOCK) * 8)) {
    for (int64_t m = 0; m < M; ++m)
      for (int64_t b = 0; b < K / QBLOCK; ++b) {
        float v[QBLOCK], amax = 0.0f;
        for (int i = 0; i < QBLOCK; ++i) {
          const int64_t k = m * K + b * QBLOCK + i;
          v[i] = x_f32 ? static_cast<const float*>(x)[k]
                       : bf16_to_f32(static_cast<const uint16_t*>(x)[k]);
          amax = std::fmax(amax, std::fabs(v[i]));
        }
        const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        int32_t sum = 0;
        for (int i = 0; i < QBLOCK; ++i) {       // nearbyint: to nearest even, as torch.round
          float r = std::fmin(std::fmax(std::nearbyint(v[i] * inv), -127.0f), 127.0f);
          q[size_t(m * K + b * QBLOCK + i)] = int16_t(r);
          sum += int32_t(r);
        }
        scale[size_t(m * (K / QBLOCK) + b)] = amax / 127.0f;
        offset[size_t((m * (K / QBLOCK) + b) * 8)] = -128 * sum;
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
  const Quantized16 qx(x, x_f32, M, K);
  const QuantStore put{bias, x_f32, out, out_f32, N};
  auto store = [&](int64_t m, int64_t n, float v) { put(m, n, v * w_scale[n]); };
  gemv_tiled<NB, MB, 1024, 1, Ahead::next_tile>(qx.view(K), w, M, N, K, threads, block_table,
                                               store, reduce16_pairwise);
}

}  // namespace specrt
