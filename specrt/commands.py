"""What every command line (generate, models, serve) shares: one exit-status policy and
one-line usage errors. Only CLIs import this."""
from __future__ import annotations

import argparse

from specrt.errors import ModelFetchError, SpecrtError


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
