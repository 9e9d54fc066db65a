"""Benchmark: greedy passes with the output head screened through its int8 copy, against the
full head, side by side in one process.

Run: python -m benchmarks.head_screen [--rounds N] [--max-new-tokens N]     (--help for the knobs)

`specrt.model.backends.head_screen` gives a greedy pass each row's argmax from an int8 copy of
the head plus the exact logits of the few ids that may be it. Two parts, the screen switched on
and off on the same loaded models (`Transformer.head_screen`), the order alternating per round:

1. passes: median ms of a decode step and of a 2-token verify pass (the most rows the screen
   serves, `head_screen.MAX_ROWS`) at position 60 with
   `argmax_only=True`, for the target and for the draft model loaded as a target (bf16, whole
   vocabulary: the 0.5B as a user decoding it alone runs it);
2. end to end: the default pair as `LLM` loads it, greedy, chat template, the first prompt of
   each task of benchmarks/prompts.json, plain and `auto` (K = 16), --repeats runs of each
   with the setting alternating; the median decode-only tokens/s (after the prompt's pass) and
   whether every run gave plain's tokens, with the screen and without.

Writes the section "A screened output head" of benchmarks/RESULTS.md (--no-record to skip);
JSON on the last line.
"""
from __future__ import annotations

import statistics
import time
from pathlib import Path

from benchmarks import e2e_plan
from benchmarks.harness import cli, machine, report, timing
from benchmarks.harness.model_dirs import resolve_with_draft

SECTION = "## A screened output head (benchmarks/head_screen.py)"
METHODS = {"plain": None, "auto:16": {"method": "auto", "num_speculative_tokens": 16}}
POSITION = 60


def build_parser():
    p = cli.parser("benchmarks.head_screen", __doc__)
    cli.add_common_args(p, out=False, dtype=False, device=False)   # bf16 on the CPU only
    cli.add_record_args(p)
    p.add_argument("--rounds", type=cli.count, default=5,
                   help="interleaved rounds of part 1 (median)")
    p.add_argument("--max-new-tokens", type=cli.count, default=64, help="part 2's answer length")
    p.add_argument("--repeats", type=cli.count, default=3,
                   help="part 2's runs of each prompt, method and setting (median)")
    p.add_argument("--skip-e2e", action="store_true", help="part 1 only")
    return p


def _switch(model, screen, on: bool) -> None:
    model.head_screen = screen if on else None


def _pass_ms(model, torch, width: int, reps: int = 7) -> float:
    """Median ms of a greedy pass of `width` tokens at POSITION (the cache put back after each)."""
    cache = model.new_cache(1, POSITION + 64)
    model.forward(torch.arange(100, 100 + POSITION)[None], cache)
    ids = torch.arange(300, 300 + width)[None]
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        model.forward(ids, cache, argmax_only=True)
        times.append(time.perf_counter() - t0)
        cache.truncate([POSITION])
    return statistics.median(times) * 1e3


def passes(args, target_dir, draft_dir) -> tuple[str, dict]:
    import torch

    from specrt.model.transformer import Transformer

    models = {"target": Transformer.from_dir(target_dir, "bfloat16", "cpu", 512),
              "draft model alone": Transformer.from_dir(draft_dir, "bfloat16", "cpu", 512)}
    screens = {name: m.head_screen for name, m in models.items()}
    if any(s is None for s in screens.values()):
        cli.fail("no screened head here (the int8 and bf16 C++ kernels, SPECRT_HEAD_SCREEN "
                 "not 0, a bf16 head the AVX kernels read: see specrt.model.backends.head_screen)")
    keys = [(name, width, on) for name in models for width in (1, 2) for on in (False, True)]
    times = {k: [] for k in keys}
    with torch.inference_mode():
        for r in cli.progress(range(args.rounds), desc="pass rounds", disable=args.no_progress):
            for name, width, on in (keys if r % 2 == 0 else keys[::-1]):
                _switch(models[name], screens[name], on)
                times[(name, width, on)].append(_pass_ms(models[name], torch, width))
    ms = {k: statistics.median(v) for k, v in times.items()}
    # the ratio within each round (the machine's drift between rounds cancels), its median
    ratio = {(name, width): statistics.median(
                 f / s for f, s in zip(times[(name, width, False)], times[(name, width, True)]))
             for name in models for width in (1, 2)}
    rows = [(name, str(width), f"{ms[(name, width, False)]:.1f}", f"{ms[(name, width, True)]:.1f}",
             f"{ratio[(name, width)]:.3f}")
            for name in models for width in (1, 2)]
    heads = {name: (m.lm_head.nbytes / 1e6, screens[name].nbytes / 1e6)
             for name, m in models.items()}
    text = (report.markdown_table(("model", "tokens", "full head ms", "screened ms",
                                   "full / screened, per round"), rows, "lrrrr")
            + "\n\n" + "\n".join(f"- {name}: full head {f:.0f} MB, int8 copy + norms {s:.0f} MB"
                                 for name, (f, s) in heads.items()))
    return text, {"ms": {f"{n} T={w} {'screened' if on else 'full'}": v
                         for (n, w, on), v in ms.items()},
                  "full_over_screened": {f"{n} T={w}": v for (n, w), v in ratio.items()}}


def end_to_end(args, target_dir, draft_dir) -> tuple[str, dict]:
    import specrt

    path = str(Path(__file__).parent / "prompts.json")
    items = e2e_plan.load_prompts(path, tuple(e2e_plan.prompt_tasks(path)), 1)
    llm = specrt.LLM(str(target_dir), draft=str(draft_dir), max_seq_len=1024)
    llm.generate(llm.encode("Hi", chat=True), max_new_tokens=2)              # loads, calibrates
    target = llm.engine.target
    screen = target.head_screen
    if screen is None:
        cli.fail("the target has no screened head here")
    speeds = {(m, on): [] for m in METHODS for on in (False, True)}   # a median per prompt
    same, rows = True, []
    for item in cli.progress(items, desc="prompts", disable=args.no_progress):
        ids = llm.encode(item.text, chat=True)
        got, runs = set(), {k: [] for k in speeds}
        for r in range(args.repeats):
            for on in ((False, True) if r % 2 == 0 else (True, False)):
                _switch(target, screen, on)
                for name, spec in METHODS.items():
                    res = llm.generate(ids, max_new_tokens=args.max_new_tokens, speculative=spec)
                    runs[(name, on)].append(timing.decode_speed(res))
                    got.add(tuple(res.token_ids))
        for k, v in runs.items():
            speeds[k].append(statistics.median(v))
        equal = len(got) == 1             # every method, repeat and setting: plain's tokens
        same &= equal
        rows.append((item.task, *(f"{speeds[(m, on)][-1]:.2f}" for m in METHODS
                                  for on in (False, True)), "yes" if equal else "NO"))
    _switch(target, screen, True)
    llm.close()
    head = tuple(f"{m} {'screened' if on else 'full'} tok/s"
                 for m in METHODS for on in (False, True))
    geo = {m: statistics.geometric_mean(a / b for a, b in zip(speeds[(m, True)],
                                                              speeds[(m, False)]))
           for m in METHODS}
    text = (report.markdown_table(("task", *head, "same tokens"), rows, "l" + "r" * len(head) + "l")
            + "\n\n" + "\n".join(f"- {m}: screened / full, geometric mean {g:.3f}"
                                 for m, g in geo.items()))
    return text, {"screened_over_full": geo, "same_tokens": same}


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    cli.setup_torch(args.threads, "cpu")
    target_dir, draft_dir = resolve_with_draft(args, "it is the second model timed")
    info = machine.machine_info(args.threads, "cpu")
    report.print_header("greedy passes: screened head vs full head", info)
    text, out = passes(args, target_dir, draft_dir)
    print(text)
    if not args.skip_e2e:
        text2, out["e2e"] = end_to_end(args, target_dir, draft_dir)
        print("\n" + text2)
        text += "\n\n" + text2
    if args.record:
        report.record_section(SECTION, report.results_preamble(info, args.note)
                              + f"\nPart 1: median ms of {args.rounds} interleaved rounds; "
                              f"part 2: {args.max_new_tokens} new tokens, medians of "
                              f"{args.repeats} repeats.\n\n" + text + "\n",
                              Path(args.results_md))
    report.emit_json(out)
    return 0 if out.get("e2e", {}).get("same_tokens", True) else 1


if __name__ == "__main__":
    raise SystemExit(main())
