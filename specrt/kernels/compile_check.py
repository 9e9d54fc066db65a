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

# Per-block shared memory a kernel may use (opt-in maximum), bytes.
SHARED_LIMIT = {90: 232448, 80: 166912}
TARGETS = (90, 80)
DTYPES = {"bf16": "bf16", "fp16": "fp16", "fp32": "fp32"}
HEAD_DIMS = (64, 128)
BLOCK_MS = (16, 32, 64, 128)      # next_pow2(T * G) clamped to 16..128 (verify_attention)
# Query heads per KV head: the Qwen2.5 family's (1.5B: 6, 0.5B: 7, 7B: 7), Llama's 4 and 8,
# and MHA's 1. GROUP is a compile-time constant of the attention kernels.
GROUPS = (1, 4, 6, 7, 8)
BLOCK_KS = (2, 4, 8, 16, 32)      # next_pow2(K + 1) (acceptance finalizers), K <= 16
BLOCK_SS = (2, 32)                # next_pow2(number of vocab splits): tiny vocab, 152k vocab


@dataclasses.dataclass(frozen=True)
class Variant:
    kernel: str                   # "module.function"
    signature: tuple              # ((arg, type or "constexpr"), ...)
    constants: tuple              # ((name, value), ...)
    num_warps: int
    bf16: bool                    # spills fail the check

    @property
    def label(self) -> str:
        return f"{self.kernel}[{', '.join(f'{k}={v}' for k, v in self.constants)}]"


def _sig(*pairs) -> tuple:
    return tuple(pairs)


def attention_variants(quick: bool) -> list[Variant]:
    from specrt.kernels.triton.verify_attention import attention_num_warps

    out = []
    dims = itertools.product(DTYPES, HEAD_DIMS, BLOCK_MS, GROUPS, (True, False))
    for dtype, d, block_m, group, split in dims:
        if quick and (d, block_m, group) != (128, 64, 6):
            continue
        block_n = 32 if dtype == "fp32" else 64
        ptr = f"*{DTYPES[dtype]}"
        sig = _sig(("q_ptr", ptr), ("k_ptr", ptr), ("v_ptr", ptr), ("lens_ptr", "*i32"),
                   ("out_ptr", ptr), ("part_acc_ptr", "*fp32"), ("part_m_ptr", "*fp32"),
                   ("part_l_ptr", "*fp32"),
                   *[(f"stride_{n}", "i32") for n in ("qb", "qt", "qh", "kb", "kh", "ks", "vb",
                                                       "vh", "vs", "ob", "ot", "oh")],
                   ("T", "i32"), ("Hkv", "i32"), ("NUM_SPLITS", "i32"), ("qk_scale", "fp32"))
        consts = (("GROUP", group), ("HEAD_DIM", d), ("BLOCK_M", block_m), ("BLOCK_N", block_n),
                  ("SPLIT", split), ("DOT_IEEE", dtype == "fp32"))
        warps = attention_num_warps(block_m, d)
        out.append(Variant("verify_attention._verify_attention_kernel",
                           sig + tuple((k, "constexpr") for k, _ in consts), consts, warps,
                           dtype == "bf16"))
        if split:
            csig = _sig(("part_acc_ptr", "*fp32"), ("part_m_ptr", "*fp32"),
                        ("part_l_ptr", "*fp32"), ("out_ptr", ptr), ("stride_ob", "i32"),
                        ("stride_ot", "i32"), ("stride_oh", "i32"), ("T", "i32"),
                        ("Hkv", "i32"), ("NUM_SPLITS", "i32"))
            cconsts = (("GROUP", group), ("HEAD_DIM", d), ("BLOCK_M", 16))
            if block_m == BLOCK_MS[0]:       # the combine kernel does not depend on BLOCK_M
                out.append(Variant("verify_attention._verify_attention_combine_kernel",
                                   csig + tuple((k, "constexpr") for k, _ in cconsts), cconsts,
                                   4, dtype == "bf16"))
    return out


def acceptance_variants(quick: bool) -> list[Variant]:
    out = []
    for dtype in DTYPES:
        if quick and dtype != "fp32":
            continue
        sig = _sig(("x_ptr", f"*{dtype}"), ("stride_xb", "i32"), ("stride_xk", "i32"),
                   ("part_val_ptr", "*fp32"), ("part_idx_ptr", "*i32"), ("K1", "i32"),
                   ("V", "i32"), ("NUM_SPLITS", "i32"), ("SPLIT_SIZE", "constexpr"),
                   ("BLOCK_V", "constexpr"))
        out.append(Variant("acceptance._row_argmax_partial_kernel", sig,
                           (("SPLIT_SIZE", 8192), ("BLOCK_V", 1024)), 4, dtype == "bf16"))
    for block_k, block_s in itertools.product(BLOCK_KS, BLOCK_SS):
        if quick and (block_k, block_s) != (16, 32):
            continue
        fin = _sig(("part_val_ptr", "*fp32"), ("part_idx_ptr", "*i32"), ("draft_ptr", "*i64"),
                   ("stride_db", "i32"), ("num_accepted_ptr", "*i32"), ("out_ptr", "*i64"),
                   ("stride_ob", "i32"), ("K", "i32"), ("V", "i32"), ("NUM_SPLITS", "i32"),
                   ("BLOCK_K", "constexpr"), ("BLOCK_S", "constexpr"))
        consts = (("BLOCK_K", block_k), ("BLOCK_S", block_s))
        out.append(Variant("acceptance._greedy_finalize_kernel", fin, consts, 1, False))
        rfin = _sig(("part_r_val_ptr", "*fp32"), ("part_r_idx_ptr", "*i32"),
                    ("part_p_val_ptr", "*fp32"), ("part_p_idx_ptr", "*i32"),
                    ("draft_ptr", "*i64"), ("stride_xb", "i32"), ("num_accepted_ptr", "*i32"),
                    ("out_ptr", "*i64"), ("stride_ob", "i32"), ("K", "i32"), ("V", "i32"),
                    ("NUM_SPLITS", "i32"), ("BLOCK_K", "constexpr"), ("BLOCK_S", "constexpr"))
        out.append(Variant("acceptance._rejection_finalize_kernel", rfin, consts, 1, False))
    for has_q, block_k in itertools.product((True, False), BLOCK_KS[:-1]):
        if quick and (has_q, block_k) != (True, 16):
            continue
        sig = _sig(("tp_ptr", "*fp32"), ("stride_tb", "i32"), ("stride_tk", "i32"),
                   ("dp_ptr", "*fp32"), ("stride_db", "i32"), ("stride_dk", "i32"),
                   ("draft_ptr", "*i64"), ("stride_xb", "i32"), ("u_ptr", "*fp32"),
                   ("stride_ub", "i32"), ("noise_ptr", "*fp32"), ("stride_nb", "i32"),
                   ("num_accepted_ptr", "*i32"), ("part_r_val_ptr", "*fp32"),
                   ("part_r_idx_ptr", "*i32"), ("part_p_val_ptr", "*fp32"),
                   ("part_p_idx_ptr", "*i32"), ("K", "i32"), ("V", "i32"), ("NUM_SPLITS", "i32"),
                   ("HAS_DRAFT_PROBS", "constexpr"), ("SPLIT_SIZE", "constexpr"),
                   ("BLOCK_V", "constexpr"), ("BLOCK_K", "constexpr"))
        consts = (("HAS_DRAFT_PROBS", has_q), ("SPLIT_SIZE", 8192), ("BLOCK_V", 1024),
                  ("BLOCK_K", block_k))
        out.append(Variant("acceptance._rejection_partial_kernel", sig, consts, 4, False))
    return out


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
        src = ASTSource(fn, dict(variant.signature), constexprs=dict(variant.constants))
        kernel = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                                options={"num_warps": variant.num_warps})
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
    variants = attention_variants(args.quick) + acceptance_variants(args.quick)
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
