"""Opening model files safely: only regular files, JSON read into one clear error.

A FIFO, device or directory where `model.safetensors`, `config.json` or `tokenizer.json`
belongs would make a plain `open()` block forever (or fail with a raw IsADirectoryError), so
every model file specrt or transformers reads is checked here first with `os.stat` (which
follows symlinks, so Hugging Face cache layouts keep working). This module knows file types
and JSON, nothing about what the files mean.
"""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from specrt.errors import ConfigError, NotRegularFileError

# Every file specrt or transformers may open in a model directory (plus any *.safetensors).
MODEL_FILES = (
    "config.json", "generation_config.json", "model.safetensors.index.json",
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "chat_template.jinja", "chat_template.json", "vocab.json", "merges.txt", "tokenizer.model",
    "specrt-checksum.json",
)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def is_regular(path: str | Path) -> bool | None:
    """True for a regular file, False for anything else that exists, None if nothing is there."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except FileNotFoundError:
        return None
    except OSError:        # a dangling symlink loop, a path through a file, ...
        return False


def check_regular(path: str | Path, what: str = "model file") -> os.stat_result:
    """os.stat of `path`, or NotRegularFileError if it is a FIFO, device, directory, ..."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise NotRegularFileError(f"cannot stat {what} {path}: {e.strerror}; replace it with "
                                  "the real file") from None
    if not stat.S_ISREG(st.st_mode):
        raise NotRegularFileError(
            f"{what} {path} is {_kind(st.st_mode)}, not a regular file; specrt reads model files "
            "only from regular files (a FIFO or device could block forever): replace it with "
            "the real file")
    return st


def file_not_directory(path: Path) -> str:
    """What to say when a model directory named is a file."""
    hint = (f"; convert a GGUF file first: python -m specrt.models convert {path} OUT_DIR"
            if path.suffix.lower() == ".gguf" else "")
    return (f"{path} is a file, not a model directory; pass the directory that holds "
            f"config.json and the *.safetensors weights{hint}")


def check_model_dir(model_dir: str | Path) -> None:
    """Refuse a model directory where any file specrt or transformers may read is not a
    regular file. One directory listing, no file is opened."""
    try:
        entries = list(os.scandir(model_dir))
    except (FileNotFoundError, NotADirectoryError):
        return             # the caller reports a missing directory in its own words
    except OSError as e:
        raise NotRegularFileError(f"cannot list model directory {model_dir}: {e.strerror}") \
            from None
    for entry in entries:
        if entry.name in MODEL_FILES or entry.name.endswith(".safetensors"):
            if is_regular(entry.path) is False:
                check_regular(entry.path)


def umask() -> int:
    """The process's umask, read without changing it (os.umask sets it, racing other threads'
    file creation) where /proc says it; else the common 0o022. What a plain open() or mkdir
    would give is 0o666 / 0o777 & ~umask(); mkstemp and mkdtemp give 0600 / 0700."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


def read_json(path: str | Path, what: str, fix: str = "", error=ConfigError) -> dict:
    """Read a JSON object from the regular file `path`; every failure is one `error`."""
    path = Path(path)
    hint = f"; {fix}" if fix else ""
    try:
        check_regular(path, what)
    except FileNotFoundError:
        raise error(f"{what} not found: {path} does not exist{hint}") from None
    try:
        raw = json.loads(path.read_bytes().decode("utf-8"))
    except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError, huge ints
        raise error(f"{what} {path} is not valid JSON ({e}); fix or re-create the file") from None
    except OSError as e:
        raise error(f"cannot read {what} {path}: {e.strerror}{hint}") from None
    if not isinstance(raw, dict):
        raise error(f"{what} {path} must hold a JSON object, got {type(raw).__name__}")
    return raw


def human_bytes(n: float) -> str:
    for unit in ("bytes", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:,.0f} {unit}" if unit == "bytes" else f"{n:,.1f} {unit}"
        n /= 1000
    return ""
