"""Builds specrt and its C++ extensions, one folder of csrc/ each:
specrt._ngram (csrc/ngram: the prompt-lookup matcher), specrt._gemv (csrc/cpu: skinny matrix
products for decode/verify) and specrt._cpu_ops (csrc/cpu: the per-layer norms, SwiGLU and
RoPE + attention of a CPU decode/verify step).

`make test` / `make demo` run `python setup.py build_ext --inplace`, so the extensions sit
next to the Python sources and no install step is needed to import them from the repo root.
Each extension is compiled with SPECRT_BUILD_ID, a hash of its sources, headers and flags, and
returns it from build_id(): timings cached for one build are not reused with another.
"""
import hashlib
from pathlib import Path

from pybind11.setup_helpers import Pybind11Extension, build_ext
from setuptools import find_packages, setup

ROOT = Path(__file__).resolve().parent
GCC12_NOISE = ["-Wno-uninitialized", "-Wno-maybe-uninitialized", "-Wno-psabi"]  # intrinsics


def build_id(files: list[str], flags: list[str]) -> str:
    h = hashlib.sha256(" ".join(flags).encode())
    for f in files:
        h.update(f"\0{f}\0".encode())
        h.update((ROOT / f).read_bytes())
    return h.hexdigest()[:16]


def extension(name: str, sources: list[str], headers: list[str], flags: list[str],
              openmp: bool = False) -> Pybind11Extension:
    flags = ["-O3"] + flags + (["-fopenmp"] if openmp else [])
    return Pybind11Extension(
        name, sources, depends=headers,            # a header edit rebuilds (and re-ids) it
        cxx_std=17, extra_compile_args=flags, extra_link_args=["-fopenmp"] if openmp else [],
        define_macros=[("SPECRT_BUILD_ID", f'"{build_id(sources + headers, flags)}"')])


ext_modules = [
    extension("specrt._ngram", ["csrc/ngram/ngram.cpp", "csrc/ngram/ngram_bindings.cpp"],
              ["csrc/ngram/ngram.h", "csrc/build_id.h"], []),
    extension("specrt._gemv", ["csrc/cpu/gemv.cpp", "csrc/cpu/gemv_bindings.cpp"],
              ["csrc/cpu/gemv.h", "csrc/cpu/cpu_features.h", "csrc/build_id.h"],
              GCC12_NOISE, openmp=True),
    # -ffp-contract=off: no multiply-adds fused behind the code's back; the ops round where the
    # PyTorch reference rounds
    extension("specrt._cpu_ops", ["csrc/cpu/ops.cpp", "csrc/cpu/ops_bindings.cpp"],
              ["csrc/cpu/ops.h", "csrc/cpu/cpu_features.h", "csrc/build_id.h"],
              ["-ffp-contract=off"] + GCC12_NOISE, openmp=True),
]

setup(
    name="specrt",
    version="0.1.0",
    description="Speculative-decoding runtime for Qwen2-family language models",
    packages=find_packages(include=["specrt", "specrt.*"]),
    ext_modules=ext_modules,
    cmdclass={"build_ext": build_ext},
    python_requires=">=3.10",
)
