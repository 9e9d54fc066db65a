"""The bf16 product on AMX-BF16 tiles (specrt.kernels.cpu.gemv_amx) against its specification,
the property it exists for (a row's bits do not depend on how many rows share the pass, so a
verify pass gives the bits of its decode steps), and the CPU backend's use of it."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specrt.kernels.cpu import gemv_amx
from specrt.model import Transformer
from specrt.model.backends.cpu_native import AmxLinear, CpuNative, GemvLinear

needs_amx = pytest.mark.skipif(not gemv_amx.AVAILABLE,
                               reason="no AMX-BF16 here (or SPECRT_AMX=0, or not built)")
SHAPES = [(16, 32), (48, 64), (80, 896), (256, 1536), (1152, 896)]   # odd groups: 48, 80


def _operands(m: int, n: int, k: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g).bfloat16()                      # [N, K]
    b = torch.randn(n, generator=g).bfloat16()                         # [N]
    x = torch.randn(m, k, generator=g).bfloat16()                      # [M, K]
    return x, w, b


@pytest.mark.parametrize("n, k", SHAPES)
def test_pack_is_undone_by_unpack(n, k):
    _, w, _ = _operands(1, n, k)
    packed = gemv_amx.pack(w)
    assert packed.shape == (n * k,)
    assert torch.equal(gemv_amx.unpack(packed, n, k), w)


@pytest.mark.parametrize("shape", [(10, 30), (16, 30), (10, 32), (0, 32), (16,)])
def test_pack_refuses_a_weight_its_layout_does_not_hold(shape):
    """(10, 30) raised torch's "shape '[0, 1, 16, 0, 16, 2]' is invalid" from a reshape."""
    with pytest.raises(ValueError, match=r"^pack: weight must be \[N, K\] with N a multiple "
                                         "of 16 and K of 32"):
        gemv_amx.pack(torch.zeros(shape, dtype=torch.bfloat16))


def test_pack_puts_a_block_of_a_group_in_one_tile():
    """tile[p][n][e] = W[n][32 b + 2 p + e]: the first KiB is rows 0-15, k 0-31."""
    w = torch.arange(64 * 64, dtype=torch.float32).view(64, 64).bfloat16()
    tile = gemv_amx.pack(w)[:512].view(16, 16, 2)                       # [p, n, e]
    for p, n, e in ((0, 0, 0), (3, 5, 1), (15, 15, 1)):
        assert tile[p, n, e] == w[n, 2 * p + e]
    # then the same block of rows 16-31 (the unit's second group)
    assert gemv_amx.pack(w)[512:1024].view(16, 16, 2)[2, 4, 1] == w[16 + 4, 5]


@needs_amx
@pytest.mark.parametrize("n, k", SHAPES)
@pytest.mark.parametrize("out_dtype", [None, torch.float32])
def test_kernel_matches_reference(n, k, out_dtype):
    x, w, b = _operands(40, n, k, seed=n + k)
    packed = gemv_amx.pack(w)
    for bias in (None, b):
        got = gemv_amx.linear(x, packed, n, k, bias, out_dtype)
        want = gemv_amx.reference_linear(x, packed, n, k, bias, out_dtype)
        assert got.dtype == want.dtype and got.shape == (40, n)
        # fp32 sums in another order: one bf16 step at most (2^-8 relative)
        torch.testing.assert_close(got.float(), want.float(), rtol=1e-2, atol=1e-2 * k ** 0.5)


@needs_amx
@pytest.mark.parametrize("n, k", [(80, 896), (256, 1536)])
def test_a_rows_bits_do_not_depend_on_the_rows_beside_it(n, k):
    """Passes of 1 to 70 rows (one or two x tiles, chunks of 32): every row has the bits of its
    decode step."""
    x, w, b = _operands(70, n, k, seed=1)
    packed = gemv_amx.pack(w)
    alone = torch.cat([gemv_amx.linear(x[i:i + 1], packed, n, k, b) for i in range(70)])
    for m in (2, 5, 16, 17, 31, 32, 33, 70):
        assert torch.equal(gemv_amx.linear(x[:m], packed, n, k, b), alone[:m]), m
    logits = torch.cat([gemv_amx.linear(x[i:i + 1], packed, n, k, b, torch.float32)
                        for i in range(70)])
    assert torch.equal(gemv_amx.linear(x, packed, n, k, b, torch.float32), logits)


@needs_amx
def test_kernel_refuses_what_it_does_not_take():
    x, w, b = _operands(2, 48, 64)
    packed = gemv_amx.pack(w)
    cases = [((x.float(), packed, 48, 64), "x"), ((x[:, :32], packed, 48, 64), "x"),
             ((x, packed[:-1], 48, 64), "packed"), ((x, packed, 40, 64), "n, k"),
             ((x, packed, 48, 64, b[:5]), "bias")]
    for args, name in cases:
        with pytest.raises(ValueError, match=name):
            gemv_amx.linear(*args)
    with pytest.raises(ValueError, match="out_dtype"):
        gemv_amx.linear(x, packed, 48, 64, None, torch.float16)


@needs_amx
def test_the_cpu_backend_packs_a_bf16_model_for_amx(tiny_noeos_dir):
    on = Transformer.from_dir(tiny_noeos_dir, dtype="bfloat16", max_seq_len=64)
    off = Transformer.from_dir(tiny_noeos_dir, dtype="bfloat16", max_seq_len=64,
                               backend=CpuNative(amx=False))
    fp32 = Transformer.from_dir(tiny_noeos_dir, dtype="float32", max_seq_len=64)
    for layer in on.layers:
        assert all(type(lin) is AmxLinear for lin in (layer.qkv, layer.o, layer.gate_up,
                                                      layer.down))
    assert type(on.lm_head) is AmxLinear and on.weight_bytes == off.weight_bytes
    assert type(off.layers[0].qkv) is GemvLinear and type(fp32.layers[0].qkv) is GemvLinear
    assert on.backend.build_id != off.backend.build_id      # calibrations are not shared
    # the same model to rounding, each path exact with itself: a verify pass of 5 tokens
    # gives the logits of its decode steps
    ids = torch.tensor([[5, 9, 2, 31, 7, 7, 1, 3]])
    for model in (on, off):
        cache = model.new_cache(1, 64)
        model.forward(ids[:, :3], cache)
        whole = model.forward(ids[:, 3:], cache)                        # [1, 5, V]
        cache.truncate([3])
        steps = torch.cat([model.forward(ids[:, t:t + 1], cache) for t in range(3, 8)], 1)
        assert torch.equal(whole, steps)
    a = on.forward(ids, on.new_cache(1, 64))
    b = off.forward(ids, off.new_cache(1, 64))
    torch.testing.assert_close(a, b, rtol=0.05, atol=0.1)


@needs_amx
def test_specrt_amx_0_keeps_bf16_models_off_the_tiles():
    script = ("from specrt.kernels.cpu import gemv_amx; from specrt.model.backends.cpu_native "
              "import CpuNative; assert not gemv_amx.AVAILABLE and not CpuNative().amx")
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120,
                   cwd=Path(__file__).parent.parent, env={**os.environ, "SPECRT_AMX": "0"})
