"""Benchmark: does the engine's rejection sampler reproduce the target distribution?

Run: python -m benchmarks.rejection_sim        (a few seconds; --help for the knobs)

The seed study's simulation, run through specrt's own acceptance code
(`specrt.kernels.rejection_sample` with randomness from `specrt.kernels.draw_randomness`):
a target p that prefers "the" and a badly calibrated draft q that prefers "a",

    words  the   a     cat   dog   sat
    p      0.40  0.15  0.20  0.15  0.10
    q      0.17  0.43  0.20  0.10  0.10      sum_x min(p(x), q(x)) = 0.72

Each of N rows (default 1,000,000) is one round with K draft tokens sampled from q with a
seeded generator; the first emitted token of every row (accepted draft or recovered token)
is counted, so N rows = N tokens. Reported: each word's output frequency vs p (goal: max abs
deviation <= 0.001), the acceptance rate vs the theory 0.72 (per drafted position, given the
earlier ones were accepted), the tokens per round vs (1 - a^(K+1)) / (1 - a), and a
chi-square test of all emitted tokens (accepted, recovered and bonus) against p. With
p and q the same at every position, every emitted token is an exact draw from p.
"""
from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

from benchmarks.harness import cli, machine, report, results

WORDS = ["the", "a", "cat", "dog", "sat"]
P = [0.40, 0.15, 0.20, 0.15, 0.10]
Q = [0.17, 0.43, 0.20, 0.10, 0.10]
SECTION = "## Rejection sampling simulation (benchmarks/rejection_sim.py)"
GOAL_MAX_DEV = 0.001
OVERLAP = sum(min(p, q) for p, q in zip(P, Q))     # theory: acceptance per position


def build_parser() -> argparse.ArgumentParser:
    p = cli.parser("benchmarks.rejection_sim", __doc__,
                   epilog="Example: python -m benchmarks.rejection_sim "
                          "--tokens 1000000 --k 1 --record")
    p.add_argument("--tokens", type=cli.count, default=1_000_000,
                   help="rows = first tokens counted (default 1,000,000)")
    p.add_argument("--k", type=cli.count, default=1, help="draft tokens per row (default 1)")
    p.add_argument("--chunk", type=cli.count, default=250_000, help="rows per batched call "
                   "(default 250,000)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--threads", type=cli.count, default=2)
    p.add_argument("--device", default="cpu", type=cli.device_arg,
                   help="cpu (default), cuda or cuda:N")
    p.add_argument("--out", default=str(results.DEFAULT_OUT))
    cli.add_record_args(p)
    p.add_argument("--no-progress", action="store_true")
    return p


def simulate(n: int, k: int, chunk: int, seed: int, device: str, show: bool):
    torch = __import__("torch")
    from specrt.kernels import draw_randomness, rejection_sample
    from specrt.spec.sampling import sample

    p = torch.tensor(P, dtype=torch.float32, device=device)
    q = torch.tensor(Q, dtype=torch.float32, device=device)
    V = len(P)
    gen = torch.Generator(device=device).manual_seed(seed)
    first = torch.zeros(V, dtype=torch.int64, device=device)       # first emitted token
    emitted = torch.zeros(V, dtype=torch.int64, device=device)     # every emitted token
    reached = torch.zeros(k, dtype=torch.int64)                    # rounds that tested pos i
    accepted = torch.zeros(k, dtype=torch.int64)                   # ... and accepted it
    tokens_out = 0
    done = 0
    bar = cli.progress(total=n, desc="rows", disable=not show, unit="row", unit_scale=True)
    while done < n:
        b = min(chunk, n - done)
        drafts = sample(q.expand(b, k, V), gen)                   # [b, K] drafts from q
        target_probs = p.expand(b, k + 1, V)                       # [b, K + 1, V]
        draft_probs = q.expand(b, k, V)                            # [b, K, V]
        uniforms, noise = draw_randomness(b, k, V, gen, device)
        num_acc, out = rejection_sample(target_probs, draft_probs, drafts, uniforms, noise)
        num_acc = num_acc.long().cpu()
        first += torch.bincount(out[:, 0], minlength=V)
        valid = out[out >= 0]
        emitted += torch.bincount(valid, minlength=V)
        tokens_out += int(valid.numel())
        for i in range(k):
            reached[i] += int((num_acc >= i).sum())
            accepted[i] += int((num_acc >= i + 1).sum())
        done += b
        bar.update(b)
    bar.close()
    return first.cpu(), emitted.cpu(), reached, accepted, tokens_out


@dataclass(frozen=True)
class Outcome:
    """What the simulation showed; frequencies are per word of WORDS."""
    rounds: int
    seconds: float
    freq: list[float]            # first emitted token of each round
    dev: list[float]             # freq - p
    max_dev: float
    freq_all: list[float]        # every emitted token (accepted + recovered + bonus)
    max_dev_all: float
    chi_pvalue: float            # chi-square of every emitted token vs p
    tokens_out: int
    a: float                     # per drafted position
    a_first: float
    per_pos: list[float]         # acceptance by position, given the earlier ones accepted
    tokens_per_round: float
    theory_tpr: float            # (1 - a^(K+1)) / (1 - a) with a = OVERLAP

    @property
    def ok_dev(self) -> bool:
        return self.max_dev <= GOAL_MAX_DEV


def analyse(n: int, k: int, seconds: float, first, emitted, reached, accepted,
            tokens_out: int) -> Outcome:
    """The counts of simulate() -> frequencies, deviations, acceptance, chi-square."""
    import numpy as np
    from scipy import stats

    freq = (first.double() / n).tolist()
    dev = [f - p for f, p in zip(freq, P)]
    freq_all = (emitted.double() / emitted.sum()).tolist()
    observed = emitted.double().numpy()
    expected = np.array(P, dtype=np.float64) / sum(P) * observed.sum()
    return Outcome(
        rounds=n, seconds=seconds, freq=freq, dev=dev, max_dev=max(abs(d) for d in dev),
        freq_all=freq_all, max_dev_all=max(abs(f - p) for f, p in zip(freq_all, P)),
        chi_pvalue=float(stats.chisquare(observed, expected).pvalue), tokens_out=tokens_out,
        a=float(accepted.sum()) / float(reached.sum()),
        a_first=float(accepted[0]) / float(reached[0]),
        per_pos=[float(accepted[i]) / float(reached[i]) if reached[i] else float("nan")
                 for i in range(k)],
        tokens_per_round=tokens_out / n,
        theory_tpr=sum(OVERLAP ** j for j in range(k + 1)))


def _freq_rows(o: Outcome) -> list[list]:
    return [[w, f"{p:.4f}", f"{q:.4f}", f"{f:.4f}", f"{d:+.4f}"]
            for w, p, q, f, d in zip(WORDS, P, Q, o.freq, o.dev)]


def print_report(args, o: Outcome) -> None:
    print(f"first emitted token of {o.rounds:,} rounds (K = {args.k}) vs the target p")
    print(report.table(["word", "p (target)", "q (draft)", "output freq", "freq - p"],
                       _freq_rows(o)))
    print()
    print(f"max |freq - p| = {o.max_dev:.4f} (goal <= {GOAL_MAX_DEV}; seed study 0.0006)")
    print(f"acceptance rate = {o.a:.4f} per drafted position (first position "
          f"{o.a_first:.4f}); theory sum min(p, q) = {OVERLAP:.2f}; seed study 0.720")
    if args.k > 1:
        print("acceptance by position (given the earlier ones were accepted): "
              + ", ".join(f"{x:.4f}" for x in o.per_pos))
    print(f"tokens per round = {o.tokens_per_round:.4f}; theory (1 - a^(K+1)) / (1 - a) with "
          f"a = {OVERLAP:.2f}: {o.theory_tpr:.4f}")
    print(f"all {o.tokens_out:,} emitted tokens (accepted + recovered + bonus): max |freq - p| "
          f"= {o.max_dev_all:.4f}, chi-square vs p: p-value {o.chi_pvalue:.3f}")
    print(f"{o.rounds:,} rounds in {o.seconds:.2f} s ({o.rounds / o.seconds / 1e6:.2f} M "
          f"rounds/s, {args.threads} threads)")
    print(f"goal: max abs deviation <= {GOAL_MAX_DEV}: {report.pass_fail(o.ok_dev)}")
    print()


def markdown(args, info: dict, o: Outcome) -> str:
    """The body of this benchmark's RESULTS.md section."""
    return "\n".join([
        report.results_preamble(info, args.note),
        "",
        f"Target p = {P}, draft q = {Q} over {WORDS} (sum min(p, q) = {OVERLAP:.2f}); "
        f"{o.rounds:,} rounds with K = {args.k} drafts sampled from q (seed {args.seed}), "
        "through `specrt.kernels.rejection_sample` (the CPU reference path) with "
        "`draw_randomness`; the first emitted token of each round is counted.",
        "",
        report.markdown_table(["word", "p", "q", "output frequency", "freq - p"],
                              _freq_rows(o)),
        "",
        f"- Max abs deviation from p: **{o.max_dev:.4f}** (goal <= {GOAL_MAX_DEV}: "
        f"{report.pass_fail(o.ok_dev)}; seed study 0.0006).",
        f"- Acceptance rate: **{o.a:.4f}** vs theory sum min(p, q) = {OVERLAP:.2f} "
        "(seed study 72.0%).",
        f"- Tokens per round {o.tokens_per_round:.4f} vs (1 - a^(K+1)) / (1 - a) = "
        f"{o.theory_tpr:.4f}; all {o.tokens_out:,} emitted tokens: max abs deviation "
        f"{o.max_dev_all:.4f}, chi-square p-value {o.chi_pvalue:.3f}.",
        f"- {o.seconds:.2f} s for {o.rounds:,} rounds on {args.threads} threads.",
    ])


def result_json(args, info: dict, o: Outcome) -> dict:
    return {
        "benchmark": "rejection_sim",
        "machine": info,
        "config": {"tokens": o.rounds, "k": args.k, "chunk": args.chunk, "seed": args.seed,
                   "words": WORDS, "p": P, "q": Q},
        "frequency": dict(zip(WORDS, [round(f, 6) for f in o.freq])),
        "max_abs_deviation": round(o.max_dev, 6),
        "frequency_all_emitted": dict(zip(WORDS, [round(f, 6) for f in o.freq_all])),
        "max_abs_deviation_all_emitted": round(o.max_dev_all, 6),
        "chisquare_pvalue_all_emitted": round(o.chi_pvalue, 4),
        "emitted_tokens": o.tokens_out,
        "acceptance_rate": round(o.a, 6),
        "acceptance_rate_by_position": [round(x, 6) for x in o.per_pos],
        "acceptance_theory": round(OVERLAP, 6),
        "tokens_per_round": round(o.tokens_per_round, 6),
        "tokens_per_round_theory": round(o.theory_tpr, 6),
        "seconds": round(o.seconds, 3),
        "seed_study": {"max_abs_deviation": 0.0006, "acceptance_rate": 0.72},
        "goals": {"max_abs_deviation_le_0.001": o.ok_dev},
    }


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.tokens < 1 or args.k < 1 or args.chunk < 1:
        cli.fail("--tokens, --k and --chunk must be >= 1")
    cli.setup_torch(args.threads, args.device)
    out = cli.out_dir(args)
    info = machine.machine_info(args.threads, args.device)
    report.print_header("rejection sampling simulation (specrt.kernels.rejection_sample)", info,
                        {"tokens": f"{args.tokens:,}", "K": args.k, "chunk": args.chunk,
                         "seed": args.seed})
    t0 = time.perf_counter()
    counts = simulate(args.tokens, args.k, args.chunk, args.seed, args.device,
                      not args.no_progress)
    o = analyse(args.tokens, args.k, time.perf_counter() - t0, *counts)
    print_report(args, o)
    if args.record:
        report.record_section(SECTION, markdown(args, info, o), args.results_md)
    report.emit_json(result_json(args, info, o), out / "rejection_sim.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
