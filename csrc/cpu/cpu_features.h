// The one place that says which x86 extensions the CPU kernels need. Kernels are compiled for
// them per function (SPECRT_AVX512) while the rest of the module stays baseline x86-64, so the
// extension imports anywhere; its callers ask cpu_supported() before the first kernel call and
// take the library path when it is false. Keep the two lists below identical: a kernel built
// for an extension the run-time test does not check would die with SIGILL on such a CPU.
#pragma once

#define SPECRT_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
// The int8 kernels (gemv_int8.cpp) also use AVX-512 VNNI.
#define SPECRT_AVX512_VNNI \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx512vnni")))
#define SPECRT_INLINE __attribute__((always_inline)) inline

namespace specrt {

inline bool cpu_supported() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
}

inline bool cpu_supported_vnni() { return __builtin_cpu_supports("avx512vnni"); }

}  // namespace specrt
