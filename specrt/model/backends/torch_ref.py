"""The PyTorch reference backend: the specification of a decoder layer stack.

SDPA attention and `F.linear` matmuls, on any device and dtype. The CPU-native and CUDA
backends are tested against these functions; prefills of every backend run here (their
attention is a real matrix product, which the library does best).
"""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from specrt.model.backends.base import Linear, Pass
from specrt.model.backends.quantized import quantized_linear


@dataclasses.dataclass
class TorchLinear:
    """y = x @ W^T + b through `F.linear`; out_dtype=fp32 upcasts the result (logits)."""

    weight: torch.Tensor              # [out, in]
    bias: torch.Tensor | None = None  # [out]

    def __call__(self, x: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
        y = F.linear(x, self.weight, self.bias)
        return y if out_dtype is None or y.dtype == out_dtype else y.to(out_dtype)

    @property
    def nbytes(self) -> int:
        n = self.weight.numel() * self.weight.element_size()
        return n + (self.bias.numel() * self.bias.element_size() if self.bias is not None else 0)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., H] -> RMSNorm(x) * weight [H]. Normalise in fp32, scale in the input dtype:
    the same rounding as the reference models."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def rope_tables(head_dim: int, theta: float, max_seq_len: int, dtype, device):
    """cos, sin [max_seq_len, head_dim] of rotary embeddings (rotate-half layout)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    freqs = torch.outer(torch.arange(max_seq_len, dtype=torch.float32), inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)                    # [S, D]
    return emb.cos().to(dtype).to(device), emb.sin().to(dtype).to(device)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, T, H, D]; cos/sin [B, T, 1, D]; rotate-half convention (as Qwen2/Llama)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def causal_mask(pos: torch.Tensor, keys: int, group: int) -> torch.Tensor:
    """Query (b, t) at position pos[b, t] sees keys 0..pos[b, t] of the first `keys` slots:
    [B, 1, group * T, keys] bool, laid out for `sdpa_attention`'s grouped queries."""
    mask = torch.arange(keys, device=pos.device)[None, None, :] <= pos[:, :, None]  # [B, T, S]
    return mask.repeat(1, group, 1)[:, None]


def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   mask: torch.Tensor | None) -> torch.Tensor:
    """q [B, T, Hq, D]; k, v [B, Hkv, S, D]; mask from `causal_mask` (None: every query sees
    every key) -> [B, T, Hq, D].

    Grouped-query attention without repeating K/V: the `group` query heads that share a KV
    head are laid out as one longer query sequence against that head.
    """
    B, T, Hq, D = q.shape
    Hkv = k.shape[1]
    group = Hq // Hkv
    qg = q.view(B, T, Hkv, group, D).permute(0, 2, 3, 1, 4).reshape(B, Hkv, group * T, D)
    out = F.scaled_dot_product_attention(qg, k, v, attn_mask=mask)   # [B, Hkv, g * T, D]
    return out.view(B, Hkv, group, T, D).permute(0, 3, 1, 2, 4).reshape(B, T, Hq, D)


class TorchReference:
    """The specification backend. Subclasses override `linear` (how weights are multiplied)
    and `hidden` / `hidden_static` (a whole pass: the CPU backend's C++ layer loop, the CUDA
    backend's fused kernels); this class's layer loop is what they must reproduce."""

    name = "torch_ref"
    # Up to how many new tokens per row a row's results are guaranteed not to depend on which
    # other rows share the pass (0: no guarantee; library GEMMs pick kernels by row count).
    batch_invariant_tokens = 0

    @property
    def build_id(self) -> str:
        return f"torch-{torch.__version__}"

    def linear(self, weight: torch.Tensor, bias: torch.Tensor | None = None,
               quant: str | None = None) -> Linear:
        if quant is not None:
            return quantized_linear(quant, weight, bias)
        return TorchLinear(weight, bias)

    def screened_head(self, head: Linear) -> None:
        """None: F.linear's rows may depend on the matrix they sit in, so no gathered product
        is sure to give the full head's bits."""
        return None

    def plan_passes(self, max_rows: int) -> None:
        """Nothing to do: this backend makes no row-count promise (`batch_invariant_tokens`)."""

    def shared_prompt_tokens(self, model) -> int:
        """`batch_invariant_tokens`: no prompt path of its own."""
        return self.batch_invariant_tokens

    def hidden(self, model, input_ids: torch.Tensor, cache, rows: Pass,
               last_only: bool = False) -> torch.Tensor:
        B, T = input_ids.shape
        device = model.device
        pos = cache.lengths[:B, None] + torch.arange(T, device=device)     # [B, T]
        if rows.all_valid:
            write_rows = torch.arange(B, device=device)[:, None].expand(B, T)
            write_pos, keep = pos, None
        else:   # only real tokens' K/V are written
            keep_h = torch.arange(T)[None, :] < torch.tensor(rows.valid)[:, None]  # [B, T] host
            r, c = keep_h.nonzero(as_tuple=True)
            write_rows = r.to(device)
            write_pos = pos[write_rows, c.to(device)]
            keep = keep_h.to(device)
        attend = self.attention_for(model, cache, pos, rows)
        x = self.layers(model, input_ids, pos, cache, write_rows, write_pos, keep, attend)
        x = rows.pack(x, last_only)                                         # [N | B, H]
        return rms_norm(x, model.norm, model.cfg.rms_norm_eps)

    def hidden_static(self, model, input_ids: torch.Tensor, cache) -> torch.Tensor:
        B, T = input_ids.shape
        device = model.device
        pos = cache.lengths[:B, None] + torch.arange(T, device=device)     # [B, T]
        rows = torch.arange(B, device=device)[:, None].expand(B, T)
        attend = self.static_attention_for(model, cache, pos)
        x = self.layers(model, input_ids, pos, cache, rows, pos, None, attend)
        cache.lengths[:B] += T
        return rms_norm(x, model.norm, model.cfg.rms_norm_eps)

    # --- attention choice -------------------------------------------------------------------
    def attention_for(self, model, cache, pos: torch.Tensor, rows: Pass):
        """attend(q [B, T, Hq, D], k_cache, v_cache [Bmax, Hkv, S, D]) -> [B, T, Hq, D] over
        the keys any query of this pass may see."""
        B, T = pos.shape
        s_used = max(s + v for s, v in zip(rows.starts, rows.valid))
        simple = T == 1 and len(set(rows.starts)) == 1 and rows.all_valid
        mask = None if simple else causal_mask(pos, s_used, model.cfg.group)
        return lambda q, k, v: sdpa_attention(q, k[:B, :, :s_used], v[:B, :, :s_used], mask)

    def static_attention_for(self, model, cache, pos: torch.Tensor):
        """As `attention_for`, with no host data: every cache slot is computed, stale ones
        masked out."""
        B = pos.shape[0]
        mask = causal_mask(pos, cache.capacity, model.cfg.group)         # every slot allocated
        return lambda q, k, v: sdpa_attention(q, k[:B], v[:B], mask)

    # --- the layer loop ----------------------------------------------------------------------
    def product(self, linear: Linear, x: torch.Tensor) -> torch.Tensor:
        """One projection of the loop below, x [..., in] -> [..., out]: the linear's own call
        (a backend whose products pick a path per call may choose otherwise in this loop)."""
        return linear(x)

    def layers(self, model, input_ids, pos, cache, write_rows, write_pos, keep, attend):
        """Embedding + decoder layers -> the residual stream [B, T, H] (before the final
        norm). K/V of the new tokens are written at (write_rows, write_pos), only where `keep`
        if given, before attention reads the cache."""
        cfg = model.cfg
        B, T = input_ids.shape
        pos_c = pos.clamp(max=model.cos.shape[0] - 1)
        cos = model.cos[pos_c][:, :, None, :]                        # [B, T, 1, D]
        sin = model.sin[pos_c][:, :, None, :]
        x = model.embed[input_ids]                                   # [B, T, H]
        for i, layer in enumerate(model.layers):
            h = rms_norm(x, layer.input_norm, cfg.rms_norm_eps)
            qkv = self.product(layer.qkv, h)                         # [B, T, q + 2 kv]
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
            x = x + self.product(layer.o, attn.reshape(B, T, cfg.q_size))
            h = rms_norm(x, layer.post_norm, cfg.rms_norm_eps)
            gate, up = self.product(layer.gate_up, h).chunk(2, dim=-1)
            x = x + self.product(layer.down, F.silu(gate) * up)
        return x
