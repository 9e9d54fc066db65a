"""Where specrt keeps files: one function resolves the cache directory for every user of it
(models, GGUFs, calibrations)."""
from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_dir", "model_dir", "gguf_path", "is_present"]


def cache_dir() -> Path:
    """`$SPECRT_CACHE`, default `~/.cache/specrt`."""
    return Path(os.environ.get("SPECRT_CACHE") or "~/.cache/specrt").expanduser()


def model_dir(name: str) -> Path:
    """Where model `name` lives once fetched (not checked)."""
    return cache_dir() / "models" / name


def gguf_path(name: str) -> Path:
    """Where the verified GGUF of model `name` is kept."""
    return cache_dir() / "gguf" / f"{name}.gguf"


def is_present(name: str) -> bool:
    # The directory only ever appears complete (os.replace), so existence is enough.
    return (model_dir(name) / "model.safetensors").is_file()
