// The small per-layer operations of a CPU decode or verify step (see ops.cpp). Raw
// pointers, row-major, contiguous unless a stride is given. T is float (fp32 models) or
// uint16_t (bf16 bits). Every output row depends only on its own inputs and position, never on
// how many rows were computed together: a verify pass and a decode step agree bit for bit.
#pragma once
#include <cstdint>

namespace specrt {

// out[m] = w * (x[m] / rms(x[m])) over H; normalised in fp32, scaled in T (as the reference).
template <typename T>
void rms_norm(const T* x, const T* w, float eps, T* out, int64_t M, int64_t H);

// x[m] = x[m] + y[m] (rounded to T, in place), then out[m] = rms_norm(x[m]).
template <typename T>
void add_rms_norm(T* x, const T* y, const T* w, float eps, T* out, int64_t M, int64_t H);

// out[m, i] = silu(gu[m, i]) * gu[m, I + i] (gate and up side by side), each op rounded to T.
template <typename T>
void silu_mul(const T* gu, T* out, int64_t M, int64_t I);

// The attention block of a layer for B rows of new tokens, packed: row b's tokens are the qkv
// rows offsets[b] .. offsets[b + 1] - 1 (M = offsets[B] in all), token t of row b at position
// starts[b] + t. Rows hold only real tokens (no padding is computed):
// 1. RoPE on q and k of every token;
// 2. k and v written into row b's cache at that position;
// 3. each query head attends to keys 0..position of its row's cache (grouped-query: head h
//    reads kv head h / (Hq / Hkv)), softmax in fp32 -> out[m, h * D : (h + 1) * D].
// qkv [M, (Hq + 2 * Hkv) * D]; k_cache, v_cache [Bmax, Hkv, S, D]; cos, sin [S_rope, D] (in T);
// starts [B]; offsets [B + 1], non-decreasing from 0; out [M, Hq * D].
struct AttentionShape {
  int64_t B, Hq, Hkv, D, S, S_rope;
  float scale;
};
template <typename T>
void rope_attention(const T* qkv, T* k_cache, T* v_cache, const T* cos, const T* sin,
                    const int64_t* starts, const int64_t* offsets, T* out, AttentionShape shape,
                    int threads);

// out[r] = the index of the largest of x[r * row_stride .. + V - 1] (V >= 1), as torch.argmax:
// the first on ties, a NaN above every number. Rows run on `threads` threads.
void argmax_rows(const float* x, int64_t R, int64_t V, int64_t row_stride, int64_t* out,
                 int threads);

}  // namespace specrt
