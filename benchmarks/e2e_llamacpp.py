"""specrt vs llama.cpp from an end-to-end run's records (benchmarks/e2e.py --llamacpp):
decode-only tokens/s per task x method of both systems, and per task specrt best / llama.cpp
best and specrt plain / llama.cpp plain; its text table, RESULTS.md section and JSON.

Decode-only = the tokens the phase after the prompt's pass made / its time: llama.cpp's own
timing lines (benchmarks/llamacpp/parse.py), specrt's result time less its prefill. specrt's and
llama-completion's prompt pass makes the first token, so their decode phase counts the tokens
after it; llama-speculative-simple's prompt pass stops one token short, so its decode phase also
makes (and counts) the first token. Nor are the phases cut alike where a draft model runs:
llama-speculative-simple feeds the prompt to its draft model before its decode clock starts
(`common_speculative_process`, in its "encoded" time), while specrt's draft catches up on the
prompt in its first round, after the first token, inside the decode phase. So every task also
gets the whole request (prompt pass + decode, model loading excluded in both): every token the
request generated (`generated_tokens`: the first and EOS included; llama-speculative-simple's
last round may run one past the budget, and that token's time is in its wall too) / wall time,
the comparison both systems' timings cut alike.
A task's speed is its total tokens / total seconds over the task's prompts (medians over the
repeats). Derives and renders only: it measures nothing.

Run: python -m benchmarks.e2e_llamacpp OUT/e2e.json   (a saved run's tables, rendered again)
"""
from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from types import SimpleNamespace

from benchmarks.e2e_records import E2EResult, Measurement, Method
from benchmarks.e2e_summary import NAN, ratio
from benchmarks.harness import cli, compare, report, results
from benchmarks.llamacpp.commands import NGRAM_N, decode_counts_first_token

SECTION = "## specrt vs llama.cpp (benchmarks/e2e.py --llamacpp)"


@dataclass(frozen=True)
class Row:
    """One task x method, decode-only."""
    task: str
    method: str                  # label
    engine: str                  # specrt | llamacpp
    tokens: int
    seconds: float
    tok_s: float
    whole_tok_s: float           # the whole request: generated_tokens / wall time
    vs_own_plain: float          # this tok/s / its own system's plain tok/s
    accept: float | None         # accepted / drafted tokens; None for plain
    mismatches: int              # prompts whose tokens differ from its own system's plain


@dataclass(frozen=True)
class TaskLine:
    task: str
    specrt_plain: float
    llamacpp_plain: float
    plain_ratio: float           # specrt plain / llama.cpp plain
    specrt_best: str
    specrt_best_tok_s: float
    llamacpp_best: str
    llamacpp_best_tok_s: float
    best_ratio: float            # specrt best / llama.cpp best
    specrt_best_whole: str       # ... by the whole request's tokens/s
    specrt_best_whole_tok_s: float
    llamacpp_best_whole: str
    llamacpp_best_whole_tok_s: float
    best_whole_ratio: float


@dataclass(frozen=True)
class SideBySide:
    rows: tuple[Row, ...]
    tasks: tuple[TaskLine, ...]
    threads: int
    prompts: int
    prompt_tokens: int                       # over the prompts, the same in both systems
    plain_vs_plain: dict[str, int | None]    # "task/prompt" -> first different token

    def json(self) -> dict:
        return {"threads": self.threads, "prompts": self.prompts,
                "prompt_tokens": self.prompt_tokens, "rows": [asdict(r) for r in self.rows],
                "tasks": [asdict(t) for t in self.tasks],
                "llamacpp_plain_vs_specrt_plain_first_diff": self.plain_vs_plain}


def _accept(rs: list[Measurement]) -> float | None:
    if rs[0].method.is_reference:
        return None
    if rs[0].method.engine == "specrt":
        st = [r.stats for r in rs if r.stats]
        drafted = sum(x["num_draft_tokens"] for x in st)
        return ratio(sum(x["num_accepted_tokens"] for x in st), drafted)
    da = [r.drafted_accepted for r in rs if r.drafted_accepted]
    return ratio(sum(a for _, a in da), sum(d for d, _ in da))


def generated_tokens(r: Measurement) -> int:
    """Every token the request generated: its decode phase's count, plus the first token where
    the prompt's pass made it (specrt, llama-completion; llama-speculative-simple counts it)."""
    m = r.method
    first_counted = m.engine == "llamacpp" and decode_counts_first_token(m.kind)
    return r.decode_tokens + (0 if first_counted else 1)


def _rows(task: str, records: list[Measurement], order: tuple[Method, ...]) -> list[Row]:
    """The task's rows in run order (the two systems' methods alternating)."""
    by: dict[Method, list[Measurement]] = {m: [] for m in order}
    for r in records:
        if r.task == task and r.decode_seconds is not None:
            by[r.method].append(r)
    by = {m: rs for m, rs in by.items() if rs}
    speed = {m: ratio(sum(r.decode_tokens for r in rs), sum(r.decode_seconds for r in rs))
             for m, rs in by.items()}
    whole = {m: ratio(sum(generated_tokens(r) for r in rs), sum(r.wall for r in rs))
             for m, rs in by.items()}
    return [Row(task=task, method=m.label, engine=m.engine,
                tokens=sum(r.decode_tokens for r in rs),
                seconds=sum(r.decode_seconds for r in rs), tok_s=speed[m], whole_tok_s=whole[m],
                vs_own_plain=ratio(speed[m], speed.get(Method(m.engine, "plain"), NAN)),
                accept=_accept(rs), mismatches=sum(r.first_diff is not None for r in rs))
            for m, rs in by.items()]


def _task_line(task: str, rows: list[Row]) -> TaskLine:
    def best(engine, key=lambda r: r.tok_s):
        return max((r for r in rows if r.engine == engine), key=key)

    def plain(engine):
        return next(r.tok_s for r in rows if r.engine == engine and r.method.endswith("plain"))

    sb, lb = best("specrt"), best("llamacpp")
    wb, wl = (best(e, lambda r: r.whole_tok_s) for e in ("specrt", "llamacpp"))
    sp, lp = plain("specrt"), plain("llamacpp")
    return TaskLine(task=task, specrt_plain=sp, llamacpp_plain=lp, plain_ratio=ratio(sp, lp),
                    specrt_best=sb.method, specrt_best_tok_s=sb.tok_s, llamacpp_best=lb.method,
                    llamacpp_best_tok_s=lb.tok_s, best_ratio=ratio(sb.tok_s, lb.tok_s),
                    specrt_best_whole=wb.method, specrt_best_whole_tok_s=wb.whole_tok_s,
                    llamacpp_best_whole=wl.method, llamacpp_best_whole_tok_s=wl.whole_tok_s,
                    best_whole_ratio=ratio(wb.whole_tok_s, wl.whole_tok_s))


def side_by_side(result: E2EResult) -> SideBySide:
    recs = [r for r in result.measurements if r.method.engine in ("specrt", "llamacpp")]
    rows = [row for t in result.config.tasks for row in _rows(t, recs, result.config.methods)]
    plains = {(r.task, r.prompt, r.method.engine): r for r in recs if r.method.is_reference}
    prompts = sorted({(t, p) for t, p, _ in plains})
    return SideBySide(
        rows=tuple(rows), threads=result.config.threads, prompts=len(prompts),
        tasks=tuple(_task_line(t, [r for r in rows if r.task == t])
                    for t in result.config.tasks),
        prompt_tokens=sum(plains[(t, p, "specrt")].prompt_tokens for t, p in prompts),
        plain_vs_plain={f"{t}/{p}": compare.first_difference(
            plains[(t, p, "llamacpp")].ids, _printed(plains[(t, p, "specrt")]))
            for t, p in prompts})


def _printed(specrt_run: Measurement) -> tuple[int, ...]:
    """specrt's ids as llama.cpp shows its own: llama.cpp never prints the end-of-generation
    token it stops at, so an EOS that ended specrt's answer is left out."""
    ids = specrt_run.ids
    return ids[:-1] if specrt_run.finish_reason == "eos" else ids


# --- rendering -------------------------------------------------------------------------------
ROW_HEADERS = ["task", "system", "method", "decode tok/s", "vs own plain", "whole request tok/s",
               "accept", "mismatch"]
TASK_HEADERS = ["task", "specrt plain", "llama.cpp plain", "specrt/llama.cpp plain",
                "specrt best", "tok/s", "llama.cpp best", "tok/s", "specrt/llama.cpp best",
                "whole request: specrt best", "llama.cpp best", "specrt/llama.cpp"]
TASK_ALIGN = "lrrrlrlrrllr"
ROW_ALIGN = "lll" + "r" * 5


def row_cells(side: SideBySide) -> list[list]:
    return [[r.task, "specrt" if r.engine == "specrt" else "llama.cpp",
             r.method.removeprefix("llamacpp:"), f"{r.tok_s:.2f}", f"{r.vs_own_plain:.2f}x",
             f"{r.whole_tok_s:.2f}",
             "-" if r.accept is None else ("none drafted" if r.accept != r.accept
                                           else f"{r.accept:.0%}"),
             "(ref)" if r.method.endswith("plain") else str(r.mismatches)] for r in side.rows]


def task_cells(side: SideBySide) -> list[list]:
    return [[t.task, f"{t.specrt_plain:.2f}", f"{t.llamacpp_plain:.2f}", f"{t.plain_ratio:.2f}x",
             t.specrt_best, f"{t.specrt_best_tok_s:.2f}", t.llamacpp_best.removeprefix(
                 "llamacpp:"), f"{t.llamacpp_best_tok_s:.2f}", f"{t.best_ratio:.2f}x",
             f"{t.specrt_best_whole} {t.specrt_best_whole_tok_s:.2f}",
             f"{t.llamacpp_best_whole.removeprefix('llamacpp:')} {t.llamacpp_best_whole_tok_s:.2f}",
             f"{t.best_whole_ratio:.2f}x"]
            for t in side.tasks]


def facts(side: SideBySide) -> list[str]:
    same = sum(v is None for v in side.plain_vs_plain.values())
    diffs = ", ".join(f"{k}@{v}" for k, v in side.plain_vs_plain.items() if v is not None)
    return [f"threads: {side.threads} in both systems (specrt torch threads; llama.cpp -t/-tb, "
            f"and -td/-tbd for its draft)",
            f"prompt tokens: identical ids in both systems on all {side.prompts} prompts "
            f"({side.prompt_tokens} tokens; checked before the sweep, a difference stops the "
            "run)",
            f"llama.cpp plain vs specrt plain: same tokens on {same} of {len(side.plain_vs_plain)}"
            " prompts" + (f" (first differences: {diffs}; two bf16 implementations round "
                          "differently and can flip near-ties)" if diffs else "")]


def print_report(side: SideBySide) -> None:
    print("specrt vs llama.cpp, decode-only tokens/s (after the prompt's pass); vs own plain "
          "= speedup over the same system's plain; mismatch = prompts whose tokens differ "
          "from the same system's plain (llama.cpp: its text re-encoded)")
    print(report.table(ROW_HEADERS, row_cells(side), ROW_ALIGN))
    print()
    print("per task: specrt vs llama.cpp, decode-only tokens/s (llama.cpp's speculative decode "
          "phase also makes the first token; its draft reads the prompt before its decode "
          "clock starts, specrt's after the first token); then the whole request (prompt pass "
          "+ decode, every token generated / wall time)")
    print(report.table(TASK_HEADERS, task_cells(side), TASK_ALIGN))
    print()
    for line in facts(side):
        print(line)
    print()


def markdown(result: E2EResult, side: SideBySide, note: str | None) -> str:
    """The body of the "specrt vs llama.cpp" section of RESULTS.md."""
    c, info = result.config, result.machine
    return "\n".join([
        report.results_preamble(info, note),
        f"Models: target `{c.target.name}`, draft `{c.draft.name if c.draft else '-'}`; specrt "
        f"{c.dtype}, llama.cpp bf16 GGUF from its own converter; {c.max_new_tokens} new "
        f"tokens, greedy, chat template; {side.prompts} prompt(s) from "
        f"`{results.shown_path(c.prompts)}`, {c.repeats} repeat(s) "
        "(median), specrt's and llama.cpp's methods alternating within each prompt's sweep. "
        "Decode-only tokens/s, and the whole request's (prompt pass + decode, loading excluded; "
        "every token generated / wall time): llama-speculative-simple feeds its draft model the "
        "prompt before its decode clock starts, specrt's draft catches up in its first round, "
        "inside the decode phase; and llama-speculative-simple's decode phase also makes (and "
        "counts) the first token, specrt's and llama-completion's start after it. "
        f"{result.elapsed / 60:.1f} min in all.",
        "",
        "llama.cpp: the vendored tree of the `llama-cpp-python==0.3.36` sdist, built by `make "
        "bench-llamacpp` (Release, `GGML_NATIVE=ON`, CPU); plain = `llama-completion`, "
        "draft:K = `llama-speculative-simple --spec-type draft-simple --spec-draft-n-max K "
        "--spec-draft-p-min 0`, ngram-simple:K / ngram-map-k:K = `--spec-type ngram-simple` / "
        f"`ngram-map-k` with a lookup n-gram of {NGRAM_N} and a draft m-gram of K; greedy "
        "(`--temp 0 --top-k 1`).",
        "",
        report.markdown_table(TASK_HEADERS, task_cells(side), TASK_ALIGN),
        "",
        "<details><summary>Every task x method</summary>",
        "",
        report.markdown_table(ROW_HEADERS, row_cells(side), ROW_ALIGN),
        "",
        "</details>",
        "",
    ] + [f"- {line}." for line in facts(side)] + [f"- Note: {n}." for n in c.notes])


# --- a saved run, rendered again ---------------------------------------------------------------
def from_saved(payload: dict) -> SideBySide:
    """The side-by-side of a run saved by benchmarks.e2e (its e2e.json): the records hold every
    timing; the token ids do not travel, so the plain-vs-plain comparison is the saved one."""
    if not payload.get("llamacpp") or "records" not in payload:
        raise ValueError("not an `e2e.py --llamacpp` run's JSON (no llamacpp section or records)")
    recs = [Measurement(
        task=r["task"], prompt=r["prompt"], method=Method(r["engine"], r["kind"], r["k"]),
        prompt_tokens=r["prompt_tokens"], ids=(), wall=r["wall"], walls=tuple(r["walls"]),
        first_diff=r["first_diff"], a=NAN if r["a"] is None else r["a"],
        drafted_rounds=r["drafted_rounds"], rejections=r["rejections"], stats=r.get("stats"),
        decode_tokens=r.get("decode_tokens"), decode_seconds=r.get("decode_seconds"),
        drafted_accepted=(r["drafted"], r["accepted"]) if "drafted" in r else None)
        for r in payload["records"]]
    by_label = {m.method.label: m.method for m in recs}
    config = SimpleNamespace(tasks=tuple(payload["config"]["tasks"]),
                             methods=tuple(by_label[m] for m in payload["config"]["methods"]
                                           if m in by_label),
                             threads=payload["llamacpp"]["threads"])
    side = side_by_side(SimpleNamespace(config=config, measurements=recs))
    return replace(side, plain_vs_plain=payload["llamacpp"][
        "llamacpp_plain_vs_specrt_plain_first_diff"])


def main(argv=None) -> int:
    p = cli.parser("benchmarks.e2e_llamacpp", "Render the specrt vs llama.cpp tables of a saved "
                   "`python -m benchmarks.e2e --llamacpp` run again (its e2e.json), e.g. after "
                   "this module learnt a new column.")
    p.add_argument("run", help="the run's e2e.json (in its --out folder)")
    args = p.parse_args(argv)
    try:
        side = from_saved(json.loads(Path(args.run).read_text()))
    except (OSError, ValueError, KeyError) as e:
        cli.fail(f"{args.run}: {e}")
    print_report(side)
    report.emit_json(side.json())
    return 0


if __name__ == "__main__":
    sys.exit(main())
