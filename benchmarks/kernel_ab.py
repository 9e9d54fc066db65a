"""Benchmark: two builds of the skinny-matmul kernels (specrt._gemv) side by side in one process.

Run: python -m benchmarks.kernel_ab [--base REV] [--new REV] [--rows 1,5] [--shapes draft]
                                    [--rounds N]

Builds the `_gemv` extension's sources (csrc/cpu/gemv*.cpp, the probes stream_read.cpp and
dot_peak.cpp, the bindings) of two git revisions (default: HEAD~1 against the working tree) into a
temporary folder, each as its own uniquely named module, loads both, checks that they give the same
bits (unless --allow-different-bits), and times the bf16 product over the 1.5B target's matrix
shapes (28 layers of qkv 2048x1536, o 1536x1536, gate_up 17920x1536, down 1536x8960, random
weights, 2.6 GB), rounds interleaved, the order reversed every other round (--format int8: the 0.5B
draft's shapes, 24 layers, int8; --shapes picks either model's shapes for either format), with the
streaming read over the same tensors as the floor. The weights sit in huge pages where the kernel
gives them, as the CPU backend puts a model's (specrt.kernels.cpu.huge_pages), and both builds read
one copy when they read the same layout: with a copy each, packed one after the other in 4 KiB
pages, the second build's int8 products read 6-9% faster than the first's, whichever build was
second (identical code: 1.06x; benchmarks/RESULTS.md, "A new CPU ..."). Prints GB/s (weight bytes /
time; median and best of the rounds) per build and row count.

Why its own modules: CPython keeps one module per extension name, so loading a second build
under the name `specrt._gemv` silently returns the first (an A/B of two identical modules).
Each build here gets its own name and is linked -Bsymbolic, so each runs its own code.
"""
from __future__ import annotations

import importlib.util
import os
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from benchmarks.harness import cli, machine, report, revisions
from specrt.kernels.cpu import gemv_int8, huge_pages

# [N, K] of one layer's products and the layer count: the 1.5B target's and the 0.5B draft's;
# each format's default (bf16: the target's format, int8: the draft's default one)
SHAPES = {"target": ((2048, 1536), (1536, 1536), (17920, 1536), (1536, 8960)),
          "draft": ((1152, 896), (896, 896), (9728, 896), (896, 4864))}
LAYERS = {"target": 28, "draft": 24}
DEFAULT_SHAPES = {"bf16": "target", "int8": "draft"}
# read here, not in the build threads: sysconfig's first read is not thread-safe
SUFFIX = sysconfig.get_config_var("EXT_SUFFIX")
INCLUDE = sysconfig.get_paths()["include"]


def build_parser():
    p = cli.parser("benchmarks.kernel_ab", __doc__)
    p.add_argument("--base", default="HEAD~1", help="git revision of build A (default HEAD~1)")
    p.add_argument("--new", default="worktree", help="git revision of build B (default: the "
                   "working tree as it is)")
    p.add_argument("--rows", default="1", help="comma-separated row counts M (default 1)")
    p.add_argument("--format", default="bf16", choices=sorted(DEFAULT_SHAPES),
                   help="the weights' format: bf16 (default) or int8 (default shapes: the "
                   "1.5B target's for bf16, the 0.5B draft's for int8)")
    p.add_argument("--shapes", choices=sorted(SHAPES), default=None,
                   help="whose matrix shapes: the 1.5B target's or the 0.5B draft's (default: "
                   "the target's for bf16, the draft's for int8)")
    p.add_argument("--rounds", type=cli.count, default=7, help="interleaved rounds (default 7)")
    p.add_argument("--threads", type=cli.count, default=2, help="kernel threads (default 2)")
    p.add_argument("--allow-different-bits", action="store_true",
                   help="time the builds even if their outputs differ")
    return p


def _sources(tree: Path) -> list[Path]:
    cpu = tree / "csrc" / "cpu"
    found = sorted(cpu.glob("gemv*.cpp")) + [cpu / "stream_read.cpp"]
    found += [cpu / "dot_peak.cpp"] if (cpu / "dot_peak.cpp").exists() else []   # newer trees
    if not (cpu / "gemv_bindings.cpp").exists():
        cli.fail(f"{tree} has no csrc/cpu/gemv_bindings.cpp: not a revision with the kernels")
    return found


def _build(tree: Path, tag: str, tmp: Path) -> Path:
    """Compile the tree's _gemv sources as module `_gemv_<tag>`; returns the .so path."""
    import pybind11
    bindings = tmp / f"bindings_{tag}.cpp"
    text = (tree / "csrc/cpu/gemv_bindings.cpp").read_text()
    bindings.write_text(text.replace("PYBIND11_MODULE(_gemv,", f"PYBIND11_MODULE(_gemv_{tag},")
                        .replace('#include "', f'#include "{tree}/csrc/cpu/'))
    out = tmp / f"_gemv_{tag}{SUFFIX}"
    srcs = [str(s) for s in _sources(tree) if s.name != "gemv_bindings.cpp"]
    cmd = ([os.environ.get("CXX", "g++"), "-O3", "-fopenmp", "-shared", "-fPIC", "-std=c++17",
            f"-I{pybind11.get_include()}", f"-I{INCLUDE}",
            f"-I{tree}/csrc/cpu", '-DSPECRT_BUILD_ID="kernel_ab"']
           + srcs + [str(bindings), "-Wl,-Bsymbolic", "-o", str(out)])
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        cli.fail(f"building {tag} failed:\n{res.stderr[-3000:]}")
    return out


def _load(path: Path, tag: str):
    spec = importlib.util.spec_from_file_location(f"_gemv_{tag}", str(path))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _pack_rows(mod) -> int:
    """The rows a build's int8 kernel packs to a group (0: it reads row-major, as builds before
    int8_packed_rows() did)."""
    return mod.int8_packed_rows() if hasattr(mod, "int8_packed_rows") else 0


def _packed(rows: int, weights: list[tuple], place) -> list[tuple]:
    """The int8 weights (row-major [N, K], scales) in the layout of a kernel that packs `rows`
    to a group (0: row-major as they are), each copied by `place`."""
    if not rows:
        return weights
    return [(place(gemv_int8.pack(gemv_int8.Int8Weight(w, s), rows).data), s, w.shape[0])
            for w, s in weights]


def _product(mod, x: torch.Tensor, w: tuple, out: torch.Tensor, threads: int) -> None:
    M, K = x.shape
    w, scale, *n = w
    N = n[0] if n else w.shape[0]
    if scale is None:
        mod.gemv_bf16(x.data_ptr(), w.data_ptr(), 0, out.data_ptr(), False, M, N, K, threads)
    else:
        mod.gemv_int8(x.data_ptr(), False, w.data_ptr(), scale.data_ptr(), 0, out.data_ptr(),
                      False, M, N, K, threads)


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    rows = cli.positive_ints(args.rows, "--rows")
    which = args.shapes or DEFAULT_SHAPES[args.format]
    info = machine.machine_info(args.threads)
    report.print_header("kernel A/B: two builds of specrt._gemv", info,
                        {"base": args.base, "new": args.new, "rows": rows, "shapes": which})
    with tempfile.TemporaryDirectory(prefix="kernel_ab_") as tmp_s:
        tmp = Path(tmp_s)
        trees = {tag: revisions.checkout(rev, tmp / tag, "csrc")
                 for tag, rev in (("A", args.base), ("B", args.new))}
        print("building both (~1 min) ...", file=sys.stderr)
        with ThreadPoolExecutor(2) as pool:
            paths = dict(zip(trees, pool.map(lambda t: _build(trees[t], t, tmp), trees)))
        mods = {tag: _load(path, tag) for tag, path in paths.items()}
    if mods["A"] is mods["B"]:
        cli.fail("both builds loaded as one module")

    g = torch.Generator().manual_seed(0)
    shapes, layers = SHAPES[which], LAYERS[which]
    arena = huge_pages.Arena() if huge_pages.enabled() else None
    place = arena.copy if arena is not None else (lambda t: t)
    if args.format == "bf16":
        weights = [(place(torch.randn(n, k, generator=g).bfloat16()), None)
                   for _ in range(layers) for n, k in shapes]
    else:
        weights = [(place(torch.randint(0, 256, (n, k), generator=g, dtype=torch.uint8)),
                    torch.rand(n, generator=g) * 0.01)
                   for _ in range(layers) for n, k in shapes]
    nbytes = sum(w.numel() * w.element_size() for w, *_ in weights)
    # the weights in the layout each build reads (the same values), one copy per layout
    laid = {tag: weights for tag in mods}
    if args.format == "int8":
        layouts: dict[int, list[tuple]] = {}
        for tag, mod in mods.items():
            group = _pack_rows(mod)
            if group not in layouts:
                layouts[group] = _packed(group, weights, place)
            laid[tag] = layouts[group]
    for m in rows:
        xs = {k: torch.randn(m, k, generator=g).bfloat16() for k in {k for _, k in shapes}}
        outs = {tag: [torch.empty(m, w.shape[0], dtype=torch.bfloat16) for w, _ in weights]
                for tag in mods}
        for tag, mod in mods.items():
            for w, lw, o in zip(weights, laid[tag], outs[tag]):
                _product(mod, xs[w[0].shape[1]], lw, o, args.threads)
        same = all(torch.equal(a.view(torch.int16), b.view(torch.int16))
                   for a, b in zip(outs["A"], outs["B"]))
        if not same and not args.allow_different_bits:
            cli.fail(f"M={m}: the two builds give different bits (--allow-different-bits to time "
                     "them anyway)")

        def run(tag):
            for w, lw, o in zip(weights, laid[tag], outs[tag]):
                _product(mods[tag], xs[w[0].shape[1]], lw, o, args.threads)

        def stream():
            for w, _ in weights:
                mods["B"].stream_read(w.data_ptr(), w.numel() * w.element_size(), args.threads)

        gbps: dict[str, list[float]] = {"A": [], "B": [], "floor": []}
        turns = (("A", lambda: run("A")), ("B", lambda: run("B")), ("floor", stream))
        for r in range(args.rounds):        # the order reversed every other round (drift)
            for name, fn in (turns if r % 2 == 0 else turns[::-1]):
                t0 = time.perf_counter()
                fn()
                gbps[name].append(nbytes / (time.perf_counter() - t0) / 1e9)
        med = {k: statistics.median(v) for k, v in gbps.items()}
        print(f"\n{args.format}, {which}'s shapes, M = {m}, {nbytes / 1e9:.2f} GB of weights, "
              f"{args.rounds} rounds, bits {'identical' if same else 'DIFFERENT'}")
        print(report.table(["", "median GB/s", "best GB/s", "of floor"], [
            [f"{tag} {rev}", f"{med[tag]:.1f}", f"{max(gbps[tag]):.1f}",
             f"{med[tag] / med['floor']:.2f}"] for tag, rev in (("A", args.base), ("B", args.new))
        ] + [["streaming read", f"{med['floor']:.1f}", f"{max(gbps['floor']):.1f}", "1.00"]]))
        print(f"B / A: {med['B'] / med['A']:.2f}")


if __name__ == "__main__":
    main()
