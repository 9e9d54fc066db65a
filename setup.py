"""Builds specrt and its C++ extensions: specrt._ngram (the prompt-lookup matcher) and
specrt._gemv (skinny CPU matrix products for decode/verify) and specrt._cpu_ops (the per-layer
norms, SwiGLU and RoPE + attention of a CPU decode/verify step).

`make test` / `make demo` run `python setup.py build_ext --inplace`, so the extension sits
next to the Python sources and no install step is needed to import it from the repo root.
"""
from pybind11.setup_helpers import Pybind11Extension, build_ext
from setuptools import find_packages, setup

ext_modules = [
    Pybind11Extension(
        "specrt._ngram",
        ["csrc/ngram/ngram.cpp", "csrc/ngram/ngram_bindings.cpp"],
        cxx_std=17,
        extra_compile_args=["-O3"],
    ),
    Pybind11Extension(
        "specrt._gemv",
        ["csrc/cpu/gemv.cpp", "csrc/cpu/gemv_bindings.cpp"],
        cxx_std=17,
        extra_compile_args=["-O3", "-fopenmp", "-Wno-uninitialized"],  # gcc 12 intrinsics noise
        extra_link_args=["-fopenmp"],
    ),
    Pybind11Extension(
        "specrt._cpu_ops",
        ["csrc/cpu/ops.cpp", "csrc/cpu/ops_bindings.cpp"],
        cxx_std=17,
        extra_compile_args=["-O3", "-ffp-contract=off", "-fopenmp", "-Wno-psabi", "-Wno-uninitialized",
                            "-Wno-maybe-uninitialized"],     # gcc 12 intrinsics noise
        extra_link_args=["-fopenmp"],
    ),
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
