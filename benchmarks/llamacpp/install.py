"""Where `make bench-llamacpp` put llama.cpp: the cache folder's binaries and GGUF files.

find() returns an Install when everything the benchmark runs is there, and a NotInstalled
error naming what is missing and how to build it otherwise. It runs nothing.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

BINARIES = ("llama-completion", "llama-speculative-simple", "llama-bench")
BUILD_HINT = ("build it once with `make bench-llamacpp` (~10 min on 2 cores; downloads the "
              "llama-cpp-python sdist from PyPI, builds its vendored llama.cpp and converts the "
              "default pair to bf16 GGUF)")


def default_dir() -> Path:
    """$SPECRT_LLAMACPP_DIR, else llamacpp/ in specrt's cache folder (as build.sh has it)."""
    from specrt.hub.paths import cache_dir

    raw = os.environ.get("SPECRT_LLAMACPP_DIR", "").strip()
    return Path(raw).expanduser() if raw else cache_dir() / "llamacpp"


class NotInstalled(Exception):
    """The llama.cpp build or its GGUF files are missing."""


@dataclass(frozen=True)
class Install:
    root: Path                  # the cache folder
    bin_dir: Path               # build/bin

    @classmethod
    def at(cls, root: Path) -> "Install":
        return cls(root=Path(root), bin_dir=Path(root) / "build" / "bin")

    def binary(self, name: str) -> Path:
        return self.bin_dir / name

    def gguf(self, model_dir: Path) -> Path:
        """The bf16 GGUF that llama.cpp's converter made of a model folder."""
        return self.root / "gguf" / f"{Path(model_dir).name}-bf16.gguf"


def find(root: Path | None, model_dirs: list[Path]) -> Install:
    """The install under `root` (default: default_dir()) with GGUFs for `model_dirs`, or raise
    NotInstalled with a message that says how to build it."""
    root = Path(root) if root else default_dir()
    inst = Install.at(root)
    missing = [str(inst.binary(b)) for b in BINARIES if not inst.binary(b).is_file()]
    missing += [str(inst.gguf(m)) for m in model_dirs if not inst.gguf(m).is_file()]
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise NotInstalled(f"llama.cpp is not built in {root} (missing: {missing[0]}{more}); "
                           + BUILD_HINT)
    return inst
