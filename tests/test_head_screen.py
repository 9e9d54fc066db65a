"""The screened output head: each row's argmax from an int8 copy of the head plus the exact
logits of the ids that may be it (specrt.model.backends.head_screen), against the full head,
and greedy generation with it against generation without it."""
import pytest
import torch

import specrt
from specrt.kernels.cpu import gemv, gemv_int8
from specrt.model.backends import cpu_native
from specrt.model.backends.head_screen import MAX_ROWS, ScreenedHead, serves
from tests.helpers import pin_costs

needs_kernels = pytest.mark.skipif(not (gemv.AVAILABLE and gemv_int8.AVAILABLE),
                                   reason="the screen needs the bf16 and int8 C++ kernels")


def _head(V=3000, H=128, dtype=torch.bfloat16, seed=0):
    """A head whose rows differ in scale by 100x (the int8 error is per row), with row 2999 a
    copy of row 7 (a tie that the argmax must break to the first id)."""
    g = torch.Generator().manual_seed(seed)
    scale = torch.logspace(-2, 0, V)[torch.randperm(V, generator=g)]                  # [V]
    w = torch.randn(V, H, generator=g) * scale[:, None]
    w[7] = torch.randn(H, generator=g)      # the largest row, and a copy of it last
    w[V - 1] = w[7]
    return w.to(dtype)


def _hidden(H=128, dtype=torch.bfloat16, seed=1):
    """Rows of hidden states as a model's final norm gives them, some with outliers, and one
    pointing at row 7 (and its copy) so the tie is the argmax."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(40, H, generator=g)
    x[::5, :3] *= 50                                    # outlier dimensions
    x[3] *= 1e-3                                        # nearly flat logits: many candidates
    x[4] *= 1e3
    return x.to(dtype)


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_screened_argmax_and_candidate_bits_are_the_full_heads(dtype):
    w = _head(dtype=dtype)
    x = _hidden(dtype=dtype)
    x[5] = w[7]                                         # row 7 and row 2999 tie at the top
    before = w.clone()
    screen = ScreenedHead(w)
    assert torch.equal(w, before)                        # an fp32 head is read, not rewritten
    full = gemv.linear(x, w, None, torch.float32)                       # [40, V]
    # the screen serves passes of up to MAX_ROWS rows: the 40 rows in such passes
    for i in range(0, 40, MAX_ROWS):
        rows = slice(i, i + MAX_ROWS)
        got = screen(x[rows])                                                # [2, V]
        ids = screen.candidates(x[rows])                                     # [C]
        assert torch.equal(got.argmax(dim=1), full[rows].argmax(dim=1))
        assert torch.equal(got[:, ids], full[rows, ids])               # the kernel's own bits
        others = torch.ones(got.shape[1], dtype=torch.bool)
        others[ids] = False
        _, b = screen.interval(x[rows])
        # elsewhere the int8 logits: within the interval, and below the row's max
        assert ((got - full[rows]).abs() <= b)[:, others].all()
        assert (got[:, others] < full[rows].amax(dim=1, keepdim=True)).all()
    assert screen(x[:MAX_ROWS + 1]) is None
    assert full[5, 7] == full[5, 2999] and screen(x[4:6]).argmax(dim=1)[1] == 7
    # it screens: a row alone computes a few of the 3000 ids exactly
    assert 1 <= screen.candidates(x[:1]).numel() < 300


@needs_kernels
def test_interval_holds_every_exact_logit():
    w = _head()
    screen = ScreenedHead(w)
    for seed in range(3):
        x = _hidden(seed=seed)
        a, b = screen.interval(x)
        full = gemv.linear(x, w, None, torch.float32)
        assert ((full - a).abs() <= b).all()
        assert (b > 0).all() and torch.isfinite(b).all()


@needs_kernels
def test_a_row_or_a_head_that_is_not_finite_asks_for_the_full_head():
    screen = ScreenedHead(_head())
    x = _hidden()[:2]
    x[1, 0] = float("nan")
    assert screen(x) is None
    w = _head()
    w[3, 5] = float("inf")                      # a damaged head: its logits are the full head's
    assert ScreenedHead(w)(_hidden()[:1]) is None


def test_serves_only_what_it_can_reproduce():
    w = torch.randn(100, 128).bfloat16()
    assert serves(w, None) == (gemv.AVAILABLE and gemv_int8.AVAILABLE)
    assert not serves(w, torch.zeros(100).bfloat16())           # a biased head
    assert not serves(torch.randn(100, 100).bfloat16(), None)    # K not a multiple of 64
    assert not serves(w.half(), None)
    with pytest.raises(ValueError, match="multiple of 64"):
        ScreenedHead(torch.randn(100, 100).bfloat16())


@needs_kernels
@pytest.mark.skipif(not cpu_native.available(torch.bfloat16), reason="the CPU-native backend")
def test_greedy_generation_with_the_screen_equals_it_without(tiny_noeos_dir, tiny_draft_dir,
                                                              monkeypatch):
    monkeypatch.setattr(cpu_native, "SCREEN_MIN_ROWS", 0)      # the tiny model's 320 ids
    kw = dict(draft=tiny_draft_dir, dtype="bfloat16", max_seq_len=128, draft_dtype="bfloat16")
    with_screen = specrt.LLM(tiny_noeos_dir, **kw)
    monkeypatch.setenv("SPECRT_HEAD_SCREEN", "0")
    without = specrt.LLM(tiny_noeos_dir, **kw)
    try:
        screen = with_screen.engine.target.head_screen
        assert screen is not None and without.engine.target.head_screen is None
        # the draft (the whole vocabulary here) never asks for argmax alone: no copy kept
        assert with_screen.engine.draft.head_rows is None
        assert with_screen.engine.draft.head_screen is None
        # a greedy step reads the int8 copy instead of the head
        assert with_screen.engine.target.weight_bytes < without.engine.target.weight_bytes
        calls = []       # the rows of each pass the screen served

        def counted(h):
            out = screen(h)
            if out is not None:
                calls.append(h.shape[0])
            return out
        with_screen.engine.target.head_screen = counted
        prompts = ["hello world", "the cat sat on", "a b c d e f"]
        auto = {"method": "auto", "num_speculative_tokens": 4}     # hears plain steps' confidence
        for llm in (with_screen, without):
            pin_costs(llm, auto, monkeypatch)
        for spec in (None, {"method": "draft_model", "num_speculative_tokens": 3},
                     {"method": "ngram", "num_speculative_tokens": 4}, auto):
            for p in prompts:
                a = with_screen.generate(p, max_new_tokens=24, speculative=spec)
                b = without.generate(p, max_new_tokens=24, speculative=spec)
                assert a.token_ids == b.token_ids, (spec, p)
            # a batch of greedy requests shares passes
            many = with_screen.generate(prompts, max_new_tokens=24, speculative=spec)
            assert [r.token_ids for r in many] == [without.generate(p, max_new_tokens=24,
                                                                    speculative=spec).token_ids
                                                   for p in prompts]
        # decode steps, and verify passes of 2 tokens, screened; wider passes read the head
        assert len(calls) > 50 and max(calls) == MAX_ROWS
        # a sampled request reads the full head
        calls.clear()
        with_screen.generate("hello", max_new_tokens=8, temperature=0.8, seed=3)
        assert calls == []
    finally:
        with_screen.close()
        without.close()
