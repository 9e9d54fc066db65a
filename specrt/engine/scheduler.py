"""One thread owns the engine: requests come in through a queue, steps go out through handles.

`submit` (any thread) checks the request, queues it and returns its `RequestHandle`. The
scheduler's thread admits queued requests into free slots at round boundaries (FIFO: a request
that cannot join the running batch holds the ones behind it), runs rounds while any request is
running, hands each step to its request's handle, and applies cancellations between rounds.
`call` (any thread) runs a function on the scheduler's thread between rounds, for work that
must run where the rounds do (timing the model: `LLM.cost_model`). Nothing else touches the
engine, the model or the caches, so requests from any threads or event loops never see each
other's state. A failure while serving one request ends that request (or, inside a shared
round, the requests of that round) with the error; the thread lives on and the next request
starts clean.
"""
from __future__ import annotations

import atexit
import collections
import concurrent.futures
import logging
import threading
import time
import weakref
from typing import Callable

from specrt.engine.engine import Engine
from specrt.engine.handle import OWN_THREAD, RequestHandle
from specrt.engine.request import Request, Step
from specrt.engine.waiting import join, result_of, wait_until
from specrt.errors import ClosedError, QueueFullError, SpecrtError

log = logging.getLogger("specrt.scheduler")
_live: weakref.WeakSet[Scheduler] = weakref.WeakSet()     # closed at interpreter exit
_stopping: set[threading.Thread] = set()    # threads told to stop without a wait (`close`)


@atexit.register
def _close_all() -> None:
    """A script that ends with a request running (a stream not read to its end, an exception
    or Ctrl-C out of `generate`) would shut Python down around a scheduler thread busy in
    torch's C++ code, which aborts the process ("terminate called without an active
    exception"); each scheduler is closed first: its requests cancelled, its thread joined
    once its round (or load, or calibration) ends. So is each thread told to stop without a
    wait (a dropped LLM's), which may still be freeing its engine: its scheduler may be gone."""
    for scheduler in list(_live):
        scheduler.close()
    for thread in list(_stopping):
        join(thread)


class Scheduler:
    def __init__(self, engine: Engine | Callable[[], Engine], max_queue: int = 256):
        """`engine`, or a function that builds it (loads the models): then the scheduler's
        thread starts now and builds it, and this waits for it and raises what the build
        raised. Building on the thread that runs the rounds keeps every tensor op of the
        model on one thread: a second thread that ever ran a parallel op keeps its own idle
        OpenMP team, and two teams on few cores make libgomp throttle its spin-waits, which
        cost ~10% of a decode step here (benchmarks/RESULTS.md, "Serving")."""
        _live.add(self)
        self.max_queue = max_queue
        self._lock = threading.Condition()
        self._queue: collections.deque[tuple[RequestHandle, float]] = collections.deque()
        self._cancels: set[str] = set()
        self._calls: collections.deque[tuple[Callable[[], object], concurrent.futures.Future]] \
            = collections.deque()
        self._handles: dict[str, RequestHandle] = {}
        self._thread: threading.Thread | None = None
        self._closed = False
        if isinstance(engine, Engine):
            self.engine = engine
        else:
            self._build_on_thread(engine)

    def _build_on_thread(self, build: Callable[[], Engine]) -> None:
        """Start the thread, which sets self.engine = build() and then runs the loop."""
        ready, failed = threading.Event(), []

        def run() -> None:
            nonlocal build
            try:
                self.engine = build()
            except BaseException as e:    # raised on the constructing thread below
                failed.append(e)
                return
            finally:
                build = None     # nor does the thread keep what built it (an LLM: `LLM`)
                ready.set()
            self._loop()

        self._thread = threading.Thread(target=run, name="specrt-scheduler", daemon=True)
        self._thread.start()
        try:
            wait_until(ready.wait)
        except BaseException:      # Ctrl-C during the load: the thread ends when the build does
            with self._lock:
                self._closed = True
            raise
        if failed:
            self._closed = True
            raise failed[0]

    # --- any thread ---------------------------------------------------------------------------
    def check(self, request: Request) -> None:
        """SpecrtError for a request that can never run here (what `submit` checks first)."""
        self.engine.check(request)

    def submit(self, request: Request) -> RequestHandle:
        """Check and queue `request`; its steps arrive through the returned handle. Raises
        SpecrtError for a request that can never run, QueueFullError when the queue is full."""
        if self._on_own_thread():
            raise SpecrtError(OWN_THREAD)
        self.engine.check(request)
        handle = RequestHandle(request, self._cancel, self._on_own_thread)
        with self._lock:
            if self._closed:
                raise ClosedError("this LLM was closed; create a new one")
            # a queued request a free slot will take at the next admission is not waiting (a
            # slot the queue's head cannot take, beside a request that runs alone or another
            # config, takes none)
            free = self.engine.max_batch_size - self.engine.running
            if self._queue and not self.engine.can_admit(self._queue[0][0].request):
                free = 0
            if len(self._queue) - free >= self.max_queue:
                raise QueueFullError(f"the request queue is full ({self.max_queue} waiting for "
                                     "a slot); retry later or raise max_queue (the server's "
                                     "--max-queue)")
            self._queue.append((handle, time.perf_counter()))
            self._handles[request.request_id] = handle
            self._ensure_thread()
            self._lock.notify()
        return handle

    def _on_own_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def call(self, fn: Callable[[], object]) -> object:
        """fn() run on the scheduler's thread between rounds; returns what it returns, raises
        what it raises. Work that times or runs the model belongs there: a second thread that
        runs a parallel op keeps its own OpenMP team, and with two teams on the machine's cores
        libgomp stops spinning between parallel regions, which slowed the int8 draft's decode
        step 1.6-2x on the 2-core Zen 5 machine (benchmarks/RESULTS.md, "Calibrated on the
        wrong thread")."""
        if threading.current_thread() is self._thread:
            return fn()
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            if self._closed:
                raise ClosedError("this LLM was closed; create a new one")
            self._calls.append((fn, future))
            self._ensure_thread()
            self._lock.notify()
        return result_of(future)

    def close(self, wait: bool = True) -> None:
        """Cancel everything and stop the thread (wait: for the round in progress, and the
        thread's end)."""
        with self._lock:
            self._closed = True
            self._cancels.update(self._handles)
            self._lock.notify()
            thread = self._thread
        if thread is None or thread is threading.current_thread():
            return
        if wait:
            join(thread)
        else:
            _stopping.difference_update([t for t in list(_stopping) if not t.is_alive()])
            _stopping.add(thread)

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._queue)

    @property
    def running(self) -> int:
        return self.engine.running

    def kv_positions(self) -> tuple[int, int]:
        return self.engine.kv_positions()

    def _cancel(self, request_id: str) -> None:
        with self._lock:
            self._cancels.add(request_id)
            self._lock.notify()

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._loop, name="specrt-scheduler",
                                            daemon=True)
            self._thread.start()

    # --- the scheduler's thread ---------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._lock:
                while not (self._queue or self._cancels or self._calls or self.engine.busy
                           or self._closed):
                    self._lock.wait()
                cancels, self._cancels = self._cancels, set()
                calls, self._calls = self._calls, collections.deque()
                closed = self._closed and not self._queue and not self.engine.busy
            self._apply_cancels(cancels)
            for fn, future in calls:
                try:
                    future.set_result(fn())
                except BaseException as e:      # raised on the calling thread
                    future.set_exception(e)
            if closed:
                return
            self._admit()
            if self.engine.busy:
                self._round()

    def _apply_cancels(self, ids: set[str]) -> None:
        for request_id in ids:
            step = self.engine.cancel(request_id)
            if step is not None:
                self._deliver(step)
                continue
            with self._lock:    # still queued: drop it
                for item in list(self._queue):
                    if item[0].request_id == request_id:
                        self._queue.remove(item)
                        handle = self._handles.pop(request_id)
                        handle.put(Step(request_id, 0, [], "", [], 0, finish_reason="cancelled",
                                        stats=None))

    def _admit(self) -> None:
        """Reserve slots for every queued request that fits now (FIFO), then prefill them."""
        steps, reserved = [], []
        while True:
            with self._lock:
                if not self._queue or not self.engine.can_admit(self._queue[0][0].request):
                    break
                handle, queued_at = self._queue.popleft()
            try:
                self.engine.reserve(handle.request, queued=time.perf_counter() - queued_at)
                reserved.append(handle.request_id)
            except Exception as e:      # this request alone fails; the engine stays clean
                steps.append(self._failed(handle.request_id, e, "at admission"))
        if reserved:
            try:
                steps += self.engine.prefill_reserved()
            except Exception as e:
                steps += [self._failed(rid, e, "in prefill") for rid in reserved]
        for step in steps:
            self._deliver(step)

    def _failed(self, request_id: str, error: BaseException, where: str) -> Step:
        if not isinstance(error, SpecrtError):
            log.error("request %s failed %s: %r", request_id, where, error, exc_info=error)
        self.engine.cancel(request_id, "error")
        return Step(request_id, 0, [], "prefill", [], 0, finish_reason="error", error=error)

    def _round(self) -> None:
        try:
            steps = self.engine.step()
        except Exception as e:
            # each request gets the error; a SpecrtError is the caller's to report (one line),
            # anything else is a bug, logged here with its traceback
            if isinstance(e, SpecrtError):
                log.debug("a round failed; ending the requests that shared it", exc_info=e)
            else:
                log.exception("a round failed; ending the requests that shared it")
            steps = self.engine.fail_all(e)
        for step in steps:
            self._deliver(step)

    def _deliver(self, step: Step) -> None:
        with self._lock:
            handle = self._handles.get(step.request_id)
            if step.finished:
                self._handles.pop(step.request_id, None)
        if handle is not None:
            try:
                handle.put(step)
            except Exception:       # one caller's trouble must not stop every request's thread
                log.exception("delivering a step of %s failed", step.request_id)
