"""The CPU skinny-matmul kernels (specrt._gemv) against F.linear, their specification."""
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from specrt.kernels.cpu import gemv as cpu_gemv

needs_kernel = pytest.mark.skipif(not cpu_gemv.AVAILABLE,
                                  reason="CPU lacks AVX-512 BF16 and AVX2: the F.linear "
                                         "fallback serves")


def test_extension_is_built():
    # make test always builds it; a missing extension would silently cost half the speed
    assert cpu_gemv._gemv is not None


@needs_kernel
def test_a_zen_4_is_told_from_its_cpuid():
    # gemv.cpp takes 3-6-row passes over its tiles there: the CPU must be named right
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.exists():
        pytest.skip("no /proc/cpuinfo to check the CPUID reading against")
    fields = {k.strip(): v.strip() for k, v in (line.split(":", 1) for line in
              cpuinfo.read_text().splitlines() if ":" in line)}   # every core's are the same
    zen4 = (cpu_gemv.LEVEL == "avx512" and fields.get("vendor_id") == "AuthenticAMD"
            and fields.get("cpu family") == "25")
    assert cpu_gemv._gemv.avx512_halves() is zen4


@needs_kernel
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("m", [1, 2, 3, 5, 9, 17, 32])
# (40, 520): a last k-block shorter than one vector, followed by another weight tile
@pytest.mark.parametrize("n, k", [(37, 100), (256, 64), (130, 333), (40, 520)])
def test_matches_f_linear(dtype, tol, m, n, k):
    g = torch.Generator().manual_seed(m * 1000 + n + k)
    x = torch.randn(m, k, generator=g).to(dtype)
    w = (torch.randn(n, k, generator=g) * 0.05).to(dtype)
    b = torch.randn(n, generator=g).to(dtype)
    ref = F.linear(x.float(), w.float(), b.float())
    for bias in (b, None):
        want = ref if bias is not None else ref - b.float()
        got = cpu_gemv.kernel_linear(x, w, bias)
        assert got.dtype == dtype and got.shape == (m, n)
        torch.testing.assert_close(got.float(), want, atol=tol * 4, rtol=tol)
    got32 = cpu_gemv.kernel_linear(x, w, b, out_dtype=torch.float32)
    assert got32.dtype == torch.float32
    torch.testing.assert_close(got32, ref, atol=tol * 2, rtol=tol)


@needs_kernel
def test_linear_keeps_autograd_and_refuses_an_out_dtype_that_is_not_one():
    """F.linear is linear's specification: a product autograd must track takes it (the kernel
    path returned a result without grad_fn for 1 row, with one for 65), and out_dtype must be
    a dtype (the string "float32" reached Tensor.to as a device name)."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(24, 40, generator=g)
    for rows in (1, 65):
        x = torch.randn(rows, 40, generator=g, requires_grad=True)
        y = cpu_gemv.linear(x, w)
        assert y.grad_fn is not None
        y.sum().backward()
        torch.testing.assert_close(x.grad, w.sum(0).expand(rows, 40))
    with torch.no_grad():                 # no graph wanted: the kernel serves it
        assert cpu_gemv.linear(torch.randn(1, 40, requires_grad=True), w).grad_fn is None
    with pytest.raises(ValueError, match="linear: out_dtype must be a torch.dtype or None"):
        cpu_gemv.linear(torch.randn(1, 40), w, out_dtype="float32")
    with pytest.raises(ValueError, match=r"out_dtype must be torch.float32 \(that of x\), got"):
        cpu_gemv.kernel_linear(torch.randn(1, 40), w, out_dtype=torch.bfloat16)


@needs_kernel
@pytest.mark.parametrize("m", [1, 3, 6, 17, 48])
def test_bf16_outputs_are_the_fp32_outputs_rounded_to_nearest_even(m):
    """The stores round (+ bias) to bf16 as torch does, every lane of a tile (vector stores on
    AVX-512, one at a time on AVX2), and keep inf and NaN."""
    g = torch.Generator().manual_seed(m)
    x = torch.randn(m, 300, generator=g).bfloat16()
    w = (torch.randn(45, 300, generator=g) * 0.05).bfloat16()   # 45: a partial weight tile
    w[3, 7] = 0.0
    b = torch.randn(45, generator=g).bfloat16()
    for bias in (b, None):
        got = cpu_gemv.kernel_linear(x, w, bias)
        want = cpu_gemv.kernel_linear(x, w, bias, out_dtype=torch.float32).bfloat16()
        assert torch.equal(got, want)
    x[-1, 7] = float("inf")                              # the last row: inf, and inf * 0 = NaN
    got = cpu_gemv.kernel_linear(x, w, b)
    want = cpu_gemv.kernel_linear(x, w, b, out_dtype=torch.float32).bfloat16()
    assert got[-1, 3].isnan() and got[-1].isinf().any()
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got.nan_to_num(0.0), want.nan_to_num(0.0))


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
# 2-6: the AVX-512 whole-row path (up to 6 rows; on a Zen 4 up to 2, the rest tiled), on AVX2
# 2-3 (two weight rows a tile) and 4 (one) whole, 5-6 tiled, against the one-row call; 7 on:
# the tiled driver against it
@pytest.mark.parametrize("m", [2, 3, 4, 5, 6, 7, 9, 17, 32, 101])
# 1000: a masked tail inside the last k-block; 2100: a decode step over rows too long to take
# one at a time (gemv.cpp, ROW_AT_A_TIME_K; a verify pass still takes them one at a time), with
# a masked tail
@pytest.mark.parametrize("k", [1536, 1000, 2100])
def test_each_row_is_independent_of_how_many_rows(dtype, m, k):
    """A verify pass (M = K + 1) and a decode step (M = 1) give bit-identical rows; so do the
    chunks a prefill's many rows are cut into (101 rows: three passes on AVX2)."""
    g = torch.Generator().manual_seed(m + k)
    x = torch.randn(m, k, generator=g).to(dtype)
    w = (torch.randn(501, k, generator=g) * 0.02).to(dtype)     # 501: a partial weight tile
    full = cpu_gemv.kernel_linear(x, w, out_dtype=torch.float32)
    for i in range(m):
        assert torch.equal(cpu_gemv.kernel_linear(x[i:i + 1], w, out_dtype=torch.float32),
                           full[i:i + 1]), f"row {i} of {m} differs from its decode-step value"
    torch.set_num_threads(1)
    try:
        assert torch.equal(cpu_gemv.kernel_linear(x, w, out_dtype=torch.float32), full)
    finally:
        torch.set_num_threads(2)


def test_fallback_for_what_the_kernel_does_not_serve():
    x = torch.randn(3, 64, dtype=torch.float16)
    w = torch.randn(10, 64, dtype=torch.float16)
    torch.testing.assert_close(cpu_gemv.linear(x, w), F.linear(x, w))
    long_x = torch.randn(cpu_gemv.MAX_ROWS[torch.float32] + 1, 64)
    w32 = torch.randn(10, 64)
    torch.testing.assert_close(cpu_gemv.linear(long_x, w32), F.linear(long_x, w32))
    strided = torch.randn(64, 10).t()          # non-contiguous weight
    assert not cpu_gemv.usable(strided)
    x2 = torch.randn(2, 64)
    torch.testing.assert_close(cpu_gemv.linear(x2, strided), F.linear(x2, strided))


@needs_kernel
def test_dispatch_uses_the_kernel_only_where_it_wins(monkeypatch):
    calls = []
    monkeypatch.setattr(cpu_gemv, "kernel_linear", lambda *a, **k: calls.append(a[0].shape[0]))
    for dtype in (torch.bfloat16, torch.float32):
        w = torch.randn(8, 64).to(dtype)
        for m in (1, 2, cpu_gemv.MAX_ROWS[dtype], cpu_gemv.MAX_ROWS[dtype] + 1):
            cpu_gemv.linear(torch.randn(m, 64).to(dtype), w)
    limits = [cpu_gemv.MAX_ROWS[d] for d in (torch.bfloat16, torch.float32)]
    assert calls == [m for lim in limits for m in (1, 2, lim)]
    calls.clear()     # logits (fp32 asked for) take the kernel at any row count
    for dtype in (torch.bfloat16, torch.float32):
        w = torch.randn(8, 64).to(dtype)
        cpu_gemv.linear(torch.randn(200, 64).to(dtype), w, out_dtype=torch.float32)
    assert calls == [200, 200]


@needs_kernel
def test_logits_of_a_large_batch_are_the_bits_of_each_row_alone():
    """A verify pass of 4 rows x 17 tokens scores 68 rows at once; each must equal its own
    decode step's logits, bit for bit (greedy exactness in a busy batch)."""
    g = torch.Generator().manual_seed(3)
    w = (torch.randn(500, 128, generator=g) * 0.1).bfloat16()
    x = torch.randn(68, 128, generator=g).bfloat16()
    full = cpu_gemv.linear(x, w, out_dtype=torch.float32)
    for m in (0, 31, 32, 67):
        assert torch.equal(full[m], cpu_gemv.linear(x[m:m + 1], w, out_dtype=torch.float32)[0])


def _bad_calls():
    """(function, args, kwargs, the argument named in the error) for each way of being wrong."""
    x, w, b = torch.randn(2, 64), torch.randn(10, 64), torch.randn(10)
    cases = []
    for fn in (cpu_gemv.linear, cpu_gemv.kernel_linear):        # the checks every path makes
        cases += [
            (fn, (torch.randn(2, 63), w), {}, "x"),                      # K != weight's K
            (fn, (x.bfloat16(), w), {}, "x"),                            # dtype != weight's
            (fn, (x, w, torch.randn(9)), {}, "bias"),                    # shape
            (fn, (x, w, b.bfloat16()), {}, "bias"),                      # dtype
            (fn, (x, w[0]), {}, "weight"),                               # rank
            (fn, (x.numpy(), w), {}, "x"),                               # not a tensor
        ]
    fn = cpu_gemv.kernel_linear                                    # and what the kernel needs
    cases += [
        (fn, (x, torch.randn(64, 10).t()), {}, "weight"),                # strides
        (fn, (x, w, torch.randn(20)[::2]), {}, "bias"),                  # strides
        (fn, (x.half(), w.half()), {}, "weight"),                        # unsupported dtype
        (fn, (x, w), dict(out_dtype=torch.bfloat16), "out_dtype"),       # fp32 -> bf16
        (fn, (torch.randn(0, 64), w), {}, "x"),                          # no rows
    ]
    return cases


@needs_kernel
@pytest.mark.parametrize("fn, args, kwargs, arg", _bad_calls(),
                         ids=lambda v: getattr(v, "__name__", None) if callable(v) else None)
def test_bad_arguments_raise_value_error_naming_them(fn, args, kwargs, arg):
    """The C++ side trusts its pointers: every wrong tensor must stop in the wrapper."""
    with pytest.raises(ValueError, match=rf"^{fn.__name__}: {arg} must be .*, got "):
        fn(*args, **kwargs)


@needs_kernel
def test_kernel_accepts_any_strides_of_x():
    """x is copied to contiguous rows when it must be: strides of x are not an error."""
    w = torch.randn(10, 64)
    x = torch.randn(64, 3).t()                                     # [3, 64], not contiguous
    torch.testing.assert_close(cpu_gemv.kernel_linear(x, w), F.linear(x, w))


def test_build_id_names_the_build_or_the_library(monkeypatch):
    assert cpu_gemv.build_id() == (cpu_gemv._gemv.build_id() if cpu_gemv.AVAILABLE else "library")
    monkeypatch.setattr(cpu_gemv, "AVAILABLE", False)
    assert cpu_gemv.build_id() == "library"


def test_the_streaming_read_reads_contiguous_cpu_tensors_and_refuses_views():
    """The memory-read floor probe (csrc/cpu/stream_read.cpp, or torch.sum without it) reads
    whole tensors; a strided view would send it past its storage, so it is refused first."""
    from specrt.kernels.cpu import bandwidth

    t = torch.ones(1 << 16)
    assert bandwidth.read_seconds([t, t[:100]], threads=1) > 0
    with pytest.raises(ValueError, match="contiguous CPU tensors"):
        bandwidth.read_seconds([torch.ones(8).expand(4, 8)])
    with pytest.raises(ValueError, match="contiguous CPU tensors"):
        bandwidth.read_seconds([torch.ones(16, 16).t()])
    # -1 reached OpenMP, which aborted the whole process; 2**31 the binding's raw TypeError
    for threads in (0, -1, 2.0, 2**31):
        with pytest.raises(ValueError, match="threads must be an int in 1..4096"):
            bandwidth.read_seconds([t], threads=threads)
    # an AttributeError; a tensor's rows read one by one; a generator read empty by the check
    for not_a_list in ([1, 2], t, (x for x in [t]), 5):
        with pytest.raises(ValueError, match="tensors must be a list of tensors"):
            bandwidth.read_seconds(not_a_list)


@needs_kernel
def test_the_compute_floor_probe_does_every_multiply_add_it_counts():
    """The compute floor probe (csrc/cpu/dot_peak.cpp) returns the sum of every product it
    issued, so one that skipped work (or counted steps it did not run) differs from the
    definition; its rate is positive and finite, and a bad thread count is refused."""
    from specrt.kernels.cpu import compute

    for steps, scale, threads in [(1000, 1.0, 1), (1000, 0.375, 2), (37, 1.0, 2)]:
        assert cpu_gemv._gemv.dot_peak(steps, scale, threads) == \
            compute.dot_peak_reference(steps, scale, threads)
    assert 0 < compute.peak_flops(threads=1, repeats=1, steps=10_000) < float("inf")
    for threads in (0, -1, 2.0, 2**31):
        with pytest.raises(ValueError, match="threads must be an int in 1..4096"):
            compute.peak_flops(threads=threads)
    # steps -5 gave a negative rate, 0 a rate of 0, 2.5 the binding's raw TypeError
    for name, bad in [("steps", -5), ("steps", 0), ("steps", 2.5), ("repeats", 0),
                      ("steps", 2**31)]:
        with pytest.raises(ValueError, match=f"peak_flops: {name} must be an int in 1\\.\\."):
            compute.peak_flops(threads=1, **{name: bad})


def test_a_pass_is_priced_at_the_flops_a_counter_sees(tmp_path):
    """pass_flops counts what PyTorch's flop counter counts in transformers' own forward of a
    tiny Qwen2 with a KV cache, except the positions the causal mask hides, which the counter
    prices too (T (T - 1) / 2 per head and layer for T new tokens)."""
    import inspect

    from torch.utils.flop_counter import FlopCounterMode
    from transformers import AutoModelForCausalLM

    import tiny
    from specrt.kernels.cpu.compute import pass_flops
    from specrt.model.config import ModelConfig

    path = tiny.make_model(tmp_path / "m", layers=3, heads=4, kv_heads=2)
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
    cfg = ModelConfig.from_dir(path)
    ids = torch.randint(0, cfg.vocab_size, (1, 12), generator=torch.Generator().manual_seed(0))
    # the cache's keyword: "cache" in newer transformers, "past_key_values" (deprecated there)
    # in older ones, such as the GPU image's
    name = "cache" if "cache" in inspect.signature(model.forward).parameters \
        else "past_key_values"
    for prefix, tokens in [(5, 1), (0, 1), (5, 3), (8, 4)]:
        with torch.no_grad():
            cache = (model(ids[:, :prefix], use_cache=True).past_key_values if prefix
                     else None)
            with FlopCounterMode(display=False) as counter:
                model(ids[:, prefix:prefix + tokens], use_cache=True, **{name: cache})
        hidden = tokens * (tokens - 1) // 2 * cfg.num_heads * cfg.head_dim * 4 * cfg.num_layers
        assert pass_flops(cfg, tokens, prefix) == counter.get_total_flops() - hidden, \
            (prefix, tokens)
