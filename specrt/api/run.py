"""One request's text side: its engine steps turned into text chunks, stop strings and a result.

A `TextRun` wraps the request's handle (token ids, from the scheduler's thread) and a
`TextStream` (text, stop strings). It runs in the caller's thread or task, never in the
engine's: a slow reader slows only itself. Its readers may be several threads at once (two
`result()` calls, a stream and a `result()`): each step is taken and applied under the run's
lock, so the tokens stay in order. A run that is dropped unread is cancelled, freeing its slot
(`submit()` without a read or a cancel held it until its whole budget was generated).
"""
from __future__ import annotations

import dataclasses
import threading
import weakref
from typing import Callable, Iterator

from specrt.api.text_stream import TextStream
from specrt.engine.handle import RequestHandle
from specrt.engine.metrics import with_new_tokens
from specrt.engine.request import Step
from specrt.engine.waiting import held
from specrt.errors import SpecrtError

TAIL = object()   # `TextRun.take`: a stop string's chunk waits for the rounds run past it


@dataclasses.dataclass
class GenerationResult:
    token_ids: list[int]      # new tokens only (an EOS token that ended the answer included)
    text: str                 # decoded new text, cut before any stop string
    finish_reason: str        # "eos", "stop" (a stop string), "length" or "cancelled"
    stats: dict               # see specrt.engine.metrics
    request_id: str = ""


@dataclasses.dataclass
class StreamChunk:
    """What `LLM.stream` yields after each round: the new text and ids; the last chunk also
    carries the finish reason and the request's stats."""

    text: str                          # text delta (may be "" while a stop string is possible)
    token_ids: list[int]               # ids committed this round (a stop string's: up to the
                                       # id completing it, the stop's own ids kept, as vLLM;
                                       # ids past one that may yet be real come with the next)
    finish_reason: str | None = None   # set on the last chunk
    stats: dict | None = None          # set on the last chunk
    step: Step | None = None           # the engine's record of the round (plan, drafts)
    tail: list[Step] = dataclasses.field(default_factory=list)
                                       # a stop string's chunk: the rounds the engine ran past
                                       # it before the cancel reached it (their ids dropped;
                                       # their drafts were proposed and verified all the same)


class TextRun:
    """A request's text side. Keep the run while the request should go on: dropped, it is
    cancelled (its `handle` alone does not keep it)."""

    def __init__(self, handle: RequestHandle, stream: TextStream, owner: object = None):
        self.handle = handle
        self.stream = stream
        self.owner = owner          # what must outlive the request (the LLM: dropped, it stops
                                    # its engines)
        self.token_ids: list[int] = []
        self.finish_reason: str | None = None
        self.stats: dict = {}
        self._stopped: StreamChunk | None = None   # a stop string's chunk, held by `take`
        self._tail: list[Step] = []         # ... with the steps that ran past the stop
        self._lock = threading.Lock()       # one reader takes and applies a step at a time
        weakref.finalize(self, handle.cancel)

    @property
    def request_id(self) -> str:
        return self.handle.request_id

    def take(self, step: Step | None) -> StreamChunk | None | object:
        """Apply the engine's next step: the chunk to hand out (None: the run had already
        ended), or TAIL while a stop string's chunk waits for the rounds that ran past the
        stop (cancelled, they still end with the engine's last step and the request's stats,
        which the chunk carries, with those rounds in its `tail`)."""
        if self._stopped is None:
            chunk = self._chunk(step)
            if chunk is None or chunk.finish_reason != "stop":
                return chunk
            self._stopped = chunk
        elif step is not None:
            self._tail.append(step)
            if step.stats is not None:
                self.stats = with_new_tokens(step.stats, len(self.token_ids))
        if step is not None and not step.finished:
            return TAIL
        chunk, self._stopped = self._stopped, None
        chunk.stats, chunk.tail = self.stats, list(self._tail)
        return chunk

    def _chunk(self, step: Step | None) -> StreamChunk | None:
        """The chunk for one engine step (None: the run had already ended)."""
        if step is None:
            if self.finish_reason is None:
                self.finish_reason = "cancelled"
            return None
        if step.error is not None:
            if isinstance(step.error, SpecrtError):
                raise step.error
            raise RuntimeError(f"request {step.request_id} failed: {step.error!r}") \
                from step.error
        was_stopped = self.stream.stopped
        text = self.stream.push(step.new_tokens, final=step.finished)
        # text past a stop string never reaches the caller; neither do its ids, nor those past
        # one that may yet be real (held back until it is known: `TextStream.kept_ids`)
        ids = self.stream.ids[len(self.token_ids):self.stream.kept_ids]
        if self.stream.stopped and not was_stopped:
            self.handle.cancel()
            self.finish_reason = "stop"
        self.token_ids += ids
        if step.finished and self.finish_reason is None:
            self.finish_reason = step.finish_reason
        if step.stats is not None:
            self.stats = with_new_tokens(step.stats, len(self.token_ids))
        done = self.finish_reason is not None
        return StreamChunk(text, ids, self.finish_reason if done else None,
                           self.stats if done else None, step)

    def chunks(self) -> Iterator[StreamChunk]:
        """Chunks until the request ends; cancels it if the consumer stops early."""
        try:
            while True:
                chunk = self._next_chunk()
                if chunk is None:
                    return
                yield chunk
                if chunk.finish_reason is not None:
                    return
        finally:
            self.handle.cancel()

    def _next_chunk(self) -> StreamChunk | None:
        """The next step as a chunk, taken and applied under the run's lock (the lock waited
        for in slices, as Ctrl-C needs); None once another reader saw the end."""
        with held(self._lock):
            if self.finish_reason is not None:
                return None
            while (chunk := self.take(self.handle.next_step())) is TAIL:
                pass
            return chunk

    def result(self) -> GenerationResult:
        """The request's result; chunks not read yet are read first (waiting for its end)."""
        for _ in self.chunks():
            pass
        text = self.stream.text if self.stream.tokenizer is not None else ""
        return GenerationResult(self.token_ids, text, self.finish_reason or "cancelled",
                                self.stats, self.request_id)


class Chunks:
    """`LLM.stream`'s iterator. The request is submitted at the first `next()` (a stream not
    read yet holds no slot); `next()` from several threads at once is taken in turn (a
    generator raised "generator already executing"); closing or dropping it cancels the
    request."""

    def __init__(self, submit: Callable[[], TextRun]):
        self._submit = submit
        self._run: TextRun | None = None
        self._chunks: Iterator[StreamChunk] | None = None
        self._closed = False
        self._lock = threading.Lock()

    def __iter__(self) -> "Chunks":
        return self

    def __next__(self) -> StreamChunk:
        with held(self._lock):
            if self._chunks is None:
                if self._closed:
                    raise StopIteration
                self._run = self._submit()
                self._chunks = self._run.chunks()
            return next(self._chunks)

    def close(self) -> None:
        """Cancel the request (a reader waiting in next() gets the end) and end the chunks."""
        self._closed = True
        if self._run is not None:
            self._run.handle.cancel()
        with self._lock:
            if self._chunks is not None:
                self._chunks.close()
