"""The static-buffer runners behind CUDA graphs, run eagerly on the CPU: same outputs as the
plain path, and no buffer is ever reallocated."""
import pytest
import torch

import specrt
from specrt.model.graphs import StaticForward
from specrt.model import Transformer

PROMPTS = [[5, 6, 7, 8], list(range(40, 70)), [250, 3]]


@pytest.fixture(scope="module")
def pair(tiny_noeos_dir, tiny_draft_dir):
    eager = specrt.LLM(tiny_noeos_dir, draft=tiny_draft_dir, max_seq_len=160, max_batch_size=3,
                       dtype="float32")
    static = specrt.LLM(tiny_noeos_dir, draft=tiny_draft_dir, max_seq_len=160, max_batch_size=3,
                        cuda_graphs=True, dtype="float32")
    assert static.engine.static and not eager.engine.static
    return eager, static


def test_static_forward_equals_forward(tiny_noeos_dir):
    model = Transformer.from_dir(tiny_noeos_dir, max_seq_len=64)
    a, b = model.new_cache(2, 64), model.new_cache(2, 64)
    prompt = torch.randint(0, 300, (2, 9), generator=torch.Generator().manual_seed(0))
    model.forward(prompt, a)
    model.forward(prompt, b)
    a.truncate([9, 6])
    b.truncate([9, 6])
    ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
    runner = StaticForward(model, b, 2, 3, use_graph=True)   # no CUDA here: runs eagerly
    torch.testing.assert_close(runner.run(ids), model.forward(ids, a), atol=1e-5, rtol=1e-5)
    assert a.host_lengths() == b.host_lengths() == [12, 9]
    assert b.lengths.tolist()[:2] == [12, 9]


@pytest.mark.parametrize("k", [1, 3, 5])
def test_static_engine_greedy_equals_plain(pair, k):
    eager, static = pair
    spec = {"method": "draft_model", "num_speculative_tokens": k}
    plain = [eager.generate(p, max_new_tokens=40).token_ids for p in PROMPTS]
    assert [r.token_ids for r in static.generate(PROMPTS, max_new_tokens=40, speculative=spec)] \
        == plain
    assert static.generate(PROMPTS[0], max_new_tokens=40, speculative=spec).token_ids == plain[0]
    ngram = static.generate(PROMPTS[1], max_new_tokens=40,
                            speculative={"method": "ngram", "num_speculative_tokens": k})
    assert ngram.token_ids == plain[1]
    # prompt lookup drafted, and was right at times (not plain steps throughout)
    assert ngram.stats["num_draft_tokens"] > 0 and ngram.stats["num_accepted_tokens"] > 0


def test_static_sampling_is_seeded(pair):
    _, static = pair
    kw = dict(max_new_tokens=30, temperature=1.0, top_k=20,
              speculative={"method": "draft_model", "num_speculative_tokens": 4})
    first = static.generate(PROMPTS[0], seed=5, **kw).token_ids
    assert static.generate(PROMPTS[0], seed=5, **kw).token_ids == first
    # the seed is used: another one draws other tokens (30 draws at temperature 1 from the
    # top 20: all equal only if the model is near certain at every step)
    assert static.generate(PROMPTS[0], seed=6, **kw).token_ids != first


def test_no_buffer_is_reallocated_across_100_rounds(pair):
    _, static = pair
    spec = {"method": "draft_model", "num_speculative_tokens": 4}
    static.generate(PROMPTS[:2], max_new_tokens=8, speculative=spec)     # build the runners
    drafter = static.engine.draft_drafter
    runners = static.engine.graphs.runners() + list(drafter._loops.values())
    ptrs = lambda: [t.data_ptr() for r in runners for t in r.buffers()] + [  # noqa: E731
        static.engine.cache.k.data_ptr(), drafter.cache.k.data_ptr(),
        static.engine.graphs.logits.data_ptr()]
    before = ptrs()
    rounds = 0
    for _ in range(12):
        res = static.generate(PROMPTS[:2], max_new_tokens=40, speculative=spec)
        rounds += res[0].stats["target_passes"] - 1
        assert ptrs() == before
    assert rounds >= 100
    assert static.engine.graphs.runners() + list(drafter._loops.values()) == runners
