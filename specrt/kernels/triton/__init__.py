"""Triton kernels for CUDA: `verify_attention` (also fused with bias + RoPE + KV write),
`acceptance` (greedy_accept, rejection_sample) and the layer ops `add_rms_norm`, `silu_mul`. Importing this package imports triton; specrt does so only when a CUDA
tensor first needs a kernel (see `specrt.kernels.dispatch`)."""
