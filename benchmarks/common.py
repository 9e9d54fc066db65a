"""Shared plumbing of the benchmark scripts: arguments, machine description, timing, tables,
the JSON last line, RESULTS.md sections and PNG plots.

Every script prints a header (machine, threads, load average: the machine is often shared, so
readers must be able to judge the noise), human-readable tables, and one JSON object on the
last line of stdout. Progress bars go to stderr. Nothing here knows about a particular
benchmark, and nothing here is imported by specrt.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import fcntl
import json
import os
import platform
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Iterable, Sequence

ROOT = Path(__file__).resolve().parent.parent
RESULTS_MD = ROOT / "benchmarks" / "RESULTS.md"
DEFAULT_OUT = ROOT / "benchmarks" / "out"
FETCH_HINT = "python -m specrt.models fetch"


# --- arguments and setup -------------------------------------------------------------------
def add_common_args(p: argparse.ArgumentParser, draft: bool = True) -> None:
    p.add_argument("--model", help="target model directory (default: the fetched "
                   "qwen2.5-coder-1.5b-instruct)")
    if draft:
        p.add_argument("--draft", help="draft model directory (default: the fetched "
                       "qwen2.5-coder-0.5b-instruct when --model is not given)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32", "float16"])
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads (default 2)")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="directory for PNG/JSON outputs "
                   "(default benchmarks/out)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars on stderr")
    p.add_argument("--results-md", default=str(RESULTS_MD), help=argparse.SUPPRESS)


def fail(msg: str, code: int = 2) -> "NoReturn":  # noqa: F821
    """A clear error on stderr and a non-zero exit, never a traceback."""
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(code)


def setup_torch(threads: int, device: str = "cpu"):
    import torch

    if threads < 1:
        fail(f"--threads must be >= 1, got {threads}")
    torch.set_num_threads(threads)
    if device.startswith("cuda") and not torch.cuda.is_available():
        fail(f"--device {device} asked for but CUDA is not available; use --device cpu")
    return torch


def _default_model_dir(which: str) -> Path:
    """Where the default target/draft lives once fetched (without triggering a download)."""
    try:
        from specrt import models

        name = models.DEFAULT_TARGET if which == "target" else models.DEFAULT_DRAFT
        return Path(models.model_dir(name))
    except Exception:   # specrt.models unavailable: fall back to its documented layout
        name = ("qwen2.5-coder-1.5b-instruct" if which == "target"
                else "qwen2.5-coder-0.5b-instruct")
        base = Path(os.environ.get("SPECRT_CACHE") or "~/.cache/specrt").expanduser()
        return base / "models" / name


def _check_model_dir(path: Path, role: str, default: bool) -> Path:
    ok = path.is_dir() and (path / "config.json").is_file() and any(path.glob("*.safetensors"))
    if not ok:
        if default:
            fail(f"the default {role} model is not fetched ({path} is missing or incomplete); "
                 f"run: {FETCH_HINT}")
        fail(f"{role} model directory {path} does not exist or has no config.json + "
             f"*.safetensors; pass a Hugging Face-style directory, or fetch the default pair "
             f"with: {FETCH_HINT}")
    return path


def resolve_models(args, need_draft: bool = True) -> tuple[Path, Path | None]:
    """(target_dir, draft_dir): --model/--draft, defaulting to the fetched pair. The default
    draft is used only with the default target (a custom target gets --draft or none)."""
    if args.model:
        target = _check_model_dir(Path(args.model).expanduser(), "target", False)
    else:
        target = _check_model_dir(_default_model_dir("target"), "target", True)
    draft = None
    if need_draft:
        if getattr(args, "draft", None):
            draft = _check_model_dir(Path(args.draft).expanduser(), "draft", False)
        elif not args.model:
            draft = _check_model_dir(_default_model_dir("draft"), "draft", True)
    return target, draft


def out_dir(args) -> Path:
    path = Path(args.out)
    path.mkdir(parents=True, exist_ok=True)
    return path


def progress(iterable=None, total=None, desc=None, disable=False, **kw):
    from tqdm import tqdm

    return tqdm(iterable, total=total, desc=desc, file=sys.stderr, dynamic_ncols=True,
                leave=False, disable=disable, **kw)


# --- the machine ---------------------------------------------------------------------------
def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_average() -> tuple[float, float, float]:
    try:
        return tuple(round(x, 2) for x in os.getloadavg())
    except OSError:
        return (float("nan"),) * 3


def machine_info(threads: int, device: str = "cpu") -> dict:
    import torch

    info = {
        "date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "host_nproc": os.cpu_count(),
        "cpu": cpu_model(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "threads_asked": threads,
        "python": platform.python_version(),
        "load_average": list(load_average()),
        "device": device,
    }
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        pass
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    else:
        info["contention_probe"] = contention_probe(threads)
    return info


def contention_probe(threads: int) -> dict:
    """How long one small parallel op (x.mul_ over 1 MB) takes with `threads` threads vs one.

    On a quiet machine the two are within a few x of each other (tens of us). When another job
    holds a core, every OpenMP parallel region waits for a descheduled worker (milliseconds),
    and a 2-thread decode step with hundreds of such regions slows down tens of times:
    the load average alone does not show how bad that is, this does.
    """
    import torch

    def probe(n: int) -> float:
        torch.set_num_threads(n)
        x = torch.ones(1 << 18)
        ts = []
        for _ in range(120):
            t0 = time.perf_counter()
            x.mul_(1.0)
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts[20:]) * 1e6

    before = torch.get_num_threads()
    try:
        one, many = probe(1), probe(threads)
    finally:
        torch.set_num_threads(before)
    ratio = many / one if one > 0 else float("nan")
    return {"us_1_thread": round(one, 1), f"us_{threads}_threads": round(many, 1),
            "ratio": round(ratio, 1), "contended": bool(threads > 1 and many > 500.0)}


def machine_line(info: dict) -> str:
    s = (f"{info['date_utc']} | nproc {info['host_nproc']} | {info['cpu']} | torch "
         f"{info['torch']} ({info['torch_threads']} threads)")
    if "transformers" in info:
        s += f" | transformers {info['transformers']}"
    if "gpu" in info:
        s += f" | {info['gpu']}"
    la = info["load_average"]
    s += f" | load average {la[0]:.2f} {la[1]:.2f} {la[2]:.2f}"
    return s


def print_header(title: str, info: dict, config: dict | None = None) -> None:
    print(f"== {title} ==")
    print(machine_line(info))
    la = info["load_average"][0]
    if la == la and la > 0.5 * (info["host_nproc"] or 1):   # nan-safe
        print(f"note: load average {la:.2f} on {info['host_nproc']} CPUs: other jobs are "
              "running, timings are noisy")
    probe = info.get("contention_probe")
    if probe:
        print(f"contention probe: a 1 MB parallel op takes {probe['us_1_thread']:.0f} us on 1 "
              f"thread, {list(probe.values())[1]:.0f} us on {info['threads_asked']}"
              + (" -- CONTENDED: another job holds a core and every parallel region stalls; "
                 "multi-thread timings from this run are not representative"
                 if probe["contended"] else ""))
    if config:
        print("config: " + ", ".join(f"{k}={v}" for k, v in config.items()))
    print(flush=True)


# --- timing --------------------------------------------------------------------------------
def sync(device) -> None:
    import torch

    if str(device).startswith("cuda") and torch.cuda.is_available():
        torch.cuda.synchronize()


def time_once(fn: Callable[[], object], device="cpu") -> float:
    """Seconds of one call of fn: CUDA events on CUDA, perf_counter elsewhere."""
    import torch

    if str(device).startswith("cuda") and torch.cuda.is_available():
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure(fn: Callable[[], object], repeats: int, warmup: int = 1, device="cpu",
            setup: Callable[[], object] | None = None) -> list[float]:
    """Seconds of `repeats` timed calls of fn after `warmup` untimed ones; `setup` (untimed)
    runs before every call, e.g. to roll a cache back."""
    for _ in range(warmup):
        if setup:
            setup()
        fn()
    sync(device)
    out = []
    for _ in range(repeats):
        if setup:
            setup()
        sync(device)
        out.append(time_once(fn, device))
    return out


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first token where a and b differ (or where the shorter ends); None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def read_bandwidth(threads: int, nbytes: int = 1 << 30, repeats: int = 7) -> dict:
    """Measured read bandwidth of this machine: x.sum() over an fp32 tensor of `nbytes`
    (default 1 GiB, far larger than any cache), with the current torch thread count."""
    import torch

    x = torch.ones(nbytes // 4, dtype=torch.float32)    # ones: every page really allocated
    times = measure(lambda: x.sum(), repeats, warmup=2)
    del x
    return {"gb_per_s": nbytes / median(times) / 1e9, "best_gb_per_s": nbytes / min(times) / 1e9,
            "bytes": nbytes, "repeats": repeats, "method": "fp32 tensor.sum() over 1 GiB",
            "threads": threads}


# --- printing ------------------------------------------------------------------------------
def fmt(x, digits: int = 2) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        if x != x:
            return "-"
        return f"{x:.{digits}f}"
    return str(x)


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

    out = [line(headers), line(["-" * w for w in width])]
    out += [line(r) for r in rows]
    return "\n".join(out)


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence],
                   align: str | None = None) -> str:
    rows = [[fmt(c) for c in r] for r in rows]
    align = align or ("l" + "r" * (len(headers) - 1))
    out = ["| " + " | ".join(headers) + " |",
           "|" + "|".join(":---" if a == "l" else "---:" for a in align) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def pass_fail(ok: bool | None) -> str:
    return "n/a " if ok is None else ("PASS" if ok else "FAIL")


def _jsonable(x):
    if isinstance(x, float) and x != x:
        return None
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
        Path(path).write_text(json.dumps(_jsonable(obj), indent=1) + "\n")
    sys.stdout.flush()
    print(line, flush=True)


def command_line() -> str:
    import shlex

    return "python -m " + " ".join([_module_name()] + [shlex.quote(a) for a in sys.argv[1:]])


def _module_name() -> str:
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    return spec.name if spec is not None and spec.name else Path(sys.argv[0]).stem


# --- RESULTS.md ----------------------------------------------------------------------------
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
    sections = _split_sections(text)
    out, done = [], False
    for title, lines in sections:
        if title is not None and title.strip() == heading:
            out.append(new)
            done = True
        else:
            out.append("".join(lines))
    if not done:
        joined = "".join(out)
        if joined and not joined.endswith("\n\n"):
            joined += "\n" if joined.endswith("\n") else "\n\n"
        return joined + new
    return "".join(out)


def write_results_section(heading: str, body: str, path: Path = RESULTS_MD) -> None:
    """Replace only our `## heading` section of the shared RESULTS.md (others own the rest).
    Read-modify-write under a lock, written atomically."""
    path = Path(path)
    DEFAULT_OUT.mkdir(parents=True, exist_ok=True)
    lock = DEFAULT_OUT / ".results-md.lock"      # git-ignored, never removed (no unlink race)
    with open(lock, "w") as lf:
        fcntl.flock(lf, fcntl.LOCK_EX)
        text = path.read_text() if path.exists() else "# Benchmark results\n\n"
        new = replace_section(text, heading, body)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        tmp.write_text(new.rstrip("\n") + "\n")
        os.replace(tmp, path)
    print(f"recorded: section '{heading}' of {shown_path(path)}", file=sys.stderr)


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
        lines[-1] += (f" Contention probe (1 MB parallel op): {probe['us_1_thread']:.0f} us on 1 "
                      f"thread, {list(probe.values())[1]:.0f} us on {info['threads_asked']}"
                      + (" (CONTENDED: timings not representative)." if probe["contended"]
                         else "."))
    if note:
        lines += ["", f"**{note}**"]
    return "\n".join(lines) + "\n"


# --- plots ---------------------------------------------------------------------------------
def shown_path(path: Path) -> str:
    """A path as RESULTS.md shows it: relative to the repository when inside it."""
    path = Path(path).resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    pyplot().close(fig)
    print(f"wrote {path}", file=sys.stderr)
    return path


def slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", s)


# --- Hugging Face transformers (the comparison, never the runtime) -------------------------
def hf_load(model_dir: Path, dtype: str, device: str = "cpu"):
    """transformers' own model for `model_dir` in `dtype`, eval mode, quiet."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=getattr(torch, dtype))
    except (OSError, ValueError) as e:
        fail(f"transformers cannot load {model_dir}: {e}")
    return model.to(device).eval()


def hf_generate(model, ids: list[int], max_new_tokens: int, force_length: bool = False,
                eos_ids=None, **kwargs) -> list[int]:
    """Greedy `model.generate` on one prompt of token ids -> the new token ids. Sampling
    options from the checkpoint's generation_config are switched off explicitly."""
    import torch

    x = torch.tensor([ids], dtype=torch.long, device=model.device)
    eos = list(eos_ids) if eos_ids else model.generation_config.eos_token_id
    pad = eos[0] if isinstance(eos, (list, tuple)) else eos
    with torch.inference_mode():
        out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False,
                             temperature=None, top_p=None, top_k=None, repetition_penalty=None,
                             max_new_tokens=max_new_tokens,
                             min_new_tokens=max_new_tokens if force_length else None,
                             eos_token_id=eos, pad_token_id=pad, **kwargs)
    return out[0, len(ids):].tolist()


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
