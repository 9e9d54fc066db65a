// The decoder layer loop of a CPU decode or verify pass in one call (see layers.cpp). Raw
// pointers, row-major, contiguous; bf16 activations (uint16_t bits).
#pragma once
#include <cstdint>
#include <vector>

namespace specrt {

// How a projection's weight is stored.
enum class WeightFormat : int {
  bf16 = 0,   // [N, K]
  int8 = 1,   // uint8 = int8 + 128 in gemv_int8's layout (gemv_int8.h), fp32 row scales [N]
  int4 = 2,   // [N, K / 2] nibbles + 8, fp32 group scales [N, K / 64] (gemv_int4.cpp)
  bf16_amx = 3,   // bf16 packed for AMX tiles (gemv_bf16_amx.cpp)
};

// One projection.
struct LinearW {
  const void* w = nullptr;
  const float* scale = nullptr;      // int8 / int4 only
  const uint16_t* bias = nullptr;    // [N] or null
  int64_t N = 0, K = 0;
  WeightFormat format = WeightFormat::bf16;
};

struct LayerW {
  const uint16_t* input_norm;        // [H]
  LinearW qkv, o;
  const uint16_t* post_norm;         // [H]
  LinearW gate_up, down;
};

struct StackDims {
  int64_t H, Hq, Hkv, D, I, S_rope;
  float eps, scale;
};

// What a pass needs besides the weights: the rows' packed tokens and this pass's cache rows.
struct PassArgs {
  uint16_t* x;                       // [M, H] the embedded tokens; the residual stream, in place
  uint16_t* out;                     // [M, H] the final-normed hidden states
  uint16_t* k_cache;                 // layer 0, the pass's first row: [B, Hkv, S, D] per layer
  uint16_t* v_cache;
  int64_t layer_stride;              // elements between one layer's cache and the next
  int64_t S;                         // cache positions per row
  const int64_t* starts;             // [B]
  const int64_t* offsets;            // [B + 1]: row b's tokens are rows offsets[b].. of x
  int64_t B;
  int threads;
};

void run_layers(const std::vector<LayerW>& layers, const uint16_t* final_norm,
                const uint16_t* cos, const uint16_t* sin, const StackDims& dims,
                const PassArgs& pass);

}  // namespace specrt
