// The packed int8 product on AMX tiles (see gemv_int8_amx.cpp): gemv_int8 takes it for passes
// of AMX_MIN_ROWS rows of x or more where cpu_amx_int8() (cpu_features.h).
#pragma once
#include <cstdint>

#include "gemv_quant.h"

namespace specrt {

// x: M rows quantized (QBlocks, gemv_quant.h), zero rows after them up to a multiple of 16;
// w: packed 16 rows a group (gemv_int8.cpp); s: the outputs [M, N].
void gemv_int8_amx(const QBlocks& x, const uint8_t* w, const QuantStore& s, int64_t M,
                   int64_t N, int64_t K, int threads);

}  // namespace specrt
