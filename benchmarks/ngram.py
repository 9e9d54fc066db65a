"""Benchmark: what does one prompt-lookup `propose` cost, and what does the index weigh?

Run: python -m benchmarks.ngram        (about 15 s on 2 cores; --help for the knobs)

For histories of 1k, 32k and 1M tokens it reports the median latency of one propose call
made from Python, per provider:
    cpp index      specrt._ngram.NgramIndex.propose   (incremental, O(max_n + k))
    python index   PyNgramIndex.propose               (the pure-Python fallback, same design)
    numpy scan     a vectorized sliding-window search over the whole history, stateless
    cpp scan       specrt._ngram.propose              (stateless backward scan in C++)
    python scan    py_propose                         (stateless backward scan in Python)
then the cost of a whole decode step (extend one token + propose) for both indexes, the C++
speedups at 32k, the RSS growth of a C++ index holding 1M tokens, and the worst single
extend while growing it (a hash-table doubling). All providers must agree on every
proposal timed.

The token stream imitates text with repetition: random ids from a 32k vocabulary, with spans
copied from earlier in the stream mixed in so that lookups find matches. Human-readable
tables first, JSON on the last line.
"""
from __future__ import annotations

import argparse
import gc
import statistics
import time

import numpy as np
import psutil

from benchmarks.harness import cli, report
from specrt.drafters.ngram_index import PyNgramIndex, py_propose

try:
    from specrt import _ngram
except ImportError:             # not built: main() says how to build it
    _ngram = None

LENGTHS = (1_000, 32_000, 1_000_000)


def token_stream(length: int, vocab: int, seed: int = 0) -> np.ndarray:
    """[length] int64 ids: fresh random runs alternating with copies of earlier spans."""
    rng = np.random.default_rng(seed)
    out = np.empty(length, dtype=np.int64)
    pos = 0
    while pos < length:
        run = int(rng.integers(4, 64))
        if pos > 2 * run and rng.random() < 0.5:
            start = int(rng.integers(0, pos - run))
            chunk = out[start:start + run].copy()
        else:
            chunk = rng.integers(0, vocab, size=run)
        chunk = chunk[:length - pos]
        out[pos:pos + len(chunk)] = chunk
        pos += len(chunk)
    return out


def numpy_scan(history: np.ndarray, k: int, min_n: int, max_n: int) -> list[int]:
    """Stateless vectorized search: compare every window with the suffix, take the last hit."""
    length = len(history)
    for n in range(max_n, min_n - 1, -1):
        if length <= n:
            continue
        starts = length - n  # candidate starts 0 .. starts-1 exclude the suffix itself
        hit = history[:starts] == history[starts]
        for t in range(1, n):
            hit &= history[t:t + starts] == history[starts + t]
        found = np.flatnonzero(hit)
        if found.size:
            i = int(found[-1])
            return history[i + n:i + n + k].tolist()
    return []


def time_call(fn, budget_s: float, max_reps: int) -> tuple[float, object]:
    """Seconds per call of fn() (mean over a loop sized to ~budget_s) and its result."""
    t0 = time.perf_counter()
    result = fn()
    first = time.perf_counter() - t0
    reps = int(min(max_reps, max(1, budget_s / max(first, 1e-9))))
    if reps == 1:
        return first, result
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps, result


def time_steps(index, tokens: list[int], k: int, batches: int = 10) -> float:
    """Seconds per decode step -- commit one token, then propose -- as the median over
    `batches` consecutive batches of the batch mean (robust to other load on the machine;
    the rare table growth lands in one batch and is reported by worst_extend instead)."""
    extend, propose = index.extend, index.propose
    size = len(tokens) // batches
    means = []
    for b in range(batches):
        batch = tokens[b * size:(b + 1) * size]
        t0 = time.perf_counter()
        for token in batch:
            extend([token])
            propose(k)
        means.append((time.perf_counter() - t0) / size)
    return statistics.median(means)


def worst_extend(stream: np.ndarray, min_n: int, max_n: int) -> tuple[float, float]:
    """(median, max) seconds of one extend([token]) while feeding the stream token by token.

    The max is a hash-table doubling: amortized O(1), but one call rehashes every n-gram.
    """
    index = _ngram.NgramIndex(min_n, max_n)
    extend, clock = index.extend, time.perf_counter
    samples = []
    for token in stream.tolist():
        t0 = clock()
        extend([token])
        samples.append(clock() - t0)
    return statistics.median(samples), max(samples)


def disagree(a: str, b: str, length: int, state: int, got_a, got_b) -> None:
    """Exit 1 saying which providers proposed differently, and where (a bug, not bad input)."""
    cli.fail(f"{a} and {b} disagree at {length:,} tokens, timed state {state}: {got_a} vs "
             f"{got_b}; every provider must propose the same tokens", code=1)


def bench_length(stream, length, args):
    """Seconds per call for each provider at one history length (medians over states)."""
    history = stream[:length]
    k, min_n, max_n, states = args.k, args.min_n, args.max_n, args.states
    steps = min(2_000, length // 2)
    base = length - states - steps
    cpp, py = _ngram.NgramIndex(min_n, max_n), PyNgramIndex(min_n, max_n)
    build = {}
    t0 = time.perf_counter()
    cpp.extend(history[:base])
    build["cpp index"] = time.perf_counter() - t0
    base_list = history[:base].tolist()
    t0 = time.perf_counter()
    py.extend(base_list)
    build["python index"] = time.perf_counter() - t0

    # A decode loop's real per-step cost: the index update for the committed token plus
    # the lookup. Afterwards both indexes are `states` tokens short of `length`.
    step_tokens = history[base:base + steps].tolist()
    step = {"cpp index": time_steps(cpp, step_tokens, k),
            "python index": time_steps(py, step_tokens, k)}
    base += steps

    # The stateless providers get fewer states at 1M: python scan is O(length) in Python.
    scan_states = states if length <= 32_000 else max(3, states // 8)
    times = {name: [] for name in ("cpp index", "python index", "numpy scan", "cpp scan",
                                   "python scan")}
    matched = 0
    for s in range(states):
        token = history[base + s:base + s + 1]
        cpp.extend(token)
        py.extend(token.tolist())
        t_cpp, draft = time_call(lambda: cpp.propose(k), args.budget, 20_000)
        t_py, draft_py = time_call(lambda: py.propose(k), args.budget, 20_000)
        times["cpp index"].append(t_cpp)
        times["python index"].append(t_py)
        if draft_py != draft:
            disagree("python index", "cpp index", length, s, draft_py, draft)
        matched += bool(draft)
        if s >= scan_states:
            continue
        upto = history[:base + s + 1]
        upto_list = upto.tolist()
        for name, fn in (("numpy scan", lambda: numpy_scan(upto, k, min_n, max_n)),
                         ("cpp scan", lambda: _ngram.propose(upto, k, min_n, max_n)),
                         ("python scan", lambda: py_propose(upto_list, k, min_n, max_n))):
            t, other = time_call(fn, args.budget, 2_000)
            times[name].append(t)
            if other != draft:
                disagree(name, "cpp index", length, s, other, draft)
    print(f"  {length:>9,} tokens: {matched}/{states} timed states had a match; building the "
          f"first {base - steps:,} took {build['cpp index']:.3f} s (cpp), "
          f"{build['python index']:.3f} s (python)")
    medians = {name: statistics.median(ts) for name, ts in times.items()}
    rates = {name: (base - steps) / t for name, t in build.items() if t > 0}
    return medians, step, rates


def cpp_index_rss(stream, min_n, max_n) -> tuple[float, float]:
    """(RSS growth in MB, build seconds) of a C++ index fed the whole stream."""
    proc = psutil.Process()
    gc.collect()
    before = proc.memory_info().rss
    t0 = time.perf_counter()
    index = _ngram.NgramIndex(min_n, max_n)
    index.extend(stream)
    seconds = time.perf_counter() - t0
    grown = proc.memory_info().rss - before
    del index
    return grown / 2**20, seconds


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ngram",
                                     description=__doc__.splitlines()[0])
    # Defaults are SpecConfig's: K=4, prompt_lookup_min=1, prompt_lookup_max=3.
    parser.add_argument("--k", type=cli.count, default=4)
    parser.add_argument("--min-n", type=cli.count, default=1)
    parser.add_argument("--max-n", type=cli.count, default=3)
    parser.add_argument("--vocab", type=cli.count, default=32_000)
    parser.add_argument("--states", type=cli.count, default=32,
                        help="consecutive histories timed per length (median over them)")
    parser.add_argument("--budget", type=float, default=0.01,
                        help="seconds of repeated calls per timed state and provider")
    args = parser.parse_args()
    if _ngram is None:
        cli.fail("specrt._ngram (the C++ n-gram index) is not built: run `make build`")

    stream = token_stream(max(LENGTHS), args.vocab)
    # Memory first, while the heap holds little else that a fresh index could reuse.
    rss_mb, build_1m = cpp_index_rss(stream, args.min_n, args.max_n)
    rss_mb_n8, _ = cpp_index_rss(stream, 1, 8)
    extend_median, extend_max = worst_extend(stream, args.min_n, args.max_n)

    print(f"n-gram propose latency, k={args.k}, n in [{args.min_n}, {args.max_n}], "
        f"vocab {args.vocab:,}")
    results, steps, rates = {}, {}, {}
    for length in LENGTHS:
        results[length], steps[length], rates[length] = bench_length(stream, length, args)

    providers = list(results[LENGTHS[0]])
    print("")
    print(f"{'median us per propose':<24}" + "".join(f"{n:>12,}" for n in LENGTHS))
    for name in providers:
        print(f"{name:<24}" + "".join(f"{results[n][name] * 1e6:>12.2f}" for n in LENGTHS))
    print(f"{'us per decode step':<24}" + "".join(f"{n:>12,}" for n in LENGTHS)
          + "   (extend([token]) + propose(k); median of 10 batch means)")
    for name in steps[LENGTHS[0]]:
        print(f"{name:<24}" + "".join(f"{steps[n][name] * 1e6:>12.2f}" for n in LENGTHS))

    at32 = results[32_000]
    speedup_index = at32["python index"] / at32["cpp index"]
    speedup_scan = at32["python scan"] / at32["cpp index"]
    speedup_step = steps[32_000]["python index"] / steps[32_000]["cpp index"]
    cpp_us = [results[n]["cpp index"] * 1e6 for n in LENGTHS]
    print("")
    print(f"at 32k tokens, cpp index is {speedup_index:.1f}x faster than the python index "
        f"and {speedup_scan:,.0f}x faster than the python scan; per decode step "
        f"(extend + propose) cpp is {speedup_step:.1f}x faster than python")
    print(f"cpp index: {min(cpp_us):.2f}-{max(cpp_us):.2f} us per propose across 1k..1M "
        f"(max/min {max(cpp_us) / min(cpp_us):.2f})")
    print(f"cpp index memory for 1M tokens: {rss_mb:.1f} MB RSS growth at n in "
        f"[{args.min_n}, {args.max_n}] (built in {build_1m:.2f} s), {rss_mb_n8:.1f} MB at "
        f"n in [1, 8]")
    print(f"cpp extend([token]) while growing to 1M tokens: median "
          f"{extend_median * 1e6:.2f} us, worst {extend_max * 1e3:.1f} ms (a hash-table doubling)")

    goals = {
        "cpp_propose_under_5us_at_all_lengths": max(cpp_us) < 5.0,
        "cpp_100x_python_index_at_32k": speedup_index >= 100,
        "cpp_index_1m_under_100mb": rss_mb < 100,
    }
    print("goals: " + ", ".join(f"{name}={'met' if ok else 'NOT met'}"
                                for name, ok in goals.items()))
    report.emit_json({
        "benchmark": "ngram",
        "config": {"k": args.k, "min_n": args.min_n, "max_n": args.max_n, "vocab": args.vocab,
                   "states": args.states},
        "propose_us": {name: {str(n): round(results[n][name] * 1e6, 3) for n in LENGTHS}
                       for name in providers},
        "step_us": {name: {str(n): round(steps[n][name] * 1e6, 3) for n in LENGTHS}
                    for name in steps[LENGTHS[0]]},
        "build_tokens_per_s": {str(n): {name: round(r) for name, r in rates[n].items()}
                               for n in LENGTHS},
        "speedup_cpp_index_over_python_index_32k": round(speedup_index, 2),
        "speedup_cpp_index_over_python_scan_32k": round(speedup_scan, 1),
        "speedup_cpp_over_python_step_32k": round(speedup_step, 2),
        "cpp_index_rss_mb_1m": round(rss_mb, 1),
        "cpp_index_rss_mb_1m_n1_8": round(rss_mb_n8, 1),
        "cpp_extend_one_token_us_median_to_1m": round(extend_median * 1e6, 3),
        "cpp_extend_one_token_ms_worst_to_1m": round(extend_max * 1e3, 2),
        "goals": goals,
    })


if __name__ == "__main__":
    main()
