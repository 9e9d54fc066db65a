"""Benchmark: what `auto` would gain from knowing what it cannot know, replayed on the traces.

Run: python -m benchmarks.auto_replay record     (once: the traces)
     python -m benchmarks.auto_oracles [--budgets 64,128] [--draft-priors 0.6,0.7]
                                       [--sets held-out,verify]

`auto` plans from two guesses about a request it has just started: how often the draft model's
guesses will be accepted (a prior, then what the request's own rounds show) and how many more
tokens the answer will run (as many as it has run so far, within MIN_HORIZON..HORIZON and the
budget), which decides whether the draft model's read of the prompt will be repaid. Each
replay below (benchmarks/auto_replay.py: the real planners, every round priced by this
machine's calibration) answers one of them with the truth, or with another rule:

  auto              as shipped;
  oracle accept     the draft model's priors = the trace's own: the share of output tokens
                    its teacher-forced guess got right, among the guesses it was sure of
                    (confidence >= draft_stop) and among the others, and the share it was
                    sure of (`AdaptivePlanner._draft_round`); not lifted by what its plain
                    steps hear of the target's confidence (the truth is given);
  oracle length     the horizon = the tokens the answer really has left;
  both oracles      the two together;
  budget length     the horizon = what is left of max_new_tokens (answers assumed to fill
                    their budget): the rule a horizon oracle suggests, without the oracle;
  prior P           (--draft-priors) the draft model's prior = P for every request (of its
                    sure guesses; of every guess for a trace without confidences): the
                    constant `auto` ships with, tried at other values (lifted by what it
                    hears, as shipped).

and, to show how much of the answer the goal's yardstick needs (the best fixed setting in
hindsight is chosen on the whole answer), two choosers that are not `auto`:

  fixed, 1/2 seen   the fixed setting fastest on the answer's first half, for all of it;
  fixed, 3/4 seen   the same, chosen on its first three quarters.

Traces are cut at each budget (an answer longer than the budget stops there; one that ended
sooner keeps its end); a budget past the one a trace was recorded with and stopped at is
refused (its answer would replay as ended there). Prints per prompt set and rule: the mean and
lowest `auto` / best fixed setting, and the lowest `auto` / plain; then, per rule, the tasks (a
set's prompts of one kind) whose mean share of the best fixed setting is below 95%, the
measure of issue 16's goal. Measures nothing on the clock.
"""
from __future__ import annotations

import statistics

from benchmarks.auto_replay import (FIXED, TRACES, _load_traces, as_heard, cut, cut_all,
                                    fixed_methods, replay)
from specrt.spec.config import DRAFT_STOP
from benchmarks.harness import cli, report
from benchmarks.harness.model_dirs import resolve_with_draft


def build_parser():
    p = cli.parser("benchmarks.auto_oracles", __doc__)
    cli.add_common_args(p, out=False, progress=False)     # replays: seconds
    p.add_argument("--traces", default=str(TRACES))
    p.add_argument("--budgets", default=None,
                   help="max_new_tokens values to replay at, none past the traces' recorded "
                        "budget (default: 64 and that budget, 64,128 as `record` writes them)")
    p.add_argument("--auto-k", type=cli.count, default=16, help="auto's K_max (default 16)")
    p.add_argument("--draft-priors", default="",
                   help="also replay auto with these draft-model priors, e.g. 0.6,0.7")
    p.add_argument("--sets", default="",
                   help="comma-separated prompt sets to replay (default: every recorded set)")
    return p


def planners(trace: dict, draft_priors=()) -> dict:
    """rule -> the planner class `auto` replays this trace with (None: as shipped)."""
    from specrt.spec.planners.adaptive import HORIZON, PRIORS, AdaptivePlanner

    out, guess = trace["output"], trace["draft"]
    right = [a == b for a, b in zip(guess, out)]
    sure = [c >= DRAFT_STOP for c in trace.get("confidence") or [1.0] * len(out)]

    def share(values) -> float | None:
        values = list(values)
        return sum(values) / len(values) if values else None

    agree = share(right)
    # the truth as a draft that stops is priced (replay stops it at DRAFT_STOP)
    sure_agree = share(r for r, s in zip(right, sure) if s)
    truth = {"priors": PRIORS | {"draft_model": agree,
                                 "draft_model/sure": agree if sure_agree is None else sure_agree},
             "goes_prior": share(sure)}
    unsure_agree = share(r for r, s in zip(right, sure) if not s)
    if unsure_agree is not None:
        truth["unsure_prior"] = unsure_agree

    def with_draft_prior(prior: float | None, base=AdaptivePlanner, hears: bool = True):
        """`base`, starting every request with the draft model's prior = prior (None: the
        trace's own, `truth`), and, unless `hears`, deaf to the target's confidence
        (`_hear_target`)."""
        attrs = dict(truth) if prior is None else {
            "priors": PRIORS | {"draft_model": prior, "draft_model/sure": prior}}
        if not hears:
            attrs["_hear_target"] = lambda self, target_sure: None
        return type(base.__name__, (base,), attrs)

    class OracleLength(AdaptivePlanner):
        def _horizon(self, ctx, rows):
            return max(1.0, min(len(out) - ctx.generated[0], HORIZON))

    class BudgetLength(AdaptivePlanner):
        def _horizon(self, ctx, rows):
            return max(1.0, min(ctx.remaining[0], HORIZON))

    rules = {"auto": None, "oracle accept": with_draft_prior(None, hears=False),
             "oracle length": OracleLength,
             "both oracles": with_draft_prior(None, OracleLength, hears=False),
             "budget length": BudgetLength}
    rules.update((f"prior {p:g}", with_draft_prior(p)) for p in draft_priors)
    return rules


SEEN = {"fixed, 1/2 seen": 0.5, "fixed, 3/4 seen": 0.75}


def chosen_on_start(trace: dict, fixed: list[str], costs, share: float) -> str:
    """The fixed setting fastest on the first `share` of the trace's answer (at least its
    first two tokens: the first is the prefill's), replayed as a request of that budget."""
    seen = cut(trace, min(len(trace["output"]), max(2, round(len(trace["output"]) * share))))
    return max(fixed, key=lambda m: replay(seen, m, costs)[0])


def replay_budget(traces: dict, budget: int, fixed: list[str], auto: str, costs,
                  draft_priors=()) -> list[dict]:
    """One row per trace, `traces` already cut to `budget` (auto_replay.cut_all)."""
    rows = []
    for key, trace in traces.items():
        whole = {m: replay(trace, m, costs)[0] for m in fixed}
        best = max(whole.values())
        plain = replay(trace, "plain", costs)[0]
        speeds = {rule: replay(trace, auto, costs, cls)[0]
                  for rule, cls in planners(trace, draft_priors).items()}
        speeds |= {rule: whole[chosen_on_start(trace, fixed, costs, share)]
                   for rule, share in SEEN.items()}
        rows.append({"trace": key, "set": trace["set"], "budget": budget, "best": best,
                     "plain": plain, "auto": speeds})
    return rows


def summary(rows: list[dict]) -> list[list]:
    cells = []
    for budget in dict.fromkeys(r["budget"] for r in rows):
        for s in dict.fromkeys(r["set"] for r in rows):
            rs = [r for r in rows if r["budget"] == budget and r["set"] == s]
            line = [budget, s]
            for rule in rs[0]["auto"]:
                vs_best = [r["auto"][rule] / r["best"] for r in rs]
                vs_plain = [r["auto"][rule] / r["plain"] for r in rs]
                line.append(f"{statistics.mean(vs_best):.1%} / {min(vs_best):.1%} / "
                            f"{min(vs_plain):.2f}x")
            cells.append(line)
    return cells


def task_misses(rows: list[dict], floor: float = 0.95) -> list[list]:
    """Per budget and rule: how many tasks (a set's prompts of one kind, as `e2e` groups
    them) have a mean share of the best fixed setting below `floor`, of how many, and which."""
    cells = []
    for budget in dict.fromkeys(r["budget"] for r in rows):
        rs = [r for r in rows if r["budget"] == budget]
        for rule in rs[0]["auto"]:
            tasks: dict[str, list[float]] = {}
            for r in rs:
                tasks.setdefault(r["trace"].rsplit(":", 1)[0], []).append(
                    r["auto"][rule] / r["best"])
            low = sorted(t for t, v in tasks.items() if statistics.mean(v) < floor)
            cells.append([budget, rule, f"{len(low)} of {len(tasks)}", ", ".join(low)])
    return cells


def main(argv=None) -> int:
    import specrt

    args = build_parser().parse_args(argv)
    cli.setup_torch(args.threads, args.device)
    try:
        priors = list(dict.fromkeys(float(p) for p in args.draft_priors.split(",") if p.strip()))
    except ValueError:
        cli.fail(f"--draft-priors: expected comma-separated numbers, got {args.draft_priors!r}")
    if any(not 0.0 < p < 1.0 for p in priors):
        cli.fail("--draft-priors: each prior is an acceptance probability, strictly between 0 "
                 "and 1")
    data = _load_traces(args.traces)
    sets = [s.strip() for s in args.sets.split(",") if s.strip()]
    known = sorted({t["set"] for t in data["traces"].values()})
    if unknown := [s for s in sets if s not in known]:
        cli.fail(f"--sets: no traces of {', '.join(unknown)} in {args.traces}; recorded sets: "
                 f"{', '.join(known)}")
    traces = {k: t for k, t in data["traces"].items() if not sets or t["set"] in sets}
    if args.budgets is None:
        recorded = min(t.get("max_new_tokens", len(t["output"])) for t in traces.values())
        budgets = sorted({min(64, recorded), recorded})
    else:
        budgets = cli.positive_ints(args.budgets, "--budgets")
    if min(budgets) < 2:
        cli.fail("--budgets: give budgets of 2 tokens or more (the first is the prefill's)")
    by_budget = {b: cut_all(traces, b, "--budgets") for b in dict.fromkeys(budgets)}
    target_dir, draft_dir = resolve_with_draft(args, "auto and the fixed settings draft with it")
    llm = specrt.LLM(target_dir, draft=draft_dir, dtype=args.dtype, device=args.device)
    by_budget = {b: as_heard(cut, llm) for b, cut in by_budget.items()}
    costs = llm.cost_model(args.auto_k)        # timed where the rounds run
    step = costs.verify_pass([1])
    print(f"costs: target step {step * 1e3:.1f} ms; verify(T) / step for T = 2..9: "
          + " ".join(f"{costs.verify_pass([t]) / step:.2f}" for t in range(2, 10))
          + f"; the draft's catch-up on 90 tokens: {costs.draft_pass([90]) / step:.2f} steps")
    fixed = fixed_methods(FIXED)
    rows = [r for b, cut in by_budget.items()
            for r in replay_budget(cut, b, fixed, f"auto:{args.auto_k}", costs, priors)]
    print("auto / best fixed setting, mean / lowest, and the lowest auto / plain, per rule:")
    print(report.table(["budget", "set", *rows[0]["auto"]], summary(rows),
                       "rl" + "r" * len(rows[0]["auto"])))
    print("tasks whose mean share of the best fixed setting is below 95%, per rule:")
    print(report.table(["budget", "rule", "tasks < 95%", "which"], task_misses(rows), "rlrl"))
    report.emit_json({"rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
