"""Each row's argmax over the vocabulary, exactly, without reading the whole output head.

A greedy pass needs only the id of each row's largest logit, and the output head is the largest
matrix a step reads (the 1.5B target's 151,936 x 1536, 467 MB in bf16: 15% of its step; the
0.5B's 24%). `ScreenedHead` keeps an int8 copy of the head (per-row scales,
`specrt.kernels.cpu.gemv_int8`, half the bytes) and, per row of hidden state x:

1. a = the int8 product, every id's approximate logit;
2. an interval a_n +- b_n that holds the exact logit L_n, the bits the full head's kernel gives:
       L_n - a_n = (x - x~) . W_n + x~ . (W_n - W~_n)
   where x~ is x as the int8 kernel quantizes it (per block of 64) and W~_n the row's int8
   values times its scale, so by Cauchy-Schwarz
       |L_n - a_n| <= ||x - x~|| ||W_n|| + ||x~|| ||W_n - W~_n||  (+ both products' fp32
   rounding, at most SLACK_ULPS * K units of 2^-24 of (||x|| + ||x~||)(||W_n|| + ||W_n - W~_n||));
   the row norms are computed once, at load (the 1.5B's 151,936-row head: ~1.4 s with its
   int8 copy);
3. the candidates: every id whose upper end a_n + b_n reaches the largest lower end
   max_j (a_j - b_j). The argmax is among them, and so is every id tied with it (its L equals
   the max, so its upper end is at least every lower end);
4. the candidates' exact logits, from their rows of the head gathered and multiplied by the
   same kernel as the full head (a product's rows never depend on the other rows: the bits are
   the full head's); every other id keeps its int8 logit a_n, which is below the row's max
   (a_n <= a_n + b_n < the best lower end <= the max).

So the argmax of the screened logits is the argmax of the full ones, ties included (the first
maximal id), and their softmax is close to the full one's (the ids outside the candidates, far
below the max, off by their int8 error): what a greedy round reads, the argmax and `auto`'s
`confidence`. Sampling and prompt passes read the full head
(`Transformer.forward(argmax_only=False)`, the default). Rows whose hidden state is not
finite, a head that is not, and passes of more than MAX_ROWS rows take the full head too.

On the 1.5B target's decode steps (120 steps of three chat answers, AVX2): the bound was ~2.2
logits where the int8 logits were off by at most 0.19, a median of 3 candidates a step (48 at
most), and the int8 head read in 8.2 ms what the bf16 one read in 17.1 (benchmarks/RESULTS.md,
"A screened output head"); `confidence` from the screened logits was within 0.0016 of the
full head's (0.25% relative, median 1e-4) over the same steps.
"""
from __future__ import annotations

import math

import torch

from specrt.kernels.cpu import gemv, gemv_int8

ENV_VAR = "SPECRT_HEAD_SCREEN"    # 0, false, off or no: every pass reads the full head
# Both products' fp32 rounding, in units of 2^-24 per input value (each sum of K products is
# within K units of the sum of their magnitudes; 4 covers both products and the bound's own
# arithmetic with room to spare).
SLACK_ULPS = 4
# The most rows (tokens of a pass) screened: the int8 product's cost grows faster with the rows
# than the bf16 one's on AVX2 (no VNNI: bytes widened to 16 bits, vpmaddwd). The 1.5B's head,
# real hidden states, one process alternating (AVX2 Zen 3; benchmarks/RESULTS.md): full /
# screened 1.72-1.76x at 1 row, 1.34-1.53x at 2, 0.95-0.99x at 3, 0.85-1.1x at 4, 0.9-1.2x at
# 5-8, 0.95-1.06x at 17. Not measured on AVX-512 VNNI, whose int8 product is faster.
MAX_ROWS = 2
# Rows of the head quantized and normed at a time at load (bounded fp32 temporaries).
_LOAD_ROWS = 4096


def serves(weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether a head of this weight can be screened here: the int8 kernel runs, the full head
    is `gemv`'s kernel (whose rows' bits the gathered product reproduces), no bias, and K a
    multiple of the int8 kernel's block."""
    return (gemv_int8.AVAILABLE and gemv.usable(weight) and bias is None
            and weight.dim() == 2 and weight.shape[1] % gemv_int8.BLOCK == 0)


class ScreenedHead:
    """The argmax-exact logits of a head W [V, H] (see the module docstring)."""

    def __init__(self, weight: torch.Tensor,   # [V, H] bf16 or fp32, as the full head reads it
                 place=lambda t: t):               # where the int8 copy is kept (huge pages)
        if not serves(weight, None):
            raise ValueError("ScreenedHead: needs a contiguous bf16 or fp32 CPU weight [V, H] "
                             f"with H a multiple of {gemv_int8.BLOCK} and the int8 kernel built")
        self.weight = weight
        q = gemv_int8.quantize(weight)
        self.int8 = gemv_int8.Int8Weight(place(q.data), q.scale, q.packed_rows)
        V = weight.shape[0]
        self.norm = torch.empty(V)            # [V] ||W_n||
        self.error = torch.empty(V)           # [V] ||W_n - W~_n||
        rows = self.int8.rows()
        for n0 in range(0, V, _LOAD_ROWS):
            part = slice(n0, n0 + _LOAD_ROWS)
            w = weight[part].float()             # [n, H] (fp32 weights: a view, left alone)
            self.norm[part] = w.norm(dim=1)
            q = (rows[part].float() - 128).mul_(self.int8.scale[part, None])        # [n, H]
            self.error[part] = q.sub_(w).norm(dim=1)
        # fp32 norms are within ~H units of 2^-24 of the true ones: taken 0.1% over
        self.norm *= 1.001
        self.error *= 1.001
        self.norm_max, self.error_max = float(self.norm.max()), float(self.error.max())
        # a head holding inf or NaN bounds nothing: its passes read the full head (whose
        # logits the engine checks)
        self.finite = math.isfinite(self.norm_max) and math.isfinite(self.error_max)
        self.slack = SLACK_ULPS * weight.shape[1] * 2.0 ** -24

    @property
    def nbytes(self) -> int:
        """What a screened pass reads besides the candidates' rows: the int8 head, its norms."""
        return self.int8.nbytes + 4 * (self.norm.numel() + self.error.numel())

    def __call__(self, h: torch.Tensor) -> torch.Tensor | None:
        """fp32 logits [N, V] of the hidden states h [N, H]: exact at the candidates, the int8
        head's elsewhere (each below its row's max); None for more than MAX_ROWS rows, a row
        that is not finite or a head that is not (the caller takes the full head)."""
        if not self.finite or h.shape[0] > MAX_ROWS or not bool(torch.isfinite(h).all()):
            return None
        a, alpha, beta = self._approx(h)                            # [N, V], [N, 1], [N, 1]
        ids = self._candidates(a, alpha, beta)                                   # [C]
        if not ids.numel():              # only where the int8 logits overflowed to inf
            return None
        exact = gemv.linear(h, self.weight.index_select(0, ids), None, torch.float32)  # [N, C]
        return a.index_copy_(1, ids, exact)

    def candidates(self, h: torch.Tensor) -> torch.Tensor:
        """The ids [C] whose exact logits a pass of finite h [N, H] computes (ascending)."""
        return self._candidates(*self._approx(h))

    def _candidates(self, a: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor
                    ) -> torch.Tensor:
        """The ids [C] any row of a [N, V] may have as its argmax: whose upper end reaches the
        row's best lower end. Two passes over the vocabulary, not six: with bmax a row's largest
        b, its best lower end is at least max(a) - bmax, so every candidate has
        a >= max(a) - 2 bmax; the intervals are then computed for those ids alone."""
        bmax = alpha * self.norm_max + beta * self.error_max                     # [N, 1]
        near = (a >= a.amax(dim=1, keepdim=True) - 2 * bmax).any(dim=0).nonzero()[:, 0]
        a_near = a[:, near]                                                      # [N, C0]
        b_near = alpha * self.norm[near] + beta * self.error[near]               # [N, C0]
        floor = (a_near - b_near).amax(dim=1, keepdim=True)                      # [N, 1]
        return near[((a_near + b_near) >= floor).any(dim=0)]                     # [C]

    def interval(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(a, b), fp32 [N, V] each: every exact logit of finite h [N, H] is within a +- b."""
        a, alpha, beta = self._approx(h)
        return a, alpha * self.norm + beta * self.error

    def _approx(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(a, alpha, beta): the int8 logits [N, V] of h [N, H], and [N, 1] each the scales of
        the bound b = alpha ||W|| + beta ||W - W~||, a little over it (fp32 arithmetic):
        alpha = ||x - x~|| + slack, beta = ||x~|| + slack."""
        a = gemv_int8.linear(h, self.int8, None, torch.float32)                 # [N, V]
        x = h.float()                                                            # [N, H]
        xq = gemv_int8.dequantized_rows(x)                                       # [N, H]
        nx, nq, dx = x.norm(dim=1), xq.norm(dim=1), (x - xq).norm(dim=1)         # [N]
        slack = self.slack * (nx + nq)                                           # [N]
        return a, ((dx + slack) * 1.001)[:, None], ((nq + slack) * 1.001)[:, None]
