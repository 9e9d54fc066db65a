"""Where specrt keeps files: one function resolves the cache directory for every user of it
(models, GGUFs, calibrations); nothing else reads SPECRT_CACHE."""
from __future__ import annotations

import json
import os
from pathlib import Path

from specrt.errors import CachePathError

__all__ = ["cache_dir", "state_file", "model_dir", "gguf_path", "is_present", "damage",
           "expand_user"]
DEFAULT_CACHE = "~/.cache/specrt"
# What a conversion (specrt.hub.gguf_convert) always writes into a model's folder: without any
# of them the folder is damaged (`damage`). Its chat_template.jinja is written only for a GGUF
# with a chat template, and the checksum record is looked at on its own.
CONVERTED_FILES = ("config.json", "generation_config.json", "tokenizer.json",
                   "tokenizer_config.json", "model.safetensors")


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
    """Model `name` is fetched and looks whole (`damage`)."""
    return model_dir(name).is_dir() and damage(name) is None


def damage(name: str) -> str | None:
    """What is wrong with model `name`'s folder in the cache, as far as a glance tells (None:
    it looks whole, or there is none). A conversion only ever renames a complete folder into
    place, so a missing file, or weights of another size than the checksum record gives
    (`specrt.model.checksum`), is damage done since; the full sha256 is checked at load."""
    from specrt.model.checksum import CHECKSUM_FILE

    folder = model_dir(name)
    if not folder.is_dir():
        return None
    for required in CONVERTED_FILES:
        if not (folder / required).is_file():
            return f"{required} is missing"
    try:
        record = json.loads((folder / CHECKSUM_FILE).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return f"its {CHECKSUM_FILE} cannot be read"
    size = record.get("size") if isinstance(record, dict) else None
    actual = (folder / "model.safetensors").stat().st_size
    if size != actual:
        return f"model.safetensors holds {actual} bytes, not the {size} it was converted to"
    return None
