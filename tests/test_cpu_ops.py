"""The per-layer CPU ops (specrt._cpu_ops) against their PyTorch specification
(specrt/model/backends/torch_ref.py), and the property they exist for: a verify pass gives the
bits of the decode steps it replaces."""
import re

import pytest
import torch
import torch.nn.functional as F

from specrt.kernels.cpu import ops as cpu_ops
from specrt.model import Transformer
from specrt.model.backends.torch_ref import apply_rope, rms_norm
from tests.helpers import drafted_k_a_round

needs_kernel = pytest.mark.skipif(not cpu_ops.AVAILABLE,
                                  reason="CPU lacks AVX-512 BF16 and AVX2: the PyTorch path serves")
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


def _reference_attention(qkv, k_cache, v_cache, cos, sin, starts, counts, hq):
    """The PyTorch path of Transformer.forward for the attention block, token by token; qkv
    holds row b's counts[b] tokens after row b - 1's."""
    _, hkv, s, d = k_cache.shape
    k_cache, v_cache = k_cache.clone(), v_cache.clone()
    out = torch.zeros(qkv.shape[0], hq * d, dtype=qkv.dtype)
    m = 0
    for b, (start, n) in enumerate(zip(starts, counts)):
        rows = qkv[m:m + n]
        q, k, v = rows.split([hq * d, hkv * d, hkv * d], dim=-1)
        pos = start + torch.arange(n)                                       # [n]
        c, sn = cos[pos][:, None], sin[pos][:, None]
        q = apply_rope(q.reshape(n, hq, d), c, sn)
        k = apply_rope(k.reshape(n, hkv, d), c, sn)
        k_cache[b, :, pos] = k.transpose(0, 1)
        v_cache[b, :, pos] = v.reshape(n, hkv, d).transpose(0, 1)
        for t in range(n):
            kk = k_cache[b, :, :pos[t] + 1].repeat_interleave(hq // hkv, dim=0)   # [Hq, p, D]
            vv = v_cache[b, :, :pos[t] + 1].repeat_interleave(hq // hkv, dim=0)
            att = F.scaled_dot_product_attention(q[t][:, None], kk, vv)[:, 0]      # [Hq, D]
            out[m + t] = att.reshape(-1)
        m += n
    return out, k_cache, v_cache


def _attention_case(dtype, M, hq, hkv, d, seed=0, S=48):
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(M, (hq + 2 * hkv) * d, generator=g).to(dtype)
    k_cache = torch.randn(4, hkv, S, d, generator=g).to(dtype)     # Bmax = 4 > B; stale data
    v_cache = torch.randn(4, hkv, S, d, generator=g).to(dtype)
    ang = torch.outer(torch.arange(S + 8, dtype=torch.float32), torch.rand(d // 2, generator=g))
    emb = torch.cat([ang, ang], dim=-1)
    return qkv, k_cache, v_cache, emb.cos().to(dtype), emb.sin().to(dtype)


@needs_kernel
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hq, hkv, d, starts, counts", [
    (4, 2, 16, [7], [1]),                # a decode step
    (4, 4, 64, [0], [5]),                # from an empty cache, no grouping
    (6, 2, 24, [10, 3], [3, 1]),         # rows at different positions, of different lengths
    (2, 1, 128, [30, 0, 17], [2, 2, 0]),  # a row with no tokens
    (2, 1, 128, [0, 9, 40], [0, 17, 8]),  # ... first; a verify-sized row; one ending at S
])
def test_rope_attention_matches_reference(dtype, hq, hkv, d, starts, counts):
    B, M = len(starts), sum(counts)
    qkv, kc, vc, cos, sin = _attention_case(dtype, M, hq, hkv, d, seed=M * B + d)
    want, want_k, want_v = _reference_attention(qkv, kc[:B], vc[:B], cos, sin, starts, counts,
                                                hq)
    kc0, vc0 = kc.clone(), vc.clone()
    got = cpu_ops.rope_attention(qkv, kc, vc, cos, sin, torch.tensor(starts),
                                 torch.tensor(counts), hq, d ** -0.5)
    # the cache holds exactly what the reference writes (same roundings), and nothing else moved:
    # not the rest of rows :B (the reference keeps it), nor the rows past B
    assert torch.equal(kc[:B], want_k) and torch.equal(vc[:B], want_v)
    assert torch.equal(kc[B:], kc0[B:]) and torch.equal(vc[B:], vc0[B:])
    torch.testing.assert_close(got.float(), want.float(), **TOL[dtype])


@needs_kernel
@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_attention_tokens_do_not_depend_on_how_many_share_the_call(dtype):
    """A pass of rows of 6 and 3 tokens == one call per token, bit for bit (verify == decode
    steps, and a row's bits do not depend on its neighbours' lengths)."""
    hq, hkv, d = 4, 2, 64
    starts, counts = [9, 20], [6, 3]
    qkv, kc, vc, cos, sin = _attention_case(dtype, sum(counts), hq, hkv, d, seed=5)
    kc2, vc2 = kc.clone(), vc.clone()
    full = cpu_ops.rope_attention(qkv, kc, vc, cos, sin, torch.tensor(starts),
                                  torch.tensor(counts), hq, d ** -0.5)
    for t in range(max(counts)):
        live = [b for b in range(2) if t < counts[b]]
        at = [sum(counts[:b]) + t for b in live]                   # token t of each live row
        one = cpu_ops.rope_attention(qkv[at], kc2, vc2, cos, sin,
                                     torch.tensor([starts[b] + t for b in range(2)]),
                                     torch.tensor([int(b in live) for b in range(2)]), hq,
                                     d ** -0.5)
        assert torch.equal(one, full[at]), f"token {t} differs from its decode step"
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

    # draft_stop 0: every draft-model round verifies all K (the tiny draft is never sure)
    llm = specrt.LLM(tiny_noeos_dir, draft=tiny_draft_dir, dtype="bfloat16", max_seq_len=256,
                     max_batch_size=3, draft_stop=0.0)
    prompts = [[5, 9, 2, 31, 7, 7, 1], [12, 3, 3, 3, 40, 8], [77, 1, 2, 77, 1, 2, 77, 1]]
    plain = [r.token_ids for r in llm.generate(prompts, max_new_tokens=48)]
    for spec in ({"method": "draft_model", "num_speculative_tokens": 4},
                 {"method": "ngram", "num_speculative_tokens": 3},
                 {"method": "auto", "num_speculative_tokens": 8}):
        batch = llm.generate(prompts, max_new_tokens=48, speculative=spec)
        assert [r.token_ids for r in batch] == plain, spec
        singles = [llm.generate(p, max_new_tokens=48, speculative=spec) for p in prompts]
        assert [r.token_ids for r in singles] == plain, spec
        runs = batch + singles
        assert sum(r.stats["num_draft_tokens"] for r in runs) > 0, spec
        if spec["method"] == "draft_model":
            assert all(r.stats["num_drafts"] > 0 for r in runs)
            assert all(drafted_k_a_round(r.stats, 4) for r in runs)


@needs_kernel
def test_a_pass_computes_only_the_real_tokens(tiny_noeos_dir, monkeypatch):
    """Rows of 5, 1 and 0 real tokens in a [3, 5] pass: 6 tokens go through the layers (a
    verify row without drafts costs one), their logits equal the padded-free reference, and
    the padding's logits are zeros."""
    model = Transformer.from_dir(tiny_noeos_dir, dtype="bfloat16", max_seq_len=64)
    model.backend.fused_loop = False     # the per-op loop, whose calls can be counted (the
    # fused C++ loop gives its bits: tests/test_cpu_layers.py)
    ref = Transformer.from_dir(tiny_noeos_dir, dtype="bfloat16", max_seq_len=64,
                               backend="torch_ref")
    seen = []
    real = cpu_ops.rope_attention
    monkeypatch.setattr(cpu_ops, "rope_attention",
                        lambda qkv, *a: seen.append(qkv.shape[0]) or real(qkv, *a))
    ids = torch.tensor([[5, 9, 2, 31, 7], [12, 0, 0, 0, 0], [0] * 5])
    got = model.forward(ids, model.new_cache(3, 16), num_valid=[5, 1, 0])
    want = ref.forward(ids, ref.new_cache(3, 16), num_valid=[5, 1, 0])
    assert set(seen) == {6} and len(seen) == model.cfg.num_layers
    assert got.shape == (3, 5, model.cfg.vocab_size)
    torch.testing.assert_close(got[0], want[0], atol=0.1, rtol=0.05)
    torch.testing.assert_close(got[1, :1], want[1, :1], atol=0.1, rtol=0.05)
    assert not got[1, 1:].any() and not got[2].any()


@needs_kernel
def test_bf16_greedy_output_in_a_batch_wider_than_one_pass_equals_alone(tiny_noeos_dir,
                                                                         tiny_draft_dir,
                                                                         monkeypatch):
    """4 rows x 13 tokens = 52 > 32: the verify pass runs in chunks and its 52 rows of logits
    in one call; every row still gives its own tokens, bit for bit, in bf16."""
    import specrt
    from specrt.model.backends import cpu_native

    # draft_stop 0: every row drafts all 12 (the tiny draft is never sure: with a stop, each
    # row would draft 1 and the pass would be 8 tokens wide)
    llm = specrt.LLM(tiny_noeos_dir, draft=tiny_draft_dir, dtype="bfloat16", max_seq_len=256,
                     max_batch_size=4, draft_stop=0.0)
    prompts = [[5, 9, 2, 31, 7, 7, 1], [12, 3, 3, 3, 40, 8], [77, 1, 2, 77, 1, 2, 77, 1], [4]]
    plain = [llm.generate(p, max_new_tokens=40).token_ids for p in prompts]
    spec = {"method": "draft_model", "num_speculative_tokens": 12}
    passes = []                    # (tokens, chunks) of each pass through the C++ layers
    real = cpu_native.chunks
    monkeypatch.setattr(cpu_native, "chunks", lambda counts, most: passes.append(
        (sum(counts), len(real(counts, most)))) or real(counts, most))
    got = llm.generate(prompts, max_new_tokens=40, speculative=spec)
    assert [r.token_ids for r in got] == plain
    assert (52, 2) in passes, "no 52-token verify pass ran in chunks"
    assert all(drafted_k_a_round(r.stats, 12) for r in got)


def _good_attention(dtype=torch.float32):
    """Valid rope_attention arguments: B = 2 rows of 3 and 2 tokens, Hq = 4, Hkv = 2, D = 16."""
    qkv, kc, vc, cos, sin = _attention_case(dtype, 5, 4, 2, 16)
    return dict(qkv=qkv, k_cache=kc, v_cache=vc, cos=cos, sin=sin, starts=torch.tensor([5, 0]),
                counts=torch.tensor([3, 2]), num_heads=4, scale=0.25)


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
        ("counts", lambda a: torch.tensor([3, 2, 1]), "shape: B from starts"),
        ("counts", lambda a: torch.tensor([[3, 2]]), "shape"),
        ("counts", lambda a: torch.tensor([3, 2, 9, 9])[::2], "strides"),
        ("starts[0], counts[0]", lambda a: torch.tensor([46, 0]), "starts + counts > S"),
        ("starts[1], counts[1]", lambda a: torch.tensor([5, -1]), "negative start"),
        ("qkv", lambda a: {"counts": torch.tensor([3, 3])}, "rows != sum(counts)"),
        ("num_heads", lambda a: 3, "Hq % Hkv != 0"),
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
    assert cpu_ops.rope_attention(**kwargs).shape == (5, 4 * 16)


def test_build_id_names_the_build_or_the_library(monkeypatch):
    if cpu_ops.AVAILABLE:
        assert len(cpu_ops.build_id()) == 16 and cpu_ops.build_id() != "unversioned"
    monkeypatch.setattr(cpu_ops, "AVAILABLE", False)
    assert cpu_ops.build_id() == "library"
    # it names the instructions and the check that exists (it said "check usable()", which
    # the module lacks, and listed the matrix kernels' instructions)
    with pytest.raises(RuntimeError, match=r"_cpu_ops \(AVX-512 or AVX2\) is not built.*"
                                           "check the kernel module's AVAILABLE first"):
        cpu_ops.silu_mul(torch.randn(1, 8))


# --- argmax over logits -----------------------------------------------------------------------

def _argmax_cases() -> list[torch.Tensor]:
    """Rows as a vocabulary's logits can be, and the cases torch.argmax settles by rule: ties
    (the first), NaN (counted largest: the first NaN), all -inf (0), +-0, widths that are not a
    multiple of the 16-lane vector, a maximum in the last (partial) vector."""
    g = torch.Generator().manual_seed(5)
    cases = [torch.randn(r, v, generator=g) * 4
             for r, v in [(1, 151936), (17, 1000), (3, 1), (2, 15), (2, 16), (2, 17), (4, 33)]]
    x = torch.randn(9, 50, generator=g)
    x[0, 7] = x[0, 31] = x[0].max() + 1                          # a tie: the first
    x[1, 30] = x[1, 12] = float("nan")                            # NaN: the first NaN
    x[2] = float("-inf")                                          # nothing finite: 0
    x[3, 40:] = float("-inf")                                     # a shortlist's unscored ids
    x[4] = float("nan")
    x[5] = 0.0
    x[5, 3] = -0.0                                                # +-0 tie: the first
    x[6, 49] = 1e30                                               # in the last, partial vector
    x[7] = float("inf")                                           # inf ties
    x[8, 20] = float("inf")
    x[8, 21] = float("nan")                                       # NaN beats inf
    cases.append(x)
    cases.append(torch.randn(3, 4, 40, generator=g)[:, 1])        # rows 160 floats apart
    cases.append(torch.randn(2, 3, 70, generator=g))              # [..., V]: two leading dims
    return cases


@needs_kernel
@pytest.mark.parametrize("x", _argmax_cases(), ids=lambda x: "x".join(map(str, x.shape)))
def test_argmax_gives_torch_argmax_indices(x):
    got = cpu_ops.argmax(x)
    assert got.dtype == torch.int64 and got.shape == x.shape[:-1]
    assert torch.equal(got, x.argmax(dim=-1))


@needs_kernel
@pytest.mark.parametrize("x, what", [
    (torch.randn(2, 8).bfloat16(), "dtype"),
    (torch.randn(2, 0), "no values"),
    (torch.tensor(1.0), "no dim"),
    ([1.0, 2.0], "not a tensor"),
])
def test_argmax_refuses_what_it_does_not_serve(x, what):
    with pytest.raises(ValueError, match=r"^argmax: x must be a CPU fp32 tensor \[\.\.\., V\] with V >= 1, got "):
        cpu_ops.argmax(x)


@needs_kernel
def test_argmax_of_zero_rows_is_empty():
    assert cpu_ops.argmax(torch.empty(0, 7)).shape == (0,)


def test_greedy_choices_take_the_kernel_on_the_cpu_and_torch_when_forced(monkeypatch):
    """`specrt.kernels.argmax` (greedy verification, plain steps, the draft's guesses) runs the
    C++ kernel for fp32 CPU rows where it is built, and torch.argmax under
    SPECRT_KERNELS=reference: the same indices either way."""
    from specrt.kernels import argmax, dispatch, greedy_accept

    g = torch.Generator().manual_seed(3)
    logits = torch.randn(2, 5, 300, generator=g)                          # [B, K + 1, V]
    target = logits.argmax(dim=-1)                                        # [B, K + 1]
    drafts = target[:, :-1].clone()
    drafts[1, 2] = (drafts[1, 2] + 1) % 300                               # row 1: rejected at 2
    calls = []
    monkeypatch.setattr(dispatch.cpu_ops, "argmax",
                        lambda x, real=dispatch.cpu_ops.argmax: calls.append(x.shape) or real(x))
    for forced in ("", "reference"):
        monkeypatch.setenv("SPECRT_KERNELS", forced)
        calls.clear()
        n, out = greedy_accept(logits, drafts)
        assert n.tolist() == [4, 2]
        assert torch.equal(out[0], target[0]) and out[1, :3].tolist() == target[1, :3].tolist()
        assert torch.equal(argmax(logits[:, 0]), target[:, 0])
        assert len(calls) == (2 if cpu_ops.AVAILABLE and not forced else 0)
