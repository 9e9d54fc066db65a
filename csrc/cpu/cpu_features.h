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

// An AMD Zen 4 (family 0x19 with AVX-512): it runs each 512-bit operation as two 256-bit
// halves, so a 512-bit load takes its load ports for a whole cycle, and kernels that load more
// per product than others pay more there than on a Zen 5 or a Xeon (gemv.cpp). Read once per
// process.
inline bool cpu_avx512_halves() {
  static const bool yes = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!cpu_avx512() || !__get_cpuid(0, &a, &b, &c, &d)) return false;
    const bool amd = b == 0x68747541u && d == 0x69746e65u && c == 0x444d4163u;  // AuthenticAMD
    if (!amd || !__get_cpuid(1, &a, &b, &c, &d)) return false;
    const unsigned base = (a >> 8) & 0xf, family = base == 0xf ? base + ((a >> 20) & 0xff) : base;
    return family == 0x19;
  }();
  return yes;
}

// The int8 and int4 kernels of gemv_int8.cpp / gemv_int4.cpp: AVX-512 and its VNNI.
inline bool cpu_avx512_vnni() { return cpu_avx512() && __builtin_cpu_supports("avx512vnni"); }

// AMX (Sapphire Rapids and later Xeons): SPECRT_AMX=0, or SPECRT_CPU_LEVEL=avx2, leaves the
// tiles unused.
#if (defined(__clang__) && __clang_major__ >= 12) || \
    (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 11)
#define SPECRT_HAS_AMX 1           // the compiler targets AMX (GCC 11, Clang 12)
#else
#define SPECRT_HAS_AMX 0           // an older one builds without the AMX kernel
#endif
#define SPECRT_AMX_INT8 \
  __attribute__((target(SPECRT_AVX512_TARGET ",avx512vnni,amx-tile,amx-int8")))

// The CPU has AMX-TILE and the tile dot product of CPUID leaf 7 EDX bit `bit` (22 AMX-BF16, 25
// AMX-INT8), SPECRT_AMX is not 0, the AVX-512 level is in use, and Linux lets this process use
// the tile registers (arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA; Linux >= 5.16).
inline bool amx_usable(unsigned bit) {
  const char* amx = std::getenv("SPECRT_AMX");
  if ((amx && std::strcmp(amx, "0") == 0) || !cpu_avx512()) return false;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)) || !(d & (1u << bit)))
    return false;
#if defined(__linux__) && defined(SYS_arch_prctl)
  constexpr long ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
  return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
#else
  return false;
#endif
}

// AMX tiles with int8 dot products (gemv_int8_amx.cpp), with VNNI for the rest of the int8
// kernels (read once per process).
inline bool cpu_amx_int8() {
  static const bool yes = SPECRT_HAS_AMX && cpu_avx512_vnni() && amx_usable(25);
  return yes;
}

// AMX tiles with bf16 dot products: every pass of a bf16 model packed for them
// (gemv_bf16_amx.cpp); and the library's bf16 GEMM (oneDNN) runs on them, which makes it faster
// than the AVX-512 kernels for a prompt of more than a few tokens where a model is not packed
// (specrt.kernels.cpu.gemv.PROMPT_LIBRARY_ROWS). Read once per process.
inline bool cpu_amx_bf16() {
  static const bool yes = amx_usable(22);
  return yes;
}

}  // namespace specrt
