"""A request in flight, as its caller sees it: a stream of `Step`s and a way to cancel.

The scheduler's thread puts steps in; the caller takes them out from any thread (`next_step`,
blocking) or any event loop (`anext_step`, awaiting). No lock is held while the caller runs:
the handle's lock guards only the deque of steps, for the instant of a put or a take.
"""
from __future__ import annotations

import asyncio
import collections
import threading
import time
from typing import Callable

from specrt.engine.request import Request, Step
from specrt.engine.waiting import wait_until
from specrt.errors import SpecrtError


# A request submitted or awaited on the thread that runs the rounds (inside `Scheduler.call`)
# could never be served: refused instead of hanging every caller of the engine.
OWN_THREAD = ("a request cannot be submitted or waited for on the scheduler's own thread "
              "(inside Scheduler.call): its steps would never come; do it from another thread")


class RequestHandle:
    def __init__(self, request: Request, cancel: Callable[[str], None],
                 on_scheduler: Callable[[], bool] = lambda: False):
        """cancel(request_id) asks the scheduler to stop it; on_scheduler() says whether the
        calling thread is the one that would put the steps (waiting there could never end)."""
        self.request = request
        self._cancel = cancel
        self._on_scheduler = on_scheduler
        self._steps: collections.deque[Step] = collections.deque()
        self._cond = threading.Condition()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = []
        self.done = False          # the last step has been put
        self.cancelled = False

    @property
    def request_id(self) -> str:
        return self.request.request_id

    # --- the scheduler's side -----------------------------------------------------------------
    def put(self, step: Step) -> None:
        step.delivered = step.delivered or time.perf_counter()
        with self._cond:
            self._steps.append(step)
            self.done = self.done or step.finished
            waiters, self._waiters = self._waiters, []
            self._cond.notify_all()
        for loop, fut in waiters:
            if fut.done():              # its await was cancelled
                continue
            try:
                loop.call_soon_threadsafe(_wake, fut)
            except RuntimeError:        # its event loop is closed: nobody awaits it now
                pass

    # --- the caller's side --------------------------------------------------------------------
    def cancel(self) -> None:
        """Stop the request at the next round boundary and free its slot. Idempotent; safe
        from any thread, also after the request ended."""
        if not self.cancelled and not self.done:
            self.cancelled = True
            self._cancel(self.request_id)

    def next_step(self, timeout: float | None = None) -> Step | None:
        """The next step, waiting for it; None once the last step was taken."""
        with self._cond:
            if not self._steps and not self.done and self._on_scheduler():
                raise SpecrtError(OWN_THREAD)
            if not wait_until(lambda seconds: self._cond.wait_for(
                    lambda: self._steps or self.done, seconds), timeout):
                raise TimeoutError(f"{self.request_id}: no step within {timeout} s")
            return self._steps.popleft() if self._steps else None

    async def anext_step(self) -> Step | None:
        """`next_step` for asyncio: awaits without blocking the event loop."""
        loop = asyncio.get_running_loop()
        while True:
            with self._cond:
                if self._steps:
                    return self._steps.popleft()
                if self.done:
                    return None
                fut = loop.create_future()
                self._waiters.append((loop, fut))
            try:
                await fut
            except BaseException:         # cancelled: leave no waiter behind on this loop
                with self._cond:
                    if (loop, fut) in self._waiters:
                        self._waiters.remove((loop, fut))
                raise


def _wake(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)
