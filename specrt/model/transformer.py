"""Qwen2 / Llama-style decoder: forward(input_ids [B, T], cache) -> logits [B, T, V].

One forward serves prefill (T = prompt length), decode (T = 1) and verify (T = K + 1): the
positions of the T new tokens come from the cache's per-row lengths, their K/V are written at
those positions, and each query attends to every cached position up to its own. The layer
arithmetic belongs to the backend chosen at load (`specrt.model.backends`); this class holds
the weights and the bookkeeping around a pass. Nothing here knows about drafting, sampling or
text.

Weights are plain tensors (no nn.Module tree): q/k/v are fused into one projection and
gate/up into another at load time, so a decode step makes 4 matmuls per layer instead of 7.
"""
from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import torch

from specrt.checks import check_device, check_int
from specrt.errors import CapacityError
from specrt.model.backends import Backend, Linear, Pass, select_backend
from specrt.model.backends.torch_ref import rope_tables
from specrt.model.config import ModelConfig
from specrt.model.kv_cache import StaticKVCache, check_fits
from specrt.model.loader import load_state_dict, parse_dtype


@dataclasses.dataclass
class Layer:
    input_norm: torch.Tensor   # [H]
    qkv: Linear                # [H] -> [q_size + 2 * kv_size]
    o: Linear                  # [q_size] -> [H]
    post_norm: torch.Tensor    # [H]
    gate_up: Linear            # [H] -> [2 * I]
    down: Linear               # [I] -> [H]


class Transformer:
    def __init__(self, cfg: ModelConfig, weights: dict[str, torch.Tensor], max_seq_len: int,
                 backend: Backend | str | None = None, quant: str | None = None,
                 head_rows: list[int] | None = None, screen: bool = True):
        """Takes ownership of `weights` (popped). backend: a Backend, a backend name, or None
        for the device's default (see specrt.model.backends). quant: store the projections and
        the output head quantized ("int8", for a draft model), None: in the weights' dtype.
        head_rows: score only these token ids (a draft model's shortlist: its output head
        shrinks to them, every other logit is -inf, except the ids a pass names in
        `also_score`); None: the whole vocabulary.
        screen: keep what gives greedy passes their argmax without reading the whole head where
        the backend has it (`forward(argmax_only=True)`; a draft never asks, and skips it)."""
        self.cfg = cfg
        # Every pass clamps a position into the rotary tables of max_seq_len rows: none would
        # leave a table of nothing to clamp into (the C++ layer loop read row -1 of it).
        max_seq_len = check_int("max_seq_len", max_seq_len, 1,
                                fix="the most positions a sequence holds, at least 1")
        if head_rows is not None:
            head_rows = [check_int("head_rows[]", r, 0, cfg.vocab_size - 1,
                                   fix="token ids of the model's vocabulary")
                         for r in head_rows]
        w = weights
        self.embed = w.pop("model.embed_tokens.weight")            # [V, H]
        self.norm = w.pop("model.norm.weight")                      # [H]
        self.dtype = self.embed.dtype
        self.device = self.embed.device
        if not isinstance(backend, (str, type(None))):
            self.backend = backend
        else:
            self.backend = select_backend(self.device, self.dtype, backend)
        self.quant = quant
        linear = functools.partial(self.backend.linear, quant=quant)
        head = w.pop("lm_head.weight", self.embed)   # tied: the embeddings (loader.py)
        self.head_rows = None
        self.head_all = None    # [V, H] every id's head row, in the weights' dtype (shortlisted)
        if head_rows is not None:
            self.head_rows = torch.tensor(sorted(set(head_rows)), dtype=torch.int64,
                                          device=self.device)                 # [N]
            self.head_all = head      # tied: the embeddings, kept anyway; untied: kept beside
                                      # the shortlist (memory a step never reads)
            head = head[self.head_rows]
        self.lm_head = linear(head)
        kept = getattr(self.lm_head, "weight", None)
        if (head is self.embed and isinstance(kept, torch.Tensor) and kept.shape == head.shape
                and kept.dtype == head.dtype):
            self.embed = kept      # tied: one copy, wherever the backend keeps the head's weight
        # greedy passes' argmax without the whole head (None: they read it all)
        self.head_screen = (self.backend.screened_head(self.lm_head)
                            if screen and head_rows is None else None)
        self.layers = [self._layer(w, f"model.layers.{n}.", linear) for n in range(cfg.num_layers)]
        self.source = f"<in-memory {id(self):x}>"   # where the weights came from (from_dir)
        # Memory hook: refuse a max_seq_len whose one-row KV cache cannot fit before the rope
        # tables (smaller, also sized by max_seq_len) go to the allocator.
        check_fits((cfg.num_layers, 1, cfg.num_kv_heads, max_seq_len, cfg.head_dim),
                   self.dtype, self.device)
        self.cos, self.sin = rope_tables(cfg.head_dim, cfg.rope_theta, max_seq_len, self.dtype,
                                         self.device)                   # [S, D] each

    def _layer(self, w: dict, p: str, linear) -> Layer:
        qkv_w = torch.cat([w.pop(p + f"self_attn.{x}_proj.weight") for x in "qkv"])
        qkv_b = (torch.cat([w.pop(p + f"self_attn.{x}_proj.bias") for x in "qkv"])
                 if self.cfg.attention_bias else None)
        return Layer(
            input_norm=w.pop(p + "input_layernorm.weight"),
            qkv=linear(qkv_w, qkv_b),
            o=linear(w.pop(p + "self_attn.o_proj.weight")),
            post_norm=w.pop(p + "post_attention_layernorm.weight"),
            gate_up=linear(torch.cat([w.pop(p + "mlp.gate_proj.weight"),
                                      w.pop(p + "mlp.up_proj.weight")])),
            down=linear(w.pop(p + "mlp.down_proj.weight")),
        )

    @classmethod
    def from_dir(cls, model_dir: str | Path, dtype="float32", device="cpu",
                 max_seq_len: int = 4096, backend: str | None = None,
                 quant: str | None = None, head_rows: list[int] | None = None,
                 screen: bool = True) -> "Transformer":
        device = check_device(device)
        cfg = ModelConfig.from_dir(model_dir)
        weights = load_state_dict(model_dir, cfg, parse_dtype(dtype), device)
        model = cls(cfg, weights, max_seq_len, backend, quant, head_rows, screen)
        model.source = str(Path(model_dir).resolve())
        return model

    @property
    def max_positions(self) -> int:
        """Positions the rotary tables were built for (the max_seq_len it was loaded with):
        every path clamps a position past them, which is silently wrong for generation (the
        engine refuses longer sequences; a cost calibration's timing does not care)."""
        return self.cos.shape[0]

    def new_cache(self, max_batch_size: int, max_seq_len: int, slack: int = 0
                  ) -> StaticKVCache:
        """A cache for rows of up to max_seq_len tokens, with `slack` positions more allocated
        for the padding of fixed-shape passes (StaticKVCache)."""
        return StaticKVCache(self.cfg.num_layers, max_batch_size, self.cfg.num_kv_heads,
                             max_seq_len, self.cfg.head_dim, self.dtype, self.device, slack)

    @property
    def weight_bytes(self) -> int:
        """Bytes of weights one greedy decode step reads (embedding rows excluded; the head, or
        where it is screened its int8 copy: a sampled step reads the full head instead)."""
        head = self.head_screen if self.head_screen is not None else self.lm_head
        n = head.nbytes + self.norm.numel() * self.norm.element_size()
        for layer in self.layers:
            n += sum(lin.nbytes for lin in (layer.qkv, layer.o, layer.gate_up, layer.down))
            n += 2 * layer.input_norm.numel() * layer.input_norm.element_size()
        return n

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, cache: StaticKVCache,
                num_valid: list[int] | None = None, last_only: bool = False,
                also_score: list[tuple[torch.Tensor, torch.Tensor] | None] | None = None,
                argmax_only: bool = False) -> torch.Tensor:
        """Run T new tokens per row through the model and append their K/V to `cache`.

        input_ids: [B, T] token ids; row b's tokens sit at positions lengths[b] + t.
        num_valid: [B] how many of row b's T tokens are real (default all); the rest are
            right-padding: their K/V are not kept and their logits are meaningless.
        last_only: return only the logits of each row's last valid token, [B, 1, V].
        also_score: [B] more ids each row scores, outside `head_rows` (a shortlisted model
            only): `also_scoring(ids)` of each row, or None (`_score_also`).
        argmax_only: the caller reads each position's argmax (greedy rows; `confidence` too,
            approximately): where the backend screens the head (`head_screen`) the logits are
            exact at the ids that may be the argmax and the int8 head's elsewhere, so their
            argmax, ties included, is the full head's and their softmax close to it.
        Returns fp32 logits [B, T, V] (or [B, 1, V]), zeros at the padding (which the backend
        need not compute); cache lengths advance by num_valid.
        """
        lengths = cache.host_lengths()
        B, T, valid = self._check_pass(input_ids, len(lengths), num_valid)
        rows = Pass(T, lengths[:B], valid)
        need = max(s + v for s, v in zip(rows.starts, rows.valid))
        if need > cache.max_seq_len:
            raise CapacityError(f"KV cache overflow: a row needs {need} positions but "
                                f"max_seq_len is {cache.max_seq_len}; raise max_seq_len")
        h = self.backend.hidden(self, input_ids, cache, rows, last_only)    # [N | B, H]
        cache.advance(rows.valid)
        logits = self._logits(h, argmax_only)     # only real tokens are scored: [N | B, V]
        unpack = (lambda x: x.view(B, 1, -1)) if last_only else rows.unpack
        logits = unpack(logits)                                              # [B, T, V]
        if also_score is not None and any(also_score):
            self._score_also(logits, unpack(h), also_score)
        return logits

    def _check_pass(self, input_ids, cache_rows: int, num_valid) -> tuple[int, int, list[int]]:
        """(B, T, num_valid as a list) of a pass, or ValueError naming what is wrong: an
        embedding lookup would wrap a negative id (-1 read as the last id, silently) and
        raise an IndexError for one past the vocabulary."""
        if not (isinstance(input_ids, torch.Tensor) and input_ids.dim() == 2
                and input_ids.dtype == torch.int64):
            got = (f"{input_ids.dtype} of shape {tuple(input_ids.shape)}"
                   if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__)
            raise ValueError(f"forward: input_ids must be an int64 tensor [B, T], got {got}")
        B, T = input_ids.shape
        if not 1 <= B <= cache_rows or T < 1:
            raise ValueError(f"forward: input_ids [B, T] = {tuple(input_ids.shape)} needs "
                             f"1 <= B <= {cache_rows} (the cache's rows) and T >= 1")
        # A CUDA tensor's values would be read by a host sync: the engine checks a request's
        # ids where it admits them (engine/request.py), and the static path never syncs.
        if input_ids.device.type == "cpu" and input_ids.numel():
            lo, hi = map(int, torch.aminmax(input_ids))
            if lo < 0 or hi >= self.cfg.vocab_size:
                raise ValueError(f"forward: input_ids must be token ids in 0.."
                                 f"{self.cfg.vocab_size - 1}, got {lo if lo < 0 else hi}")
        valid = [T] * B if num_valid is None else list(num_valid)
        if len(valid) != B or not all(isinstance(v, int) and 0 <= v <= T for v in valid):
            raise ValueError(f"forward: num_valid must be {B} ints in 0..{T} (each row's "
                             f"real tokens), got {valid!r:.80}")
        return B, T, valid

    def forward_static(self, input_ids: torch.Tensor, cache: StaticKVCache) -> torch.Tensor:
        """The CUDA-graph-safe forward: every row's T tokens are real, positions and lengths
        are read from and advanced in the cache's device tensor, shapes never depend on data,
        and nothing syncs with the host. The caller owns the host mirror of the lengths
        (`cache.note_advanced`) and the capacity check. Returns fp32 logits [B, T, V]."""
        return self._logits(self.backend.hidden_static(self, input_ids, cache))

    def also_scoring(self, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor] | None:
        """What `forward(also_score=...)` takes for a row scoring `ids` past the shortlist too:
        (ids [X] int64, their head rows [X, H] fp32), gathered once for any number of passes;
        None for no ids. Only for a model loaded with head_rows."""
        if self.head_all is None:
            raise ValueError("also_scoring: this model scores every id (no head_rows)")
        if not ids:
            return None
        bad = [t for t in ids if not 0 <= t < self.cfg.vocab_size]
        if bad:
            raise ValueError(f"also_scoring: ids {bad[:3]} are not in the vocabulary "
                             f"(0..{self.cfg.vocab_size - 1})")
        cols = torch.tensor(ids, dtype=torch.int64, device=self.device)          # [X]
        return cols, self.head_all.index_select(0, cols).float()                 # [X, H]

    def _score_also(self, logits: torch.Tensor, h: torch.Tensor,
                    rows: list[tuple[torch.Tensor, torch.Tensor] | None]) -> None:
        """Fill in the logits of each row's ids past the shortlist (`also_scoring`): logits
        [B, T, V] fp32, h [B, T, H]. Each row is scored on its own, [T, H] x [H, X_b] in fp32,
        so its numbers depend on its own ids and the pass's T only, not on the other rows'
        contents (a drafter's passes score one position per row: T = 1)."""
        for b, row in enumerate(rows):
            if row is not None:
                cols, w = row                                        # [X_b], [X_b, H]
                logits[b].index_copy_(-1, cols, h[b].float() @ w.T)                 # [T, X_b]

    def _logits(self, h: torch.Tensor, argmax_only: bool = False) -> torch.Tensor:
        """fp32 logits [..., V] of the final hidden states h [..., H] (argmax_only: `forward`)."""
        if argmax_only and self.head_screen is not None:
            screened = self.head_screen(h.reshape(-1, h.shape[-1]))                # [N, V]
            if screened is not None:
                return screened.view(*h.shape[:-1], -1)
        logits = self.lm_head(h, torch.float32)                  # [B, T, V] or [B, T, N]
        if self.head_rows is None:
            return logits
        full = torch.full((*logits.shape[:-1], self.cfg.vocab_size), float("-inf"),
                          device=logits.device)                  # [B, T, V]
        return full.index_copy_(-1, self.head_rows, logits)
