"""The per-layer CPU ops (specrt._cpu_ops) against their PyTorch specification
(specrt/model/backends/torch_ref.py), and the property they exist for: a verify pass gives the bits of the decode steps it replaces."""
import re

import pytest
import torch
import torch.nn.functional as F

from specrt.kernels.cpu import ops as cpu_ops
from specrt.model import Transformer
from specrt.model.backends.torch_ref import apply_rope, rms_norm

needs_kernel = pytest.mark.skipif(not cpu_ops.AVAILABLE,
                                  reason="CPU lacks AVX-512 BF16: the PyTorch path serves")
# Per-dtype tolerances: fp32 differs from PyTorch only in summation order; bf16 may round one
# step to the neighbouring bf16 value (a relative step of 2^-8).
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=1.6e-2, atol=1e-2)}
DTYPES = [torch.float32, torch.bfloat16]


def test_extension_is_built():
    # make test always builds it; without it decode loses its fused path and bf16 exactness
    assert cpu_ops._cpu_ops is not None


@needs_kernel
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m, h", [(1, 64), (3, 40), (17, 1536), (2, 100)])
def test_rms_norm_and_residual_add_match_reference(dtype, m, h):
    g = torch.Generator().manual_seed(m * 100 + h)
    x = (torch.randn(m, h, generator=g) * 3).to(dtype)
    y = torch.randn(m, h, generator=g).to(dtype)
    w = (1 + 0.1 * torch.randn(h, generator=g)).to(dtype)
    torch.testing.assert_close(cpu_ops.rms_norm(x, w, 1e-6).float(),
                               rms_norm(x, w, 1e-6).float(), **TOL[dtype])
    x2 = x.clone()
    out = cpu_ops.add_rms_norm(x2, y, w, 1e-6)
    assert torch.equal(x2, x + y), "the residual add must round exactly like x + y"
    torch.testing.assert_close(out.float(), rms_norm(x + y, w, 1e-6).float(), **TOL[dtype])


@needs_kernel
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m, i", [(1, 64), (5, 24), (9, 8960)])
def test_silu_mul_matches_reference(dtype, m, i):
    g = torch.Generator().manual_seed(m + i)
    gu = (torch.randn(m, 2 * i, generator=g) * 4).to(dtype)
    gu[0, :3] = torch.tensor([-100.0, 100.0, 0.0], dtype=dtype)        # exp's clamps and zero
    gate, up = gu.chunk(2, dim=-1)
    torch.testing.assert_close(cpu_ops.silu_mul(gu).float(), (F.silu(gate) * up).float(),
                               **TOL[dtype])


def _reference_attention(qkv, k_cache, v_cache, cos, sin, starts, valid, T, hq):
    """The PyTorch path of Transformer.forward for the attention block, row by row."""
    _, hkv, s, d = k_cache.shape
    B = len(starts)
    k_cache, v_cache = k_cache.clone(), v_cache.clone()
    q, k, v = qkv.view(B, T, -1).split([hq * d, hkv * d, hkv * d], dim=-1)
    pos = torch.tensor(starts)[:, None] + torch.arange(T)                  # [B, T]
    c, sn = cos[pos][:, :, None], sin[pos][:, :, None]
    q = apply_rope(q.reshape(B, T, hq, d), c, sn)
    k = apply_rope(k.reshape(B, T, hkv, d), c, sn)
    v = v.reshape(B, T, hkv, d)
    for b in range(B):
        for t in range(valid[b]):
            k_cache[b, :, pos[b, t]] = k[b, t]
            v_cache[b, :, pos[b, t]] = v[b, t]
    out = torch.zeros(B, T, hq, d, dtype=qkv.dtype)
    for b in range(B):
        for t in range(T):
            n = pos[b, t] + 1
            kk = k_cache[b, :, :n].repeat_interleave(hq // hkv, dim=0)      # [Hq, n, D]
            vv = v_cache[b, :, :n].repeat_interleave(hq // hkv, dim=0)
            out[b, t] = F.scaled_dot_product_attention(q[b, t][:, None], kk, vv)[:, 0]
    return out.reshape(B * T, hq * d), k_cache, v_cache


def _attention_case(dtype, B, T, hq, hkv, d, starts, seed=0, S=48):
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(B * T, (hq + 2 * hkv) * d, generator=g).to(dtype)
    k_cache = torch.randn(4, hkv, S, d, generator=g).to(dtype)     # Bmax = 4 > B; stale data
    v_cache = torch.randn(4, hkv, S, d, generator=g).to(dtype)
    ang = torch.outer(torch.arange(S + 8, dtype=torch.float32), torch.rand(d // 2, generator=g))
    emb = torch.cat([ang, ang], dim=-1)
    return qkv, k_cache, v_cache, emb.cos().to(dtype), emb.sin().to(dtype)


@needs_kernel
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B, T, hq, hkv, d, starts, valid", [
    (1, 1, 4, 2, 16, [7], [1]),              # a decode step
    (1, 5, 4, 4, 64, [0], [5]),              # from an empty cache, no grouping
    (2, 3, 6, 2, 24, [10, 3], [3, 1]),       # rows at different positions, one padded
    (3, 2, 2, 1, 128, [30, 0, 17], [2, 2, 0]),
])
def test_rope_attention_matches_reference(dtype, B, T, hq, hkv, d, starts, valid):
    qkv, kc, vc, cos, sin = _attention_case(dtype, B, T, hq, hkv, d, starts, seed=B * T + d)
    want, want_k, want_v = _reference_attention(qkv, kc[:B], vc[:B], cos, sin, starts, valid,
                                                T, hq)
    got = cpu_ops.rope_attention(qkv, kc, vc, cos, sin, torch.tensor(starts), torch.tensor(valid),
                                 T, hq, d ** -0.5)
    # the cache holds exactly what the reference writes (same roundings), and nothing else moved
    assert torch.equal(kc[:B], want_k) and torch.equal(vc[:B], want_v)
    for b in range(B):     # padded rows' outputs are meaningless: compare the valid ones
        rows = slice(b * T, b * T + valid[b])
        torch.testing.assert_close(got[rows].float(), want[rows].float(), **TOL[dtype])


@needs_kernel
@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_attention_rows_do_not_depend_on_how_many_share_the_call(dtype):
    """T rows in one call == T calls of one row each, bit for bit (verify == decode steps)."""
    B, T, hq, hkv, d = 2, 6, 4, 2, 64
    starts = [9, 20]
    qkv, kc, vc, cos, sin = _attention_case(dtype, B, T, hq, hkv, d, starts, seed=5)
    kc2, vc2 = kc.clone(), vc.clone()
    full = cpu_ops.rope_attention(qkv, kc, vc, cos, sin, torch.tensor(starts),
                                  torch.tensor([T, T]), T, hq, d ** -0.5)
    for t in range(T):
        rows = qkv.view(B, T, -1)[:, t].contiguous()
        one = cpu_ops.rope_attention(rows, kc2, vc2, cos, sin, torch.tensor(starts) + t,
                                     torch.tensor([1, 1]), 1, hq, d ** -0.5)
        assert torch.equal(one, full.view(B, T, -1)[:, t]), f"row {t} differs from its decode step"
    assert torch.equal(kc, kc2) and torch.equal(vc, vc2)


@needs_kernel
@pytest.mark.parametrize("dtype", DTYPES)
def test_model_verify_pass_equals_decode_steps_bitwise(tiny_noeos_dir, dtype):
    """The whole forward: logits of a K + 1-token verify pass are the logits of the K + 1 decode
    steps it stands for, bit for bit, in bf16 as in fp32. This is what keeps greedy speculative
    output equal to plain greedy output in bf16."""
    model = Transformer.from_dir(tiny_noeos_dir, dtype=dtype, max_seq_len=64)
    prompt = torch.tensor([[5, 9, 2, 31, 7, 7, 1]])
    new = torch.tensor([[4, 18, 3, 3, 40]])
    a, b = model.new_cache(1, 64), model.new_cache(1, 64)
    model.forward(prompt, a)
    model.forward(prompt, b)
    verify = model.forward(new, a)                                            # [1, 5, V]
    steps = torch.cat([model.forward(new[:, t:t + 1], b) for t in range(new.shape[1])], dim=1)
    assert torch.equal(verify, steps)


@needs_kernel
def test_cpu_native_backend_agrees_with_the_reference_backend(tiny_noeos_dir):
    """The reference backend (no extension, or another CPU) stays a working specification:
    the same weights loaded under each backend give the same logits on the same inputs."""
    prompt, new = torch.tensor([[5, 9, 2, 31, 7]]), torch.tensor([[4, 18, 3]])
    outs = []
    for backend in ("cpu_native", "torch_ref"):
        model = Transformer.from_dir(tiny_noeos_dir, dtype="float32", max_seq_len=64,
                                     backend=backend)
        assert model.backend.name == backend
        cache = model.new_cache(1, 64)
        model.forward(prompt, cache)
        outs.append(torch.cat([model.forward(new, cache), model.forward(new[:, :1], cache)], 1))
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-5)


@needs_kernel
def test_bf16_greedy_speculative_output_equals_plain(tiny_noeos_dir, tiny_draft_dir):
    """The product-level promise in bf16: every drafter, batch 1 and 3, token for token."""
    import specrt

    llm = specrt.LLM(tiny_noeos_dir, draft=tiny_draft_dir, dtype="bfloat16", max_seq_len=256,
                     max_batch_size=3)
    prompts = [[5, 9, 2, 31, 7, 7, 1], [12, 3, 3, 3, 40, 8], [77, 1, 2, 77, 1, 2, 77, 1]]
    plain = [r.token_ids for r in llm.generate(prompts, max_new_tokens=48)]
    for spec in ({"method": "draft_model", "num_speculative_tokens": 4},
                 {"method": "ngram", "num_speculative_tokens": 3},
                 {"method": "auto", "num_speculative_tokens": 8}):
        assert [r.token_ids for r in llm.generate(prompts, max_new_tokens=48,
                                                  speculative=spec)] == plain, spec
        for p, want in zip(prompts, plain):
            assert llm.generate(p, max_new_tokens=48, speculative=spec).token_ids == want, spec


def _good_attention(dtype=torch.float32):
    """Valid rope_attention arguments: B = 2 rows of T = 3 tokens, Hq = 4, Hkv = 2, D = 16."""
    qkv, kc, vc, cos, sin = _attention_case(dtype, 2, 3, 4, 2, 16, [5, 0])
    return dict(qkv=qkv, k_cache=kc, v_cache=vc, cos=cos, sin=sin, starts=torch.tensor([5, 0]),
                valid=torch.tensor([3, 2]), tokens=3, num_heads=4, scale=0.25)


def _bad_calls():
    """(function, kwargs, the argument named in the error) for each way of being wrong."""
    x, w = torch.randn(3, 64), torch.randn(64)
    gu = torch.randn(3, 48)
    strided = torch.randn(64, 3).t()                        # [3, 64], not contiguous
    cases = [
        (cpu_ops.rms_norm, dict(x=x, weight=torch.randn(63), eps=1e-6), "weight"),   # shape
        (cpu_ops.rms_norm, dict(x=x, weight=w.bfloat16(), eps=1e-6), "weight"),      # dtype
        (cpu_ops.rms_norm, dict(x=x.half(), weight=w.half(), eps=1e-6), "x"),        # dtype
        (cpu_ops.rms_norm, dict(x=strided, weight=w, eps=1e-6), "x"),                # strides
        (cpu_ops.rms_norm, dict(x=x[0], weight=w, eps=1e-6), "x"),                   # rank
        (cpu_ops.add_rms_norm, dict(x=x, y=torch.randn(2, 64), weight=w, eps=1e-6), "y"),
        (cpu_ops.add_rms_norm, dict(x=x, y=x.bfloat16(), weight=w, eps=1e-6), "y"),
        (cpu_ops.add_rms_norm, dict(x=x, y=strided, weight=w, eps=1e-6), "y"),
        (cpu_ops.add_rms_norm, dict(x=x, y=x.clone(), weight=w[::2], eps=1e-6), "weight"),
        (cpu_ops.silu_mul, dict(gate_up=torch.randn(3, 47)), "gate_up"),             # odd width
        (cpu_ops.silu_mul, dict(gate_up=gu.to(torch.int32)), "gate_up"),
        (cpu_ops.silu_mul, dict(gate_up=torch.randn(48, 3).t()), "gate_up"),
        (cpu_ops.silu_mul, dict(gate_up=gu.numpy()), "gate_up"),                     # not a tensor
    ]
    for name, bad, what in [
        ("qkv", lambda a: a["qkv"][:, :-1], "shape"),
        ("qkv", lambda a: a["qkv"].bfloat16(), "dtype"),
        ("qkv", lambda a: a["qkv"].t().contiguous().t(), "strides"),
        ("k_cache", lambda a: {"k_cache": a["k_cache"][:1], "v_cache": a["v_cache"][:1]},
         "Bmax < B"),
        ("k_cache", lambda a: a["k_cache"].transpose(2, 3).contiguous().transpose(2, 3), "strides"),
        ("v_cache", lambda a: a["v_cache"][:, :, :-1], "shape"),
        ("v_cache", lambda a: a["v_cache"].double(), "dtype"),
        ("cos", lambda a: a["cos"][:, :8], "shape"),
        ("sin", lambda a: a["sin"].bfloat16(), "dtype"),
        ("sin", lambda a: a["sin"].t().contiguous().t(), "strides"),
        ("starts", lambda a: a["starts"].int(), "dtype"),
        ("starts", lambda a: torch.tensor([[5, 0]]), "shape"),
        ("valid", lambda a: torch.tensor([3, 2, 1]), "shape: B from starts"),
        ("valid", lambda a: torch.tensor([[3, 2]]), "shape"),
        ("valid", lambda a: torch.tensor([3, 2, 9, 9])[::2], "strides"),
        ("starts[0], valid[0]", lambda a: torch.tensor([46, 0]), "starts + valid > S"),
        ("starts[1], valid[1]", lambda a: torch.tensor([5, -1]), "negative start"),
        ("num_heads", lambda a: 3, "Hq % Hkv != 0"),
        ("tokens", lambda a: 0, "no tokens"),
    ]:
        kwargs = _good_attention()
        change = bad(kwargs)
        kwargs.update(change if isinstance(change, dict) else {name.split("[")[0]: change})
        cases.append((cpu_ops.rope_attention, kwargs, name))
    return cases


@needs_kernel
@pytest.mark.parametrize("fn, kwargs, arg", _bad_calls(),
                         ids=lambda v: getattr(v, "__name__", None) if callable(v) else None)
def test_bad_arguments_raise_value_error_naming_them(fn, kwargs, arg):
    """The C++ side trusts its pointers: every wrong tensor must stop in the wrapper."""
    with pytest.raises(ValueError, match=rf"^{fn.__name__}: {re.escape(arg)} must be .*, got "):
        fn(**kwargs)


@needs_kernel
def test_good_attention_arguments_pass_the_checks():
    """The valid case the bad ones are derived from runs (so each failure above is its own)."""
    kwargs = _good_attention()
    assert cpu_ops.rope_attention(**kwargs).shape == (6, 4 * 16)


def test_build_id_names_the_build_or_the_library(monkeypatch):
    if cpu_ops.AVAILABLE:
        assert len(cpu_ops.build_id()) == 16 and cpu_ops.build_id() != "unversioned"
    monkeypatch.setattr(cpu_ops, "AVAILABLE", False)
    assert cpu_ops.build_id() == "library"
    with pytest.raises(RuntimeError, match="check usable"):
        cpu_ops.silu_mul(torch.randn(1, 8))
