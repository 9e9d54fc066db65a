"""Rendering results for people and machines: text tables, markdown tables, the run header,
the RESULTS.md preamble, and the JSON object on the last line of stdout.

Every script prints a header (machine, threads, load average, contention), human-readable
tables, and one JSON object on the last line. These are the harness functions that print, and
they only render what they are given: no measuring here, and the RESULTS.md file itself is
results' business.
"""
from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Iterable, Sequence

from benchmarks.harness import results


# --- cells and tables ------------------------------------------------------------------------
def fmt(x, digits: int = 2) -> str:
    """A table cell: '-' for None and NaN, floats to `digits` places."""
    if x is None:
        return "-"
    if isinstance(x, float):
        return "-" if x != x else f"{x:.{digits}f}"
    return str(x)


def pass_fail(ok: bool | None) -> str:
    return "n/a " if ok is None else ("PASS" if ok else "FAIL")


def table(headers: Sequence[str], rows: Iterable[Sequence], align: str | None = None) -> str:
    """A plain-text table; first column left-aligned, the rest right-aligned (or per `align`,
    a string of 'l'/'r' per column)."""
    rows = [[fmt(c) for c in r] for r in rows]
    cols = len(headers)
    align = align or ("l" + "r" * (cols - 1))
    width = [max(len(str(headers[i])), *(len(r[i]) for r in rows)) if rows else len(headers[i])
             for i in range(cols)]

    def line(cells):
        return "  ".join(str(c).ljust(width[i]) if align[i] == "l" else str(c).rjust(width[i])
                         for i, c in enumerate(cells)).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in width])] + [line(r) for r in rows])


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence],
                   align: str | None = None) -> str:
    rows = [[fmt(c) for c in r] for r in rows]
    align = align or ("l" + "r" * (len(headers) - 1))
    out = ["| " + " | ".join(headers) + " |",
           "|" + "|".join(":---" if a == "l" else "---:" for a in align) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


# --- the header ------------------------------------------------------------------------------
def machine_line(info: dict) -> str:
    """One line of machine_info(): date, nproc, CPU, versions, load average."""
    s = (f"{info['date_utc']} | nproc {info['host_nproc']} | {info['cpu']} | torch "
         f"{info['torch']} ({info['torch_threads']} threads)")
    if "transformers" in info:
        s += f" | transformers {info['transformers']}"
    if "gpu" in info:
        s += f" | {info['gpu']}"
    la = info["load_average"]
    return s + f" | load average {la[0]:.2f} {la[1]:.2f} {la[2]:.2f}"


def _probe_us(info: dict) -> tuple[float, float]:
    """(us on 1 thread, us on the asked threads) of the contention probe."""
    probe = info["contention_probe"]
    return probe["us_1_thread"], list(probe.values())[1]


def print_header(title: str, info: dict, config: dict | None = None) -> None:
    print(f"== {title} ==")
    print(machine_line(info))
    la = info["load_average"][0]
    if la == la and la > 0.5 * (info["host_nproc"] or 1):   # nan-safe
        print(f"note: load average {la:.2f} on {info['host_nproc']} CPUs: other jobs are "
              "running, timings are noisy")
    probe = info.get("contention_probe")
    if probe:
        one, many = _probe_us(info)
        print(f"contention probe: a 1 MB parallel op takes {one:.0f} us on 1 "
              f"thread, {many:.0f} us on {info['threads_asked']}"
              + (" -- CONTENDED: another job holds a core and every parallel region stalls; "
                 "multi-thread timings from this run are not representative"
                 if probe["contended"] else ""))
    if config:
        print("config: " + ", ".join(f"{k}={v}" for k, v in config.items()))
    print(flush=True)


# --- RESULTS.md ------------------------------------------------------------------------------
def command_line() -> str:
    """The command that is running, as `python -m benchmarks.<name> args...`."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    name = spec.name if spec is not None and spec.name else Path(sys.argv[0]).stem
    return "python -m " + " ".join([name] + [shlex.quote(a) for a in sys.argv[1:]])


def results_preamble(info: dict, note: str | None = None) -> str:
    """Command, date, machine and load average, for the top of a RESULTS.md section."""
    la = info["load_average"]
    lines = [f"Command: `{command_line()}`",
             f"Date: {info['date_utc']}. Machine: nproc = {info['host_nproc']}, CPU "
             f"\"{info['cpu']}\", torch {info['torch']}, {info['torch_threads']} threads"
             + (f", transformers {info['transformers']}" if "transformers" in info else "")
             + (f", GPU {info['gpu']}" if "gpu" in info else "")
             + f". Load average at start: {la[0]:.2f} {la[1]:.2f} {la[2]:.2f}."]
    probe = info.get("contention_probe")
    if probe:
        one, many = _probe_us(info)
        lines[-1] += (f" Contention probe (1 MB parallel op): {one:.0f} us on 1 "
                      f"thread, {many:.0f} us on {info['threads_asked']}"
                      + (" (CONTENDED: timings not representative)." if probe["contended"]
                         else "."))
    return "\n".join(lines) + "\n" + note_block(note)


def note_block(note: str | None) -> str:
    """--note's line for a RESULTS.md section, set off in bold ("" without one)."""
    return f"\n**{note}**\n" if note else ""


def record_section(heading: str, body: str, path: Path = results.RESULTS_MD) -> None:
    """Write our section of RESULTS.md and say so on stderr."""
    path = results.write_section(heading, body, path)
    print(f"recorded: section '{heading}' of {results.shown_path(path)}", file=sys.stderr)


# --- JSON ------------------------------------------------------------------------------------
def _jsonable(x):
    if isinstance(x, float) and x != x:
        return None                                  # NaN -> null
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, Path):
        return str(x)
    return x


def emit_json(obj: dict, path: Path | None = None) -> None:
    """Write obj to `path` (if given) and print it as the LAST line of stdout."""
    line = json.dumps(_jsonable(obj), separators=(", ", ": "))
    if path is not None:
        results.write_atomically(Path(path), json.dumps(_jsonable(obj), indent=1) + "\n")
    sys.stdout.flush()
    print(line, flush=True)
