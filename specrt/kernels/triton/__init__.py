"""Triton kernels for CUDA: `verify_attention` (also fused with bias + RoPE + KV write),
`acceptance` (greedy_accept, rejection_sample), the layer ops `add_rms_norm`, `silu_mul` and the
batch-invariant skinny `matmul`. Importing this package imports triton; specrt does so only
when a CUDA tensor first needs a kernel (see `specrt.kernels.dispatch`)."""
