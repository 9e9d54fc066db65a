"""Drafting with a small model that shares the target's tokenizer.

The draft model keeps its own static KV cache. `seen[b]` counts the committed tokens of row b
whose K/V are in that cache; each round it first catches up on the committed tokens it has not
seen (the whole prompt on the first round, then usually the target's last token, or two tokens
after a fully accepted round), then decodes K steps, feeding each guess to the next step.
Rejected guesses are rolled back (by the round, through `rollback`) by truncating its cache
to the accepted length: O(1).
"""
from __future__ import annotations

import torch

from specrt.model.transformer import Transformer
from specrt.spec.drafters.base import NO_DRAFT, DraftContext, Proposal, right_pad
from specrt.spec.drafters.draft_loop import StaticDraftLoop
from specrt.spec.sampling import choose


class DraftModelDrafter:
    name = "draft_model"

    def __init__(self, model: Transformer, target_vocab_size: int, max_batch_size: int,
                 max_seq_len: int, static: bool = False):
        self.model = model
        # static: run guesses 2..K through a StaticDraftLoop (a CUDA graph on CUDA).
        self.static = static
        self._loops: dict[tuple, StaticDraftLoop] = {}
        # Checkpoints pad their embeddings differently; a guess must be a token both can read,
        # and q must live on the target's vocabulary axis for the acceptance test.
        self.target_vocab_size = target_vocab_size
        self.common_vocab = min(model.cfg.vocab_size, target_vocab_size)
        self.cache = model.new_cache(max_batch_size, max_seq_len)
        self.seen: list[int] = []
        self._pending: list[int] = []   # committed tokens fed this round, per row
        self._guesses: list[int] = []   # guesses fed back this round, per row (k - 1 or 0)

    def begin(self, batch_size: int) -> None:
        self.cache.reset()
        self.seen = [0] * batch_size
        self._pending = [0] * batch_size
        self._guesses = [0] * batch_size

    def unseen(self, ctx: DraftContext) -> int:
        """The longest run of committed tokens an active row has not fed to the draft model:
        what the first forward of the next proposal must catch up on."""
        return max((len(h) - s for h, s, a in zip(ctx.histories, self.seen, ctx.active) if a),
                   default=0)

    @torch.inference_mode()
    def propose(self, ctx: DraftContext, k: int) -> Proposal | None:
        pending = [h[s:] if a else [] for h, s, a in zip(ctx.histories, self.seen, ctx.active)]
        valid = [len(p) for p in pending]
        if max(valid) == 0:
            return None
        device = self.model.device
        # Catch up on the unseen committed tokens; its last logits give the first guess.
        logits = self.model.forward(right_pad(pending).to(device), self.cache, num_valid=valid,
                                    last_only=True)
        first, q = choose(logits[:, 0, : self.common_vocab], ctx.params, ctx.generator)
        guesses, qs = [first], [q]                                   # [B] each, [B, V_common]
        if self.static and k > 1:
            rest, rest_q = self._loop(first.shape[0], k, ctx.params).run(first, ctx.generator)
            guesses += list(rest.unbind(1))
            qs += list(rest_q[..., : self.common_vocab].unbind(1)) if rest_q is not None \
                else [None] * (k - 1)
        else:
            step_valid = [int(a) for a in ctx.active]
            for _ in range(k - 1):   # the last guess is never fed: nothing would read its K/V
                logits = self.model.forward(guesses[-1][:, None], self.cache,
                                            num_valid=step_valid)
                guess, q = choose(logits[:, 0, : self.common_vocab], ctx.params,
                                  ctx.generator)
                guesses.append(guess)
                qs.append(q)
        self._pending = valid
        # inactive rows may have run through the static loop; their seen count stays put
        self._guesses = [k - 1 if a else 0 for a in ctx.active]
        tokens = torch.stack(guesses, dim=1)                                 # [B, K]
        tokens[torch.tensor([not a for a in ctx.active], device=device)] = NO_DRAFT
        probs = None
        if not ctx.params.greedy:                                            # [B, K, V_target]
            probs = torch.nn.functional.pad(torch.stack(qs, dim=1),
                                            (0, self.target_vocab_size - self.common_vocab))
        return Proposal(tokens=tokens, probs=probs, counts=[k if a else 0 for a in ctx.active])

    def _loop(self, batch_size: int, k: int, params) -> StaticDraftLoop:
        key = (batch_size, k - 1, params.temperature, params.top_k, params.top_p)
        loop = self._loops.get(key)
        if loop is None:
            loop = self._loops[key] = StaticDraftLoop(
                self.model, self.cache, batch_size, k - 1, params, self.common_vocab,
                self.target_vocab_size, use_graph=True)
        return loop

    def rollback(self, num_accepted: list[int]) -> None:
        # Cached K/V stay valid for the pending tokens plus the accepted guesses that were fed.
        self.seen = [s + p + min(n, g) for s, p, g, n
                     in zip(self.seen, self._pending, self._guesses, num_accepted)]
        self.cache.truncate(self.seen)
        self._pending = [0] * len(self.seen)
        self._guesses = [0] * len(self.seen)
