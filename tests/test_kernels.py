"""Kernel-vs-reference tests for specrt.kernels, plus hand-built and statistical checks.

On CPU the Triton kernels run under the interpreter (tests/session.py sets
TRITON_INTERPRET=1), which is slow: shapes are small and the parametrizations cover each
value of each axis rather than their product. The interpreter's bf16 arithmetic is wrong,
so bf16 cases run on CUDA only. On a GPU the same tests run the compiled kernels.
"""
import importlib
import math

import pytest
import torch

import specrt.kernels as kernels
from specrt.kernels import reference, reference_layer
from tests.kernel_cases import CUDA, DEVICE, TOL, needs_cuda_bf16

# the kernels under test are Triton's (under TRITON_INTERPRET=1 on a CPU): an install without
# triton (`pip install 'specrt[test]'` on a CPU-only torch) skips them instead of erroring
pytest.importorskip("triton", reason="the Triton kernels' tests need triton "
                    "(pip install 'specrt[cuda]')")
dispatch = importlib.import_module("specrt.kernels.dispatch")
attention_kernel = importlib.import_module("specrt.kernels.triton.verify_attention")
acceptance_kernel = importlib.import_module("specrt.kernels.triton.acceptance")
rms_kernel = importlib.import_module("specrt.kernels.triton.add_rms_norm")
silu_kernel = importlib.import_module("specrt.kernels.triton.silu_mul")

SMALL_SPLIT = {"split_size": 256, "block_v": 128}  # several V-splits and blocks at V ~ 1000
# Equal maxima in the same lane of different blocks, in different lanes and in different
# V-splits, for both the default (8192 / 1024) and SMALL_SPLIT tilings: the answer is 2.
TIE_V, TIES = 2100, [2050, 1026, 700, 300, 131, 130, 2]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator(device=DEVICE).manual_seed(seed)


# ---------------------------------------------------------------------------------------------
# verify_attention


def _attention_inputs(B, T, Hq, Hkv, D, S, dtype, seed, strided_q=False):
    g = _gen(seed)
    if strided_q:  # q as a view into a fused projection: non-trivial head/token strides
        q = torch.randn(B, T, Hq, 2 * D, generator=g, device=DEVICE).to(dtype)[..., :D]
    else:
        q = torch.randn(B, T, Hq, D, generator=g, device=DEVICE).to(dtype)
    k = torch.randn(B, Hkv, S, D, generator=g, device=DEVICE).to(dtype)
    v = torch.randn(B, Hkv, S, D, generator=g, device=DEVICE).to(dtype)
    lens = torch.randint(T, S + 1, (B,), generator=g, device=DEVICE, dtype=torch.int32)
    lens[0] = T  # a row whose whole history is the T new tokens
    # Stale slots past lens (rolled-back drafts) hold large values that must be ignored.
    stale = torch.arange(S, device=DEVICE).view(1, 1, S, 1) >= lens.view(B, 1, 1, 1)
    k.masked_fill_(stale, 300.0)
    v.masked_fill_(stale, -300.0)
    return q, k, v, lens


# (B, T, Hq, Hkv, D, S_max, dtype, split_keys, scale, strided_q); split_keys None: one split
ATTENTION_CASES = [
    (1, 1, 2, 2, 64, 64, torch.float32, None, None, False),
    (3, 1, 6, 2, 64, 80, torch.float16, 64, None, False),      # 2 splits
    (3, 2, 6, 2, 64, 80, torch.float32, None, None, True),
    (1, 2, 2, 2, 64, 96, torch.float16, 64, 0.3, False),
    (3, 5, 6, 2, 64, 100, torch.float32, 32, None, False),     # 4 splits
    (3, 5, 2, 2, 64, 72, torch.float16, None, None, True),
    (3, 9, 6, 2, 64, 100, torch.float16, 64, None, False),
    (1, 9, 2, 2, 64, 64, torch.float32, 32, None, False),
    (2, 17, 8, 1, 64, 80, torch.float32, 32, None, False),     # T * G = 136: three M tiles
    (2, 5, 6, 2, 128, 72, torch.float16, 64, None, False),     # D = 128
]


@pytest.mark.parametrize("B,T,Hq,Hkv,D,S,dtype,split_keys,scale,strided_q", ATTENTION_CASES)
def test_verify_attention_matches_reference(B, T, Hq, Hkv, D, S, dtype, split_keys, scale,
                                            strided_q):
    q, k, v, lens = _attention_inputs(B, T, Hq, Hkv, D, S, dtype, seed=B * 100 + T,
                                      strided_q=strided_q)
    out = attention_kernel.verify_attention(q, k, v, lens, scale, split_keys=split_keys)
    ref = reference.verify_attention(q, k, v, lens, scale)
    assert out.shape == (B, T, Hq, D) and out.dtype == dtype
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(out.float(), ref.float(), atol=atol, rtol=rtol)


def test_verify_attention_reference_matches_per_query_softmax():
    """The reference itself against a literal per-row, per-head loop (the spec)."""
    B, T, Hq, Hkv, D, S = 2, 3, 4, 2, 64, 20
    q, k, v, lens = _attention_inputs(B, T, Hq, Hkv, D, S, torch.float32, seed=7)
    out = reference.verify_attention(q, k, v, lens)
    for b in range(B):
        for t in range(T):
            pos = int(lens[b]) - T + t
            for h in range(Hq):
                kv = h // (Hq // Hkv)
                w = torch.softmax(k[b, kv, : pos + 1] @ q[b, t, h] / D**0.5, dim=0)
                torch.testing.assert_close(out[b, t, h], w @ v[b, kv, : pos + 1],
                                           atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("split_keys", [None, 32])
def test_verify_attention_row_bits_do_not_depend_on_T(split_keys):
    """Batch invariance: the query at position p gets the same bits whether it is decoded alone
    (T = 1) or verified as row t of a T-token pass, with one split or several (the splits sit
    at fixed key positions, not at positions derived from lens)."""
    B, T, Hq, Hkv, D, S = 2, 6, 6, 2, 64, 96
    q, k, v, lens = _attention_inputs(B, T, Hq, Hkv, D, S, torch.float32, seed=3)
    full = attention_kernel.verify_attention(q, k, v, lens, split_keys=split_keys)
    for t in range(T):
        alone = attention_kernel.verify_attention(q[:, t:t + 1].contiguous(), k, v,
                                                  lens - (T - 1 - t), split_keys=split_keys)
        assert torch.equal(alone[:, 0], full[:, t]), f"row {t} differs from its decode step"


def test_verify_attention_splits_past_the_last_key_do_no_work_and_leave_tickets_zero():
    """A cache far longer than the rows' histories: the splits past a row's last key return at
    once and the live ones merge (the ticket counts live splits only). Wrong counting would leave
    a tile unmerged (or a ticket above zero, breaking the next launch), so the kernel runs twice
    and the ticket buffer must be zero after each launch."""
    from specrt.kernels.triton.tickets import ticket_buffer
    B, T, Hq, Hkv, D, S = 2, 3, 4, 2, 64, 512                     # 16 splits of 32 keys
    q, k, v, _ = _attention_inputs(B, T, Hq, Hkv, D, S, torch.float32, seed=12)
    for lens in ([T, 70], [40, 33]):                              # 1 + 3 and 2 + 2 live splits
        lens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
        out = attention_kernel.verify_attention(q, k, v, lens, split_keys=32)
        torch.testing.assert_close(out, reference.verify_attention(q, k, v, lens),
                                   atol=1e-4, rtol=1e-4)
        assert not ticket_buffer(q.device, 1).any()


def test_verify_attention_with_lens_past_the_cache_leaves_no_ticket_taken():
    """lens[b] > S_max is checked on CPU tensors but not on CUDA (it would need a host sync):
    such a launch must still reset its tickets, which every later split launch (attention and
    matmul) shares. Launched here past the check, then a split matmul must be right."""
    from specrt.kernels.triton.tickets import ticket_buffer
    mm = importlib.import_module("specrt.kernels.triton.matmul")
    B, T, Hq, Hkv, D, S = 1, 1, 2, 2, 64, 64                      # 2 splits of 32 keys
    q, k, v, _ = _attention_inputs(B, T, Hq, Hkv, D, S, torch.float32, seed=13)
    attention_kernel._launch(q, k, v, torch.tensor([70], dtype=torch.int32, device=DEVICE),
                             torch.empty_like(q), T, Hq // Hkv, None, 32, False)
    assert not ticket_buffer(q.device, 1).any()
    x, w = torch.randn(1, 256, device=DEVICE), torch.randn(40, 256, device=DEVICE)
    torch.testing.assert_close(mm.matmul(x, w, split_blocks=2), x @ w.T, atol=1e-3, rtol=1e-4)


def test_verify_attention_rejects_head_dims_the_compile_check_does_not_cover():
    q, k, v, lens = _attention_inputs(1, 1, 2, 2, 32, 8, torch.float32, seed=0)
    with pytest.raises(ValueError, match="head dim"):
        attention_kernel.verify_attention(q, k, v, lens)


# Each launcher fed one bad input, all in one `python -O` process (where an `assert` would be
# gone and the bad tensor would reach the kernel): case -> (code, what the error must say).
LAUNCHER_MISUSES = {
    "greedy_accept: drafts of the wrong shape": (
        "acceptance.greedy_accept(torch.randn(1, 3, 64), torch.zeros(1, 5, dtype=torch.int64))",
        "draft_tokens must be"),
    "rejection_sample: noise of the wrong dtype": (
        "acceptance.rejection_sample(torch.rand(1, 3, 64).softmax(-1), None,"
        " torch.zeros(1, 2, dtype=torch.int64), torch.rand(1, 2),"
        " torch.rand(1, 64, dtype=torch.float64))", "noise must be"),
    "verify_attention: an unsupported head dim": (
        "verify_attention.verify_attention(torch.randn(1, 1, 2, 32), torch.randn(1, 2, 8, 32),"
        " torch.randn(1, 2, 8, 32), torch.tensor([8], dtype=torch.int32))", "head dim"),
    "add_rms_norm: a weight of the wrong size": (
        "add_rms_norm.add_rms_norm(torch.randn(2, 16), None, torch.ones(8), 1e-6)",
        "weight must be"),
    "silu_mul: an odd width": ("silu_mul.silu_mul(torch.randn(2, 15))", "is not even"),
    "reference.greedy_accept: drafts of the wrong shape": (
        "reference.greedy_accept(torch.randn(1, 3, 64), torch.zeros(1, 5, dtype=torch.int64))",
        "draft_tokens must be"),
}


def test_launchers_reject_bad_inputs_with_a_value_error_even_under_python_O():
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    script = "\n".join([
        "import json, sys, torch",
        "from specrt.kernels import reference",
        "from specrt.kernels.triton import acceptance, add_rms_norm, silu_mul, verify_attention",
        "assert False, 'asserts must be off under -O'",
        "out = {}",
        f"cases = {json.dumps({k: v[0] for k, v in LAUNCHER_MISUSES.items()})}",
        "for case, code in cases.items():",
        "    try:",
        "        exec(code)",
        "        out[case] = 'accepted'",
        "    except Exception as e:",
        "        out[case] = f'{type(e).__name__}: {e}'",
        "print(json.dumps(out))",
    ])
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(root)}
    run = subprocess.run([sys.executable, "-O", "-c", script], capture_output=True, text=True,
                         env=env, cwd=root, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    for case, (_, needle) in LAUNCHER_MISUSES.items():
        assert got[case].startswith("ValueError") and needle in got[case], (case, got[case])


@needs_cuda_bf16
@pytest.mark.parametrize("T", [1, 5, 17])
def test_verify_attention_bf16(T):
    q, k, v, lens = _attention_inputs(3, T, 12, 2, 128, 300, torch.bfloat16, seed=T)
    out = attention_kernel.verify_attention(q, k, v, lens)
    ref = reference.verify_attention(q, k, v, lens)
    torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)


# ---------------------------------------------------------------------------------------------
# greedy_accept

BACKENDS = [
    pytest.param(reference.greedy_accept, id="reference"),
    pytest.param(acceptance_kernel.greedy_accept, id="triton"),
    pytest.param(lambda lg, d: acceptance_kernel.greedy_accept(lg, d, **SMALL_SPLIT),
                 id="triton-splitv"),
]


def _logits_with_argmax(argmax_tokens, V):  # [B, K + 1] -> logits whose argmax is that
    B, K1 = argmax_tokens.shape
    logits = torch.randn(B, K1, V, generator=_gen(11), device=DEVICE)
    logits.scatter_(2, argmax_tokens.to(DEVICE).view(B, K1, 1), 10.0)
    return logits


def _tokens(rows):
    return torch.tensor(rows, dtype=torch.int64, device=DEVICE)


@pytest.mark.parametrize("greedy", BACKENDS)
def test_greedy_hand_built(greedy):
    V = 1000
    target = _tokens([[5, 6, 7, 8], [5, 6, 7, 8], [5, 6, 7, 8], [5, 6, 7, 8], [5, 6, 7, 8]])
    drafts = _tokens([
        [5, 6, 7],  # all accepted -> bonus 8
        [9, 6, 7],  # first rejected -> recovered 5
        [5, 6, 999],  # middle/last rejected -> recovered 7
        [5, -1, -1],  # padding: stops at the first -1 and emits the target's token
        [-1, 6, 7],  # padding first: nothing accepted even though later drafts match
    ])
    n, out = greedy(_logits_with_argmax(target, V), drafts)
    assert n.dtype == torch.int32 and out.dtype == torch.int64
    assert n.tolist() == [3, 0, 2, 1, 0]
    assert out.tolist() == [
        [5, 6, 7, 8],
        [5, -1, -1, -1],
        [5, 6, 7, -1],
        [5, 6, -1, -1],
        [5, -1, -1, -1],
    ]


@pytest.mark.parametrize("greedy", BACKENDS)
def test_greedy_k1(greedy):
    target = _tokens([[3, 4], [3, 4]])
    n, out = greedy(_logits_with_argmax(target, 777), _tokens([[3], [2]]))
    assert n.tolist() == [1, 0]
    assert out.tolist() == [[3, 4], [3, -1]]


@pytest.mark.parametrize("greedy", BACKENDS)
def test_greedy_ties_go_to_lowest_index(greedy):
    V = TIE_V
    logits = torch.zeros(3, 3, V, device=DEVICE)
    logits[:, 0, TIES] = 2.0  # -> 2
    logits[:, 1] = -1.0  # all equal -> 0
    logits[:, 2, [V - 1, V - 2]] = float("inf")  # tie at the end of the vocab -> V - 2
    logits[2, 0] = float("-inf")  # all -inf -> 0, like torch.argmax
    n, out = greedy(logits, _tokens([[2, 0], [2, 1], [0, 5]]))
    assert torch.equal(out[:, 0], logits[:, 0].argmax(-1))
    assert n.tolist() == [2, 1, 1]
    assert out.tolist() == [[2, 0, V - 2], [2, 0, -1], [0, 0, -1]]


@pytest.mark.parametrize(
    "B,K,V,dtype,splits",
    [
        (1, 1, 1000, torch.float32, {}),
        (3, 4, 1000, torch.float16, SMALL_SPLIT),
        (3, 8, 777, torch.float32, SMALL_SPLIT),
        (1, 16, 1000, torch.float16, {}),
    ],
)
def test_greedy_matches_reference(B, K, V, dtype, splits):
    g = _gen(B * 31 + K)
    logits = torch.randn(B, K + 1, V, generator=g, device=DEVICE).to(dtype)
    drafts = logits[:, :K].argmax(-1)
    # Corrupt some positions and pad some tails so rows stop at different places.
    corrupt = torch.rand(B, K, generator=g, device=DEVICE) < 0.2
    drafts = torch.where(corrupt, (drafts + 1) % V, drafts)
    drafts[0, K // 2 + 1:] = -1
    n, out = acceptance_kernel.greedy_accept(logits, drafts, **splits)
    n_ref, out_ref = reference.greedy_accept(logits, drafts)
    assert torch.equal(n, n_ref) and torch.equal(out, out_ref)


@needs_cuda_bf16
def test_greedy_bf16():
    logits = torch.randn(8, 9, 151936, generator=_gen(0), device=DEVICE).to(torch.bfloat16)
    drafts = logits[:, :8].argmax(-1)
    drafts[::2, 3] = -1
    n, out = acceptance_kernel.greedy_accept(logits, drafts)
    n_ref, out_ref = reference.greedy_accept(logits, drafts)
    assert torch.equal(n, n_ref) and torch.equal(out, out_ref)


# ---------------------------------------------------------------------------------------------
# rejection_sample

REJECTION_BACKENDS = [
    pytest.param(reference.rejection_sample, id="reference"),
    pytest.param(acceptance_kernel.rejection_sample, id="triton"),
    pytest.param(lambda *a: acceptance_kernel.rejection_sample(*a, **SMALL_SPLIT),
                 id="triton-splitv"),
]


def _probs(shape, seed, sharpness=2.0):
    logits = torch.randn(*shape, generator=_gen(seed), device=DEVICE) * sharpness
    return torch.softmax(logits, dim=-1)


def _sample(probs, seed):  # [..., V] -> [...] int64
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=_gen(seed)).view(probs.shape[:-1])


@pytest.mark.parametrize(
    "B,K,V,dtype,one_hot,splits",
    [
        (1, 1, 1000, torch.float32, False, {}),
        (3, 4, 1000, torch.float16, False, SMALL_SPLIT),
        (3, 7, 777, torch.float32, True, SMALL_SPLIT),
        (3, 4, 1000, torch.float16, True, {}),
        (8, 16, 1000, torch.float32, False, SMALL_SPLIT),
    ],
)
def test_rejection_matches_reference_exactly(B, K, V, dtype, one_hot, splits):
    seed = B * 1000 + K
    base = torch.randn(B, K + 1, V, generator=_gen(seed), device=DEVICE) * 2
    target = torch.softmax(base, -1)
    # A draft close to the target so that acceptance lengths vary across rows.
    noise = torch.randn(B, K, V, generator=_gen(seed + 1), device=DEVICE)
    draft = torch.softmax(base[:, :K] + 0.7 * noise, -1)
    drafts = _sample(draft, seed + 2)
    drafts[-1, K - 1] = -1  # a padded last position
    target, draft = target.to(dtype), draft.to(dtype)
    u, noise = reference.draw_randomness(B, K, V, _gen(seed + 3), DEVICE)
    draft_arg = None if one_hot else draft
    n, out = acceptance_kernel.rejection_sample(target, draft_arg, drafts, u, noise, **splits)
    n_ref, out_ref = reference.rejection_sample(target, draft_arg, drafts, u, noise)
    assert torch.equal(n, n_ref), (n, n_ref)
    assert torch.equal(out, out_ref), (out, out_ref)


@pytest.mark.parametrize("sample", REJECTION_BACKENDS)
def test_rejection_q_equals_p_always_accepts(sample):
    B, K, V = 16, 3, 1000
    p = _probs((B, K + 1, V), seed=1)
    drafts = _sample(p[:, :K], seed=2)
    u, noise = reference.draw_randomness(B, K, V, _gen(3), DEVICE)
    n, out = sample(p, p[:, :K].contiguous(), drafts, u, noise)
    assert n.tolist() == [K] * B
    assert torch.equal(out[:, :K], drafts)
    assert torch.equal(out[:, K], (p[:, K] / noise).argmax(-1))  # the bonus token


@pytest.mark.parametrize("sample", REJECTION_BACKENDS)
@pytest.mark.parametrize("one_hot", [False, True], ids=["probs", "one-hot"])
def test_rejection_zero_target_prob_always_rejects(sample, one_hot):
    B, K, V = 64, 2, 1000
    x = 123
    p = _probs((B, K + 1, V), seed=4)
    p[:, 0, x] = 0.0
    q = _probs((B, K, V), seed=5)
    drafts = torch.full((B, K), x, dtype=torch.int64, device=DEVICE)
    u, noise = reference.draw_randomness(B, K, V, _gen(6), DEVICE)
    n, out = sample(p, None if one_hot else q, drafts, u, noise)
    assert n.tolist() == [0] * B
    assert (out[:, 0] != x).all() and (out[:, 1:] == -1).all()


@pytest.mark.parametrize("sample", REJECTION_BACKENDS)
def test_rejection_explicit_one_hot_q_equals_none(sample):
    """Deterministic drafts (n-gram, greedy) as an explicit one-hot q give the bits of
    `draft_probs=None` (the CUDA graphs' sampled verify body always passes a q): a valid draft
    has q(x) = 1, and at the rejected position max(0, p - 1) = 0 at x and p - 0 = p elsewhere.
    Padding, certain drafts (p(x) = 1) and the bonus position included."""
    B, K, V = 6, 4, 1000
    p = _probs((B, K + 1, V), seed=21)
    drafts = _sample(p[:, :K], seed=22)
    drafts[1, 2:] = -1                                          # padding
    drafts[2, 0] = p[2, 0].argmax()
    p[2, 0] = 0.0
    p[2, 0, drafts[2, 0]] = 1.0                                 # a certain draft
    u, noise = reference.draw_randomness(B, K, V, _gen(23), DEVICE)
    u[3] = 0.0                                                  # row 3 accepts every valid draft
    one_hot = torch.zeros(B, K, V, device=DEVICE).scatter_(2, drafts.clamp(min=0)[..., None], 1.0)
    n, out = sample(p, one_hot, drafts, u, noise)
    n_ref, out_ref = sample(p, None, drafts, u, noise)
    assert torch.equal(n, n_ref) and torch.equal(out, out_ref)
    assert n[3] == K


@pytest.mark.parametrize("sample", REJECTION_BACKENDS)
def test_rejection_one_hot_accepts_iff_u_below_p(sample):
    B, K, V = 64, 1, 1000
    x = 7
    p = _probs((B, K + 1, V), seed=8)
    p[:, 0, x] = 0.0
    p[:, 0] *= 0.7 / p[:, 0].sum(-1, keepdim=True)
    p[:, 0, x] = 0.3
    drafts = torch.full((B, K), x, dtype=torch.int64, device=DEVICE)
    u, noise = reference.draw_randomness(B, K, V, _gen(9), DEVICE)
    n, out = sample(p, None, drafts, u, noise)
    assert torch.equal(n.bool(), u[:, 0] < p[:, 0, x])
    rejected = n == 0
    assert rejected.any() and (~rejected).any()
    assert (out[rejected, 0] != x).all()  # the residual is p with x zeroed


@pytest.mark.parametrize("sample", REJECTION_BACKENDS)
def test_rejection_padding_and_residual_fallback(sample):
    B, K, V = 3, 3, 1000
    p = _probs((B, K + 1, V), seed=10)
    q = p[:, :K].clone()
    drafts = _sample(q, seed=11)
    drafts[0, 1] = -1  # padding: rejected, recovered from the full p (q treated as 0)
    u, noise = reference.draw_randomness(B, K, V, _gen(12), DEVICE)
    u[1, 0] = 1.0  # force a rejection where p == q: residual all zero -> argmax p / noise
    n, out = sample(p, q, drafts, u, noise)
    assert n.tolist() == [1, 0, K]
    assert out[0, 1] == (p[0, 1] / noise[0]).argmax()
    assert out[1, 0] == (p[1, 0] / noise[1]).argmax()
    assert out[2, K] == (p[2, K] / noise[2]).argmax()
    # An id past the vocabulary is padding too (the reference indexed past V: an IndexError
    # on the CPU, where the Triton kernel read it as padding), with q or one-hot.
    for outside in (V, V + 5, -2):
        far = drafts.clone()
        far[0, 1] = outside
        for q_or_none in (q, None):
            want = sample(p, q_or_none, drafts, u, noise)
            got = sample(p, q_or_none, far, u, noise)
            assert all(torch.equal(a, b) for a, b in zip(got, want))


@pytest.mark.parametrize("sample", REJECTION_BACKENDS)
def test_rejection_ties_go_to_lowest_index(sample):
    B, K, V = 2, 1, TIE_V
    p = torch.zeros(B, K + 1, V, device=DEVICE)
    p[:, :, TIES] = 1.0 / len(TIES)
    drafts = _tokens([[5], [130]])  # row 0: p(x) = 0 -> rejected; row 1: accepted -> bonus
    u = torch.full((B, K), 0.1, device=DEVICE)
    noise = torch.ones(B, V, device=DEVICE)
    n, out = sample(p, None, drafts, u, noise)
    assert n.tolist() == [0, 1]
    assert out.tolist() == [[2, -1], [130, 2]]
    # q == p and u = 1: rejected with an all-zero residual -> fallback argmax p / noise.
    n, out = sample(p, p[:, :K].contiguous(), drafts, torch.ones(B, K, device=DEVICE), noise)
    assert n.tolist() == [0, 0]
    assert out.tolist() == [[2, -1], [2, -1]]


@needs_cuda_bf16
@pytest.mark.parametrize("one_hot", [False, True])
def test_rejection_bf16(one_hot):
    B, K, V = 8, 8, 151936
    target = _probs((B, K + 1, V), seed=13).to(torch.bfloat16)
    draft = _probs((B, K, V), seed=14).to(torch.bfloat16)
    drafts = _sample(draft.float(), seed=15)
    u, noise = reference.draw_randomness(B, K, V, _gen(16), DEVICE)
    draft_arg = None if one_hot else draft
    n, out = acceptance_kernel.rejection_sample(target, draft_arg, drafts, u, noise)
    n_ref, out_ref = reference.rejection_sample(target, draft_arg, drafts, u, noise)
    assert torch.equal(n, n_ref) and torch.equal(out, out_ref)


def test_rejection_sampling_reproduces_target_distribution(monkeypatch):
    """The seed study's pair: target p prefers 'the', draft q prefers 'a', sum(min(p, q)) =
    0.72.

    1,000,000 batched K = 1 draws through the dispatcher: the acceptance rate must be 0.72 and
    the emitted word must follow p (within 0.002), and where the draft was accepted the bonus
    token must follow the target's next distribution, p2 (within 0.003 over ~720,000 rows).
    """
    monkeypatch.setenv("SPECRT_KERNELS", "reference")
    words = ["the", "a", "cat", "sat", "mat"]
    p = torch.tensor([0.40, 0.10, 0.20, 0.15, 0.15], dtype=torch.float64)
    q = torch.tensor([0.12, 0.38, 0.20, 0.15, 0.15], dtype=torch.float64)
    p2 = torch.tensor([0.05, 0.15, 0.30, 0.20, 0.30], dtype=torch.float64)

    N, V = 1_000_000, len(words)
    g = torch.Generator(device=DEVICE).manual_seed(2024)
    target = torch.stack([p, p2]).float().to(DEVICE)            # [K + 1, V]
    q32 = q.float().to(DEVICE)
    drafts = torch.multinomial(q32, N, replacement=True, generator=g).view(N, 1)
    uniforms, noise = kernels.draw_randomness(N, 1, V, g, DEVICE)
    n, out = kernels.rejection_sample(target.expand(N, 2, V), q32.expand(N, 1, V), drafts,
                                      uniforms, noise)

    assert abs(n.double().mean().item() - 0.72) < 0.002
    freq = torch.bincount(out[:, 0], minlength=V).double().cpu() / N
    assert (freq - p).abs().max().item() < 0.002, dict(zip(words, freq.tolist()))
    bonus = out[n == 1, 1]
    freq2 = torch.bincount(bonus, minlength=V).double().cpu() / bonus.numel()
    assert (freq2 - p2).abs().max().item() < 0.003, dict(zip(words, freq2.tolist()))


def test_draw_randomness_is_seeded_and_positive():
    a = reference.draw_randomness(4, 3, 1000, _gen(0), DEVICE)
    b = reference.draw_randomness(4, 3, 1000, _gen(0), DEVICE)
    assert a[0].shape == (4, 3) and a[1].shape == (4, 1000)
    assert a[0].dtype == a[1].dtype == torch.float32
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert (a[1] > 0).all() and ((a[0] >= 0) & (a[0] < 1)).all()


def test_the_noise_is_exp1_with_fp32_precision_in_both_tails():
    """`fill_exponential_` against Exp(1): P(E <= t) = 1 - exp(-t) from the smallest values the
    race cares most about (E near 0: p / E is large) to the far tail, within 5 binomial
    standard deviations of 2^22 draws, and a Kolmogorov-Smirnov fit; each value exactly the
    formula's on its own uniform (a draw does not depend on the others in its tensor)."""
    from scipy import stats

    n = 1 << 22
    e = reference.fill_exponential_(torch.empty(n, device=DEVICE), _gen(7)).double().cpu()
    for t in (1e-6, 1e-4, 1e-2, 0.5, 1.0, 3.0, 8.0, 12.0):
        want = -math.expm1(-t)
        sd = math.sqrt(want * (1 - want) / n)
        got = (e <= t).double().mean().item()
        assert abs(got - want) <= 5 * sd + 1e-12, (t, got, want)
    assert stats.kstest(e[:200_000].numpy(), "expon").pvalue > 1e-3
    u = torch.rand(1000, dtype=torch.float64, generator=_gen(3), device=DEVICE)
    e = reference.fill_exponential_(torch.empty(1000, device=DEVICE), _gen(3))
    exact = (-torch.log1p(-u)).float()
    assert torch.allclose(e, exact, rtol=2 ** -22, atol=0), (e - exact).abs().max()


# ---------------------------------------------------------------------------------------------
# dispatch


def test_backend_for_default_and_override(monkeypatch):
    t = torch.zeros(1)
    monkeypatch.delenv("SPECRT_KERNELS", raising=False)
    assert kernels.backend_for(t) == "reference"
    monkeypatch.setenv("SPECRT_KERNELS", "triton")
    assert kernels.backend_for(t) == "triton"
    monkeypatch.setenv("SPECRT_KERNELS", "reference")
    assert kernels.backend_for(t) == "reference"
    if CUDA:
        monkeypatch.delenv("SPECRT_KERNELS")
        assert kernels.backend_for(t.cuda()) == "triton"


def test_backend_override_rejects_unknown_values(monkeypatch):
    from specrt.errors import ArgumentError

    monkeypatch.setenv("SPECRT_KERNELS", "cuda")
    with pytest.raises(ArgumentError, match="SPECRT_KERNELS.*triton.*reference"):   # exit 2
        kernels.backend_for(torch.zeros(1))
    with pytest.raises(ValueError, match="SPECRT_KERNELS"):
        kernels.greedy_accept(torch.zeros(1, 2, 10), torch.zeros(1, 1, dtype=torch.int64))


@pytest.mark.parametrize("value, interpret, needle", [
    ("foo", "1", "must be one of triton, reference"),
    ("triton", None, "set TRITON_INTERPRET=1 as well"),
])
def test_a_bad_kernel_override_is_refused_when_the_model_loads(monkeypatch, tiny_noeos_dir,
                                                                value, interpret, needle):
    """Not at the first pass that needs a kernel: after a token was printed, with a traceback,
    or never (a plain request used no kernel of dispatch's)."""
    import specrt
    from specrt.errors import ArgumentError

    monkeypatch.setenv("SPECRT_KERNELS", value)
    if interpret is None:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ArgumentError, match=needle):
        specrt.LLM(tiny_noeos_dir, dtype="float32", max_seq_len=64)


@pytest.mark.parametrize("forced", ["triton", "reference"])
def test_dispatch_routes_to_the_forced_backend(monkeypatch, forced):
    q, k, v, lens = _attention_inputs(1, 2, 2, 2, 64, 32, torch.float32, seed=0)
    expected = reference.verify_attention(q, k, v, lens)
    probs = _probs((2, 3, 100), seed=1)
    drafts = probs[:, :2].argmax(-1)
    u, noise = reference.draw_randomness(2, 2, 100, _gen(2), DEVICE)

    calls = []
    for module, backend in ((attention_kernel, "triton"), (acceptance_kernel, "triton"),
                            (dispatch.reference, "reference")):
        for name in ("verify_attention", "greedy_accept", "rejection_sample"):
            if not hasattr(module, name):
                continue

            def spy(*args, _fn=getattr(module, name), _tag=(backend, name)):
                calls.append(_tag)
                return _fn(*args)

            monkeypatch.setattr(module, name, spy)
    monkeypatch.setenv("SPECRT_KERNELS", forced)

    torch.testing.assert_close(kernels.verify_attention(q, k, v, lens), expected,
                               atol=1e-4, rtol=1e-4)
    kernels.greedy_accept(probs, drafts)
    kernels.rejection_sample(probs, None, drafts, u, noise)
    assert calls == [(forced, "verify_attention"), (forced, "greedy_accept"),
                     (forced, "rejection_sample")]


@pytest.mark.parametrize("forced", ["triton", "reference"])
def test_dispatch_routes_the_layer_ops(monkeypatch, forced):
    calls = []
    for module, backend, names in (
            (attention_kernel, "triton", ["rope_verify_attention"]),
            (rms_kernel, "triton", ["add_rms_norm"]), (silu_kernel, "triton", ["silu_mul"]),
            (reference_layer, "reference", ["rope_verify_attention", "add_rms_norm", "silu_mul"])):
        for name in names:
            def spy(*args, _fn=getattr(module, name), _tag=(backend, name)):
                calls.append(_tag)
                return _fn(*args)

            monkeypatch.setattr(module, name, spy)
    monkeypatch.setenv("SPECRT_KERNELS", forced)
    qkv, bias, cos, sin, kc, vc, lens = _fused_inputs(1, 2, 2, 1, 64, 16, torch.float32, seed=0)
    kernels.rope_verify_attention(qkv, bias, cos, sin, kc, vc, lens, 2)
    x = torch.randn(3, 40, device=DEVICE)
    kernels.add_rms_norm(x, x, torch.ones(40, device=DEVICE), 1e-6)
    kernels.silu_mul(torch.randn(3, 40, device=DEVICE))
    assert calls == [(forced, "rope_verify_attention"), (forced, "add_rms_norm"),
                     (forced, "silu_mul")]


# ---------------------------------------------------------------------------------------------
# rope_verify_attention: bias + RoPE + KV-cache write + attention in one kernel


def _fused_inputs(B, T, Hq, Hkv, D, S, dtype, seed, rope_len=None):
    g = _gen(seed)
    W = (Hq + 2 * Hkv) * D
    qkv = torch.randn(B, T, W, generator=g, device=DEVICE).to(dtype)
    bias = (0.5 * torch.randn(W, generator=g, device=DEVICE)).to(dtype)
    from specrt.model.backends.torch_ref import rope_tables
    cos, sin = rope_tables(D, 10000.0, rope_len or S, dtype, DEVICE)
    _, k, v, lens = _attention_inputs(B, T, Hq, Hkv, D, S, dtype, seed + 1)
    return qkv, bias, cos, sin, k, v, lens


# (B, T, Hq, Hkv, D, S_max, dtype, split_keys)
FUSED_CASES = [
    (2, 1, 6, 2, 64, 80, torch.float32, None),
    (3, 5, 6, 2, 64, 100, torch.float32, 32),
    (2, 9, 4, 1, 64, 70, torch.float16, 64),
    (2, 17, 7, 1, 64, 90, torch.float32, 32),      # T * G = 119: two M tiles
    (1, 3, 4, 2, 128, 72, torch.float16, None),
]


@pytest.mark.parametrize("B,T,Hq,Hkv,D,S,dtype,split_keys", FUSED_CASES)
def test_rope_verify_attention_matches_reference(B, T, Hq, Hkv, D, S, dtype, split_keys):
    qkv, bias, cos, sin, k, v, lens = _fused_inputs(B, T, Hq, Hkv, D, S, dtype, seed=B + T)
    k_ref, v_ref = k.clone(), v.clone()
    out = attention_kernel.rope_verify_attention(qkv, bias, cos, sin, k, v, lens, Hq,
                                                 split_keys=split_keys)
    ref = reference_layer.rope_verify_attention(qkv, bias, cos, sin, k_ref, v_ref, lens, Hq)
    atol, rtol = TOL[dtype]
    assert out.shape == (B, T, Hq, D) and out.dtype == dtype
    torch.testing.assert_close(out.float(), ref.float(), atol=atol, rtol=rtol)
    # The new tokens' k/v landed in the cache (rotated, with bias); nothing else changed.
    torch.testing.assert_close(k.float(), k_ref.float(), atol=atol, rtol=rtol)
    torch.testing.assert_close(v.float(), v_ref.float(), atol=atol, rtol=rtol)
    written = torch.zeros_like(k, dtype=torch.bool)
    for b in range(B):
        written[b, :, int(lens[b]) - T:int(lens[b])] = True
    assert torch.equal(k[~written], k_ref[~written]) and torch.equal(v[~written], v_ref[~written])


def test_qkv_rope_reference_rotates_like_the_model():
    """The fused reference's RoPE is the model's apply_rope (rotate-half) on q + bias."""
    from specrt.model.backends.torch_ref import apply_rope
    qkv, bias, cos, sin, *_ = _fused_inputs(2, 3, 4, 2, 64, 40, torch.float32, seed=5)
    pos = torch.tensor([[3, 4, 5], [30, 31, 32]])
    q, k, v = reference_layer.qkv_rope(qkv, bias, cos, sin, pos, 4, 2)
    x = (qkv + bias).view(2, 3, 8, 64)
    c, s = cos[pos][:, :, None], sin[pos][:, :, None]
    torch.testing.assert_close(q, apply_rope(x[:, :, :4], c, s))
    torch.testing.assert_close(k, apply_rope(x[:, :, 4:6], c, s))
    torch.testing.assert_close(v, x[:, :, 6:])


@pytest.mark.parametrize("split_keys", [None, 32])
def test_rope_verify_attention_verify_equals_decode_steps_bitwise(split_keys):
    """T fused decode steps and one T-token fused verify leave the same cache bits and give the
    same outputs, bit for bit (fp32 under the interpreter; bf16 is the GPU's test)."""
    B, T, Hq, Hkv, D, S = 2, 5, 6, 2, 64, 96
    qkv, bias, cos, sin, k, v, lens = _fused_inputs(B, T, Hq, Hkv, D, S, torch.float32, seed=9)
    k2, v2 = k.clone(), v.clone()
    full = attention_kernel.rope_verify_attention(qkv, bias, cos, sin, k, v, lens, Hq,
                                                  split_keys=split_keys)
    for t in range(T):
        step = attention_kernel.rope_verify_attention(
            qkv[:, t:t + 1].contiguous(), bias, cos, sin, k2, v2, lens - (T - 1 - t), Hq,
            split_keys=split_keys)
        assert torch.equal(step[:, 0], full[:, t]), f"row {t} differs from its decode step"
    assert torch.equal(k, k2) and torch.equal(v, v2)


@needs_cuda_bf16
def test_rope_verify_attention_verify_equals_decode_steps_bitwise_bf16():
    """The GPU's promise: in bf16, a 17-token fused verify gives each row the bits of its decode
    step (one MMA path, fixed split positions), over several splits."""
    B, T, Hq, Hkv, D, S = 2, 17, 12, 2, 128, 1024
    qkv, bias, cos, sin, k, v, lens = _fused_inputs(B, T, Hq, Hkv, D, S, torch.bfloat16, seed=11)
    k2, v2 = k.clone(), v.clone()
    full = attention_kernel.rope_verify_attention(qkv, bias, cos, sin, k, v, lens, Hq)
    for t in range(T):
        step = attention_kernel.rope_verify_attention(
            qkv[:, t:t + 1].contiguous(), bias, cos, sin, k2, v2, lens - (T - 1 - t), Hq)
        assert torch.equal(step[:, 0], full[:, t]), f"row {t} differs from its decode step"
    assert torch.equal(k, k2) and torch.equal(v, v2)


# ---------------------------------------------------------------------------------------------
# add_rms_norm, silu_mul


@pytest.mark.parametrize("N,H,dtype,residual", [
    (1, 64, torch.float32, True), (5, 1500, torch.float32, True), (3, 2100, torch.float16, True),
    (4, 896, torch.float16, False), (2, 1536, torch.float32, False)])
def test_add_rms_norm_matches_reference(N, H, dtype, residual):
    g = _gen(N + H)
    x = (3 * torch.randn(N, H, generator=g, device=DEVICE)).to(dtype)
    y = torch.randn(N, H, generator=g, device=DEVICE).to(dtype) if residual else None
    w = (1 + 0.1 * torch.randn(H, generator=g, device=DEVICE)).to(dtype)
    out, res = rms_kernel.add_rms_norm(x, y, w, 1e-6)
    ref_out, ref_res = reference_layer.add_rms_norm(x, y, w, 1e-6)
    assert out.dtype == dtype and res.dtype == dtype
    assert torch.equal(res, ref_res)      # one rounding of x + y, as the reference
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(out.float(), ref_out.float(), atol=atol, rtol=rtol)


def test_add_rms_norm_reference_is_the_model_norm():
    from specrt.model.backends.torch_ref import rms_norm
    x, y, w = torch.randn(3, 50), torch.randn(3, 50), torch.randn(50)
    out, res = reference_layer.add_rms_norm(x, y, w, 1e-5)
    assert torch.equal(res, x + y) and torch.equal(out, rms_norm(x + y, w, 1e-5))


def test_add_rms_norm_row_bits_do_not_depend_on_row_count():
    """Each row is reduced in a fixed order: a row normalized alone equals the same row in a
    batch of 7, bit for bit."""
    g = _gen(4)
    x = torch.randn(7, 1500, generator=g, device=DEVICE)
    y = torch.randn(7, 1500, generator=g, device=DEVICE)
    w = torch.randn(1500, generator=g, device=DEVICE)
    out, res = rms_kernel.add_rms_norm(x, y, w, 1e-6)
    for r in (0, 3, 6):
        one, one_res = rms_kernel.add_rms_norm(x[r:r + 1], y[r:r + 1], w, 1e-6)
        assert torch.equal(one[0], out[r]) and torch.equal(one_res[0], res[r])


@pytest.mark.parametrize("N,I,dtype", [(1, 64, torch.float32), (3, 1500, torch.float32),
                                       (2, 2100, torch.float16)])
def test_silu_mul_matches_reference(N, I, dtype):
    gu = (2 * torch.randn(N, 2 * I, generator=_gen(I), device=DEVICE)).to(dtype)
    out = silu_kernel.silu_mul(gu)
    ref = reference_layer.silu_mul(gu)
    assert out.shape == (N, I) and out.dtype == dtype
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(out.float(), ref.float(), atol=atol, rtol=rtol)


def test_one_split_launches_pass_the_pointer_types_the_kernels_are_compiled_with(monkeypatch):
    """NUM_SPLITS is a runtime value, so a launch compiles the split branch whatever it takes:
    one-split launches that passed their output as the never-read partials and tickets gave
    the tickets' atomics a bf16 / fp16 pointer, which triton 3.6 does not compile (seen on an
    H200; the interpreter and compile_check, which declares the types, did not show it)."""
    from specrt.kernels.triton import matmul as matmul_kernel

    seen = {}

    def spy_on(module, name):
        real = getattr(module, name)

        class Spy:
            def __getitem__(self, grid):
                def launch(*args, **kwargs):
                    seen[name] = dict(zip(real.arg_names, args))
                    return real[grid](*args, **kwargs)
                return launch

        monkeypatch.setattr(module, name, Spy())

    spy_on(matmul_kernel, "_matmul_kernel")
    spy_on(attention_kernel, "_verify_attention_kernel")
    x = torch.randn(3, 64, device=DEVICE, dtype=torch.float16)
    w = torch.randn(32, 64, device=DEVICE, dtype=torch.float16)
    matmul_kernel.matmul(x, w, split_blocks=64)                          # one split
    q, k, v, lens = _attention_inputs(1, 1, 2, 2, 64, 16, torch.float16, seed=0)
    attention_kernel.verify_attention(q, k, v, lens, split_keys=64)      # one split
    for name, pointers in (("_matmul_kernel", ("part_ptr", "count_ptr")),
                           ("_verify_attention_kernel",
                            ("part_acc_ptr", "part_m_ptr", "part_l_ptr", "count_ptr"))):
        args = seen[name]
        assert args["NUM_SPLITS"] == 1, name
        assert [args[p].dtype for p in pointers] == \
            [torch.float32] * (len(pointers) - 1) + [torch.int32], name
