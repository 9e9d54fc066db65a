"""What every command line (generate, models, serve) shares: one exit-status policy and
one-line usage errors. Only CLIs import this."""
from __future__ import annotations

import argparse
import contextlib
import functools
import sys
from pathlib import Path
from typing import Callable

from specrt.errors import ArgumentError, ModelFetchError, SpecrtError


def run_command(body, interrupted: str = "interrupted", forced: str = "interrupted") -> int:
    """Run a CLI's body and answer the way every specrt command does:

    0 success; 2 bad input (a SpecrtError: one line `error: ...` on stderr, no traceback;
    argparse's usage errors are 2 as well); 1 a runtime failure (ModelFetchError: network or
    disk; OutputError: stdout cannot be written; any other exception: one line `error:
    internal error: ...`, or the full traceback
    when the environment sets SPECRT_DEBUG=1); 130 on Ctrl-C. A reader that closes the pipe
    early (`... | head -c 5`) ends the command quietly with 0, as the Python docs advise
    (stdout is pointed at /dev/null so the exit flush cannot fail again).

    Ctrl-C while a specrt thread the body started still runs (a scheduler's "specrt-..."
    thread, maybe loading a model or calibrating inside torch's C++ code) ends the process at
    once (os._exit(130), after a flush): waiting for that thread could take many seconds, and a
    Python shutdown around it aborts ("terminate called without an active exception", 134).
    Without such a thread (other threads, like tqdm's monitor, idle in Python) it returns 130.
    A Ctrl-C while torch is first imported (`import_torch`, before the body) ends the process
    at once too: torch's own start-up would swallow it or abort on it.
    A second Ctrl-C, wherever the first is being handled, ends the process at once: `forced`
    on stderr (what the cleanup it cut short leaves behind), 130.
    """
    import_torch(interrupted)      # first, over Python's default handler (see there)
    with _second_ctrl_c_exits(forced):
        return _answer(body, interrupted)


@contextlib.contextmanager
def _second_ctrl_c_exits(forced: str):
    """While the command runs, the first SIGINT raises KeyboardInterrupt as usual and any later
    one leaves at once with `forced` and 130. Python's own handler would raise a second
    KeyboardInterrupt wherever the first is being handled: out of the handler, past its
    answer, into a shutdown that waits for a busy thread (it hung there). Only on the main
    thread, and only over Python's default handler (a caller's own handler is kept)."""
    import signal
    import threading

    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield
        return
    seen = []

    def on_sigint(signum, frame):
        if seen:
            _say(forced, lead="\n")
            _exit_now(130)
        seen.append(signum)
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        if signal.getsignal(signal.SIGINT) is on_sigint:
            signal.signal(signal.SIGINT, signal.default_int_handler)


def import_torch(interrupted: str = "interrupted") -> None:
    """Import torch (a no-op once it is in) so that a Ctrl-C during its import ends the
    command at once: `interrupted` on stderr, exit 130 (main thread only; nothing has been
    done yet that needs cleaning up). torch's C++ start-up runs Python code -- numpy's import,
    c10d's init -- and a KeyboardInterrupt raised there is swallowed (the Ctrl-C is lost: the
    command runs to its end) or thrown through C++ (std::terminate: SIGABRT and a stack
    dump): 7 and 1 of 30 Ctrl-Cs sent 0.2-0.4 s after `python -m specrt.generate` started.
    Only over Python's default handler (`_second_ctrl_c_exits`'s rule): a SIGINT the process
    ignores (a background job) stays ignored, a caller's own handler is kept."""
    import signal
    import threading

    if ("torch" in sys.modules or threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        import torch  # noqa: F401
        return

    def leave(signum, frame):
        if interrupted:
            _say(interrupted, lead="\n")
        _exit_now(130)

    previous = signal.signal(signal.SIGINT, leave)
    try:
        import torch  # noqa: F401,F811
    finally:
        signal.signal(signal.SIGINT, previous)


class OutputError(Exception):
    """Standard output could not take the answer (a full disk, an I/O error): a runtime
    failure, exit 1. A closed pipe is BrokenPipeError instead (a reader that had enough)."""


def write_out(text: str) -> None:
    """Write text to standard output and flush it; a failure other than a closed pipe is an
    OutputError, and so is a closed standard output (`>&-`: sys.stdout is None)."""
    import sys

    if sys.stdout is None:
        raise OutputError("standard output is closed, and the answer goes there: redirect it "
                          "to a file (> FILE, or > /dev/null to discard it)")
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except OSError as e:
        raise OutputError(f"cannot write to standard output ({e.strerror or e})") from None


def _stdout_reader_gone() -> bool:
    """Whether stdout is a pipe whose reader has closed it (poll reports an error on the
    writing end); True where that cannot be told."""
    import select

    try:
        poll = select.poll()
        poll.register(sys.__stdout__.fileno(), select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poll.poll(0))
    except (OSError, ValueError, AttributeError):
        return True


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so the flush at exit cannot fail again."""
    import os
    import sys

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):   # stdout is not a real file (tests)
        pass


def _answer(body, interrupted: str) -> int:
    import os
    import threading

    before = set(threading.enumerate())
    try:
        return body()
    except ModelFetchError as e:
        _say(f"error: {e}")
        return 1
    except SpecrtError as e:
        _say(f"error: {e}")
        return 2
    except KeyboardInterrupt:
        busy = any(t.name.startswith("specrt-") and t.is_alive()
                   for t in set(threading.enumerate()) - before)
        if busy:        # a second Ctrl-C now would escape this handler: ignore it
            import signal

            signal.signal(signal.SIGINT, signal.SIG_IGN)
        if interrupted:
            _say(interrupted, lead="\n")  # after the answer's partial line on a terminal
        if busy:
            _exit_now(130)
        return 130
    except BrokenPipeError:
        # a pipe other than stdout's (a library's write to a dead stderr): not a reader
        # that had enough of the answer (asked before stdout is pointed at /dev/null)
        gone = _stdout_reader_gone()
        _quiet_stdout()
        return 0 if gone else 1
    except OutputError as e:
        _say(f"error: {e}")
        _quiet_stdout()
        return 1
    except Exception as e:                 # noqa: BLE001 - the last line of defence
        if os.environ.get("SPECRT_DEBUG") == "1":
            raise
        _say(f"error: internal error: {type(e).__name__}: {e} (set SPECRT_DEBUG=1 for the "
             "traceback, and please report it)")
        return 1


@contextlib.contextmanager
def sigterm_interrupts():
    """While inside, the first SIGTERM raises KeyboardInterrupt in the main thread, as Ctrl-C
    does, so the command unwinds through its cleanup (its `interrupted` line, status 130); a
    second one is ignored until the cleanup is done (SIGKILL still ends it). Only over the
    default handler, on the main thread."""
    import signal
    import threading

    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL):
        yield
        return

    def on_term(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def interruptible(main):
    """Wrap a CLI's `main(argv)` so that a Ctrl-C before run_command takes over (while torch is
    imported or the parser is built: the first second or two) also ends it with one line
    `interrupted` on stderr and exit status 130, not a KeyboardInterrupt traceback."""
    @functools.wraps(main)
    def wrapper(argv=None):
        try:
            return main(argv)
        except KeyboardInterrupt:
            return interrupted_status()
    return wrapper


@contextlib.contextmanager
def exits_on_ctrl_c(module_name: str):
    """Around an entry module's imports (`python -m specrt.generate` importing torch takes a
    second or two): run as the command (`module_name` "__main__"), a Ctrl-C there exits with
    `interrupted` and status 130, not a traceback; imported, the module raises it as usual."""
    import sys

    try:
        yield
    except KeyboardInterrupt:
        if module_name != "__main__":
            raise
        sys.exit(interrupted_status())


@contextlib.contextmanager
def named_flags(flag_of: Callable[[str], str | None]):
    """An ArgumentError of the API's checks, which starts with the argument's name
    (`draft_stop must be ...`), names the flag that set it (`--draft-stop: draft_stop must
    be ...`): flag_of(name) is that flag, or None to leave the message as it is."""
    try:
        yield
    except ArgumentError as e:
        flag = flag_of(str(e).split(" ", 1)[0])
        if flag is None:
            raise
        raise ArgumentError(f"{flag}: {e}") from None


def interrupted_status(message: str = "interrupted") -> int:
    """What Ctrl-C outside run_command answers: `message` on stderr, then 130 to exit with.
    For an entry point's own imports (`python -m specrt.generate` importing the CLI)."""
    _say(message, lead="\n")
    return 130


def report_error(message: str, status: int) -> int:
    """One line `error: message` on stderr; returns `status` (for a failure that is neither a
    SpecrtError nor a ModelFetchError, e.g. a missing optional package: 1)."""
    _say(f"error: {message}")
    return status


def _exit_now(status: int) -> None:
    """Flush what was printed, then leave without Python's shutdown (which would wait for, or
    abort inside, a thread still running native code)."""
    import os
    import sys

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):    # a closed pipe: nothing to keep
            pass
    os._exit(status)


def _say(line: str, lead: str = "") -> None:
    """One line on stderr: a message's own line breaks are folded so scripts can parse it."""
    say(lead + " ".join(part.strip() for part in line.splitlines() if part.strip()))


def say(line: str) -> None:
    """A diagnostic line on stderr (progress, a trace, a summary, an error), best effort: a
    closed, full or broken standard error drops it. The answer goes to stdout, and a lost log
    line must neither stop it nor pass for stdout's reader having gone (`_answer`)."""
    import sys

    if sys.stderr is None:                 # 2>&-: printing to None writes to stdout
        return
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):          # a broken pipe, a full disk, a closed file
        pass


def prog_name(module: str, script: str) -> str:
    """What a command's usage and errors call it: the console script's name where it runs as
    that script (`specrt --help` said `usage: python -m specrt.generate`), else `python -m
    module`."""
    return script if Path(sys.argv[0]).name == script else f"python -m {module}"


class OneLineParser(argparse.ArgumentParser):
    """argparse whose usage errors are one line (`prog: error: ...; see --help`), exit 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}; see --help\n")

    def print_help(self, file=None):
        """--help through write_out: a stdout that cannot take it is exit 1 with an error line
        (argparse wrote into a full disk and exited 0), a reader that closed it early 0."""
        if file is not None:
            return super().print_help(file)
        sys.exit(_answer(lambda: write_out(self.format_help()) or 0, ""))
