"""Read a checkpoint's `*.safetensors` files into a flat {name: tensor} dict.

Single files and sharded checkpoints (`model.safetensors.index.json`) are both read through
`safetensors.safe_open`, which memory-maps the file, so each tensor is read once and cast straight
to the requested dtype and device. Every tensor the model needs is checked for presence and shape
here; a problem is reported by tensor name, never as a shape error deep inside a matmul.
This module knows the checkpoint's naming scheme but nothing about running the model.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from specrt.errors import CheckpointError
from specrt.model.config import ModelConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

# Buffers some exporters write that carry no weights we need.
_IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        if dtype in DTYPES.values():
            return dtype
    elif dtype in DTYPES:
        return DTYPES[dtype]
    raise CheckpointError(f"unsupported dtype {dtype!r}; choose float32, bfloat16 or float16")


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a checkpoint must provide for `cfg`, with its shape."""
    h, i = cfg.hidden_size, cfg.intermediate_size
    shapes = {"model.embed_tokens.weight": (cfg.vocab_size, h), "model.norm.weight": (h,)}
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, h)
    for n in range(cfg.num_layers):
        p = f"model.layers.{n}."
        shapes.update({
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (cfg.q_size, h),
            p + "self_attn.k_proj.weight": (cfg.kv_size, h),
            p + "self_attn.v_proj.weight": (cfg.kv_size, h),
            p + "self_attn.o_proj.weight": (h, cfg.q_size),
            p + "mlp.gate_proj.weight": (i, h),
            p + "mlp.up_proj.weight": (i, h),
            p + "mlp.down_proj.weight": (h, i),
        })
        if cfg.attention_bias:
            shapes.update({p + "self_attn.q_proj.bias": (cfg.q_size,),
                           p + "self_attn.k_proj.bias": (cfg.kv_size,),
                           p + "self_attn.v_proj.bias": (cfg.kv_size,)})
    return shapes


def _weight_files(model_dir: Path) -> dict[str, Path]:
    """name -> file holding it, for a single-file or sharded checkpoint."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise CheckpointError(f"{index} is not a valid safetensors index ({e!r}); "
                                  "re-create the checkpoint") from None
        files = {name: model_dir / fname for name, fname in weight_map.items()}
        for path in sorted(set(files.values())):
            if not path.is_file():
                raise CheckpointError(f"shard {path.name} listed in {index.name} is missing "
                                      f"from {model_dir}; re-download or re-convert the model")
        return files
    single = model_dir / "model.safetensors"
    if single.is_file():
        candidates = [single]
    else:
        candidates = sorted(model_dir.glob("*.safetensors"))
    if not candidates:
        raise CheckpointError(f"no model weights in {model_dir}: expected model.safetensors or "
                              "model.safetensors.index.json (specrt reads safetensors only)")
    files = {}
    for path in candidates:
        for name in _keys(path):
            files[name] = path
    return files


def _keys(path: Path) -> list[str]:
    try:
        with safe_open(str(path), framework="pt") as f:
            return list(f.keys())
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"cannot read {path}: {e}; the file is corrupt or truncated, "
                              "re-download or re-convert the model") from None


def load_state_dict(model_dir: str | Path, cfg: ModelConfig, dtype: torch.dtype,
                    device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """Load and check every tensor `cfg` needs, cast to `dtype` on `device`."""
    model_dir = Path(model_dir)
    files = _weight_files(model_dir)
    want = expected_shapes(cfg)
    missing = [n for n in want if n not in files]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise CheckpointError(f"checkpoint in {model_dir} is missing tensor {missing[0]!r}{more}; "
                              "it does not match its config.json")
    optional = {"lm_head.weight"} if cfg.tie_word_embeddings else set()
    unexpected = [n for n in files if n not in want and n not in optional
                  and not n.endswith(_IGNORED_SUFFIXES)]
    if unexpected:
        raise CheckpointError(f"checkpoint in {model_dir} has unexpected tensor {unexpected[0]!r}"
                              f" ({len(unexpected)} in all); it does not match its config.json "
                              f"({cfg.architecture})")

    out: dict[str, torch.Tensor] = {}
    by_file: dict[Path, list[str]] = {}
    for name in want:
        by_file.setdefault(files[name], []).append(name)
    for path, names in by_file.items():
        try:
            with safe_open(str(path), framework="pt") as f:
                for name in names:
                    shape = tuple(f.get_slice(name).get_shape())
                    if shape != want[name]:
                        raise CheckpointError(
                            f"tensor {name!r} in {path.name} has shape {list(shape)}, expected "
                            f"{list(want[name])} from config.json")
                    # copy=True: own the memory instead of aliasing the file mapping (mapped
                    # pages in 4 KiB TLB entries slow every later read of the weights)
                    out[name] = f.get_tensor(name).to(device=device, dtype=dtype, copy=True)
        except (SafetensorError, OSError) as e:
            raise CheckpointError(f"cannot read {path}: {e}; the file is corrupt or truncated, "
                                  "re-download or re-convert the model") from None
    return out
