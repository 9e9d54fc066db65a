"""The CUDA backend: the reference layer loop with Triton attention for decode and verify.

Decode (T = 1) and verify (T = K + 1 <= 17) passes attend through the Triton
`verify_attention` kernel; prefills and unsupported head sizes use SDPA. `hidden_static` is
the body that `specrt.model.graphs` captures in CUDA graphs. Fused layer kernels for the GPU
belong here: the model and the layers above never see the difference.
"""
from __future__ import annotations

import torch

from specrt.kernels import verify_attention
from specrt.model.backends.base import Pass
from specrt.model.backends.torch_ref import TorchReference

MAX_KERNEL_T = 17     # the verify-attention kernel's largest query block (K_max + 1)


def kernel_serves(t: int, head_dim: int) -> bool:
    """The kernel serves power-of-two head sizes >= 16 (64, 128: the Qwen2.5 family) for up
    to MAX_KERNEL_T new tokens per row."""
    return t <= MAX_KERNEL_T and head_dim >= 16 and head_dim & (head_dim - 1) == 0


class Cuda(TorchReference):
    name = "cuda"

    def attention_for(self, model, cache, pos: torch.Tensor, rows: Pass):
        B, T = pos.shape
        if not (kernel_serves(T, model.cfg.head_dim) and rows.all_valid):
            return super().attention_for(model, cache, pos, rows)
        ends = [s + v for s, v in zip(rows.starts, rows.valid)]
        lens = torch.tensor(ends, dtype=torch.int32, device=model.device)
        return lambda q, k, v: verify_attention(q, k[:B], v[:B], lens)

    def static_attention_for(self, model, cache, pos: torch.Tensor):
        B, T = pos.shape
        if not kernel_serves(T, model.cfg.head_dim):
            return super().static_attention_for(model, cache, pos)
        lens = (cache.lengths[:B] + T).to(torch.int32)
        return lambda q, k, v: verify_attention(q, k[:B], v[:B], lens)
