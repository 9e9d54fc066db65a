// The per-layer glue of a CPU decode or verify step: RMSNorm (with the residual add fused),
// SiLU-and-multiply, and RoPE + KV-cache write + grouped-query attention for a few rows.
//
// Why in C++: a decode step of the 1.5B target spends ~80 ms streaming weights and, in PyTorch,
// another 7-12 ms in ~30 small ops per layer (norms, rotary, softmax, residuals, dispatch).
// Here each of those is one call per layer. And why every row on its own: PyTorch's attention
// rounds a query differently depending on how many queries share the call, so in bf16 a verify
// pass (K + 1 rows) and a decode step disagreed at near-ties and greedy speculative output drifted
// from plain greedy. Here each output row depends only on its own inputs and position, in a fixed
// order of operations, so the two agree bit for bit (the matmuls in gemv.cpp do the same).
//
// The PyTorch functions in specrt/model/backends/torch_ref.py (rms_norm, apply_rope, sdpa_attention) are the
// specification; specrt/kernels/cpu/ops.py checks the arguments and dispatches. Rounding follows
// the reference: fp32 arithmetic, and in bf16 a rounding after each step the reference rounds
// (x * r, w * n, x + y, silu, products).
#include "ops.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu_features.h"

namespace specrt {

// --- 16 lanes of T as fp32 ----------------------------------------------------------------
static inline __mmask16 lanes(int64_t n) { return n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1); }

SPECRT_AVX512 SPECRT_INLINE __m512 load(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
SPECRT_AVX512 SPECRT_INLINE __m512 load(const uint16_t* p, __mmask16 m) {
  __m512i w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}
SPECRT_AVX512 SPECRT_INLINE void store(float* p, __m512 v, __mmask16 m) { _mm512_mask_storeu_ps(p, m, v); }
SPECRT_AVX512 SPECRT_INLINE void store(uint16_t* p, __m512 v, __mmask16 m) {
  _mm256_mask_storeu_epi16(p, m, (__m256i)_mm512_cvtneps_pbh(v));   // round to nearest even
}
// The value T holds after rounding v into it.
SPECRT_AVX512 SPECRT_INLINE __m512 round_to(const float*, __m512 v) { return v; }
SPECRT_AVX512 SPECRT_INLINE __m512 round_to(const uint16_t*, __m512 v) {
  __m512i w = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(v));
  return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}

// exp(x) to within ~1 ulp: x = n ln2 + r, |r| <= ln2 / 2, degree-7 Taylor polynomial, 2^n by
// scalef. Same lanes in, same bits out, on every call.
SPECRT_AVX512 SPECRT_INLINE __m512 exp16(__m512 x) {
  x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.7f)), _mm512_set1_ps(-104.0f));
  __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);      // ln2 high part
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860682030941723212e-6f), r);       // ln2 low part
  __m512 p = _mm512_set1_ps(1.0f / 5040);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// --- RMSNorm ---------------------------------------------------------------------------------
template <typename T>
SPECRT_AVX512 static void norm_row(const T* x, const T* w, float eps, T* out, int64_t H) {
  __m512 ss = _mm512_setzero_ps();
  for (int64_t k = 0; k < H; k += 16) {
    __m512 v = load(x + k, lanes(H - k));
    ss = _mm512_fmadd_ps(v, v, ss);
  }
  const __m512 r = _mm512_set1_ps(1.0f / std::sqrt(_mm512_reduce_add_ps(ss) / float(H) + eps));
  for (int64_t k = 0; k < H; k += 16) {
    __mmask16 m = lanes(H - k);
    __m512 n = round_to(x, _mm512_mul_ps(load(x + k, m), r));
    store(out + k, _mm512_mul_ps(load(w + k, m), n), m);
  }
}

template <typename T>
SPECRT_AVX512 static void rms_norm_k(const T* x, const T* w, float eps, T* out, int64_t M, int64_t H) {
  for (int64_t i = 0; i < M; ++i) norm_row(x + i * H, w, eps, out + i * H, H);
}

template <typename T>
SPECRT_AVX512 static void add_rms_norm_k(T* x, const T* y, const T* w, float eps, T* out, int64_t M, int64_t H) {
  for (int64_t i = 0; i < M; ++i) {
    T* xr = x + i * H;
    const T* yr = y + i * H;
    for (int64_t k = 0; k < H; k += 16) {
      __mmask16 m = lanes(H - k);
      store(xr + k, _mm512_add_ps(load(xr + k, m), load(yr + k, m)), m);
    }
    norm_row(xr, w, eps, out + i * H, H);
  }
}

// --- SwiGLU ----------------------------------------------------------------------------------
template <typename T>
SPECRT_AVX512 static void silu_mul_k(const T* gu, T* out, int64_t M, int64_t I) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t i = 0; i < M; ++i) {
    const T* g = gu + i * 2 * I;
    for (int64_t k = 0; k < I; k += 16) {
      __mmask16 m = lanes(I - k);
      __m512 gv = load(g + k, m);
      __m512 s = _mm512_div_ps(gv, _mm512_add_ps(one, exp16(_mm512_sub_ps(_mm512_setzero_ps(), gv))));
      store(out + i * I + k, _mm512_mul_ps(round_to(g, s), load(g + I + k, m)), m);
    }
  }
}

// --- RoPE + cache write + attention -------------------------------------------------------------
// Rotate-half RoPE of one head vector x [D] at the position whose tables are c, s [D]:
// out = x * c + rotate_half(x) * s, each product and the sum rounded to T.
template <typename T, typename Out>
SPECRT_AVX512 SPECRT_INLINE void rope(const T* x, const T* c, const T* s, Out* out, int64_t D) {
  const int64_t half = D / 2;
  for (int64_t k = 0; k < half; k += 16) {
    __mmask16 m = lanes(half - k);
    __m512 lo = load(x + k, m), hi = load(x + half + k, m);
    __m512 a = round_to(x, _mm512_mul_ps(lo, load(c + k, m)));
    __m512 b = round_to(x, _mm512_mul_ps(hi, load(s + k, m)));
    store(out + k, round_to(x, _mm512_sub_ps(a, b)), m);
    a = round_to(x, _mm512_mul_ps(hi, load(c + half + k, m)));
    b = round_to(x, _mm512_mul_ps(lo, load(s + half + k, m)));
    store(out + half + k, round_to(x, _mm512_add_ps(a, b)), m);
  }
}

// The softmax numerators in place: scores[j] <- exp(scores[j] - best) for j < n, summed in a
// fixed order; returns 1 / their sum.
SPECRT_AVX512 SPECRT_INLINE float exp_scores(float* scores, int64_t n, float best) {
  __m512 total = _mm512_setzero_ps();
  const __m512 top = _mm512_set1_ps(best);
  for (int64_t j = 0; j < n; j += 16) {
    __mmask16 m = lanes(n - j);
    __m512 e = _mm512_maskz_mov_ps(m, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, scores + j), top)));
    _mm512_mask_storeu_ps(scores + j, m, e);
    total = _mm512_add_ps(total, e);
  }
  return 1.0f / _mm512_reduce_add_ps(total);
}

// One query q [D] (fp32, already holding T's values) against keys 0..n-1 of one kv head
// (k, v [n, D]): out = softmax(q . k * scale) @ v, scores [n] as scratch.
template <typename T>
SPECRT_AVX512 static void attend_one(const float* q, const T* k, const T* v, int64_t n, int64_t D,
                                     float scale, float* scores, T* out) {
  float best = -INFINITY;
  for (int64_t j = 0; j < n; ++j) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t d = 0; d < D; d += 16) {
      __mmask16 m = lanes(D - d);
      acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q + d), load(k + j * D + d, m), acc);
    }
    scores[j] = _mm512_reduce_add_ps(acc) * scale;
    best = std::max(best, scores[j]);
  }
  const __m512 inv = _mm512_set1_ps(exp_scores(scores, n, best));
  for (int64_t d = 0; d < D; d += 16) {     // out[d] = sum_j p_j v_j[d], j in order
    __mmask16 m = lanes(D - d);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t j = 0; j < n; ++j)
      acc = _mm512_fmadd_ps(_mm512_set1_ps(scores[j]), load(v + j * D + d, m), acc);
    store(out + d, _mm512_mul_ps(acc, inv), m);
  }
}

// The same for D = 16 * ND (64 and 128: the Qwen2.5 family), with the same order of every sum,
// so the same bits: only the schedule differs. Four keys' dot products and the ND output
// vectors are independent chains, so the FMAs overlap instead of each waiting for the last
// (one chain per output vector over 2,000 keys made a long-context verify pass slower than SDPA).
template <typename T, int ND>
SPECRT_AVX512 static void attend_fixed(const float* q, const T* k, const T* v, int64_t n,
                                       float scale, float* scores, T* out) {
  constexpr int64_t D = 16 * ND;
  constexpr __mmask16 all = 0xffff;
  __m512 qv[ND];
#pragma GCC unroll 8
  for (int c = 0; c < ND; ++c) qv[c] = _mm512_loadu_ps(q + 16 * c);
  float best = -INFINITY;
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
#pragma GCC unroll 8
    for (int c = 0; c < ND; ++c)
#pragma GCC unroll 4
      for (int r = 0; r < 4; ++r) acc[r] = _mm512_fmadd_ps(qv[c], load(k + (j + r) * D + 16 * c, all), acc[r]);
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) {
      scores[j + r] = _mm512_reduce_add_ps(acc[r]) * scale;
      best = std::max(best, scores[j + r]);
    }
  }
  for (; j < n; ++j) {
    __m512 acc = _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int c = 0; c < ND; ++c) acc = _mm512_fmadd_ps(qv[c], load(k + j * D + 16 * c, all), acc);
    scores[j] = _mm512_reduce_add_ps(acc) * scale;
    best = std::max(best, scores[j]);
  }
  const __m512 inv = _mm512_set1_ps(exp_scores(scores, n, best));
  __m512 acc[ND];
#pragma GCC unroll 8
  for (int c = 0; c < ND; ++c) acc[c] = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; ++i) {
    const __m512 p = _mm512_set1_ps(scores[i]);
#pragma GCC unroll 8
    for (int c = 0; c < ND; ++c) acc[c] = _mm512_fmadd_ps(p, load(v + i * D + 16 * c, all), acc[c]);
  }
#pragma GCC unroll 8
  for (int c = 0; c < ND; ++c) store(out + 16 * c, _mm512_mul_ps(acc[c], inv), all);
}

template <typename T>
SPECRT_AVX512 static void attend(const float* q, const T* k, const T* v, int64_t n, int64_t D,
                                 float scale, float* scores, T* out) {
  if (D == 128) attend_fixed<T, 8>(q, k, v, n, scale, scores, out);
  else if (D == 64) attend_fixed<T, 4>(q, k, v, n, scale, scores, out);
  else attend_one(q, k, v, n, D, scale, scores, out);
}

template <typename T>
SPECRT_AVX512 static void rope_attention_k(const T* qkv, T* k_cache, T* v_cache, const T* cos, const T* sin,
                                  const int64_t* starts, const int64_t* offsets, T* out,
                                  AttentionShape sh, int threads) {
  const int64_t B = sh.B, Hq = sh.Hq, Hkv = sh.Hkv, D = sh.D, S = sh.S;
  const int64_t M = offsets[B], row = (Hq + 2 * Hkv) * D, group = Hq / Hkv;
  auto cache_at = [&](T* base, int64_t b, int64_t h, int64_t p) { return base + ((b * Hkv + h) * S + p) * D; };

  // 1. Rotate q (kept in fp32, with T's values) and write every token's k, v into the cache.
  std::vector<float> q(static_cast<size_t>(M * Hq * D));
  std::vector<T> tmp(static_cast<size_t>(D));     // one rotated head in T
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t m = offsets[b]; m < offsets[b + 1]; ++m) {
      const int64_t p = starts[b] + (m - offsets[b]);
      const int64_t pr = std::min(p, sh.S_rope - 1);
      const T* src = qkv + m * row;
      const T* c = cos + pr * D;
      const T* s = sin + pr * D;
      for (int64_t h = 0; h < Hq; ++h) {
        rope(src + h * D, c, s, tmp.data(), D);
        for (int64_t d = 0; d < D; d += 16) {
          __mmask16 mk = lanes(D - d);
          _mm512_mask_storeu_ps(&q[size_t((m * Hq + h) * D + d)], mk, load(tmp.data() + d, mk));
        }
      }
      for (int64_t h = 0; h < Hkv; ++h) {
        rope(src + (Hq + h) * D, c, s, cache_at(k_cache, b, h, p), D);
        std::copy(src + (Hq + Hkv + h) * D, src + (Hq + Hkv + h + 1) * D, cache_at(v_cache, b, h, p));
      }
    }
  }
  // 2. Every (row of the batch, query head) on its own: its queries against its kv head.
  #pragma omp parallel num_threads(threads)
  {
    std::vector<float> scores(static_cast<size_t>(S));
    #pragma omp for schedule(static)
    for (int64_t task = 0; task < B * Hq; ++task) {
      const int64_t b = task / Hq, h = task % Hq, kvh = h / group;
      for (int64_t m = offsets[b]; m < offsets[b + 1]; ++m) {
        const int64_t p = starts[b] + (m - offsets[b]);
        attend(&q[size_t((m * Hq + h) * D)], cache_at(k_cache, b, kvh, 0),
               cache_at(v_cache, b, kvh, 0), p + 1, D, sh.scale, scores.data(),
               out + (m * Hq + h) * D);
      }
    }
  }
}

// The entry points (compiled for the baseline ISA; the callers check cpu_supported first).
template <typename T>
void rms_norm(const T* x, const T* w, float eps, T* out, int64_t M, int64_t H) {
  rms_norm_k(x, w, eps, out, M, H);
}
template <typename T>
void add_rms_norm(T* x, const T* y, const T* w, float eps, T* out, int64_t M, int64_t H) {
  add_rms_norm_k(x, y, w, eps, out, M, H);
}
template <typename T>
void silu_mul(const T* gu, T* out, int64_t M, int64_t I) { silu_mul_k(gu, out, M, I); }
template <typename T>
void rope_attention(const T* qkv, T* k_cache, T* v_cache, const T* cos, const T* sin,
                    const int64_t* starts, const int64_t* offsets, T* out, AttentionShape shape,
                    int threads) {
  rope_attention_k(qkv, k_cache, v_cache, cos, sin, starts, offsets, out, shape, threads);
}

#define SPECRT_INSTANTIATE(T)                                                                   \
  template void rms_norm<T>(const T*, const T*, float, T*, int64_t, int64_t);                   \
  template void add_rms_norm<T>(T*, const T*, const T*, float, T*, int64_t, int64_t);           \
  template void silu_mul<T>(const T*, T*, int64_t, int64_t);                                    \
  template void rope_attention<T>(const T*, T*, T*, const T*, const T*, const int64_t*,        \
                                  const int64_t*, T*, AttentionShape, int);
SPECRT_INSTANTIATE(float)
SPECRT_INSTANTIATE(uint16_t)

}  // namespace specrt
