"""Benchmark: decode steps with the weights in transparent huge pages against 4 KiB pages.

Run: python -m benchmarks.huge_pages [--rounds N] [--order huge-first|small-first]

Loads the default pair's target (bf16) and its draft as `LLM` loads it (int8, the default
shortlist) twice each in one process: once with the CPU backend's huge-page arena
(`specrt.kernels.cpu.huge_pages`) and once without, checks that both give the same logits,
then times 10 decode steps at position 60 of each, the two placements alternating in each
round. Also times the streaming read (the floor) over each copy's weights. Prints median ms
per step, the median of the per-round ratios (small pages / huge pages: above 1, huge pages
are faster) and AnonHugePages from /proc/meminfo. Where a copy lands in physical memory can
matter, so run it with both --order values. JSON on the last line.
"""
from __future__ import annotations

import argparse
import os
import statistics

from benchmarks.harness import cli, machine, report
from benchmarks.harness.model_dirs import resolve_with_draft


def build_parser() -> argparse.ArgumentParser:
    p = cli.parser("benchmarks.huge_pages", __doc__)
    cli.add_common_args(p, out=False, dtype=False, device=False)   # bf16 on the CPU only
    p.add_argument("--rounds", type=cli.count, default=10, help="interleaved rounds (default 10)")
    p.add_argument("--order", choices=("huge-first", "small-first"), default="huge-first",
                   help="which copy of each model is loaded first (default huge-first)")
    return p


def anon_huge_mb() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("AnonHugePages:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    import torch

    from benchmarks.layer_loop import step_seconds
    from specrt.api.tokenizer import Tokenizer
    from specrt.kernels.cpu import bandwidth, huge_pages
    from specrt.model.backends.cpu_native import CpuNative
    from specrt.model.config import ModelConfig
    from specrt.model.transformer import Transformer
    from specrt.spec.drafters.draft_model import draft_head_rows

    cli.setup_torch(args.threads, "cpu")
    if not huge_pages.enabled():
        cli.fail(f"huge pages are off here (THP mode {huge_pages.thp_mode()!r}, "
                 f"{huge_pages.ENV_VAR}={os.environ.get(huge_pages.ENV_VAR)!r}): "
                 "nothing to compare")
    target_dir, draft_dir = resolve_with_draft(args, "its weights are measured")
    info = machine.machine_info(args.threads, "cpu")
    report.print_header("decode steps: weights in huge pages vs 4 KiB pages", info,
                        {"order": args.order, "THP mode": huge_pages.thp_mode()})
    head = draft_head_rows(ModelConfig.from_dir(draft_dir), Tokenizer(target_dir))
    before = anon_huge_mb()
    models = {}
    loads = {"target bf16": (target_dir, {}),
             "draft int8 + shortlist": (draft_dir, {"quant": "int8", "head_rows": head})}
    x = torch.arange(100, 140)[None]
    for name, (model_dir, kw) in loads.items():
        for huge in ((True, False) if args.order == "huge-first" else (False, True)):
            models[(name, huge)] = Transformer.from_dir(model_dir, "bfloat16", "cpu", 512,
                                                        backend=CpuNative(huge=huge), **kw)
        a, b = (models[(name, h)] for h in (True, False))
        if not torch.equal(a.forward(x, a.new_cache(1, 64)), b.forward(x, b.new_cache(1, 64))):
            cli.fail(f"{name}: the two placements give different logits")
    huge_mb = (anon_huge_mb() or 0) - (before or 0)
    weights = {k: bandwidth.weight_tensors(m) for k, m in models.items()}
    step = {k: [] for k in models}
    floor = {k: [] for k in models}
    for r in cli.progress(range(args.rounds), desc="rounds", disable=args.no_progress):
        for name in loads:
            for huge in ((True, False) if r % 2 == 0 else (False, True)):
                k = (name, huge)
                step[k].append(step_seconds(models[k], True) * 1e3)
                floor[k].append(sum(t.nbytes for t in weights[k])
                                / bandwidth.read_seconds(weights[k]) / 1e9)
    rows, out = [], {}
    for name in loads:
        h, s = step[(name, True)], step[(name, False)]
        ratio = statistics.median(b / a for a, b in zip(h, s))
        fr = statistics.median(b / a for a, b in zip(floor[(name, False)], floor[(name, True)]))
        rows.append((name, f"{statistics.median(h):.2f}", f"{statistics.median(s):.2f}",
                     f"{ratio:.3f}", f"{statistics.median(floor[(name, True)]):.1f}",
                     f"{statistics.median(floor[(name, False)]):.1f}", f"{fr:.3f}"))
        out[name] = {"huge_ms": statistics.median(h), "small_ms": statistics.median(s),
                     "step_ratio": ratio, "read_ratio": fr}
    print(report.markdown_table(("model", "huge ms", "4 KiB ms", "4 KiB / huge (paired)",
                                 "read GB/s huge", "read GB/s 4 KiB", "huge / 4 KiB read (paired)"),
                                rows, "lrrrrrr"))
    print(f"\nAnonHugePages grew by {huge_mb:.0f} MiB over the loads; {args.rounds} rounds, "
          f"load order {args.order}")
    report.emit_json({"order": args.order, "anon_huge_mib": huge_mb, **out})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
