"""Benchmark: the per-token work over the vocabulary on the CPU, before and after its fast paths.

Run: python -m benchmarks.vocab_ops [--rounds N] [--vocab V] [--shortlist N]   (--help)

Every greedy choice reads a row of logits as wide as the vocabulary (151,936 ids for the
default pair): the target's argmax at each position of a verify pass (K + 1 rows) or plain
step, the draft's argmax at each guess, and the draft's confidence in each guess (its stop,
`draft_stop`). Random fp32 logits of that width, timed in interleaved rounds (the order
reversed every other round), median microseconds per call:
- argmax of 1, 6 and 17 rows: torch.argmax against `specrt.kernels.cpu.ops.argmax` (the C++
  kernel `specrt.kernels.argmax` runs on the CPU; checked to give the same indices first);
- the draft's confidence over a shortlisted row (ids past --shortlist at -inf, as a draft
  scoring its shortlist of frequent ids leaves them): the sum of exp(x - max) it was computed
  as before, against the softmax's largest entry it is now (`sampling.confidence`; the two
  checked to agree within 1e-4: each sums ~50,000 fp32 terms in its own order, ~5e-6 apart);
- the top-p cut (0.9) of a sampled position: the stable sort of the whole row
  (`sampling.top_p_cut_sorted`, the specification) against the ranked cut `warp` takes on the
  CPU (`sampling.top_p_cut`; checked to cut the same tokens), on a peaked row (a handful of
  tokens kept, as a language model's rows mostly are) and on a flat one (tens of thousands
  kept: the ranked cut falls back to the full sort, its worst case);
- the Exp(1) noise of one sampled position (every sampled choice, draft guess and
  acceptance draws a vocabulary of it): torch's `exponential_` as it was drawn against
  `fill_exponential_` (a float64 uniform and a logarithm; a statistical test checks it);
- a lone request's [1, K + 1, V] logits taken by advanced indexing (a copy) against the view
  the round now takes (`specrt.engine.round._rows`).
Writes the section "Work over the vocabulary" of benchmarks/RESULTS.md (--no-record to
skip); JSON on the last line.
"""
from __future__ import annotations

import statistics
from pathlib import Path

import torch

from benchmarks.harness import cli, machine, report, timing
from specrt.spec.drafters.draft_model import SHORTLIST

SECTION = "## Work over the vocabulary (benchmarks/vocab_ops.py)"
ROWS = (1, 6, 17)          # a plain step or a draft guess, a K = 5 and a K = 16 verify pass
TOP_P = 0.9
TINY = torch.finfo(torch.float32).tiny


def build_parser():
    p = cli.parser("benchmarks.vocab_ops", __doc__)
    p.add_argument("--rounds", type=cli.count, default=200,
                   help="interleaved rounds (median; default 200)")
    p.add_argument("--vocab", type=cli.count, default=151936,
                   help="ids per row (default 151,936: the default pair's vocabulary)")
    p.add_argument("--shortlist", type=cli.count, default=SHORTLIST + 22,
                   help=f"ids the draft scores in the confidence row (default {SHORTLIST + 22:,}: "
                   "the default shortlist with the default pair's 22 special ids)")
    p.add_argument("--threads", type=cli.count, default=2, help="torch threads (default 2)")
    cli.add_record_args(p)
    return p


def old_confidence(logits: torch.Tensor) -> torch.Tensor:
    """The draft's confidence as it was computed before: 1 / sum exp(x - max)."""
    x = logits.float()
    return torch.exp(x - x.amax(dim=-1, keepdim=True)).sum(dim=-1).reciprocal()


def cases(vocab: int, shortlist: int) -> dict[str, dict[str, object]]:
    """{what: {"before": fn, "now": fn}}, each pair checked to agree first."""
    from specrt.engine.round import _rows
    from specrt.kernels.cpu import ops
    from specrt.spec.sampling import confidence

    g = torch.Generator().manual_seed(0)
    out = {}
    for r in ROWS:
        x = torch.randn(r, vocab, generator=g) * 4                                  # [R, V]
        if not torch.equal(ops.argmax(x), x.argmax(dim=-1)):
            cli.fail(f"the argmax kernel disagrees with torch.argmax on {r} rows")
        out[f"argmax, {r} row{'s' * (r > 1)}"] = {
            "before": lambda x=x: x.argmax(dim=-1), "now": lambda x=x: ops.argmax(x)}
    row = torch.full((1, vocab), float("-inf"))                                     # [1, V]
    row[0, :min(shortlist, vocab)] = torch.randn(min(shortlist, vocab), generator=g) * 4
    if not torch.allclose(old_confidence(row), confidence(row), rtol=1e-4):
        cli.fail("the two confidence formulas disagree")
    out["draft confidence, shortlisted row"] = {
        "before": lambda: old_confidence(row), "now": lambda: confidence(row)}
    from specrt.spec.sampling import top_p_cut, top_p_cut_sorted

    for what, scale in (("peaked", 8.0), ("flat", 1.0)):
        probs = torch.softmax(torch.randn(1, vocab, generator=g) * scale, dim=-1)   # [1, V]
        if not torch.equal(top_p_cut(probs, TOP_P), top_p_cut_sorted(probs, TOP_P)):
            cli.fail(f"the ranked top-p cut differs from the full sort's on the {what} row")
        kept = int((~top_p_cut_sorted(probs, TOP_P)).sum())
        out[f"top-p {TOP_P} cut, {what} row ({kept:,} kept)"] = {
            "before": lambda p=probs: top_p_cut_sorted(p, TOP_P),
            "now": lambda p=probs: top_p_cut(p, TOP_P)}
    from specrt.kernels.reference import fill_exponential_

    noise, gen = torch.empty(vocab), torch.Generator().manual_seed(1)
    out["Exp(1) noise of one sampled position"] = {
        "before": lambda: noise.exponential_(generator=gen).clamp_(min=TINY),
        "now": lambda: fill_exponential_(noise, gen)}
    logits = torch.randn(1, ROWS[-1], vocab, generator=g)                       # [1, K + 1, V]
    out[f"a lone request's [1, {ROWS[-1]}, V] logits"] = {
        "before": lambda: logits[[0]], "now": lambda: _rows(logits, [0])}
    return out


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from specrt.kernels.cpu import ops

    if not ops.AVAILABLE:
        cli.fail("specrt._cpu_ops is not built or this CPU has neither AVX-512 nor AVX2: "
                 "run `make build` (the argmax kernel is what this compares)")
    cli.setup_torch(args.threads, "cpu")
    info = machine.machine_info(args.threads, "cpu")
    report.print_header("Work over the vocabulary", info)
    rows = []
    for what, fns in cases(args.vocab, args.shortlist).items():
        times = timing.interleaved(fns, args.rounds, warmup=3)
        us = {k: statistics.median(v) * 1e6 for k, v in times.items()}
        rows.append((what, f"{us['before']:.1f}", f"{us['now']:.1f}",
                     f"{us['before'] / us['now']:.1f}x"))
    text = report.markdown_table(("per call", "before us", "now us", "speedup"), rows, "lrrr")
    print(text)
    if args.record:
        report.record_section(SECTION, report.results_preamble(info, args.note)
                              + f"\nMedian microseconds per call, {args.rounds} interleaved "
                              f"rounds, rows of {args.vocab:,} fp32 logits:\n\n" + text + "\n",
                              Path(args.results_md))
    report.emit_json({"rows": [dict(zip(("what", "before_us", "now_us", "speedup"), r))
                               for r in rows]})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
