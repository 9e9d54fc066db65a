"""The draft model stops a row's drafts after a guess it is unsure of (`draft_stop`): what it
proposes, and that output stays exact (greedy: identical to plain; sampling: the distribution
test in test_sampling_exact.py; seeded: the same alone and in a batch)."""
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import specrt
from specrt.engine.engine import Engine
from specrt.errors import ArgumentError
from specrt.model.transformer import Transformer
from specrt.spec.config import SpecConfig
from specrt.spec.costs import CostModel
from specrt.spec.drafters.base import NO_DRAFT, DraftContext
from specrt.spec.drafters.draft_model import DraftModelDrafter
from specrt.spec.sampling import confidence
from specrt.spec.sampling import SamplingParams
from tests.helpers import drain, slots_held_at_reserve

ROOT = Path(__file__).resolve().parents[1]

PROMPTS = [[5, 6, 7, 8], list(range(40, 70)), [250, 3]]
K = 6
MAX_SEQ = 256


def test_confidence_is_the_top_softmax_probability():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 300, generator=g) * 4                       # [B, V]
    logits[:, 200:] = float("-inf")                  # ids a shortlist does not score
    got = confidence(logits)
    assert got.dtype == torch.float32 and got.shape == (5,)
    assert torch.allclose(got.double(), torch.softmax(logits.double(), -1).amax(-1), rtol=1e-5)
    peaked = torch.full((1, 300), -1e4)
    peaked[0, 7] = 0.0
    assert confidence(peaked).item() == pytest.approx(1.0)


def _greedy_with_confidence(model: Transformer, ids: list[int], n: int):
    """The draft's greedy continuation of ids for n tokens with its confidence in each, one full
    forward per token (the reference)."""
    seq, out = list(ids), []
    for _ in range(n):
        logits = model.forward(torch.tensor([seq]), model.new_cache(1, len(seq) + 1),
                               last_only=True)[0, 0]                               # [V]
        out.append((int(logits.argmax()), float(confidence(logits[None])[0])))
        seq.append(out[-1][0])
    return out


@pytest.fixture(scope="module")
def draft(tiny_draft_dir):
    return Transformer.from_dir(tiny_draft_dir, torch.float32, torch.device("cpu"), MAX_SEQ)


@pytest.fixture(scope="module")
def threshold(draft):
    """A stop amid the tiny draft's confidences (it is unsure of every guess, ~1/50, so the
    default 0.5 would stop every round after one guess): a quarter of its guesses fall below
    it, so some rounds stop early and others draft on."""
    sure = [c for p in PROMPTS for _, c in _greedy_with_confidence(draft, p, K)]
    return statistics.quantiles(sure, n=4)[0]


def test_each_row_drafts_until_a_guess_below_the_stop(draft, threshold):
    drafter = DraftModelDrafter(draft, draft.cfg.vocab_size, len(PROMPTS), MAX_SEQ,
                                stop_below=threshold)
    rows = list(range(len(PROMPTS)))
    drafter.reset(rows)
    ctx = DraftContext([list(p) for p in PROMPTS], [True] * 3, [SamplingParams()] * 3,
                       [None] * 3)
    proposal = drafter.propose(ctx, K)
    expected, last_sure = [], []
    for b, p in enumerate(PROMPTS):
        ref = _greedy_with_confidence(draft, p, K)
        n = next((j + 1 for j, (_, c) in enumerate(ref[:-1]) if c < threshold), K)
        expected.append(n)
        last_sure.append(ref[n - 1][1] >= threshold)
        assert proposal.tokens[b, :n].tolist() == [t for t, _ in ref[:n]], b
        assert (proposal.tokens[b, n:] == NO_DRAFT).all(), b
    assert proposal.counts == expected
    # it reports the kind of each row's last guess: unsure where it stopped, and judged
    # where it drafted its K (a guess it does not draft past)
    assert proposal.last_sure == last_sure
    assert min(expected) < K and max(expected) > 1, expected     # the stop was exercised
    # a row fed its guesses but the last: all accepted, its cache holds prompt + n - 1 guesses
    drafter.rollback(expected)
    assert drafter.seen[:3] == [len(p) + n - 1 for p, n in zip(PROMPTS, expected)]
    assert drafter.cache.host_lengths()[:3] == drafter.seen[:3]


def test_a_round_of_one_guess_reports_the_kind_of_its_guess(draft, threshold):
    """K = 1: every row drafts its one guess, never asks whether to go on, and still reports
    whether it was sure of it (what `auto` learns a K = 1 round's guess as)."""
    drafter = DraftModelDrafter(draft, draft.cfg.vocab_size, len(PROMPTS), MAX_SEQ,
                                stop_below=threshold)
    drafter.reset(list(range(len(PROMPTS))))
    ctx = DraftContext([list(p) for p in PROMPTS], [True] * 3, [SamplingParams()] * 3,
                       [None] * 3)
    proposal = drafter.propose(ctx, 1)
    sure = [_greedy_with_confidence(draft, p, 1)[0][1] >= threshold for p in PROMPTS]
    assert proposal.counts == [1] * 3 and proposal.last_sure == sure
    assert True in sure and False in sure


def test_a_stop_of_zero_drafts_every_guess(draft):
    drafter = DraftModelDrafter(draft, draft.cfg.vocab_size, 1, MAX_SEQ, stop_below=0.0)
    drafter.reset([0])
    ctx = DraftContext([PROMPTS[1]], [True], [SamplingParams()], [None])
    proposal = drafter.propose(ctx, K)
    assert proposal.counts == [K] and proposal.last_sure is None    # judges no guess
    assert proposal.tokens[0].tolist() == [t for t, _ in
                                           _greedy_with_confidence(draft, PROMPTS[1], K)]


def test_a_static_drafter_always_drafts_k(draft):
    """The static loop cannot stop on a value it has not read back, and its eager rounds draft
    all K too, so a request's rounds do not depend on which path served them."""
    assert DraftModelDrafter(draft, draft.cfg.vocab_size, 1, MAX_SEQ, static=True,
                             stop_below=0.5).stop_below == 0.0


def test_a_stop_that_graphs_would_ignore_is_refused(tmp_path):
    """With CUDA graphs every round drafts K: a draft_stop other than 0 (the same) or the
    default was silently ignored. Refused before any file is read (the model does not exist),
    by the API and, naming the flag, by the CLI."""
    from specrt.api.args import LLMArgs
    from specrt.spec.config import DRAFT_STOP

    missing = str(tmp_path / "model")
    with pytest.raises(ArgumentError, match="draft_stop 0.3 would be ignored: with CUDA graphs"):
        LLMArgs(model=missing, device="cpu", cuda_graphs=True, draft_stop=0.3)
    for stop in (0.0, DRAFT_STOP):
        LLMArgs(model=missing, device="cpu", cuda_graphs=True, draft_stop=stop)
    LLMArgs(model=missing, device="cpu", draft_stop=0.3)        # no graphs on the CPU
    proc = subprocess.run([sys.executable, "-m", "specrt.generate", "--model", missing,
                           "--draft", missing, "--cuda-graphs", "--draft-stop", "0.3"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("error: --draft-stop: draft_stop 0.3 would be "
                                          "ignored"), proc.stderr


@pytest.mark.parametrize("bad", [1.5, -0.1, float("nan"), "0.5", None, True])
def test_an_engine_refuses_a_stop_that_is_not_a_probability(draft, bad):
    """`Engine` is public too: it checks its stop as `LLM` does, before building anything."""
    with pytest.raises(ArgumentError, match="draft_stop must be a finite number in \\[0, 1\\]"):
        Engine(draft, draft, 1, MAX_SEQ, draft_stop=bad)


@pytest.fixture(scope="module")
def llm(tiny_noeos_dir, tiny_draft_dir, threshold):
    return specrt.LLM(tiny_noeos_dir, draft=tiny_draft_dir, max_seq_len=MAX_SEQ,
                      max_batch_size=3, dtype="float32", draft_stop=threshold)


@pytest.mark.parametrize("method", ["draft_model", "auto"])
@pytest.mark.parametrize("k", [3, 8])
def test_greedy_output_equals_plain_when_rounds_stop_early(llm, method, k):
    spec = {"method": method, "num_speculative_tokens": k}
    if method == "auto":     # costs that make the draft model pay here, so auto drafts with it
        llm.engine.planner_for(SpecConfig(**spec)).costs = CostModel(
            verify=[1.0 + 0.03 * t for t in range(1, 33)],
            draft=[0.05 + 0.01 * t for t in range(1, 33)])
    plain = [llm.generate(p, max_new_tokens=40).token_ids for p in PROMPTS]
    alone = [llm.generate(p, max_new_tokens=40, speculative=spec) for p in PROMPTS]
    batch = llm.generate(PROMPTS, max_new_tokens=40, speculative=spec)
    assert [r.token_ids for r in alone] == plain
    assert [r.token_ids for r in batch] == plain
    stats = [r.stats for r in alone + batch]
    drafts = sum(s["num_drafts"] for s in stats)
    tokens = sum(s["num_draft_tokens"] for s in stats)
    assert sum(s["num_accepted_tokens"] for s in stats) > 0
    if method == "draft_model":     # every round drafted the draft model: some stopped early
        assert drafts < tokens < k * drafts, (drafts, tokens)


def test_a_seeded_request_samples_the_same_alone_and_in_a_batch(llm):
    """Where a row stops depends on its own logits only, and a row that stopped draws no more:
    its randomness, and so its tokens, are its own beside any other rows."""
    kw = dict(max_new_tokens=30, temperature=0.9, top_k=50,
              speculative={"method": "draft_model", "num_speculative_tokens": 4})
    alone = [llm.generate(p, seed=21 + i, **kw) for i, p in enumerate(PROMPTS)]
    with slots_held_at_reserve(llm.engine) as busy_at_reserve:
        together = drain([llm.submit(p, seed=21 + i, **kw) for i, p in enumerate(PROMPTS)])
    assert max(busy_at_reserve) > 0, "the requests never shared a batch"
    assert [r.token_ids for r in together] == [r.token_ids for r in alone]
    stats = [r.stats for r in alone]
    assert sum(s["num_drafts"] for s in stats) < sum(s["num_draft_tokens"] for s in stats) \
        < 4 * sum(s["num_drafts"] for s in stats)
