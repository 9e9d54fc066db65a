"""Speculative sampling reproduces the (warped) target distribution exactly: statistical tests
with fixed seeds, batched over tensors."""
import dataclasses
import itertools

import numpy as np
import pytest
import torch
from scipy import stats

import specrt
from specrt.engine import engine as engine_module
from specrt.engine.engine import Engine
from specrt.engine.request import Request
from specrt.spec.config import DRAFT_STOP, SpecConfig
from specrt.spec.costs import CostModel
from specrt.spec.sampling import SamplingParams
from specrt.kernels import rejection_sample
from specrt.kernels.reference import draw_randomness
from specrt.model import Transformer
from specrt.spec.sampling import (NUCLEUS_FIRST, NUCLEUS_GROWTH, make_generator, param_row,
                                  sample, top_p_cut, top_p_cut_sorted, warp, warp_rows)
from tests.tiny import make_model

# The seed study's five-word example: the target prefers "the", the draft prefers "a".
WORDS = ["the", "a", "cat", "dog", "sat"]
P = torch.tensor([0.40, 0.15, 0.20, 0.15, 0.10])
Q = torch.tensor([0.17, 0.43, 0.20, 0.10, 0.10])


def test_fixture_data_is_the_seed_study_pair():
    """A guard of this file's own data, not of specrt: P and Q are the pair whose numbers
    benchmarks/RESULTS.md and test_kernels.py quote (two distributions, sum min(p, q) = 0.72)."""
    assert P.sum().item() == pytest.approx(1.0) and Q.sum().item() == pytest.approx(1.0)
    assert torch.minimum(P, Q).sum().item() == pytest.approx(0.72)


def test_warp_top_k_and_top_p():
    logits = torch.log(P)[None]
    k2 = warp(logits, SamplingParams(temperature=1.0, top_k=2))
    torch.testing.assert_close(k2[0], torch.tensor([0.4, 0, 0.2, 0, 0]) / 0.6)
    p7 = warp(logits, SamplingParams(temperature=1.0, top_p=0.7))   # smallest set with >= 0.7
    torch.testing.assert_close(p7[0], torch.tensor([0.4, 0.15, 0.2, 0, 0]) / 0.75)
    hot = warp(logits, SamplingParams(temperature=0.5))
    torch.testing.assert_close(hot[0], P ** 2 / (P ** 2).sum())


def test_a_tiny_temperature_or_top_p_is_greedy_not_nan(small_pair):
    """logits / 1e-39 overflowed to inf and top_p 1e-46 rounded to 0 in float32: NaN
    probabilities, and every sampled token was id 0. A temperature below 1e-5 is greedy (as in
    vLLM); a top_p that small keeps the most likely token only: both give the greedy answer."""
    assert SamplingParams(temperature=1e-39).greedy and SamplingParams(temperature=1e-6).greedy
    assert not SamplingParams(temperature=1e-5).greedy
    logits = torch.log(P)[None] * 50
    probs = warp(logits, SamplingParams(temperature=1.0, top_p=1e-46))
    assert torch.equal(probs[0], torch.tensor([1.0, 0, 0, 0, 0]))
    target, draft = small_pair
    llm = specrt.LLM(target, draft=draft, dtype="float32", max_seq_len=64)
    try:
        greedy = llm.generate(PROMPT, max_new_tokens=8).token_ids
        assert len(set(greedy)) > 1 or greedy[0] != 0
        spec = {"method": "draft_model", "num_speculative_tokens": 3}
        for kw in (dict(temperature=1e-39), dict(temperature=1.0, top_p=1e-46)):
            for speculative in (None, spec):
                got = llm.generate(PROMPT, max_new_tokens=8, seed=1, speculative=speculative,
                                   **kw).token_ids
                assert got == greedy, (kw, speculative)
    finally:
        llm.close()


def test_warp_rows_equals_warp_bit_for_bit():
    """The graphs' warp (settings read from the device, one batch of rows with different
    settings) gives every row the bits `warp` gives it alone: temperatures, top-k below, at
    and past the vocabulary, top-p, both, greedy rows (neutral), and tied logits."""
    import itertools
    gen = torch.Generator().manual_seed(0)
    V = 5000                                       # wide enough for `warp`'s ranked top-p cut
    logits = torch.randn(6, 3, V, generator=gen) * 3                     # [B, T, V]
    logits[1] = (logits[1] * 2).round() / 2                              # many ties
    combos = [SamplingParams(t, k, p) for t, k, p in
              itertools.product((0.7, 1.0, 1.3), (0, 1, 5, V, V + 7), (1.0, 0.9, 0.3))]
    combos.append(SamplingParams())                                      # greedy
    for i in range(0, len(combos), 6):
        params = (combos[i:i + 6] + [SamplingParams()] * 6)[:6]
        rows = torch.tensor([param_row(p, V) for p in params])          # [B, 4]
        got = warp_rows(logits, rows)
        for b, p in enumerate(params):
            want = warp(logits[b], p if not p.greedy else SamplingParams(temperature=1.0))
            assert torch.equal(got[b], want), f"row {b}: {p}"
            assert rows[b, 3] == (0.0 if p.greedy else 1.0)


def test_a_top_p_cut_through_tied_tokens_keeps_the_lowest_ids():
    """4000 tokens of equal probability and a top-p cut through them: the cut keeps the 2000
    lowest ids, in `warp` on one row, on a batch, and in `warp_rows`, so which tokens survive a
    tie is a function of the probabilities, not of the sort's order of equal keys (unstable
    before: threads and shapes scrambled the tied tokens)."""
    V = 6000
    logits = torch.full((V,), -30.0)
    logits[1000:5000] = 0.0                                                # tied tokens
    want = torch.zeros(V, dtype=torch.bool)
    want[1000:3000] = True
    params = SamplingParams(temperature=1.0, top_p=0.5)
    batch = logits.expand(3, 2, V).clone()
    rows = torch.tensor([param_row(params, V)] * 3)
    for probs in (warp(logits, params), warp(batch, params)[2, 1], warp_rows(batch, rows)[1, 0]):
        assert torch.equal(probs > 0, want)


def _nucleus(probs: torch.Tensor, top_p: float) -> int:
    return int((~top_p_cut_sorted(probs, top_p)).sum())


@pytest.mark.parametrize("V", [1024, 5000, 151936])
def test_the_top_p_cut_has_the_bits_of_the_full_sort(V):
    """`top_p_cut` (the CPU's: the most likely tokens ranked first, the full sort only when
    they hold too little mass) cuts exactly what `top_p_cut_sorted` (the specification) cuts:
    peaked rows settled by the first candidates, flatter ones by the widened set or the full
    sort, ties across the cut, a row after a top-k cut (mostly zeros), NaN rows, top_p from
    tiny to near 1."""
    g = torch.Generator().manual_seed(V)
    rows = [torch.randn(V, generator=g) * s for s in (20.0, 8.0, 3.0, 1.0, 0.3)]
    tied = torch.full((V,), -30.0)
    tied[V // 8: V // 8 + 600] = 1.0                       # 600 tied tokens, cut through
    rows.append(tied)
    nan = torch.randn(V, generator=g)
    nan[V // 3] = float("nan")
    rows.append(nan)
    probs = torch.softmax(torch.stack(rows), dim=-1)                              # [R, V]
    top_k = torch.randn(V, generator=g) * 3                 # a top-k cut first: mostly zeros
    top_k[top_k < top_k.topk(50).values[-1]] = float("-inf")
    lone_nan = torch.full((V,), 1.0 / V)                    # a NaN beside tied values (not
    lone_nan[5] = float("nan")                              # from softmax, which NaNs a
    probs = torch.cat([probs, torch.softmax(top_k, -1)[None], lone_nan[None]])    # whole row)
    sizes = set()
    for top_p in (1e-30, 0.1, 0.5, 0.9, 0.95, 0.999):
        assert torch.equal(top_p_cut(probs, top_p), top_p_cut_sorted(probs, top_p)), top_p
        assert torch.equal(top_p_cut(probs[None, 2:4], top_p),
                           top_p_cut_sorted(probs[None, 2:4], top_p))        # [1, 2, V]
        sizes |= {_nucleus(p, top_p) for p in probs[:-4]}
    # every way of settling the cut was taken: within the first candidates, the widened set,
    # and the full sort
    first, wide = NUCLEUS_FIRST, NUCLEUS_FIRST * NUCLEUS_GROWTH
    assert min(sizes) < first and any(first <= n < wide for n in sizes) \
        and (max(sizes) >= wide or 4 * wide > V)


def test_a_cpu_running_sum_has_the_bits_of_its_head():
    """What `top_p_cut` rests on: on the CPU a cumsum over a row's first m values has the bits
    of the first m values of the cumsum over the whole row."""
    g = torch.Generator().manual_seed(1)
    for _ in range(20):
        x = torch.rand(151936, generator=g) ** 8
        x = x / x.sum()
        whole = torch.cumsum(x, dim=0)
        for m in (1, 7, 255, 4100, 100000):
            assert torch.equal(torch.cumsum(x[:m], dim=0), whole[:m]), m


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.8, top_k=3),
    SamplingParams(temperature=1.2, top_p=0.8),
], ids=["plain", "top_k", "top_p"])
def test_million_draws_match_warped_target(params):
    """1,000,000 accept/resample draws through the engine's code path: the draft samples from
    warped q, acceptance uses warped p and q, and the output frequencies equal warped p."""
    n = 1_000_000
    gen = torch.Generator().manual_seed(1234)
    p = warp(torch.log(P)[None], params)[0]           # what plain sampling would draw from
    q = warp(torch.log(Q)[None], params)[0]
    drafts = sample(q.expand(n, 5), gen)[:, None]       # [n, 1] draft tokens from q
    target_probs = p.expand(n, 2, 5)                    # [n, K + 1, V]
    draft_probs = q.expand(n, 1, 5)                     # [n, K, V]
    uniforms, noise = draw_randomness(n, 1, 5, gen, "cpu")
    num_accepted, out = rejection_sample(target_probs, draft_probs, drafts, uniforms, noise)
    first = out[:, 0]
    freq = torch.bincount(first, minlength=5).double() / n
    assert (freq - p.double()).abs().max().item() < 0.002, (freq, p)
    rate = num_accepted.double().mean().item()
    assert rate == pytest.approx(torch.minimum(p, q).sum().item(), abs=0.002)


def test_every_position_of_a_three_draft_round_follows_its_target():
    """K = 3 with a different p and q at each position (and the bonus position's own p): the
    token committed at position j, over the rows that reach it, follows p_j; the acceptance
    after j accepted drafts is sum min(p_j, q_j). The tests above see position 0 only; a rule
    that is right there and wrong later (e.g. a resample at j >= 2 that subtracts the previous
    position's q: 0.21 off at j = 2) passes them."""
    n, K, V = 400_000, 3, 5
    gen = torch.Generator().manual_seed(7)
    p = torch.stack([P, Q, P.roll(1), Q.roll(2)])                      # [K + 1, V]
    q = torch.stack([Q, P.roll(3), Q.roll(1)])                         # [K, V]
    drafts = torch.stack([sample(q[j].expand(n, V), gen) for j in range(K)], dim=1)  # [n, K]
    uniforms, noise = draw_randomness(n, K, V, gen, "cpu")
    num_accepted, out = rejection_sample(p.expand(n, K + 1, V), q.expand(n, K, V), drafts,
                                         uniforms, noise)
    for j in range(K + 1):
        reached = num_accepted >= j                                    # position j committed
        freq = torch.bincount(out[reached, j], minlength=V).double() / reached.sum()
        assert (freq - p[j].double()).abs().max().item() < 0.005, (j, freq, p[j])
        if j < K:
            accepted = (num_accepted[reached] > j).double().mean().item()
            assert accepted == pytest.approx(torch.minimum(p[j], q[j]).sum().item(), abs=0.005)


def test_one_hot_drafts_match_target():
    """n-gram drafts have no q: accept x with probability p(x), else draw from p without x."""
    n = 1_000_000
    gen = torch.Generator().manual_seed(99)
    drafts = torch.full((n, 1), 1, dtype=torch.int64)   # always guesses "a"
    uniforms, noise = draw_randomness(n, 1, 5, gen, "cpu")
    num_accepted, out = rejection_sample(P.expand(n, 2, 5), None, drafts, uniforms, noise)
    freq = torch.bincount(out[:, 0], minlength=5).double() / n
    assert (freq - P.double()).abs().max().item() < 0.002
    assert num_accepted.double().mean().item() == pytest.approx(0.15, abs=0.002)


# --- end to end: the first three sampled tokens of a tiny model ---------------------------------
VOCAB = 12
PROMPT = [1, 2, 3, 1, 2]
BATCH = 2500
ROUNDS = 8            # 20,000 samples per method
SPEC_SEED = 1000      # request i of round r gets seed + r * BATCH + i: the speculative runs
PLAIN_SEED = SPEC_SEED + BATCH * ROUNDS   # and plain sampling's use disjoint seeds


@pytest.fixture(scope="module")
def small_pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("small_vocab")
    kw = dict(vocab_size=VOCAB, hidden=32, tokenizer=False, eos=False, scale_logits=6.0)
    return make_model(root / "t", "qwen2", seed=3, **kw), make_model(root / "d", "qwen2",
                                                                      seed=4, **kw)


def _exact_joint(model_dir, params) -> np.ndarray:
    """P(t1, t2, t3 | PROMPT) under the warped target, by enumerating all prefixes."""
    model = Transformer.from_dir(model_dir, max_seq_len=16)
    joint = np.ones((VOCAB,) * 3)
    for depth in range(3):
        prefixes = list(itertools.product(range(VOCAB), repeat=depth))
        ids = torch.tensor([PROMPT + list(pre) for pre in prefixes])
        logits = model.forward(ids, model.new_cache(len(prefixes), 16), last_only=True)[:, 0]
        probs = warp(logits, params).double().numpy()
        for pre, row in zip(prefixes, probs):
            # multiply the slice joint[pre] by this position's distribution, broadcast over
            # the positions after it
            joint[pre] *= row.reshape((VOCAB,) + (1,) * (2 - depth))
    return joint


def _samples(runner, params, spec, seed) -> tuple[np.ndarray, int, int, np.ndarray, int]:
    """(counts of each output's first 3 tokens, draft tokens, rounds that drafted, counts of
    each among the requests that drafted, the guesses those rounds had room for), all but the
    first over the rounds that decided those 3 tokens. Only a round's first two guesses can
    decide them; a speculative request's budget is 4 (K >= 2), so that its first round has
    room for both (`DraftContext.room`: with 2 tokens left after the prompt's, one).

    runner: an LLM, whose requests go through its scheduler with a seed each; or an Engine,
    which runs the requests from this thread in batches as slots free up, unseeded (see
    `_engine_runs`)."""
    k = spec["num_speculative_tokens"] if spec is not None else 0
    budget = 2 + min(k, 2) if k else 3
    runs = (_engine_runs(runner, params, spec, seed, budget) if isinstance(runner, Engine)
            else _llm_runs(runner, params, spec, seed, budget))
    counts = np.zeros((VOCAB,) * 3)
    drafting = np.zeros((VOCAB,) * 3)
    drafted = rounds = asked = 0
    for steps_of_run in runs:
        got, deciding, tokens = 0, [], []
        for step in steps_of_run:
            tokens += step.new_tokens
            if got >= 3:
                continue
            if step.draft_tokens:
                asked += min(k, budget - got - 1)
            deciding.append(step)
            got += len(step.new_tokens)
        first = tuple(tokens[:3])
        counts[first] += 1
        drafted += sum(len(step.draft_tokens) for step in deciding)
        rounds += sum(bool(step.draft_tokens) for step in deciding)
        drafting[first] += any(step.draft_tokens for step in deciding)
    return counts, drafted, rounds, drafting, asked


def _llm_runs(llm, params, spec, seed, budget):
    """Each request's steps, BATCH requests submitted at a time, each with its own seed."""
    for r in range(ROUNDS):
        runs = [llm.submit(PROMPT, max_new_tokens=budget, temperature=params.temperature,
                           top_k=params.top_k, top_p=params.top_p, seed=seed + r * BATCH + i,
                           speculative=spec) for i in range(BATCH)]
        yield from [[chunk.step for chunk in run.chunks()] for run in runs]


def _engine_runs(engine, params, spec, seed, budget):
    """Each request's steps, the engine driven from this thread (`Engine.run`): requests
    admitted in order as slots free up, so every round's batch is the same from run to run.
    A seeded sampled `auto` request runs alone (`runs_alone`: its plans, and so its draws,
    would depend on its companions); these are unseeded, and each gets the generator a seed
    would give it (seed + its index, in admission order), so the test is as reproducible as a
    seeded one and its requests share rounds as a service's do."""
    params = dataclasses.replace(params, seed=None)
    requests = [Request(tuple(PROMPT), budget, params, SpecConfig(**spec))
                for _ in range(BATCH * ROUNDS)]
    admitted = itertools.count(seed)
    steps = {r.request_id: [] for r in requests}      # in the requests' order
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(engine_module, "make_generator",
                      lambda given, device: make_generator(next(admitted), device))
        for batch in engine.run(requests):
            for step in batch:
                assert step.error is None, step.error
                steps[step.request_id].append(step)
    return list(steps.values())


def _lookup_matches() -> np.ndarray:
    """[t1, t2, t3]: whether a request with that output finds a prompt-lookup match (n >= 1)
    in a round: round 1 looks its last token t1 up in PROMPT; a round 1 without drafts commits
    t2 alone, and round 2 looks t2 up in PROMPT + [t1]."""
    found = np.zeros((VOCAB,) * 3, dtype=bool)
    for t1, t2 in itertools.product(range(VOCAB), repeat=2):
        found[t1, t2, :] = t1 in PROMPT or t2 in PROMPT + [t1]
    return found


def _binned(expected_p, *counts, min_expected=5.0):
    """Cells with enough expected mass stay; the rest are pooled into one."""
    n = counts[0].sum()
    big = expected_p * n >= min_expected
    return [np.append(c[big], c[~big].sum()) for c in counts], np.append(
        expected_p[big], expected_p[~big].sum())


SAMPLING = SamplingParams(temperature=1.0, top_k=8)


def _llm(pair, **kwargs):
    # Slots: 1000, the rest of each round's requests wait in the queue for a free one.
    target, draft = pair
    return specrt.LLM(target, draft=draft, max_seq_len=16, max_queue=BATCH, dtype="float32",
                      max_batch_size=1000, **kwargs)


def _engine(pair, draft_stop):
    """An Engine of the pair, as `_llm`'s, for `_engine_runs`."""
    target, draft = (Transformer.from_dir(d, "float32", "cpu", 16) for d in pair)
    return Engine(target, draft, 1000, 16, draft_stop=draft_stop)


@pytest.fixture(scope="module")
def plain_counts(small_pair):
    """Plain sampling's counts, drawn once for all, on seeds none of the speculative runs use
    (the two-sample test below assumes independent samples)."""
    return _samples(_llm(small_pair), SAMPLING, None, PLAIN_SEED)[0]


@pytest.mark.parametrize("method, k, stop", [
    ("draft_model", 1, DRAFT_STOP), ("draft_model", 4, DRAFT_STOP), ("draft_model", 4, 0.0),
    ("ngram", 2, DRAFT_STOP), ("auto", 4, DRAFT_STOP)])
def test_first_three_tokens_distribution_matches_plain(small_pair, plain_counts, method, k,
                                                       stop):
    """stop: the draft model's draft_stop; at the default it stops some rounds early (the
    small draft is sure of some guesses and not of others), at 0 every round drafts K."""
    target, _ = small_pair
    if method == "auto":
        # auto plans for the whole batch of up to 1000 and, with its measured costs, would
        # (rightly) neither widen such a pass 5x nor catch a draft model up on the prompt for
        # 3-token answers. Costs where a pass's tokens are nearly free and drafting is free make
        # it speculate, which is what is tested; in batches (`_engine_runs`), where its plan
        # for a round weighs every row's past.
        runner = _engine(small_pair, stop)
        planner = runner.planner_for(SpecConfig(method=method, num_speculative_tokens=k))
        planner.costs = CostModel(verify=[1.0 + 1e-5 * t for t in range(40)], draft=[0.0] * 40)
    else:
        runner = _llm(small_pair, draft_stop=stop)
    spec_counts, drafted, rounds, drafting, asked = _samples(
        runner, SAMPLING, {"method": method, "num_speculative_tokens": k}, SPEC_SEED)
    assert drafted > 0.1 * BATCH * ROUNDS      # speculation really ran (and was rejected)
    if method == "ngram":
        # Prompt lookup drafts where the text repeats: here ~64% of the requests, all of them.
        could = spec_counts * _lookup_matches()
        assert (drafting == could).all(), (int(drafting.sum()), int(could.sum()))
    else:
        # Nearly every sample comes from a request that drafted (observed: all of them), not
        # from plain rounds.
        assert drafting.sum() >= 0.9 * BATCH * ROUNDS, int(drafting.sum())
    if method == "draft_model" and k > 1:
        if stop:
            assert rounds < drafted < asked, (rounds, drafted, asked)   # some rounds stopped
        else:
            assert drafted == asked > rounds
    exact = _exact_joint(target, SAMPLING)
    assert spec_counts.sum() == BATCH * ROUNDS
    # speculative vs the exact target distribution, and vs plain sampling (two-sample test)
    assert _fit_pvalues(exact, spec_counts).min() > 1e-3
    assert _fit_pvalues(exact, plain_counts).min() > 1e-3
    (s, p), _ = _binned(exact, spec_counts, plain_counts)
    assert stats.chi2_contingency(np.stack([s, p])).pvalue > 1e-3


def _fit_pvalues(exact: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Chi-square p-values of `counts` [V, V, V] against the joint `exact`: over the whole
    joint (~500 cells), then over the first token, the first two, and the second and third
    tokens alone. The joint alone let a sampler 2-3% off in total variation pass about half
    the time at 20,000 samples; the marginals' few cells catch it
    (test_the_fit_catches_a_sampler_a_few_percent_off)."""
    out = []
    for axes in ((), (1, 2), (2,), (0, 2), (0, 1)):
        e_p, c = exact.sum(axis=axes), counts.sum(axis=axes)
        (c,), e = _binned(e_p, c)
        possible = e > 0            # the pooled cell may be empty (every cell big enough)
        if c[~possible].sum():      # an outcome of probability 0 was drawn
            out.append(0.0)
            continue
        c, e = c[possible], e[possible] / e[possible].sum()   # fp32 sums: 1 within ~1e-7
        out.append(stats.chisquare(c, e * c.sum()).pvalue)
    return np.array(out)


def test_the_fit_catches_a_sampler_a_few_percent_off(small_pair):
    """The check above can fail: 20,000 draws from the exact joint pass it, 20,000 from a
    sampler 3% off in total variation (the exact joint mixed with itself given the likeliest
    first token) fail it, with fixed seeds. Over 200 seeds (2026-12-05): at 3% off the joint
    alone caught 108, with the marginals 200; at 2% off 7 and 183; exact draws failed 0-2."""
    target, _ = small_pair
    exact = _exact_joint(target, SAMPLING)
    rng = np.random.default_rng(0)

    def draws(p):
        return rng.multinomial(BATCH * ROUNDS, p.ravel() / p.sum()).reshape(p.shape) * 1.0

    first = exact.sum(axis=(1, 2))
    given_likeliest = np.zeros_like(exact)
    given_likeliest[first.argmax()] = exact[first.argmax()] / first.max()
    off = 0.03 / (1 - first.max())
    biased = (1 - off) * exact + off * given_likeliest
    assert 0.5 * np.abs(biased - exact).sum() == pytest.approx(0.03)
    assert _fit_pvalues(exact, draws(exact)).min() > 1e-3
    assert _fit_pvalues(exact, draws(biased)).min() < 1e-3
