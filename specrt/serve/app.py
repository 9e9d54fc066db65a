"""The OpenAI-compatible HTTP app: routes, and the step from an OpenAI request to a specrt one.

    POST /v1/completions        prompt: text (no chat template) or token ids
    POST /v1/chat/completions   messages through the model's chat template
    POST /tokenize, /detokenize  vLLM's: the ids a prompt or messages run as, and back
    GET  /v1/models, /health, /metrics (Prometheus text), /version

`build_app` takes a ready `AsyncLLM`; it neither loads nor closes models (the CLI, or a test,
owns them). Text is encoded here, on a worker thread (a long prompt takes seconds to tokenize;
the event loop serves everyone else meanwhile), so the prompt's length is known for `usage`, the
default token budget and the length check, which names the request's own fields; the engine
gets token ids. The server holds no
request state of its own: every request is a `Generation` that ends when its response does.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time

import specrt

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.requests import ClientDisconnect

from specrt.api.args import check_stop
from specrt.api.async_llm import AsyncLLM
from specrt.api.tokenizer import check_template_kwargs, check_turn_options
from specrt.engine.request import check_length, positions_needed
from specrt.errors import ClosedError, SpecrtError, TextTooLongError
from specrt.serve import schemas
from specrt.serve.errors import APIError, as_api_error, error_response, install_handlers
from specrt.serve.generation import Generation, chat_events, collect, completion_events
from specrt.serve.metrics import ServerMetrics
from specrt.spec.config import SpecConfig
from specrt.spec.sampling import SamplingParams


@dataclasses.dataclass(frozen=True)
class ServeConfig:
    served_model_name: str
    default_speculative: dict | None     # applied to requests that do not say otherwise


class _State:
    def __init__(self, allm: AsyncLLM, config: ServeConfig):
        self.allm, self.config = allm, config
        self.llm = allm.llm
        self.metrics = ServerMetrics(config.served_model_name, lambda: allm.llm.pending,
                                     lambda: allm.llm.running, lambda: allm.llm.kv_cache_usage,
                                     allm.llm.max_seq_len)
        self.created = int(time.time())
        self.stopping = asyncio.Event()     # set when the server's shutdown begins


def build_app(allm: AsyncLLM, config: ServeConfig) -> FastAPI:
    app = FastAPI(title="specrt", summary="OpenAI-compatible speculative decoding server")
    state = app.state.serve = _State(allm, config)
    install_handlers(app, state.metrics.failed)

    @app.post("/v1/completions")
    async def completions(request: Request, body: schemas.CompletionRequest):
        return await _respond(state, request, body, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request, body: schemas.ChatCompletionRequest):
        return await _respond(state, request, body, chat=True)

    @app.post("/tokenize")
    async def tokenize(body: schemas.TokenizeRequest):
        return await asyncio.to_thread(_tokenize, state, body)      # seconds for a long one

    @app.post("/detokenize")
    async def detokenize(body: schemas.DetokenizeRequest):
        _check_model(state, body)
        try:
            return {"prompt": await asyncio.to_thread(state.llm.decode, body.tokens)}
        except SpecrtError as e:
            raise APIError(str(e), param="tokens") from None

    @app.get("/version")
    @app.head("/version", include_in_schema=False)
    async def version():
        return {"version": specrt.__version__}

    # HEAD wherever GET (health checkers send it), kept out of the OpenAPI schema, whose
    # operation ids would repeat
    @app.get("/v1/models")
    @app.head("/v1/models", include_in_schema=False)
    async def models():
        return schemas.models_list(config.served_model_name, state.created, state.llm.max_seq_len)

    @app.get("/health")
    @app.head("/health", include_in_schema=False)
    async def health():
        return Response(status_code=200)

    @app.get("/metrics")
    @app.head("/metrics", include_in_schema=False)
    async def metrics():
        return Response(state.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    tokenizer = allm.llm.tokenizer
    # the longest prompt that can fit, each character as JSON's longest escape (a surrogate
    # pair's "\ud83d\ude00": 12 bytes), or without a tokenizer each of its token ids (the
    # vocabulary's longest, and room for a comma and indentation), and room for the other
    # fields
    if tokenizer is not None:
        prompt_bytes = 12 * tokenizer.max_chars(allm.llm.max_seq_len)
    else:
        prompt_bytes = allm.llm.max_seq_len * (len(str(allm.llm.target.cfg.vocab_size)) + 8)
    limit = prompt_bytes + (1 << 20)
    app.add_middleware(_BodyLimit, limit=limit, on_refused=state.metrics.failed,
                       stopping=state.stopping)

    return app


def begin_shutdown(app: FastAPI) -> None:
    """The server's shutdown has begun: a request still sending its body is answered 503
    now (it would otherwise hold the shutdown until its timeout, then get a 500)."""
    app.state.serve.stopping.set()


async def _respond(state: _State, request: Request, body, chat: bool):
    arrived = time.perf_counter()
    gen = None
    try:
        ids, args = await asyncio.to_thread(_engine_request, state, body, chat)
        # an answer without text (no tokenizer) is its ids, asked or not
        with_ids = body.return_token_ids if body.return_token_ids is not None else \
            state.llm.tokenizer is None
        gen = Generation(state.allm, state.metrics, ids, args, arrived, with_ids)
        # a client that leaves while its request is queued frees its place before prefill
        first = await _unless_disconnected(request, gen.start())
    except BaseException as e:  # noqa: BLE001 -- every failure answers this request alone
        if gen is not None:
            await gen.close()   # also when this handler is cancelled (e.g. server shutdown)
        if not isinstance(e, Exception):
            raise
        err = as_api_error(e)
        state.metrics.failed(err.status)
        return error_response(err)
    if first is None:
        await gen.close()
        return Response(status_code=499)        # nginx's "client closed request"; unread
    name = state.config.served_model_name
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    if body.stream:
        rid = schemas.new_id("chatcmpl" if chat else "cmpl")
        events = (chat_events if chat else completion_events)(gen, first, rid, name,
                                                              include_usage)
        return _GenerationStream(events, gen)
    try:
        text = await _unless_disconnected(request, collect(gen, first))
    except Exception as e:      # noqa: BLE001
        err = as_api_error(e)
        state.metrics.failed(err.status)
        return error_response(err)
    if text is None:
        return Response(status_code=499)        # nginx's "client closed request"; unread
    ids, prompt_ids = (gen.token_ids, gen.prompt_ids) if gen.with_ids else (None, None)
    if chat:
        out = schemas.chat_completion(schemas.new_id("chatcmpl"), name, text, gen.finish_reason,
                                      gen.usage(), ids, prompt_ids)
    else:
        out = schemas.completion(schemas.new_id("cmpl"), name, text, gen.finish_reason,
                                 gen.usage(), ids=ids, prompt_ids=prompt_ids)
    return JSONResponse(out)


class _GenerationStream(StreamingResponse):
    """A generation's server-sent events. The body closes the generation when it ends; so
    does the response, for a client gone before the body started (Starlette then never starts
    it: under ASGI spec 2.3 it returns, under 2.4 it raises ClientDisconnect)."""

    def __init__(self, events, gen: Generation):
        super().__init__(events, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache"})
        self._generation = gen

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        except ClientDisconnect:
            pass                            # nobody is left to answer
        finally:
            await self._generation.close()


class _BodyLimit:
    """A request body past `limit` bytes is answered 413 before the app sees it: past what
    any prompt that fits the cache needs, it would only cost memory and tokenizing time
    (a 100 MB body was read whole and its prompt tokenized for half a minute). The body is
    read here, up to the limit, and handed to the app as it arrived; a client gone before
    its body is whole never reaches the app (which counted it a malformed body, a 400), and
    one still sending when the server's shutdown begins is answered 503 at once."""

    def __init__(self, app, limit: int, on_refused, stopping: asyncio.Event):
        self.app, self.on_refused, self.stopping = app, on_refused, stopping
        self.limit = limit

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.limit:
            return await self._refuse(self._too_large(), scope, receive, send)
        messages, size = [], 0
        while True:
            message = await self._receive(receive)
            if message is None:                 # the shutdown began with the body half sent
                return await self._refuse(as_api_error(ClosedError("shutting down")), scope,
                                          receive, send)
            if message["type"] == "http.disconnect":
                return          # gone before its body was whole: nothing to answer or count
            messages.append(message)
            if message["type"] != "http.request":
                break
            size += len(message.get("body", b""))
            if size > self.limit:
                return await self._refuse(self._too_large(), scope, receive, send)
            if not message.get("more_body", False):
                break

        async def replay():
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)

    async def _receive(self, receive):
        """The next message, or None if the server's shutdown begins before it comes."""
        message = asyncio.ensure_future(receive())
        stopping = asyncio.ensure_future(self.stopping.wait())
        try:
            await asyncio.wait({message, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
            if not message.done():
                message.cancel()            # also when this handler is cancelled
        return message.result() if message.done() and not message.cancelled() else None

    def _too_large(self) -> APIError:
        return APIError(f"the request body is larger than {self.limit:,} bytes, more than the "
                        "longest prompt that fits --max-model-len needs; send a shorter prompt",
                        413, "invalid_request_error", code="request_too_large")

    async def _refuse(self, err: APIError, scope, receive, send) -> None:
        self.on_refused(err.status)
        await error_response(err)(scope, receive, send)


async def _unless_disconnected(request: Request, work):
    """`await work`, or cancel it and return None if the client disconnects first (Starlette
    cancels a streaming response's iterator by itself, but not a plain handler)."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not task.done():
            task.cancel()           # the stream's finally cancels the request
            await asyncio.wait({task})      # ... before its generation is closed
    try:
        return await task
    except asyncio.CancelledError:
        if watch.cancelled() or not watch.done():
            raise                   # we are being cancelled ourselves
        return None


async def _disconnected(request: Request) -> None:
    # the body was read already, so the next message is the disconnect
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _check_model(state: _State, body) -> None:
    if body.model is not None and body.model != state.config.served_model_name:
        raise APIError(f"the model {body.model!r} does not exist; this server serves "
                       f"{state.config.served_model_name!r}", param="model",
                       code="model_not_found")


def _tokenize(state: _State, body: schemas.TokenizeRequest) -> dict:
    """/tokenize's answer: the ids the completion or chat endpoint would run."""
    _check_model(state, body)
    if (body.prompt is None) == (body.messages is None):
        raise APIError("send a \"prompt\" (tokenized as /v1/completions does) or "
                       "\"messages\" (as /v1/chat/completions does), one of the two")
    _refuse_unsupported(body)
    # as those endpoints tokenize: a prompt with its special tokens (a BOS, where the
    # tokenizer adds one), messages without (the template writes them)
    added = body.messages is None
    if body.add_special_tokens not in (None, added):
        raise APIError(f"add_special_tokens={str(not added).lower()} is not supported: "
                       f"{'a prompt is' if added else 'messages are'} tokenized as "
                       f"{'/v1/completions' if added else '/v1/chat/completions'} does; "
                       "leave it out", param="add_special_tokens")
    if body.prompt == "":
        return schemas.tokenized([], state.llm.max_seq_len, [] if body.return_token_strs
                                 else None)
    if state.llm.tokenizer is None:
        raise APIError("this model has no tokenizer (no tokenizer.json), so there is no text to "
                       "tokenize; its completions take prompts as token ids")
    if body.messages is None:
        _refuse_template_options(body)
    try:
        ids = _encode(state, body, chat=body.messages is not None, **body.template_options())
        strs = state.llm.tokenizer.token_strs(ids) if body.return_token_strs else None
    except SpecrtError as e:
        raise as_api_error(e) from None
    return schemas.tokenized(ids, state.llm.max_seq_len, strs)


def _refuse_template_options(body: schemas.TokenizeRequest) -> None:
    """A prompt with the chat template's fields: they apply to messages only."""
    asks = {"continue_final_message": body.continue_final_message,
            "add_generation_prompt": not body.add_generation_prompt,
            "chat_template_kwargs": bool(body.chat_template_kwargs)}   # {} asks for nothing
    for name, asked in asks.items():
        if asked:
            raise APIError(f"{name} applies to chat messages, not to a prompt: send "
                           "\"messages\" instead of \"prompt\", or leave it out", param=name)


def _encode(state: _State, body, chat: bool, **options) -> list[int]:
    """The ids of a request's messages (chat) or prompt; what is wrong with them (too long to
    fit, empty, an id past the vocabulary, text that is not Unicode) is a 400 naming the
    request's field (the template's options are checked first, under their own names)."""
    field = "messages" if chat else "prompt"
    if chat:
        _check_template_options(options)
    try:
        if chat:
            return state.llm.encode(messages=[m.as_dict() for m in body.messages], **options)
        return state.llm.encode(body.prompt, chat=False, **options)
    except TextTooLongError as e:
        raise APIError(e.describe("the server's --max-model-len"), param=field) from None
    except SpecrtError as e:
        raise APIError(str(e), param=field) from None


def _check_template_options(options: dict) -> None:
    """The chat-template fields of a request, checked as `Tokenizer.chat_text` checks them,
    and refused under their names."""
    with _as_field("add_generation_prompt"):
        check_turn_options(options.get("add_generation_prompt", True),
                           options.get("continue_final_message", False))
    with _as_field("chat_template_kwargs"):
        check_template_kwargs(options.get("chat_template_kwargs"))


def _refuse_unsupported(body) -> None:
    unsupported = body.unsupported()
    if unsupported is not None:
        name, value = unsupported
        raise APIError(f"{name} is not supported by this server (got {value!r}); leave it out",
                       param=name)


def _engine_request(state: _State, body, chat: bool) -> tuple[list[int], dict]:
    """(prompt ids, keyword arguments of AsyncLLM.stream) for an OpenAI request; raises
    APIError or SpecrtError (both 400) for one that cannot run."""
    _check_model(state, body)
    if body.n != 1:
        raise APIError(f"n must be 1 (one choice per request), got {body.n}", param="n")
    _refuse_unsupported(body)
    # as vLLM: stream_options that ask for something ({} and null ask for nothing)
    options = body.stream_options
    if options is not None and (options.model_fields_set or options.model_extra) \
            and not body.stream:
        raise APIError("stream_options applies to streamed responses: set \"stream\": true "
                       "or leave stream_options out", param="stream_options")
    ids = _encode(state, body, chat, **(body.template_options() if chat else {}))
    if body.speculative is None:
        spec = state.config.default_speculative
    elif body.speculative and "model" in body.speculative:
        # a path from a client would make the server load any directory it can read
        raise APIError("a request's speculative config may not name a draft \"model\"; the "
                       "server's draft is set with --draft", param="speculative")
    else:
        spec = None if body.speculative is False else body.speculative   # false: plain
    with _as_field("speculative"):
        parsed = SpecConfig.parse(spec)
    if parsed is not None and parsed.method == "draft_model" and state.llm.draft_dir is None:
        raise APIError("this server has no draft model, so speculative method 'draft_model' "
                       "cannot run; send {\"method\": \"ngram\"} or {\"method\": \"auto\"} "
                       "(prompt lookup), or \"speculative\": false, or start the server with "
                       "--draft DIR", param="speculative")
    max_tokens, field = body.token_budget()
    if max_tokens is not None and max_tokens < 1:
        raise APIError(f"{field} must be at least 1, got {max_tokens}", param=field)
    _check_room(state, len(ids), parsed, chat)
    if max_tokens is None:
        room = state.llm.max_seq_len - positions_needed(len(ids), 0, parsed)
        default = schemas.CHAT_MAX_TOKENS if chat else schemas.COMPLETION_MAX_TOKENS
        max_tokens = min(default, room)
    try:
        check_length(len(ids), max_tokens, parsed, state.llm.max_seq_len,
                     "the server's --max-model-len", budget=field)
    except SpecrtError as e:
        raise APIError(str(e) + _unspeculated_fit(state, len(ids), max_tokens, parsed),
                       param=field) from None
    sampling = dict(temperature=1.0 if body.temperature is None else float(body.temperature),
                    top_p=1.0 if body.top_p is None else float(body.top_p),
                    top_k=body.top_k_or_off(), seed=body.seed)
    try:          # checked here, where each error can name the request's field
        SamplingParams(**sampling)
    except SpecrtError as e:
        raise APIError(str(e), param=next((f for f in sampling if str(e).startswith(f)),
                                          None)) from None
    with _as_field("stop"):
        check_stop(body.stops())
    if body.stops() and state.llm.tokenizer is None:
        raise APIError("this model has no tokenizer (no tokenizer.json), so a stop string cannot "
                       "be matched in its answers; leave \"stop\" out", param="stop")
    return ids, dict(max_new_tokens=max_tokens, **sampling, stop=body.stops(),
                     speculative=parsed)


def _check_room(state: _State, prompt_tokens: int, spec: SpecConfig | None, chat: bool) -> None:
    """A prompt that leaves no room for even one token of answer is the prompt's fault (named
    as such, whatever budget the request set or left out)."""
    if positions_needed(prompt_tokens, 1, spec) <= state.llm.max_seq_len:
        return
    k = spec.num_speculative_tokens if spec is not None else 0
    raise APIError(f"the prompt ({prompt_tokens} tokens)"
                   + (f" + K+1 ({k + 1}) for speculation" if k else "")
                   + f" leaves no room for an answer in the server's --max-model-len "
                   f"({state.llm.max_seq_len}); send a shorter prompt"
                   + _unspeculated_fit(state, prompt_tokens, 1, spec),
                   param="messages" if chat else "prompt")


def _unspeculated_fit(state: _State, prompt_tokens: int, max_tokens: int,
                      spec: SpecConfig | None) -> str:
    """A hint for a request that only speculation's K+1 positions keep from fitting."""
    if spec is None or positions_needed(prompt_tokens, max_tokens, None) > state.llm.max_seq_len:
        return ""
    return ", or send \"speculative\": false (plain decoding needs no K+1)"


@contextlib.contextmanager
def _as_field(field: str):
    """A SpecrtError raised inside is a 400 naming the request's `field`."""
    try:
        yield
    except SpecrtError as e:
        raise APIError(str(e), param=field) from None
