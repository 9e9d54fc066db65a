"""One HTTP request's generation: the specrt stream behind it, its metrics, its SSE events.

A `Generation` wraps `AsyncLLM.stream` for token ids the server has already encoded (so it
knows the prompt's length for `usage`). `start()` submits the request and waits for the first
chunk, so a refusal (bad input: 400, full queue: 503) is known before any response byte is
sent. `close()` ends it whatever happened; a generation closed before its last chunk (the
client went away, while queued or running) cancels its request, which leaves the queue at once
or frees its slot at the next round, and counts as finished_reason="abort" (a refused or failed
one counts as a failure instead, by its caller).
"""
from __future__ import annotations

import json
import time
from typing import AsyncIterator

from specrt.api.async_llm import AsyncLLM
from specrt.api.run import StreamChunk
from specrt.serve import schemas
from specrt.serve.errors import as_api_error, error_body
from specrt.serve.metrics import Phases, ServerMetrics


class Generation:
    def __init__(self, allm: AsyncLLM, metrics: ServerMetrics, prompt_ids: list[int],
                 engine_args: dict, arrived: float, with_ids: bool = False):
        self.metrics = metrics
        self.prompt_ids = prompt_ids
        self.prompt_tokens = len(prompt_ids)
        self.with_ids = with_ids                     # the answer's ids go out with its text
        self.token_ids: list[int] = []               # the answer's ids so far
        self.completion_tokens = 0
        self.finish_reason: str | None = None       # OpenAI's name, once the last chunk came
        self.max_tokens = engine_args["max_new_tokens"]
        self._stream = allm.stream(prompt_ids, **engine_args)
        self._arrived = arrived
        self._scheduled: float | None = None         # when it got a slot (the engine's time)
        self._first: float | None = None             # the engine's time of the first token
        self._last: float | None = None              # the engine's time of the last round
        self._started = False                        # submitted (a refusal: _failed)
        self._failed = False                         # counted as a failure by its caller
        self._closed = False

    async def start(self) -> StreamChunk:
        """Submit and wait for the first chunk; raises what submission raises."""
        self._started = True
        chunk = await self.next()
        assert chunk is not None
        return chunk

    async def next(self) -> StreamChunk | None:
        """The next chunk; None after the last one."""
        if self.finish_reason is not None:
            return None
        try:
            chunk = await self._stream.__anext__()
        except StopAsyncIteration:     # the engine cancelled it (the LLM is closing)
            chunk = StreamChunk("", [], "cancelled")
        except Exception:              # a failure: its caller counts it, `close` does not abort
            self._failed = True
            raise
        step = chunk.step
        now = step.delivered if step is not None and step.delivered else time.perf_counter()
        committed = step is not None and bool(step.new_tokens)   # not a cancel in the queue
        if committed and step.index == 0:
            self.metrics.admitted(self.prompt_tokens)    # the prefill read its prompt
            self._scheduled = step.scheduled or now
        if committed:
            if self._last is None:
                self._first = now
                self.metrics.first_token(now - self._arrived)
            else:
                self.metrics.between_chunks(now - self._last)
            self._last = now
        self.completion_tokens += len(chunk.token_ids)
        self.token_ids += chunk.token_ids
        self.metrics.round(step, len(chunk.token_ids))
        for ran_on in chunk.tail:      # rounds past a stop string: no ids, drafts all the same
            self.metrics.round(ran_on, 0)
        if chunk.finish_reason is not None:
            self.finish_reason = schemas.FINISH_REASONS.get(chunk.finish_reason,
                                                            chunk.finish_reason)
            self._finished(self.finish_reason, now)
        return chunk

    def _finished(self, reason: str, now: float) -> None:
        phases = None
        if self._scheduled is not None:       # set with the first token: _first, _last are too
            phases = Phases(queue=self._scheduled - self._arrived,
                            prefill=self._first - self._scheduled,
                            decode=self._last - self._first,
                            inference=self._last - self._scheduled,
                            prompt_tokens=self.prompt_tokens,
                            generation_tokens=self.completion_tokens,
                            max_tokens=self.max_tokens)
        self.metrics.finished(reason, now - self._arrived, phases)

    def usage(self) -> dict:
        return schemas.usage(self.prompt_tokens, self.completion_tokens)

    async def close(self) -> None:
        """Cancel the request if it is still running, and settle the metrics. Nothing here
        waits on the engine, so it also runs in a task that is being cancelled."""
        if self._closed:
            return
        self._closed = True
        if self._started and self.finish_reason is None and not self._failed:
            self._finished("abort", time.perf_counter())
        await self._stream.aclose()             # cancels the request


async def collect(gen: Generation, first: StreamChunk) -> str:
    """The whole text of a generation whose first chunk is `first`."""
    try:
        parts, chunk = [], first
        while chunk is not None:
            parts.append(chunk.text)
            chunk = await gen.next()
        return "".join(parts)
    finally:
        await gen.close()


def sse(body: dict | str) -> str:
    return f"data: {body if isinstance(body, str) else json.dumps(body)}\n\n"


async def chat_events(gen: Generation, first: StreamChunk, rid: str, model: str,
                      include_usage: bool) -> AsyncIterator[str]:
    """OpenAI's chat.completion.chunk events: the role, the text deltas, the finish reason,
    the usage (if asked), then [DONE]. With `gen.with_ids`, the first event has the prompt's
    ids and each delta its token ids (vLLM's `return_token_ids`)."""
    def frame(delta, finish=None, ids=None, prompt_ids=None):
        return sse(schemas.chat_chunk(rid, model, delta, finish, ids=ids,
                                      prompt_ids=prompt_ids))

    async def deltas():
        yield frame({"role": "assistant", "content": ""},
                    prompt_ids=gen.prompt_ids if gen.with_ids else None)
        async for chunk in _chunks(gen, first):
            if chunk.text or (gen.with_ids and chunk.token_ids):
                yield frame({"content": chunk.text},
                            ids=chunk.token_ids if gen.with_ids else None)
        yield frame({}, gen.finish_reason)
        if include_usage:
            yield sse(schemas.chat_chunk(rid, model, None, None, gen.usage()))

    async for event in _guarded(gen, deltas()):
        yield event


async def completion_events(gen: Generation, first: StreamChunk, rid: str, model: str,
                            include_usage: bool) -> AsyncIterator[str]:
    """OpenAI's text_completion stream chunks, then [DONE]. With `gen.with_ids`, each chunk has
    its token ids and the first the prompt's too (vLLM's `return_token_ids`)."""
    async def deltas():
        prompt_ids = gen.prompt_ids if gen.with_ids else None
        async for chunk in _chunks(gen, first):
            if chunk.text or chunk.finish_reason is not None or (gen.with_ids
                                                                  and chunk.token_ids):
                yield sse(schemas.completion(
                    rid, model, chunk.text, gen.finish_reason if chunk.finish_reason else None,
                    None, chunk=True, ids=chunk.token_ids if gen.with_ids else None,
                    prompt_ids=prompt_ids))
                prompt_ids = None
        if include_usage:
            body = schemas.completion(rid, model, "", None, gen.usage(), chunk=True)
            body["choices"] = []
            yield sse(body)

    async for event in _guarded(gen, deltas()):
        yield event


async def _chunks(gen: Generation, first: StreamChunk) -> AsyncIterator[StreamChunk]:
    chunk = first
    while chunk is not None:
        yield chunk
        chunk = await gen.next()


async def _guarded(gen: Generation, events: AsyncIterator[str]) -> AsyncIterator[str]:
    """`events`, then [DONE]; a failure mid-stream becomes an error event (the status line
    was sent long ago). However the stream ends -- finished, failed, or closed by Starlette
    when the client disconnects -- the generation is closed, which cancels its request."""
    try:
        try:
            async for event in events:
                yield event
        except Exception as e:     # noqa: BLE001 -- reported to the client, logged in as_api_error
            err = as_api_error(e)
            gen.metrics.failed(err.status)
            yield sse(error_body(err.message, err.type, err.param, err.code))
        yield sse("[DONE]")
    finally:
        await events.aclose()
        await gen.close()
