"""Blocking waits that Ctrl-C can end.

CPython runs a signal's Python handler (the one that raises KeyboardInterrupt) on the main
thread, between bytecodes. A wait without a timeout sleeps in the kernel until it is woken,
and a SIGINT wakes it only if it lands on the main thread while that thread sleeps. When it
lands on another thread (one busy loading a model inside torch's C++ code), or on the main
thread after it released the GIL but before it went to sleep, the handler's flag is set and
nothing wakes the main thread: the command goes on until the wait ends, which for a model load
or a calibration is many seconds (seen: 2 of 25 Ctrl-Cs during a load hung with the machine's
other core busy). So the waits a caller's thread makes on the scheduler sleep in slices and
return to Python between them, where a pending KeyboardInterrupt is raised.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import threading
import time
from typing import Callable

SLICE_S = 0.1     # longest a pending Ctrl-C waits to be raised; ten wake-ups a second cost nothing


def wait_until(wait: Callable[[float], bool], timeout: float | None = None) -> bool:
    """Call wait(seconds) (an Event's or a Condition's wait: true once what it waits for has
    happened) in slices of at most SLICE_S until it returns true (then true) or `timeout`
    seconds have passed (then false); None waits as long as it takes."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = SLICE_S if deadline is None else min(SLICE_S, deadline - time.monotonic())
        if left <= 0:
            return False
        if wait(left):
            return True


@contextlib.contextmanager
def held(lock: threading.Lock):
    """`with lock:`, waiting for it in slices."""
    wait_until(lambda seconds: lock.acquire(timeout=seconds))
    try:
        yield
    finally:
        lock.release()


def result_of(future: concurrent.futures.Future) -> object:
    """future.result(), waiting in slices."""
    wait_until(lambda seconds: not concurrent.futures.wait([future], seconds).not_done)
    return future.result()


def join(thread: threading.Thread) -> None:
    """thread.join(), waiting in slices."""
    def joined(seconds: float) -> bool:
        thread.join(seconds)
        return not thread.is_alive()
    wait_until(joined)
