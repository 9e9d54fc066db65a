"""The batch-invariant skinny matmul (specrt/kernels/triton/matmul.py) against its reference
(`reference_layer.matmul`), and its promise: a row's bits do not depend on how many rows, or
which, share the call.

On CPU the kernel runs under the Triton interpreter (tests/session.py), so shapes are small;
bf16 runs on CUDA only (the interpreter's bf16 arithmetic is wrong). On the interpreter every
tile's `tl.dot` has the same [BLOCK_M, BLOCK_K] x [BLOCK_K, BLOCK_N] shape whatever M is, so the
row-invariance tests check what the kernel controls (tiles, masks, k order, splits and their
merge); that one MMA instruction gives a row the same bits whatever the other rows hold is the
GPU's part, checked by the bf16 tests there.
"""
import importlib

import pytest
import torch
import torch.nn.functional as F

import specrt.kernels as kernels
from specrt.kernels import reference_layer
from tests.kernel_cases import DEVICE, TOL, needs_cuda_bf16

# the kernels under test are Triton's (under TRITON_INTERPRET=1 on a CPU): an install without
# triton (`pip install 'specrt[test]'` on a CPU-only torch) skips them instead of erroring
pytest.importorskip("triton", reason="the Triton kernels' tests need triton "
                    "(pip install 'specrt[cuda]')")
mm = importlib.import_module("specrt.kernels.triton.matmul")


def _inputs(M, N, K, dtype, seed, bias=True):
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    x = torch.randn(M, K, generator=g, device=DEVICE).to(dtype)                 # [M, K]
    w = (torch.randn(N, K, generator=g, device=DEVICE) / K ** 0.5).to(dtype)   # [N, K]
    b = torch.randn(N, generator=g, device=DEVICE).to(dtype) if bias else None  # [N]
    return x, w, b


# (M, N, K, dtype, bias, out_dtype, split_blocks): M over decode and verify sizes, N and K not
# multiples of the blocks; split_blocks None: the launcher's rule, 1: a split per k block.
CASES = [
    (1, 100, 300, torch.float32, True, None, None),
    (3, 70, 130, torch.float16, True, None, None),
    (17, 129, 257, torch.float32, False, None, 1),
    (32, 65, 96, torch.float16, False, torch.float32, None),
    (17, 33, 200, torch.float16, True, torch.float32, 1),
    (3, 200, 40, torch.float32, True, torch.float32, None),     # K < one fp32 block pair
    (40, 50, 70, torch.float32, True, None, None),             # three row tiles
]


@pytest.mark.parametrize("M,N,K,dtype,bias,out_dtype,split_blocks", CASES)
def test_matmul_matches_reference(M, N, K, dtype, bias, out_dtype, split_blocks):
    x, w, b = _inputs(M, N, K, dtype, seed=M * 1000 + N, bias=bias)
    y = mm.matmul(x, w, b, out_dtype, split_blocks=split_blocks)
    ref = reference_layer.matmul(x, w, b, out_dtype)
    want = out_dtype or dtype
    assert y.shape == (M, N) and y.dtype == want
    atol, rtol = TOL[want]
    torch.testing.assert_close(y.float(), ref.float(), atol=atol, rtol=rtol)


def test_matmul_reference_is_the_linear_layer():
    """The spec is nn.Linear's function: in fp32 it is F.linear up to summation order."""
    x, w, b = _inputs(5, 40, 60, torch.float32, seed=1)
    torch.testing.assert_close(reference_layer.matmul(x, w, b), F.linear(x, w, b))


@pytest.mark.parametrize("dtype,out_dtype,split_blocks", [
    (torch.float32, None, None), (torch.float16, None, 1), (torch.float16, torch.float32, None),
    (torch.float32, None, 100)])
def test_matmul_row_bits_do_not_depend_on_the_other_rows(dtype, out_dtype, split_blocks):
    """Row m of a 32-row call equals the same row computed alone (M = 1), among 3 and 17 rows,
    at another position, and in a 40-row call (three row tiles), bit for bit: the verify pass's
    rows get the bits of the decode steps they replace."""
    N, K = 70, 230   # fp32 by default: 4 splits of 2 blocks; fp16: 2 blocks, one split each
    x, w, b = _inputs(40, N, K, dtype, seed=7)

    def run(rows):
        return mm.matmul(x[rows], w, b, out_dtype, split_blocks=split_blocks)

    full = run(list(range(32)))                                                  # [32, N]
    assert torch.equal(run(list(range(40)))[:32], full)
    for m in (0, 5, 31):
        assert torch.equal(run([m])[0], full[m]), f"row {m} alone differs"
    assert torch.equal(run([2, 9, 31]), full[[2, 9, 31]])
    rows17 = list(range(31, 14, -1))                                             # reversed
    assert torch.equal(run(rows17), full[rows17])
    assert torch.equal(run([35, 3])[1], full[3])       # row 3 at position 1, beside a later tile's


def test_matmul_fp32_output_is_the_accumulator():
    """out_dtype=fp32 returns the fp32 sum itself: rounding it gives the half-precision call's
    bits (one rounding of the same accumulator), and it is not that call's result upcast."""
    x, w, b = _inputs(17, 90, 250, torch.float16, seed=3)
    y32 = mm.matmul(x, w, b, torch.float32)
    y16 = mm.matmul(x, w, b)
    assert y32.dtype == torch.float32 and y16.dtype == torch.float16
    assert torch.equal(y32.to(torch.float16), y16)
    assert not torch.equal(y32, y16.float())
    exact = (x.double() @ w.double().t() + b.double()).float()
    torch.testing.assert_close(y32, exact, atol=1e-5, rtol=1e-5)


def test_matmul_strided_rows_and_empty_input():
    x, w, b = _inputs(6, 30, 64, torch.float32, seed=4)
    wide = torch.randn(6, 100, device=DEVICE)
    wide[:, 10:74] = x
    view = wide[:, 10:74]                                                        # row stride 100
    assert torch.equal(mm.matmul(view, w, b), mm.matmul(x, w, b))
    assert mm.matmul(x[:0], w, b).shape == (0, 30)


def test_split_k_depends_on_the_weight_shape_only():
    """Splits fill the GPU where N alone gives few tiles (the 1.5B's down projection:
    [1536, 8960] -> 6 splits of 12 blocks) and never split a wide weight (the output head); the
    rule takes no M, so a weight always sums in the same order."""
    bf16 = torch.bfloat16
    assert mm.split_blocks_for(1536, 8960, bf16) == 12                  # 70 blocks, 6 splits
    assert mm.split_blocks_for(151936, 1536, bf16) == 12                # one split
    assert mm.split_blocks_for(17920, 1536, bf16) == 12                 # gate/up: one split
    for n, k in ((2048, 1536), (1536, 1536), (896, 4864), (64, 100)):
        blocks = mm.split_blocks_for(n, k, bf16)
        assert blocks >= 1 and blocks >= min(mm.MIN_SPLIT_BLOCKS, -(-k // 128))


@pytest.mark.parametrize("bad,match", [
    (lambda x, w, b: (x[:, :-1], w, b, None), "differ in K"),
    (lambda x, w, b: (x, w.half(), b, None), "share a dtype"),
    (lambda x, w, b: (x.long(), w.long(), None, None), "share a dtype"),
    (lambda x, w, b: (x.t().contiguous().t(), w, b, None), "contiguous along K"),
    (lambda x, w, b: (x, w, b[:-1], None), "bias must be"),
    (lambda x, w, b: (x, w, b.half(), None), "bias must be"),
    (lambda x, w, b: (x, w, b, torch.float16), "out_dtype"),
    (lambda x, w, b: (x[0], w, b, None), r"\[M, K\]"),
])
def test_matmul_rejects_what_it_does_not_serve(bad, match):
    x, w, b = _inputs(3, 20, 40, torch.float32, seed=5)
    with pytest.raises(ValueError, match=match):
        mm.matmul(*bad(x, w, b))
    with pytest.raises(ValueError, match="split_blocks"):
        mm.matmul(x, w, b, split_blocks=0)


@pytest.mark.parametrize("forced", ["triton", "reference"])
def test_dispatch_routes_matmul(monkeypatch, forced):
    calls = []
    for module, tag in ((mm, "triton"), (reference_layer, "reference")):
        def spy(*args, _fn=module.matmul, _tag=tag):
            calls.append(_tag)
            return _fn(*args)
        monkeypatch.setattr(module, "matmul", spy)
    monkeypatch.setenv("SPECRT_KERNELS", forced)
    x, w, b = _inputs(2, 20, 40, torch.float32, seed=6)
    torch.testing.assert_close(kernels.matmul(x, w, b), F.linear(x, w, b), atol=1e-4, rtol=1e-4)
    assert calls == [forced]


@needs_cuda_bf16
@pytest.mark.parametrize("out_dtype", [None, torch.float32])
def test_matmul_bf16_matches_reference_and_rows_are_invariant(out_dtype):
    """The GPU's promise in bf16, at real shapes (1.5B down projection: split-K; output-head
    width: one split): every row of a 17- and 32-row call has the bits of the row alone."""
    for N, K in ((1536, 8960), (4096, 1536)):
        x, w, b = _inputs(32, N, K, torch.bfloat16, seed=N)
        full = mm.matmul(x, w, b, out_dtype)
        ref = reference_layer.matmul(x, w, b, out_dtype)
        atol, rtol = TOL[out_dtype or torch.bfloat16]
        torch.testing.assert_close(full.float(), ref.float(), atol=atol, rtol=rtol)
        part = mm.matmul(x[:17], w, b, out_dtype)
        assert torch.equal(part, full[:17])
        for m in range(32):
            assert torch.equal(mm.matmul(x[m:m + 1], w, b, out_dtype)[0], full[m]), m
