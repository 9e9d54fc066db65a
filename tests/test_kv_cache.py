"""The static cache: preallocated once, rolled back by moving lengths, never reallocated."""
import gc

import psutil
import torch

import specrt
from specrt.model.kv_cache import StaticKVCache


def test_truncate_moves_lengths_only():
    cache = StaticKVCache(2, 2, 2, 16, 8, torch.float32)
    cache.k.normal_()
    before = cache.k.clone()
    cache.advance([10, 7])
    cache.truncate([6, 7])
    assert cache.host_lengths() == [6, 7]
    assert cache.lengths.tolist() == [6, 7]
    assert torch.equal(cache.k, before)       # no data moved or zeroed


def test_truncate_refuses_to_grow_and_advance_refuses_overflow():
    import pytest

    from specrt.errors import CapacityError

    cache = StaticKVCache(1, 1, 1, 8, 4, torch.float32)
    cache.advance([5])
    with pytest.raises(ValueError, match="only shrink"):
        cache.truncate([6])
    with pytest.raises(CapacityError, match="max_seq_len"):
        cache.advance([4])


def _storage(llm):
    cache = llm.engine.cache
    return (cache.k.data_ptr(), cache.v.data_ptr(), cache.k.shape)


def test_cache_storage_is_reused_across_100_generate_calls(tiny_noeos_dir, tiny_draft_dir):
    llm = specrt.LLM(tiny_noeos_dir, draft=tiny_draft_dir, max_seq_len=128, dtype="float32")
    first = _storage(llm)
    draft_cache = llm.engine.draft_drafter.cache
    draft_first = (draft_cache.k.data_ptr(), draft_cache.v.data_ptr())
    for i in range(100):
        spec = None if i % 2 else {"method": "draft_model", "num_speculative_tokens": 3}
        llm.generate([1 + i % 50, 2, 3], max_new_tokens=6, speculative=spec)
        assert _storage(llm) == first
    assert (draft_cache.k.data_ptr(), draft_cache.v.data_ptr()) == draft_first
    assert llm.engine.draft_drafter.cache is draft_cache


def test_1000_generate_calls_keep_rss_flat(tiny_noeos_dir):
    llm = specrt.LLM(tiny_noeos_dir, max_seq_len=64, dtype="float32")
    proc = psutil.Process()
    first = _storage(llm)
    for i in range(1000):
        llm.generate([1 + i % 200, 7], max_new_tokens=3)
        if i == 49:
            gc.collect()
            base = proc.memory_info().rss
    gc.collect()
    end = proc.memory_info().rss
    # absolute: base is the whole test process (a GB or more in a full run), so 5% of it would
    # let ~50 KB a call leak unnoticed; 950 calls within 8 MiB is < 9 KB a call
    assert end - base <= 8 << 20, f"RSS grew from {base >> 20} MiB to {end >> 20} MiB"
    assert _storage(llm) == first
