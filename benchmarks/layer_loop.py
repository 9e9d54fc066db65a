"""Benchmark: a decode step through the C++ layer loop against the per-op loop it replaces.

Run: python -m benchmarks.layer_loop [--rounds N]        (--help for the knobs)

The default pair's target (bf16) and its draft as `LLM` loads it, int8 (the default), int4
(`draft_dtype="int4"`) and bf16 (`draft_dtype="bfloat16"`), all scoring the default
shortlist, each on the CPU-native backend. Each round times 10 decode steps at position 60 of
every model with the fused loop (`specrt.kernels.cpu.layers`) and with the per-op loop
(`CpuNative.layers_per_op`), the order alternating from round to round, so the machine's drift
hits both alike. Prints median ms per
step, the speedup, draft step / target step for both loops, and the bytes of weights a step
reads relative to the target's (the floor under the step ratio of a memory-bound step); writes
the section "C++ layer loop" of benchmarks/RESULTS.md (--no-record to skip); JSON on the last
line.
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from benchmarks.harness import cli, machine, report, timing
from benchmarks.harness.model_dirs import resolve_with_draft

SECTION = "## C++ layer loop (benchmarks/layer_loop.py)"


def build_parser() -> argparse.ArgumentParser:
    p = cli.parser("benchmarks.layer_loop", __doc__)
    cli.add_common_args(p, out=False, dtype=False, device=False)   # bf16 on the CPU only
    cli.add_record_args(p)
    p.add_argument("--rounds", type=cli.count, default=5, help="interleaved rounds (median)")
    return p


def step_seconds(model, fused: bool) -> float:
    """A decode step at position 60 through the fused loop or the per-op one."""
    model.backend.fused_loop = fused
    return timing.decode_step_seconds(model)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from specrt.api.tokenizer import Tokenizer
    from specrt.model.transformer import Transformer
    from specrt.model.config import ModelConfig
    from specrt.spec.drafters.draft_model import draft_head_rows

    cli.setup_torch(args.threads, "cpu")
    target_dir, draft_dir = resolve_with_draft(args, "its step is measured")
    info = machine.machine_info(args.threads, "cpu")
    report.print_header("C++ layer loop vs per-op loop", info)
    target = Transformer.from_dir(target_dir, "bfloat16", "cpu", 512)
    head = draft_head_rows(ModelConfig.from_dir(draft_dir), Tokenizer(target_dir))
    drafts = {f"draft {q or 'bf16'} + shortlist": Transformer.from_dir(
                  draft_dir, "bfloat16", "cpu", 512, quant=q,
                  head_rows=head)
              for q in ("int8", "int4", None)}
    models = {"target bf16": target, **drafts}
    times = {(name, fused): [] for name in models for fused in (False, True)}
    for r in cli.progress(range(args.rounds), desc="rounds", disable=args.no_progress):
        for name, model in models.items():
            for fused in ((False, True) if r % 2 == 0 else (True, False)):
                times[(name, fused)].append(step_seconds(model, fused))
    ms = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    rows = [(name, f"{ms[(name, False)]:.2f}", f"{ms[(name, True)]:.2f}",
             f"{ms[(name, False)] / ms[(name, True)]:.3f}") for name in models]
    ratios = {f"{d} / target, {'fused' if f else 'per-op'}":
              ms[(d, f)] / ms[("target bf16", f)]
              for d in drafts for f in (False, True)}
    ratios |= {f"{d} / target, weight bytes": models[d].weight_bytes / target.weight_bytes
               for d in drafts}
    text = "\n".join(
        [report.markdown_table(("model", "per-op ms", "fused ms", "speedup"), rows, "lrrr"), ""]
        + [f"- {k}: {v:.3f}" for k, v in ratios.items()])
    print(text)
    if args.record:
        report.record_section(SECTION, report.results_preamble(info, args.note)
                              + f"\nMedian ms per decode step, {args.rounds} interleaved "
                              "rounds of 10 steps at position 60:\n\n" + text + "\n",
                              Path(args.results_md))
    report.emit_json({"ms": {f"{k[0]} {'fused' if k[1] else 'per-op'}": v
                            for k, v in ms.items()}, "ratios": ratios})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
