// The memory-read floor of a decode step: stream a buffer once with AVX-512 (or AVX2) loads on `threads`
// threads and nothing else (each thread XORs its contiguous share of 64-byte lines into eight
// independent accumulators, so the loads are the only limit). A matrix product that streams the
// same bytes cannot be faster; benchmarks compare decode steps against this, run over the
// model's own weight tensors.
#include "stream_read.h"

#include <immintrin.h>

#include "cpu_features.h"

namespace specrt {

SPECRT_AVX512 static uint64_t xor_lines(const char* p, int64_t lines) {
  __m512i a[8];
  for (auto& v : a) v = _mm512_setzero_si512();
  int64_t i = 0;
  for (; i + 8 <= lines; i += 8)
    for (int j = 0; j < 8; ++j)
      a[j] = _mm512_xor_si512(a[j], _mm512_loadu_si512(p + (i + j) * 64));
  for (; i < lines; ++i) a[0] = _mm512_xor_si512(a[0], _mm512_loadu_si512(p + i * 64));
  for (int j = 1; j < 8; ++j) a[0] = _mm512_xor_si512(a[0], a[j]);
  return uint64_t(_mm512_reduce_add_epi64(a[0]));
}

SPECRT_AVX2 static uint64_t xor_lines_avx2(const char* p, int64_t lines) {
  __m256i a[8];
  for (auto& v : a) v = _mm256_setzero_si256();
  int64_t i = 0;
  for (; i + 4 <= lines; i += 4)
    for (int j = 0; j < 8; ++j)
      a[j] = _mm256_xor_si256(a[j], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i * 64 + j * 32)));
  for (; i < lines; ++i)
    for (int j = 0; j < 2; ++j)
      a[j] = _mm256_xor_si256(a[j], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i * 64 + j * 32)));
  for (int j = 1; j < 8; ++j) a[0] = _mm256_xor_si256(a[0], a[j]);
  return uint64_t(_mm256_extract_epi64(a[0], 0) + _mm256_extract_epi64(a[0], 1) +
                  _mm256_extract_epi64(a[0], 2) + _mm256_extract_epi64(a[0], 3));
}

uint64_t stream_read(const void* data, int64_t nbytes, int threads) {
  const char* p = static_cast<const char*>(data);
  const int64_t lines = nbytes / 64;
  uint64_t sum = 0;
  const bool wide = cpu_avx512();
  #pragma omp parallel num_threads(threads) reduction(^ : sum)
  {
#ifdef _OPENMP
    int t = omp_get_thread_num(), n = omp_get_num_threads();
#else
    int t = 0, n = 1;
#endif
    int64_t lo = lines * t / n, hi = lines * (t + 1) / n;
    sum ^= wide ? xor_lines(p + lo * 64, hi - lo) : xor_lines_avx2(p + lo * 64, hi - lo);
  }
  return sum;
}

}  // namespace specrt
