"""Benchmark: `auto` replayed on recorded greedy traces against every fixed setting, noise-free.

Run: python -m benchmarks.auto_replay record    (once per model pair: ~20 min on 2 cores)
     python -m benchmarks.auto_replay replay    (seconds; --help for the knobs)
     python -m benchmarks.auto_replay lookup    (prompt lookup's first guesses, per match)
     python -m benchmarks.auto_replay live      (the engine's own rounds, priced: ~1 h)

An end-to-end run measures `auto` through bandwidth that swings 1.6x within minutes, on one
prompt per task; a replay decides nothing by the clock, so planner changes can be compared on
every prompt of every set, exactly.

record: for each prompt of benchmarks/prompts.json (the tuning set),
benchmarks/prompts_unseen.json (the held-out set), benchmarks/prompts_fresh.json,
benchmarks/prompts_check.json and benchmarks/prompts_verify.json (each written after the sets
before it had been used to design planner changes, to check a change once on text it was not
chosen on; later changes were chosen on them too), in the chat template, it records the
target's plain greedy output (--max-new-tokens) and the draft model's greedy guess at every
output position given the true text before it, with its confidence in it (one teacher-forced
forward of the draft, as `LLM` loads it: a shortlisted draft also scores the ids past its
shortlist that the text before the position holds, as the engine's eager draft does), and the
target's confidence in its own token there (one forward of the target), which `auto` hears
from its plain steps. `--sets` records some sets only, keeping the traces of the others.

replay: greedy speculative decoding of each trace, round by round, with the real planners
(`specrt.spec.planners`: fixed K, and `auto` with the real prompt-lookup drafter). The trace
fixes every round's outcome: a draft model whose earlier guesses were all accepted saw the
true text, so its guess at a position is the recorded one, and a round commits the guesses up
to the first that differs from the output, plus the target's token. The draft model stops a
round's drafts after a guess whose recorded confidence is below --draft-stop, as the engine's
does, and a plain step that `auto` asks about reports the target's recorded confidence; past
a wrong guess the live draft reads its own guess, not the true text, so where it
stops there (how many guesses the round drafts and pays for, never what it accepts) is
approximate. Each round is priced by the calibrated costs `auto` itself plans with
(`CostModel`: this machine's calibration of the pair): the draft model's catch-up (all of a new
request's prompt in its first round) and a step for each further guess it drafts, the verify
pass of the drafted tokens + 1, or a plain step. Decode-only tokens/s, as
benchmarks.e2e reports. So a replay measures the planner's decisions, not whether the costs
are right (an e2e run measures both); and the teacher-forced forward runs the prefill path,
whose rounding may flip a near-tie the decode path would not.

live: what the replay approximates, measured on the engine itself: each prompt of the sets,
generated greedily by the real engine with each method (plain, the fixed settings, `auto`),
every forward it runs after the prompt's pass (each draft catch-up, draft step and verify
pass, the draft model's stop falling where it really does) priced by the same calibration.
Deterministic like a replay (nothing is timed), as slow as generating (~4 s a request here);
every method's output is checked against plain greedy decoding.

`--max-new-tokens N` replays each trace's first N tokens as a request of N tokens (the e2e
runs in RESULTS.md use --max-new-tokens 64); an N past the budget a trace was recorded with and
stopped at is refused (its answer would replay as ended there). Prints per prompt the best
fixed setting, `auto`, their ratio and `auto`'s plan mix, then per set the lowest and mean
ratio; writes the section "auto replayed" of benchmarks/RESULTS.md (--no-record to skip).
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from benchmarks import e2e_plan
from benchmarks.harness import cli, report
from benchmarks.harness.model_dirs import resolve_with_draft
from specrt.spec.config import DRAFT_STOP

SECTION = "## auto replayed on recorded traces (benchmarks/auto_replay.py)"
LIVE_SECTION = "## auto's live rounds, priced (benchmarks/auto_replay.py live)"
HERE = Path(__file__).parent
PROMPT_SETS = {"tuning": HERE / "prompts.json", "held-out": HERE / "prompts_unseen.json",
               "fresh": HERE / "prompts_fresh.json", "check": HERE / "prompts_check.json",
               "verify": HERE / "prompts_verify.json"}
TRACES = HERE / "results" / "auto_traces.json"
FIXED = ("draft_model:1,draft_model:2,draft_model:3,draft_model:4,draft_model:5,draft_model:6,"
         "ngram:2,ngram:4,ngram:8,ngram:16")


def build_parser():
    p = cli.parser("benchmarks.auto_replay", __doc__)
    sub = p.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="record the traces (loads the pair, ~20 min)")
    cli.add_common_args(rec, out=False)
    rec.add_argument("--max-new-tokens", type=cli.count, default=128)
    rec.add_argument("--traces", default=str(TRACES), help="where to write them")
    rec.add_argument("--sets", default=",".join(PROMPT_SETS),
                     help=f"prompt sets to record (default all: {','.join(PROMPT_SETS)}); the "
                          "traces of other sets already in --traces are kept")
    rep = sub.add_parser("replay", help="replay auto and the fixed settings on the traces")
    cli.add_common_args(rep, out=False, progress=False)          # replays: seconds
    cli.add_record_args(rep)
    rep.add_argument("--traces", default=str(TRACES))
    rep.add_argument("--auto-k", type=cli.count, default=16, help="auto's K_max (default 16)")
    rep.add_argument("--fixed", default=FIXED, help=f"fixed settings (default {FIXED})")
    rep.add_argument("--draft-stop", type=float, default=DRAFT_STOP,
                     help=f"the draft model's stop (as LLM's draft_stop; default {DRAFT_STOP}, "
                          "0: every round drafts K)")
    rep.add_argument("--max-new-tokens", type=cli.count, default=None,
                     help="replay each trace's first N tokens only, as a request with that "
                          "budget, at most the recorded one (64: the e2e runs in RESULTS.md; "
                          "default: all that was recorded)")
    live = sub.add_parser("live", help="the engine's own rounds on each prompt, every forward "
                          "priced by the calibration (~1 h)")
    cli.add_common_args(live, out=False)
    cli.add_record_args(live)
    live.add_argument("--auto-k", type=cli.count, default=16, help="auto's K_max (default 16)")
    live.add_argument("--fixed", default=FIXED, help=f"fixed settings (default {FIXED})")
    live.add_argument("--max-new-tokens", type=cli.count, default=64)
    live.add_argument("--sets", default=",".join(PROMPT_SETS),
                      help=f"prompt sets (default all: {','.join(PROMPT_SETS)})")
    look = sub.add_parser("lookup", help="how often prompt lookup's first guess is right, per "
                          "matched length, on the traces (no model loads)")
    look.add_argument("--traces", default=str(TRACES))
    return p


# --- replay ------------------------------------------------------------------------------------
class TraceDraft:
    """The draft model as the planner sees it (a CatchUpDrafter): only how far it lags."""

    name = "draft_model"
    cut_short = True                     # drafts no guess that could add no token, as `replay`

    def __init__(self, stop_below: float = DRAFT_STOP):
        self.fed = 0                     # tokens of the row's text whose K/V it holds
        self.stop_below = stop_below     # as the engine's (0: never stops on an unsure guess)

    def lags(self, ctx) -> list[int]:
        return [len(ctx.histories[0]) - self.fed]


def replay(trace: dict, method: str, costs, planner_cls=None, draft_stop: float = DRAFT_STOP
           ) -> tuple[float, dict, int]:
    """(decode-only tokens/s, {plan label: rounds}, drafts accepted) of greedy decoding
    `trace` with `method` ("plain", "draft_model:K", "ngram:K" or "auto:K"), one request,
    priced by `costs`; "auto" plans with `planner_cls` (default AdaptivePlanner); the draft
    model stops below `draft_stop` (traces recorded without confidences: never); a plain
    step that `auto` asks about reports the target's recorded confidence in its token (none
    in a trace recorded without them)."""
    from specrt.spec.config import SpecConfig
    from specrt.spec.drafters.base import LONG_CATCH_UP, DraftContext
    from specrt.spec.drafters.draft_model import goes_on
    from specrt.spec.drafters.ngram import NgramDrafter
    from specrt.spec.planners.adaptive import AdaptivePlanner

    prompt, out, guess = trace["prompt"], trace["output"], trace["draft"]
    sure = trace.get("confidence") or [1.0] * len(out)
    target_sure = trace.get("target_confidence")
    ends = frozenset(trace.get("eos_ids", ()))
    name, _, k_text = method.partition(":")
    k_fixed = int(k_text or 0)
    spec = SpecConfig()
    ngram = NgramDrafter(spec.prompt_lookup_min, spec.prompt_lookup_max)
    ngram.reset([0])
    draft = TraceDraft(draft_stop if "confidence" in trace else 0.0)
    planner = None
    if name == "auto":
        planner = (planner_cls or AdaptivePlanner)(k_fixed, costs, draft_model=draft,
                                                   ngram=ngram)
        planner.new_batch()
        planner.reset([0])
    budget = trace.get("max_new_tokens", len(out))

    def known(i: int) -> tuple[bool, bool]:
        """The draft's guess at answer position i: whether it was sure of it, and whether it
        ends the answer (past the recorded answer: sure, no end)."""
        return (sure[i] >= draft_stop, guess[i] in ends) if i < len(out) else (True, False)

    done, seconds, mix, total_accepted = 1, 0.0, {}, 0   # the first token is the prefill's
    while done < len(out):
        history = prompt + out[:done]
        ctx = DraftContext([history], [True], [None], [None], remaining=[budget - done],
                           generated=[done], ends=[ends])
        if planner is not None:
            plan = planner.choose(ctx)
            who, k = (plan.drafter.name if plan.drafter is not None else "plain"), plan.k
        else:
            who, k = name, k_fixed
        room = ctx.room(0, k)                    # no room for a guess: a plain step
        if who == "draft_model" and room:
            lag = len(history) - draft.fed
            if lag > LONG_CATCH_UP:              # a long catch-up runs alone first
                seconds += costs.draft_pass([lag - 1])
                lag = 1
            # it stops as the engine's does (past the recorded answer: taken as sure)
            drafted = 1
            while goes_on(*known(done + drafted - 1), drafted, room):
                drafted += 1
            seconds += costs.draft_pass([lag]) + (drafted - 1) * costs.draft_pass([1])
            seconds += costs.verify_pass([drafted + 1])
            guesses = guess[done:done + drafted]
        elif who == "ngram":
            guesses = ngram.matches(ctx, k)[0][0]
            seconds += costs.verify_pass([len(guesses) + 1])
            drafted = len(guesses)
        else:
            guesses, drafted = [], 0
            seconds += costs.verify_pass([1])
        accepted = 0
        while (accepted < len(guesses) and done + accepted < len(out)
               and guesses[accepted] == out[done + accepted]):
            accepted += 1
        if who == "draft_model" and drafted:     # it fed its guesses but the last; rolled back
            draft.fed = len(history) + min(accepted, drafted - 1)
        label = f"{who}:{k}" if drafted else "plain"     # no n-gram match: a plain step
        mix[label] = mix.get(label, 0) + 1
        if planner is not None:
            heard = ([target_sure[done]] if plan.wants_sure and not plan.k and target_sure
                     else None)
            # the kind of its last guess, as the engine's draft reports it (`last_sure`)
            last = ([known(done + drafted - 1)[0]] if who == "draft_model" and drafted
                    and draft.stop_below > 0 else None)
            planner.observe(plan, [accepted], [drafted], 0.0, 0.0, heard, last)
        done += accepted + 1
        total_accepted += accepted
    return (len(out) - 1) / seconds if seconds else 0.0, mix, total_accepted


# --- live --------------------------------------------------------------------------------------
class PricedForwards:
    """While entered, every forward of the engine's target and draft model is logged, and
    `seconds` prices the log by `costs`, the target's first forward (the prompt's pass) left
    out: decode-only, as benchmarks.e2e reports."""

    def __init__(self, engine, costs):
        self.models = [(engine.target, costs.verify_pass)]
        if engine.draft is not None:
            self.models.append((engine.draft, costs.draft_pass))
        self.log: list[tuple[object, list[int]]] = []     # (price, tokens per row)

    def __enter__(self):
        for model, price in self.models:
            def forward(input_ids, cache, num_valid=None, last_only=False, also_score=None,
                        argmax_only=False, _model=model, _price=price):
                B, T = input_ids.shape
                self.log.append((_price, list(num_valid) if num_valid is not None else [T] * B))
                return type(_model).forward(_model, input_ids, cache, num_valid, last_only,
                                            also_score, argmax_only)
            model.forward = forward                  # the instance's, over the class's
        return self

    def __exit__(self, *exc):
        for model, _ in self.models:
            del model.forward

    def seconds(self) -> float:
        target = self.models[0][1]
        first = next(i for i, (price, _) in enumerate(self.log) if price == target)
        return sum(price(tokens) for i, (price, tokens) in enumerate(self.log) if i != first)


def live_run(llm, ids: list[int], method: str, costs, max_new_tokens: int
             ) -> tuple[list[int], float, dict]:
    """(tokens, decode-only tokens/s as priced, plan histogram) of the engine generating `ids`
    greedily with `method` ("plain", "draft_model:K", "ngram:K" or "auto:K")."""
    name, _, k = method.partition(":")
    spec = None if name == "plain" else {"method": name, "num_speculative_tokens": int(k)}
    with PricedForwards(llm.engine, costs) as priced:
        res = llm.generate(ids, max_new_tokens=max_new_tokens, speculative=spec)
    tokens = list(res.token_ids)
    seconds = priced.seconds()
    return tokens, (len(tokens) - 1) / seconds if seconds else 0.0, res.stats["plan_histogram"]


def live_command(args) -> int:
    import specrt

    names = _set_names(args.sets)
    fixed = fixed_methods(args.fixed)
    if args.max_new_tokens < 2:
        cli.fail("--max-new-tokens must be at least 2 (the first token is the prompt's pass's)")
    target_dir, draft_dir = resolve_with_draft(args, "auto and the fixed settings draft with it")
    # eager rounds (no graphs): the static ones run forward_static, which is not priced here
    llm = specrt.LLM(target_dir, draft=draft_dir, dtype=args.dtype, device=args.device,
                     max_seq_len=4096, cuda_graphs=False)
    costs = llm.cost_model(args.auto_k)
    auto = f"auto:{args.auto_k}"
    rows, mismatches = [], []
    items = prompt_items({n: PROMPT_SETS[n] for n in names})
    for s, task, item in cli.progress(items, desc="prompts", disable=args.no_progress):
        key, ids = f"{s}:{task}:{item['id']}", encode_item(llm, item)
        plain, plain_tps, _ = live_run(llm, ids, "plain", costs, args.max_new_tokens)
        if len(plain) < 2:               # the answer ended at its first token: nothing to price
            print(f"{key}: the answer is {len(plain)} token(s) long; skipped", file=sys.stderr)
            continue
        speeds, plans = {}, {}
        for m in [*fixed, auto]:
            out, speeds[m], plans[m] = live_run(llm, ids, m, costs, args.max_new_tokens)
            if out != plain:
                mismatches.append(f"{key} {m}")
        auto_tps = speeds.pop(auto)
        rows.append(_row(key, s, speeds, plain_tps, auto_tps, plans[auto]))
    text = render(rows, auto)
    print(text)
    if mismatches:
        cli.fail(f"{len(mismatches)} outputs differ from plain greedy decoding: "
                 + ", ".join(mismatches))
    if args.record:
        _record(args, LIVE_SECTION, text, "", costs, fixed,
                "every output equal to plain greedy decoding")
    report.emit_json({"rows": rows})
    return 0


def lookup_acceptance(traces: dict) -> dict[str, dict[int, list[int]]]:
    """Per prompt set, per matched length n (1 .. COPYING, a copy in progress counted at
    COPYING): [positions with a match, ... whose first guess was right] of prompt lookup at
    every output position of the traces after the first, given the true text before it: the
    base rates the planner's n-gram priors stand for."""
    from specrt.spec.config import SpecConfig
    from specrt.spec.drafters.base import DraftContext
    from specrt.spec.drafters.ngram import COPYING, NgramDrafter

    spec = SpecConfig()
    out: dict[str, dict[int, list[int]]] = {}
    for trace in traces.values():
        ngram = NgramDrafter(spec.prompt_lookup_min, spec.prompt_lookup_max)
        ngram.reset([0])
        counts = out.setdefault(trace["set"], {})
        text = trace["prompt"] + trace["output"]
        for t in range(len(trace["prompt"]) + 1, len(text)):
            (guesses, n), = ngram.matches(DraftContext([text[:t]], [True], [None], [None]), 1)
            if guesses:
                seen = counts.setdefault(min(n, COPYING), [0, 0])
                seen[0] += 1
                seen[1] += guesses[0] == text[t]
    return out


def render_lookup(counts: dict[str, dict[int, list[int]]]) -> str:
    lengths = sorted({n for c in counts.values() for n in c})
    return report.markdown_table(
        ["set", *(f"n = {n}" for n in lengths)],
        [[s, *(f"{c[n][1] / c[n][0]:.2f} ({c[n][0]})" if n in c else "-" for n in lengths)]
         for s, c in counts.items()])


def ran_to_budget(trace: dict) -> bool:
    """Whether the recorded answer stopped at its budget (recorded max_new_tokens; a trace
    without one counts as stopped there) rather than ending on its own."""
    return len(trace["output"]) >= trace.get("max_new_tokens", len(trace["output"]))


def cut(trace: dict, n: int) -> dict:
    """The trace of a request whose budget was n tokens: its first n (all, if it ended
    sooner). ValueError for n past the recorded budget of a trace that ran to it: what it would
    have said next was not recorded."""
    if ran_to_budget(trace) and n > len(trace["output"]):
        raise ValueError(f"recorded to its budget of {len(trace['output'])} tokens, not {n}")
    short = dict(trace, output=trace["output"][:n], draft=trace["draft"][:n], max_new_tokens=n)
    for field in ("confidence", "target_confidence"):
        if trace.get(field) is not None:
            short[field] = trace[field][:n]
    return short


def cut_all(traces: dict, n: int, what: str) -> dict:
    """`cut` of every trace, or exit 2 naming the option (`what`) and the budget that fits."""
    stopped = [len(t["output"]) for t in traces.values() if ran_to_budget(t)]
    if stopped and n > min(stopped):
        cli.fail(f"{what}: {sum(s < n for s in stopped)} of {len(traces)} traces stopped at "
                 f"a recorded budget below {n} tokens (the lowest {min(stopped)}), and replayed "
                 f"at {n} their answers would end there as if finished: use at most "
                 f"{min(stopped)}, or record the traces again with --max-new-tokens {n}")
    return {k: cut(t, n) for k, t in traces.items()}


def replay_all(traces: dict, fixed: list[str], auto: str, costs,
               draft_stop: float = DRAFT_STOP) -> list[dict]:
    rows = []
    for key, trace in traces.items():
        speeds = {m: replay(trace, m, costs, draft_stop=draft_stop)[0] for m in fixed}
        auto_tps, mix, _ = replay(trace, auto, costs, draft_stop=draft_stop)
        rows.append(_row(key, trace["set"], speeds, replay(trace, "plain", costs)[0], auto_tps,
                         mix))
    return rows


def _row(key: str, set_name: str, speeds: dict[str, float], plain_tps: float, auto_tps: float,
         mix: dict) -> dict:
    """One prompt's row of `render`'s table (and the JSON): the best of the fixed settings'
    `speeds`, plain's and auto's tokens/s, auto's plan mix."""
    best = max(speeds, key=speeds.get)
    return {"trace": key, "set": set_name, "best": best, "best_tps": speeds[best],
            "plain_tps": plain_tps, "auto_tps": auto_tps, "ratio": auto_tps / speeds[best],
            "mix": mix, "fixed": speeds}


def render(rows: list[dict], auto: str) -> str:
    table = report.markdown_table(
        ["prompt", "best fixed", "tok/s", auto, "auto / best", "auto / plain", "auto's rounds"],
        [[r["trace"], r["best"], f"{r['best_tps']:.2f}", f"{r['auto_tps']:.2f}",
          f"{r['ratio']:.1%}", f"{r['auto_tps'] / r['plain_tps']:.2f}x",
          ", ".join(f"{m} x{n}" for m, n in sorted(r["mix"].items(), key=lambda x: -x[1])[:4])]
         for r in rows])
    lines = [table, ""]
    for s in dict.fromkeys(r["set"] for r in rows):
        ratios = [r["ratio"] for r in rows if r["set"] == s]
        low = [r["trace"] for r in rows if r["set"] == s and r["ratio"] < 0.95]
        lines.append(f"- {s}: auto / best fixed lowest {min(ratios):.1%}, mean "
                     f"{statistics.mean(ratios):.1%} over {len(ratios)} prompts; below 95%: "
                     + (", ".join(low) if low else "none"))
    return "\n".join(lines)


# --- record ------------------------------------------------------------------------------------
def prompt_items(sets: dict[str, Path] = PROMPT_SETS) -> list[tuple[str, str, dict]]:
    """(set, task, prompt item) of every prompt of every set."""
    return [(s, task, item) for s, path in sets.items()
            for task, group in e2e_plan.prompt_tasks(str(path)).items()
            for item in group]


def encode_item(llm, item: dict) -> list[int]:
    """A prompt item's token ids as `LLM` takes them: its messages, or its prompt, through the
    chat template."""
    if "messages" in item:
        return llm.encode(messages=item["messages"])
    return llm.encode(item["prompt"], chat=True)


def record_traces(llm, items, max_new_tokens: int, progress: bool = False) -> dict:
    """key -> trace ({"set", "prompt", "output", "draft", "confidence", "target_confidence",
    "max_new_tokens", "eos_ids"}) of each item: the target's greedy answer, the draft's guess
    and confidence at each of its positions, and the target's confidence in its token there
    (each from one pass over prompt and answer)."""
    import torch

    from specrt.spec.drafters.draft_model import hide_unread
    from specrt.spec.sampling import confidence

    target, draft = llm.engine.target, llm.engine.draft
    drafter = llm.engine.draft_drafter
    draft_vocab = drafter.common_vocab                     # the ids its guesses come from
    traces = {}
    for s, task, item in cli.progress(items, desc="traces", disable=not progress):
        ids = encode_item(llm, item)
        out = list(llm.generate(ids, max_new_tokens=max_new_tokens).token_ids)
        text = ids + out
        # A shortlisted draft also scores the ids past its shortlist its request has read
        # (`DraftModelDrafter.past_shortlist`): each from the position that reads it on.
        read = list(drafter.past_shortlist(text))
        with torch.inference_mode():
            logits = draft.forward(torch.tensor([text], device=draft.device),
                                   draft.new_cache(1, len(text)),
                                   also_score=[draft.also_scoring(read)]
                                   if read else None)[0]                       # [T, V]
            hide_unread(logits, text, read)
            said = target.forward(torch.tensor([text], device=target.device),
                                  target.new_cache(1, len(text)))[0]                # [T, V]
        # logits[i] scores text[i + 1]: output token t sits at len(ids) + t
        scores = logits[len(ids) - 1:len(text) - 1, :draft_vocab]                # [N, V_c]
        traces[f"{s}:{task}:{item['id']}"] = {
            "set": s, "prompt": ids, "output": out, "draft": scores.argmax(-1).tolist(),
            "confidence": confidence(scores).tolist(),
            "target_confidence": confidence(said[len(ids) - 1:len(text) - 1]).tolist(),
            "max_new_tokens": max_new_tokens,
            "eos_ids": sorted(llm.eos_ids)}
    return traces


def _set_names(text: str) -> list[str]:
    """--sets as a list of known prompt sets, or a clear error."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in PROMPT_SETS]
    if unknown or not names:
        cli.fail(f"--sets: unknown set(s) {', '.join(unknown) or '(none given)'}; choose from "
                 f"{', '.join(PROMPT_SETS)}")
    return names


def record(args) -> int:
    import specrt

    names = _set_names(args.sets)
    path = Path(args.traces)
    target_dir, draft_dir = resolve_with_draft(args, "the traces hold its guesses")
    kept = {}
    if path.is_file():
        old = json.loads(path.read_text())
        kept = {k: t for k, t in old["traces"].items() if t["set"] not in names}
        if kept and (old.get("target"), old.get("draft")) != (target_dir.name, draft_dir.name):
            cli.fail(f"{path} holds traces of another pair ({old.get('target')}, "
                     f"{old.get('draft')}); record every set (--sets "
                     f"{','.join(PROMPT_SETS)}) or write to another --traces file")
    llm = specrt.LLM(target_dir, draft=draft_dir, dtype=args.dtype, device=args.device,
                     max_seq_len=4096)
    traces = kept | record_traces(llm, prompt_items({n: PROMPT_SETS[n] for n in names}),
                                  args.max_new_tokens, not args.no_progress)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"target": target_dir.name, "draft": draft_dir.name,
                               "draft_dtype": llm.draft_dtype, "traces": traces}))
    tmp.replace(path)
    print(f"recorded {len(traces)} traces in {path}", file=sys.stderr)
    return 0


def replay_command(args) -> int:
    import specrt

    if not 0.0 <= args.draft_stop <= 1.0:
        cli.fail(f"--draft-stop must be a probability in [0, 1], got {args.draft_stop}")
    if args.max_new_tokens is not None and args.max_new_tokens < 2:
        cli.fail("--max-new-tokens must be at least 2 (the first token is the prefill's)")
    fixed = fixed_methods(args.fixed)
    path = Path(args.traces)
    data = _load_traces(path)
    if args.draft_stop and any("confidence" not in t for t in data["traces"].values()):
        cli.fail(f"{path} was recorded without the draft's confidences, which --draft-stop "
                 f"{args.draft_stop:g} needs: record the traces again (python -m "
                 "benchmarks.auto_replay record) or replay with --draft-stop 0")
    traces = data["traces"]
    if args.max_new_tokens is not None:
        traces = cut_all(traces, args.max_new_tokens, "--max-new-tokens")
    target_dir, draft_dir = resolve_with_draft(args, "auto and the fixed settings draft with it")
    llm = specrt.LLM(target_dir, draft=draft_dir, dtype=args.dtype, device=args.device)
    if llm.cuda_graphs and args.draft_stop:
        # the static draft loop always drafts K (specrt.spec.drafters.draft_model): so does
        # the replay, or it would price and teach rounds the engine never runs
        print(f"--draft-stop {args.draft_stop:g} ignored: with CUDA graphs every round "
              "drafts K", file=sys.stderr)
        args.draft_stop = 0.0
    traces = as_heard(traces, llm)
    costs = llm.cost_model(args.auto_k)        # timed where the rounds run
    auto = f"auto:{args.auto_k}"
    rows = replay_all(traces, fixed, auto, costs, args.draft_stop)
    text = render(rows, auto)
    print(text)
    if args.record:
        _record(args, SECTION, text, f" (traces: `{path.name}`, recorded with `python -m "
                "benchmarks.auto_replay record`)", costs, fixed,
                f"the draft model stops below {args.draft_stop:g}")
    report.emit_json({"rows": rows})
    return 0


def _record(args, section: str, text: str, source: str, costs, fixed: list[str], how: str):
    """Write `text` (a `render`ed table) as RESULTS.md's `section`, under the command, its
    source, the calibration's costs, the fixed settings and `how` they ran."""
    body = (f"Command: `{report.command_line()}`{source}. Costs: this machine's calibration of "
            f"the pair, target step {costs.verify[0] * 1e3:.1f} ms, draft step "
            f"{costs.draft[0] * 1e3:.1f} ms. Fixed settings: {', '.join(fixed)}; {how}.\n"
            + report.note_block(args.note) + "\n")
    report.record_section(section, body + text + "\n", Path(args.results_md))


def fixed_methods(text: str) -> list[str]:
    """The fixed settings of a comma-separated METHOD:K list (--fixed), as `replay` takes them,
    or exit 2 naming the entry that is not draft_model:K or ngram:K."""
    return [f"{m}:{k}" for m, k in cli.method_ks(text, "--fixed", ("draft_model", "ngram"))]


def as_heard(traces: dict, llm) -> dict:
    """`traces` as `auto` on `llm`'s engine hears them: with the target's confidence in each
    token, except on an engine with CUDA graphs, whose static rounds report none
    (`RoundOutcome.target_sure`); a warning where some traces were recorded without it (a
    partial re-record: those replay as if on such an engine)."""
    if llm.cuda_graphs:
        return {k: {f: v for f, v in t.items() if f != "target_confidence"}
                for k, t in traces.items()}
    deaf = [k for k, t in traces.items() if "target_confidence" not in t]
    if deaf:
        print(f"note: {len(deaf)} of {len(traces)} traces were recorded without the target's "
              "confidence, which auto hears before its draft model drafts; they replay deaf to "
              "it (record them again with python -m benchmarks.auto_replay record)",
              file=sys.stderr)
    return traces


def _load_traces(path) -> dict:
    path = Path(path)
    if not path.is_file():
        cli.fail(f"no traces at {path}: record them first (python -m benchmarks.auto_replay "
                 "record)")
    try:
        data = json.loads(path.read_text())
        if not isinstance(data["traces"], dict) or not data["traces"]:
            raise ValueError("no traces in it")
    except (OSError, ValueError, KeyError, TypeError) as e:
        cli.fail(f"{path} is not a traces file ({type(e).__name__}: {e}): record them again "
                 "(python -m benchmarks.auto_replay record)")
    return data


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "lookup":
        print(render_lookup(lookup_acceptance(_load_traces(args.traces)["traces"])))
        return 0
    cli.setup_torch(args.threads, args.device)
    commands = {"record": record, "replay": replay_command, "live": live_command}
    return commands[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
