"""`python -m specrt.models` (console script `specrt-models`): fetch, list, locate, convert.

    python -m specrt.models fetch [NAME ...]   download, verify, convert (default: both)
    python -m specrt.models path NAME          print the model directory
    python -m specrt.models list               what is cached, with sizes
    python -m specrt.models convert PATH.gguf OUT_DIR   a user's own Qwen2 / Llama GGUF

Exit status as in every specrt command (specrt.commands.run_command): 0 done, 2 bad input (an
unknown name, a model not fetched yet, an unusable SPECRT_CACHE, a missing or unsupported GGUF,
an existing OUT_DIR), 1 a failed fetch or conversion (network or disk), 130 on Ctrl-C or
SIGTERM (either removes the unfinished files).
"""
from __future__ import annotations

import argparse
import contextlib
import errno
import json
import logging
import os
import stat
import sys
import tempfile
import time
from pathlib import Path

from specrt.commands import (OneLineParser, interruptible, prog_name, run_command,
                             sigterm_interrupts, write_out)
from specrt.errors import (ArgumentError, CachePathError, ModelFetchError, NotRegularFileError,
                           SpecrtError)
from specrt.hub.paths import cache_dir, is_present, model_dir
from specrt.hub.registry import KNOWN_MODELS, fetch_command, spec_for
from specrt.logs import configure_logging

MAX_NAME_BYTES = 255    # a file name's limit on Linux's file systems (NAME_MAX)


def _human(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000


def _check_names(names: list[str]) -> None:
    """An unknown name is the user's typo (exit 2), not a failed fetch (exit 1)."""
    for name in names:
        try:
            spec_for(name)
        except ModelFetchError as e:
            raise ArgumentError(str(e)) from None


def _cmd_path(name: str) -> int:
    _check_names([name])
    if not is_present(name):
        raise SpecrtError(f"{name} is not in the cache ({model_dir(name)}); fetch it with "
                              f"`{fetch_command(name)}`")
    write_out(f"{model_dir(name)}\n")
    return 0


def _cmd_list() -> int:
    from specrt.hub.fetch import cached_models

    rows = cached_models()
    lines = [f"cache: {cache_dir()}"]
    if not rows:
        lines.append("nothing cached; fetch the default pair with `python -m specrt.models "
                     "fetch`")
    else:
        width = max(len(r[0]) for r in rows)
        lines += [f"{name:<{width}}  {kind:<4}  {_human(size):>8}  {path}"
                  for name, kind, size, path in rows]
        missing = [n for n in KNOWN_MODELS if not is_present(n)]
        if missing:
            lines.append("not fetched: " + ", ".join(f"{n} ({KNOWN_MODELS[n].description})"
                                                     for n in missing))
    write_out("".join(f"{line}\n" for line in lines))
    return 0


def _path_arg(text: str) -> Path:
    """A path argument; an empty one would name the current folder (Path("") is ".")."""
    if not text:
        raise argparse.ArgumentTypeError("an empty path; give a file or folder name")
    return Path(text)


def _check_convert_paths(gguf: Path, out: Path) -> None:
    """Refuse, before reading anything, what is the user's to fix (exit 2)."""
    try:
        mode = os.stat(gguf).st_mode
    except FileNotFoundError:
        raise SpecrtError(f"{gguf}: no such file; give the path of a .gguf file") from None
    except OSError as e:
        raise SpecrtError(f"{gguf}: cannot read it ({e.strerror})") from None
    if not stat.S_ISREG(mode):
        raise NotRegularFileError(f"{gguf} is not a regular file (a directory, FIFO or "
                                  "device); give the path of a .gguf file")
    if not os.access(gguf, os.R_OK):
        raise SpecrtError(f"{gguf}: permission denied; make the file readable")
    if os.path.lexists(out):
        raise SpecrtError(f"{out} already exists; choose a new output directory or remove it")
    if len(os.fsencode(out.name)) > MAX_NAME_BYTES:
        raise SpecrtError(f"the output directory's name is {len(os.fsencode(out.name))} bytes "
                          f"long, past the {MAX_NAME_BYTES} a name may have; choose a shorter "
                          "one")
    _check_writable_parent(out)


def _check_writable_parent(out: Path) -> None:
    """The nearest existing folder above `out` takes a new entry (tried: permissions alone do
    not tell /sys or a read-only mount), so a bad OUT_DIR is refused before the whole GGUF is
    read rather than after."""
    above = out.absolute().parent
    while not os.path.lexists(above) and above != above.parent:
        above = above.parent
    if not above.is_dir():
        raise SpecrtError(f"{out}: {above} is not a directory; choose an output directory "
                          "whose parent is a folder")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".specrt-probe-", dir=above))
    except OSError as e:
        raise SpecrtError(f"{out}: cannot create a folder in {above} ({e.strerror}); choose a "
                          "writable location") from None


def _cache_models() -> Path | None:
    """The cache's models/ folder, resolved; None where SPECRT_CACHE cannot be used (then no
    output is in it: a convert elsewhere does not need it)."""
    try:
        return (cache_dir() / "models").resolve()
    except CachePathError:
        return None


def _cmd_convert(gguf: Path, out: Path, progress: bool) -> int:
    from specrt.hub.fetch import cache_lock
    from specrt.hub.gguf_convert import UnsupportedGGUF, convert_gguf

    _check_convert_paths(gguf, out)
    start = time.perf_counter()
    # A conversion into the cache's models/ holds the cache lock: a fetch removes every
    # unlocked .tmp-* entry there as the leftover of an interrupted run.
    in_cache = out.resolve().parent == _cache_models()
    try:
        with cache_lock(progress) if in_cache else contextlib.nullcontext():
            convert_gguf(gguf, out, progress=progress)
    except UnsupportedGGUF as e:
        raise UnsupportedGGUF(f"cannot convert {gguf}: {e}") from None
    except OSError as e:
        why = "disk full" if e.errno == errno.ENOSPC else str(e)
        raise ModelFetchError(f"converting {gguf} to {out} failed: {why} (partial files were "
                              "removed)") from None
    cfg = json.loads((out / "config.json").read_text())
    logging.getLogger("specrt.hub").log(
        logging.INFO if progress else logging.DEBUG, "converted %s (%s, %d layers) in %.1f s: %s",
        gguf, cfg["model_type"], cfg["num_hidden_layers"], time.perf_counter() - start, out)
    return 0


@interruptible          # the module imports no torch: Ctrl-C finds the handler at once
def main(argv=None) -> int:
    parser = OneLineParser(prog=prog_name("specrt.models", "specrt-models"),
                           description="Fetch, list and locate the models specrt knows.")
    sub = parser.add_subparsers(dest="command", required=True)
    p_fetch = sub.add_parser("fetch", help="download, verify and convert models (default: both)")
    p_fetch.add_argument("names", nargs="*", metavar="NAME",
                         help=f"one of: {', '.join(KNOWN_MODELS)}")
    p_fetch.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    p_path = sub.add_parser("path", help="print the directory of a fetched model")
    p_path.add_argument("name", metavar="NAME")
    sub.add_parser("list", help="show cached models with their size on disk")
    p_conv = sub.add_parser("convert", help="convert your own Qwen2 or Llama GGUF into a model "
                            "directory (bf16 safetensors + tokenizer)")
    p_conv.add_argument("gguf", metavar="PATH.gguf", type=_path_arg, help="the GGUF file")
    p_conv.add_argument("out", metavar="OUT_DIR", type=_path_arg,
                        help="the folder to write; must not exist yet (missing parent "
                             "folders are created)")
    p_conv.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    configure_logging()
    # SIGTERM (`kill`, `timeout`, a container's stop) unwinds as Ctrl-C does, through the
    # cleanup of a fetch's or a convert's unfinished files (nothing here runs in C++ threads)
    with sigterm_interrupts():
        return run_command(lambda: _command(args), interrupted="interrupted; unfinished files "
                           "were removed (a verified GGUF is kept for the next fetch)",
                           forced="interrupted again, before the cleanup: a .tmp-* folder "
                           "may be left (a fetch removes those in its cache)")


def _command(args) -> int:
    if args.command == "fetch":
        from specrt.hub.fetch import fetch

        _check_names(args.names)
        fetch(args.names, progress=not args.quiet)
        return 0
    if args.command == "path":
        return _cmd_path(args.name)
    if args.command == "convert":
        return _cmd_convert(args.gguf, args.out, progress=not args.quiet)
    return _cmd_list()

if __name__ == "__main__":
    sys.exit(main())
