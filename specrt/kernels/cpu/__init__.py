"""Wrappers of specrt's C++ CPU kernels: `gemv` (skinny matmuls) and `ops` (per-layer norms,
RoPE + attention, SwiGLU), each with its PyTorch specification as fallback."""
