"""Rendering the end-to-end benchmark from its records: the header, the text tables, the
RESULTS.md section body and the JSON object. Same headings and columns as always, so the
sections already in RESULTS.md read the same.

Rendering only: it takes an E2EResult (or a RunConfig for the header) and prints or returns
text; it measures and derives nothing.
"""
from __future__ import annotations

import collections
from pathlib import Path

from benchmarks.e2e_records import E2EResult, RunConfig, TaskSummary
from benchmarks.harness import report, results

# The seed study (3B target, 0.5B draft, Apple M5 Pro GPU, 200 tokens): (method, K, speedup)
SEED = {"code": ("draft_model", 8, 1.89), "rewrite": ("ngram", 8, 3.49),
        "explain": ("best", None, 1.15), "story": ("draft_model", 8, 0.72)}
METHOD_ALIGN = "ll" + "r" * 8
SUMMARY_ALIGN = "lrlrrrlrrrrr"
SEED_ALIGN = "llll"


def print_start(config: RunConfig, info: dict) -> None:
    others = [name for name, on in (("Hugging Face", config.has_hf),
                                    ("llama.cpp", config.has_llamacpp)) if on]
    report.print_header("end-to-end speculative decoding: specrt"
                        + (" vs " + " and ".join(others) if others else ""), info, {
        "target": config.target.name, "draft": config.draft.name if config.draft else None,
        "dtype": config.dtype, "max_new_tokens": config.max_new_tokens,
        "tasks": list(config.tasks), "prompts_per_task": config.prompts_per_task,
        "repeats": config.repeats, "methods": " ".join(m.label for m in config.methods)})
    for n in config.notes:
        print(f"note: {n}")


def method_rows(result: E2EResult) -> tuple[list[str], list[list]]:
    headers = ["task", "method", "tok/s", "speedup", "accept", "a", "mean acc len", "tok/pass",
               "draft share", "mismatch"]
    rows = []
    for t, ms in result.per_task.items():
        for s in ms.values():
            m = s.method
            if m.engine == "llamacpp":     # decode-only, in e2e_llamacpp's table
                continue
            mm = f"{s.mismatches}/{s.prompts}"
            if s.mismatches:
                mm += " @" + ",".join(str(d) for d in s.first_diffs if d is not None)
            if m.is_reference:
                mm = "(ref)"
            spd = f"{s.speedup:.2f}x" if m.engine == "specrt" else \
                f"{s.speedup:.2f}x ({s.speedup_vs_hf_plain:.2f}x hf)"
            stats = s.acceptance_rate is not None
            has = stats and not m.is_reference
            rows.append([t, m.label, f"{s.tok_s:.2f}", spd,
                         f"{s.acceptance_rate:.0%}" if has else "-",
                         f"{s.a:.2f}" if has else "-",
                         f"{s.mean_acceptance_length:.2f}" if has else "-",
                         f"{s.tokens_per_target_pass:.2f}" if stats else "-",
                         f"{s.draft_share:.0%}" if has else "-", mm])
    return headers, rows


def _summary_row(t: str, s: TaskSummary) -> list:
    def opt(x, spec):
        return "-" if x is None else format(x, spec)

    return [t, f"{s.plain_tok_s:.2f}", s.best, f"{s.best_tok_s:.2f}", f"{s.best_speedup:.2f}x",
            f"{s.hf_plain_tok_s:.2f}" if s.hf_plain_tok_s else "-", s.hf_best or "-",
            opt(s.hf_best_tok_s, ".2f"),
            "-" if s.ratio_vs_hf_best is None else f"{s.ratio_vs_hf_best:.2f}x",
            "-" if s.auto_vs_plain is None else f"{s.auto_vs_plain:.2f}x",
            opt(s.auto_vs_best_fixed, ".0%"), opt(s.auto_vs_chosen_fixed, ".0%")]


def summary_rows(result: E2EResult) -> tuple[list[str], list[list]]:
    headers = ["task", "plain tok/s", "specrt best", "tok/s", "speedup", "HF plain", "HF best",
               "tok/s", "specrt/HF", "auto vs plain", "auto vs best fixed",
               "auto vs fixed chosen on other repeats"]
    return headers, [_summary_row(t, s) for t, s in result.summaries.items()]


def seed_rows(result: E2EResult) -> tuple[list[str], list[list]]:
    headers = ["task", "seed study", "specrt, same config", "specrt best"]
    rows = []
    for t, (kind, k, x) in SEED.items():
        if t not in result.per_task:
            continue
        if kind == "best":
            seed, same = f"~{x:.2f}x (best, K 1-2)", "-"
        else:
            seed = f"{x:.2f}x ({kind} K={k})"
            s = result.per_task[t].get(f"{kind}:{k}")
            same = f"{s.speedup:.2f}x" if s else "not run"
        b = result.summaries[t]
        rows.append([t, seed, same, f"{b.best_speedup:.2f}x ({b.best})"])
    return headers, rows


def exactness_line(result: E2EResult) -> str:
    spec = result.speculative
    diffs = [r for r in spec if r.first_diff is not None]
    dtype = result.config.dtype
    line = (f"exactness: {len(diffs)} of {len(spec)} specrt speculative outputs differ "
            f"from specrt plain greedy ({dtype})")
    if diffs:
        line += "; first differing tokens: " + ", ".join(
            f"{r.task}/{r.prompt}/{r.method.label}@{r.first_diff}" for r in diffs)
        if dtype != "float32":
            line += (" -- in bf16 a (K+1)-token verify and a 1-token step round "
                     "differently and can flip near-ties; float32 must give 0")
    return line


def _prompts_per_task(result: E2EResult) -> str:
    """Prompts measured per task: "3", or "1-3" where the prompts file's tasks differ."""
    counts = collections.Counter(task for task, _ in {(r.task, r.prompt)
                                                      for r in result.measurements})
    lo, hi = min(counts.values(), default=0), max(counts.values(), default=0)
    return str(lo) if lo == hi else f"{lo}-{hi}"


def print_report(result: E2EResult) -> None:
    """The three tables, exactness, HF vs specrt plain, auto's plans, goals, elapsed."""
    c = result.config
    h, rows = method_rows(result)
    print(f"per task x method ({_prompts_per_task(result)} prompt(s) per task, "
          f"{c.max_new_tokens} new tokens, {c.dtype}); speedup vs specrt plain "
          "(HF rows also vs hf:plain); accept = accepted / drafted tokens (vLLM); a = "
          "per-position acceptance, accepted / (accepted + rejections); mismatch = prompts "
          "whose output differs from plain greedy of the same engine, @ first differing token")
    print(report.table(h, rows, METHOD_ALIGN))
    print()
    print("per task: specrt's best vs Hugging Face's best")
    print(report.table(*summary_rows(result), SUMMARY_ALIGN))
    print()
    print("vs the seed study (3B target / 0.5B draft on an Apple M5 Pro GPU, 200 tokens)")
    print(report.table(*seed_rows(result), SEED_ALIGN))
    print()
    print(exactness_line(result))
    hv = result.hf_vs_specrt
    if hv:
        same = sum(v is None for v in hv.values())
        print(f"HF plain vs specrt plain: {same} of {len(hv)} prompts identical"
              + ("" if same == len(hv) else " (first differences: " + ", ".join(
                  f"{k}@{v}" for k, v in hv.items() if v is not None) + ")"))
    for t, ms in result.per_task.items():
        for s in ms.values():
            if s.method.kind == "auto" and s.plans:
                print(f"auto plans on {t}: "
                      + ", ".join(f"{k} x{v}" for k, v in list(s.plans.items())[:5]))
    for n in c.notes:
        print(f"note: {n}")
    for g, ok in result.goals.items():
        print(f"goal: {g}: {report.pass_fail(ok)}")
    if not c.has_hf:
        print("goal: specrt best >= 1.5x HF best: n/a (--no-hf)")
    print(f"elapsed: {result.elapsed / 60:.1f} min in all (load average at the end "
          f"{result.machine['load_average_end'][0]:.2f})")
    print()


def markdown(result: E2EResult, pngs: tuple[Path, ...], note: str | None) -> str:
    """The body of the "End-to-end speedup" section of RESULTS.md."""
    c, info = result.config, result.machine
    return "\n".join([
        report.results_preamble(info, note),
        f"Models: target `{c.target.name}`, draft `{c.draft.name if c.draft else '-'}`"
        f", {c.dtype}, {c.device}; {c.max_new_tokens} new tokens, greedy, chat "
        f"template; {_prompts_per_task(result)} prompt(s) per task from "
        f"`{results.shown_path(c.prompts)}`, all methods back to back per prompt. Speed = new "
        f"tokens / wall time of the call (prefill included). {result.elapsed / 60:.1f} min in "
        f"all; load average at the end {info['load_average_end'][0]:.2f}."
        + "".join(f" Note: {n}." for n in c.notes),
        "",
        "Per task: specrt's best vs Hugging Face's best",
        "",
        report.markdown_table(*summary_rows(result), SUMMARY_ALIGN),
        "",
        "vs the seed study (3B / 0.5B, Apple M5 Pro GPU):",
        "",
        report.markdown_table(*seed_rows(result), SEED_ALIGN),
        "",
        "<details><summary>Every task x method</summary>",
        "",
        report.markdown_table(*method_rows(result), METHOD_ALIGN),
        "",
        "Speedup: vs specrt plain (HF rows also vs hf:plain). accept: accepted / drafted "
        "tokens (vLLM's acceptance rate). a: per-position acceptance, accepted / (accepted + "
        "rejections). mean acc len: tokens per drafted round. tok/pass: new tokens per "
        "target forward (prefill included). draft share: drafting time / total time. "
        "mismatch: prompts whose output differs from plain greedy of the same engine, "
        "@ the first differing token.",
        "",
        "</details>",
        "",
        f"- {exactness_line(result)}.",
    ] + [f"- Goal {g}: **{report.pass_fail(ok)}**" for g, ok in result.goals.items()]
      + ["", "Speedup vs K per task and method; measured tokens per round vs "
         "(1 - a^(K+1)) / (1 - a); auto's drafter and K per round:", ""]
      + [results.image(p, p.stem) for p in pngs])


def json_payload(result: E2EResult, pngs: tuple[Path, ...]) -> dict:
    """The object of the JSON last line (and out/e2e.json)."""
    return {
        "benchmark": "e2e", "machine": result.machine, "config": result.config.json(),
        "notes": list(result.config.notes), "elapsed_s": round(result.elapsed, 1),
        "summary": {t: s.json() for t, s in result.summaries.items()},
        "goals": result.goals,
        "mismatches": sum(r.first_diff is not None for r in result.speculative),
        "hf_plain_vs_specrt_plain_first_diff": result.hf_vs_specrt,
        "per_task_method": {t: {k: s.json() for k, s in ms.items()}
                            for t, ms in result.per_task.items()},
        "records": [r.json() for r in result.measurements],
        "plots": [str(p) for p in pngs],
    }
