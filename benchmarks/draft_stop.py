"""Benchmark: the draft model's stop (`draft_stop`) on and off, interleaved in one run.

Run: python -m benchmarks.draft_stop [--sets tuning,held-out]
         [--methods auto,draft_model:3,draft_model:5] [--stops 0,0.5] [--repeats 2]
         [--max-new-tokens 64]

One `LLM` (the default pair unless --model / --draft); for each prompt of the chosen sets (the
prompt files of benchmarks.auto_replay, in the chat template), plain decoding once (the
reference output), then each method with each stop in --stops, the stops alternating within
each method and their order reversed every other repeat, so the machine's drift hits both
alike. The stop is set on the engine's drafter between requests, on the scheduler's thread.
Measures decode-only tokens/s (as benchmarks.e2e: the tokens after the first over the time
after the prefill), the draft tokens per drafted round, and whether every output equals plain
greedy token for token. Prints per prompt the median tokens/s of each (method, stop) and each
stop's ratio to the first, then per set and method the geometric mean of those ratios; writes
the section "The draft model's stop on and off" of benchmarks/RESULTS.md (--no-record to
skip); JSON on the last line.
"""
from __future__ import annotations

import math
import statistics
from pathlib import Path

from benchmarks.auto_replay import PROMPT_SETS, encode_item, prompt_items
from benchmarks.harness import cli, report, timing
from benchmarks.harness.model_dirs import resolve_with_draft

SECTION = "## The draft model's stop on and off (benchmarks/draft_stop.py)"


def build_parser():
    p = cli.parser("benchmarks.draft_stop", __doc__)
    cli.add_common_args(p, out=False)
    cli.add_record_args(p)
    p.add_argument("--sets", default="tuning,held-out",
                   help=f"prompt sets (default tuning,held-out; of {','.join(PROMPT_SETS)})")
    p.add_argument("--methods", default="auto,draft_model:3,draft_model:5",
                   help="specrt methods, METHOD:K (auto alone: K <= 16)")
    p.add_argument("--stops", default="0,0.5", help="draft_stop values, the first the "
                   "reference of the ratios (default 0,0.5)")
    p.add_argument("--repeats", type=cli.count, default=2)
    p.add_argument("--max-new-tokens", type=cli.count, default=64)
    return p


def parse_args(args) -> tuple[list[str], list[tuple[str, int]], list[float]]:
    sets = [s.strip() for s in args.sets.split(",") if s.strip()]
    unknown = [s for s in sets if s not in PROMPT_SETS]
    if unknown or not sets:
        cli.fail(f"--sets: unknown set(s) {', '.join(unknown) or '(none given)'}; choose from "
                 f"{', '.join(PROMPT_SETS)}")
    methods = cli.method_ks(args.methods, "--methods", ("auto", "draft_model"), {"auto": 16},
                            why="the stop is the draft model's")
    try:
        stops = [float(s) for s in args.stops.split(",") if s.strip()]
    except ValueError:
        cli.fail(f"--stops: expected comma-separated probabilities, got {args.stops!r}")
    if len(stops) < 2 or not all(0.0 <= s <= 1.0 for s in stops):
        cli.fail(f"--stops: give two or more probabilities in [0, 1], got {args.stops!r}")
    if args.repeats < 1 or args.max_new_tokens < 2:
        cli.fail("--repeats must be >= 1 and --max-new-tokens >= 2")
    return sets, methods, stops


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    sets, methods, stops = parse_args(args)
    cli.setup_torch(args.threads, args.device)
    import specrt

    target_dir, draft_dir = resolve_with_draft(args, "the stop is the draft model's")
    llm = specrt.LLM(target_dir, draft=draft_dir, dtype=args.dtype, device=args.device)
    drafter = llm.engine.draft_drafter

    def set_stop(value: float) -> None:
        llm.scheduler.call(lambda: setattr(drafter, "stop_below", value))

    items = prompt_items({s: PROMPT_SETS[s] for s in sets})
    rows, mismatches, runs = [], 0, 0
    for s, task, item in cli.progress(items, desc="prompts", disable=args.no_progress):
        ids = encode_item(llm, item)
        plain = llm.generate(ids, max_new_tokens=args.max_new_tokens)
        speeds = {(m, k, st): [] for m, k in methods for st in stops}
        per_round = {key: [] for key in speeds}
        for r in range(args.repeats):
            for m, k in methods:
                for st in (stops if r % 2 == 0 else stops[::-1]):
                    set_stop(st)
                    res = llm.generate(ids, max_new_tokens=args.max_new_tokens,
                                       speculative={"method": m, "num_speculative_tokens": k})
                    runs += 1
                    mismatches += res.token_ids != plain.token_ids
                    speeds[(m, k, st)].append(timing.decode_speed(res))
                    if res.stats["num_drafts"]:
                        per_round[(m, k, st)].append(res.stats["num_draft_tokens"]
                                                     / res.stats["num_drafts"])
        set_stop(stops[0])
        row = {"set": s, "prompt": f"{task}:{item['id']}", "plain": timing.decode_speed(plain),
               "methods": {}}
        for m, k in methods:
            med = {st: statistics.median(speeds[(m, k, st)]) for st in stops}
            row["methods"][f"{m}:{k}"] = {
                "tok_s": {str(st): v for st, v in med.items()},
                "ratio": {str(st): med[st] / med[stops[0]] for st in stops[1:]},
                "drafts_per_round": {str(st): statistics.mean(per_round[(m, k, st)])
                                     if per_round[(m, k, st)] else 0.0 for st in stops}}
        rows.append(row)
    text = render(rows, methods, stops, mismatches, runs)
    print(text)
    if args.record:
        body = (f"Command: `{report.command_line()}`; decode-only tokens/s, medians of "
                f"{args.repeats}, the stops alternating within each method.\n"
                + report.note_block(args.note) + "\n")
        report.record_section(SECTION, body + text + "\n", Path(args.results_md))
    report.emit_json({"rows": rows, "mismatches": mismatches, "runs": runs})
    return 0


def render(rows: list[dict], methods, stops, mismatches: int, runs: int) -> str:
    labels = [f"{m}:{k}" for m, k in methods]
    head = ["set", "prompt", "plain"]
    for label in labels:
        head += [f"{label} stop {st:g}" for st in stops]
        head += [f"{label} {st:g} / {stops[0]:g}" for st in stops[1:]]
    body = []
    for row in rows:
        line = [row["set"], row["prompt"], f"{row['plain']:.2f}"]
        for label in labels:
            r = row["methods"][label]
            line += [f"{r['tok_s'][str(st)]:.2f} ({r['drafts_per_round'][str(st)]:.1f}/round)"
                     for st in stops]
            line += [f"{r['ratio'][str(st)]:.3f}" for st in stops[1:]]
        body.append(line)
    lines = [report.markdown_table(head, body), ""]
    for s in dict.fromkeys(r["set"] for r in rows):
        for label in labels:
            for st in stops[1:]:
                ratios = [r["methods"][label]["ratio"][str(st)] for r in rows if r["set"] == s]
                geo = math.exp(statistics.mean(math.log(x) for x in ratios))
                lines.append(f"- {s}, {label}: stop {st:g} / stop {stops[0]:g} geometric mean "
                             f"{geo:.3f} over {len(ratios)} prompts (lowest {min(ratios):.3f}, "
                             f"highest {max(ratios):.3f})")
    lines.append(f"- outputs differing from plain greedy: {mismatches} of {runs}")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
