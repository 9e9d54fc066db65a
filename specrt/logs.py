"""Where specrt's log records go. Library code only logs (to the `specrt` loggers); a command
line decides where records go with `configure_logging`, so nothing is configured at import
and a host process's logging stays its own."""
from __future__ import annotations

import logging
import sys
from pathlib import Path


class _Stderr(logging.StreamHandler):
    """Writes to whatever sys.stderr is at the time (a redirected or captured stderr too)."""

    def __init__(self):
        super().__init__()
        self.setFormatter(logging.Formatter("%(message)s"))

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value):
        pass


def configure_logging(level: str | int = "INFO") -> None:
    """Records of the `specrt` loggers, at `level` and above, to stderr as plain lines."""
    logger = logging.getLogger("specrt")
    if not any(isinstance(h, _Stderr) for h in logger.handlers):
        logger.addHandler(_Stderr())
    logger.setLevel(level if isinstance(level, int) else level.upper())


_reported: set[str] = set()


def extension_missing(module: str, what: str, fallback: str, reason: object = None) -> None:
    """Say once per process, at INFO on the `specrt` logger, that C++ extension `module`
    (e.g. "specrt._ngram") is not available and `fallback` serves `what` instead.
    The extensions are optional (see setup.py), so this is a note, not a warning."""
    if module in _reported:
        return
    _reported.add(module)
    because = f" ({reason})" if reason else ""
    logging.getLogger("specrt").info("%s (%s) is not available%s; using %s. %s",
                                     module, what, because, fallback, build_hint())


def build_hint(package_dir: Path = Path(__file__).resolve().parent) -> str:
    """How to get the C++ extensions: in a source tree (setup.py beside the package) build them
    in place; in an installed package, reinstall with a compiler, past pip's cache (pip reuses
    the wheel it built without them)."""
    if (package_dir.parent / "setup.py").is_file():
        return ("Build it with `make build` (or `python setup.py build_ext --inplace`; needs a "
                "C++17 compiler).")
    return ("Install a C++17 compiler, then reinstall specrt from its source folder: `pip "
            "install --no-cache-dir --force-reinstall --no-deps FOLDER` (without "
            "--no-cache-dir pip reuses the wheel it built without the extensions).")
