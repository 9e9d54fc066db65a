// Skinny matrix products with int4 weights (see gemv_int4.cpp). Raw pointers, row-major,
// contiguous: x [M, K] (bf16, or fp32 if x_f32), w [N, K / 2] packed nibbles, w_scale
// [N, K / 64] fp32, bias [N] (x's dtype) or null, out [M, N] (fp32 if out_f32, else bf16).
// K % 128 == 0.
#pragma once
#include <cstdint>

namespace specrt {

void gemv_int4(const void* x, bool x_f32, const uint8_t* w, const float* w_scale,
               const void* bias, void* out, bool out_f32, int64_t M, int64_t N, int64_t K,
               int threads);

}  // namespace specrt
