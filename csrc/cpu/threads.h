// How many threads a kernel call takes. An OpenMP parallel region costs a fork and a join:
// ~10 us on the 2-core development machine (AMD EPYC, Zen 3: a 32 x 32 fp32 product through
// `kernel_linear` took 11.8-14.6 us on one thread, 21.6-22.8 on two), more than a small
// product's whole work. So work below SMALL_WORK multiply-adds (PyTorch's grain size for its
// own parallel loops) runs on the calling thread. No product of a real model is that small (the
// 0.5B's smallest weight is 896 x 896); every product of the tests' tiny models is, and their
// requests ran 1.5-1.6x faster (benchmarks/RESULTS.md, "The suite on AVX2"). Which thread
// computes a tile never changes its bits.
#pragma once

#include <cstdint>

namespace specrt {

constexpr int64_t SMALL_WORK = 1 << 15;

inline int threads_for(int64_t work, int threads) { return work < SMALL_WORK ? 1 : threads; }

}  // namespace specrt
