"""`specrt.AsyncLLM`: the API for asyncio services.

    async with specrt.AsyncLLM(model="DIR", max_batch_size=8) as llm:   # LLM's arguments
        res = await llm.generate("Write quicksort", max_new_tokens=64)
        async for chunk in llm.stream(messages=[{"role": "user", "content": "Hi"}]):
            print(chunk.text, end="")

Requests run on the same scheduler thread as `LLM`'s; awaiting never blocks the event loop
(steps are handed over with `call_soon_threadsafe`). Cancelling the awaiting task, or
closing the async iterator, cancels the request and frees its slot at the next round.
A request is checked and its prompt encoded on a worker thread (a long prompt takes seconds to
tokenize: 2.35 s for 2 MB of text), and a draft model named per request is loaded on one the
first time, so neither holds up the event loop.
"""
from __future__ import annotations

import asyncio
import functools
from typing import AsyncIterator, Awaitable, Callable

from specrt.api.args import check_positional, given_once
from specrt.api.llm import LLM, is_batch
from specrt.api.run import TAIL, StreamChunk, TextRun
from specrt.errors import ArgumentError


class AsyncLLM:
    def __init__(self, *args, llm: LLM | None = None, **kwargs):
        """Build an LLM from LLM's arguments, or wrap an existing one (`llm=`, alone)."""
        if llm is not None:
            if not isinstance(llm, LLM):
                raise ArgumentError(f"llm must be an LLM, got {type(llm).__name__}")
            if args or kwargs:
                given = ", ".join([*(repr(a) for a in args), *kwargs])
                raise ArgumentError(f"llm= wraps a ready LLM, whose settings are fixed; other "
                                    f"arguments ({given}) would be ignored: pass them to "
                                    "LLM(...) instead")
        self.llm = llm if llm is not None else LLM(*args, **kwargs)

    @property
    def tokenizer(self):
        return self.llm.tokenizer

    def close(self) -> None:
        """Cancel every request and stop the scheduler threads, waiting for the round in
        progress (up to a forward pass). From a coroutine, `await aclose()` instead: this
        blocks the event loop while it waits."""
        self.llm.close()

    async def aclose(self) -> None:
        """`close()` on a worker thread: the event loop keeps serving while the round in
        progress ends."""
        await asyncio.to_thread(self.llm.close)

    async def __aenter__(self) -> "AsyncLLM":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    @given_once
    def stream(self, prompt=None, *extra, **kwargs) -> "AsyncChunks":
        """Async `LLM.stream`: a StreamChunk per round; the last has finish_reason and stats.
        The request starts at the first step; several tasks may step the stream at once."""
        check_positional("stream", extra)
        async def start() -> TextRun:     # a draft model it names loads on that worker thread,
            return await _submitted(        # once every argument is checked
                functools.partial(self.llm.submit_stream, prompt, **kwargs))
        return AsyncChunks(start)

    @given_once
    async def generate(self, prompt=None, *extra, **kwargs):
        """Async `LLM.generate`: one prompt (text, token ids or messages=[...]) ->
        GenerationResult, a list of prompts -> list[GenerationResult], each equal to its
        single run (a batch of any size: what the queue cannot hold waits for room;
        cancelling the await cancels every one)."""
        check_positional("generate", extra)
        # checked, encoded and (a draft model it names) loaded on a worker thread
        prepared = await asyncio.to_thread(self.llm.prepare_all, prompt, **kwargs)
        runs: list[TextRun] = []
        try:
            for p in prepared:        # a batch larger than the queue waits for room in it
                run, going = self.llm.start_in_batch(p, runs)
                while run is None:
                    async for _ in _chunks(going):
                        pass
                    run, going = self.llm.start_in_batch(p, runs)
                runs.append(run)
            for run in runs:
                async for _ in _chunks(run):
                    pass
        finally:
            for run in runs:                  # a no-op for the runs that finished
                run.handle.cancel()
        results = [run.result() for run in runs]
        return results if is_batch(prompt) else results[0]


async def _submitted(submit: Callable[[], TextRun]) -> TextRun:
    """submit() (checks, encoding, the scheduler's queue) on a worker thread. Cancelled while
    it runs, the await ends at once and what it submits is cancelled when it returns."""
    future = asyncio.get_running_loop().run_in_executor(None, submit)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        future.add_done_callback(_cancel_submitted)
        raise


def _cancel_submitted(future: asyncio.Future) -> None:
    if future.cancelled() or future.exception() is not None:
        return
    future.result().handle.cancel()


class AsyncChunks:
    """`AsyncLLM.stream`'s async iterator. Tasks of one event loop may step it at once (in
    turn; an async generator raised "already running"); cancelling a task waiting on it, or
    `aclose()`, or dropping it, cancels the request."""

    def __init__(self, start: Callable[[], Awaitable[TextRun]]):
        self._start = start
        self._run: TextRun | None = None
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock: asyncio.Lock | None = None

    def __aiter__(self) -> "AsyncChunks":
        return self

    async def __anext__(self) -> StreamChunk:
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop, self._lock = loop, asyncio.Lock()
        elif loop is not self._loop:
            raise ArgumentError("an AsyncLLM stream is stepped in the event loop that first "
                                "stepped it; start another stream in this loop instead")
        try:
            async with self._lock:
                if self._closed:
                    raise StopAsyncIteration
                if self._run is None:
                    self._run = await self._start()
                    if self._closed:           # aclose() while it was submitted
                        self._run.handle.cancel()
                        raise StopAsyncIteration
                chunk = await _next_chunk(self._run)
        except StopAsyncIteration:
            raise
        except BaseException:
            await self.aclose()          # a cancelled task (or an error) ends the request
            raise
        if chunk is None:
            raise StopAsyncIteration
        return chunk

    async def aclose(self) -> None:
        """Cancel the request; the stream ends (a task waiting on it gets the last chunk)."""
        self._closed = True
        if self._run is not None:
            self._run.handle.cancel()


async def _next_chunk(run: TextRun) -> StreamChunk | None:
    """The next step of `run` as a chunk; None once the run has ended."""
    if run.finish_reason is not None:
        return None
    while (chunk := run.take(await run.handle.anext_step())) is TAIL:
        pass
    return chunk


async def _chunks(run: TextRun) -> AsyncIterator[StreamChunk]:
    while (chunk := await _next_chunk(run)) is not None:
        yield chunk
