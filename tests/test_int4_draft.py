"""The int4 draft: its packing, its reference, and exactness of speculation with it (its kernel
against its reference: tests/test_int8_draft.py, the same tests for both kernels; the fused
layer loop: tests/test_cpu_layers.py)."""
import pytest
import torch

import specrt
from specrt.errors import ConfigError
from specrt.kernels.cpu import gemv_int4
from specrt.model.backends.quantized import Int4Linear
from tests.helpers import drafted_k_a_round, pin_costs


def _operands(dtype, M, N, K, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(N, K, generator=g).to(dtype)
    x = (3 * torch.randn(M, K, generator=g)).to(dtype)
    b = torch.randn(N, generator=g).to(dtype)
    return x, gemv_int4.quantize(w), b, w


def test_packing_puts_value_t_and_64_plus_t_in_one_byte():
    """Values already on the int4 grid (scale 1) come back exactly, stored as documented."""
    g = torch.Generator().manual_seed(0)
    w = torch.randint(-7, 8, (3, 256), generator=g).float()
    w[:, ::64] = 7.0                         # every group's max|w| is 7: scale 1 is a candidate
    q = gemv_int4.quantize(w)
    assert q.data.shape == (3, 128) and q.scale.shape == (3, 4) and q.shape == (3, 256)
    assert torch.equal(q.scale, torch.ones(3, 4))
    assert torch.equal(gemv_int4.dequantize(q), w)
    chunk = w[1, 128:256] + 8                # row 1, second chunk
    byte = q.data[1, 64:128]
    assert torch.equal((byte & 0x0F).float(), chunk[:64])
    assert torch.equal((byte >> 4).float(), chunk[64:])


def test_groups_are_symmetric_and_round_trip_within_half_a_step():
    """Each group of 64: scale max|group| / 7, values -7..7, every value back within half a
    step; an all-zero group keeps scale 0."""
    w = torch.randn(16, 512, generator=torch.Generator().manual_seed(1))
    w[2, 64:128] = 0.0
    q = gemv_int4.quantize(w)
    groups = w.view(16, 8, 64)
    torch.testing.assert_close(q.scale, groups.abs().amax(-1) / 7)
    values = torch.cat([q.data & 0x0F, q.data >> 4], dim=1).float() - 8
    assert values.abs().max() == 7
    err = (gemv_int4.dequantize(q).view(16, 8, 64) - groups).abs().amax(-1)
    assert (err <= q.scale / 2 + 1e-6).all()
    assert q.scale[2, 1] == 0 and (gemv_int4.dequantize(q)[2, 64:128] == 0).all()


def test_reference_is_close_to_the_float_product():
    x, qw, b, w = _operands(torch.float32, 4, 64, 512, seed=2)
    want = torch.nn.functional.linear(x, w, b)
    got = gemv_int4.reference_linear(x, qw, b)
    # ~9% for 4-bit Gaussian weights (int8: ~1%); LLM weights are heavier-tailed per row than
    # per group, which is what the group scales are for
    assert ((got - want).norm() / want.norm()) < 0.12


def test_bad_operands_raise_value_error():
    x, qw, b, _ = _operands(torch.float32, 2, 8, 128)
    with pytest.raises(ValueError, match="multiple of 128"):
        gemv_int4.quantize(torch.randn(8, 192))
    with pytest.raises(ValueError, match="bfloat16 or float32"):
        gemv_int4.linear(x.double(), qw)
    with pytest.raises(ValueError, match="bias"):
        gemv_int4.linear(x, qw, b[:3])
    with pytest.raises(ValueError, match=r"\[\.\.\., 128\]"):
        gemv_int4.linear(torch.randn(2, 64), qw)


@pytest.fixture(scope="module")
def llm4(tiny128_dir, tiny128_draft_dir):
    # draft_stop 0: every draft-model round drafts all K the budget has room for (the tiny
    # draft is never sure)
    llm = specrt.LLM(tiny128_dir, draft=tiny128_draft_dir, dtype="bfloat16", max_seq_len=256,
                     draft_dtype="int4", draft_stop=0.0)
    yield llm
    llm.close()


def test_int4_draft_holds_int4_weights(llm4):
    draft = llm4.engine.draft
    assert draft.quant == "int4" and isinstance(draft.layers[0].qkv, Int4Linear)
    assert isinstance(draft.lm_head, Int4Linear)
    # same shapes as the bf16 target: 0.5 + 4 / 64 bytes a weight against 2 (int8: ~1 against 2)
    assert draft.weight_bytes < 0.3 * llm4.target.weight_bytes


@pytest.mark.parametrize("method", ["draft_model", "auto"])
def test_int4_draft_greedy_equals_plain(llm4, method, monkeypatch):
    prompts = [[5, 6, 7, 8], list(range(40, 70)), [250, 3]]
    speculative = {"method": method, "num_speculative_tokens": 4}
    if method == "auto":     # costs where the draft pays: on the real clock auto may not draft
        pin_costs(llm4, speculative, monkeypatch)
    plain = [r.token_ids for r in llm4.generate(prompts, max_new_tokens=40)]
    spec = llm4.generate(prompts, max_new_tokens=40, speculative=speculative)
    assert [r.token_ids for r in spec] == plain
    assert any(plan.startswith("draft_model") for r in spec
               for plan in r.stats["plan_histogram"])          # the int4 draft did draft
    if method == "draft_model":
        assert spec[1].stats["num_draft_tokens"] > 0
        assert spec[1].stats["num_accepted_tokens"] > 0      # the quantized draft still agrees
        assert all(drafted_k_a_round(r.stats, 4) for r in spec)


def test_int4_on_a_model_it_cannot_hold_is_one_clear_error(tiny_noeos_dir, tiny_draft_dir):
    """Hidden size 64: not a multiple of 128, but of int8's 64, so int8 is offered; a 32-wide
    one fits neither, and int8 said to load it in int8."""
    with pytest.raises(ConfigError, match="multiples of 128.*load it unquantized or in int8$"):
        specrt.LLM(tiny_noeos_dir, draft=tiny_draft_dir, dtype="float32", draft_dtype="int4")
    from specrt.model.backends.quantized import quantized_linear

    for fmt in ("int8", "int4"):
        with pytest.raises(ConfigError, match="32-wide projection: load it unquantized$"):
            quantized_linear(fmt, torch.zeros(64, 32))


def test_calibration_tells_int4_from_int8(tiny128_draft_dir):
    from specrt.model.transformer import Transformer
    from specrt.spec.calibration import calibration_key

    keys = {calibration_key(Transformer.from_dir(tiny128_draft_dir, "bfloat16", "cpu", 64,
                                                 quant=q), 8) for q in (None, "int8", "int4")}
    assert len(keys) == 3
