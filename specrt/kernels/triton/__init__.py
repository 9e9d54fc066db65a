"""Triton kernels for CUDA: `verify_attention` and `acceptance` (greedy_accept,
rejection_sample). Importing this package imports triton; specrt does so only when a CUDA
tensor first needs a kernel (see `specrt.kernels.dispatch`)."""
