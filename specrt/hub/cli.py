"""`python -m specrt.models` (console script `specrt-models`): fetch, list and locate models.

    python -m specrt.models fetch [NAME ...]   download, verify, convert (default: both)
    python -m specrt.models path NAME          print the model directory
    python -m specrt.models list               what is cached, with sizes

Exit status as in every specrt command (specrt.errors.run_command): 0 done, 2 bad input (an
unknown name, a model not fetched yet, an unusable SPECRT_CACHE), 1 a failed fetch (network or
disk), 130 on Ctrl-C.
"""
from __future__ import annotations

import sys

from specrt.logs import configure_logging
from specrt.errors import ArgumentError, OneLineParser, SpecrtError, run_command
from specrt.hub.fetch import cached_models, fetch, fetch_command
from specrt.hub.paths import cache_dir, is_present, model_dir
from specrt.hub.registry import KNOWN_MODELS, spec_for


def _human(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return str(n)


def _check_names(names: list[str]) -> None:
    """An unknown name is the user's typo (exit 2), not a failed fetch (exit 1)."""
    for name in names:
        if name not in KNOWN_MODELS:
            raise ArgumentError(f"unknown model {name!r}; known models: "
                                f"{', '.join(KNOWN_MODELS)}")


def _cmd_path(name: str) -> int:
    _check_names([name])
    spec_for(name)
    if not is_present(name):
        raise SpecrtError(f"{name} is not in the cache ({model_dir(name)}); fetch it with "
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
    parser = OneLineParser(prog="python -m specrt.models",
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
    return run_command(lambda: _command(args), interrupted="interrupted; unfinished files were "
                       "removed (a verified GGUF is kept for the next fetch)")


def _command(args) -> int:
    if args.command == "fetch":
        _check_names(args.names)
        fetch(args.names, progress=not args.quiet)
        return 0
    if args.command == "path":
        return _cmd_path(args.name)
    return _cmd_list()

if __name__ == "__main__":
    sys.exit(main())
