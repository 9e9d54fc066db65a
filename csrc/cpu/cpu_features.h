// The one place that says which x86 extensions the CPU kernels need. Kernels are compiled for
// them per function (SPECRT_AVX512, SPECRT_AVX2) or per region (#pragma GCC target, simd.h)
// while the rest of the module stays baseline x86-64, so the extension imports anywhere; its
// callers ask cpu_supported() before the first kernel call and take the library path when it is
// false. Two levels serve the bf16/fp32 kernels: AVX-512 (with BF16 dot products) where the CPU
// has it, else AVX2 + FMA (bf16 widened to fp32 in registers). Keep each level's target list
// and its run-time test identical: a kernel built for an extension the test does not check
// would die with SIGILL on such a CPU.
#pragma once

#define SPECRT_AVX512_TARGET "avx512f,avx512bw,avx512vl,avx512bf16"
#define SPECRT_AVX2_TARGET "avx2,fma,f16c"
#define SPECRT_AVX512 __attribute__((target(SPECRT_AVX512_TARGET)))
#define SPECRT_AVX2 __attribute__((target(SPECRT_AVX2_TARGET)))
// The int8 kernels (gemv_int8.cpp) also use AVX-512 VNNI.
#define SPECRT_AVX512_VNNI __attribute__((target(SPECRT_AVX512_TARGET ",avx512vnni")))
#define SPECRT_INLINE __attribute__((always_inline)) inline

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace specrt {

// SPECRT_CPU_LEVEL=avx2 runs the AVX2 kernels on an AVX-512 CPU (tests and comparisons; read
// once per process).
inline bool cpu_avx512() {
  static const bool yes = [] {
    const char* level = std::getenv("SPECRT_CPU_LEVEL");
    return !(level && std::strcmp(level, "avx2") == 0) && __builtin_cpu_supports("avx512f") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512bf16");
  }();
  return yes;
}

inline bool cpu_avx2() {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
         __builtin_cpu_supports("f16c");
}

// The bf16/fp32 kernels (gemv, ops, the layer loop) run at one of the two levels.
inline bool cpu_supported() { return cpu_avx512() || cpu_avx2(); }

// Which level they run at here: "avx512", "avx2" or "none".
inline const char* cpu_level() { return cpu_avx512() ? "avx512" : cpu_avx2() ? "avx2" : "none"; }

// The int8 and int4 kernels of gemv_int8.cpp / gemv_int4.cpp: AVX-512 and its VNNI.
inline bool cpu_avx512_vnni() { return cpu_avx512() && __builtin_cpu_supports("avx512vnni"); }

// AMX tiles with int8 dot products (gemv_int8_amx.cpp), with VNNI for the rest of the int8
// kernels: the CPU has them (CPUID leaf 7: AMX-TILE, AMX-INT8) and Linux lets this process use
// the tile registers (arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA, asked once; Linux >= 5.16).
// SPECRT_AMX=0, or SPECRT_CPU_LEVEL=avx2, leaves them unused (read once per process).
#if (defined(__clang__) && __clang_major__ >= 12) || \
    (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 11)
#define SPECRT_HAS_AMX 1           // the compiler targets AMX (GCC 11, Clang 12)
#else
#define SPECRT_HAS_AMX 0           // an older one builds without the AMX kernel
#endif
#define SPECRT_AMX_INT8 \
  __attribute__((target(SPECRT_AVX512_TARGET ",avx512vnni,amx-tile,amx-int8")))
inline bool cpu_amx_int8() {
  static const bool yes = [] {
    const char* amx = std::getenv("SPECRT_AMX");
    if (!SPECRT_HAS_AMX || (amx && std::strcmp(amx, "0") == 0) || !cpu_avx512_vnni())
      return false;
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)) || !(d & (1u << 25)))
      return false;
#if defined(__linux__) && defined(SYS_arch_prctl)
    constexpr long ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
#else
    return false;
#endif
  }();
  return yes;
}

}  // namespace specrt
