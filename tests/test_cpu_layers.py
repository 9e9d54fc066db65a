"""The C++ layer loop (specrt.kernels.cpu.layers) against its specification, the per-op loop of
the CPU-native backend: the same bits, bf16, int8 and int4 weights, decode, packed verify passes."""
import pytest
import torch

from specrt.kernels.cpu import gemv_int4, gemv_int8
from specrt.kernels.cpu import layers as cpu_layers
from specrt.model import Transformer

needs_kernel = pytest.mark.skipif(not cpu_layers.AVAILABLE,
                                  reason="specrt._cpu_layers not built or no AVX-512 / AVX2")
# The quantized kernels: int8 with AVX-512 VNNI or AVX2, int4 with AVX-512 VNNI only.
needs_int8 = pytest.mark.skipif(not gemv_int8.AVAILABLE, reason="no int8 kernel on this CPU")
needs_int4 = pytest.mark.skipif(not gemv_int4.AVAILABLE, reason="no AVX-512 VNNI on this CPU")
QUANTS = [None, pytest.param("int8", marks=needs_int8), pytest.param("int4", marks=needs_int4)]


def _pair(model_dir, quant=None):
    """The same weights twice: one model through the fused loop, one through the per-op loop."""
    fused = Transformer.from_dir(model_dir, dtype="bfloat16", max_seq_len=64, quant=quant)
    per_op = Transformer.from_dir(model_dir, dtype="bfloat16", max_seq_len=64, quant=quant)
    per_op.backend.fused_loop = False
    assert fused.backend._stack(fused) is not None and per_op.backend._stack(per_op) is None
    return fused, per_op


@needs_kernel
@pytest.mark.parametrize("quant", QUANTS)
def test_fused_loop_gives_the_bits_of_the_per_op_loop(tiny_noeos_dir, tiny128_dir, quant):
    """Prefill, decode steps and a packed 3-row verify pass (rows of 4, 1 and 2 tokens, at
    different positions): logits and caches bit for bit."""
    fused, per_op = _pair(tiny128_dir if quant == "int4" else tiny_noeos_dir, quant)
    caches = [m.new_cache(3, 64) for m in (fused, per_op)]
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 300, (3, 9), generator=g)
    passes = [(prompt, [9, 5, 7]), (prompt[:, :1], [1, 1, 1]),
              (torch.randint(0, 300, (3, 4), generator=g), [4, 1, 2]),
              (prompt[:, :1], [1, 0, 1])]
    for ids, valid in passes:
        got, want = (m.forward(ids, c, num_valid=valid) for m, c in zip((fused, per_op), caches))
        assert torch.equal(got, want), (ids.shape, valid)
    assert torch.equal(caches[0].k, caches[1].k) and torch.equal(caches[0].v, caches[1].v)


@needs_kernel
def test_fp32_models_keep_the_per_op_loop(tiny_noeos_dir):
    model = Transformer.from_dir(tiny_noeos_dir, dtype="float32", max_seq_len=32)
    assert model.backend._stack(model) is None
    logits = model.forward(torch.tensor([[5, 9, 2]]), model.new_cache(1, 32))
    assert torch.isfinite(logits).all()


@needs_kernel
def test_bad_pass_arguments_raise_value_error_naming_them(tiny_noeos_dir):
    """The C++ loop trusts its pointers: a wrong pass stops in the wrapper."""
    model = Transformer.from_dir(tiny_noeos_dir, dtype="bfloat16", max_seq_len=32)
    stack = model.backend._stack(model)
    cache = model.new_cache(2, 32)
    x = torch.zeros(3, model.cfg.hidden_size, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"starts\[1\], counts\[1\] must be"):
        stack.run(x, cache, [0, 31], [1, 2])              # past the cache's 32 positions
    with pytest.raises(ValueError, match="x must be"):
        stack.run(x.float(), cache, [0, 0], [1, 2])
    with pytest.raises(ValueError, match="x must be"):
        stack.run(x, cache, [0, 0], [1, 1])               # 3 rows for 2 tokens
    with pytest.raises(ValueError, match="k_cache must be"):
        stack.run(x, model.new_cache(2, 32).rows(0, 1), [0, 0], [1, 2])   # B = 1, not 2
    # one count per start: C++ read counts past their end (std::bad_alloc, or rows left
    # unwritten when there were more counts than starts)
    with pytest.raises(ValueError, match=r"counts must be one entry per row of starts \(2\)"):
        stack.run(x[:1], cache, [0, 0], [1])
    with pytest.raises(ValueError, match=r"counts must be one entry per row of starts \(1\)"):
        stack.run(x, model.new_cache(1, 32), [0], [1, 2])


@needs_kernel
@needs_int8
def test_a_quantized_prompt_runs_in_the_cpp_loop_and_agrees_with_the_reference(
        tiny_noeos_dir, monkeypatch):
    """An int8 model's prompt of up to QUANT_PROMPT_ROWS tokens takes the C++ loop (its products
    are the int8 kernel on either path); a longer one, and a bf16 model's prompt past
    ops.MAX_ROWS, the reference. Its logits and the decode step after it agree with the
    reference backend's (bf16: to its rounding; SDPA sums in another order)."""
    from specrt.model.backends import cpu_native
    from specrt.kernels.cpu import ops

    runs = []
    real_run = cpu_layers.Stack.run
    monkeypatch.setattr(cpu_layers.Stack, "run",
                        lambda self, x, *a, **k: runs.append(x.shape[0]) or real_run(self, x, *a,
                                                                                     **k))
    g = torch.Generator().manual_seed(3)
    most = cpu_native.QUANT_PROMPT_ROWS
    for quant, T, fused in (("int8", 100, True), ("int8", most, True), ("int8", most + 1, False),
                            (None, ops.MAX_ROWS + 1, False)):
        prompt = torch.randint(0, 300, (1, T), generator=g)
        step = torch.randint(0, 300, (1, 1), generator=g)
        outs = []
        for backend in ("cpu_native", "torch_ref"):
            model = Transformer.from_dir(tiny_noeos_dir, dtype="bfloat16", max_seq_len=T + 8,
                                         quant=quant, backend=backend)
            cache = model.new_cache(1, T + 8)
            runs.clear()
            first = model.forward(prompt, cache)[:, -1]
            if backend == "cpu_native":
                assert runs == ([T] if fused else []), (quant, T, runs)
            outs.append(torch.cat([first, model.forward(step, cache)[:, -1]]).float())
        torch.testing.assert_close(outs[0], outs[1], rtol=0.0, atol=0.05)   # logits' std ~0.6
