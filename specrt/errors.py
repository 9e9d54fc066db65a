"""The one exception type users of specrt catch.

Every bad-input path (missing files, bad config, incompatible draft, cache too small, invalid
K, ...) raises SpecrtError with a message that names the problem and the fix. Subclasses
exist only where a caller may want to tell cases apart. The `check_*` helpers at the bottom are
the one place public arguments are type- and range-checked, so every entry point words a bad
value the same way.
"""
import argparse
import math


class SpecrtError(Exception):
    """A problem with the user's input or environment, explained in the message."""


class ConfigError(SpecrtError, ValueError):
    """config.json or a speculative/sampling configuration is invalid or unsupported."""


class CheckpointError(SpecrtError):
    """Model files are missing, corrupt, or do not match the config."""


class CapacityError(SpecrtError, ValueError):
    """A request does not fit in the preallocated KV cache."""


class ModelFetchError(SpecrtError):
    """Fetching or converting a model failed; the message says what to do."""


class QueueFullError(SpecrtError):
    """Every slot is busy and the waiting queue is full; retry later (HTTP 503)."""


# --- bad model files, one family each (issue 18) -------------------------------------------
class ConfigValueError(ConfigError):
    """A config.json / generation_config.json field has the wrong type or an impossible value."""


class IndexFileError(CheckpointError):
    """model.safetensors.index.json is malformed or names a file outside the model directory."""


class NotRegularFileError(CheckpointError, ConfigError):
    """A model file is a FIFO, device or directory; reading it could block forever."""


class WeightsSizeError(CheckpointError):
    """The config implies more (or fewer) parameters than the weight files can hold."""


class MemoryCapacityError(CapacityError):
    """A KV cache would not fit in the memory this machine has available."""


class TokenizerFileError(CheckpointError):
    """tokenizer.json, tokenizer_config.json or the chat template is malformed."""


class ChecksumError(CheckpointError):
    """Converted weights changed since conversion (their sha256 no longer matches)."""


class ArgumentError(ConfigError):
    """A public argument (of `LLM`, `generate`/`stream`/`submit`, a CLI flag, the speculative
    config) has the wrong type or is out of range; the message names it, the value and the fix."""


class CachePathError(SpecrtError):
    """A cache or state path (`SPECRT_CACHE`, `SPECRT_CALIBRATION`) cannot be used."""


# --- argument checks shared by every entry point (LLM, generate, CLIs, server) ----------------

def show(value, limit: int = 60) -> str:
    """repr(value), shortened: a 10**5-digit int or a megabyte string must not flood a message
    (and repr of an int over 4300 digits raises)."""
    try:
        text = repr(value)
    except Exception:                      # noqa: BLE001 - any repr failure: describe the type
        return f"<a {type(value).__name__} too large to print>"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def check_int(name: str, value, lo: int, hi: int | None = None, fix: str = "") -> int:
    """An int (bool is not one) in lo..hi, else ArgumentError naming `name`, the value, the fix."""
    if not isinstance(value, int) or isinstance(value, bool) or value < lo \
            or (hi is not None and value > hi):
        rng = f"in {lo}..{hi}" if hi is not None else f">= {lo}"
        raise ArgumentError(f"{name} must be an integer {rng}, got {show(value)}"
                            + (f"; {fix}" if fix else ""))
    return int(value)


def check_number(name: str, value, lo: float, hi: float = math.inf, lo_open: bool = False,
                 fix: str = "") -> float:
    """A finite real number (not bool, not str) in [lo, hi] ((lo, hi] if lo_open) -> float."""
    x = math.nan
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            x = float(value)
        except OverflowError:              # an int too large for a float
            pass
    if not (math.isfinite(x) and (x > lo if lo_open else x >= lo) and x <= hi):
        rng = f"in {'(' if lo_open else '['}{lo:g}, {hi:g}]" if math.isfinite(hi) \
            else f"{'>' if lo_open else '>='} {lo:g}"
        raise ArgumentError(f"{name} must be a finite number {rng}, got {show(value)}"
                            + (f"; {fix}" if fix else ""))
    return x


def check_bool(name: str, value, allow_none: bool = False) -> bool | None:
    """True or False (or None where None means "choose for me"), never a truthy stand-in."""
    if isinstance(value, bool) or (allow_none and value is None):
        return value
    raise ArgumentError(f"{name} must be True or False{' or None' if allow_none else ''}, "
                        f"got {show(value)}")


# --- the exit status every command shares (generate, models, serve) ---------------------------

def run_command(body, interrupted: str = "interrupted") -> int:
    """Run a CLI's body and answer the way every specrt command does:

    0 success; 2 bad input (a SpecrtError: one line `error: ...` on stderr, no traceback;
    argparse's usage errors are 2 as well); 1 a runtime failure (ModelFetchError: network or
    disk; any other exception: one line `error: internal error: ...`, or the full traceback
    when the environment sets SPECRT_DEBUG=1); 130 on Ctrl-C. A reader that closes the pipe
    early (`... | head -c 5`) ends the command quietly with 0, as the Python docs advise
    (stdout is pointed at /dev/null so the exit flush cannot fail again).
    """
    import os
    import sys

    try:
        return body()
    except ModelFetchError as e:
        _say(f"error: {e}")
        return 1
    except SpecrtError as e:
        _say(f"error: {e}")
        return 2
    except KeyboardInterrupt:
        if interrupted:
            _say(interrupted, lead="\n")  # after the answer's partial line on a terminal
        return 130
    except BrokenPipeError:
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError, AttributeError):   # stdout is not a real file (tests)
            pass
        return 0
    except Exception as e:                 # noqa: BLE001 - the last line of defence
        if os.environ.get("SPECRT_DEBUG") == "1":
            raise
        _say(f"error: internal error: {type(e).__name__}: {e} (set SPECRT_DEBUG=1 for the "
             "traceback, and please report it)")
        return 1


def _say(line: str, lead: str = "") -> None:
    """One line on stderr: a message's own line breaks are folded so scripts can parse it."""
    import sys

    print(lead + " ".join(part.strip() for part in line.splitlines() if part.strip()),
          file=sys.stderr)


class OneLineParser(argparse.ArgumentParser):
    """argparse whose usage errors are one line (`prog: error: ...; see --help`), exit 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}; see --help\n")
