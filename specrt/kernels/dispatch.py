"""Backend selection for the speculative-decoding kernels.

Each op runs the Triton kernel when its inputs are CUDA tensors and the PyTorch reference
otherwise. `SPECRT_KERNELS=triton|reference` forces one backend; it is read at every call
so tests can monkeypatch it. Forcing `triton` on CPU tensors runs the kernels under the
Triton interpreter, which needs TRITON_INTERPRET=1 set before the first import of a kernel
module (tests/session.py does this when CUDA is absent).

Triton is imported only when a call first needs it, so CPU users need no triton at all.
On the CPU the argmax behind greedy choices runs the C++ kernel of `specrt.kernels.cpu.ops`
where it is built (`argmax`; the same indices as torch.argmax).
"""
from __future__ import annotations

import importlib
import os

import torch

from specrt.kernels import reference, reference_layer
from specrt.kernels.cpu import ops as cpu_ops

__all__ = ["backend_for", "argmax", "verify_attention", "greedy_accept", "rejection_sample",
           "rope_verify_attention", "add_rms_norm", "silu_mul", "matmul"]

ENV_VAR = "SPECRT_KERNELS"
BACKENDS = ("triton", "reference")


def forced_backend(device: torch.device | None = None) -> str | None:
    """The backend SPECRT_KERNELS forces, None when unset. Refused (ArgumentError): an unknown
    value, and 'triton' for a CPU `device` without Triton's interpreter (TRITON_INTERPRET=1)."""
    forced = os.environ.get(ENV_VAR, "").strip()
    if not forced:
        return None
    from specrt.errors import ArgumentError

    if forced not in BACKENDS:
        raise ArgumentError(f"environment variable {ENV_VAR} must be one of "
                            f"{', '.join(BACKENDS)} (or unset), got {forced!r}")
    if (forced == "triton" and device is not None and device.type != "cuda"
            and os.environ.get("TRITON_INTERPRET") != "1"):
        raise ArgumentError(f"{ENV_VAR}=triton on the CPU runs Triton's interpreter (for tests; "
                            "slow): set TRITON_INTERPRET=1 as well, or unset " + ENV_VAR)
    return forced


def backend_for(tensor: torch.Tensor) -> str:
    """'triton' or 'reference': the backend the ops below use for inputs like `tensor`."""
    return forced_backend() or ("triton" if tensor.is_cuda else "reference")


def _triton(name: str):
    return importlib.import_module(f"specrt.kernels.triton.{name}")


def verify_attention(
    q: torch.Tensor,  # [B, T, Hq, D]
    k_cache: torch.Tensor,  # [B, Hkv, S_max, D]
    v_cache: torch.Tensor,  # [B, Hkv, S_max, D]
    lens: torch.Tensor,  # [B] int32, valid positions per row including the T new ones
    scale: float | None = None,
) -> torch.Tensor:  # [B, T, Hq, D]
    """Causal GQA attention of T new tokens per row against the cache (see reference.py)."""
    if backend_for(q) == "triton":
        return _triton("verify_attention").verify_attention(q, k_cache, v_cache, lens, scale)
    return reference.verify_attention(q, k_cache, v_cache, lens, scale)


def greedy_accept(
    target_logits: torch.Tensor,  # [B, K + 1, V]
    draft_tokens: torch.Tensor,  # [B, K], -1 = no draft
) -> tuple[torch.Tensor, torch.Tensor]:  # num_accepted [B] int32, out_tokens [B, K + 1] int64
    """Greedy verification of the drafts against the target's argmax (see reference.py)."""
    if backend_for(target_logits) == "triton":
        return _triton("acceptance").greedy_accept(target_logits, draft_tokens)
    if _cpu_argmax(target_logits):
        return reference.greedy_accept_ids(cpu_ops.argmax(target_logits), draft_tokens)
    return reference.greedy_accept(target_logits, draft_tokens)


def argmax(x: torch.Tensor) -> torch.Tensor:  # [..., V] -> [...] int64
    """torch.argmax(x, dim=-1): the first largest value of each row, a NaN above every number.
    fp32 rows on the CPU go through the C++ kernel where it is built (the same indices, ~10x
    faster over a vocabulary: specrt.kernels.cpu.ops.argmax); everything else, and every call
    under SPECRT_KERNELS=reference, through torch."""
    return cpu_ops.argmax(x) if _cpu_argmax(x) else x.argmax(dim=-1)


def _cpu_argmax(x: torch.Tensor) -> bool:
    """Whether `argmax` of x runs the C++ CPU kernel."""
    return (cpu_ops.AVAILABLE and x.device.type == "cpu" and x.dtype == torch.float32
            and x.dim() >= 1 and x.shape[-1] >= 1 and forced_backend() != "reference")


def rejection_sample(
    target_probs: torch.Tensor,  # [B, K + 1, V]
    draft_probs: torch.Tensor | None,  # [B, K, V], or None for one-hot drafts
    draft_tokens: torch.Tensor,  # [B, K], -1 = no draft
    uniforms: torch.Tensor,  # [B, K]
    noise: torch.Tensor,  # [B, V]
) -> tuple[torch.Tensor, torch.Tensor]:  # num_accepted [B] int32, out_tokens [B, K + 1] int64
    """Exact speculative sampling with caller-drawn randomness (see reference.py)."""
    if backend_for(target_probs) == "triton":
        return _triton("acceptance").rejection_sample(target_probs, draft_probs, draft_tokens,
                                                      uniforms, noise)
    return reference.rejection_sample(target_probs, draft_probs, draft_tokens, uniforms, noise)


# --- the CUDA backend's layer ops (specrt.model.backends.cuda) ---------------------------------

def rope_verify_attention(
    qkv: torch.Tensor,  # [B, T, (Hq + 2 Hkv) * D], the QKV projection without its bias
    bias: torch.Tensor,  # [(Hq + 2 Hkv) * D]
    cos: torch.Tensor,  # [S, D]
    sin: torch.Tensor,  # [S, D]
    k_cache: torch.Tensor,  # [B, Hkv, S_max, D], the new tokens' k written at lens - T + t
    v_cache: torch.Tensor,  # [B, Hkv, S_max, D]
    lens: torch.Tensor,  # [B] int32, valid positions per row after this pass
    num_heads: int,
    scale: float | None = None,
) -> torch.Tensor:  # [B, T, Hq, D]
    """Bias + RoPE + KV-cache write + verify attention (see reference_layer.py)."""
    if backend_for(qkv) == "triton":
        return _triton("verify_attention").rope_verify_attention(
            qkv, bias, cos, sin, k_cache, v_cache, lens, num_heads, scale)
    return reference_layer.rope_verify_attention(qkv, bias, cos, sin, k_cache, v_cache, lens,
                                                 num_heads, scale)


def add_rms_norm(
    x: torch.Tensor,  # [N, H]
    y: torch.Tensor | None,  # [N, H] added first, or None
    weight: torch.Tensor,  # [H]
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:  # normed [N, H], residual x + y [N, H]
    """Residual add + RMSNorm, both outputs (see reference_layer.py)."""
    if backend_for(x) == "triton":
        return _triton("add_rms_norm").add_rms_norm(x, y, weight, eps)
    return reference_layer.add_rms_norm(x, y, weight, eps)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:  # [N, 2 I] -> [N, I]
    """SiLU(gate) * up (see reference_layer.py)."""
    if backend_for(gate_up) == "triton":
        return _triton("silu_mul").silu_mul(gate_up)
    return reference_layer.silu_mul(gate_up)


def matmul(
    x: torch.Tensor,  # [M, K]
    weight: torch.Tensor,  # [N, K]
    bias: torch.Tensor | None = None,  # [N]
    out_dtype: torch.dtype | None = None,  # x.dtype or torch.float32
) -> torch.Tensor:  # [M, N]
    """x @ weight^T + bias, each row's bits independent of M on the Triton path (see
    reference_layer.py and triton/matmul.py)."""
    if backend_for(x) == "triton":
        return _triton("matmul").matmul(x, weight, bias, out_dtype)
    return reference_layer.matmul(x, weight, bias, out_dtype)
