"""`python -m specrt.kernels.compile_check`: compile every Triton kernel variant specrt can launch
for real GPUs, on a machine without one.

Triton compiles for any CUDA target through the `ptxas` its wheel ships, so a GPU kernel that
would fail to compile, spill registers or overrun shared memory is caught on a CPU-only
machine (CI included), by name. Each variant is a kernel with the compile-time constants the
launchers in `specrt.kernels.triton` pick (dtype, head size, query block, key block, split
mode, ...), compiled for sm_90 (H100/H200) and sm_80 (A100) with `triton.compile`; `ptxas -v`
then reports registers and spills.

Fails (exit 1, naming the kernel and its constants) on: a compile error; spilled registers in a
bf16 variant (the dtype the GPU path runs, where a spill costs most); shared memory over the
target's per-block limit; a missing ptxas (said so, never skipped silently). `--quick` keeps
one variant per kernel and target (for a smoke test). Imports triton; nothing else in specrt
imports this module.
"""
from __future__ import annotations

import argparse
import concurrent.futures as futures
import dataclasses
import itertools
import os
import re
import subprocess
import sys
import tempfile
import time

import torch

# Per-block shared memory a kernel may use (opt-in maximum), bytes.
SHARED_LIMIT = {90: 232448, 80: 166912}
TARGETS = (90, 80)
_TL = {"torch.float16": "fp16", "torch.bfloat16": "bf16", "torch.float32": "fp32",
       "fp16": "fp16", "bf16": "bf16", "fp32": "fp32"}


@dataclasses.dataclass(frozen=True)
class Variant:
    kernel: str                   # "module.function"
    signature: tuple              # ((arg, type or "constexpr"), ...)
    constants: tuple              # ((name, value), ...)
    num_warps: int
    bf16: bool                    # spills fail the check
    dtype: str = ""               # the data dtype, for the label
    num_stages: int | None = None  # the launcher's pipeline depth (None: triton's default)
    aligned: tuple = ()           # integer arguments a real launch specializes as % 16 == 0
    out: str = ""                 # the output dtype where it differs from the data dtype

    @property
    def label(self) -> str:
        consts = ", ".join(f"{k}={v}" for k, v in self.constants)
        out = f"->{self.out}" if self.out else ""
        return f"{self.kernel}[{self.dtype + out + ', ' if self.dtype else ''}{consts}]"


def _variant(module: str, name: str, types: dict, consts: dict, num_warps: int,
             dtype: str, **extra) -> Variant:
    """A variant of `module.name` whose signature follows the kernel's own argument list:
    `*_ptr` arguments take their type from `types` (default: the data dtype), `stride_*` are
    i32, constexprs come from `consts`, any other argument must be typed in `types` (so a
    kernel's new argument fails here, loudly, instead of being compiled wrong). `extra`:
    num_stages, aligned, out (see Variant)."""
    import importlib

    fn = getattr(importlib.import_module(f"specrt.kernels.triton.{module}"), name)
    sig = []
    for arg in fn.arg_names:
        if arg in consts:
            sig.append((arg, "constexpr"))
        elif arg in types:
            sig.append((arg, types[arg]))
        elif arg.endswith("_ptr"):
            sig.append((arg, f"*{dtype}"))
        elif arg.startswith("stride_"):
            sig.append((arg, "i32"))
        else:
            raise TypeError(f"compile_check: no type for {module}.{name} argument {arg!r}")
    return Variant(f"{module}.{name}", tuple(sig), tuple(consts.items()), num_warps,
                   dtype == "bf16", dtype, **extra)


def attention_variants(quick: bool) -> list[Variant]:
    """Every (dtype, head size, fused) the attention launchers accept: BLOCK_M, BLOCK_N and
    the warps are functions of those (T, GROUP, splits and S_max are runtime arguments)."""
    from specrt.kernels.triton import verify_attention as va

    out = []
    for dtype, d, fused in itertools.product(va.DTYPES, va.HEAD_DIMS, (False, True)):
        dt = _TL[str(dtype)]
        if quick and (dt, d) != ("bf16", 128):
            continue
        types = {"lens_ptr": "*i32", "part_acc_ptr": "*fp32", "part_m_ptr": "*fp32",
                 "part_l_ptr": "*fp32", "count_ptr": "*i32", "T": "i32", "Hkv": "i32",
                 "GROUP": "i32", "NUM_SPLITS": "i32", "split_keys": "i32", "rope_len": "i32",
                 "qk_scale": "fp32"}
        consts = {"HEAD_DIM": d, "BLOCK_M": va.BLOCK_M, "BLOCK_N": va.block_n_for(dtype),
                  "FUSED": fused, "DOT_IEEE": dtype == torch.float32}
        out.append(_variant("verify_attention", "_verify_attention_kernel", types, consts,
                            va.num_warps_for(d), dt))
    return out


def layer_variants(quick: bool) -> list[Variant]:
    """The CUDA backend's other layer kernels: residual add + RMSNorm, SiLU * mul."""
    from specrt.kernels.triton import add_rms_norm as rn
    from specrt.kernels.triton import silu_mul as sm

    out = []
    for dtype in rn.DTYPES:
        dt = _TL[str(dtype)]
        for residual in (True, False):
            if quick and (dt, residual) != ("bf16", True):
                continue
            out.append(_variant("add_rms_norm", "_add_rms_norm_kernel",
                                {"H": "i32", "eps": "fp32"},
                                {"HAS_RESIDUAL": residual, "BLOCK_H": rn.BLOCK_H},
                                rn.NUM_WARPS, dt))
    for dtype in sm.DTYPES:
        dt = _TL[str(dtype)]
        if quick and dt != "bf16":
            continue
        out.append(_variant("silu_mul", "_silu_mul_kernel", {"I": "i32"},
                            {"BLOCK": sm.BLOCK}, sm.NUM_WARPS, dt))
    return out


def matmul_variants(quick: bool) -> list[Variant]:
    """The batch-invariant matmul: every input dtype x output (the input dtype, or fp32 for
    logits) x with/without bias, at the launcher's block sizes and pipeline depth. M, the split
    size and the number of splits are runtime arguments; N and K are specialized as multiples
    of 16, as every model shape is."""
    from specrt.kernels.triton import matmul as mm

    types = {"part_ptr": "*fp32", "count_ptr": "*i32", "M": "i32", "N": "i32", "K": "i32",
             "split_blocks": "i32", "NUM_SPLITS": "i32"}
    out = []
    for dtype in mm.DTYPES:
        dt = _TL[str(dtype)]
        for out_dt, bias in itertools.product(sorted({dt, "fp32"}), (True, False)):
            if quick and (dt, out_dt, bias) != ("bf16", "bf16", True):
                continue
            tile = mm.tile_for(dtype)
            consts = {"HAS_BIAS": bias, "BLOCK_M": tile.block_m, "BLOCK_N": tile.block_n,
                      "BLOCK_K": tile.block_k, "DOT_IEEE": dtype == torch.float32}
            out.append(_variant("matmul", "_matmul_kernel", {**types, "y_ptr": f"*{out_dt}"},
                                consts, tile.num_warps, dt, num_stages=tile.num_stages,
                                aligned=("N", "K"), out="" if out_dt == dt else out_dt))
    return out


def acceptance_variants(quick: bool) -> list[Variant]:
    """Every input dtype, draft-probability mode and position block (K = 0..MAX_K) the
    acceptance launchers can pick; the vocab tiling and the split block are constants."""
    from specrt.kernels.triton import acceptance as ac

    scalars = {"K1": "i32", "K": "i32", "V": "i32", "NUM_SPLITS": "i32",
               "part_val_ptr": "*fp32", "part_idx_ptr": "*i32", "part_r_val_ptr": "*fp32",
               "part_r_idx_ptr": "*i32", "part_p_val_ptr": "*fp32", "part_p_idx_ptr": "*i32",
               "draft_ptr": "*i64", "num_accepted_ptr": "*i32", "out_ptr": "*i64",
               "u_ptr": "*fp32", "noise_ptr": "*fp32"}
    fin_blocks = sorted({ac.block_k_for(k + 1) for k in range(ac.MAX_K + 1)})
    part_blocks = sorted({ac.block_k_for(k) for k in range(ac.MAX_K + 1)})
    out = []
    for dt in ac.DTYPES:
        if quick and dt != "fp32":
            continue
        out.append(_variant("acceptance", "_row_argmax_partial_kernel", scalars,
                            {"SPLIT_SIZE": ac.SPLIT_SIZE, "BLOCK_V": ac.BLOCK_V}, 4, dt))
        for has_q, block_k in itertools.product((True, False), part_blocks):
            if quick and (has_q, block_k) != (True, 16):
                continue
            consts = {"HAS_DRAFT_PROBS": has_q, "SPLIT_SIZE": ac.SPLIT_SIZE,
                      "BLOCK_V": ac.BLOCK_V, "BLOCK_K": block_k}
            out.append(_variant("acceptance", "_rejection_partial_kernel",
                                {**scalars, "tp_ptr": f"*{dt}", "dp_ptr": f"*{dt}"}, consts,
                                4, dt))
    for block_k in fin_blocks:
        if quick and block_k != 32:
            continue
        consts = {"BLOCK_K": block_k, "BLOCK_S": ac.MAX_V_SPLITS}
        for name in ("_greedy_finalize_kernel", "_rejection_finalize_kernel"):
            out.append(_variant("acceptance", name, scalars, consts, 1, ""))
    return out


def all_variants(quick: bool = False) -> list[Variant]:
    return (attention_variants(quick) + layer_variants(quick) + matmul_variants(quick)
            + acceptance_variants(quick))


def ptxas_path() -> str | None:
    import triton

    path = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    return path if os.access(path, os.X_OK) else None


@dataclasses.dataclass
class Outcome:
    label: str
    arch: int
    seconds: float
    registers: int | None = None
    spill_bytes: int | None = None
    shared: int | None = None
    error: str | None = None


def compile_variant(variant: Variant, arch: int) -> Outcome:
    """Compile one variant for sm_<arch>; never raises (the error is in the outcome)."""
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    t0 = time.perf_counter()
    try:
        module, name = variant.kernel.split(".")
        fn = getattr(importlib.import_module(f"specrt.kernels.triton.{module}"), name)
        # As a real launch specializes them: pointers and strides divisible by 16 (the
        # vectorized loads; what the launchers pass for the model shapes).
        attrs = {(i,): [["tt.divisibility", 16]] for i, (arg, ty) in enumerate(variant.signature)
                 if ty.startswith("*") or arg.startswith("stride_") or arg in variant.aligned}
        src = ASTSource(fn, dict(variant.signature), constexprs=dict(variant.constants),
                        attrs=attrs)
        options = {"num_warps": variant.num_warps}
        if variant.num_stages is not None:
            options["num_stages"] = variant.num_stages
        kernel = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)
        regs, spills = _ptxas_report(kernel.asm["ptx"], arch)
        return Outcome(variant.label, arch, time.perf_counter() - t0, regs, spills,
                       kernel.metadata.shared)
    except Exception as e:      # noqa: BLE001 -- reported by name, the run goes on
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return Outcome(variant.label, arch, time.perf_counter() - t0, error=first[:300])


def _ptxas_report(ptx: str, arch: int) -> tuple[int | None, int | None]:
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        sm = f"sm_{arch}a" if arch >= 90 else f"sm_{arch}"   # triton emits sm_90a PTX
        proc = subprocess.run([ptxas_path(), f"-arch={sm}", "-v", src, "-o",
                               os.path.join(tmp, "k.cubin")], capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"ptxas: {proc.stderr.strip()[:300]}")
    regs = re.search(r"Used (\d+) registers", proc.stderr)
    spills = re.findall(r"(\d+) bytes spill (?:stores|loads)", proc.stderr)
    return (int(regs.group(1)) if regs else None, sum(map(int, spills)) if spills else 0)


def problems(outcome: Outcome, variant: Variant) -> list[str]:
    if outcome.error:
        return [f"compile error: {outcome.error}"]
    out = []
    if variant.bf16 and outcome.spill_bytes:
        out.append(f"spills {outcome.spill_bytes} bytes of registers (bf16 variant)")
    if outcome.shared is not None and outcome.shared > SHARED_LIMIT[outcome.arch]:
        out.append(f"uses {outcome.shared} bytes of shared memory, over sm_{outcome.arch}'s "
                   f"{SHARED_LIMIT[outcome.arch]}")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m specrt.kernels.compile_check",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="one variant per kernel and target")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--arch", type=int, action="append", choices=TARGETS,
                   help="compile for this sm only (repeatable; default: 90 and 80)")
    args = p.parse_args(argv)
    if ptxas_path() is None:
        print("compile_check: FAILED: the triton wheel's ptxas is missing "
              "(triton/backends/nvidia/bin/ptxas); nothing was compiled", file=sys.stderr)
        return 1
    variants = all_variants(args.quick)
    jobs = [(v, arch) for v in variants for arch in (args.arch or TARGETS)]
    t0 = time.perf_counter()
    failures = []
    with futures.ProcessPoolExecutor(max(1, args.jobs)) as pool:
        for (variant, arch), outcome in zip(jobs, pool.map(_compile_job, jobs, chunksize=4)):
            for problem in problems(outcome, variant):
                failures.append(f"sm_{arch} {variant.label}: {problem}")
    spent = time.perf_counter() - t0
    print(f"compile_check: {len(jobs)} variants ({len(variants)} kernels x constants, "
          f"targets {', '.join(f'sm_{a}' for a in (args.arch or TARGETS))}) in {spent:.0f} s")
    for line in failures:
        print(f"  FAIL {line}")
    print("compile_check: " + ("FAILED" if failures else "all compiled, no bf16 spills, "
                               "shared memory within limits"))
    return 1 if failures else 0


def _compile_job(job: tuple[Variant, int]) -> Outcome:
    return compile_variant(*job)


if __name__ == "__main__":
    sys.exit(main())
