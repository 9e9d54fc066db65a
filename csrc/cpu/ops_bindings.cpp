// pybind11 bindings of the per-layer CPU operations (ops.cpp) -> specrt._cpu_ops.
// Tensors cross as raw data pointers plus sizes, which this layer cannot verify: a wrong one reads
// or writes out of bounds. specrt/kernels/cpu/ops.py is the checked boundary (dtype, shape,
// strides, device, starts + counts <= S; ValueError otherwise): call these only through it.
// `bf16` picks the element type: bf16 bits (uint16) or fp32.
#include <pybind11/pybind11.h>

#include "../build_id.h"
#include "cpu_features.h"
#include "ops.h"

namespace py = pybind11;
using specrt::AttentionShape;

template <typename T>
static T* p(uintptr_t a) { return reinterpret_cast<T*>(a); }

PYBIND11_MODULE(_cpu_ops, m) {
  m.doc() = "Per-layer CPU ops of a decode/verify step (AVX-512 or AVX2): norms, SwiGLU, "
            "RoPE + attention; the argmax of logits.";
  m.def(
      "rms_norm",
      [](bool bf16, uintptr_t x, uintptr_t w, float eps, uintptr_t out, int64_t M, int64_t H) {
        py::gil_scoped_release release;
        if (bf16) specrt::rms_norm(p<const uint16_t>(x), p<const uint16_t>(w), eps, p<uint16_t>(out), M, H);
        else specrt::rms_norm(p<const float>(x), p<const float>(w), eps, p<float>(out), M, H);
      },
      "out [M, H] = RMSNorm(x [M, H]) * w [H]");
  m.def(
      "add_rms_norm",
      [](bool bf16, uintptr_t x, uintptr_t y, uintptr_t w, float eps, uintptr_t out, int64_t M,
         int64_t H) {
        py::gil_scoped_release release;
        if (bf16)
          specrt::add_rms_norm(p<uint16_t>(x), p<const uint16_t>(y), p<const uint16_t>(w), eps,
                               p<uint16_t>(out), M, H);
        else
          specrt::add_rms_norm(p<float>(x), p<const float>(y), p<const float>(w), eps, p<float>(out), M, H);
      },
      "x [M, H] += y (in place); out [M, H] = RMSNorm(x) * w [H]");
  m.def(
      "silu_mul",
      [](bool bf16, uintptr_t gu, uintptr_t out, int64_t M, int64_t I) {
        py::gil_scoped_release release;
        if (bf16) specrt::silu_mul(p<const uint16_t>(gu), p<uint16_t>(out), M, I);
        else specrt::silu_mul(p<const float>(gu), p<float>(out), M, I);
      },
      "out [M, I] = silu(gu[:, :I]) * gu[:, I:]");
  m.def(
      "rope_attention",
      [](bool bf16, uintptr_t qkv, uintptr_t k_cache, uintptr_t v_cache, uintptr_t cos,
         uintptr_t sin, uintptr_t starts, uintptr_t offsets, uintptr_t out, int64_t B,
         int64_t Hq, int64_t Hkv, int64_t D, int64_t S, int64_t S_rope, float scale, int threads) {
        py::gil_scoped_release release;
        AttentionShape shape{B, Hq, Hkv, D, S, S_rope, scale};
        auto st = p<const int64_t>(starts);
        auto of = p<const int64_t>(offsets);
        if (bf16)
          specrt::rope_attention(p<const uint16_t>(qkv), p<uint16_t>(k_cache), p<uint16_t>(v_cache),
                                 p<const uint16_t>(cos), p<const uint16_t>(sin), st, of,
                                 p<uint16_t>(out), shape, threads);
        else
          specrt::rope_attention(p<const float>(qkv), p<float>(k_cache), p<float>(v_cache),
                                 p<const float>(cos), p<const float>(sin), st, of, p<float>(out),
                                 shape, threads);
      },
      "RoPE on qkv [M, (Hq+2Hkv)*D] (row b's tokens at rows offsets[b]..offsets[b+1]), k/v "
      "written into the caches [Bmax, Hkv, S, D] at starts[b] + t, attention of every query "
      "-> out [M, Hq*D]");
  m.def(
      "argmax_rows",
      [](uintptr_t x, int64_t R, int64_t V, int64_t row_stride, uintptr_t out, int threads) {
        py::gil_scoped_release release;
        specrt::argmax_rows(p<const float>(x), R, V, row_stride, p<int64_t>(out), threads);
      },
      "out [R] int64 = argmax of each fp32 row of x (rows row_stride apart, V >= 1 values), "
      "as torch.argmax");
  m.def("build_id", [] { return SPECRT_BUILD_ID; },
        "Hash of the sources and flags this module was built from");
  m.def("cpu_supported", &specrt::cpu_supported, "AVX-512F/BW/VL/BF16 or AVX2/FMA/F16C available on this CPU");
  m.def("cpu_level", &specrt::cpu_level, "the level the kernels run at here: avx512, avx2 or none");
}
