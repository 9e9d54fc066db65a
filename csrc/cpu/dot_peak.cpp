// The compute floor of a pass: how many multiply-adds a second this CPU's threads issue with the
// instruction the bf16 kernels multiply with (AVX-512 BF16's vdpbf16ps: 16 lanes, each adding
// two bf16 products to an fp32 sum; or, at the AVX2 level, fp32 FMA on bf16 widened in
// registers), on register operands only: CHAINS independent accumulators a thread, so neither
// memory nor an instruction's latency limits it. A pass of T tokens does T multiply-adds (2 T
// flops) per weight: no kernel on these instructions can do it faster than its flops at this
// rate.
#include "dot_peak.h"

#include <immintrin.h>

#include "cpu_features.h"

namespace specrt {

constexpr int CHAINS_512 = 16;   // accumulators a thread (of 32 vector registers)
constexpr int CHAINS_256 = 12;   // ... of 16

SPECRT_AVX512 static double chains_512(int64_t steps, float scale) {
  __m512 acc[CHAINS_512];
  for (auto& v : acc) v = _mm512_setzero_ps();
  const __m512bh one = (__m512bh)_mm512_set1_epi16(0x3f80);                  // bf16 1.0
  const __m512bh s = _mm512_cvtne2ps_pbh(_mm512_set1_ps(scale), _mm512_set1_ps(scale));
  for (int64_t i = 0; i < steps; ++i)
#pragma GCC unroll 16
    for (int j = 0; j < CHAINS_512; ++j) acc[j] = _mm512_dpbf16_ps(acc[j], one, s);
  double sum = 0;
  for (auto& v : acc) sum += _mm512_reduce_add_ps(v);
  return sum;
}

SPECRT_AVX2 static double chains_256(int64_t steps, float scale) {
  __m256 acc[CHAINS_256];
  for (auto& v : acc) v = _mm256_setzero_ps();
  const __m256 one = _mm256_set1_ps(1.0f), s = _mm256_set1_ps(scale);
  for (int64_t i = 0; i < steps; ++i)
#pragma GCC unroll 12
    for (int j = 0; j < CHAINS_256; ++j) acc[j] = _mm256_fmadd_ps(one, s, acc[j]);
  double sum = 0;
  alignas(32) float lanes[8];
  for (auto& v : acc) {
    _mm256_store_ps(lanes, v);
    for (float x : lanes) sum += x;
  }
  return sum;
}

int64_t dot_peak_flops_per_step() {
  // vdpbf16ps: 16 lanes x 2 products; FMA: 8 lanes x 1; a multiply-add is two operations
  return cpu_avx512() ? int64_t(CHAINS_512) * 16 * 2 * 2 : int64_t(CHAINS_256) * 8 * 2;
}

double dot_peak(int64_t steps, float scale, int threads) {
  const bool wide = cpu_avx512();
  double sum = 0;
  #pragma omp parallel num_threads(threads) reduction(+ : sum)
  sum += wide ? chains_512(steps, scale) : chains_256(steps, scale);
  return sum;
}

}  // namespace specrt
