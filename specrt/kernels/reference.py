"""Pure-PyTorch references for the speculative-decoding kernels.

These functions are the specification of the Triton kernels in `verify_attention.py` and
`acceptance.py` and, through `dispatch.py`, the CPU path of the engine. They are batched
and vectorized (no Python loop over the vocabulary or the draft positions) and allocate at
most a few `[batch, vocab]` temporaries beyond their inputs, so they are usable for
B = 1..8, K <= 16, V = 151936.

The words draft / accepted / rejected / recovered / bonus token mean what the round's
contract in `specrt/engine/round.py` defines. Every row emits `num_accepted + 1` tokens: the
accepted drafts, then the recovered or bonus token; `out_tokens[b, num_accepted[b] + 1:]` is `-1`.

Randomness enters rejection sampling only as tensors drawn by the caller (see
`draw_randomness`), so the reference and the kernel agree exactly on the same inputs.
This module must not pick a backend, import Triton, or draw random numbers implicitly.
"""
from __future__ import annotations

import math

import torch

from specrt.kernels.checks import require

__all__ = ["verify_attention", "greedy_accept", "rejection_sample", "draw_randomness",
           "exponential_noise", "fill_exponential_"]


def verify_attention(
    q: torch.Tensor,  # [B, T, Hq, D]
    k_cache: torch.Tensor,  # [B, Hkv, S_max, D]
    v_cache: torch.Tensor,  # [B, Hkv, S_max, D]
    lens: torch.Tensor,  # [B] int, valid positions per row including the T new ones
    scale: float | None = None,
) -> torch.Tensor:  # [B, T, Hq, D], q.dtype
    """Causal attention of T new query tokens per row against a static KV cache.

    Query t of row b sits at position `lens[b] - T + t` and attends to key positions
    `0..lens[b] - T + t` inclusive; query head h reads kv head `h // (Hq // Hkv)`.
    Computed in fp32, returned in q's dtype.
    """
    B, T, Hq, D = q.shape
    Bk, Hkv, S, Dk = k_cache.shape
    require(v_cache.shape == k_cache.shape, "k_cache and v_cache must have the same shape")
    require((Bk, Dk) == (B, D), f"cache {tuple(k_cache.shape)} does not match q {tuple(q.shape)}")
    require(Hq % Hkv == 0, f"Hq={Hq} must be a multiple of Hkv={Hkv}")
    require(lens.shape == (B,), f"lens must be [B]={B}, got {tuple(lens.shape)}")
    G = Hq // Hkv
    scale = 1.0 / math.sqrt(D) if scale is None else scale

    if not lens.is_cuda:
        # Cheap on CPU (no device sync): catch invalid rows and skip the unused cache tail.
        require(bool((lens >= T).all()) and bool((lens <= S).all()),
                f"lens must lie in [T={T}, S_max={S}], got {lens.tolist()}")
        S = int(lens.max()) if B > 0 else 0
    k = k_cache[:, :, :S].float()  # [B, Hkv, S, D]
    v = v_cache[:, :, :S].float()

    # Group the queries that share a kv head: [B, Hkv, G * T, D], row = g * T + t.
    qg = q.float().reshape(B, T, Hkv, G, D).permute(0, 2, 3, 1, 4).reshape(B, Hkv, G * T, D)
    scores = torch.matmul(qg, k.transpose(-1, -2)) * scale  # [B, Hkv, G*T, S]

    qpos = lens.to(torch.long).view(B, 1) - T + torch.arange(T, device=q.device)  # [B, T]
    kpos = torch.arange(S, device=q.device)
    hidden = (kpos.view(1, 1, S) > qpos.view(B, T, 1)).view(B, 1, 1, T, S)  # future keys
    scores = scores.view(B, Hkv, G, T, S).masked_fill_(hidden, float("-inf")).view(B, Hkv, G * T, S)
    out = torch.matmul(torch.softmax(scores, dim=-1), v)  # [B, Hkv, G*T, D]
    out = out.view(B, Hkv, G, T, D).permute(0, 3, 1, 2, 4).reshape(B, T, Hq, D)
    return out.to(q.dtype)


def _compose_out_tokens(
    draft_tokens: torch.Tensor,  # [B, K]
    num_accepted: torch.Tensor,  # [B] int64
    last_token: torch.Tensor,  # [B] int64, recovered or bonus token
) -> torch.Tensor:  # [B, K + 1] int64
    B, K = draft_tokens.shape
    pos = torch.arange(K + 1, device=draft_tokens.device).view(1, K + 1)
    n = num_accepted.view(B, 1)
    drafts = torch.cat([draft_tokens.long(), draft_tokens.new_full((B, 1), -1).long()], dim=1)
    out = torch.where(pos < n, drafts, torch.full_like(drafts, -1))
    return out.scatter_(1, n, last_token.view(B, 1))


def _accepted_prefix_len(accept: torch.Tensor) -> torch.Tensor:  # [B, K] bool -> [B] int64
    return accept.to(torch.int32).cumprod(dim=1).sum(dim=1, dtype=torch.int64)


def greedy_accept(
    target_logits: torch.Tensor,  # [B, K + 1, V]
    draft_tokens: torch.Tensor,  # [B, K] int, -1 = no draft
) -> tuple[torch.Tensor, torch.Tensor]:  # num_accepted [B] int32, out_tokens [B, K + 1] int64
    """Greedy verification: accept drafts while they equal the target's argmax.

    Ties in the argmax go to the lowest index (as torch.argmax). The token after the
    accepted prefix is the target's argmax there (recovered at a mismatch, bonus at K).
    """
    return greedy_accept_ids(target_logits.argmax(dim=-1), draft_tokens)


def greedy_accept_ids(
    target: torch.Tensor,  # [B, K + 1] int64, the target's argmax at each position
    draft_tokens: torch.Tensor,  # [B, K] int, -1 = no draft
) -> tuple[torch.Tensor, torch.Tensor]:  # num_accepted [B] int32, out_tokens [B, K + 1] int64
    """`greedy_accept` from the target's argmax ids, however they were computed."""
    B, K1 = target.shape
    require(draft_tokens.shape == (B, K1 - 1),
            f"draft_tokens must be [B, K]={[B, K1 - 1]}, got {list(draft_tokens.shape)}")
    n = _accepted_prefix_len(draft_tokens.long() == target[:, :-1])
    last = target.gather(1, n.view(B, 1)).view(B)
    return n.to(torch.int32), _compose_out_tokens(draft_tokens, n, last)


def rejection_sample(
    target_probs: torch.Tensor,  # [B, K + 1, V]
    draft_probs: torch.Tensor | None,  # [B, K, V], or None for one-hot drafts
    draft_tokens: torch.Tensor,  # [B, K] int, -1 = no draft
    uniforms: torch.Tensor,  # [B, K] in [0, 1)
    noise: torch.Tensor,  # [B, V], Exp(1), > 0
) -> tuple[torch.Tensor, torch.Tensor]:  # num_accepted [B] int32, out_tokens [B, K + 1] int64
    """Exact speculative sampling (Leviathan et al. / Chen et al.).

    Draft x_i is accepted iff `uniforms[b, i] * q_i(x_i) < p_i(x_i)` (q = 1 without
    draft_probs); padding drafts (-1, or any id outside 0..V-1) are rejected. At the first
    rejected position i the recovered token is `argmax_v max(0, p_i[v] - q_i[v]) / noise[b, v]`
    (one-hot drafts: p_i with x_i zeroed; padding: q_i = 0), an exact sample of the normalized
    residual since noise ~ Exp(1) (exponential race). If the residual scores are all zero, it
    falls back to `argmax_v p_i[v] / noise[b, v]`. After K acceptances the bonus token is
    `argmax_v p_K[v] / noise[b, v]`. All comparisons in fp32; ties -> lowest index.
    """
    B, K1, V = target_probs.shape
    K = K1 - 1
    require(draft_tokens.shape == (B, K), f"draft_tokens must be [B, K]={[B, K]}")
    require(uniforms.shape == (B, K), f"uniforms must be [B, K]={[B, K]}")
    require(noise.shape == (B, V), f"noise must be [B, V]={[B, V]}")
    if draft_probs is not None:
        require(draft_probs.shape == (B, K, V), f"draft_probs must be [B, K, V]={[B, K, V]}")

    x = draft_tokens.long()
    valid = (x >= 0) & (x < V)
    x = torch.where(valid, x, -1)  # an id outside the vocabulary is padding, as -1 is
    xc = x.clamp(min=0).unsqueeze(-1)  # [B, K, 1]
    p_x = target_probs[:, :K].gather(2, xc).squeeze(-1).float()  # [B, K]
    if draft_probs is None:
        q_x = torch.ones_like(p_x)
    else:
        q_x = draft_probs.gather(2, xc).squeeze(-1).float()
    accept = valid & (uniforms.float() * q_x < p_x)
    n = _accepted_prefix_len(accept)  # [B]

    rows = torch.arange(B, device=target_probs.device)
    x_n = torch.cat([x, x.new_full((B, 1), -1)], dim=1).gather(1, n.view(B, 1))  # [B, 1]
    p_n = target_probs[rows, n].float()  # [B, V]
    if draft_probs is None:
        vocab = torch.arange(V, device=target_probs.device).view(1, V)
        residual = torch.where(vocab == x_n, torch.zeros_like(p_n), p_n)
    else:
        # Bonus (n == K) and padding drafts have no draft distribution: q = 0.
        q_n = (draft_probs[rows, n.clamp(max=max(K - 1, 0))].float() if K > 0
               else torch.zeros_like(p_n))
        q_n = torch.where(x_n >= 0, q_n, torch.zeros_like(q_n))
        residual = (p_n - q_n).clamp_min_(0.0)
    noise = noise.float()
    score = residual.div_(noise)
    best, tok = score.amax(dim=-1), score.argmax(dim=-1)
    fallback = p_n.div_(noise).argmax(dim=-1)  # only when the residual is all zero
    last = torch.where(best > 0, tok, fallback)
    return n.to(torch.int32), _compose_out_tokens(draft_tokens, n, last)


def fill_exponential_(out: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Fill `out` (fp32) in place with Exp(1) noise, the one noise source of specrt.

    E = -log(1 - U) from one float64 uniform U per value, computed so that E keeps fp32's
    relative precision over its whole range: for U < 1/2 as -log1p(-U) with U rounded to fp32
    (where E ~ U is small), else as -log(1 - U) with 1 - U exact in float64, then rounded
    (where E is large); within ~1.3 fp32 ulp of -log1p(-U) in float64. torch's CPU
    `exponential_` draws the same uniforms (so a seed's noise moved by at most ~1e-7 relative
    when this replaced it) but took ~3.2 ms for the 151,936 values of one sampled position on a
    2-core Xeon, against ~1.5 ms here (benchmarks/RESULTS.md, "Exp(1) noise"). Clamped to
    the smallest normal fp32 so `p / noise` in the exponential race (argmax p / E is an exact
    draw from p) never divides by zero: E is 0 only at U = 0 (probability 2^-53), and never
    between 0 and 2^-53.
    """
    require(out.dtype == torch.float32, f"noise must be float32, got {out.dtype}")
    u = torch.rand(out.shape, dtype=torch.float64, generator=generator, device=out.device)
    small = torch.log1p(u.float().neg_())                           # U < 1/2: log(1 - U)
    large = torch.log((1.0 - u).float())                            # U >= 1/2: the same
    out.copy_(torch.where(u < 0.5, small, large).neg_())
    return out.clamp_(min=torch.finfo(torch.float32).tiny)


def exponential_noise(shape, generator: torch.Generator | None,
                      device: torch.device | str | None = None) -> torch.Tensor:
    """A new fp32 tensor of Exp(1) noise (see `fill_exponential_`)."""
    return fill_exponential_(torch.empty(shape, dtype=torch.float32, device=device), generator)


def draw_randomness(
    B: int,
    K: int,
    V: int,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # uniforms [B, K] fp32, noise [B, V] fp32
    """The random inputs of `rejection_sample`, drawn the same way everywhere.

    uniforms ~ U[0, 1) decide acceptance; noise ~ Exp(1) picks the recovered or bonus token.
    The generator must live on `device`.
    """
    uniforms = torch.rand(B, K, generator=generator, device=device, dtype=torch.float32)
    return uniforms, exponential_noise((B, V), generator, device)
