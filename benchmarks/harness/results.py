"""benchmarks/RESULTS.md: where results go, and rewriting one `## ` section of it.

Several benchmarks may finish at once and each owns only its own section, so the write is a
read-modify-write under an exclusive file lock, written atomically (temp file + os.replace).
This module never prints and never renders tables: callers hand it a finished body
(`report.record_section` does that and says so on stderr).
"""
from __future__ import annotations

import fcntl
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]          # the repository
RESULTS_MD = ROOT / "benchmarks" / "RESULTS.md"
DEFAULT_OUT = ROOT / "benchmarks" / "results"        # PNG/JSON outputs, committed (small)


def shown_path(path: Path) -> str:
    """A path as RESULTS.md shows it: relative to the repository when inside it."""
    path = Path(path).resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def image(path: Path, alt: str) -> str:
    """A markdown image of `path` as RESULTS.md (in benchmarks/) links it: the picture shows on
    the page when the file is committed (benchmarks/results/)."""
    path = Path(path).resolve()
    base = RESULTS_MD.parent.resolve()
    shown = path.relative_to(base) if path.is_relative_to(base) else shown_path(path)
    return f"![{alt}]({shown})"


def _split_sections(text: str) -> list[tuple[str | None, list[str]]]:
    """[(heading line or None for the preamble, lines)], cutting at '## ' lines that are not
    inside a ``` fence."""
    sections: list[tuple[str | None, list[str]]] = [(None, [])]
    fence = False
    for line in text.splitlines(keepends=True):
        if line.lstrip().startswith("```"):
            fence = not fence
        if not fence and line.startswith("## "):
            sections.append((line.rstrip("\n"), [line]))
        else:
            sections[-1][1].append(line)
    return sections


def replace_section(text: str, heading: str, body: str) -> str:
    """`text` with the section titled `heading` ('## ...') replaced by heading + body, or
    appended at the end when absent. Other sections are left byte for byte."""
    heading = heading.rstrip()
    assert heading.startswith("## "), heading
    new = heading + "\n\n" + body.strip("\n") + "\n\n"
    out, done = [], False
    for title, lines in _split_sections(text):
        if title is not None and title.strip() == heading:
            out.append(new)
            done = True
        else:
            out.append("".join(lines))
    if done:
        return "".join(out)
    joined = "".join(out)
    if joined and not joined.endswith("\n\n"):
        joined += "\n" if joined.endswith("\n") else "\n\n"
    return joined + new


def write_atomically(path: Path, text: str) -> Path:
    """Write `text` to `path` through a temp file beside it and os.replace: a run killed
    mid-write leaves the old file or none, never half of the new one."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_section(heading: str, body: str, path: Path = RESULTS_MD) -> Path:
    """Replace only our `## heading` section of the shared RESULTS.md (others own the rest);
    returns the path written."""
    path = Path(path)
    DEFAULT_OUT.mkdir(parents=True, exist_ok=True)
    lock = DEFAULT_OUT / ".results-md.lock"      # git-ignored, never removed (no unlink race)
    with open(lock, "w") as lf:
        fcntl.flock(lf, fcntl.LOCK_EX)
        text = path.read_text() if path.exists() else "# Benchmark results\n\n"
        new = replace_section(text, heading, body)
        write_atomically(path, new.rstrip("\n") + "\n")
    return path
