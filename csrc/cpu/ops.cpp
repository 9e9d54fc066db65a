// The per-layer glue of a CPU decode or verify step: RMSNorm (with the residual add fused),
// SiLU-and-multiply, and RoPE + KV-cache write + grouped-query attention for a few rows; and
// the argmax over a vocabulary of logits.
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
//
// The kernels themselves are in ops_impl.h, written against simd.h's 16-lane vector and
// compiled here twice: for AVX-512 and for AVX2 + FMA, the level this CPU has picked at each
// call (cpu_avx512).
#include "ops.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu_features.h"
#include "threads.h"
#include "simd.h"

namespace specrt {

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16")
namespace avx512 {
#include "ops_impl.h"
}  // namespace avx512
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace avx2 {
#include "ops_impl.h"
}  // namespace avx2
#pragma GCC pop_options

// The entry points (compiled for the baseline ISA; the callers check cpu_supported first).
template <typename T>
void rms_norm(const T* x, const T* w, float eps, T* out, int64_t M, int64_t H) {
  if (cpu_avx512()) avx512::rms_norm_k(x, w, eps, out, M, H);
  else avx2::rms_norm_k(x, w, eps, out, M, H);
}
template <typename T>
void add_rms_norm(T* x, const T* y, const T* w, float eps, T* out, int64_t M, int64_t H) {
  if (cpu_avx512()) avx512::add_rms_norm_k(x, y, w, eps, out, M, H);
  else avx2::add_rms_norm_k(x, y, w, eps, out, M, H);
}
template <typename T>
void silu_mul(const T* gu, T* out, int64_t M, int64_t I) {
  if (cpu_avx512()) avx512::silu_mul_k(gu, out, M, I);
  else avx2::silu_mul_k(gu, out, M, I);
}
template <typename T>
void rope_attention(const T* qkv, T* k_cache, T* v_cache, const T* cos, const T* sin,
                    const int64_t* starts, const int64_t* offsets, T* out, AttentionShape shape,
                    int threads) {
  int64_t keys = 0;                   // keys each query reads, summed over the queries
  for (int64_t b = 0; b < shape.B; ++b) {
    const int64_t n = offsets[b + 1] - offsets[b];
    keys += n * starts[b] + n * (n + 1) / 2;
  }
  threads = threads_for(2 * keys * shape.Hq * shape.D, threads);
  if (cpu_avx512())
    avx512::rope_attention_k(qkv, k_cache, v_cache, cos, sin, starts, offsets, out, shape, threads);
  else
    avx2::rope_attention_k(qkv, k_cache, v_cache, cos, sin, starts, offsets, out, shape, threads);
}

void argmax_rows(const float* x, int64_t R, int64_t V, int64_t row_stride, int64_t* out,
                 int threads) {
  threads = threads_for(R * V, threads);
  if (cpu_avx512()) avx512::argmax_rows_k(x, R, V, row_stride, out, threads);
  else avx2::argmax_rows_k(x, R, V, row_stride, out, threads);
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
