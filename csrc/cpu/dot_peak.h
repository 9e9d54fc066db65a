// The compute floor probe (see dot_peak.cpp): `steps` rounds of independent dot-product
// instructions on each of `threads` threads, multiplying 1 by `scale`. Returns the sum of every
// accumulator (dot_peak_reference in specrt/kernels/cpu/compute.py says what it must be).
#pragma once
#include <cstdint>

namespace specrt {

double dot_peak(int64_t steps, float scale, int threads);
// Floating-point operations per step and thread: a multiply-add counts two.
int64_t dot_peak_flops_per_step();

}  // namespace specrt
