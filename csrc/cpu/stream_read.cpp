// The memory-read floor of a decode step: stream a buffer once with AVX-512 loads on `threads`
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

uint64_t stream_read(const void* data, int64_t nbytes, int threads) {
  const char* p = static_cast<const char*>(data);
  const int64_t lines = nbytes / 64;
  uint64_t sum = 0;
  #pragma omp parallel num_threads(threads) reduction(^ : sum)
  {
#ifdef _OPENMP
    int t = omp_get_thread_num(), n = omp_get_num_threads();
#else
    int t = 0, n = 1;
#endif
    int64_t lo = lines * t / n, hi = lines * (t + 1) / n;
    sum ^= xor_lines(p + lo * 64, hi - lo);
  }
  return sum;
}

}  // namespace specrt
