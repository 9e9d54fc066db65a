// pybind11 bindings of the skinny CPU matrix products (gemv.cpp) -> specrt._gemv.
// Tensors cross as raw data pointers plus sizes, which this layer cannot verify: a wrong one reads
// or writes out of bounds. specrt/kernels/cpu/gemv.py is the checked boundary (dtype, shape,
// strides, device; ValueError otherwise): call these only through it.
#include <pybind11/pybind11.h>

#include "../build_id.h"
#include "cpu_features.h"
#include "dot_peak.h"
#include "gemv.h"
#include "gemv_bf16_amx.h"
#include "gemv_int4.h"
#include "gemv_int8.h"
#include "stream_read.h"

namespace py = pybind11;

PYBIND11_MODULE(_gemv, m) {
  m.doc() = "Skinny matrix products y = x @ W.T (+ b) for CPU decoding (AVX-512 or AVX2).";
  m.def(
      "gemv_bf16",
      [](uintptr_t x, uintptr_t w, uintptr_t bias, uintptr_t out, bool out_f32, int64_t M,
         int64_t N, int64_t K, int threads) {
        py::gil_scoped_release release;
        specrt::gemv_bf16(reinterpret_cast<const uint16_t*>(x), reinterpret_cast<const uint16_t*>(w),
                          reinterpret_cast<const uint16_t*>(bias), reinterpret_cast<void*>(out),
                          out_f32, M, N, K, threads);
      },
      "bf16 x [M, K] @ w [N, K].T (+ bias [N], 0 = none) -> out [M, N] (fp32 or bf16)");
  m.def(
      "gemv_bf16_amx",
      [](uintptr_t x, uintptr_t w, uintptr_t bias, uintptr_t out, bool out_f32, int64_t M,
         int64_t N, int64_t K, int threads) {
        py::gil_scoped_release release;
        specrt::gemv_bf16_amx(reinterpret_cast<const uint16_t*>(x),
                              reinterpret_cast<const uint16_t*>(w),
                              reinterpret_cast<const uint16_t*>(bias),
                              reinterpret_cast<void*>(out), out_f32, M, N, K, threads);
      },
      "bf16 x [M, K] @ w packed for AMX (gemv_bf16_amx.cpp).T (+ bias [N], 0 = none) -> out "
      "[M, N] (fp32 or bf16); N % 16 == 0, K % 32 == 0");
  m.def(
      "gemv_f32",
      [](uintptr_t x, uintptr_t w, uintptr_t bias, uintptr_t out, int64_t M, int64_t N, int64_t K,
         int threads) {
        py::gil_scoped_release release;
        specrt::gemv_f32(reinterpret_cast<const float*>(x), reinterpret_cast<const float*>(w),
                         reinterpret_cast<const float*>(bias), reinterpret_cast<float*>(out), M, N,
                         K, threads);
      },
      "fp32 x [M, K] @ w [N, K].T (+ bias [N], 0 = none) -> out [M, N]");
  m.def(
      "gemv_int8",
      [](uintptr_t x, bool x_f32, uintptr_t w, uintptr_t w_scale, uintptr_t bias, uintptr_t out,
         bool out_f32, int64_t M, int64_t N, int64_t K, int threads) {
        py::gil_scoped_release release;
        specrt::gemv_int8(reinterpret_cast<const void*>(x), x_f32,
                          reinterpret_cast<const uint8_t*>(w), reinterpret_cast<const float*>(w_scale),
                          reinterpret_cast<const void*>(bias), reinterpret_cast<void*>(out), out_f32,
                          M, N, K, threads);
      },
      "x [M, K] (bf16 or fp32) @ int8 w [N, K] (stored +128 as uint8 in the layout of "
      "int8_packed_rows, scales [N]).T (+ bias) -> out [M, N] (fp32 or bf16); K % 64 == 0");
  m.def(
      "gemv_int4",
      [](uintptr_t x, bool x_f32, uintptr_t w, uintptr_t w_scale, uintptr_t bias, uintptr_t out,
         bool out_f32, int64_t M, int64_t N, int64_t K, int threads) {
        py::gil_scoped_release release;
        specrt::gemv_int4(reinterpret_cast<const void*>(x), x_f32,
                          reinterpret_cast<const uint8_t*>(w), reinterpret_cast<const float*>(w_scale),
                          reinterpret_cast<const void*>(bias), reinterpret_cast<void*>(out), out_f32,
                          M, N, K, threads);
      },
      "x [M, K] (bf16 or fp32) @ int4 w [N, K / 2] (nibbles + 8, group scales [N, K / 64]).T "
      "(+ bias) -> out [M, N] (fp32 or bf16); K % 128 == 0");
  m.def(
      "stream_read",
      [](uintptr_t data, int64_t nbytes, int threads) {
        py::gil_scoped_release release;
        return specrt::stream_read(reinterpret_cast<const void*>(data), nbytes, threads);
      },
      "read nbytes once with AVX-512 or AVX2 loads on `threads` threads (the memory-read floor)");
  m.def(
      "dot_peak",
      [](int64_t steps, float scale, int threads) {
        py::gil_scoped_release release;
        return specrt::dot_peak(steps, scale, threads);
      },
      "steps rounds of independent dot products (1 x scale) on `threads` threads: the compute "
      "floor probe; returns the sum of the accumulators");
  m.def("dot_peak_flops_per_step", &specrt::dot_peak_flops_per_step,
        "floating-point operations of one dot_peak step on one thread");
  m.def("int8_supported", &specrt::cpu_supports_int8, "AVX-512 VNNI, or AVX2 (the int8 product runs)");
  m.def("int8_packed_rows", &specrt::int8_packed_rows,
        "the int8 weight layout here: 16 (groups of 16 rows, AVX-512 VNNI) or 0 (row-major)");
  m.def("int8_amx_rows", &specrt::int8_amx_rows,
        "from how many rows of x the int8 product runs on AMX tiles (0: never here)");
  m.def("bf16_amx_supported", &specrt::bf16_amx_supported,
        "the bf16 product on AMX tiles runs here (gemv_bf16_amx)");
  m.def("amx_bf16", &specrt::cpu_amx_bf16,
        "AMX-BF16 tiles usable here (the library's bf16 GEMM runs on them; SPECRT_AMX=0: no)");
  m.def("int4_supported", &specrt::cpu_avx512_vnni, "AVX-512 and AVX-512 VNNI (the int4 product runs)");
  m.def("build_id", [] { return SPECRT_BUILD_ID; },
        "Hash of the sources and flags this module was built from");
  m.def("cpu_supported", &specrt::cpu_supported, "AVX-512F/BW/VL/BF16 or AVX2/FMA/F16C available on this CPU");
  m.def("cpu_level", &specrt::cpu_level, "the level the kernels run at here: avx512, avx2 or none");
  m.def("avx512_halves", &specrt::cpu_avx512_halves,
        "an AMD Zen 4: 512-bit operations run as two 256-bit halves (gemv.cpp takes fewer rows "
        "of x over whole weight rows)");
}
