"""One backend per device, chosen once when a model is loaded.

- `torch_ref` (TorchReference): SDPA + `F.linear`, the specification; any device.
- `cpu_native` (CpuNative): C++ matmuls and layer ops for CPU decode/verify passes (bf16,
  fp32) on CPUs with AVX-512 BF16 or AVX2 + FMA; the default on such CPUs.
- `cuda` (Cuda): Triton attention for decode/verify, the CUDA-graph body; the default on CUDA.

`SPECRT_BACKEND=torch_ref|cpu_native|cuda` (or `select_backend(..., name=...)`) overrides the
choice, for tests and comparisons.
"""
from __future__ import annotations

import importlib.util
import os

import torch

from specrt.errors import ConfigError
from specrt.kernels.dispatch import forced_backend
from specrt.model.backends.base import Backend, Linear, Pass
from specrt.model.backends.torch_ref import TorchReference

__all__ = ["Backend", "Linear", "Pass", "select_backend", "BACKENDS"]
BACKENDS = ("torch_ref", "cpu_native", "cuda")
ENV_VAR = "SPECRT_BACKEND"


def _check_cpu_level(device: torch.device) -> None:
    """The CPU kernels' level is read by the C++ extensions themselves (csrc/cpu/cpu_features.h),
    which ignore anything but CPU_LEVELS; a typo, or a change after they loaded, is caught here,
    where a model is loaded."""
    from specrt.kernels.cpu.extension import CPU_LEVEL_READ, CPU_LEVEL_VAR, CPU_LEVELS

    level = os.environ.get(CPU_LEVEL_VAR)
    if level and level not in CPU_LEVELS:
        raise ConfigError(f"unknown CPU kernel level {level!r} ({CPU_LEVEL_VAR}); set it to "
                          f"{' or '.join(CPU_LEVELS)}, or unset it for the best this CPU has")
    # what the extensions act on: "avx2" or not ("" and unset alike); only CPU models use them
    if device.type == "cpu" and (level or None) != (CPU_LEVEL_READ or None):
        def shown(value):
            return "unset" if value is None else repr(value)

        raise ConfigError(f"{CPU_LEVEL_VAR} changed from {shown(CPU_LEVEL_READ)} to "
                          f"{shown(level)} after specrt's CPU kernels loaded; they read it once "
                          "per process: set it before importing specrt (or in a new process)")


def select_backend(device: torch.device, dtype: torch.dtype, name: str | None = None) -> Backend:
    name = name or os.environ.get(ENV_VAR, "").strip() or None
    if name is not None and name not in BACKENDS:
        raise ConfigError(f"unknown backend {name!r} ({ENV_VAR}); choose one of "
                          f"{', '.join(BACKENDS)}")
    kernels = forced_backend(device)       # SPECRT_KERNELS, checked before any pass needs it
    _check_cpu_level(device)
    if ((device.type == "cuda" and kernels != "reference") or kernels == "triton") \
            and importlib.util.find_spec("triton") is None:
        raise ConfigError("the GPU kernels need triton, which is not installed: pip install "
                          "'specrt[cuda]' (or set SPECRT_KERNELS=reference to run PyTorch's "
                          "ops instead, slower)")
    if name == "torch_ref":
        return TorchReference()
    if device.type == "cuda" or name == "cuda":
        if device.type != "cuda":
            raise ConfigError(f"backend 'cuda' needs a CUDA device, the model is on {device}")
        from specrt.model.backends.cuda import Cuda

        return Cuda()
    from specrt.model.backends import cpu_native

    if name == "cpu_native" or (name is None and cpu_native.available(dtype)):
        if not cpu_native.available(dtype):
            raise ConfigError(f"backend 'cpu_native' is unavailable for {dtype} here (extension "
                              "not built, CPU without AVX-512 BF16 or AVX2, or SPECRT_CPU_OPS=0)")
        return cpu_native.CpuNative()
    return TorchReference()
