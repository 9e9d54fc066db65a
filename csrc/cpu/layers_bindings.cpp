// pybind11 bindings of the CPU layer loop (layers.cpp) -> specrt._cpu_layers.
// Pointers cross as integers, which this layer cannot verify: specrt/kernels/cpu/layers.py is
// the checked boundary (every weight checked once when a Stack is built, every pass's tensors
// and bounds on each run; ValueError otherwise). Call these only through it.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <tuple>
#include <vector>

#include "../build_id.h"
#include "cpu_features.h"
#include "layers.h"

namespace py = pybind11;
using specrt::LayerW;
using specrt::LinearW;

// (weight, scale or 0, bias or 0, N, K, format: 0 bf16, 1 int8, 2 int4, 3 bf16 packed for AMX)
using LinearT = std::tuple<uintptr_t, uintptr_t, uintptr_t, int64_t, int64_t, int>;
// (input_norm, qkv, o, post_norm, gate_up, down)
using LayerT = std::tuple<uintptr_t, LinearT, LinearT, uintptr_t, LinearT, LinearT>;

static LinearW to_linear(const LinearT& t) {
  LinearW l;
  l.w = reinterpret_cast<const void*>(std::get<0>(t));
  l.scale = reinterpret_cast<const float*>(std::get<1>(t));
  l.bias = reinterpret_cast<const uint16_t*>(std::get<2>(t));
  l.N = std::get<3>(t);
  l.K = std::get<4>(t);
  const int format = std::get<5>(t);
  if (format < 0 || format > 3)
    throw py::value_error("unknown weight format " + std::to_string(format));
  l.format = static_cast<specrt::WeightFormat>(format);
  return l;
}

struct Stack {
  std::vector<LayerW> layers;
  const uint16_t *final_norm, *cos, *sin;
  specrt::StackDims dims;

  Stack(const std::vector<LayerT>& ls, uintptr_t final_norm_, uintptr_t cos_, uintptr_t sin_,
        int64_t H, int64_t Hq, int64_t Hkv, int64_t D, int64_t I, int64_t S_rope, float eps,
        float scale)
      : final_norm(reinterpret_cast<const uint16_t*>(final_norm_)),
        cos(reinterpret_cast<const uint16_t*>(cos_)),
        sin(reinterpret_cast<const uint16_t*>(sin_)),
        dims{H, Hq, Hkv, D, I, S_rope, eps, scale} {
    for (const auto& t : ls)
      layers.push_back(LayerW{reinterpret_cast<const uint16_t*>(std::get<0>(t)),
                              to_linear(std::get<1>(t)), to_linear(std::get<2>(t)),
                              reinterpret_cast<const uint16_t*>(std::get<3>(t)),
                              to_linear(std::get<4>(t)), to_linear(std::get<5>(t))});
  }

  void run(uintptr_t x, uintptr_t out, uintptr_t k_cache, uintptr_t v_cache, int64_t layer_stride,
           int64_t S, uintptr_t starts, uintptr_t offsets, int64_t B, int threads) {
    py::gil_scoped_release release;
    specrt::PassArgs p{reinterpret_cast<uint16_t*>(x), reinterpret_cast<uint16_t*>(out),
                       reinterpret_cast<uint16_t*>(k_cache), reinterpret_cast<uint16_t*>(v_cache),
                       layer_stride, S, reinterpret_cast<const int64_t*>(starts),
                       reinterpret_cast<const int64_t*>(offsets), B, threads};
    specrt::run_layers(layers, final_norm, cos, sin, dims, p);
  }
};

PYBIND11_MODULE(_cpu_layers, m) {
  m.doc() = "The decoder layer loop of a CPU decode/verify pass in one call "
            "(AVX-512 or AVX2, bf16).";
  py::class_<Stack>(m, "Stack")
      .def(py::init<const std::vector<LayerT>&, uintptr_t, uintptr_t, uintptr_t, int64_t, int64_t,
                    int64_t, int64_t, int64_t, int64_t, float, float>(),
           "A model's layers: per layer (input_norm, qkv, o, post_norm, gate_up, down), each "
           "projection (weight, scale, bias, N, K, format 0 bf16 / 1 int8 / 2 int4 / 3 bf16 "
           "AMX); then the final norm, rope tables "
           "and dims (H, Hq, Hkv, D, I, S_rope, eps, scale)")
      .def("run", &Stack::run,
           "x [M, H] (residual, in place) -> out [M, H]; caches, layer stride, S, starts [B], "
           "offsets [B + 1], B, threads");
  m.def("build_id", [] { return SPECRT_BUILD_ID; },
        "Hash of the sources and flags this module was built from");
  m.def("cpu_supported", &specrt::cpu_supported, "AVX-512F/BW/VL/BF16 or AVX2/FMA/F16C available on this CPU");
}
