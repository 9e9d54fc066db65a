"""Qwen2 / Llama-style decoder: forward(input_ids [B, T], cache) -> logits [B, T, V].

One forward serves prefill (T = prompt length), decode (T = 1) and verify (T = K + 1): the
positions of the T new tokens come from the cache's per-row lengths, their K/V are written at
those positions, and each query attends to every cached position up to its own. Nothing here
knows about drafting, sampling or text.

Weights are plain tensors (no nn.Module tree): q/k/v are fused into one projection and
gate/up into another at load time, so a decode step makes 4 matmuls per layer instead of 7.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
import torch.nn.functional as F

from specrt.config import ModelConfig
from specrt.errors import CapacityError
from specrt.kernels import verify_attention
from specrt.kernels.cpu import gemv as cpu_gemv, ops as cpu_ops
from specrt.kv_cache import StaticKVCache
from specrt.loader import load_state_dict, parse_dtype


MAX_KERNEL_T = 17     # the verify-attention kernel's largest query block (K_max + 1)


def use_kernel(device: torch.device, t: int, head_dim: int) -> bool:
    """The Triton verify-attention kernel serves decode and verify on CUDA for power-of-two
    head sizes (64, 128: the Qwen2.5 family); prefill (long T), other head sizes and the CPU
    use SDPA, whose semantics are the same."""
    return (device.type == "cuda" and t <= MAX_KERNEL_T and head_dim >= 16
            and head_dim & (head_dim - 1) == 0)


class Linear:
    """y = x @ W^T + b. On the CPU, decode and verify go through specrt.kernels.cpu.gemv (weights in
    [out, in] layout, streamed once per call); without that kernel, fp32 weights are stored
    pre-transposed, since MKL's small-M path re-reads an [out, in] weight once per row while
    the [in, out] layout streams it once. bf16/fp16 and CUDA use `F.linear`."""

    __slots__ = ("weight", "bias", "transposed")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        self.transposed = (weight.device.type == "cpu" and weight.dtype == torch.float32
                           and not cpu_gemv.usable(weight))
        self.weight = weight.t().contiguous() if self.transposed else weight  # [in,out] | [out,in]
        self.bias = bias

    def __call__(self, x: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
        if self.transposed:
            y = x @ self.weight
            y = y + self.bias if self.bias is not None else y
            return y if out_dtype is None else y.to(out_dtype)
        return cpu_gemv.linear(x, self.weight, self.bias, out_dtype)

    @property
    def nbytes(self) -> int:
        n = self.weight.numel() * self.weight.element_size()
        return n + (self.bias.numel() * self.bias.element_size() if self.bias is not None else 0)


@dataclasses.dataclass
class Layer:
    input_norm: torch.Tensor   # [H]
    qkv: Linear                # [H] -> [q_size + 2 * kv_size]
    o: Linear                  # [q_size] -> [H]
    post_norm: torch.Tensor    # [H]
    gate_up: Linear            # [H] -> [2 * I]
    down: Linear               # [I] -> [H]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # Normalise in fp32, scale in the input dtype: the same rounding as the reference models.
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def rope_tables(cfg: ModelConfig, max_seq_len: int, dtype, device):
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float32)
                                         / cfg.head_dim))
    freqs = torch.outer(torch.arange(max_seq_len, dtype=torch.float32), inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)                    # [S, D]
    return emb.cos().to(dtype).to(device), emb.sin().to(dtype).to(device)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, T, H, D]; cos/sin [B, T, 1, D]; rotate-half convention (as Qwen2/Llama)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class Transformer:
    def __init__(self, cfg: ModelConfig, weights: dict[str, torch.Tensor], max_seq_len: int):
        self.cfg = cfg
        w = weights
        self.embed = w.pop("model.embed_tokens.weight")            # [V, H]
        self.norm = w.pop("model.norm.weight")                      # [H]
        head = self.embed if cfg.tie_word_embeddings else w.pop("lm_head.weight")
        self.lm_head = Linear(head)
        self.layers: list[Layer] = []
        for n in range(cfg.num_layers):
            p = f"model.layers.{n}."
            qkv_w = torch.cat([w.pop(p + f"self_attn.{x}_proj.weight") for x in "qkv"])
            qkv_b = (torch.cat([w.pop(p + f"self_attn.{x}_proj.bias") for x in "qkv"])
                     if cfg.attention_bias else None)
            self.layers.append(Layer(
                input_norm=w.pop(p + "input_layernorm.weight"),
                qkv=Linear(qkv_w, qkv_b),
                o=Linear(w.pop(p + "self_attn.o_proj.weight")),
                post_norm=w.pop(p + "post_attention_layernorm.weight"),
                gate_up=Linear(torch.cat([w.pop(p + "mlp.gate_proj.weight"),
                                          w.pop(p + "mlp.up_proj.weight")])),
                down=Linear(w.pop(p + "mlp.down_proj.weight")),
            ))
        self.dtype = self.embed.dtype
        self.device = self.embed.device
        self.source = f"<in-memory {id(self):x}>"   # where the weights came from (from_dir)
        self.cos, self.sin = rope_tables(cfg, max_seq_len, self.dtype, self.device)

    @classmethod
    def from_dir(cls, model_dir: str | Path, dtype="float32", device="cpu",
                 max_seq_len: int = 4096) -> "Transformer":
        cfg = ModelConfig.from_dir(model_dir)
        weights = load_state_dict(model_dir, cfg, parse_dtype(dtype), device)
        model = cls(cfg, weights, max_seq_len)
        model.source = str(Path(model_dir).resolve())
        return model

    def new_cache(self, max_batch_size: int, max_seq_len: int) -> StaticKVCache:
        return StaticKVCache(self.cfg.num_layers, max_batch_size, self.cfg.num_kv_heads,
                             max_seq_len, self.cfg.head_dim, self.dtype, self.device)

    @property
    def weight_bytes(self) -> int:
        """Bytes of weights one decode step reads (embedding rows excluded, lm_head included)."""
        n = self.lm_head.nbytes + self.norm.numel() * self.norm.element_size()
        for layer in self.layers:
            n += sum(lin.nbytes for lin in (layer.qkv, layer.o, layer.gate_up, layer.down))
            n += 2 * layer.input_norm.numel() * layer.input_norm.element_size()
        return n

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, cache: StaticKVCache,
                num_valid: list[int] | None = None, last_only: bool = False) -> torch.Tensor:
        """Run T new tokens per row through the model and append their K/V to `cache`.

        input_ids: [B, T] token ids; row b's tokens sit at positions lengths[b] + t.
        num_valid: [B] how many of row b's T tokens are real (default all); the rest are
            right-padding: their K/V are not kept and their logits are meaningless.
        last_only: return only the logits of each row's last valid token, [B, 1, V].
        Returns fp32 logits [B, T, V] (or [B, 1, V]); cache lengths advance by num_valid.
        """
        cfg = self.cfg
        B, T = input_ids.shape
        device = self.device
        start = cache.host_lengths()[:B]
        valid = list(num_valid) if num_valid is not None else [T] * B
        end = [s + n for s, n in zip(start, valid)]
        if max(end) > cache.max_seq_len:
            raise CapacityError(f"KV cache overflow: a row needs {max(end)} positions but "
                                f"max_seq_len is {cache.max_seq_len}; raise max_seq_len")
        s_used = max(end)                                            # keys any query may see

        start_t = cache.lengths[:B]                                  # [B] device
        pos = start_t[:, None] + torch.arange(T, device=device)      # [B, T]
        # Where each new token's K/V goes: only valid tokens are written.
        keep = torch.arange(T)[None, :] < torch.tensor(valid)[:, None]   # [B, T] host
        all_valid = bool(keep.all())
        if all_valid:
            rows = torch.arange(B, device=device)[:, None].expand(B, T)
            write_rows, write_pos = rows, pos
        else:
            rows, cols = keep.nonzero(as_tuple=True)
            write_rows = rows.to(device)
            write_pos = pos[write_rows, cols.to(device)]

        if device.type == "cpu" and cpu_ops.usable(self.dtype, device, B * T):
            h = self._layers_cpu(input_ids, start, valid, cache)         # [B, T, H], normed
            cache.advance(valid)
            if last_only:
                h = h[torch.arange(B), torch.tensor(valid) - 1][:, None]
            return self.lm_head(h, torch.float32)

        if use_kernel(device, T, cfg.head_dim) and all_valid:
            lens = torch.tensor(end, dtype=torch.int32, device=device)
            attend = lambda q, k_cache, v_cache: verify_attention(  # noqa: E731
                q, k_cache[:B], v_cache[:B], lens)
        else:
            mask = self._sdpa_mask(pos, s_used, simple=T == 1 and len(set(start)) == 1
                                   and all_valid)
            attend = lambda q, k_cache, v_cache: self._attention(  # noqa: E731
                q, k_cache[:B, :, :s_used], v_cache[:B, :, :s_used], mask)
        keep_d = None if all_valid else keep.to(device)
        x = self._layers(input_ids, pos, cache, write_rows, write_pos, keep_d, attend)
        cache.advance(valid)
        if last_only:
            x = x[torch.arange(B, device=device), torch.tensor(valid, device=device) - 1][:, None]
        x = rms_norm(x, self.norm, cfg.rms_norm_eps)
        return self.lm_head(x, torch.float32)

    def forward_static(self, input_ids: torch.Tensor, cache: StaticKVCache) -> torch.Tensor:
        """The CUDA-graph-safe forward: every row's T tokens are real, positions and lengths
        are read from and advanced in the cache's device tensor, shapes never depend on data,
        and nothing syncs with the host. The caller owns the host mirror of the lengths
        (`cache.note_advanced`) and the capacity check. Returns fp32 logits [B, T, V]."""
        B, T = input_ids.shape
        device = self.device
        pos = cache.lengths[:B, None] + torch.arange(T, device=device)       # [B, T]
        rows = torch.arange(B, device=device)[:, None].expand(B, T)
        if use_kernel(device, T, self.cfg.head_dim):
            lens = (cache.lengths[:B] + T).to(torch.int32)
            attend = lambda q, k_cache, v_cache: verify_attention(  # noqa: E731
                q, k_cache[:B], v_cache[:B], lens)
        else:   # the same arithmetic on every cache slot, stale ones masked out
            mask = self._sdpa_mask(pos, cache.max_seq_len)
            attend = lambda q, k_cache, v_cache: self._attention(  # noqa: E731
                q, k_cache[:B], v_cache[:B], mask)
        x = self._layers(input_ids, pos, cache, rows, pos, None, attend)
        cache.lengths[:B] += T
        x = rms_norm(x, self.norm, self.cfg.rms_norm_eps)
        return self.lm_head(x, torch.float32)

    def _layers(self, input_ids, pos, cache, write_rows, write_pos, keep, attend):
        """Embedding + decoder layers; K/V of the new tokens written at (write_rows,
        write_pos) (only those where `keep`, if given) before attention reads the cache."""
        cfg = self.cfg
        B, T = input_ids.shape
        pos_c = pos.clamp(max=self.cos.shape[0] - 1)
        cos = self.cos[pos_c][:, :, None, :]                         # [B, T, 1, D]
        sin = self.sin[pos_c][:, :, None, :]

        x = self.embed[input_ids]                                    # [B, T, H]
        for i, layer in enumerate(self.layers):
            h = rms_norm(x, layer.input_norm, cfg.rms_norm_eps)
            qkv = layer.qkv(h)
            q, k, v = qkv.split([cfg.q_size, cfg.kv_size, cfg.kv_size], dim=-1)
            q = apply_rope(q.view(B, T, cfg.num_heads, cfg.head_dim), cos, sin)
            k = apply_rope(k.view(B, T, cfg.num_kv_heads, cfg.head_dim), cos, sin)
            v = v.view(B, T, cfg.num_kv_heads, cfg.head_dim)

            k_cache, v_cache = cache.layer(i)                        # [Bmax, Hkv, S, D]
            if keep is None:
                k_cache[write_rows, :, write_pos] = k                # [B, T, Hkv, D]
                v_cache[write_rows, :, write_pos] = v
            else:
                k_cache[write_rows, :, write_pos] = k[keep]
                v_cache[write_rows, :, write_pos] = v[keep]

            attn = attend(q, k_cache, v_cache)                       # [B, T, Hq, D]
            x = x + layer.o(attn.reshape(B, T, cfg.q_size))

            h = rms_norm(x, layer.post_norm, cfg.rms_norm_eps)
            gate, up = layer.gate_up(h).chunk(2, dim=-1)
            x = x + layer.down(F.silu(gate) * up)
        return x

    def _layers_cpu(self, input_ids, start: list[int], valid: list[int], cache):
        """`_layers` and the final norm for a CPU decode or verify pass, through
        specrt.kernels.cpu.ops: one call per norm, attention block and SwiGLU, each row computed on
        its own (so a verify pass gives the bits of the decode steps it replaces). The residual
        stream x [B * T, H] is updated in place; returns the final-normed [B, T, H]."""
        cfg = self.cfg
        B, T = input_ids.shape
        eps = cfg.rms_norm_eps
        starts = torch.tensor(start, dtype=torch.int64)              # [B]
        valid_t = torch.tensor(valid, dtype=torch.int64)             # [B]
        scale = cfg.head_dim ** -0.5
        x = self.embed[input_ids.reshape(-1)]                        # [B * T, H], a copy
        h = cpu_ops.rms_norm(x, self.layers[0].input_norm, eps)
        for i, layer in enumerate(self.layers):
            k_cache, v_cache = cache.layer(i)                        # [Bmax, Hkv, S, D]
            attn = cpu_ops.rope_attention(layer.qkv(h), k_cache, v_cache, self.cos, self.sin,
                                          starts, valid_t, T, cfg.num_heads, scale)
            h = cpu_ops.add_rms_norm(x, layer.o(attn), layer.post_norm, eps)
            act = cpu_ops.silu_mul(layer.gate_up(h))                 # [B * T, I]
            after = self.layers[i + 1].input_norm if i + 1 < len(self.layers) else self.norm
            h = cpu_ops.add_rms_norm(x, layer.down(act), after, eps)
        return h.view(B, T, -1)

    def _sdpa_mask(self, pos: torch.Tensor, keys: int, simple: bool = False):
        """Query (b, t) at position pos[b, t] sees keys 0..pos[b, t] of the first `keys` slots:
        [B, 1, group*T, keys] bool, laid out for _attention's grouped queries. None when every
        query sees every key (one token per row at a shared position)."""
        if simple:
            return None
        mask = torch.arange(keys, device=pos.device)[None, None, :] <= pos[:, :, None]  # [B,T,S]
        group = self.cfg.num_heads // self.cfg.num_kv_heads
        return mask.repeat(1, group, 1)[:, None]

    def _attention(self, q, k, v, mask):
        """q [B, T, Hq, D]; k, v [B, Hkv, S, D] -> [B, T, Hq, D].

        Grouped-query attention without repeating K/V: the `group` query heads that share a
        KV head are laid out as one longer query sequence against that head.
        """
        cfg = self.cfg
        B, T = q.shape[:2]
        group = cfg.num_heads // cfg.num_kv_heads
        qg = q.view(B, T, cfg.num_kv_heads, group, cfg.head_dim)
        qg = qg.permute(0, 2, 3, 1, 4).reshape(B, cfg.num_kv_heads, group * T, cfg.head_dim)
        out = F.scaled_dot_product_attention(qg, k, v, attn_mask=mask)   # [B, Hkv, g*T, D]
        out = out.view(B, cfg.num_kv_heads, group, T, cfg.head_dim).permute(0, 3, 1, 2, 4)
        return out                                                   # [B, T, Hkv, g, D]
