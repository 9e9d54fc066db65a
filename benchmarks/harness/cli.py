"""The command-line side shared by the benchmark scripts: common arguments, list parsing,
torch set-up, progress bars, and fail() -- a clear error and exit code 2, never a traceback.

Benchmarks are CLIs, so fail() writing to stderr and exiting is the intended behaviour here;
nothing in this module measures or renders results. Which model directories a run uses is
model_dirs' business.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import NoReturn

from benchmarks.harness.results import DEFAULT_OUT, RESULTS_MD


def parser(module: str, doc: str, epilog: str | None = None) -> argparse.ArgumentParser:
    """The parser of `python -m <module>`: the first paragraph of its docstring `doc` as the
    description, printed as written."""
    return argparse.ArgumentParser(prog=f"python -m {module}", description=doc.split("\n\n")[0],
                                   formatter_class=argparse.RawDescriptionHelpFormatter,
                                   epilog=epilog)


def add_common_args(p: argparse.ArgumentParser, draft: bool = True, out: bool = True,
                    dtype: bool = True, device: bool = True, progress: bool = True) -> None:
    """--model [--draft] [--dtype] [--device] --threads [--out] [--no-progress]: a benchmark
    asks only for the flags it honours (benchmarks/tests/test_common_flags.py checks
    each one is read)."""
    p.add_argument("--model", help="target model directory (default: the fetched "
                   "qwen2.5-coder-1.5b-instruct)")
    if draft:
        p.add_argument("--draft", help="draft model directory (default: the fetched "
                       "qwen2.5-coder-0.5b-instruct when --model is not given)")
    if dtype:
        p.add_argument("--dtype", default="bfloat16",
                       choices=["bfloat16", "float32", "float16"])
    if device:
        p.add_argument("--device", default="cpu", type=device_arg,
                       help="cpu (default), cuda or cuda:N")
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads (default 2)")
    if out:
        p.add_argument("--out", default=str(DEFAULT_OUT), help="directory for PNG/JSON "
                       "outputs (default benchmarks/results)")
    if progress:
        p.add_argument("--no-progress", action="store_true",
                       help="no progress bars on stderr")


def add_record_args(p: argparse.ArgumentParser) -> None:
    """--record/--no-record, --note, and the hidden --results-md (another file, e.g. for a
    trial run)."""
    p.add_argument("--record", action=argparse.BooleanOptionalAction, default=True,
                   help="write the result into benchmarks/RESULTS.md (default on)")
    p.add_argument("--note", help="a line to add to the RESULTS.md section (e.g. PRELIMINARY)")
    p.add_argument("--results-md", default=str(RESULTS_MD), help=argparse.SUPPRESS)


def fail(msg: str, code: int = 2) -> NoReturn:
    """A clear error on stderr and a non-zero exit, never a traceback."""
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(code)


def count(text: str) -> int:
    """argparse type of a count (rounds, repeats, tokens, K): a whole number >= 1. A 0 ran
    the models' loading and then failed on an empty median."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n} is not a count: give 1 or more")
    return n


def positive_ints(s: str, what: str, unique_sorted: bool = False) -> list[int]:
    """Parse a comma-separated list of positive integers from the command line, or fail with a
    message naming the option."""
    try:
        vals = [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        fail(f"{what} must be comma-separated integers, got {s!r}")
    if not vals or min(vals) < 1:
        fail(f"{what} must be positive integers, got {s!r}")
    return sorted(set(vals)) if unique_sorted else vals


def method_ks(s: str, what: str, names: tuple[str, ...], default_k: dict[str, int] | None = None,
              why: str = "") -> list[tuple[str, int]]:
    """Parse a comma-separated list of METHOD:K (METHOD one of `names`, K a positive integer,
    optional for a METHOD with a default in `default_k`) into (METHOD, K) pairs, or fail with a
    message naming the option, the entry and the forms it takes (`why`: why only these)."""
    default_k = default_k or {}
    forms = " or ".join(f"{n}[:K]" if n in default_k else f"{n}:K" for n in names)
    out = []
    for tok in (t.strip() for t in s.split(",") if t.strip()):
        name, _, k = tok.partition(":")
        if name not in names or not (k or name in default_k):
            fail(f"{what}: {tok!r} is not {forms}" + (f" ({why})" if why else ""))
        out.append((name, positive_ints(k or str(default_k[name]), f"{what}: K of {tok!r}")[0]))
    if not out:
        fail(f"{what}: give at least one of {forms}")
    return out


def device_arg(s: str) -> str:
    """--device: cpu, cuda or cuda:N, or fail naming the forms."""
    if not re.fullmatch(r"cpu|cuda(:\d+)?", s):
        fail(f"--device must be cpu, cuda or cuda:N (N a GPU index), got {s!r}")
    return s


def setup_torch(threads: int, device: str = "cpu"):
    """Set torch's intra-op threads; fail early when CUDA is asked for and absent. -> torch"""
    import torch

    if threads < 1:
        fail(f"--threads must be >= 1, got {threads}")
    torch.set_num_threads(threads)
    if device.startswith("cuda") and not torch.cuda.is_available():
        fail(f"--device {device} asked for but CUDA is not available; use --device cpu")
    return torch


def out_dir(args) -> Path:
    """args.out, created."""
    path = Path(args.out)
    path.mkdir(parents=True, exist_ok=True)
    return path


def progress(iterable=None, total=None, desc=None, disable=False, **kw):
    """A tqdm bar on stderr (stdout is for tables and the JSON last line)."""
    from tqdm import tqdm

    return tqdm(iterable, total=total, desc=desc, file=sys.stderr, dynamic_ncols=True,
                leave=False, disable=disable, **kw)
