"""Turning logits into token choices: warping (temperature, top-k, top-p) and seeded sampling.

Speculative sampling is exact only if the target's p and the drafter's q are warped the same
way, so there is exactly one `warp` and both sides call it. Sampling uses the exponential race
argmax(p / E) with E ~ Exp(1) drawn from a seeded generator: it is an exact draw from p, needs
no normalisation, and is the same rule the acceptance kernels use for recovered/bonus tokens.
"""
from __future__ import annotations

import torch

from specrt.config import SamplingParams


def warp(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """logits [..., V] -> probabilities [..., V] (fp32) after temperature, top-k, then top-p."""
    x = logits.float() / params.temperature
    vocab = x.shape[-1]
    if 0 < params.top_k < vocab:
        kth = torch.topk(x, params.top_k, dim=-1).values[..., -1:]     # [..., 1]
        x = x.masked_fill(x < kth, float("-inf"))
    probs = torch.softmax(x, dim=-1)
    if params.top_p < 1.0:
        sorted_p, order = torch.sort(probs, dim=-1, descending=True)
        before = torch.cumsum(sorted_p, dim=-1) - sorted_p             # mass strictly above
        drop_sorted = before >= params.top_p                            # never drops the top-1
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def exponential_noise(shape, generator: torch.Generator, device) -> torch.Tensor:
    """Exp(1) noise, kept away from 0 so argmax(p / noise) never divides by zero."""
    noise = torch.empty(shape, dtype=torch.float32, device=device)
    return noise.exponential_(generator=generator).clamp_(min=1e-20)


def sample(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One exact draw per row from probs [..., V] -> token ids [...] (int64)."""
    return (probs / exponential_noise(probs.shape, generator, probs.device)).argmax(dim=-1)


def choose(logits: torch.Tensor, params: SamplingParams,
           generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Pick one token per row of logits [..., V]: argmax when greedy, else a seeded draw from the
    warped distribution. Returns (tokens [...], probs [..., V] or None when greedy)."""
    if params.greedy:
        return logits.argmax(dim=-1), None
    probs = warp(logits, params)
    return sample(probs, generator), probs


def make_generator(seed: int | None, device) -> torch.Generator:
    gen = torch.Generator(device=device)
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(seed)
    return gen
