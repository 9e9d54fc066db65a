// The bf16 product on AMX-BF16 tiles for every pass of a model whose weights are packed for it
// (see gemv_bf16_amx.cpp): decode steps, verify passes and prompts alike.
#pragma once
#include <cstdint>

namespace specrt {

// AMX-BF16 tiles usable here and compiled in (cpu_amx_bf16(), and a compiler that targets AMX).
bool bf16_amx_supported();

// x [M, K] bf16 (row-major) @ the packed weight (N % 16 == 0, K % 32 == 0; layout in
// gemv_bf16_amx.cpp) (+ bias [N] bf16 or null) -> out [M, N], fp32 (out_f32) or bf16 rounded
// to nearest even. Any M >= 1; each output's sums run in one fixed order whatever M is.
void gemv_bf16_amx(const uint16_t* x, const uint16_t* w, const uint16_t* bias, void* out,
                   bool out_f32, int64_t M, int64_t N, int64_t K, int threads);

}  // namespace specrt
