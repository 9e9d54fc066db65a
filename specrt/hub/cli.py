"""`python -m specrt.models` (console script `specrt-models`): fetch, list and locate models.

    python -m specrt.models fetch [NAME ...]   download, verify, convert (default: both)
    python -m specrt.models path NAME          print the model directory
    python -m specrt.models list               what is cached, with sizes
"""
from __future__ import annotations

import argparse
import sys

from specrt.logs import configure_logging
from specrt.errors import ModelFetchError
from specrt.hub.fetch import cached_models, fetch, fetch_command
from specrt.hub.paths import cache_dir, is_present, model_dir
from specrt.hub.registry import KNOWN_MODELS, spec_for


def _human(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return str(n)


def _cmd_path(name: str) -> int:
    spec_for(name)
    if not is_present(name):
        raise ModelFetchError(f"{name} is not in the cache ({model_dir(name)}); fetch it with "
                              f"`{fetch_command(name)}`")
    print(model_dir(name))
    return 0


def _cmd_list() -> int:
    rows = cached_models()
    print(f"cache: {cache_dir()}")
    if not rows:
        print("nothing cached; fetch the default pair with `python -m specrt.models fetch`")
        return 0
    width = max(len(r[0]) for r in rows)
    for name, kind, size, path in rows:
        print(f"{name:<{width}}  {kind:<4}  {_human(size):>8}  {path}")
    missing = [n for n in KNOWN_MODELS if not is_present(n)]
    if missing:
        print(f"not fetched: {', '.join(missing)}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specrt.models",
                                     description="Fetch, list and locate the models specrt knows.")
    sub = parser.add_subparsers(dest="command", required=True)
    p_fetch = sub.add_parser("fetch", help="download, verify and convert models (default: both)")
    p_fetch.add_argument("names", nargs="*", metavar="NAME",
                         help=f"one of: {', '.join(KNOWN_MODELS)}")
    p_fetch.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    p_path = sub.add_parser("path", help="print the directory of a fetched model")
    p_path.add_argument("name", metavar="NAME")
    sub.add_parser("list", help="show cached models with their size on disk")
    args = parser.parse_args(argv)
    configure_logging()
    try:
        if args.command == "fetch":
            fetch(args.names, progress=not args.quiet)
            return 0
        if args.command == "path":
            return _cmd_path(args.name)
        return _cmd_list()
    except ModelFetchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ninterrupted; unfinished files were removed (a verified GGUF is kept for the next "
              "fetch)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
