"""A git revision's tree copied out of the repository, for benchmarks that build and time two
revisions side by side (benchmarks.kernel_ab, benchmarks.model_ab, benchmarks.generate_ab)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from benchmarks.harness import cli

ROOT = Path(__file__).resolve().parent.parent.parent      # the repository


def checkout(rev: str, into: Path, *paths: str) -> Path:
    """The tree of `rev` (only `paths` if given) extracted under `into`; "worktree": the
    repository itself, as it is."""
    if rev == "worktree":
        return ROOT
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, *paths],
                             capture_output=True)
    if archive.returncode != 0:
        cli.fail(f"git archive {rev}: {archive.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def built(rev: str, into: Path) -> Path:
    """The tree of `rev` under `into` with its extensions built (~1-3 min); "worktree": the
    repository itself, as it is built."""
    tree = checkout(rev, into)
    if tree == ROOT:
        return tree
    print(f"building {rev} (~1-3 min) ...", file=sys.stderr)
    done = subprocess.run([sys.executable, "setup.py", "--quiet", "build_ext", "--inplace"],
                          cwd=tree, capture_output=True, text=True)
    if done.returncode != 0:
        cli.fail(f"building {rev} failed:\n{done.stderr[-3000:]}")
    return tree
