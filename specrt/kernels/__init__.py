"""Speculative-decoding kernels: PyTorch references (the specification and the CPU path),
Triton kernels for CUDA (`specrt.kernels.triton`, imported on first CUDA use) and the C++
CPU kernels' wrappers (`specrt.kernels.cpu`).

Import the ops from here; `dispatch.py` picks the backend per call (override with
SPECRT_KERNELS=triton|reference). `draw_randomness` draws the uniforms and noise that
`rejection_sample` consumes, the same way on every backend.
"""
from specrt.kernels.dispatch import (add_rms_norm, argmax, backend_for, greedy_accept, matmul,
                                     rejection_sample, rope_verify_attention, silu_mul,
                                     verify_attention)
from specrt.kernels.reference import draw_randomness, exponential_noise, fill_exponential_

__all__ = ["argmax", "verify_attention", "greedy_accept", "rejection_sample", "backend_for",
           "rope_verify_attention", "add_rms_norm", "silu_mul", "matmul",
           "draw_randomness", "exponential_noise", "fill_exponential_"]
