// Skinny matrix products for CPU decode/verify (see gemv.cpp). Raw pointers, row-major,
// contiguous: x [M, K], w [N, K], bias [N] or null, out [M, N].
#pragma once
#include <cstdint>

namespace specrt {

// bf16 inputs, fp32 accumulation; out is fp32 (out_f32) or bf16 rounded to nearest even.
void gemv_bf16(const uint16_t* x, const uint16_t* w, const uint16_t* bias, void* out, bool out_f32,
               int64_t M, int64_t N, int64_t K, int threads);
// fp32 throughout.
void gemv_f32(const float* x, const float* w, const float* bias, float* out, int64_t M, int64_t N,
              int64_t K, int threads);

}  // namespace specrt
