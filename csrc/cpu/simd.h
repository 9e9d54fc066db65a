// 16 fp32 lanes, the vector the CPU layer ops (ops_impl.h) are written against, at the two
// levels of cpu_features.h: one AVX-512 register, or two AVX2 registers. The ops are compiled
// once per level (ops.cpp includes ops_impl.h in namespace avx512 and again in avx2, each
// inside a `#pragma GCC target` region) and run at the level cpu_avx512() picks. Lane-wise
// arithmetic is the same IEEE fp32 at both levels; the sums across lanes (reduce_add), the
// rounding to bf16 of denormals and exp's last step differ in their last bits, so each level
// keeps its own bits for a row whatever the batch, not the other level's.
//
// Every lane count n below means "the first n lanes" (n >= 16: all of them); loads give zero
// in the others, stores leave memory past n alone.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "cpu_features.h"

namespace specrt {

// exp(x) as both levels compute it, to within ~1 ulp: x clamped to [EXP_LO, EXP_HI], x = n ln2
// + r with n = round(x log2 e) and ln2 in a high and a low part (|r| <= ln2 / 2), e^r by the
// degree-7 Taylor polynomial (Horner, EXP_POLY from the highest coefficient), times 2^n.
constexpr float EXP_HI = 88.7f, EXP_LO = -104.0f, LOG2E = 1.44269504088896341f;
constexpr float LN2_HI = 0.693145751953125f, LN2_LO = 1.42860682030941723212e-6f;
constexpr float EXP_POLY[8] = {1.0f / 5040, 1.0f / 720, 1.0f / 120, 1.0f / 24,
                               1.0f / 6,    0.5f,       1.0f,       1.0f};

// --- AVX-512 (the target list is SPECRT_AVX512_TARGET: #pragma takes no macro) ----------------
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16")
namespace avx512 {

struct V { __m512 v; };

static inline __mmask16 lanes(int64_t n) { return n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1); }

SPECRT_INLINE V zero() { return {_mm512_setzero_ps()}; }
SPECRT_INLINE V set1(float x) { return {_mm512_set1_ps(x)}; }
SPECRT_INLINE V add(V a, V b) { return {_mm512_add_ps(a.v, b.v)}; }
SPECRT_INLINE V sub(V a, V b) { return {_mm512_sub_ps(a.v, b.v)}; }
SPECRT_INLINE V mul(V a, V b) { return {_mm512_mul_ps(a.v, b.v)}; }
SPECRT_INLINE V div(V a, V b) { return {_mm512_div_ps(a.v, b.v)}; }
SPECRT_INLINE V fmadd(V a, V b, V c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }   // a * b + c
SPECRT_INLINE float reduce_add(V a) { return _mm512_reduce_add_ps(a.v); }
SPECRT_INLINE V first(V a, int64_t n) { return {_mm512_maskz_mov_ps(lanes(n), a.v)}; }
SPECRT_INLINE V max_of(V a, V b) { return {_mm512_max_ps(a.v, b.v)}; }   // b where a is NaN
SPECRT_INLINE float reduce_max(V a) { return _mm512_reduce_max_ps(a.v); }
// Bit i set where lane i of a equals lane i of b (a NaN equals nothing); where it is a NaN.
SPECRT_INLINE uint32_t equal_lanes(V a, V b) { return _mm512_cmp_ps_mask(a.v, b.v, _CMP_EQ_OQ); }
SPECRT_INLINE uint32_t nan_lanes(V a) { return _mm512_cmp_ps_mask(a.v, a.v, _CMP_UNORD_Q); }

SPECRT_INLINE V load(const float* p, int64_t n = 16) { return {_mm512_maskz_loadu_ps(lanes(n), p)}; }
SPECRT_INLINE V load_or(const float* p, int64_t n, float fill) {    // fill past n
  return {_mm512_mask_loadu_ps(_mm512_set1_ps(fill), lanes(n), p)};
}
SPECRT_INLINE V load(const uint16_t* p, int64_t n = 16) {
  __m512i w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(lanes(n), p));
  return {_mm512_castsi512_ps(_mm512_slli_epi32(w, 16))};
}
SPECRT_INLINE void store(float* p, V a, int64_t n = 16) { _mm512_mask_storeu_ps(p, lanes(n), a.v); }
SPECRT_INLINE void store(uint16_t* p, V a, int64_t n = 16) {
  _mm256_mask_storeu_epi16(p, lanes(n), (__m256i)_mm512_cvtneps_pbh(a.v));   // nearest even
}
// The value T holds after rounding a into it.
SPECRT_INLINE V round_to(const float*, V a) { return a; }
SPECRT_INLINE V round_to(const uint16_t*, V a) {
  __m512i w = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(a.v));
  return {_mm512_castsi512_ps(_mm512_slli_epi32(w, 16))};
}

// exp (see EXP_POLY), 2^n by scalef. Same lanes in, same bits out, on every call.
SPECRT_INLINE V exp16(V a) {
  __m512 x = _mm512_max_ps(_mm512_min_ps(a.v, _mm512_set1_ps(EXP_HI)), _mm512_set1_ps(EXP_LO));
  __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(LOG2E)),
                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_LO), r);
  __m512 p = _mm512_set1_ps(EXP_POLY[0]);
#pragma GCC unroll 8
  for (int i = 1; i < 8; ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_POLY[i]));
  return {_mm512_scalef_ps(p, n)};
}

}  // namespace avx512
#pragma GCC pop_options

// --- AVX2 + FMA (SPECRT_AVX2_TARGET) ----------------------------------------------------------
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace avx2 {

struct V { __m256 lo, hi; };

// The lanes of an 8-lane half that are below n (n counted from the half's first lane).
SPECRT_INLINE __m256i below(int64_t n) {
  int c = int(n < 0 ? 0 : n > 8 ? 8 : n);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(c), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

SPECRT_INLINE V zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
SPECRT_INLINE V set1(float x) { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
SPECRT_INLINE V add(V a, V b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
SPECRT_INLINE V sub(V a, V b) { return {_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)}; }
SPECRT_INLINE V mul(V a, V b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
SPECRT_INLINE V div(V a, V b) { return {_mm256_div_ps(a.lo, b.lo), _mm256_div_ps(a.hi, b.hi)}; }
SPECRT_INLINE V fmadd(V a, V b, V c) {
  return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
}
// The 16 lanes folded into one by Op (Sum or Max below) in a fixed order: the two halves, their
// 128-bit halves, then pairs, then lane 0 with lane 1.
template <typename Op>
SPECRT_INLINE float fold(V a) {
  __m256 s = Op::of(a.lo, a.hi);
  __m128 q = Op::of(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  q = Op::of(q, _mm_movehl_ps(q, q));
  q = Op::of(q, _mm_movehdup_ps(q));
  return _mm_cvtss_f32(q);
}
struct Sum {
  static SPECRT_INLINE __m256 of(__m256 a, __m256 b) { return _mm256_add_ps(a, b); }
  static SPECRT_INLINE __m128 of(__m128 a, __m128 b) { return _mm_add_ps(a, b); }
};
struct Max {
  static SPECRT_INLINE __m256 of(__m256 a, __m256 b) { return _mm256_max_ps(a, b); }
  static SPECRT_INLINE __m128 of(__m128 a, __m128 b) { return _mm_max_ps(a, b); }
};
SPECRT_INLINE float reduce_add(V a) { return fold<Sum>(a); }
SPECRT_INLINE V first(V a, int64_t n) {
  return {_mm256_and_ps(a.lo, _mm256_castsi256_ps(below(n))),
          _mm256_and_ps(a.hi, _mm256_castsi256_ps(below(n - 8)))};
}
SPECRT_INLINE V max_of(V a, V b) {            // b where a is NaN
  return {_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)};
}
SPECRT_INLINE float reduce_max(V a) { return fold<Max>(a); }
SPECRT_INLINE uint32_t equal_lanes(V a, V b) {
  return uint32_t(_mm256_movemask_ps(_mm256_cmp_ps(a.lo, b.lo, _CMP_EQ_OQ))) |
         uint32_t(_mm256_movemask_ps(_mm256_cmp_ps(a.hi, b.hi, _CMP_EQ_OQ))) << 8;
}
SPECRT_INLINE uint32_t nan_lanes(V a) {
  return uint32_t(_mm256_movemask_ps(_mm256_cmp_ps(a.lo, a.lo, _CMP_UNORD_Q))) |
         uint32_t(_mm256_movemask_ps(_mm256_cmp_ps(a.hi, a.hi, _CMP_UNORD_Q))) << 8;
}

SPECRT_INLINE V load(const float* p, int64_t n = 16) {
  if (n >= 16) return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)};
  return {_mm256_maskload_ps(p, below(n)), _mm256_maskload_ps(p + 8, below(n - 8))};
}
SPECRT_INLINE V load_or(const float* p, int64_t n, float fill) {    // fill past n
  const V v = load(p, n);
  if (n >= 16) return v;
  return {_mm256_blendv_ps(_mm256_set1_ps(fill), v.lo, _mm256_castsi256_ps(below(n))),
          _mm256_blendv_ps(_mm256_set1_ps(fill), v.hi, _mm256_castsi256_ps(below(n - 8)))};
}
SPECRT_INLINE __m256 widen(__m128i h) {     // 8 bf16 -> 8 fp32
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
SPECRT_INLINE V load(const uint16_t* p, int64_t n = 16) {
  alignas(32) uint16_t tmp[16] = {};
  if (n < 16) { std::memcpy(tmp, p, size_t(n < 0 ? 0 : n) * 2); p = tmp; }
  return {widen(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
          widen(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)))};
}
SPECRT_INLINE void store(float* p, V a, int64_t n = 16) {
  if (n >= 16) { _mm256_storeu_ps(p, a.lo); _mm256_storeu_ps(p + 8, a.hi); return; }
  _mm256_maskstore_ps(p, below(n), a.lo);
  _mm256_maskstore_ps(p + 8, below(n - 8), a.hi);
}
// fp32 -> bf16 bits in the low 16 bits of each 32-bit lane: round to nearest even, NaN quiet.
SPECRT_INLINE __m256i bf16_bits(__m256 v) {
  __m256i u = _mm256_castps_si256(v);
  __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
  __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                   _mm256_set1_epi32(0x7f800000));
  __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  return _mm256_blendv_epi8(r, quiet, nan);
}
SPECRT_INLINE void store(uint16_t* p, V a, int64_t n = 16) {
  __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(bf16_bits(a.lo), bf16_bits(a.hi)), 0xd8);
  if (n >= 16) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), packed); return; }
  alignas(32) uint16_t tmp[16];
  _mm256_store_si256(reinterpret_cast<__m256i*>(tmp), packed);
  std::memcpy(p, tmp, size_t(n < 0 ? 0 : n) * 2);
}
SPECRT_INLINE V round_to(const float*, V a) { return a; }
SPECRT_INLINE V round_to(const uint16_t*, V a) {
  return {_mm256_castsi256_ps(_mm256_slli_epi32(bf16_bits(a.lo), 16)),
          _mm256_castsi256_ps(_mm256_slli_epi32(bf16_bits(a.hi), 16))};
}

// exp (see EXP_POLY), 2^n applied as two exact powers of two (n in [-150, 128]).
SPECRT_INLINE __m256 exp8(__m256 x) {
  x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(EXP_HI)), _mm256_set1_ps(EXP_LO));
  __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(LOG2E)),
                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LO), r);
  __m256 p = _mm256_set1_ps(EXP_POLY[0]);
#pragma GCC unroll 8
  for (int i = 1; i < 8; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_POLY[i]));
  __m256i ni = _mm256_cvtps_epi32(n);
  __m256i n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
  auto pow2 = [](__m256i e) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e, _mm256_set1_epi32(127)), 23));
  };
  return _mm256_mul_ps(_mm256_mul_ps(p, pow2(n1)), pow2(n2));
}
SPECRT_INLINE V exp16(V a) { return {exp8(a.lo), exp8(a.hi)}; }

}  // namespace avx2
#pragma GCC pop_options

}  // namespace specrt
