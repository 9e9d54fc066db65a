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

from benchmarks.harness import cli, machine, report, results

WORDS = ["the", "a", "cat", "dog", "sat"]
P = [0.40, 0.15, 0.20, 0.15, 0.10]
Q = [0.17, 0.43, 0.20, 0.10, 0.10]
SECTION = "## Rejection sampling simulation (benchmarks/rejection_sim.py)"
GOAL_MAX_DEV = 0.001


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.rejection_sim",
                                description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Example: python -m benchmarks.rejection_sim "
                                       "--tokens 1000000 --k 1 --record")
    p.add_argument("--tokens", type=int, default=1_000_000, help="rows = first tokens counted "
                   "(default 1,000,000)")
    p.add_argument("--k", type=int, default=1, help="draft tokens per row (default 1)")
    p.add_argument("--chunk", type=int, default=250_000, help="rows per batched call "
                   "(default 250,000)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", default=str(results.DEFAULT_OUT))
    cli.add_record_args(p)
    p.add_argument("--no-progress", action="store_true")
    return p


def simulate(n: int, k: int, chunk: int, seed: int, device: str, show: bool):
    torch = __import__("torch")
    from specrt.kernels import draw_randomness, rejection_sample
    from specrt.sampling import sample

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


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.tokens < 1 or args.k < 1 or args.chunk < 1:
        cli.fail("--tokens, --k and --chunk must be >= 1")
    torch = cli.setup_torch(args.threads, args.device)
    import numpy as np
    from scipy import stats

    out = cli.out_dir(args)
    info = machine.machine_info(args.threads, args.device)
    overlap = sum(min(a, b) for a, b in zip(P, Q))
    report.print_header("rejection sampling simulation (specrt.kernels.rejection_sample)", info,
                        {"tokens": f"{args.tokens:,}", "K": args.k, "chunk": args.chunk,
                         "seed": args.seed})

    t0 = time.perf_counter()
    first, emitted, reached, accepted, tokens_out = simulate(
        args.tokens, args.k, args.chunk, args.seed, args.device, not args.no_progress)
    seconds = time.perf_counter() - t0

    n = args.tokens
    freq = (first.double() / n).tolist()
    dev = [f - p for f, p in zip(freq, P)]
    max_dev = max(abs(d) for d in dev)
    freq_all = (emitted.double() / emitted.sum()).tolist()
    max_dev_all = max(abs(f - p) for f, p in zip(freq_all, P))
    observed = emitted.double().numpy()
    expected = np.array(P, dtype=np.float64) / sum(P) * observed.sum()
    chi = stats.chisquare(observed, expected)
    a = float(accepted.sum()) / float(reached.sum())            # per-position acceptance
    a_first = float(accepted[0]) / float(reached[0])
    per_pos = [float(accepted[i]) / float(reached[i]) if reached[i] else float("nan")
               for i in range(args.k)]
    tokens_per_round = tokens_out / n
    theory_tpr = sum(overlap ** j for j in range(args.k + 1))   # (1 - a^(K+1)) / (1 - a)
    ok_dev = max_dev <= GOAL_MAX_DEV

    rows = [[w, p, q, f, d] for w, p, q, f, d in zip(WORDS, P, Q, freq, dev)]
    print(f"first emitted token of {n:,} rounds (K = {args.k}) vs the target p")
    print(report.table(["word", "p (target)", "q (draft)", "output freq", "freq - p"],
                       [[r[0], f"{r[1]:.4f}", f"{r[2]:.4f}", f"{r[3]:.4f}", f"{r[4]:+.4f}"]
                        for r in rows]))
    print()
    print(f"max |freq - p| = {max_dev:.4f} (goal <= {GOAL_MAX_DEV}; seed study 0.0006)")
    print(f"acceptance rate = {a:.4f} per drafted position (first position {a_first:.4f}); "
          f"theory sum min(p, q) = {overlap:.2f}; seed study 0.720")
    if args.k > 1:
        print("acceptance by position (given the earlier ones were accepted): "
              + ", ".join(f"{x:.4f}" for x in per_pos))
    print(f"tokens per round = {tokens_per_round:.4f}; theory (1 - a^(K+1)) / (1 - a) with "
          f"a = {overlap:.2f}: {theory_tpr:.4f}")
    print(f"all {tokens_out:,} emitted tokens (accepted + recovered + bonus): max |freq - p| = "
          f"{max_dev_all:.4f}, chi-square vs p: p-value {chi.pvalue:.3f}")
    print(f"{n:,} rounds in {seconds:.2f} s ({n / seconds / 1e6:.2f} M rounds/s, "
          f"{args.threads} threads)")
    print(f"goal: max abs deviation <= {GOAL_MAX_DEV}: {report.pass_fail(ok_dev)}")
    print()

    result = {
        "benchmark": "rejection_sim",
        "machine": info,
        "config": {"tokens": n, "k": args.k, "chunk": args.chunk, "seed": args.seed,
                   "words": WORDS, "p": P, "q": Q},
        "frequency": dict(zip(WORDS, [round(f, 6) for f in freq])),
        "max_abs_deviation": round(max_dev, 6),
        "frequency_all_emitted": dict(zip(WORDS, [round(f, 6) for f in freq_all])),
        "max_abs_deviation_all_emitted": round(max_dev_all, 6),
        "chisquare_pvalue_all_emitted": round(float(chi.pvalue), 4),
        "emitted_tokens": tokens_out,
        "acceptance_rate": round(a, 6),
        "acceptance_rate_by_position": [round(x, 6) for x in per_pos],
        "acceptance_theory": round(overlap, 6),
        "tokens_per_round": round(tokens_per_round, 6),
        "tokens_per_round_theory": round(theory_tpr, 6),
        "seconds": round(seconds, 3),
        "seed_study": {"max_abs_deviation": 0.0006, "acceptance_rate": 0.72},
        "goals": {"max_abs_deviation_le_0.001": ok_dev},
    }
    if args.record:
        body = "\n".join([
            report.results_preamble(info, args.note),
            "",
            f"Target p = {P}, draft q = {Q} over {WORDS} (sum min(p, q) = {overlap:.2f}); "
            f"{n:,} rounds with K = {args.k} drafts sampled from q (seed {args.seed}), "
            "through `specrt.kernels.rejection_sample` (the CPU reference path) with "
            "`draw_randomness`; the first emitted token of each round is counted.",
            "",
            report.markdown_table(["word", "p", "q", "output frequency", "freq - p"],
                                  [[r[0], f"{r[1]:.4f}", f"{r[2]:.4f}", f"{r[3]:.4f}",
                                    f"{r[4]:+.4f}"] for r in rows]),
            "",
            f"- Max abs deviation from p: **{max_dev:.4f}** (goal <= {GOAL_MAX_DEV}: "
            f"{report.pass_fail(ok_dev)}; seed study 0.0006).",
            f"- Acceptance rate: **{a:.4f}** vs theory sum min(p, q) = {overlap:.2f} "
            "(seed study 72.0%).",
            f"- Tokens per round {tokens_per_round:.4f} vs (1 - a^(K+1)) / (1 - a) = "
            f"{theory_tpr:.4f}; all {tokens_out:,} emitted tokens: max abs deviation "
            f"{max_dev_all:.4f}, chi-square p-value {chi.pvalue:.3f}.",
            f"- {seconds:.2f} s for {n:,} rounds on {args.threads} threads.",
        ])
        report.record_section(SECTION, body, args.results_md)
    report.emit_json(result, out / "rejection_sim.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
