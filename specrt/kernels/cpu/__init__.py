"""Wrappers of the C++ CPU kernels for decode and verify: `gemv` (skinny matrix products,
specrt._gemv) and `ops` (norms, SwiGLU, RoPE + attention, specrt._cpu_ops).

Each wrapper is the checked boundary of its extension: it validates every tensor (dtype, shape,
contiguity, device) and raises ValueError before a pointer reaches C++. Import the submodules
themselves; this package imports nothing so that loading it stays cheap.
"""
