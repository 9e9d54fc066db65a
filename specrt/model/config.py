"""The shape of a checkpoint: `ModelConfig`, read and checked from its `config.json`.

Every field is type- and range-checked as it is read (`_Fields`), and the dataclass validates
itself on construction, so an invalid value fails here with a message that names the field,
the value and the fix, never later inside a kernel or the allocator. This module knows nothing
about tensors.
"""
from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from typing import Any, Mapping

from specrt.errors import ConfigError, ConfigValueError
from specrt.model.files import check_model_dir, file_not_directory, read_json

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
        transformers-5 one (`rope_parameters`, `layer_types`). Every field is type- and
        range-checked as it is read; unsupported features are refused here, by name, rather
        than silently producing wrong logits."""
        f = _Fields(raw, source)
        arch = _architecture(f)
        if f.bool("use_sliding_window", False):
            raise ConfigError(f"{source}: use_sliding_window=true is not supported; "
                              "specrt implements full attention only")
        layer_types = f.get("layer_types", [])
        if not isinstance(layer_types, list) or not all(isinstance(t, str) for t in layer_types):
            f.bad("layer_types", layer_types, "a list of strings")
        if any(t != "full_attention" for t in layer_types):
            raise ConfigError(f"{source}: layer_types {sorted(set(layer_types))} include non-full "
                              "attention; specrt implements full attention only")
        if f.get("quantization_config", None) is not None:
            raise ConfigError(f"{source}: quantization_config is set; specrt loads float "
                              "checkpoints (bf16 / fp16 / fp32) only; use the model's "
                              "unquantized weights (a quantized draft: draft_dtype='int8')")
        if f.bool("mlp_bias", False):
            raise ConfigError(f"{source}: mlp_bias=true is not supported")
        act = f.get("hidden_act", "silu")
        if act != "silu":
            raise ConfigError(f"{source}: hidden_act {act!r} is not supported (only 'silu')")

        rope_theta = _rope_theta(f)
        num_heads = f.int("num_attention_heads")
        hidden = f.int("hidden_size")
        head_dim = f.int("head_dim", None)
        if head_dim is None:
            if hidden % num_heads:
                raise ConfigValueError(
                    f"{source}: hidden_size ({hidden}) is not divisible by num_attention_heads "
                    f"({num_heads}) and head_dim is absent; fix one of them or set head_dim")
            head_dim = hidden // num_heads
        vocab_size = f.int("vocab_size")
        gen = _Fields(generation or {}, source.replace("config.json", "generation_config.json"))
        own_eos = f.ids("eos_token_id", vocab_size)   # checked even where generation overrides
        eos = gen.ids("eos_token_id", vocab_size) or own_eos
        bos = (gen if "bos_token_id" in gen.raw else f).ids("bos_token_id", vocab_size)
        return cls(
            architecture=arch,
            vocab_size=vocab_size,
            hidden_size=hidden,
            intermediate_size=f.int("intermediate_size"),
            num_layers=f.int("num_hidden_layers"),
            num_heads=num_heads,
            num_kv_heads=f.int("num_key_value_heads", num_heads),
            head_dim=head_dim,
            rms_norm_eps=f.number("rms_norm_eps", 1e-6, below=1.0),
            rope_theta=rope_theta,
            max_position_embeddings=f.int("max_position_embeddings", 32768),
            tie_word_embeddings=f.bool("tie_word_embeddings", False),
            attention_bias=f.bool("attention_bias", _ARCHITECTURES[arch]),
            bos_token_id=bos[0] if len(bos) == 1 else None,
            eos_token_ids=eos,
        )

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> "ModelConfig":
        model_dir = Path(model_dir)
        if os.path.exists(model_dir) and not os.path.isdir(model_dir):
            raise ConfigError(file_not_directory(model_dir))
        check_model_dir(model_dir)
        path = model_dir / "config.json"
        raw = read_json(path, what="model config",
                        fix="point --model at a Hugging Face-style model directory "
                            "(or fetch the default pair: python -m specrt.models fetch)")
        gen_path = model_dir / "generation_config.json"
        generation = (read_json(gen_path, what="generation config")
                      if os.path.lexists(gen_path) else None)
        return cls.from_dict(raw, generation, source=str(path))


# Upper bounds far above any real checkpoint: a value past them is a typo, and refusing it
# here keeps absurd sizes away from the arithmetic and the allocator.
_MAX = {"vocab_size": 1 << 22, "hidden_size": 1 << 17, "intermediate_size": 1 << 20,
        "num_hidden_layers": 1 << 12, "num_attention_heads": 1 << 12,
        "num_key_value_heads": 1 << 12, "head_dim": 1 << 12, "max_position_embeddings": 1 << 30}
_REQUIRED = object()
_NULL_MEANS_DEFAULT = {"head_dim", "num_key_value_heads", "eos_token_id", "bos_token_id",
                       "architectures", "model_type", "layer_types"}


class _Fields:
    """Typed, range-checked reads of one JSON object; each failure is one ConfigValueError
    naming the file, the field, the value and what it must be."""

    def __init__(self, raw: Mapping[str, Any], source: str):
        self.raw, self.source = raw, source

    def bad(self, key: str, value, want: str):
        raise ConfigValueError(f"{self.source}: {key} must be {want}, got {value!r}; fix {key} "
                               "in the file (it must describe the checkpoint's weights)")

    def get(self, key: str, default=_REQUIRED):
        """The raw value, `default` when absent. null means "absent" only for the fields
        Hugging Face configs write as null to mean "derive it" (`_NULL_MEANS_DEFAULT`)."""
        value = self.raw.get(key)
        if value is None and (key not in self.raw or key in _NULL_MEANS_DEFAULT):
            if default is _REQUIRED:
                raise ConfigValueError(f"{self.source}: required field {key!r} is missing; "
                                       "add it (copy it from the model's original config.json)")
            return default
        return value

    def int(self, key: str, default=_REQUIRED, lo: int = 1) -> int:
        value = self.get(key, default)
        hi = _MAX.get(key, 1 << 31)
        if value is None and default is None:
            return None
        if isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi:
            return value
        return self.bad(key, value, f"an integer in [{lo}, {hi}]")

    def number(self, key: str, default, below: float = math.inf) -> float:
        value = self.get(key, default)
        if isinstance(value, (int, float)) and not isinstance(value, bool) \
                and math.isfinite(value) and 0 < value < below:
            return float(value)
        return self.bad(key, value, "a positive number" + (f" below {below}" if below < math.inf
                                                             else ""))

    def bool(self, key: str, default: bool) -> bool:
        value = self.get(key, default)
        if isinstance(value, bool):
            return value
        return self.bad(key, value, "true or false (a JSON boolean, not a string or number)")

    def ids(self, key: str, vocab_size: int) -> tuple[int, ...]:
        value = self.get(key, ())
        ids = [value] if not isinstance(value, (list, tuple)) else value
        if all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < vocab_size
               for v in ids):
            return tuple(ids)
        return self.bad(key, value, f"a token id or a list of token ids in [0, {vocab_size})")


def _architecture(f: _Fields) -> str:
    archs = f.get("architectures", [])
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        f.bad("architectures", archs, 'a list of class names, e.g. ["Qwen2ForCausalLM"]')
    model_type = f.get("model_type", "")
    if not isinstance(model_type, str):
        f.bad("model_type", model_type, 'a string such as "qwen2"')
    arch = archs[0] if archs else _MODEL_TYPES.get(model_type)
    if arch not in _ARCHITECTURES:
        found = archs[0] if archs else f.raw.get("model_type")
        raise ConfigError(
            f"{f.source}: unsupported architecture {found!r}; specrt runs "
            f"{', '.join(sorted(_ARCHITECTURES))} (model_type qwen2 or llama)")
    return arch


def _rope_theta(f: _Fields) -> float:
    source = f.source
    params = f.raw.get("rope_parameters")
    scaling = f.raw.get("rope_scaling")
    for label, block in (("rope_parameters", params), ("rope_scaling", scaling)):
        if block is None:
            continue
        if not isinstance(block, Mapping):
            raise ConfigValueError(f"{source}: {label} must be an object or null, got {block!r}")
        rope_type = block.get("rope_type", block.get("type", "default"))
        if rope_type != "default":
            raise ConfigError(
                f"{source}: {label} with rope_type {rope_type!r} is not supported; specrt "
                "implements plain RoPE only (rope_scaling: null / rope_type 'default')")
        extra = set(block) - {"rope_type", "type", "rope_theta"}
        if label == "rope_scaling" and extra:
            raise ConfigError(f"{source}: rope_scaling {dict(block)!r} is not supported; "
                              "specrt implements plain RoPE only (rope_scaling: null)")
    theta = f.number("rope_theta", 10000.0)
    # As transformers 5 reads it: rope_scaling (the older name), when set, stands in for
    # rope_parameters whole; the block's rope_theta wins over the top level's.
    label, block = ("rope_scaling", scaling) if scaling is not None else \
        ("rope_parameters", params)
    if block and "rope_theta" in block:
        return _Fields(block, f"{source} {label}").number("rope_theta", theta)
    return theta
