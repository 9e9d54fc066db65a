// The AVX2 variant of gemv_int8.h's product, for CPUs without AVX-512 VNNI (gemv_int8.cpp
// dispatches). Same arguments; K % 64 == 0.
#pragma once
#include <cstdint>

namespace specrt {

void gemv_int8_avx2(const void* x, bool x_f32, const uint8_t* w, const float* w_scale,
                    const void* bias, void* out, bool out_f32, int64_t M, int64_t N, int64_t K,
                    int threads);

}  // namespace specrt
