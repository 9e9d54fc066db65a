"""Test-wide setup.

Triton reads TRITON_INTERPRET when a kernel module is first imported, so it must be set
here, before any test imports specrt.kernels. Without CUDA the interpreter runs the kernels
on the CPU (correct in fp32/fp16; its bf16 arithmetic is wrong, so bf16 is GPU-only).
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

torch.set_num_threads(min(2, os.cpu_count() or 1))
