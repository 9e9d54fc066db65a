// Skinny matrix products with int8 weights (see gemv_int8.cpp). Raw pointers, row-major,
// contiguous: x [M, K] (bf16, or fp32 if x_f32), w [N, K] uint8 (int8 + 128), w_scale [N] fp32,
// bias [N] (x's dtype) or null, out [M, N] (fp32 if out_f32, else bf16). K % 64 == 0.
#pragma once
#include <cstdint>

namespace specrt {

bool cpu_supports_int8();   // the int8 product runs: with VNNI, or with AVX2 (gemv_int8_avx2.cpp)
void gemv_int8(const void* x, bool x_f32, const uint8_t* w, const float* w_scale,
               const void* bias, void* out, bool out_f32, int64_t M, int64_t N, int64_t K,
               int threads);

}  // namespace specrt
