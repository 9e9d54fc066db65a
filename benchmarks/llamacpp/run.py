"""Running one llama.cpp generation as a subprocess, with a timeout, and reading its timings.

The process inherits this process's niceness; its thread count is the Job's (-t/-tb and, for
the draft model, -td/-tbd), never llama.cpp's default of all cores.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

from benchmarks.llamacpp import commands, parse


class LlamaCppFailed(RuntimeError):
    """llama.cpp exited non-zero, timed out, or printed output the parser cannot read."""


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def run(bin_dir: Path, job: commands.Job, timeout: float) -> parse.Timings:
    """One generation -> llama.cpp's text and timings, or raise LlamaCppFailed."""
    cmd = commands.argv(bin_dir, job)
    label = job.kind if job.kind == "plain" else f"{job.kind}:{job.k}"
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, errors="replace",
                           timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise LlamaCppFailed(f"llama.cpp {label} did not finish within {timeout:.0f} s "
                             "(--llamacpp-timeout)") from None
    except OSError as e:
        raise LlamaCppFailed(f"cannot run {cmd[0]}: {e}") from None
    if p.returncode != 0:
        raise LlamaCppFailed(f"llama.cpp {label} exited with {p.returncode}:\n"
                             + _tail(p.stderr))
    try:
        if job.kind == "plain":
            return parse.completion(p.stdout, p.stderr)
        return parse.speculative_simple(p.stdout, p.stderr, job.prompt)
    except parse.ParseError as e:
        raise LlamaCppFailed(f"llama.cpp {label}: {e}:\n" + _tail(p.stderr)) from None
