"""The int8 draft: its kernel against its reference (and the int4 kernel's, the same tests), and
exactness of speculation with it."""
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
import torch

import specrt
from specrt.errors import ArgumentError
from specrt.kernels.cpu import gemv_int4, gemv_int8
from specrt.model.backends.quantized import Int8Linear
from tests.helpers import drafted_k_a_round, pin_costs

needs_kernel = pytest.mark.skipif(not gemv_int8.AVAILABLE,
                                  reason="the int8 kernel needs AVX-512 VNNI or AVX2, and the "
                                         "extension")
needs_int4 = pytest.mark.skipif(not gemv_int4.AVAILABLE,
                                reason="the int4 kernel needs AVX-512 VNNI and the extension")


def _operands(dtype, M, N, K, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(N, K, generator=g).to(dtype)
    x = (3 * torch.randn(M, K, generator=g)).to(dtype)
    b = torch.randn(N, generator=g).to(dtype)
    return x, gemv_int8.quantize(w), b, w


def test_quantize_is_per_row_symmetric_and_round_trips_within_half_a_step():
    w = torch.randn(37, 128, dtype=torch.float64).float()
    w[5] = 0.0                                            # an all-zero row keeps scale 0
    q = gemv_int8.quantize(w)
    assert q.data.dtype == torch.uint8 and q.scale.shape == (37,) and q.shape == (37, 128)
    values = q.rows().float() - 128
    assert values.abs().max() == 127 and values.min() >= -127
    back = values * q.scale[:, None]
    assert (back - w).abs().max(dim=1).values.le(q.scale / 2 + 1e-7).all()
    assert q.scale[5] == 0 and torch.equal(back[5], w[5])


def test_packed_layout_holds_16_rows_a_group_and_round_trips():
    w = torch.randn(37, 128)
    rows = gemv_int8.quantize(w, packed_rows=0)
    packed = gemv_int8.quantize(w, packed_rows=16)
    assert packed.data.shape == (3, 32, 16, 4) and packed.shape == (37, 128)
    # w[g, k / 4, r, k % 4] = W[16 g + r, k]; the 11 rows past 37 hold 128 (zero weights)
    assert packed.data[2, 5, 3, 1] == rows.data[35, 21]
    assert torch.equal(packed.rows(), rows.data) and torch.equal(packed.scale, rows.scale)
    assert (packed.data[2, :, 5:, :] == 128).all()
    with pytest.raises(ValueError, match="row-major"):
        gemv_int8.pack(packed)


@needs_kernel
@pytest.mark.skipif(not gemv_int8.PACK_ROWS, reason="the packed int8 kernel needs AVX-512 VNNI; "
                    "the AVX2 kernel sums in another order (test_kernel_matches_reference)")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
# 1: a decode step; 5: one row tile; 17: three; 23 / 24: either side of the prompt schedule;
# where the CPU has AMX (gemv_int8.AMX_ROWS = 16): 16 one tile of x, 17 / 23 / 24 / 32 two, 40 and
# 100 two and a last one
@pytest.mark.parametrize("M", [1, 2, 5, 16, 17, 23, 24, 32, 40, 100])
def test_packed_kernel_gives_the_reference_bits(dtype, M):
    # N = 75 and 130: partial groups and a partial tile (on AMX 5 and 9 groups: a last pair of
    # one); K = 2304: 36 blocks
    for N, K in ((75, 384), (130, 2304)):
        x, qw, b, _ = _operands(dtype, M, N, K, seed=M)
        for bias in (None, b):
            for out_dtype in (None, torch.float32):
                want = gemv_int8.reference_linear(x, qw, bias, out_dtype)
                assert torch.equal(gemv_int8.kernel_linear(x, qw, bias, out_dtype), want)


@pytest.mark.skipif(not gemv_int8.AMX_ROWS, reason="no AMX tiles here: they need AVX-512 VNNI, "
                    "AMX-INT8 and the OS's leave (and not SPECRT_AMX=0)")
def test_amx_tiles_and_vnni_tiles_give_the_same_bits():
    """The same prompt-sized products with AMX (this process) and without (SPECRT_AMX=0 in a
    child process: the switch is read once per process)."""
    script = textwrap.dedent("""
        import sys, torch
        from specrt.kernels.cpu import gemv_int8
        from tests.test_int8_draft import _operands
        assert gemv_int8.AMX_ROWS == 0, gemv_int8.AMX_ROWS
        outs = []
        for M in (16, 40, 100):
            x, qw, b, _ = _operands(torch.bfloat16, M, 130, 2304, seed=M)
            outs.append(gemv_int8.kernel_linear(x, qw, b, torch.float32))
        torch.save(outs, sys.argv[1])
        """)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "vnni.pt"
        subprocess.run([sys.executable, "-c", script, str(path)], check=True, timeout=120,
                       cwd=Path(__file__).parent.parent, env={**os.environ, "SPECRT_AMX": "0"})
        vnni = torch.load(path)
    for M, want in zip((16, 40, 100), vnni):
        x, qw, b, _ = _operands(torch.bfloat16, M, 130, 2304, seed=M)
        assert torch.equal(gemv_int8.kernel_linear(x, qw, b, torch.float32), want), M


@needs_kernel
def test_kernel_refuses_a_weight_in_another_layout():
    x, qw, _, w = _operands(torch.float32, 2, 32, 128)
    other = gemv_int8.quantize(w, packed_rows=16 - gemv_int8.PACK_ROWS)
    with pytest.raises(ValueError, match="packed_rows"):
        gemv_int8.kernel_linear(x, other)
    assert torch.equal(gemv_int8.reference_linear(x, other), gemv_int8.reference_linear(x, qw))


# The quantized kernels: int8 here, int4 (tests/test_int4_draft.py) alike.
KERNELS = pytest.mark.parametrize("kernel", [gemv_int8, pytest.param(gemv_int4, marks=needs_int4)],
                                  ids=["int8", "int4"])


def _quantized(kernel, dtype, M, N, K, seed=0):
    x, _, b, w = _operands(dtype, M, N, K, seed)
    return x, kernel.quantize(w), b


@needs_kernel
@KERNELS
@pytest.mark.parametrize("M", [1, 2, 17, 48])
def test_bf16_outputs_are_the_fp32_outputs_rounded_to_nearest_even(kernel, M):
    """The stores scale, add the bias and round to bf16 as torch rounds the fp32 output."""
    x, qw, b = _quantized(kernel, torch.bfloat16, M, 75, 384, seed=M)
    for bias in (b, None):
        got = kernel.kernel_linear(x, qw, bias)
        want = kernel.kernel_linear(x, qw, bias, torch.float32).bfloat16()
        assert got.dtype == torch.bfloat16 and torch.equal(got, want)


@needs_kernel
@KERNELS
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("M", [1, 2, 3, 7, 17, 40])
def test_kernel_matches_reference(kernel, dtype, M):
    x, qw, b = _quantized(kernel, dtype, M, 75, 384)
    for bias in (None, b):
        for out_dtype in (None, torch.float32):
            want = kernel.reference_linear(x, qw, bias, out_dtype)
            got = kernel.kernel_linear(x, qw, bias, out_dtype)
            assert got.dtype == want.dtype and got.shape == (M, 75)
            # the same integer block dots and scales; fp32 sums in another order (int4, int8 on
            # AVX2), which a bf16 output may round the other way: one ulp, 2^-8 relative
            rtol = 2 ** -7 if (out_dtype or dtype) == torch.bfloat16 else 2e-3
            torch.testing.assert_close(got.float(), want.float(), rtol=rtol, atol=2e-3)


@needs_kernel
@KERNELS
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
# 2: the draft's first forward of a round (whole rows on AVX-512); 101: a catch-up cut into
# passes of <= 48 rows
@pytest.mark.parametrize("M", [2, 9, 101])
def test_kernel_rows_do_not_depend_on_their_neighbours(kernel, dtype, M):
    # K = 2304: whole k-blocks of both kernels (1024 / 2048 values) and a part of one
    x, qw, b = _quantized(kernel, dtype, M, 130, 2304, seed=1)
    together = kernel.kernel_linear(x, qw, b, torch.float32)
    alone = torch.cat([kernel.kernel_linear(x[m:m + 1], qw, b, torch.float32)
                       for m in range(M)])
    assert torch.equal(together, alone)


@needs_kernel
@KERNELS
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("M", [3, 20])          # 20: a prompt's pass (AMX tiles where there)
def test_a_non_finite_input_makes_its_row_nan_as_in_the_reference(kernel, dtype, bad, M):
    """The block maximum (vmaxps) dropped a NaN operand and an infinity gave an infinite scale:
    the kernels turned a NaN row into finite numbers (or +-inf) where the reference gives NaN,
    so a draft gone NaN looked healthy. Every position of a 64-value block is tried (the
    maximum is taken over four vectors, then across lanes)."""
    x, qw, b = _quantized(kernel, dtype, M, 40, 256)
    rest = [m for m in range(M) if m != 1]
    for col in (0, 5, 16, 31, 47, 63, 64 + 17, 255):
        xb = x.clone()
        xb[1, col] = bad
        want = kernel.reference_linear(xb, qw, b, torch.float32)
        got = kernel.kernel_linear(xb, qw, b, torch.float32)
        assert want[1].isnan().all(), col                      # the reference's answer
        assert got[1].isnan().all(), (col, got[1, :4])
        torch.testing.assert_close(got[rest], want[rest], rtol=2e-3, atol=2e-3)


def test_reference_is_close_to_the_float_product():
    x, qw, b, w = _operands(torch.float32, 4, 64, 512, seed=2)
    want = torch.nn.functional.linear(x, w, b)
    got = gemv_int8.reference_linear(x, qw, b)
    assert ((got - want).norm() / want.norm()) < 0.02       # ~1% for int8 weights + activations


@pytest.mark.parametrize("bad", ["K", "dtype", "bias", "scale", "device"])
def test_bad_operands_raise_value_error(bad):
    x, qw, b, _ = _operands(torch.float32, 2, 8, 128)
    if bad == "K":
        for K in (100, 102):          # 102: not even a multiple of 4 (kept row-major)
            w = gemv_int8.quantize(torch.randn(8, K))
            with pytest.raises(ValueError, match="multiple of 64"):
                gemv_int8.linear(torch.randn(2, K), w)
    elif bad == "dtype":
        with pytest.raises(ValueError, match="bfloat16 or float32"):
            gemv_int8.linear(x.double(), qw)
    elif bad == "bias":
        with pytest.raises(ValueError, match="bias"):
            gemv_int8.linear(x, qw, b[:3])
    elif bad == "scale":          # a stride-0 view would be read past its one element
        strided = gemv_int8.Int8Weight(qw.data, qw.scale[:1].expand(8), qw.packed_rows)
        with pytest.raises(ValueError, match="contiguous fp32 scale"):
            gemv_int8.kernel_linear(x, strided)
    else:                         # no pointer of another device may reach the C++ kernel
        off_cpu = gemv_int8.Int8Weight(qw.data, qw.scale.to("meta"), qw.packed_rows)
        with pytest.raises(ValueError, match="on the CPU"):
            gemv_int8.kernel_linear(x, off_cpu)
        with pytest.raises(ValueError, match="bias"):
            gemv_int8.kernel_linear(x, qw, b.to("meta"))


def test_malformed_weights_and_empty_inputs():
    """A hand-built weight of the wrong rank is a ValueError naming it (not an IndexError from
    its shape); no rows in, no rows out, as F.linear; an empty weight cannot be quantized."""
    x, qw, _, _ = _operands(torch.float32, 2, 8, 128)
    for data in (qw.data.reshape(-1), qw.rows()):            # 1-D; 2-D marked as packed
        bad = gemv_int8.Int8Weight(data, qw.scale, 16)
        with pytest.raises(ValueError, match="uint8 data of 4 dims"):
            gemv_int8.linear(x, bad)
    for int4 in (False, True):
        mod = gemv_int4 if int4 else gemv_int8
        w = mod.quantize(torch.randn(8, 128))
        empty = torch.zeros(0, 128)
        for fn in (mod.linear, mod.reference_linear):
            assert fn(empty, w).shape == (0, 8)
            assert fn(torch.zeros(3, 0, 128), w).shape == (3, 0, 8)
        for shape in ((8, 0), (0, 128)):
            with pytest.raises(ValueError, match="non-empty 2-D float tensor"):
                mod.quantize(torch.randn(shape))
    bad4 = gemv_int4.Int4Weight(torch.zeros(8, dtype=torch.uint8), torch.ones(8, 1))
    with pytest.raises(ValueError, match="uint8 data of 2 dims"):
        gemv_int4.linear(x, bad4)


@pytest.fixture(scope="module")
def pair(tiny_noeos_dir, tiny_draft_dir):
    # draft_stop 0: every draft-model round drafts all K the budget has room for (the tiny
    # draft is never sure)
    llms = {q: specrt.LLM(tiny_noeos_dir, draft=tiny_draft_dir, dtype="float32",
                          max_seq_len=256, draft_dtype=q, draft_stop=0.0)
            for q in ("int8", "float32")}
    yield llms
    for llm in llms.values():
        llm.close()


def test_int8_draft_holds_int8_weights(pair):
    draft = pair["int8"].engine.draft
    assert draft.quant == "int8" and isinstance(draft.layers[0].qkv, Int8Linear)
    assert isinstance(draft.lm_head, Int8Linear)
    assert pair["float32"].engine.draft.quant is None
    assert draft.weight_bytes < 0.3 * pair["float32"].engine.draft.weight_bytes


@pytest.mark.parametrize("method", ["draft_model", "auto"])
def test_int8_draft_greedy_equals_plain(pair, method, monkeypatch):
    prompts = [[5, 6, 7, 8], list(range(40, 70)), [250, 3]]
    llm = pair["int8"]
    speculative = {"method": method, "num_speculative_tokens": 4}
    if method == "auto":     # costs where the draft pays: on the real clock auto may not draft
        pin_costs(llm, speculative, monkeypatch)
    plain = [r.token_ids for r in llm.generate(prompts, max_new_tokens=40)]
    spec = llm.generate(prompts, max_new_tokens=40, speculative=speculative)
    assert [r.token_ids for r in spec] == plain
    assert any(plan.startswith("draft_model") for r in spec
               for plan in r.stats["plan_histogram"])          # the int8 draft did draft
    if method == "draft_model":
        assert spec[1].stats["num_draft_tokens"] > 0
        assert spec[1].stats["num_accepted_tokens"] > 0      # the quantized draft still agrees
        assert all(drafted_k_a_round(r.stats, 4) for r in spec)


@pytest.mark.parametrize("value", ["int3", "bfloat16", 8])
def test_bad_draft_dtype_is_one_clear_error(tiny_noeos_dir, value):
    with pytest.raises(ArgumentError, match="draft_dtype"):
        specrt.LLM(tiny_noeos_dir, dtype="float32", draft_dtype=value)


def test_a_float16_pair_keeps_its_draft_unquantized_and_refuses_int8(tiny_noeos_dir,
                                                                     tiny_draft_dir):
    """The int8 / int4 kernels take bfloat16 or float32 activations: with float16, "auto" keeps
    the draft in float16 (it chose int8 and every draft request failed inside the kernel), and
    an explicit int8 is refused before anything loads."""
    llm = specrt.LLM(tiny_noeos_dir, draft=tiny_draft_dir, dtype="float16", max_seq_len=64)
    try:
        assert llm.engine.draft.quant is None
        plain = llm.generate([5, 6, 7], max_new_tokens=8).token_ids
        spec = llm.generate([5, 6, 7], max_new_tokens=8,
                            speculative={"method": "draft_model", "num_speculative_tokens": 3})
        assert spec.token_ids == plain and spec.stats["num_draft_tokens"] > 0
    finally:
        llm.close()
    for fmt in ("int8", "int4"):
        with pytest.raises(ArgumentError, match="bfloat16 or float32 activations"):
            specrt.LLM(tiny_noeos_dir, draft=tiny_draft_dir, dtype="float16", draft_dtype=fmt)


@pytest.mark.parametrize("prompt", [list(range(40, 70)), [*range(40, 60), *range(200, 230)]],
                         ids=["shortlisted ids", "ids past the shortlist"])
def test_draft_vocab_shortlist_keeps_output_exact(tiny_noeos_dir, tiny_draft_dir, prompt):
    """A draft scoring only ids < 100 (and the special tokens) proposes nothing else but the
    ids its request has read, and the target still decides: greedy output equals plain
    decoding."""
    llm = specrt.LLM(tiny_noeos_dir, draft=tiny_draft_dir, dtype="float32", max_seq_len=256,
                     draft_vocab=100)
    try:
        draft = llm.engine.draft
        allowed = set(draft.head_rows.tolist())
        assert set(range(100)) <= allowed and len(allowed) < draft.cfg.vocab_size
        assert draft.lm_head.weight.shape[0] == len(allowed)
        plain = llm.generate(prompt, max_new_tokens=40).token_ids
        run = llm.submit(prompt, max_new_tokens=40,
                         speculative={"method": "draft_model", "num_speculative_tokens": 4})
        proposed = [t for chunk in run.chunks() for t in chunk.step.draft_tokens]
        assert run.result().token_ids == plain
        assert proposed and set(proposed) <= allowed | set(prompt) | set(plain)
    finally:
        llm.close()


@pytest.mark.parametrize("also", [[[250, 120], [300]], [[], [101, 319, 200]], [[150], []]])
def test_a_shortlisted_pass_scores_the_ids_each_row_names_as_the_full_head(tiny_draft_dir,
                                                                           also):
    """`also_score`: a shortlisted model scores row b's ids also[b] too, as the full model
    does, and no other id past its shortlist; in a decode step, a catch-up's last token and a
    padded pass alike."""
    from specrt.model.transformer import Transformer

    rows = list(range(100))
    full = Transformer.from_dir(tiny_draft_dir, "float32", "cpu", 64)
    short = Transformer.from_dir(tiny_draft_dir, "float32", "cpu", 64, head_rows=rows)
    ids = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 0]])
    for kw in (dict(num_valid=[4, 3]), dict(num_valid=[4, 3], last_only=True)):
        want = full.forward(ids, full.new_cache(2, 64), **kw)                 # [2, T, V]
        got = short.forward(ids, short.new_cache(2, 64),
                            also_score=[short.also_scoring(r) for r in also], **kw)
        for b in range(2):
            scored = torch.zeros(want.shape[-1], dtype=torch.bool)
            scored[rows + also[b]] = True
            valid = slice(None) if kw.get("last_only") else slice(0, kw["num_valid"][b])
            torch.testing.assert_close(got[b, valid][:, scored], want[b, valid][:, scored],
                                       rtol=1e-5, atol=1e-5)
            assert torch.isneginf(got[b, valid][:, ~scored]).all()


def test_also_scoring_refuses_ids_outside_the_vocabulary_and_unshortlisted_models(
        tiny_draft_dir):
    from specrt.model.transformer import Transformer

    short = Transformer.from_dir(tiny_draft_dir, "float32", "cpu", 64, head_rows=range(100))
    assert short.also_scoring([]) is None
    cols, w = short.also_scoring([250, 120])
    assert cols.tolist() == [250, 120] and w.shape == (2, short.cfg.hidden_size)
    with pytest.raises(ValueError, match=r"ids \[320\] are not in the vocabulary"):
        short.also_scoring([250, 320])
    full = Transformer.from_dir(tiny_draft_dir, "float32", "cpu", 64)
    with pytest.raises(ValueError, match="no head_rows"):
        full.also_scoring([250])


def test_a_static_drafter_reads_no_ids_past_its_shortlist(tiny_noeos_dir, tiny_draft_dir):
    """With cuda_graphs (run eagerly on the CPU) the draft loop's shapes are fixed: it scores
    its shortlist alone, in its eager rounds too, and names nothing past it."""
    llm = specrt.LLM(tiny_noeos_dir, draft=tiny_draft_dir, dtype="float32", max_seq_len=256,
                     draft_vocab=100, cuda_graphs=True)
    try:
        drafter = llm.engine.draft_drafter
        assert drafter.static and not drafter.reads_ids
        assert list(drafter.past_shortlist([250, 120, 300])) == []
        prompt = [*range(40, 60), *range(200, 230)]
        run = llm.submit(prompt, max_new_tokens=24,
                         speculative={"method": "draft_model", "num_speculative_tokens": 3})
        proposed = {t for chunk in run.chunks() for t in chunk.step.draft_tokens}
        assert run.result().token_ids == llm.generate(prompt, max_new_tokens=24).token_ids
        assert proposed and proposed <= set(llm.engine.draft.head_rows.tolist())
    finally:
        llm.close()


def test_a_shortlisted_draft_scores_what_its_row_read_past_the_shortlist(tiny_noeos_dir,
                                                                        tiny_draft_dir):
    """The eager draft model names, per row, the ids past its shortlist that the row's request
    has read (prompt and answer so far) in order of first use, the same whether the request
    runs alone or beside another; a new request on the row starts from none."""
    llm = specrt.LLM(tiny_noeos_dir, draft=tiny_draft_dir, dtype="float32", max_seq_len=256,
                     draft_vocab=100)
    named = []
    model = llm.engine.draft
    forward = model.forward

    def spy(*args, also_score=None, **kw):
        named.append([r[0].tolist() if r is not None else [] for r in also_score]
                     if also_score is not None else None)
        return forward(*args, also_score=also_score, **kw)

    model.forward = spy
    spec = {"method": "draft_model", "num_speculative_tokens": 3}
    prompts = [[*range(40, 50), 250, 120, 250, 7, 300], [*range(10, 30), 199]]
    shortlist = set(model.head_rows.tolist())
    try:
        alone = []
        for p in prompts:
            named.clear()
            out = llm.generate(p, max_new_tokens=12, speculative=spec).token_ids
            read = list(dict.fromkeys(t for t in p + out if t not in shortlist))
            rows = [r[0] for r in named if r is not None]
            assert rows and all(read[:len(r)] == r for r in rows)      # a prefix, growing
            in_prompt = list(dict.fromkeys(t for t in p if t not in shortlist))
            assert rows[0][:len(in_prompt)] == in_prompt
            alone.append(read)
        named.clear()
        together = llm.generate(prompts, max_new_tokens=12, speculative=spec)
        assert [r.token_ids for r in together] == [
            llm.generate(p, max_new_tokens=12).token_ids for p in prompts]
        # every row names a prefix of one request's own read ids (a request may move rows),
        # never a mix of two
        rows = [r for names in named if names is not None for r in names if r]
        owner = [[b for b in range(2) if alone[b][:len(r)] == r] for r in rows]
        assert rows and all(owner) and {b for o in owner for b in o} == {0, 1}
    finally:
        model.forward = forward
        llm.close()


@pytest.mark.parametrize("start", [0, 1, 2])
def test_hide_unread_hides_each_id_until_the_first_row_that_has_read_it(start):
    """Row j of a pass over text has read text[:start + j + 1]: 8 is read at position 1, 9 at
    2, so each is -inf in the rows before; 5 is not named, so it stays."""
    from specrt.spec.drafters.draft_model import hide_unread

    text = [5, 8, 9, 8, 5]
    scores = torch.zeros(len(text) - start, 10)                                 # [N, V]
    assert hide_unread(scores, text, [8, 9], start) is scores
    for j in range(len(scores)):
        read = set(text[:start + j + 1])
        assert [t for t in range(10) if scores[j, t] == float("-inf")] == [
            t for t in (8, 9) if t not in read]


def test_past_shortlist_names_new_ids_once_in_order_of_first_use(tiny_noeos_dir,
                                                                  tiny_draft_dir):
    llm = specrt.LLM(tiny_noeos_dir, draft=tiny_draft_dir, dtype="float32", max_seq_len=256,
                     draft_vocab=100)
    try:
        drafter = llm.engine.draft_drafter
        read = drafter.past_shortlist([250, 5, 120, 250])
        assert list(read) == [250, 120]
        assert list(drafter.past_shortlist([120, 300, 7, 250, 199], read)) \
            == [250, 120, 300, 199]
        assert list(read) == [250, 120, 300, 199]          # extended in place
    finally:
        llm.close()


def test_draft_head_rows_keep_eos_and_special_ids_past_the_shortlist():
    """The rows a draft scores (as LLM and the benchmarks load it): the first n ids, its EOS
    ids and the tokenizer's special ids, sorted; every id under "auto" for a small vocabulary."""
    from types import SimpleNamespace

    from specrt.spec.drafters.draft_model import SHORTLIST, SHORTLIST_ALONE, draft_head_rows

    tok = SimpleNamespace(special_ids=lambda: [150_000, 151_643, 10**9])   # one out of range
    big = SimpleNamespace(vocab_size=151_936, eos_token_ids=[151_645])
    rows = draft_head_rows(big, tok)
    assert rows == sorted(set(range(SHORTLIST)) | {150_000, 151_643, 151_645})
    # a drafter that reads no ids past its shortlist (a static one) keeps the larger one
    assert SHORTLIST < SHORTLIST_ALONE
    assert draft_head_rows(big, tok, reads_ids=False) == sorted(
        set(range(SHORTLIST_ALONE)) | {150_000, 151_643, 151_645})
    assert draft_head_rows(big, None, n=10) == [*range(10), 151_645]
    assert draft_head_rows(big, tok, n=None) is None
    assert draft_head_rows(SimpleNamespace(vocab_size=320, eos_token_ids=[3]), tok) is None


def test_draft_vocab_auto_keeps_small_vocabularies_whole(pair):
    assert pair["int8"].engine.draft.head_rows is None      # 320 tokens: nothing to cut


def test_calibration_tells_draft_forms_apart(tiny_draft_dir):
    """An int8 draft, a shortlisted one and the plain one cost differently: each gets its own
    calibration entry."""
    from specrt.model.transformer import Transformer
    from specrt.spec.calibration import calibration_key

    forms = [dict(), dict(quant="int8"), dict(head_rows=list(range(100)))]
    keys = {calibration_key(Transformer.from_dir(tiny_draft_dir, "float32", "cpu", 64, **kw), 8)
            for kw in forms}
    assert len(keys) == 3


@pytest.mark.parametrize("rows", [[*range(100), 250, 300, 319], [5, 7, 300], list(range(64))])
def test_a_shortlisted_head_scores_its_rows_as_the_full_head_and_no_others(tiny_draft_dir,
                                                                           rows):
    """The logits of a model scoring only `rows` (a run from id 0 copied as one slice, the
    rest scattered): the full model's at those ids, -inf at every other, in every row of a
    verify-shaped pass."""
    from specrt.model.transformer import Transformer

    full = Transformer.from_dir(tiny_draft_dir, "float32", "cpu", 64)
    short = Transformer.from_dir(tiny_draft_dir, "float32", "cpu", 64, head_rows=rows)
    ids = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
    want = full.forward(ids, full.new_cache(2, 64))                  # [2, 4, V]
    got = short.forward(ids, short.new_cache(2, 64))
    scored = torch.zeros(want.shape[-1], dtype=torch.bool)
    scored[rows] = True
    torch.testing.assert_close(got[..., scored], want[..., scored], rtol=1e-6, atol=1e-6)
    assert torch.isneginf(got[..., ~scored]).all()
