// What the weight-quantized skinny products (gemv_int8.cpp, gemv_int4.cpp) share: x quantized
// per row and per block of 64 values at call time, and the rows as their block functions read
// them.
//
// Each block b of a row: scale s = max|x[block]| / 127, bytes q = round(x / s) (to nearest
// even) clamped to -127..127, and the lane corrections -OFFSET * (sum of each 4 consecutive
// bytes): the weights are stored unsigned (the signed value + OFFSET) because vpdpbusd
// multiplies unsigned by signed bytes, and a lane's exact integer dot is
//   dpbusd(w + OFFSET, q) - OFFSET * sum(q of the lane's 4 values),
// one instruction when the correction is the accumulator vpdpbusd adds to.
// The spec is specrt.kernels.cpu.gemv_int8.quantize_rows.
#pragma once

#include <immintrin.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "cpu_features.h"
#include "gemv_tiled.h"

namespace specrt {

constexpr int QBLOCK = 64;           // activation values per scale: one vector of bytes

// Rows of quantized x: bytes [M, K], lane corrections [M, K / 4] (negative: the accumulator a
// block's vpdpbusd starts from), block scales [M, K / 64].
struct QRows {
  const int8_t* q;
  const int32_t* corr;
  const float* scale;
  int64_t K;
  QRows rows(int64_t m) const {
    return {q + m * K, corr + m * (K / 4), scale + m * (K / QBLOCK), K};
  }
};

// x as the packed int8 kernels read it (gemv_int8.cpp, gemv_int8_amx.cpp): bytes [M, K], block
// scales and block corrections [M, K / 64].
struct QBlocks {
  const int8_t* q;
  const float* scale;
  const int32_t* corr;
  int64_t K;
  QBlocks rows(int64_t m) const {
    return {q + m * K, scale + m * (K / QBLOCK), corr + m * (K / QBLOCK), K};
  }
};

// 16 values of x as fp32.
SPECRT_AVX512 SPECRT_INLINE __m512 load16(const float* x) { return _mm512_loadu_ps(x); }
SPECRT_AVX512 SPECRT_INLINE __m512 load16(const uint16_t* x) {
  __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// A block's scale: max|x| / 127; NaN where the block holds a NaN or an infinity, as the
// reference's (its inf / inf and NaN values make every output of the row NaN).
SPECRT_INLINE float block_scale(float amax, bool has_nan) {
  return has_nan || std::isinf(amax) ? std::numeric_limits<float>::quiet_NaN() : amax / 127.0f;
}

// One row of x (K values, bf16 or fp32) -> bytes, block scales and lane corrections for
// weights stored + offset. Rounding: cvtps2dq under the default rounding mode (to nearest, ties
// to even), as the reference's torch.round.
template <typename T>
SPECRT_AVX512_VNNI void quantize_row(const T* x, int64_t K, uint8_t offset, int8_t* q,
                                     float* scale, int32_t* corr) {
  const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
  const __m512i off = _mm512_set1_epi8(char(offset));
  for (int64_t b = 0; b < K / QBLOCK; ++b) {
    __m512 v[4];
    __m512 amax = _mm512_setzero_ps();
    __mmask16 nan = 0;                 // vmaxps drops a NaN operand: seen apart
    for (int i = 0; i < 4; ++i) {
      v[i] = load16(x + b * QBLOCK + 16 * i);
      amax = _mm512_max_ps(amax, _mm512_abs_ps(v[i]));
      nan |= _mm512_cmp_ps_mask(v[i], v[i], _CMP_UNORD_Q);
    }
    float m = _mm512_reduce_max_ps(amax);
    float inv = m > 0.0f ? 127.0f / m : 0.0f;
    scale[b] = block_scale(m, nan != 0);
    __m512 vinv = _mm512_set1_ps(inv);
    for (int i = 0; i < 4; ++i) {
      __m512i r = _mm512_cvtps_epi32(_mm512_mul_ps(v[i], vinv));
      r = _mm512_min_epi32(_mm512_max_epi32(r, lo), hi);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + b * QBLOCK + 16 * i),
                       _mm512_cvtepi32_epi8(r));
    }
    __m512i bytes = _mm512_loadu_si512(q + b * QBLOCK);
    _mm512_storeu_si512(corr + b * (QBLOCK / 4),
                        _mm512_sub_epi32(_mm512_setzero_si512(),
                                         _mm512_dpbusd_epi32(_mm512_setzero_si512(), off, bytes)));
  }
}

// M rows of x quantized for weights stored + offset; owns its buffers.
struct QuantizedX {
  std::vector<int8_t> q;
  std::vector<int32_t> corr;
  std::vector<float> scale;
  QRows view;

  // rows > M: room for that many rows, those past M zeros.
  QuantizedX(const void* x, bool x_f32, int64_t M, int64_t K, uint8_t offset, int64_t rows = 0)
      : q(size_t(std::max(M, rows) * K)), corr(size_t(std::max(M, rows) * (K / 4))),
        scale(size_t(std::max(M, rows) * (K / QBLOCK))) {
    for (int64_t m = 0; m < M; ++m) {
      if (x_f32)
        quantize_row(static_cast<const float*>(x) + m * K, K, offset, &q[m * K],
                     &scale[m * (K / QBLOCK)], &corr[m * (K / 4)]);
      else
        quantize_row(static_cast<const uint16_t*>(x) + m * K, K, offset, &q[m * K],
                     &scale[m * (K / QBLOCK)], &corr[m * (K / 4)]);
    }
    view = QRows{q.data(), corr.data(), scale.data(), K};
  }
};

// An output element of a quantized product: x w_scale[n] where the weight has one scale a row
// (int8; int4's group scales are applied in its blocks), + bias[n] (x's dtype), stored as fp32
// or bf16 (rounded to nearest even) at out[m, n].
struct QuantStore {
  const float* w_scale;              // [N] or null
  const void* bias;                  // [N] or null
  bool x_f32;
  void* out;                         // [M, N]
  bool out_f32;
  int64_t N;
  void operator()(int64_t m, int64_t n, float v) const {
    if (w_scale) v *= w_scale[n];
    if (bias) v += x_f32 ? static_cast<const float*>(bias)[n]
                         : bf16_to_f32(static_cast<const uint16_t*>(bias)[n]);
    if (out_f32) static_cast<float*>(out)[m * N + n] = v;
    else static_cast<uint16_t*>(out)[m * N + n] = f32_to_bf16(v);
  }
};

// A QuantStore's row scales and bias for outputs n0 .. n0 + nb - 1 (nb <= 16) as vectors, for
// put_scaled / put_tile (gemv_tiled.h): null where the store has none.
struct QuantLanes {
  __m512 scale_v, bias_v;
  const __m512* scale = nullptr;
  const __m512* bias = nullptr;
};
SPECRT_AVX512 inline void load_lanes(const QuantStore& s, int64_t n0, int nb, QuantLanes& l) {
  const __mmask16 lanes = __mmask16((1u << nb) - 1);
  if (s.w_scale) {
    l.scale_v = _mm512_maskz_loadu_ps(lanes, s.w_scale + n0);
    l.scale = &l.scale_v;
  }
  if (s.bias) {
    l.bias_v = s.x_f32 ? _mm512_maskz_loadu_ps(lanes, static_cast<const float*>(s.bias) + n0)
                       : load_bf16(static_cast<const uint16_t*>(s.bias) + n0, nb);
    l.bias = &l.bias_v;
  }
}

// The same, a tile at a time (store_tile, gemv_tiled.h), for the AVX-512 kernels.
SPECRT_AVX512 inline void store_tile(const Vector512<QuantStore>& s, int64_t m0, int64_t mb,
                                     int64_t n0, int nb, const float* vals) {
  QuantLanes l;
  load_lanes(s, n0, nb, l);
  put_tile(vals, m0, mb, n0, nb, l.scale, l.bias, s.out, s.out_f32, s.N);
}

}  // namespace specrt
