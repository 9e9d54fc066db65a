"""Weights in transparent huge pages (specrt.kernels.cpu.huge_pages): the arena's copies hold the
same values, aligned, outliving the arena; the THP setting and SPECRT_HUGE_PAGES are honoured;
a model whose weights the CPU backend moved there gives the bits of one whose weights it did not."""
import gc
import mmap

import pytest
import torch

from specrt.kernels.cpu import gemv_int8, huge_pages
from specrt.kernels.cpu import layers as cpu_layers
from specrt.model import Transformer

needs_madvise = pytest.mark.skipif(not hasattr(mmap, "MADV_HUGEPAGE"),
                                   reason="this Python has no mmap.MADV_HUGEPAGE (not Linux)")


@needs_madvise
def test_copy_holds_the_same_tensor_in_aligned_memory_of_its_own():
    arena = huge_pages.Arena()
    g = torch.Generator().manual_seed(0)
    src = [torch.randn(512, 1025, generator=g).bfloat16(),       # odd byte count: next is realigned
           torch.randint(0, 255, (1024, 1024), generator=g, dtype=torch.uint8),
           torch.randn(300, 900, generator=g)]
    out = [arena.copy(t) for t in src]
    for s, o in zip(src, out):
        assert o.dtype == s.dtype and o.shape == s.shape and o.is_contiguous()
        assert torch.equal(o, s) and o.data_ptr() != s.data_ptr()
        assert o.data_ptr() % huge_pages.ALIGN == 0
    # small tensors share one mapping, one after another
    assert out[1].untyped_storage().data_ptr() == out[0].untyped_storage().data_ptr()


@needs_madvise
def test_small_tensors_stay_and_big_ones_get_a_mapping_of_their_own(monkeypatch):
    monkeypatch.setattr(huge_pages, "CHUNK", 4 << 20)
    arena = huge_pages.Arena()
    small = torch.ones(16, 16)
    assert arena.copy(small) is small                     # below MIN_BYTES: left where it is
    a = arena.copy(torch.ones(1 << 20, dtype=torch.uint8))
    big = arena.copy(torch.ones(3 << 20, dtype=torch.uint8))     # > CHUNK / 2
    b = arena.copy(torch.ones(1 << 20, dtype=torch.uint8))
    assert big.data_ptr() % huge_pages.PAGE == 0
    assert big.untyped_storage().data_ptr() != a.untyped_storage().data_ptr()
    assert b.untyped_storage().data_ptr() == a.untyped_storage().data_ptr()   # the chunk goes on


@needs_madvise
def test_copies_outlive_the_arena():
    arena = huge_pages.Arena()
    t = torch.arange(1 << 20, dtype=torch.float32)
    c = arena.copy(t)
    del arena
    gc.collect()
    c.add_(1)                                   # writable, still mapped
    assert torch.equal(c, t + 1)


def test_thp_mode_reads_the_bracketed_setting(tmp_path, monkeypatch):
    setting = tmp_path / "enabled"
    monkeypatch.setattr(huge_pages, "_SETTING", str(setting))
    assert huge_pages.thp_mode() is None                  # no such file: no THP here
    for text, mode in [("always [madvise] never\n", "madvise"),
                       ("[always] madvise never", "always"),
                       ("always madvise [never]\n", "never"), ("garbage", None)]:
        setting.write_text(text)
        assert huge_pages.thp_mode() == mode
    monkeypatch.delenv(huge_pages.ENV_VAR, raising=False)
    setting.write_text("always madvise [never]")
    assert not huge_pages.enabled()
    setting.write_text("always [madvise] never")
    assert huge_pages.enabled() == hasattr(mmap, "MADV_HUGEPAGE")
    monkeypatch.setenv(huge_pages.ENV_VAR, "0")
    assert not huge_pages.enabled()


needs_native = pytest.mark.skipif(not cpu_layers.AVAILABLE,
                                  reason="specrt._cpu_layers not built or no AVX-512 / AVX2")


@needs_madvise
@needs_native
@pytest.mark.parametrize("quant", [None, pytest.param("int8", marks=pytest.mark.skipif(
    not gemv_int8.AVAILABLE, reason="no int8 kernel on this CPU"))])
@pytest.mark.parametrize("fixture", ["tiny_noeos_dir", "tiny_llama_dir"])   # untied, tied head
def test_a_model_in_huge_pages_gives_the_same_bits(request, monkeypatch, fixture, quant):
    """Prefill and decode logits bit for bit; every projection's weight (and the head, with the
    embedding it is tied to: one copy, unless the head is packed for AMX tiles) moved into the
    arena."""
    from specrt.model.backends.cpu_native import CpuNative

    monkeypatch.setattr(huge_pages, "MIN_BYTES", 1)         # the tiny model's tensors are small
    model_dir = request.getfixturevalue(fixture)
    moved, kept = (Transformer.from_dir(model_dir, "bfloat16", max_seq_len=32, quant=quant,
                                        backend=CpuNative(huge=huge)) for huge in (True, False))
    caches = [m.new_cache(1, 32) for m in (moved, kept)]
    for ids in (torch.tensor([[5, 9, 2, 7, 1]]), torch.tensor([[3]]), torch.tensor([[11]])):
        got, want = (m.forward(ids, c) for m, c in zip((moved, kept), caches))
        assert torch.equal(got, want)
    weight = (lambda lin: lin.weight.data if quant else lin.weight)
    for a, b in zip(moved.layers, kept.layers):
        for name in ("qkv", "o", "gate_up", "down"):
            wa, wb = weight(getattr(a, name)), weight(getattr(b, name))
            assert torch.equal(wa, wb) and wa.untyped_storage().nbytes() % huge_pages.PAGE == 0
    if moved.cfg.tie_word_embeddings and quant is None:
        head = moved.lm_head.weight
        assert head.untyped_storage().nbytes() % huge_pages.PAGE == 0
        if not moved.backend.amx:
            assert moved.embed.data_ptr() == head.data_ptr()
        else:   # packed for AMX tiles: the embedding stays a copy of its own
            assert head.shape == (moved.embed.numel(),)


@needs_native
def test_the_placement_is_part_of_the_build_id():
    """Calibrated costs measured with the weights in 4 KiB pages are not reused in huge ones."""
    from specrt.model.backends.cpu_native import CpuNative

    assert CpuNative(huge=True).build_id != CpuNative(huge=False).build_id


def test_switches_take_0_false_off_no_as_off_and_name_any_other_value(monkeypatch, caplog):
    """SPECRT_HUGE_PAGES and the SPECRT_CPU_* switches read one way: 0, false, off or no (any
    case, spaces ignored) turn them off; a value that is none of those nor an "on" spelling
    leaves them on with a warning naming it, rather than silently."""
    from specrt.kernels.cpu.extension import switched_off

    for value in ("0", "false", " OFF ", "No"):
        monkeypatch.setenv(huge_pages.ENV_VAR, value)
        assert switched_off(huge_pages.ENV_VAR) and not huge_pages.enabled()
    with caplog.at_level("WARNING", logger="specrt"):
        for value in ("1", "", "true", "On", "yes"):
            monkeypatch.setenv("SPECRT_CPU_GEMV", value)
            assert not switched_off("SPECRT_CPU_GEMV")
        assert not caplog.records
        monkeypatch.setenv("SPECRT_CPU_GEMV", "maybe")
        assert not switched_off("SPECRT_CPU_GEMV")
    assert any("SPECRT_CPU_GEMV='maybe'" in r.getMessage() for r in caplog.records)
    monkeypatch.delenv("SPECRT_CPU_GEMV")
    assert not switched_off("SPECRT_CPU_GEMV")
