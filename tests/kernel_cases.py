"""What the Triton kernel tests share: where they run and how close a kernel must come.

On CPU the kernels run under the Triton interpreter (tests/session.py sets
TRITON_INTERPRET=1), whose bf16 arithmetic is wrong: bf16 cases run on CUDA only.
"""
import pytest
import torch

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
needs_cuda_bf16 = pytest.mark.skipif(
    not CUDA, reason="bf16 arithmetic is wrong under the Triton interpreter; bf16 runs on CUDA only"
)
TOL = {torch.float32: (1e-4, 1e-4), torch.float16: (3e-3, 3e-3), torch.bfloat16: (2e-2, 2e-2)}
