// The AVX2 + FMA variants of gemv.h's products, for CPUs without AVX-512 (gemv.cpp dispatches).
#pragma once

#include <cstdint>

namespace specrt {

void gemv_bf16_avx2(const uint16_t* x, const uint16_t* w, const uint16_t* bias, void* out,
                    bool out_f32, int64_t M, int64_t N, int64_t K, int threads);
void gemv_f32_avx2(const float* x, const float* w, const float* bias, float* out, int64_t M,
                   int64_t N, int64_t K, int threads);

}  // namespace specrt
