"""Benchmark: whole requests under two builds of specrt, interleaved in one run.

Run: python -m benchmarks.generate_ab [--base REV] [--sets tuning,held-out]
                                      [--prompts-per-task N] [--methods plain,auto:16]
                                      [--max-new-tokens 64] [--repeats N]
                                      [--calibration FILE] [--no-progress]

`kernel_ab` times two builds' matrix products and `model_ab` their forward passes; this times
what a user sees: greedy requests of the recorded prompt sets (benchmarks.auto_replay's) on the
default pair, as `LLM()` loads it, each method under both builds. The base revision's tree is
copied out and built (~1-3 min); each build then serves from its own process, and every (prompt,
method) runs under both, in alternating order (ABBA over the sweep), so the machine's swings in
memory bandwidth hit both alike.

`auto` plans from a calibration of each build (specrt.spec.costs), and a calibration is timed
once: both are timed at the start, one after the other, into calibration files of this run (not
the user's cache), so neither build plans from one timed in another hour. A pair timed in
different memory speeds is not a fair pair (a calibration timed while the memory runs fast
prices verify passes far above a decode step, and `auto` then drafts little), so the pair is
timed again, up to CALIBRATIONS times, until the two builds' decode steps in it lie within
STEP_SPREAD of each other (a change that makes the step itself that much faster never passes,
and is warned about). That makes the pair fair, not typical: both may be timed while the memory
runs fast (their steps are printed; 55-57 ms for the default pair's target on the development
machine's fast stretches, 86-92 ms on its usual ones), and both builds' `auto` then plans as
such a calibration makes it. The read bandwidth measured around the calibrations did not tell:
in one run, readings of 63 and 54 GB/s framed steps of 58 and 87 ms, 59 and 35 GB/s two of 89
ms. `--calibration FILE` plans both builds from the calibration in FILE instead (a calibration
file holding one pair of the target and the draft model timed together, as `SPECRT_CALIBRATION`
files of one build do), timing none: what `auto` does in whole requests with a calibration timed
at another memory speed than the requests run at.

Prints per method each build's decode-only tokens/s (summed over the prompts), the geometric
mean over prompts of B's tokens/s / A's (> 1: the working tree is faster), and whether both
builds gave the same tokens (greedy: they should, unless a kernel change alters bits) and the
same as plain decoding. JSON on the last line, with both calibrations (to replay `auto` on them:
benchmarks.auto_replay).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.auto_replay import PROMPT_SETS, prompt_items
from benchmarks.harness import cli, machine, report, revisions
from specrt.spec import calibration

CALIBRATIONS = 4          # tries at a pair of calibrations timed at one memory speed
STEP_SPREAD = 1.1         # ... the slower build's decode step in them / the faster's

# What each build's process runs: load the default pair, then serve one job per line read.
CHILD = r"""
import json, os, sys, torch
from pathlib import Path
torch.set_num_threads(int(sys.argv[1]))
from specrt import LLM
from specrt.spec import calibration
llm = LLM()
print("ready", flush=True)
for line in sys.stdin:
    job = json.loads(line)
    if "calibrate" in job:
        if job["fresh"]:           # forget this process's calibration: time it again
            calibration._cache.clear()
            Path(os.environ["SPECRT_CALIBRATION"]).unlink(missing_ok=True)
        needed = []
        if job.get("given"):       # plan from these curves: what timing them would return
            def given(models, max_t, graphed, curves=job["given"]):
                needed.append(max_t)
                return [curves["verify"][:max_t], curves["draft"][:max_t]], False
            calibration._measure = given
        costs = llm.cost_model(job["calibrate"])
        print(json.dumps({"verify": costs.verify, "draft": costs.draft, "needed": needed}),
              flush=True)
        continue
    item = job["item"]
    ids = (llm.encode(messages=item["messages"]) if "messages" in item
           else llm.encode(item["prompt"], chat=True))
    res = llm.submit(ids, max_new_tokens=job["max_new"], speculative=job["spec"]).result()
    print(json.dumps({"ids": list(res.token_ids), "tokens": len(res.token_ids) - 1,
                      "seconds": res.stats["seconds"] - res.stats["prefill_seconds"]}),
          flush=True)
"""


def build_parser() -> argparse.ArgumentParser:
    p = cli.parser("benchmarks.generate_ab", __doc__)
    p.add_argument("--base", default="HEAD~1", help="git revision of build A (default HEAD~1); "
                   "B is the working tree as it is built")
    p.add_argument("--sets", default="tuning,held-out",
                   help=f"prompt sets (default tuning,held-out; of {','.join(PROMPT_SETS)})")
    p.add_argument("--prompts-per-task", type=cli.count, default=1,
                   help="prompts of each task of each set (default 1)")
    p.add_argument("--methods", default="plain,auto:16",
                   help="comma-separated methods: plain, auto:K, draft_model:K, ngram:K "
                        "(default plain,auto:16)")
    p.add_argument("--max-new-tokens", type=cli.count, default=64,
                   help="new tokens per request (default 64)")
    p.add_argument("--repeats", type=cli.count, default=1, help="sweeps (default 1)")
    p.add_argument("--threads", type=cli.count, default=2, help="torch threads (default 2)")
    p.add_argument("--calibration", default=None, metavar="FILE",
                   help="plan both builds' auto from the pair of curves in this calibration "
                        "file, timing none (default: time a pair at the start)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    return p


def given_calibration(path: str) -> dict[str, list[float]]:
    """The pair of curves a calibration file holds ({"verify": the target's seconds per pass
    size, "draft": the draft model's}: the two entries timed beside each other, the slower
    step the target's), or exit 2 naming what is wrong with the file."""
    try:
        entries = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        cli.fail(f"--calibration {path}: cannot read it as a calibration file ({e})")
    if not isinstance(entries, dict) or not entries or not all(
            calibration.valid_entry(k, v) for k, v in entries.items()):
        cli.fail(f"--calibration {path}: not a calibration file (a JSON object of forward "
                 "times per model, as specrt saves in ~/.cache/specrt/calibration.json)")
    pairs = {frozenset((k, f"{other}{calibration.BESIDE}{model}"))
             for k in entries for model, _, other in [k.partition(calibration.BESIDE)]
             if other and f"{other}{calibration.BESIDE}{model}" in entries}
    if len(pairs) != 1:
        cli.fail(f"--calibration {path}: it holds {len(pairs)} pairs of a target and a draft "
                 "model timed together, not one: keep the pair to plan from in a file of its "
                 "own")
    first, second = (entries[k] for k in sorted(next(iter(pairs))))
    if len(first) != len(second):
        cli.fail(f"--calibration {path}: its pair's curves differ in length ({len(first)} and "
                 f"{len(second)} pass sizes): not a calibration specrt saved")
    target, draft = (first, second) if first[0] >= second[0] else (second, first)
    return {"verify": target, "draft": draft}


def speculative(method: str) -> dict | None:
    """`LLM`'s speculative= argument for a method label, or exit 2 naming the syntax."""
    name, _, k = method.partition(":")
    if name == "plain" and not k:
        return None
    if name in ("auto", "draft_model", "ngram") and k.isdigit() and int(k) > 0:
        return {"method": name, "num_speculative_tokens": int(k)}
    cli.fail(f"unknown method {method!r} in --methods: use plain, auto:K, draft_model:K or "
             "ngram:K (K >= 1)")


def _start(tree: Path, threads: int, calibration: Path) -> subprocess.Popen:
    """The build's process, the default pair loaded, its calibrations kept in `calibration`."""
    env = {**os.environ, "PYTHONPATH": str(tree), "SPECRT_CALIBRATION": str(calibration)}
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(threads)], cwd=tree, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    if proc.stdout.readline().strip() != "ready":
        cli.fail(f"the default pair did not load under {tree}")
    return proc


def _ask(proc: subprocess.Popen, job: dict) -> dict:
    proc.stdin.write(json.dumps(job) + "\n")
    proc.stdin.flush()
    line = proc.stdout.readline()
    if not line:
        cli.fail(f"a build's process died on {str(job)[:80]}")
    return json.loads(line)


def _calibrate(procs: dict[str, subprocess.Popen], k: int,
               given: dict[str, list[float]] | None = None) -> dict[str, dict]:
    """Both builds' calibrations for auto:k, timed one after the other at one memory speed
    (see the module's doc), their curves printed: tag -> {"verify": [seconds of a target pass
    of 1, 2, ... tokens], "draft": [the same for the draft]}. given: the curves both builds
    plan from instead (`given_calibration`; none is timed)."""
    for attempt in range(1, CALIBRATIONS + 1):
        # given: fresh, so each build asks for its curves (`needed`: the pass sizes it plans
        # from) rather than using any it has cached
        curves = {tag: _ask(procs[tag], {"calibrate": k, "fresh": attempt > 1 or bool(given),
                                         "given": given}) for tag in ("A", "B")}
        needed = {tag: curves[tag].pop("needed") for tag in ("A", "B")}
        if given is not None:
            for tag in ("A", "B"):
                if not needed[tag] or curves[tag] != {w: c[:needed[tag][-1]]
                                                      for w, c in given.items()}:
                    cli.fail(f"--calibration: build {tag} did not plan from the given "
                             "calibration (a build older than `generate_ab --calibration`?)")
                if needed[tag][-1] > len(given["verify"]):
                    cli.fail(f"--calibration: its curves time {len(given['verify'])} pass "
                             f"sizes, and build {tag} plans from {needed[tag][-1]}: give a "
                             "calibration this kind of engine saved")
        steps = [curves[tag]["verify"][0] for tag in ("A", "B")]
        spread = max(steps) / min(steps)
        print(f"calibrations for auto:{k}, try {attempt}:", file=sys.stderr)
        for tag in ("A", "B"):
            print(f"  {tag}: target passes of 1-8 tokens "
                  + " ".join(f"{s * 1e3:.1f}" for s in curves[tag]["verify"][:8]) + " ms; draft "
                  + " ".join(f"{s * 1e3:.1f}" for s in curves[tag]["draft"][:8]) + " ms",
                  file=sys.stderr)
        if spread <= STEP_SPREAD or given is not None:
            return curves
    print(f"warning: no pair of calibrations for auto:{k} was timed at one memory speed in "
          f"{CALIBRATIONS} tries (the last: decode steps {spread:.2f}x apart); its comparison "
          "is not fair", file=sys.stderr)
    return curves


def _speed(runs: list[dict]) -> float:
    """Decode-only tokens/s over runs (NaN where they decoded nothing)."""
    seconds = sum(r["seconds"] for r in runs)
    return sum(r["tokens"] for r in runs) / seconds if seconds > 0 else float("nan")


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    sets = [s for s in args.sets.split(",") if s]
    unknown = [s for s in sets if s not in PROMPT_SETS]
    if unknown or not sets:
        cli.fail(f"unknown prompt set(s) {unknown or args.sets!r}: use {','.join(PROMPT_SETS)}")
    methods = [m for m in args.methods.split(",") if m]
    specs = {m: speculative(m) for m in methods}
    if "plain" not in specs:
        methods, specs = ["plain", *methods], {"plain": None, **specs}
    autos = [int(m.partition(":")[2]) for m in methods if m.startswith("auto:")]
    if args.calibration and not autos:
        cli.fail("--calibration is what auto plans from: add an auto:K method to --methods")
    given = given_calibration(args.calibration) if args.calibration else None
    items, seen = [], {}
    for s, task, item in prompt_items({s: PROMPT_SETS[s] for s in sets}):
        seen[(s, task)] = seen.get((s, task), 0) + 1
        if seen[(s, task)] <= args.prompts_per_task:
            items.append((f"{s}:{task}:{item['id']}", item))
    info = machine.machine_info(args.threads, "cpu")
    report.print_header("generate A/B: whole requests under two builds", info,
                        {"base": args.base, "sets": ",".join(sets), "prompts": len(items),
                         "methods": ",".join(methods), "max_new_tokens": args.max_new_tokens,
                         "repeats": args.repeats})
    runs: dict[tuple[str, str, str], list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="generate_ab_") as tmp:
        trees = {"A": revisions.built(args.base, Path(tmp) / "A"), "B": revisions.ROOT}
        procs = {tag: _start(tree, args.threads, Path(tmp) / f"calibration_{tag}.json")
                 for tag, tree in trees.items()}
        # one calibration serves every K here (LLM.cost_model times passes up to 128 tokens
        # with a draft model, MAX_SPECULATIVE_TOKENS + 1 at most)
        calibrations = {"auto": _calibrate(procs, max(autos), given)} if autos else {}
        # each (prompt, method) alternates AB, BA over the repeats, and over the prompts each
        # method starts with A as often as with B
        jobs = [(r + i + j, key, item, m) for r in range(args.repeats)
                for i, (key, item) in enumerate(items) for j, m in enumerate(methods)]
        for turn, key, item, m in cli.progress(jobs, desc="requests", disable=args.no_progress):
            for tag in ("A", "B") if turn % 2 == 0 else ("B", "A"):
                out = _ask(procs[tag], {"item": item, "max_new": args.max_new_tokens,
                                        "spec": specs[m]})
                runs.setdefault((tag, key, m), []).append(out)
        for proc in procs.values():
            proc.stdin.close()
            proc.wait()
    rows, summary = [], {}
    keys = [key for key, _ in items]
    for m in methods:
        speed = {tag: _speed([r for k in keys for r in runs[(tag, k, m)]]) for tag in "AB"}
        ratios = [_speed(runs[("B", k, m)]) / _speed(runs[("A", k, m)]) for k in keys]
        timed = [r for r in ratios if r == r]       # a request that decoded nothing: NaN
        geo = math.exp(sum(map(math.log, timed)) / len(timed)) if timed else float("nan")
        same = sum(all(r["ids"] == runs[("A", k, m)][0]["ids"]
                       for tag in "AB" for r in runs[(tag, k, m)]) for k in keys)
        plain = sum(all(r["ids"] == runs[("A", k, "plain")][0]["ids"]
                        for tag in "AB" for r in runs[(tag, k, m)]) for k in keys)
        rows.append([m, f"{speed['A']:.2f}", f"{speed['B']:.2f}", f"{geo:.3f}",
                     f"{min(timed, default=math.nan):.3f}",
                     f"{max(timed, default=math.nan):.3f}", f"{same}/{len(keys)}",
                     f"{plain}/{len(keys)}"])
        summary[m] = {"tok_s": speed, "b_over_a_geo": geo, "b_over_a": dict(zip(keys, ratios)),
                      "same_tokens": same, "same_as_plain": plain}
    print(report.table(["method", f"A {args.base} tok/s", "B worktree tok/s", "B / A geo",
                        "lowest", "highest", "A = B tokens", "= plain"], rows))
    report.emit_json({"base": args.base, "prompts": keys, "methods": summary,
                      "calibrations": calibrations})
    return 0


if __name__ == "__main__":
    sys.exit(main())
