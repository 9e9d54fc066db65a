// The decoder layer loop of a CPU decode or verify pass in one call.
//
// Why: a decode step of the 0.5B draft spends ~15% of its time outside the matrix products,
// mostly in Python: 24 layers x 9 calls, each checking its tensors and allocating its output
// (~0.1-0.2 ms a layer). Here the same calls, in the same order, on the same kernels
// (gemv.cpp, gemv_int8.cpp, gemv_int4.cpp, ops.cpp), run from C++ with scratch buffers reused
// through the pass, so the bits are those of the per-op path (the specification of this loop:
// specrt/model/backends/cpu_native.py) and every row stays independent of the rows beside it.
//
// Per layer, x the residual stream and h the normed input of the next projection:
//   qkv = h W_qkv^T + b; attn = rope_attention(qkv); x += attn W_o^T; h = norm(x);
//   act = silu(gate) * up of h W_gu^T; x += act W_down^T; h = norm_next(x)
// specrt/kernels/cpu/layers.py checks everything before a pointer reaches this file.
#include "layers.h"

#include <algorithm>
#include <vector>

#include "gemv.h"
#include "gemv_bf16_amx.h"
#include "gemv_int4.h"
#include "gemv_int8.h"
#include "ops.h"

namespace specrt {

static void linear(const LinearW& l, const uint16_t* x, uint16_t* out, int64_t M, int threads) {
  switch (l.format) {
    case WeightFormat::int8:
      gemv_int8(x, false, static_cast<const uint8_t*>(l.w), l.scale, l.bias, out, false, M, l.N,
                l.K, threads);
      break;
    case WeightFormat::int4:
      gemv_int4(x, false, static_cast<const uint8_t*>(l.w), l.scale, l.bias, out, false, M, l.N,
                l.K, threads);
      break;
    case WeightFormat::bf16:
      gemv_bf16(x, static_cast<const uint16_t*>(l.w), l.bias, out, false, M, l.N, l.K, threads);
      break;
    case WeightFormat::bf16_amx:
      gemv_bf16_amx(x, static_cast<const uint16_t*>(l.w), l.bias, out, false, M, l.N, l.K,
                    threads);
      break;
  }
}

void run_layers(const std::vector<LayerW>& layers, const uint16_t* final_norm,
                const uint16_t* cos, const uint16_t* sin, const StackDims& d,
                const PassArgs& p) {
  const int64_t M = p.offsets[p.B], H = d.H;
  if (M == 0) return;
  std::vector<uint16_t> h(size_t(M * H)), y(size_t(M * H));
  std::vector<uint16_t> qkv(size_t(M * (d.Hq + 2 * d.Hkv) * d.D)), attn(size_t(M * d.Hq * d.D));
  std::vector<uint16_t> gu(size_t(M * 2 * d.I)), act(size_t(M * d.I));
  const AttentionShape shape{p.B, d.Hq, d.Hkv, d.D, p.S, d.S_rope, d.scale};
  rms_norm(p.x, layers[0].input_norm, d.eps, h.data(), M, H);
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerW& l = layers[i];
    linear(l.qkv, h.data(), qkv.data(), M, p.threads);
    rope_attention(qkv.data(), p.k_cache + i * p.layer_stride, p.v_cache + i * p.layer_stride,
                   cos, sin, p.starts, p.offsets, attn.data(), shape, p.threads);
    linear(l.o, attn.data(), y.data(), M, p.threads);
    add_rms_norm(p.x, y.data(), l.post_norm, d.eps, h.data(), M, H);
    linear(l.gate_up, h.data(), gu.data(), M, p.threads);
    silu_mul(gu.data(), act.data(), M, d.I);
    linear(l.down, act.data(), y.data(), M, p.threads);
    const uint16_t* next = i + 1 < layers.size() ? layers[i + 1].input_norm : final_norm;
    add_rms_norm(p.x, y.data(), next, d.eps, i + 1 < layers.size() ? h.data() : p.out, M, H);
  }
}

}  // namespace specrt
