"""Turning logits into token choices: `SamplingParams`, warping (temperature, top-k, top-p)
and seeded draws.

Speculative sampling is exact only if the target's p and the drafter's q are warped the same
way, so there is one warp and both sides call it: `warp` where settings are Python values,
`warp_rows` (the same operations, settings read from the device) inside CUDA graphs. Sampling
uses the exponential race argmax(p / E) with E ~ Exp(1) (`race`; the noise comes from
`specrt.kernels.reference.exponential_noise`, the one noise source of specrt): an exact draw
from p that needs no normalisation, and the same rule the acceptance kernels use for recovered
and bonus tokens.
"""
from __future__ import annotations

import dataclasses

import torch

from specrt.checks import check_int, check_number
from specrt.kernels import argmax
from specrt.kernels.reference import exponential_noise
from specrt.model.staging import Staging

MAX_SEED = 2**63 - 1      # torch seeds are 64-bit; negative ones are a user's slip
MAX_TOP_K = 2**31 - 1
# Past this the distribution is uniform to float32's precision; past float32's largest
# finite value the division overflows inside torch.
MAX_TEMPERATURE = 1e4
# Below this a temperature is greedy, as in vLLM: logits / T would overflow float32 to inf
# (NaN probabilities: every draw id 0) for T near 1e-37, and well before that the warped
# distribution is the argmax but for ties within T.
GREEDY_BELOW = 1e-5
# A top_p under float32's smallest normal number would round to 0 and cut every token; any
# positive top_p that small keeps only the most likely one, as this value does.
MIN_TOP_P = 2.0 ** -126


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How a token is chosen from logits. temperature == 0 (or below GREEDY_BELOW) means
    greedy."""

    temperature: float = 0.0
    top_k: int = 0          # 0 = off
    top_p: float = 1.0      # 1.0 = off
    seed: int | None = None

    def __post_init__(self):
        # Checked here so the API, the CLIs and the server share one wording; a value that gets
        # past this reaches torch (a seed of 2**64 overflows, nan warps to nan probabilities).
        set_ = object.__setattr__
        set_(self, "temperature", check_number(
            "temperature", self.temperature, 0.0, MAX_TEMPERATURE,
            fix="0 means greedy, 0.7..1.0 is typical"))
        set_(self, "top_k", check_int("top_k", self.top_k, 0, MAX_TOP_K, fix="0 disables it"))
        set_(self, "top_p", check_number("top_p", self.top_p, 0.0, 1.0, lo_open=True,
                                         fix="1 disables it"))
        if self.temperature < GREEDY_BELOW:
            set_(self, "temperature", 0.0)
        set_(self, "top_p", max(self.top_p, MIN_TOP_P))
        if self.seed is not None:
            set_(self, "seed", check_int("seed", self.seed, 0, MAX_SEED,
                                         fix="or None for a fresh random seed"))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0




def warp(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """logits [..., V] -> probabilities [..., V] (fp32) after temperature, top-k, then top-p."""
    # A device tensor, not a Python float: CUDA would multiply by the reciprocal of a host
    # scalar (one bit off), and `warp_rows` divides by device values.
    x = logits.float() / torch.full((), params.temperature, device=logits.device)
    vocab = x.shape[-1]
    if 0 < params.top_k < vocab:
        kth = torch.topk(x, params.top_k, dim=-1).values[..., -1:]     # [..., 1]
        x = x.masked_fill(x < kth, float("-inf"))
    probs = torch.softmax(x, dim=-1)
    if params.top_p < 1.0:
        probs = probs.masked_fill(top_p_cut(probs, params.top_p), 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def top_p_cut_sorted(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """The specification of the top-p cut: probs [..., V] -> bool [..., V], True where a token
    goes. Tokens rank by probability, equal ones by id (a stable sort: which of them a cut
    keeps is a function of the probabilities, not of the sort's threads or the batch's shape);
    a token goes when the mass ranked strictly above it reaches top_p (never the first)."""
    sorted_p, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    before = torch.cumsum(sorted_p, dim=-1) - sorted_p                 # mass strictly above
    return torch.zeros_like(before, dtype=torch.bool).scatter(-1, order, before >= top_p)


# How many of a row's most likely tokens `top_p_cut` ranks first, and the factor it widens
# that by while they hold too little mass to settle the cut, up to a quarter of the vocabulary
# (past that the full sort costs about as much).
NUCLEUS_FIRST, NUCLEUS_GROWTH = 256, 16
# Past the cut, the mass ranked above a token is the candidates' sum less at most a rounding
# of the running sum (<= 1 + eps, so well under this): with that sum >= top_p + CUT_MARGIN,
# every token after the candidates goes.
CUT_MARGIN = 1e-6


def top_p_cut(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """`top_p_cut_sorted`, the same bits, without sorting the whole vocabulary on the CPU.

    A stable sort of 151,936 probabilities takes ~13 ms on a 2-core Xeon, once per sampled
    position (a plain step, each verify position, each draft guess): top_p decoding ran ~1.3x
    slower than temperature alone. The tokens ranked first are those at or above the k-th
    largest probability; sorted stably from id order they are exactly the head of the full
    sort, and a running sum over them has the bits of the full one's head (CPU cumsum is a
    sequential scan, tests/test_sampling_exact.py). Once their mass passes top_p + CUT_MARGIN
    everything after them goes, so their cut is the whole cut; if it does not (a flat
    distribution, a NaN) k grows, then the full sort. On CUDA the full sort is fast and its
    scan is parallel: `top_p_cut_sorted`."""
    V = probs.shape[-1]
    if (probs.device.type != "cpu" or probs.dtype != torch.float32 or V < 4 * NUCLEUS_FIRST
            or bool((probs < 0).any())):      # the margin holds for fp32 probabilities only
        return top_p_cut_sorted(probs, top_p)
    rows = probs.reshape(-1, V)                                                    # [R, V]
    cut = torch.ones(rows.shape, dtype=torch.bool)                                 # [R, V]
    for r in range(rows.shape[0]):
        cut[r] = _row_cut(rows[r], top_p)
    return cut.view(probs.shape)


def _row_cut(p: torch.Tensor, top_p: float) -> torch.Tensor:          # p [V] -> bool [V]
    V, k = p.shape[0], NUCLEUS_FIRST
    while 4 * k <= V:
        top = torch.topk(p, k).values                                               # [k]
        if torch.isnan(top).any():        # NaN sorts first, and every mass above is NaN
            break
        kth = top[-1]
        # after a top-k cut most of the row is 0: the positive ones are the head then
        ids = torch.nonzero(p > 0 if kth == 0 else p >= kth).squeeze(1)     # [m] in id order
        if not ids.numel():                       # no positive probability: not a distribution
            break
        sorted_p, order = torch.sort(p[ids], descending=True, stable=True)
        total = torch.cumsum(sorted_p, dim=0)                                       # [m]
        mass = float(total[-1])
        if mass >= top_p + CUT_MARGIN:
            cut = torch.ones(V, dtype=torch.bool)
            cut[ids[order]] = (total - sorted_p) >= top_p
            return cut
        # no later token is likelier than these m on average, so reaching top_p takes at
        # least m * top_p / mass of them: a flat row goes straight to the full sort
        k = max(k * NUCLEUS_GROWTH, int(ids.numel() * top_p / max(mass, 1e-30)))
    return top_p_cut_sorted(p, top_p)


# A row's warp settings as device data, for graphs that sample (`warp_rows`): one row of
# PARAM_COLUMNS fp32 values per request, written by `param_row`.
PARAM_COLUMNS = 4        # temperature, top_k, top_p, sampled (0/1)


def param_row(params: SamplingParams, vocab: int) -> tuple[float, float, float, float]:
    """[temperature, top_k, top_p, sampled] of a request for `warp_rows`. A greedy row gets a
    neutral warp (temperature 1, no cut) whose probabilities nothing reads; top_k is capped at
    the vocabulary (exact in fp32: vocabularies are far below 2**24)."""
    if params.greedy:
        return (1.0, 0.0, 1.0, 0.0)
    return (params.temperature, float(min(params.top_k, vocab)), params.top_p, 1.0)


def param_staging(batch_size: int, device: torch.device) -> Staging:
    """A staged [B, PARAM_COLUMNS] fp32 buffer of warp settings for `warp_rows`, every row a
    greedy row's neutral warp until a round writes its own (so a graph's capture warms up on
    finite probabilities)."""
    stage = Staging((batch_size, PARAM_COLUMNS), torch.float32, device)
    stage.device[:] = torch.tensor(param_row(SamplingParams(), 1), device=device)
    return stage


def stage_params(stage: Staging, params: list[SamplingParams], vocab: int) -> None:
    """Write each row's settings (`param_row`) into a `param_staging` buffer and queue its
    copy to the device."""
    rows = stage.write()                                                    # [B, PARAM_COLUMNS]
    for b, p in enumerate(params):
        rows[b] = param_row(p, vocab)
    stage.push()


def warp_rows(logits: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """`warp` with each row's settings read from the device, for CUDA graphs: logits [B, ..., V]
    and rows [B, PARAM_COLUMNS] (`param_row`) -> probabilities [B, ..., V] (fp32), equal to
    `warp(logits[b], params[b])` on every row: the same operations in the same order, each cut
    applied where the row asks for it. Bit for bit on the CPU (tests/test_sampling_exact.py);
    on CUDA a reduction's rounding may depend on how many rows share the call, so the two can
    differ in the last bit and a draw in the rare case of a tie within that rounding. It reads
    no value on the host, so its shapes and work are the same for every batch; the price is a
    sort for top-k where `warp` takes a top-k, and both sorts for every row."""
    B, V = logits.shape[0], logits.shape[-1]
    view = (B,) + (1,) * (logits.dim() - 1)
    temperature, top_k, top_p = (rows[:, i].view(view) for i in range(3))
    x = logits.float() / temperature
    k = top_k.long()
    ranked = torch.sort(x, dim=-1, descending=True).values
    kth = ranked.gather(-1, (k.clamp(1, V) - 1).expand(*x.shape[:-1], 1))      # [B, ..., 1]
    x = x.masked_fill((k > 0) & (k < V) & (x < kth), float("-inf"))
    probs = torch.softmax(x, dim=-1)
    sorted_p, order = torch.sort(probs, dim=-1, descending=True, stable=True)  # as `warp`
    before = torch.cumsum(sorted_p, dim=-1) - sorted_p                 # mass strictly above
    drop = torch.zeros_like(sorted_p, dtype=torch.bool).scatter(-1, order, before >= top_p)
    cut = probs.masked_fill(drop, 0.0)
    cut = cut / cut.sum(dim=-1, keepdim=True)
    return torch.where(top_p < 1.0, cut, probs)


def race(probs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """The exponential race: probs [..., V] and Exp(1) noise [..., V] -> argmax(p / E) [...],
    an exact draw from p (int64 token ids)."""
    return argmax(probs / noise)


def sample(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One exact draw per row from probs [..., V] -> token ids [...] (int64)."""
    return race(probs, exponential_noise(probs.shape, generator, probs.device))


def confidence(logits: torch.Tensor) -> torch.Tensor:
    """A model's top-1 probability per row: logits [B, V] -> [B] fp32 (softmax at temperature
    1 over the ids it scores; a shortlisted draft's unscored ones are -inf). Where the draft
    stops its round (`DraftModelDrafter`), and how sure the target was of a plain step's token
    (`RoundOutcome.target_sure`, which `auto` reads). Taken as the softmax's largest entry:
    torch's softmax passes over the -inf of the unscored ids quickly, where torch.exp of them
    is slow (over a shortlisted draft's 151,936 logits: 0.09 ms against 0.42 for exp(x - max)
    summed, each draft step; benchmarks/RESULTS.md, "The argmax over the vocabulary")."""
    return torch.softmax(logits.float(), dim=-1).amax(dim=-1)


def choose_rows(logits: torch.Tensor, params: list[SamplingParams],
                generators: list[torch.Generator | None], rows: list[bool] | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One token per row of logits [B, V], each row by its own params: the argmax where greedy,
    else a draw from the warped distribution -> tokens [B] and, when any row samples, probs
    [B, V] (zero rows where greedy). Each sampled row draws from its
    own generator, so a request's draws never depend on which requests share its batch.
    rows: [B] which rows to choose for (default all); the others get an argmax and draw nothing."""
    tokens = argmax(logits)                                             # [B]
    probs = None
    for group, p in sampling_groups(params, rows):
        if probs is None:
            probs = torch.zeros(logits.shape, dtype=torch.float32, device=logits.device)
        warped = warp(logits[group], p)                                 # [n, V]
        noise = torch.stack([exponential_noise(warped.shape[-1:], generators[b], logits.device)
                             for b in group])                           # [n, V]
        probs[group] = warped
        tokens[group] = race(warped, noise)
    return tokens, probs


def sampling_groups(params: list[SamplingParams], rows: list[bool] | None = None
                    ) -> list[tuple[list[int], SamplingParams]]:
    """The sampled rows (of those selected), grouped by identical warp settings, so each group
    warps in one call; greedy rows are left out."""
    groups: dict[tuple, tuple[list[int], SamplingParams]] = {}
    for b, p in enumerate(params):
        if p.greedy or (rows is not None and not rows[b]):
            continue
        key = (p.temperature, p.top_k, p.top_p)
        groups.setdefault(key, ([], p))[0].append(b)
    return list(groups.values())


def make_generator(seed: int | None, device) -> torch.Generator:
    gen = torch.Generator(device=device)
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(seed)
    return gen
