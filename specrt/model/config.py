"""The shape of a checkpoint: `ModelConfig`, read and checked from its `config.json`.

It validates itself on construction, so an invalid value fails here with a message that names
it, never later inside a kernel. This module knows nothing about tensors.
"""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any, Mapping

from specrt.errors import ConfigError

# architecture name -> whether q/k/v projections carry a bias by default
_ARCHITECTURES = {
    "Qwen2ForCausalLM": True,
    "LlamaForCausalLM": False,
}
_MODEL_TYPES = {"qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM"}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """The shape of a Qwen2 / Llama-style decoder, read from `config.json`."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                     "num_heads", "num_kv_heads", "head_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ConfigError(f"config.json: {name} must be a positive integer, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"config.json: num_attention_heads ({self.num_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_kv_heads})")
        if self.head_dim % 2:
            raise ConfigError(f"config.json: head_dim must be even for RoPE, got {self.head_dim}")

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def group(self) -> int:
        """Query heads per KV head (grouped-query attention)."""
        return self.num_heads // self.num_kv_heads

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], generation: Mapping[str, Any] | None = None,
                  source: str = "config.json") -> "ModelConfig":
        """Read either config dialect: classic (top-level `rope_theta`, `rope_scaling`) or the
        transformers-5 one (`rope_parameters`, `layer_types`). Unsupported features are refused
        here, by name, rather than silently producing wrong logits."""

        def need(key):
            if key not in raw:
                raise ConfigError(f"{source}: required field {key!r} is missing")
            return raw[key]

        archs = raw.get("architectures") or []
        arch = archs[0] if archs else _MODEL_TYPES.get(raw.get("model_type", ""))
        if arch not in _ARCHITECTURES:
            found = archs[0] if archs else raw.get("model_type")
            raise ConfigError(
                f"{source}: unsupported architecture {found!r}; specrt runs "
                f"{', '.join(sorted(_ARCHITECTURES))} (model_type qwen2 or llama)")

        if raw.get("use_sliding_window"):
            raise ConfigError(f"{source}: use_sliding_window=true is not supported; "
                              "specrt implements full attention only")
        layer_types = raw.get("layer_types") or []
        if any(t != "full_attention" for t in layer_types):
            raise ConfigError(f"{source}: layer_types {sorted(set(layer_types))} include non-full "
                              "attention; specrt implements full attention only")
        if raw.get("mlp_bias"):
            raise ConfigError(f"{source}: mlp_bias=true is not supported")
        act = raw.get("hidden_act", "silu")
        if act != "silu":
            raise ConfigError(f"{source}: hidden_act {act!r} is not supported (only 'silu')")

        rope_theta = _rope_theta(raw, source)
        num_heads = int(need("num_attention_heads"))
        hidden = int(need("hidden_size"))
        head_dim = raw.get("head_dim") or hidden // num_heads

        eos = _as_ids((generation or {}).get("eos_token_id")) or _as_ids(raw.get("eos_token_id"))
        bos = (generation or {}).get("bos_token_id", raw.get("bos_token_id"))
        return cls(
            architecture=arch,
            vocab_size=int(need("vocab_size")),
            hidden_size=hidden,
            intermediate_size=int(need("intermediate_size")),
            num_layers=int(need("num_hidden_layers")),
            num_heads=num_heads,
            num_kv_heads=int(raw.get("num_key_value_heads") or num_heads),
            head_dim=int(head_dim),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            max_position_embeddings=int(raw.get("max_position_embeddings", 32768)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            attention_bias=bool(raw.get("attention_bias", _ARCHITECTURES[arch])),
            bos_token_id=bos if isinstance(bos, int) else None,
            eos_token_ids=eos,
        )

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> "ModelConfig":
        model_dir = Path(model_dir)
        path = model_dir / "config.json"
        raw = read_json(path, what="model config",
                        fix="point --model at a Hugging Face-style model directory "
                            "(or fetch the default pair: python -m specrt.models fetch)")
        gen_path = model_dir / "generation_config.json"
        generation = read_json(gen_path, what="generation config") if gen_path.exists() else None
        return cls.from_dict(raw, generation, source=str(path))


def _rope_theta(raw: Mapping[str, Any], source: str) -> float:
    params = raw.get("rope_parameters")
    scaling = raw.get("rope_scaling")
    for label, block in (("rope_parameters", params), ("rope_scaling", scaling)):
        if block is None:
            continue
        if not isinstance(block, Mapping):
            raise ConfigError(f"{source}: {label} must be an object or null, got {block!r}")
        rope_type = block.get("rope_type", block.get("type", "default"))
        if rope_type != "default":
            raise ConfigError(
                f"{source}: {label} with rope_type {rope_type!r} is not supported; specrt "
                "implements plain RoPE only (rope_scaling: null / rope_type 'default')")
        extra = set(block) - {"rope_type", "type", "rope_theta"}
        if label == "rope_scaling" and extra:
            raise ConfigError(f"{source}: rope_scaling {dict(block)!r} is not supported; "
                              "specrt implements plain RoPE only (rope_scaling: null)")
    theta = (params or {}).get("rope_theta", raw.get("rope_theta", 10000.0))
    if not isinstance(theta, (int, float)) or not math.isfinite(theta) or theta <= 0:
        raise ConfigError(f"{source}: rope_theta must be a positive number, got {theta!r}")
    return float(theta)


def _as_ids(value) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def read_json(path: Path, what: str, fix: str = "") -> dict:
    """Read a JSON object from `path`, turning every failure into one ConfigError."""
    path = Path(path)
    hint = f"; {fix}" if fix else ""
    if not path.is_file():
        raise ConfigError(f"{what} not found: {path} does not exist{hint}")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{what} {path} is not valid JSON ({e}); fix or re-create the file") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{what} {path} must hold a JSON object, got {type(raw).__name__}")
    return raw
