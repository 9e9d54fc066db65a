"""Where specrt keeps files: one function resolves the cache directory for every user of it
(models, GGUFs, calibrations); nothing else reads SPECRT_CACHE."""
from __future__ import annotations

import os
from pathlib import Path

from specrt.errors import CachePathError

__all__ = ["cache_dir", "state_file", "model_dir", "gguf_path", "is_present", "expand_user"]
DEFAULT_CACHE = "~/.cache/specrt"


def expand_user(raw: str | Path, what: str) -> Path:
    """Path(raw) with a leading `~` or `~user` expanded; one that names no user this system
    knows (or `~` with no home directory) is a CachePathError naming `what`, not the
    RuntimeError pathlib raises."""
    try:
        return Path(raw).expanduser()
    except RuntimeError:
        raise CachePathError(f"{what} {str(raw)!r}: its '~' names no home directory this system "
                             "knows; write the path out in full") from None


def cache_dir() -> Path:
    """`$SPECRT_CACHE` (`~` expanded; unset or empty: `~/.cache/specrt`). Every cache path of
    specrt starts here. A file where the directory (or one of its parents) belongs is a
    CachePathError, not a NotADirectoryError at the first write."""
    raw = os.environ.get("SPECRT_CACHE", "")
    path = expand_user(raw.strip() or DEFAULT_CACHE, "SPECRT_CACHE")
    for p in (path, *path.parents):
        if os.path.lexists(p):
            if not os.path.isdir(p):
                raise CachePathError(
                    f"SPECRT_CACHE={raw or DEFAULT_CACHE!r} cannot be used: {p} is a file, not a "
                    "directory; point SPECRT_CACHE at a directory (unset: ~/.cache/specrt)")
            break
    return path


def state_file(env: str, name: str) -> Path:
    """A state file: `$env` (expanded like SPECRT_CACHE; unset or empty: `cache_dir()/name`).
    A directory where the file belongs is a CachePathError."""
    raw = os.environ.get(env, "").strip()
    path = expand_user(raw, env) if raw else cache_dir() / name
    if os.path.isdir(path):
        if raw:
            raise CachePathError(f"{env}={raw!r} is a directory; point it at a file such as "
                                 f"{path / name} (or unset it)")
        raise CachePathError(f"{path} is a directory; remove it, or set {env} to a file path")
    return path


def model_dir(name: str) -> Path:
    """Where model `name` lives once fetched (not checked)."""
    return cache_dir() / "models" / name


def gguf_path(name: str) -> Path:
    """Where the verified GGUF of model `name` is kept."""
    return cache_dir() / "gguf" / f"{name}.gguf"


def is_present(name: str) -> bool:
    # The directory only ever appears complete (os.replace), so existence is enough.
    return (model_dir(name) / "model.safetensors").is_file()
