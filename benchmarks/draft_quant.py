"""Benchmark: quantized drafts (int8, int4) against the bf16 draft, side by side in one run.

Run: python -m benchmarks.draft_quant [--quick] [--prompts FILE] [--drafts bfloat16,int8,int4]

One target (bf16) and the same draft model loaded once per form in --drafts: quantized ones as
`LLM` loads them (scoring the default shortlist of token ids and the special ones: see
specrt.spec.drafters.draft_model.shortlist), the unquantized one over the whole vocabulary;
each in its own engine sharing the target's weights, all on this thread. Measures:
- step costs: a target decode step and a step of each draft, in turns (the order reversed
  every other round; median of --step-repeats rounds of 10 steps each), and the ratios
  draft / target;
- per prompt (chat template, greedy, --max-new-tokens): plain decoding and, for each draft,
  draft_model:K for K in --ks and auto:8, the methods in a rotating order per prompt so drift
  hits them alike; tokens/s over the whole call (prefill included), acceptance rate and mean
  acceptance length, and whether every output equals plain greedy token for token.
Per task: each method's tokens/s, acceptance per draft, and each quantized draft's best / the
bf16 draft's best. Prints a table; writes the section "Quantized drafts" of
benchmarks/RESULTS.md (--no-record to skip); JSON on the last line.
"""
from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time
from pathlib import Path

from benchmarks import e2e_plan
from benchmarks.harness import cli, machine, report, timing
from benchmarks.harness.model_dirs import resolve_with_draft

SECTION = "## Quantized drafts (benchmarks/draft_quant.py)"
PROMPTS = Path(__file__).with_name("prompts.json")


def build_parser() -> argparse.ArgumentParser:
    p = cli.parser("benchmarks.draft_quant", __doc__)
    cli.add_common_args(p, out=False, progress=False)     # a line per prompt on stderr
    cli.add_record_args(p)
    p.add_argument("--quick", action="store_true", help="1 prompt per task, 48 tokens, K=4")
    p.add_argument("--prompts", default=str(PROMPTS), help="prompts file (benchmarks/prompts.json "
                   "format)")
    p.add_argument("--prompts-per-task", type=cli.count, default=None,
                   help="default 3 (--quick: 1)")
    p.add_argument("--max-new-tokens", type=cli.count, default=None,
                   help="default 128 (--quick: 48)")
    p.add_argument("--ks", default=None, help="draft_model K values (default 2,4; --quick: 4)")
    p.add_argument("--step-repeats", type=cli.count, default=5)
    p.add_argument("--drafts", default=None, help="draft forms to compare, the first the "
                   "reference of the ratios: --dtype (unquantized, whole vocabulary), int8, "
                   "int4 (default: all three, --dtype first)")
    return p


def parse_args(args) -> tuple[int, int, list[int], list[str | None], dict]:
    """(prompts per task, new tokens, the Ks, the draft forms as `quant=` takes them (None: the
    unquantized --dtype), task -> its first prompts), checked before any model loads."""
    from specrt.model.backends.quantized import QUANT_FORMATS

    n_prompts = (1 if args.quick else 3) if args.prompts_per_task is None \
        else args.prompts_per_task
    max_new = (48 if args.quick else 128) if args.max_new_tokens is None else args.max_new_tokens
    if n_prompts < 1 or max_new < 2 or args.step_repeats < 1:
        cli.fail("--prompts-per-task and --step-repeats must be >= 1, --max-new-tokens >= 2")
    ks = cli.positive_ints(args.ks or ("4" if args.quick else "2,4"), "--ks")
    names = [f.strip() for f in (args.drafts or f"{args.dtype},int8,int4").split(",")
             if f.strip()]
    known = (args.dtype, *QUANT_FORMATS)
    if bad := [f for f in names if f not in known]:
        cli.fail(f"--drafts: {bad[0]!r} is not a draft form; use "
                 f"{', '.join(known)} (the unquantized form is this run's --dtype, "
                 f"{args.dtype})")
    if not names or len(set(names)) != len(names):
        cli.fail(f"--drafts: give each form once, at least one, got {args.drafts!r}")
    tasks = tuple(e2e_plan.prompt_tasks(args.prompts))
    by_task: dict[str, list] = {}
    for pr in e2e_plan.load_prompts(args.prompts, tasks, n_prompts):
        by_task.setdefault(pr.task, []).append(pr)
    return n_prompts, max_new, ks, [None if f == args.dtype else f for f in names], by_task


def step_costs(models: dict, repeats: int) -> dict[str, float]:
    """Median seconds of one decode step (1 row) of each model, in turns, the order reversed
    every other repeat."""
    times = collections.defaultdict(list)
    for r in range(repeats):
        for k, m in (models.items() if r % 2 == 0 else list(models.items())[::-1]):
            times[k].append(timing.decode_step_seconds(m, position=32))
    return {k: statistics.median(v) for k, v in times.items()}


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from specrt.api.tokenizer import Tokenizer
    from specrt.engine.engine import Engine
    from specrt.engine.request import Request
    from specrt.model.transformer import Transformer
    from specrt.spec.config import SpecConfig
    from specrt.model.config import ModelConfig
    from specrt.spec.drafters.draft_model import draft_head_rows

    n_prompts, max_new, ks, forms, tasks = parse_args(args)
    cli.setup_torch(args.threads, args.device)
    target_dir, draft_dir = resolve_with_draft(args, "its forms are compared")
    info = machine.machine_info(args.threads, args.device)
    report.print_header("Quantized drafts side by side", info)

    target = Transformer.from_dir(target_dir, args.dtype, args.device, 4096)
    tok = Tokenizer(target_dir)
    # as LLM loads them: unquantized = draft_dtype/draft_vocab of the model, quantized = the
    # default shortlist
    rows = draft_head_rows(ModelConfig.from_dir(draft_dir), tok)
    drafts = {}
    for q in forms:
        t0 = time.perf_counter()
        drafts[q or args.dtype] = Transformer.from_dir(draft_dir, args.dtype, args.device, 4096,
                                                       quant=q, head_rows=rows if q else None)
        log(f"draft {q or args.dtype}: loaded in {time.perf_counter() - t0:.1f} s")
    eos = frozenset(target.cfg.eos_token_ids)
    steps = step_costs({"target": target, **drafts}, args.step_repeats)
    ratios = {k: steps[k] / steps["target"] for k in drafts}
    log("step ms: " + ", ".join(f"{k} {v * 1e3:.1f}" for k, v in steps.items()))
    engines = {k: Engine(target, d, 1, 4096) for k, d in drafts.items()}
    for engine in engines.values():      # calibrate auto's costs now, not inside a timed call
        engine.planner_for(SpecConfig(method="auto", num_speculative_tokens=8))

    methods = [("plain", None, None)]
    for k in ks:
        methods += [(f"draft_model:{k} {q}", q, SpecConfig(method="draft_model",
                                                           num_speculative_tokens=k))
                    for q in drafts]
    methods += [(f"auto:8 {q}", q, SpecConfig(method="auto", num_speculative_tokens=8))
                for q in drafts]

    rows = []
    for t, (task, items) in enumerate(tasks.items()):
        for i, item in enumerate(items):
            ids = tuple(tok.encode_messages([{"role": r, "content": c} for r, c in item.text])
                        if isinstance(item.text, tuple) else tok.encode(item.text, chat=True))
            order = methods[(t + i) % len(methods):] + methods[:(t + i) % len(methods)]
            plain_out = None
            results = {}
            for label, q, spec in order:
                engine = engines[q or args.dtype] if spec else next(iter(engines.values()))
                req = Request(ids, max_new, spec=spec, eos_ids=eos)
                t0 = time.perf_counter()
                out, stats = [], None
                for batch in engine.run([req]):
                    for s in batch:
                        out += s.new_tokens
                        stats = s.stats or stats
                results[label] = (out, time.perf_counter() - t0, stats)
            plain_out = results["plain"][0]
            for label, (out, wall, stats) in results.items():
                rows.append({"task": task, "prompt": item.id, "method": label,
                             "tokens": len(out), "seconds": wall,
                             "drafted": stats["num_draft_tokens"],
                             "accepted": stats["num_accepted_tokens"],
                             "drafts": stats["num_drafts"], "exact": out == plain_out})
            log(f"{task}/{item.id}: " + ", ".join(
                f"{lab} {len(o) / w:.1f}" for lab, (o, w, _) in results.items()))

    table, summary = summarize(rows, [m[0] for m in methods], list(drafts))
    bytes_ = {k: d.weight_bytes for k, d in drafts.items()}
    lines = ["step ms: " + ", ".join(f"{k} {v * 1e3:.1f}" for k, v in steps.items()),
             "draft step / target step: " + ", ".join(f"{k} {v:.3f}" for k, v in ratios.items()),
             "draft weight MB read per step: " + ", ".join(f"{k} {v / 1e6:.0f}"
                                                           for k, v in bytes_.items()),
             "", table]
    mismatches = sum(not r["exact"] for r in rows)
    lines.append(f"\nmismatches against plain greedy: {mismatches} of {len(rows)} generations")
    text = "\n".join(lines)
    print(text)
    if args.record:
        report.record_section(SECTION, report.results_preamble(info, args.note)
                              + "\n```\n" + text + "\n```\n", Path(args.results_md))
    report.emit_json({"steps": steps, "ratios": ratios, "summary": summary,
                      "mismatches": mismatches, "rows": rows})
    return 0


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def summarize(rows: list[dict], methods: list[str], quants: list[str]) -> tuple[str, dict]:
    by = collections.defaultdict(lambda: [0, 0.0, 0, 0, 0])
    for r in rows:
        e = by[(r["task"], r["method"])]
        e[0] += r["tokens"]
        e[1] += r["seconds"]
        e[2] += r["drafted"]
        e[3] += r["accepted"]
        e[4] += r["drafts"]
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    head = "| method | " + " | ".join(tasks) + " |"
    out = [head, "|" + "---|" * (len(tasks) + 1)]
    for m in methods:
        cells = []
        for t in tasks:
            tokens, secs, drafted, accepted, _ = by[(t, m)]
            acc = f" ({accepted / drafted:.0%})" if drafted else ""
            cells.append(f"{tokens / secs:.2f}{acc}")
        out.append(f"| {m} | " + " | ".join(cells) + " |")
    summary = {}
    ref = quants[0]
    for t in tasks:
        best = {q: max((by[(t, m)][0] / by[(t, m)][1], m) for m in methods if m.endswith(q))
                for q in quants}
        plain = by[(t, "plain")][0] / by[(t, "plain")][1]
        summary[t] = {"best": {q: b[1] for q, b in best.items()},
                      "over_ref": {q: best[q][0] / best[ref][0] for q in quants[1:]},
                      "over_plain": {q: best[q][0] / plain for q in quants}}
    out.append("")
    out.append("cells: tokens/s over the whole call (acceptance rate of drafted tokens)")
    for t, s in summary.items():
        out.append(f"- {t}: " + "; ".join(
            f"best {q} / best {ref} = {s['over_ref'][q]:.2f} ({s['best'][q]} vs "
            f"{s['best'][ref]})" for q in quants[1:]) + "; best / plain: " + ", ".join(
            f"{q} {s['over_plain'][q]:.2f}" for q in quants))
    return "\n".join(out), summary


if __name__ == "__main__":
    raise SystemExit(main())
