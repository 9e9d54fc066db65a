// Skinny matrix products with int8 weights (see gemv_int8.cpp). Raw pointers, contiguous: x
// [M, K] (bf16, or fp32 if x_f32), w uint8 (int8 + 128) in the layout int8_packed_rows() names,
// w_scale [N] fp32, bias [N] (x's dtype) or null, out [M, N] (fp32 if out_f32, else bf16).
// K % 64 == 0.
#pragma once
#include <cstdint>

namespace specrt {

bool cpu_supports_int8();   // the int8 product runs: with VNNI, or with AVX2 (gemv_int8_avx2.cpp)
// The weight layout gemv_int8 reads here: 16 = packed in groups of 16 rows, [ceil(N / 16), K / 4,
// 16, 4] (with AVX-512 VNNI, gemv_int8.cpp), 0 = row-major [N, K] (AVX2).
int int8_packed_rows();
// From how many rows of x the packed product runs on AMX tiles here (gemv_int8_amx.cpp, the
// same bits); 0 where it never does (no AMX-INT8, the OS refused the tiles, or SPECRT_AMX=0).
int int8_amx_rows();
void gemv_int8(const void* x, bool x_f32, const uint8_t* w, const float* w_scale,
               const void* bias, void* out, bool out_f32, int64_t M, int64_t N, int64_t K,
               int threads);

}  // namespace specrt
