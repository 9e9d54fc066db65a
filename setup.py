"""Builds specrt's optional C++ extensions, one folder of csrc/ each:
specrt._ngram (csrc/ngram: the prompt-lookup matcher), specrt._gemv (csrc/cpu: skinny matrix
products for decode/verify, bf16/fp32 and int8 weights), specrt._cpu_ops (csrc/cpu: the
per-layer norms, SwiGLU and RoPE + attention of a CPU decode/verify step) and
specrt._cpu_layers (csrc/cpu: the whole layer loop of a bf16 decode/verify pass in one call,
on the kernels of the other two). The package metadata is in pyproject.toml.

`make test` / `make demo` run `python setup.py build_ext --inplace`, so the extensions sit
next to the Python sources and no install step is needed to import them from the repo root.
Each extension is compiled with SPECRT_BUILD_ID, a hash of its sources, headers and flags, and
returns it from build_id(): timings cached for one build are not reused with another.

Every extension is optional: specrt has a Python/PyTorch path for each. An extension that
cannot be compiled (no compiler, an unsupported platform) is left out with a one-line note and
the package installs without it. _gemv and _cpu_ops use x86 intrinsics (AVX-512), so they are
built on x86-64 only; -fopenmp is passed only when the compiler accepts it (probed once).
"""
import hashlib
import platform
import sys
import tempfile
from pathlib import Path

from pybind11.setup_helpers import ParallelCompile, Pybind11Extension, build_ext
from setuptools import setup
from setuptools.errors import CCompilerError, CompileError, LinkError, PlatformError

ROOT = Path(__file__).resolve().parent
GCC12_NOISE = ["-Wno-uninitialized", "-Wno-maybe-uninitialized", "-Wno-psabi"]  # intrinsics
CPU_FLAGS = ["-ffp-contract=off"] + GCC12_NOISE
X86_64 = platform.machine().lower() in ("x86_64", "amd64")
BUILD_ERRORS = (CCompilerError, CompileError, LinkError, PlatformError, OSError)


def build_id(files: list[str], flags: list[str]) -> str:
    h = hashlib.sha256(" ".join(flags).encode())
    for f in files:
        h.update(f"\0{f}\0".encode())
        h.update((ROOT / f).read_bytes())
    return h.hexdigest()[:16]


def extension(name: str, sources: list[str], headers: list[str], flags: list[str],
              openmp: bool = False, x86_only: bool = False) -> Pybind11Extension:
    ext = Pybind11Extension(
        name, sources, depends=headers,            # a header edit rebuilds (and re-ids) it
        cxx_std=17, extra_compile_args=["-O3"] + flags)
    # What OptionalBuildExt needs to finish the flags (and the build id) on the build machine.
    ext.specrt_files, ext.specrt_flags = sources + headers, ["-O3"] + flags
    ext.specrt_openmp, ext.specrt_x86_only = openmp, x86_only
    return ext


def note(message: str) -> None:
    print(f"specrt: {message}", file=sys.stderr)


class OptionalBuildExt(build_ext):
    """build_ext that finishes each extension's flags for this machine and skips, with a note,
    an extension that cannot be built there: the package then uses its Python path."""

    def run(self):
        try:
            super().run()
        except BUILD_ERRORS as e:   # no usable compiler at all
            note(f"no C++ extensions built ({e}); using the Python/PyTorch fallbacks")

    def build_extensions(self):
        self._openmp = None
        built = []
        for ext in self.extensions:
            if ext.specrt_x86_only and not X86_64:
                note(f"{ext.name} skipped: its kernels need x86-64 (this is "
                     f"{platform.machine()}); using the PyTorch fallback")
                continue
            try:
                self.finish_flags(ext)
                self.build_fresh(ext)
            except BUILD_ERRORS as e:
                note(f"{ext.name} not built ({type(e).__name__}, see the compiler output "
                     "above); using its Python/PyTorch fallback")
                continue
            built.append(ext)
        self.extensions = built     # what --inplace copies and what get_outputs() lists

    def build_fresh(self, ext) -> None:
        """build_extension, recompiling every object when the extension's build id (its
        sources and flags) differs from the last build's: setuptools alone recompiles only
        sources newer than their objects, so a flag change kept the old objects and the new
        id."""
        marker = Path(self.build_temp) / f"{ext.name}.build_id"
        ident = dict(ext.define_macros)["SPECRT_BUILD_ID"]
        stale = not marker.exists() or marker.read_text() != ident
        force = self.force, self.compiler.force
        if stale:
            self.force = self.compiler.force = True
        try:
            self.build_extension(ext)
        finally:
            self.force, self.compiler.force = force
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(ident)

    def finish_flags(self, ext) -> None:
        flags = list(ext.specrt_flags)
        if ext.specrt_openmp and self.accepts_openmp():
            flags.append("-fopenmp")
            ext.extra_compile_args.append("-fopenmp")
            ext.extra_link_args.append("-fopenmp")
        ext.define_macros = [m for m in ext.define_macros if m[0] != "SPECRT_BUILD_ID"]
        ext.define_macros.append(("SPECRT_BUILD_ID", f'"{build_id(ext.specrt_files, flags)}"'))

    def accepts_openmp(self) -> bool:
        """Whether the compiler compiles and links -fopenmp (Apple clang, MSVC: no)."""
        if self._openmp is None:
            with tempfile.TemporaryDirectory() as tmp:
                src = Path(tmp) / "omp_probe.cpp"
                src.write_text("#include <omp.h>\nint probe() { return omp_get_max_threads(); }\n")
                try:
                    objs = self.compiler.compile([str(src)], output_dir=tmp,
                                                 extra_postargs=["-fopenmp"])
                    self.compiler.link_shared_object(objs, str(Path(tmp) / "omp_probe.so"),
                                                     extra_postargs=["-fopenmp"])
                    self._openmp = True
                except BUILD_ERRORS:
                    self._openmp = False
                    note("the compiler does not accept -fopenmp; CPU kernels run single-threaded")
        return self._openmp


def cpu(*names: str) -> list[str]:
    return [f"csrc/cpu/{n}" for n in names]


# The matrix products, compiled into _gemv (Python's products) and into _cpu_layers (the layer
# loop calls them from C++), and the headers every CPU extension includes.
GEMV = cpu("gemv.cpp", "gemv_avx2.cpp", "gemv_bf16_amx.cpp", "gemv_int8.cpp",
           "gemv_int8_amx.cpp", "gemv_int8_avx2.cpp", "gemv_int4.cpp")
GEMV_HEADERS = cpu("gemv.h", "gemv_avx2.h", "gemv_bf16_amx.h", "gemv_int8.h", "gemv_int8_amx.h",
                   "gemv_int8_avx2.h", "gemv_int4.h", "gemv_quant.h", "gemv_tiled.h")
OPS_HEADERS = cpu("ops.h", "ops_impl.h")
CPU_HEADERS = cpu("simd.h", "cpu_features.h", "threads.h") + ["csrc/build_id.h"]

ext_modules = [
    extension("specrt._ngram", ["csrc/ngram/ngram.cpp", "csrc/ngram/ngram_bindings.cpp"],
              ["csrc/ngram/ngram.h", "csrc/build_id.h"], []),
    # -ffp-contract=off everywhere in csrc/cpu: no multiply-adds fused behind the code's back
    # (the ops round where the PyTorch reference rounds), and one source compiled into two
    # extensions gives the same bits in both (_cpu_layers runs the kernels of the other two).
    extension("specrt._gemv", GEMV + cpu("stream_read.cpp", "dot_peak.cpp", "gemv_bindings.cpp"),
              GEMV_HEADERS + cpu("simd.h", "stream_read.h", "dot_peak.h", "cpu_features.h",
                                 "threads.h") + ["csrc/build_id.h"],
              CPU_FLAGS, openmp=True, x86_only=True),
    extension("specrt._cpu_ops", cpu("ops.cpp", "ops_bindings.cpp"), OPS_HEADERS + CPU_HEADERS,
              CPU_FLAGS, openmp=True, x86_only=True),
    extension("specrt._cpu_layers",
              cpu("layers.cpp", "layers_bindings.cpp") + GEMV + cpu("ops.cpp"),
              cpu("layers.h") + GEMV_HEADERS + OPS_HEADERS + CPU_HEADERS,
              CPU_FLAGS, openmp=True, x86_only=True),
]

# Each extension's sources compile in parallel, one job a CPU (SPECRT_BUILD_JOBS=n to choose).
# build_ext compiles an extension only when it is out of date or its build id changed
# (`build_fresh`), and then every object must be rebuilt: pybind11's default keeps each object
# file that exists, so an edited header would have been linked in with objects built before it.
ParallelCompile("SPECRT_BUILD_JOBS", needs_recompile=lambda obj, src: True).install()

setup(ext_modules=ext_modules, cmdclass={"build_ext": OptionalBuildExt})
