// The memory-read floor probe (see stream_read.cpp): raw pointer, bytes (whole 64-byte lines are
// read; a tail shorter than a line is skipped), threads. Returns a checksum nobody needs, so the
// loads cannot be optimised away.
#pragma once
#include <cstdint>
#ifdef _OPENMP
#include <omp.h>
#endif

namespace specrt {

uint64_t stream_read(const void* data, int64_t nbytes, int threads);

}  // namespace specrt
