"""Benchmark: a bf16 prompt's prefill on the library GEMM against specrt's skinny kernels.

Run: python -m benchmarks.prompt_paths [--lengths 1,4,8,...] [--rounds N]

Loads the target (bf16, the CPU backend on its AVX-512 kernels: a model packed for AMX tiles
runs every pass on them, `benchmarks.bf16_amx`) and times one prompt's pass of T tokens from
position 0, alone, as the engine prefills it (`model.forward(..., last_only=True)` on a fresh
cache row), two ways alternating within each round: with `gemv.PROMPT_LIBRARY_ROWS` as this
CPU sets it (the library GEMM, oneDNN, from that many tokens) and with it past the kernels'
32 rows (the kernels up to 32 tokens, as before). Prints median ms per pass and the median of
the per-round ratios. Passes of more than 32 tokens take the library either way: a control.
JSON on the last line.
"""
from __future__ import annotations

import argparse
import statistics

from benchmarks.harness import cli, machine, report, timing
from benchmarks.harness.model_dirs import resolve_models


def build_parser() -> argparse.ArgumentParser:
    p = cli.parser("benchmarks.prompt_paths", __doc__)
    cli.add_common_args(p, draft=False, out=False, dtype=False, device=False)  # bf16, CPU
    p.add_argument("--lengths", default="1,4,8,12,16,20,24,32,40",
                   help="prompt lengths in tokens, comma-separated (default 1,4,8,...,40)")
    p.add_argument("--rounds", type=cli.count, default=5, help="interleaved rounds (default 5)")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    lengths = cli.positive_ints(args.lengths, "--lengths", unique_sorted=True)
    import torch

    from specrt.kernels.cpu import gemv
    from specrt.model.backends.cpu_native import CpuNative
    from specrt.model.transformer import Transformer

    cli.setup_torch(args.threads, "cpu")
    if not gemv.AVAILABLE:
        cli.fail("the C++ kernels do not run on this CPU: nothing to compare")
    here = gemv.PROMPT_LIBRARY_ROWS
    kernels = gemv.MAX_ROWS[torch.bfloat16] + 1
    target_dir, _ = resolve_models(args, need_draft=False)
    model = Transformer.from_dir(target_dir, "bfloat16", "cpu", max(lengths) + 1,
                                 backend=CpuNative(amx=False))   # tiles: no lone-prompt path
    info = machine.machine_info(args.threads, "cpu")
    report.print_header("a bf16 prompt's pass: the library GEMM against the kernels", info,
                        {"PROMPT_LIBRARY_ROWS here": here, "model": target_dir.name})
    if here == kernels:
        print(f"This CPU takes the library from {here} tokens, as before (no AMX-BF16, "
              "or SPECRT_AMX=0): both columns run the same code.")
    cache = model.new_cache(1, max(lengths) + 1)
    ids = torch.randint(100, 20000, (1, max(lengths)), generator=torch.Generator().manual_seed(0))

    def seconds(t: int, library_from: int) -> float:
        gemv.PROMPT_LIBRARY_ROWS = library_from
        try:
            cache.truncate([0])
            return timing.time_once(lambda: model.forward(ids[:, :t], cache, last_only=True))
        finally:
            gemv.PROMPT_LIBRARY_ROWS = here

    seconds(lengths[0], here), seconds(lengths[0], kernels)            # warm-up
    times = {(t, w): [] for t in lengths for w in (here, kernels)}
    for r in cli.progress(range(args.rounds), desc="rounds", disable=args.no_progress):
        for t in lengths:
            for w in ((here, kernels) if r % 2 == 0 else (kernels, here)):
                times[(t, w)].append(seconds(t, w) * 1e3)
    rows, out = [], {}
    for t in lengths:
        a, b = times[(t, here)], times[(t, kernels)]
        ratio = statistics.median(x / y for x, y in zip(a, b))
        rows.append((t, f"{statistics.median(b):.1f}", f"{statistics.median(a):.1f}",
                     f"{ratio:.2f}", "library" if t >= here else "kernels"))
        out[t] = {"kernels_to_32_ms": statistics.median(b), "here_ms": statistics.median(a),
                  "ratio": ratio}
    print(report.markdown_table(("tokens", "kernels to 32 ms", f"from {here} on the library ms",
                                 "here / kernels (paired)", "here takes"), rows, "rrrrl"))
    report.emit_json({"prompt_library_rows": here, "rounds": args.rounds, "passes": out})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
