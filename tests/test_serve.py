"""The HTTP server, end to end: a real uvicorn server in this process on a tiny model, driven by
the official `openai` client (and raw HTTP where the client would hide what is tested).

In-process so faults can be injected into one request and the engine's slots inspected.
Every client call has a timeout and no retries; the whole file runs in well under 2 minutes.
"""
from __future__ import annotations

import asyncio
import http.client
import json
import os
import re
import socket
import threading
import time

import openai
import pytest
import uvicorn

import specrt
from specrt.serve import ServeConfig, build_app
from tests.helpers import run_bounded

SPEC = {"method": "draft_model", "num_speculative_tokens": 3}   # fixed: sampling is exact
PROMPTS = ["The quick brown fox", "def add(a, b):", "for i in range(10):",
           "Once upon a time", "A refrigerator keeps", "Speculative decoding drafts"]
TIMEOUT = 30.0


class Server:
    """A uvicorn server on a free port in a background thread, on an LLM the test owns."""

    def __init__(self, llm: specrt.LLM, name: str = "tiny", spec: dict | None = SPEC):
        self.llm = llm
        self.app = build_app(specrt.AsyncLLM(llm=llm), ServeConfig(name, spec))
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        config = uvicorn.Config(self.app, log_level="warning", lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       daemon=True)
        self.url = f"http://127.0.0.1:{self.port}"

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.01)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(10)
        self.llm.close()

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key="x", timeout=TIMEOUT,
                             max_retries=0)

    def aclient(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=self.url + "/v1", api_key="x", timeout=TIMEOUT,
                                  max_retries=0)

    def raw(self, method: str, path: str, body: bytes | str | dict | None = None,
            content_type: str = "application/json"):
        """(status, headers, body bytes) of one plain HTTP request."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=TIMEOUT)
        try:
            if isinstance(body, dict):
                body = json.dumps(body)
            conn.request(method, path, body=body, headers={"Content-Type": content_type})
            resp = conn.getresponse()
            return resp.status, dict(resp.getheaders()), resp.read()
        finally:
            conn.close()

    def metrics(self) -> dict[str, float]:
        """{'name{labels}': value} of /metrics."""
        status, _, text = self.raw("GET", "/metrics")
        assert status == 200
        out = {}
        for line in text.decode().splitlines():
            if line and not line.startswith("#"):
                key, value = line.rsplit(" ", 1)
                out[key] = float(value)
        return out

    def wait_idle(self, seconds: float = 10.0) -> None:
        deadline = time.monotonic() + seconds
        while self.llm.engine.busy or self.llm.scheduler.pending:
            assert time.monotonic() < deadline, "the engine did not go idle"
            time.sleep(0.01)


@pytest.fixture(scope="module")
def server(tiny_noeos_dir, tiny_draft_dir):
    # draft_stop 0: the tiny draft is never confident, and would stop after its first guess
    llm = specrt.LLM(tiny_noeos_dir, draft=tiny_draft_dir, max_seq_len=2048, max_batch_size=4,
                     dtype="float32", draft_stop=0.0)
    with Server(llm) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return server.client()


def complete(client, prompt, **kw):
    kw.setdefault("max_tokens", 24)
    kw.setdefault("temperature", 0)
    return client.completions.create(model="tiny", prompt=prompt, **kw)


async def stream_text(aclient, prompt, **kw) -> tuple[str, str]:
    kw.setdefault("max_tokens", 24)
    kw.setdefault("temperature", 0)
    stream = await aclient.completions.create(model="tiny", prompt=prompt, stream=True, **kw)
    parts, finish = [], None
    async for event in stream:
        parts.append(event.choices[0].text)
        finish = event.choices[0].finish_reason or finish
    return "".join(parts), finish


# --- the endpoints -------------------------------------------------------------------------------
def test_models_health_and_metrics_endpoints(server, client):
    assert [m.id for m in client.models.list().data] == ["tiny"]
    assert server.raw("GET", "/health")[0] == 200
    status, headers, _ = server.raw("GET", "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain")


def test_completion_text_usage_and_finish_reason(server, client):
    res = complete(client, "The quick brown fox", max_tokens=20)
    alone = server.llm.generate("The quick brown fox", max_new_tokens=20, speculative=SPEC)
    assert res.choices[0].text == alone.text
    assert res.choices[0].finish_reason == "length"
    prompt_len = len(server.llm.encode("The quick brown fox"))
    assert (res.usage.prompt_tokens, res.usage.completion_tokens, res.usage.total_tokens) == \
        (prompt_len, 20, prompt_len + 20)
    # token ids as the prompt give the same answer
    ids = server.llm.encode("The quick brown fox")
    assert complete(client, ids, max_tokens=20).choices[0].text == alone.text
    # specrt's extra field: plain decoding for this request (greedy: the same tokens)
    plain = complete(client, "The quick brown fox", max_tokens=20,
                     extra_body={"speculative": False})
    assert plain.choices[0].text == alone.text
    # OpenAI's default budget is 16 tokens
    res = client.completions.create(model="tiny", prompt="Once upon a time", temperature=0)
    assert res.usage.completion_tokens == 16


def test_completion_stream_equals_non_stream(server, client):
    full = complete(client, "def add(a, b):", max_tokens=30).choices[0].text
    text, finish = asyncio.run(stream_text(server.aclient(), "def add(a, b):", max_tokens=30))
    assert (text, finish) == (full, "length")


def test_chat_with_system_message_stream_and_usage(server, client):
    messages = [{"role": "system", "content": "You write Python."},
                {"role": "user", "content": "def add(a, b):"}]
    res = client.chat.completions.create(model="tiny", messages=messages, max_tokens=25,
                                         temperature=0)
    alone = server.llm.generate(messages=messages, max_new_tokens=25, speculative=SPEC)
    assert res.choices[0].message.content == alone.text
    assert res.choices[0].message.role == "assistant"
    assert res.choices[0].finish_reason == "length"
    assert res.usage.prompt_tokens == len(server.llm.encode(messages=messages))
    assert res.usage.completion_tokens == 25

    stream = client.chat.completions.create(model="tiny", messages=messages, max_tokens=25,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    events = list(stream)
    assert events[0].choices[0].delta.role == "assistant"
    text = "".join(e.choices[0].delta.content or "" for e in events if e.choices)
    assert text == alone.text
    assert [e.choices[0].finish_reason for e in events if e.choices][-1] == "length"
    assert events[-1].choices == [] and events[-1].usage.completion_tokens == 25


def test_chat_default_budget_is_capped_by_the_model_length(tiny_noeos_dir):
    llm = specrt.LLM(tiny_noeos_dir, max_seq_len=64, max_batch_size=1, dtype="float32")
    with Server(llm, spec=None) as s:
        res = s.client().chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "Hi"}], temperature=0)
        assert res.usage.prompt_tokens + res.usage.completion_tokens == 64


def test_stop_string_finishes_with_stop(server, client):
    text = complete(client, "for i in range(10):", max_tokens=40).choices[0].text
    stop = text[6:9]
    res = complete(client, "for i in range(10):", max_tokens=40, stop=[stop])
    assert res.choices[0].text == text[:text.find(stop)]
    assert res.choices[0].finish_reason == "stop"


# --- exactness under load ----------------------------------------------------------------------
def test_16_concurrent_greedy_streams_equal_their_solo_outputs(server, client):
    prompts = [f"{PROMPTS[i % len(PROMPTS)]} {i}" for i in range(16)]
    solo = [complete(client, p).choices[0].text for p in prompts]

    async def all_at_once():
        aclient = server.aclient()
        return await asyncio.gather(*(stream_text(aclient, p) for p in prompts))

    got = asyncio.run(asyncio.wait_for(all_at_once(), 90))
    assert [text for text, _ in got] == solo
    assert {finish for _, finish in got} == {"length"}


def test_seeded_sampling_alone_equals_under_load(server, client):
    kw = dict(temperature=1.0, top_p=0.9, seed=1234, max_tokens=30)
    alone = complete(client, "Once upon a time", **kw).choices[0].text
    assert complete(client, "Once upon a time", **kw).choices[0].text == alone

    async def under_load():
        aclient = server.aclient()
        others = [stream_text(aclient, p, temperature=1.0, seed=i, max_tokens=40)
                  for i, p in enumerate(PROMPTS)]
        return await asyncio.gather(stream_text(aclient, "Once upon a time", **kw), *others)

    got = asyncio.run(asyncio.wait_for(under_load(), 60))
    assert got[0][0] == alone


# --- clients that go away ------------------------------------------------------------------------
def test_client_disconnect_mid_stream_frees_the_slot(server, client):
    before = complete(client, "The quick brown fox").choices[0].text
    server.wait_idle()
    m0 = server.metrics()
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=TIMEOUT)
    conn.request("POST", "/v1/completions", json.dumps(
        {"model": "tiny", "prompt": "Once upon a time", "max_tokens": 1900, "temperature": 0,
         "stream": True, "speculative": SPEC}), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    for _ in range(6):                                     # the prefill's chunk and 5 rounds
        assert resp.readline().startswith(b"data: ")
        assert resp.readline() == b"\n"
    assert server.llm.engine.busy
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()
    server.wait_idle()
    m1 = server.metrics()
    key = 'vllm:request_success_total{finished_reason="abort",model_name="tiny"}'
    assert m1[key] - m0.get(key, 0) == 1
    generated = (m1['vllm:generation_tokens_total{model_name="tiny"}']
                 - m0['vllm:generation_tokens_total{model_name="tiny"}'])
    assert generated < 1900                                 # cancelled, not run to the end
    # the rounds it was delivered count, as a finished request's do (each drafted 3)
    drafts = (m1['vllm:spec_decode_num_drafts_total{model_name="tiny"}']
              - m0['vllm:spec_decode_num_drafts_total{model_name="tiny"}'])
    assert drafts >= 5 and (m1['vllm:spec_decode_num_draft_tokens_total{model_name="tiny"}']
                            - m0['vllm:spec_decode_num_draft_tokens_total{model_name="tiny"}']
                            == 3 * drafts)
    assert server.llm.engine.slots == [None] * 4
    assert complete(client, "The quick brown fox").choices[0].text == before


def test_client_gone_before_a_non_streaming_answer_cancels_it(server):
    server.wait_idle()
    m0 = server.metrics()
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=TIMEOUT)
    conn.request("POST", "/v1/completions", json.dumps(
        {"model": "tiny", "prompt": "Once upon a time", "max_tokens": 1900, "temperature": 0}),
        {"Content-Type": "application/json"})
    deadline = time.monotonic() + 10
    while not server.llm.engine.busy:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()
    server.wait_idle()
    m1 = server.metrics()
    key = 'vllm:request_success_total{finished_reason="abort",model_name="tiny"}'
    assert m1[key] - m0.get(key, 0) == 1
    assert server.llm.engine.slots == [None] * 4


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_gone_while_queued_leaves_the_queue_before_its_prefill(tiny_noeos_dir,
                                                                        stream):
    """One slot, held by a long stream; a second request waits in the queue and its client
    leaves. The request must leave the queue then, while the first still runs, and never be
    prefilled (it used to wait for the slot, be prefilled, and only be cancelled when its
    first token found nobody to send it to)."""
    llm = specrt.LLM(tiny_noeos_dir, max_seq_len=2048, max_batch_size=1, dtype="float32")
    with Server(llm, spec=None) as s:
        holder = http.client.HTTPConnection("127.0.0.1", s.port, timeout=TIMEOUT)
        holder.request("POST", "/v1/completions", json.dumps(
            {"model": "tiny", "prompt": "Once upon a time", "max_tokens": 1900,
             "temperature": 0, "stream": True}), {"Content-Type": "application/json"})
        resp = holder.getresponse()
        assert resp.readline().startswith(b"data: ")
        m0 = s.metrics()
        queued = http.client.HTTPConnection("127.0.0.1", s.port, timeout=TIMEOUT)
        queued.request("POST", "/v1/completions", json.dumps(
            {"model": "tiny", "prompt": "A refrigerator keeps", "max_tokens": 8,
             "temperature": 0, "stream": stream}), {"Content-Type": "application/json"})
        deadline = time.monotonic() + 10
        while not llm.scheduler.pending:
            assert time.monotonic() < deadline, "the second request was never queued"
            time.sleep(0.002)
        queued.sock.shutdown(socket.SHUT_RDWR)
        queued.close()
        deadline = time.monotonic() + 10
        while llm.scheduler.pending:
            assert time.monotonic() < deadline, "the request stayed queued"
            time.sleep(0.002)
        assert llm.engine.busy and llm.engine.slots[0] is not None   # the first still runs
        m1 = s.metrics()
        holder.sock.shutdown(socket.SHUT_RDWR)
        holder.close()
        s.wait_idle()
        m2 = s.metrics()

    def delta(key, a=m0, b=m1):
        return b.get(key, 0) - a.get(key, 0)

    assert delta('vllm:prompt_tokens_total{model_name="tiny"}') == 0     # never prefilled
    assert delta('vllm:request_success_total{finished_reason="abort",model_name="tiny"}') == 1
    assert m1['vllm:num_requests_running{model_name="tiny"}'] == 1       # the holder only
    assert m2['vllm:num_requests_running{model_name="tiny"}'] == 0


# --- bad input, failures, back-pressure -------------------------------------------------
BAD = {
    "malformed JSON": b'{"model": "tiny", "prompt": ',
    "wrong type": {"model": "tiny", "prompt": "hi", "max_tokens": "five"},
    "wrong type of stop": {"model": "tiny", "prompt": "hi", "stop": 3},
    "missing prompt": {"model": "tiny"},
    "max_tokens 0": {"model": "tiny", "prompt": "hi", "max_tokens": 0},
    "unknown model": {"model": "gpt-5", "prompt": "hi"},
    "n = 2": {"model": "tiny", "prompt": "hi", "n": 2},
    "prompt too long": {"model": "tiny", "prompt": list(range(1, 300)) * 7, "max_tokens": 16},
    "token id out of vocabulary": {"model": "tiny", "prompt": [1, 2, 10**6]},
    "empty prompt": {"model": "tiny", "prompt": ""},
    "bad speculative config": {"model": "tiny", "prompt": "hi",
                               "speculative": {"method": "magic"}},
    "draft model named by a request": {"model": "tiny", "prompt": "hi", "speculative": {
        "method": "draft_model", "model": "/etc"}},
    "negative temperature": {"model": "tiny", "prompt": "hi", "temperature": -1},
    "top_p 0": {"model": "tiny", "prompt": "hi", "top_p": 0},
    "string temperature": {"model": "tiny", "prompt": "hi", "temperature": "0.5"},
    "temperature past float32": {"model": "tiny", "prompt": "hi", "temperature": 1e39},
    "logprobs asked for": {"model": "tiny", "prompt": "hi", "logprobs": 5},
    "echo asked for": {"model": "tiny", "prompt": "hi", "echo": True},
    "a presence penalty": {"model": "tiny", "prompt": "hi", "presence_penalty": 1.5},
    "JSON mode": {"model": "tiny", "prompt": "hi", "response_format": {"type": "json_object"}},
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_input_is_a_400_with_an_openai_error_body(server, name):
    status, _, body = server.raw("POST", "/v1/completions", BAD[name])
    assert status == 400, body
    error = json.loads(body)["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    assert set(error) == {"message", "type", "param", "code"}


def test_bad_chat_input_and_the_server_lives_on(server, client):
    for body in ({"model": "tiny", "messages": []},
                 {"model": "tiny", "messages": [{"role": "wizard", "content": "hi"}]},
                 {"model": "tiny", "messages": [{"role": "user", "content": 5}]},
                 {"model": "tiny", "messages": "hi"}):
        status, _, raw = server.raw("POST", "/v1/chat/completions", body)
        assert status == 400, raw
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="nope", prompt="hi", max_tokens=4)
    # unknown extra fields are ignored
    res = complete(client, "hi", max_tokens=4, user="u1", extra_body={"foo": {"bar": 1}})
    assert res.usage.completion_tokens == 4


def _error(response) -> dict:
    status, _, body = response
    assert status == 400, body
    return json.loads(body)["error"]


def test_an_unsupported_field_is_refused_by_name_unless_it_asks_for_nothing(server, client):
    """Ignoring logprobs, echo, penalties or JSON mode would answer a different question than
    the client asked; their neutral values (what clients send by default) are accepted."""
    for field, value in [("logprobs", 2), ("best_of", 3), ("logit_bias", {"5": -100}),
                         ("frequency_penalty", 0.5), ("tools", [{"type": "function"}])]:
        error = _error(server.raw("POST", "/v1/completions",
                                  {"model": "tiny", "prompt": "hi", field: value}))
        assert error["param"] == field and "not supported" in error["message"], error
    error = _error(server.raw("POST", "/v1/chat/completions", {
        "model": "tiny", "messages": [{"role": "user", "content": "x"}], "logprobs": True,
        "top_logprobs": 2}))
    assert error["param"] == "logprobs", error
    res = complete(client, "hi", max_tokens=4, logprobs=None, echo=False, presence_penalty=0,
                   extra_body={"response_format": {"type": "text"}, "tool_choice": "none"})
    assert res.usage.completion_tokens == 4


def test_vllms_sampling_extensions_are_refused_by_name_unless_they_ask_for_nothing(server):
    """stop_token_ids, include_stop_str_in_output, allowed_token_ids, beam search, ...: vLLM
    fields this server does not implement were ignored (a 200 answering another question)."""
    for field, value in [("stop_token_ids", [5]), ("include_stop_str_in_output", True),
                         ("skip_special_tokens", False), ("allowed_token_ids", [5]),
                         ("bad_words", ["x"]), ("use_beam_search", True),
                         ("prompt_logprobs", 1), ("truncate_prompt_tokens", 1)]:
        error = _error(server.raw("POST", "/v1/completions",
                                  {"model": "tiny", "prompt": "hi", field: value}))
        assert error["param"] == field and "not supported" in error["message"], error
    neutral = {"stop_token_ids": [], "include_stop_str_in_output": False,
               "skip_special_tokens": True, "use_beam_search": False, "length_penalty": 1.0,
               "priority": 0}
    status, _, body = server.raw("POST", "/v1/completions", {
        "model": "tiny", "prompt": "hi", "max_tokens": 3, "temperature": 0, **neutral})
    assert status == 200, body


def test_vllms_null_and_minus_one_defaults_are_taken(server):
    """null for n, stream, include_usage and the template switches means their default, and
    top_k -1 means no top-k, as in vLLM: the same answer as without them."""
    base = {"model": "tiny", "prompt": "Once upon", "max_tokens": 6, "temperature": 0}
    status, _, plain = server.raw("POST", "/v1/completions", base)
    assert status == 200, plain
    status, _, body = server.raw("POST", "/v1/completions", {
        **base, "n": None, "stream": None, "stream_options": {"include_usage": None},
        "top_k": -1})
    assert status == 200, body
    assert json.loads(body)["choices"][0]["text"] == json.loads(plain)["choices"][0]["text"]
    status, _, body = server.raw("POST", "/v1/chat/completions", {
        "model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2,
        "add_generation_prompt": None, "continue_final_message": None})
    assert status == 200, body
    error = _error(server.raw("POST", "/v1/completions", {**base, "top_k": -2}))
    assert error["param"] == "top_k" and "-1" in error["message"], error


def test_a_number_is_not_a_speculative_config(server):
    """0 == False in Python, so 0 passed as `false` (plain decoding) in a strict schema."""
    for value in (0, 0.0, 1):
        error = _error(server.raw("POST", "/v1/completions",
                                  {"model": "tiny", "prompt": "hi", "speculative": value}))
        assert error["param"] == "speculative", error


def test_errors_specrt_raises_name_the_requests_field(server):
    """The request's own field as `param` for what specrt's checks refuse (it was null)."""
    for field, value in [("seed", -1), ("top_k", 2**40), ("stop", [""]), ("prompt", [99999]),
                         ("speculative", {"method": "xx"}),
                         ("speculative", {"num_speculative_tokens": 99})]:
        body = {"model": "tiny", "prompt": "hi", field: value}
        error = _error(server.raw("POST", "/v1/completions", body))
        assert error["param"] == field, error
    error = _error(server.raw("POST", "/v1/chat/completions", {
        "model": "tiny", "messages": [{"role": "user", "content": "x"}], "temperature": 0.5,
        "top_p": 1.0, "seed": 2**64}))
    assert error["param"] == "seed", error


def test_an_unparseable_body_says_why(server):
    """A body of valid UTF-8 JSON that Python cannot read: the reason, not "not UTF-8?"."""
    deep = b'{"model": "tiny", "prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    long = b'{"model": "tiny", "prompt": "x", "max_tokens": 1' + b"0" * 5000 + b"}"
    for body, reason in [(deep, "nested too deeply"), (long, "more digits"),
                         (b'{"prompt": "\xff"}', "not UTF-8")]:
        error = _error(server.raw("POST", "/v1/completions", body))
        assert reason in error["message"], error


def test_length_errors_name_the_requests_fields_and_the_servers_flag(server):
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "x"}]}
    error = _error(server.raw("POST", "/v1/chat/completions",
                              {**chat, "max_completion_tokens": 0}))
    assert error["param"] == "max_completion_tokens", error
    assert error["message"].startswith("max_completion_tokens must be at least 1"), error
    for body, field in [({**chat, "max_completion_tokens": 10**6}, "max_completion_tokens"),
                        ({"model": "tiny", "prompt": "hi", "max_tokens": 2**40}, "max_tokens")]:
        path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
        error = _error(server.raw("POST", path, body))
        assert error["param"] == field and f"+ {field} (" in error["message"], error
        assert "--max-model-len" in error["message"] and "max_new_tokens" not in \
            error["message"], error


def test_a_prompt_that_leaves_no_room_is_the_prompts_fault_not_max_tokens(tiny_noeos_dir):
    """A prompt too long for any answer was blamed on max_tokens, even when the client sent
    none ("+ max_tokens (1)"); now it names the prompt (messages), and where speculation's K+1
    positions are all that keep a request from fitting, says "speculative": false."""
    llm = specrt.LLM(tiny_noeos_dir, max_seq_len=64, max_batch_size=1, dtype="float32")
    with Server(llm, spec={"method": "ngram", "num_speculative_tokens": 8}) as s:
        long = {"role": "user", "content": "hello " * 80}
        for body in ({"messages": [long]}, {"messages": [long], "max_tokens": 8}):
            error = _error(s.raw("POST", "/v1/chat/completions", {"model": "tiny", **body}))
            assert error["param"] == "messages", error
            assert "leaves no room for an answer" in error["message"], error
            assert "max_tokens" not in error["message"], error
        ids = list(range(1, 51))                 # 50 + 6 tokens fit 64, not with K+1 (9) more
        error = _error(s.raw("POST", "/v1/completions",
                             {"model": "tiny", "prompt": ids, "max_tokens": 6}))
        assert error["param"] == "max_tokens" and '"speculative": false' in error["message"]
        status, _, body = s.raw("POST", "/v1/completions", {
            "model": "tiny", "prompt": ids, "max_tokens": 6, "speculative": False})
        assert status == 200, body
        # no max_tokens sent: the default 16, capped by the room left (as a chat request's)
        status, _, body = s.raw("POST", "/v1/completions", {
            "model": "tiny", "prompt": list(range(1, 61)), "speculative": False})
        assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 4, body


def test_prompt_and_template_errors_name_their_field_in_jsons_words(server):
    """An empty prompt, text that is not Unicode, and template options that contradict each
    other named no field (param null), or said it in Python's words ("=True")."""
    error = _error(server.raw("POST", "/v1/completions", {"model": "tiny", "prompt": ""}))
    assert error["param"] == "prompt", error
    error = _error(server.raw("POST", "/v1/completions",
                              '{"model": "tiny", "prompt": "a\\udcffb"}'))
    assert error["param"] == "prompt", error
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "x"}]}
    error = _error(server.raw("POST", "/v1/chat/completions",
                              {**chat, "continue_final_message": True}))
    assert error["param"] == "add_generation_prompt", error
    assert "=True" not in error["message"] and "=False" not in error["message"] \
        and "turn add_generation_prompt off" in error["message"], error
    error = _error(server.raw("POST", "/v1/chat/completions",
                              {**chat, "chat_template_kwargs": {"1x": 2}}))
    assert error["param"] == "chat_template_kwargs", error


def test_a_body_that_is_not_a_json_object_says_to_send_one(server):
    """An empty body, or JSON that is not an object, got pydantic's "body: Field required" or
    "Input should be a valid dictionary" with no fix."""
    for body, got in [(b"", "an empty body"), (b"[1, 2]", "a JSON array"),
                      (b"null", "JSON null"), (b'"x"', "a JSON string")]:
        error = _error(server.raw("POST", "/v1/completions", body))
        assert f"must be a JSON object of the request's fields, got {got}" in \
            error["message"], error
        assert error["message"].count("Content-Type: application/json") == 1, error


def test_a_draft_model_request_to_a_server_without_a_draft_is_told_what_it_has(tiny_noeos_dir):
    """The error pointed at LLM(draft=DIR) and a "model" key the server itself refuses."""
    llm = specrt.LLM(tiny_noeos_dir, max_seq_len=256, max_batch_size=1, dtype="float32")
    with Server(llm, spec=None) as s:
        for spec in ({"method": "draft_model"}, {}):
            error = _error(s.raw("POST", "/v1/completions",
                                 {"model": "tiny", "prompt": "hi", "speculative": spec}))
            assert error["param"] == "speculative", error
            assert "no draft model" in error["message"] and '"ngram"' in error["message"]
            assert "LLM(" not in error["message"], error
        status, _, body = s.raw("POST", "/v1/completions", {
            "model": "tiny", "prompt": "hi", "max_tokens": 3, "speculative": {"method": "ngram"}})
        assert status == 200, body


def test_return_token_ids_gives_the_answers_and_the_prompts_ids(server, client):
    """vLLM's `return_token_ids`: the ids beside the text, whole or per streamed chunk, the
    same as the engine's for the request; not sent unless asked (a model with a tokenizer)."""
    want = server.llm.generate("def add(a, b):", chat=False, max_new_tokens=12)
    prompt = server.llm.encode("def add(a, b):", chat=False)
    res = complete(client, "def add(a, b):", max_tokens=12,
                   extra_body={"return_token_ids": True}).model_dump()
    assert res["choices"][0]["token_ids"] == want.token_ids
    assert res["choices"][0]["prompt_token_ids"] == prompt
    assert "token_ids" not in complete(client, "def add(a, b):", max_tokens=4).model_dump()[
        "choices"][0]
    stream = client.completions.create(model="tiny", prompt="def add(a, b):", max_tokens=12,
                                       temperature=0, stream=True,
                                       extra_body={"return_token_ids": True})
    events = [e.model_dump() for e in stream]
    assert [t for e in events for t in e["choices"][0].get("token_ids") or []] == \
        want.token_ids
    assert events[0]["choices"][0]["prompt_token_ids"] == prompt
    messages = [{"role": "user", "content": "hi"}]
    chat_want = server.llm.generate(messages=messages, max_new_tokens=6)
    res = client.chat.completions.create(model="tiny", messages=messages, max_tokens=6,
                                         temperature=0,
                                         extra_body={"return_token_ids": True}).model_dump()
    assert res["choices"][0]["token_ids"] == chat_want.token_ids
    assert res["prompt_token_ids"] == server.llm.encode(messages=messages)
    stream = client.chat.completions.create(model="tiny", messages=messages, max_tokens=6,
                                            temperature=0, stream=True,
                                            extra_body={"return_token_ids": True})
    events = [e.model_dump() for e in stream]
    assert events[0]["prompt_token_ids"] == server.llm.encode(messages=messages)
    assert [t for e in events for c in e["choices"] for t in c.get("token_ids") or []] == \
        chat_want.token_ids


def test_a_body_that_is_not_json_says_how_to_send_one(server):
    error = _error(server.raw("POST", "/v1/completions", b'{"model": "tiny", "prompt": "\xff"}'))
    assert "Content-Type: application/json" in error["message"], error
    error = _error(server.raw("POST", "/v1/completions", "model=tiny&prompt=hi",
                              content_type="application/x-www-form-urlencoded"))
    assert "application/x-www-form-urlencoded" in error["message"], error
    assert "Content-Type: application/json" in error["message"], error


def test_a_field_of_several_shapes_says_what_it_takes_not_what_pydantic_tried(server):
    """A batch of prompts, the CLI's "none" as the speculative config, a stop number: one
    sentence naming the field and the shapes it takes (no "prompt.list[int].0" in it)."""
    for body, field, needle in [
            ({"prompt": ["a", "b"]}, "prompt", "one prompt per request"),
            ({"prompt": "hi", "speculative": "none"}, "speculative", "false (plain decoding)"),
            ({"prompt": "hi", "stop": 3}, "stop", "a string or a list of strings")]:
        error = _error(server.raw("POST", "/v1/completions", {"model": "tiny", **body}))
        assert error["param"] == field and error["message"].startswith(f"{field} must be "), \
            error
        assert needle in error["message"] and "[" not in error["message"].split(" must ")[0]
        assert error["message"].count(" must be ") == 1, error
    error = _error(server.raw("POST", "/v1/completions", {"model": "tiny", "max_tokens": 4}))
    assert error["param"] == "prompt" and error["message"] == "prompt: Field required", error


def test_a_body_that_is_not_json_says_where_and_names_no_field(server):
    error = _error(server.raw("POST", "/v1/chat/completions", b"{bad json"))
    assert error["param"] is None, error
    assert error["message"].startswith("the request body is not valid JSON at character 1:"), \
        error


def test_an_unknown_path_is_a_404_whose_code_is_a_string_or_null(server):
    for method, path in (("GET", "/v2/nothing"), ("GET", "/v1/completions")):
        status, _, body = server.raw(method, path)
        assert status in (404, 405), body
        code = json.loads(body)["error"]["code"]
        assert code is None or isinstance(code, str), body


def test_every_refused_request_is_counted_by_status(server):
    key = 'specrt:request_failure_total{model_name="tiny",status="400"}'
    before = server.metrics().get(key, 0)
    for body in (b'{"model": ', {"model": "tiny", "prompt": "hi", "max_tokens": "x"},
                 {"model": "tiny", "prompt": "hi", "max_tokens": 0}):
        assert server.raw("POST", "/v1/completions", body)[0] == 400
    assert server.metrics().get(key, 0) - before == 3


def test_a_long_tokenization_does_not_stall_other_clients(server, monkeypatch):
    """A prompt of megabytes takes seconds to tokenize; the event loop serves others meanwhile."""
    tok = server.llm.tokenizer
    real_encode = tok.encode
    entered, release = threading.Event(), threading.Event()

    def slow_encode(text, chat=False):
        if text == "SLOW":
            entered.set()
            release.wait(10)       # stands in for a long tokenization (the GIL is free)
        return real_encode(text, chat)

    monkeypatch.setattr(tok, "encode", slow_encode)
    out = {}
    worker = threading.Thread(target=lambda: out.update(r=server.raw("POST", "/v1/completions", {
        "model": "tiny", "prompt": "SLOW", "max_tokens": 2})))
    worker.start()
    try:
        assert entered.wait(10), "the slow request never reached the tokenizer"
        start = time.monotonic()
        status, _, _ = server.raw("GET", "/health")
        took = time.monotonic() - start
    finally:
        release.set()
        worker.join(TIMEOUT)
    assert status == 200 and took < 2.0, took       # the event loop was free (it took ~0.01 s)
    assert out["r"][0] == 200, out


def test_an_internal_error_fails_that_request_alone(server, client, monkeypatch):
    tok = server.llm.tokenizer
    real_encode = tok.encode

    def encode(text, chat=False):
        if text == "EXPLODE":
            raise RuntimeError("injected fault")
        return real_encode(text, chat)

    monkeypatch.setattr(tok, "encode", encode)
    real_reserve = server.llm.engine.reserve
    poison = tuple(server.llm.encode("def add(a, b):"))

    def reserve(request, *a, **kw):      # an engine-side fault, on the scheduler's thread
        if request.prompt == poison:
            raise RuntimeError("injected engine fault")
        return real_reserve(request, *a, **kw)

    monkeypatch.setattr(server.llm.engine, "reserve", reserve)
    expected = complete(client, "The quick brown fox").choices[0].text

    async def mixed():
        aclient = server.aclient()
        return await asyncio.gather(
            aclient.completions.create(model="tiny", prompt="EXPLODE", max_tokens=8),
            aclient.completions.create(model="tiny", prompt="def add(a, b):", max_tokens=8),
            stream_text(aclient, "The quick brown fox"), return_exceptions=True)

    bad_text, bad_engine, good = asyncio.run(asyncio.wait_for(mixed(), 30))
    assert isinstance(bad_text, openai.InternalServerError) and "injected" in str(bad_text)
    assert isinstance(bad_engine, openai.InternalServerError)
    assert good == (expected, "length")
    monkeypatch.undo()
    assert complete(client, "def add(a, b):").usage.completion_tokens == 24


def test_a_full_queue_is_a_503_with_retry_after(tiny_noeos_dir):
    llm = specrt.LLM(tiny_noeos_dir, max_seq_len=1024, max_batch_size=1, max_queue=1,
                     dtype="float32")
    with Server(llm, spec=None) as s:
        async def flood():
            aclient = s.aclient()
            return await asyncio.gather(*(
                aclient.completions.with_raw_response.create(
                    model="tiny", prompt=f"Once upon a time {i}", max_tokens=600, temperature=0)
                for i in range(6)), return_exceptions=True)

        got = asyncio.run(asyncio.wait_for(flood(), 60))
        refused = [r for r in got if isinstance(r, openai.APIStatusError)]
        served = [r for r in got if not isinstance(r, BaseException)]
        assert refused and served, got
        for r in refused:
            assert r.status_code == 503 and r.response.headers["retry-after"] == "1"
            assert r.body["type"] == "service_unavailable"
        s.wait_idle()
        res = s.client().completions.create(model="tiny", prompt="hi", max_tokens=4)
        assert res.usage.completion_tokens == 4


# --- metrics ------------------------------------------------------------------------------------
def test_speculative_metrics_add_up(server, client):
    m0 = server.metrics()
    for p in PROMPTS[:3]:
        complete(client, p, max_tokens=40)
    server.wait_idle()
    m1 = server.metrics()

    def delta(name):
        return m1.get(name, 0) - m0.get(name, 0)

    drafted = delta('vllm:spec_decode_num_draft_tokens_total{model_name="tiny"}')
    accepted = delta('vllm:spec_decode_num_accepted_tokens_total{model_name="tiny"}')
    drafts = delta('vllm:spec_decode_num_drafts_total{model_name="tiny"}')
    per_pos = {k: delta(k) for k in m1
               if k.startswith("vllm:spec_decode_num_accepted_tokens_per_pos_total")}
    # each round drafts 3 guesses, but the last rounds of a request, with 3 or fewer tokens
    # left (DraftContext.room: at most 2 rounds, each at least 1 short): 3 requests
    assert drafts > 0 and 0 < accepted <= drafted and 3 * drafts - 3 * 4 <= drafted <= 3 * drafts
    assert sum(per_pos.values()) == accepted
    positions = sorted(int(re.search(r'position="(\d+)"', k).group(1)) for k in per_pos)
    assert positions == [0, 1, 2] and all(v > 0 for v in per_pos.values()), per_pos
    assert delta('vllm:generation_tokens_total{model_name="tiny"}') == 120
    assert delta('vllm:request_success_total{finished_reason="length",model_name="tiny"}') == 3
    assert delta('vllm:e2e_request_latency_seconds_count{model_name="tiny"}') == 3
    assert delta('vllm:time_to_first_token_seconds_count{model_name="tiny"}') == 3
    assert delta('vllm:inter_token_latency_seconds_count{model_name="tiny"}') > 0
    assert m1['vllm:num_requests_running{model_name="tiny"}'] == 0
    assert m1['vllm:num_requests_waiting{model_name="tiny"}'] == 0


def test_a_requests_phases_and_sizes_add_up(server, client):
    """queue + prefill + decode is the request's whole time (arrival to its last token, the
    e2e latency), inference is prefill + decode, and the token histograms hold each request's
    prompt, output and max_tokens."""
    m0 = server.metrics()
    prompts = PROMPTS[3:6]
    for p, budget in zip(prompts, (8, 16, 24)):
        complete(client, p, max_tokens=budget)
    server.wait_idle()
    m1 = server.metrics()

    def delta(name):
        key = f'vllm:{name}{{model_name="tiny"}}'
        return m1[key] - m0[key]

    phases = ("queue", "prefill", "decode", "inference")
    for name in phases:
        assert delta(f"request_{name}_time_seconds_count") == 3, name
        assert delta(f"request_{name}_time_seconds_sum") >= 0, name
    queue, prefill, decode, inference = (delta(f"request_{n}_time_seconds_sum") for n in phases)
    assert prefill > 0 and decode > 0
    assert inference == pytest.approx(prefill + decode, rel=1e-9, abs=1e-9)
    assert delta("e2e_request_latency_seconds_sum") == pytest.approx(queue + inference,
                                                                       rel=1e-9, abs=1e-9)
    assert delta("request_prompt_tokens_sum") == delta("prompt_tokens_total") > 0
    assert delta("request_generation_tokens_sum") == delta("generation_tokens_total") == 48
    assert delta("request_params_max_tokens_sum") == 48
    def bucket(le):
        key = f'vllm:request_params_max_tokens_bucket{{le="{le}",model_name="tiny"}}'
        return m1[key] - m0[key]
    assert (bucket("5.0"), bucket("10.0"), bucket("20.0"), bucket("50.0")) == (0, 1, 2, 3)


def test_queue_time_and_kv_cache_usage_follow_the_slot(tiny_noeos_dir):
    """A request queued behind the only slot's holder for 0.3 s has a queue time of at least
    that; while the holder runs the KV-cache gauge is its tokens over the cache's positions,
    and 0 when nothing runs."""
    llm = specrt.LLM(tiny_noeos_dir, max_seq_len=2048, max_batch_size=1, dtype="float32")
    with Server(llm, spec=None) as s:
        holder = llm.submit(list(range(1, 9)), max_new_tokens=1900)     # the only slot
        holder.handle.next_step(TIMEOUT)
        usage = s.metrics()['vllm:kv_cache_usage_perc{model_name="tiny"}']
        assert 9 / 2048 <= usage <= (8 + 1900) / 2048
        out = {}
        thread = threading.Thread(target=lambda: out.setdefault("r", s.raw(
            "POST", "/v1/completions", {"model": "tiny", "prompt": "hello", "max_tokens": 4,
                                        "temperature": 0})))
        thread.start()
        deadline = time.monotonic() + TIMEOUT
        while not llm.scheduler.pending:
            assert time.monotonic() < deadline, "the request was never queued"
            time.sleep(0.002)
        time.sleep(0.3)
        holder.handle.cancel()
        thread.join(TIMEOUT)
        s.wait_idle()
        m = s.metrics()
    assert out["r"][0] == 200
    label = '{model_name="tiny"}'
    assert m[f"vllm:request_queue_time_seconds_count{label}"] == 1
    assert m[f"vllm:request_queue_time_seconds_sum{label}"] >= 0.3
    assert m[f"vllm:kv_cache_usage_perc{label}"] == 0


# --- the library's streams, from threads (no HTTP) ------------------------------------------------
@pytest.fixture(scope="module")
def llm(tiny_noeos_dir, tiny_draft_dir):
    llm = specrt.LLM(tiny_noeos_dir, draft=tiny_draft_dir, max_seq_len=256, max_batch_size=2,
                     dtype="float32")
    yield llm
    llm.close()


def test_one_stream_stepped_from_two_threads(llm):
    solo = llm.generate("The quick brown fox", max_new_tokens=40, speculative=SPEC).token_ids
    it = llm.stream("The quick brown fox", max_new_tokens=40, speculative=SPEC)
    got, turn, done = [], [threading.Event(), threading.Event()], threading.Event()

    def step(me: int):
        while not done.is_set():
            if not turn[me].wait(TIMEOUT):
                return
            turn[me].clear()
            chunk = next(it, None)
            if chunk is None:
                done.set()
            else:
                got.append((me, chunk.token_ids))
            turn[1 - me].set()

    threads = [threading.Thread(target=step, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    turn[0].set()
    for t in threads:
        t.join(TIMEOUT)
    assert done.is_set()
    assert [t for _, ids in got for t in ids] == solo
    assert {me for me, _ in got} == {0, 1}


def test_two_streams_interleaved_on_one_thread(llm):
    kw = dict(max_new_tokens=30, speculative=SPEC)
    solo = [llm.generate(p, **kw).token_ids for p in PROMPTS[:2]]
    its = [llm.stream(p, **kw) for p in PROMPTS[:2]]
    got = [[], []]
    live = [True, True]
    while any(live):
        for i, it in enumerate(its):
            if live[i]:
                chunk = next(it, None)
                if chunk is None:
                    live[i] = False
                else:
                    got[i] += chunk.token_ids
    assert got == solo


def test_async_generate_takes_a_batch_and_checks_its_arguments_as_llm_does(llm):
    from specrt.errors import ArgumentError, SpecrtError

    allm = specrt.AsyncLLM(llm=llm)
    kw = dict(max_new_tokens=20, speculative=SPEC)
    solo = [llm.generate(p, **kw).token_ids for p in PROMPTS[:3]]

    async def batch():
        return await asyncio.wait_for(allm.generate(PROMPTS[:3], **kw), TIMEOUT)

    assert [r.token_ids for r in asyncio.run(batch())] == solo

    async def misspelled():
        return await allm.generate(PROMPTS[0], max_new_token=3)

    with pytest.raises(ArgumentError, match="did you mean 'max_new_tokens'"):
        asyncio.run(misspelled())

    async def stream_a_batch():
        return [c async for c in allm.stream(PROMPTS[:2], max_new_tokens=3)]

    with pytest.raises(SpecrtError, match="stream takes one prompt"):
        asyncio.run(stream_a_batch())
    assert llm.generate(PROMPTS[0], **kw).token_ids == solo[0]       # the engine lives on


def test_finish_reasons_map_to_openais():
    from specrt.serve.schemas import FINISH_REASONS

    assert (FINISH_REASONS["eos"], FINISH_REASONS["stop"], FINISH_REASONS["length"]) == \
        ("stop", "stop", "length")


def test_server_speculative_flag_none_means_plain_as_the_generate_cli():
    from specrt.api.cli import default_speculative
    from specrt.errors import ArgumentError
    from specrt.serve.cli import speculative_from_flag

    for word in ("none", " OFF ", "null"):
        assert speculative_from_flag(word, has_draft=True) is None
    assert speculative_from_flag(None, has_draft=True) == default_speculative(True)
    spec = '{"method": "ngram", "num_speculative_tokens": 3}'
    assert speculative_from_flag(spec, has_draft=False) == {"method": "ngram",
                                                             "num_speculative_tokens": 3}
    with pytest.raises(ArgumentError):
        speculative_from_flag("nope", has_draft=True)


def test_an_empty_speculative_object_is_a_config_not_plain_decoding(server, client):
    """{} is a speculative config with every key at its default (draft_model, K = 4), as
    SpecConfig.parse reads it; only false asks for plain decoding."""
    key = 'vllm:spec_decode_num_drafts_total{model_name="tiny"}'
    for body, drafts in (({}, True), (False, False)):
        before = server.metrics().get(key, 0)
        complete(client, PROMPTS[0], max_tokens=12, extra_body={"speculative": body})
        server.wait_idle()
        assert (server.metrics().get(key, 0) > before) == drafts, body


@pytest.mark.parametrize("port", ["70000", "-1"])
def test_a_port_out_of_range_is_bad_input_before_anything_loads(port, capsys):
    from specrt.serve.cli import main

    assert main(["--model", "/nonexistent", "--port", port]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--port" in err[0] and "65535" in err[0], err


@pytest.mark.parametrize("flags,needle", [
    (["--max-num-seqs", "0"], "--max-num-seqs"), (["--max-model-len", "1"], "--max-model-len"),
    (["--max-queue", "0"], "max_queue"), (["--draft-stop", "5"], "draft_stop"),
    (["--device", "tpu"], "device"), (["--speculative-config", '{"method": "magic"}'], "magic")])
def test_bad_flags_are_refused_before_the_default_pair_is_fetched(flags, needle, capsys,
                                                                 monkeypatch, tmp_path):
    """With no --model the server would fetch the default pair (~6 GB) first."""
    from specrt.serve.cli import main

    monkeypatch.setenv("SPECRT_CACHE", str(tmp_path / "cache"))
    assert main(flags) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("*.safetensors"))


@pytest.mark.parametrize("flags,k,warned", [
    ([], 16, True),
    (["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 8}'], 8, True),
    (["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 8}'], 9, False),
    (["--speculative-config", "none"], 2, False)])
def test_a_model_length_too_short_for_the_servers_config_is_warned_of_on_the_flags(
        flags, k, warned, caplog):
    """Requests under the server's config need prompt + max_tokens + K + 1 positions; below
    K + 3 every one of them will be refused, though requests sending "speculative": false or
    a smaller K are served: a warning at start, not a refusal."""
    from specrt.serve.cli import build_parser, check_flags

    args = build_parser().parse_args(["--max-model-len", str(k + 2), *flags])
    with caplog.at_level("WARNING", logger="specrt.serve"):
        check_flags(args)
    said = [r.getMessage() for r in caplog.records if r.name == "specrt.serve"]
    assert bool(said) == warned, said
    if warned:
        assert f"--max-model-len {k + 2} is too short" in said[0] and f"K={k}" in said[0]


def test_a_failure_mid_stream_is_counted_once_as_a_failure(server, monkeypatch):
    """A request whose round fails after its first chunk ends with an error event, counted as
    a failed request (500) and not also as an abort."""
    from specrt.engine import engine as engine_module

    poison = tuple(server.llm.encode("def poisoned(x):"))
    real_round = engine_module.run_round

    def run_round(target, cache, planner, ctx, *args, **kwargs):
        if any(tuple(h[:len(poison)]) == poison for h in ctx.histories):
            raise RuntimeError("injected mid-stream fault")
        return real_round(target, cache, planner, ctx, *args, **kwargs)

    server.wait_idle()
    monkeypatch.setattr(engine_module, "run_round", run_round)
    m0 = server.metrics()
    status, _, body = server.raw("POST", "/v1/completions", {
        "model": "tiny", "prompt": list(poison), "max_tokens": 8, "stream": True})
    server.wait_idle()
    m1 = server.metrics()
    monkeypatch.undo()
    events = body.decode()
    assert status == 200 and "injected mid-stream fault" in events and "data: [DONE]" in events

    def delta(part):
        return sum(v - m0.get(k, 0) for k, v in m1.items() if part in k and "_created" not in k)

    assert delta('request_failure_total{model_name="tiny",status="500"}') == 1
    assert delta('finished_reason="abort"') == 0
    assert m1['vllm:num_requests_running{model_name="tiny"}'] == 0


def asgi_scope(server: Server, spec_version: str = "2.3") -> dict:
    """An HTTP scope for POST /v1/completions, to drive the app without a socket."""
    return {"type": "http", "asgi": {"version": "3.0", "spec_version": spec_version},
            "http_version": "1.1", "method": "POST", "scheme": "http",
            "path": "/v1/completions", "raw_path": b"/v1/completions", "query_string": b"",
            "root_path": "", "headers": [(b"content-type", b"application/json")],
            "client": ("127.0.0.1", 1), "server": ("127.0.0.1", server.port)}


@pytest.mark.parametrize("spec_version", ["2.3", "2.4"])
def test_a_stream_whose_body_never_starts_is_settled(server, spec_version):
    """A client gone after the handler answered, before the response head went out: the body
    (which closes the generation when it ends) never starts, yet the request is cancelled and
    counted as an abort, and its slot is freed (the running gauge back to 0). Driven through
    the ASGI app itself, the only way to lose the client at exactly that point: under ASGI spec
    2.3 (what uvicorn's HTTP speaks) Starlette learns it from `receive`, under 2.4 from `send`
    failing."""
    server.wait_idle()
    body = json.dumps({"model": "tiny", "prompt": PROMPTS[0], "max_tokens": 1500,
                       "temperature": 0, "stream": True}).encode()
    scope = asgi_scope(server, spec_version)

    async def drive() -> list[str]:
        sent, answered, messages = [], asyncio.Event(), [
            {"type": "http.request", "body": body, "more_body": False}]

        async def receive():
            if messages:
                return messages.pop()
            await answered.wait()          # the client goes once the handler has answered
            return {"type": "http.disconnect"}

        async def send(message):
            sent.append(message["type"])
            if message["type"] == "http.response.start":
                answered.set()
                if spec_version == "2.4":
                    raise OSError("the client is gone")
                await asyncio.Event().wait()     # the head never goes out

        await server.app(scope, receive, send)
        return sent

    key = 'vllm:request_success_total{finished_reason="abort",model_name="tiny"}'
    aborts = server.metrics().get(key, 0)
    sent = asyncio.run(asyncio.wait_for(drive(), TIMEOUT))
    assert sent == ["http.response.start"]           # no body byte was sent
    assert server.metrics()[key] == aborts + 1
    server.wait_idle()                    # cancelled: long before its 1500 tokens
    assert server.metrics()['vllm:num_requests_running{model_name="tiny"}'] == 0


def test_a_handler_cancelled_while_its_request_is_queued_settles_it(tiny_noeos_dir):
    """The handler's task cancelled while it waits for the first chunk (as a server shutting
    down cancels it): the request leaves the queue, never holds a slot (the running gauge
    counts the one slot's holder, a library caller's request, throughout), never reads its
    prompt, and counts as an abort."""
    llm = specrt.LLM(tiny_noeos_dir, max_seq_len=2048, max_batch_size=1, dtype="float32")
    with Server(llm, spec=None) as s:
        holder = llm.submit(list(range(1, 9)), max_new_tokens=1900)     # the only slot
        holder.handle.next_step(TIMEOUT)
        m0 = s.metrics()
        body = json.dumps({"model": "tiny", "prompt": PROMPTS[0], "max_tokens": 8,
                           "temperature": 0}).encode()

        async def drive():
            messages = [{"type": "http.request", "body": body, "more_body": False}]

            async def receive():
                if messages:
                    return messages.pop()
                await asyncio.Event().wait()        # the client never leaves

            async def send(message):
                raise AssertionError(f"a cancelled handler sent {message['type']}")

            task = asyncio.ensure_future(s.app(asgi_scope(s), receive, send))
            deadline = time.monotonic() + 10
            while not llm.scheduler.pending:
                assert time.monotonic() < deadline, "the request was never queued"
                await asyncio.sleep(0.002)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        asyncio.run(asyncio.wait_for(drive(), TIMEOUT))
        deadline = time.monotonic() + 10
        while llm.scheduler.pending:
            assert time.monotonic() < deadline, "the request stayed queued"
            time.sleep(0.002)
        assert llm.engine.slots[0] is not None          # the holder still runs
        m1 = s.metrics()
        holder.handle.cancel()
        s.wait_idle()

    key = 'vllm:request_success_total{finished_reason="abort",model_name="tiny"}'
    assert m1[key] - m0.get(key, 0) == 1
    running = 'vllm:num_requests_running{model_name="tiny"}'
    assert m0[running] == m1[running] == 1    # the holder's slot (a library caller's request)
    prompt = 'vllm:prompt_tokens_total{model_name="tiny"}'
    assert m1.get(prompt, 0) == m0.get(prompt, 0)                        # never prefilled


def test_the_waiting_gauge_counts_every_engines_queue(tiny_noeos_dir, tiny_draft_dir):
    """Requests queued on the engine of a draft "model" a library caller named (beside the
    server's, in one process) are in vllm:num_requests_waiting, not only the default's."""
    llm = specrt.LLM(tiny_noeos_dir, max_seq_len=1024, max_batch_size=1, dtype="float32")
    spec = {"method": "draft_model", "model": str(tiny_draft_dir), "num_speculative_tokens": 3}
    key = 'vllm:num_requests_waiting{model_name="tiny"}'
    with Server(llm, spec=None) as s:
        runs = [llm.submit(list(range(1, 9)), max_new_tokens=1000, speculative=spec)
                for _ in range(3)]
        try:
            waiting = s.metrics()[key]          # one slot: at most one of the three runs
            assert llm.scheduler.pending == 0 and waiting >= 2
        finally:
            for run in runs:
                run.handle.cancel()
        deadline = time.monotonic() + TIMEOUT
        while llm.pending:
            assert time.monotonic() < deadline, "the cancelled requests stayed queued"
            time.sleep(0.01)
        assert s.metrics()[key] == 0


def test_an_await_cancelled_on_a_loop_that_then_closes_leaves_no_waiter():
    """A timed-out `anext_step` on an event loop that ends (asyncio.run returns) must not
    leave a waiter for the scheduler's thread to wake on the closed loop (RuntimeError on the
    thread that serves every request)."""
    from specrt.engine.handle import RequestHandle
    from specrt.engine.request import Request, Step

    handle = RequestHandle(Request((1, 2), 4), cancel=lambda _id: None)

    async def wait_briefly():
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(handle.anext_step(), 0.01)

    asyncio.run(wait_briefly())
    assert handle._waiters == []
    handle.put(Step(handle.request_id, 0, [7], "prefill", [], 0))    # does not raise
    assert handle.next_step(1).new_tokens == [7]


def test_a_step_that_cannot_be_delivered_fails_no_other_request(llm, monkeypatch):
    """A request whose steps cannot be delivered (its caller's loop is gone) ends alone: the
    request sharing its batch when delivery fails gets its solo tokens."""
    from specrt.engine.handle import RequestHandle

    kw = dict(max_new_tokens=30, speculative=SPEC)
    solo = llm.generate(PROMPTS[0], **kw).token_ids
    put = RequestHandle.put
    engine, failed = llm.engine, []

    def put_or_fail(self, step):     # fails only while the other request shares the batch
        if self.request.prompt == (1, 2, 3) and sum(r is not None for r in engine.slots) == 2:
            failed.append(step.index)
            raise RuntimeError("a caller's loop is gone")
        put(self, step)

    monkeypatch.setattr(RequestHandle, "put", put_or_fail)
    doomed = llm.submit([1, 2, 3], max_new_tokens=200)
    got = run_bounded(lambda: llm.generate(PROMPTS[0], **kw).token_ids, TIMEOUT)
    doomed.handle.cancel()
    assert failed, "the undeliverable request never shared a batch"
    assert got == ("ok", solo)
    monkeypatch.setattr(RequestHandle, "put", put)
    assert run_bounded(lambda: llm.generate(PROMPTS[0], **kw).token_ids, TIMEOUT) == ("ok", solo)


def test_a_busy_port_or_a_bad_host_is_bad_input_before_anything_loads(capsys):
    """The socket is bound before the model is resolved (here it does not exist): a port in
    use or a host that is not this machine's is one line naming the flag, exit 2."""
    from specrt.serve.cli import main

    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        assert main(["--model", "/nonexistent", "--port", str(port)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"--port {port}" in err[0] and "in use" in err[0], err
    # TEST-NET-1: no machine's own; not a name; empty, which bind reads as every interface
    # (it listened on 0.0.0.0 and logged "http://:PORT/v1")
    for host in ("192.0.2.1", "a..b", "", " "):
        assert main(["--model", "/nonexistent", "--host", host, "--port", "0"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"--host {host!r}" in err[0], err


def test_the_early_socket_refuses_clients_until_the_server_starts_and_is_dual_stack():
    """Bound but not listening while the models load (a client, or a TCP readiness probe, is
    refused at once instead of hanging through the load); `--host ::` takes IPv4 too, as
    uvicorn's own socket did."""
    from specrt.serve.cli import bind

    sock = bind("127.0.0.1", 0)
    try:
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(sock.getsockname(), timeout=5)
    finally:
        sock.close()
    try:
        sock6 = bind("::", 0)
    except specrt.SpecrtError:
        pytest.skip("no IPv6 on this machine")
    try:
        assert sock6.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY) == 0
    finally:
        sock6.close()


def test_without_the_serve_extra_help_works_and_serving_says_what_to_install(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    (tmp_path / "fastapi").mkdir()
    (tmp_path / "fastapi" / "__init__.py").write_text("raise ImportError('not installed')\n")
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{root}")

    def serve(*args):
        return subprocess.run([sys.executable, "-m", "specrt.serve", *args], cwd=root, env=env,
                              capture_output=True, text=True, timeout=60)

    helped = serve("--help")
    assert helped.returncode == 0 and "--max-num-seqs" in helped.stdout, helped.stderr
    proc = serve("--model", "/nonexistent", "--port", "0")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip() == ("error: the HTTP server needs the serve extra: pip install "
                                   "'specrt[serve]' (missing fastapi)")


def test_a_draft_model_config_without_a_draft_is_refused_on_the_flags():
    """The server would start and answer every request with a 400."""
    from specrt.errors import ArgumentError
    from specrt.serve.cli import build_parser, check_flags

    for spec in ("{}", '{"method": "draft_model"}'):
        args = build_parser().parse_args(["--model", "/nonexistent",
                                          "--speculative-config", spec])
        with pytest.raises(ArgumentError, match="--draft"):
            check_flags(args)
    for ok in (["--draft", "/nonexistent"], []):       # with a draft; the default pair has one
        argv = ["--speculative-config", "{}"] + (["--model", "/x"] + ok if ok else [])
        check_flags(build_parser().parse_args(argv))


def test_the_max_queue_error_names_its_flag(capsys):
    from specrt.serve.cli import main

    assert main(["--model", "/nonexistent", "--max-queue", "0"]) == 2
    assert capsys.readouterr().err.startswith("error: --max-queue: ")


def test_every_series_is_exported_from_the_start_and_no_created_ones(tiny_noeos_dir):
    """A counter that appears only at its first event is invisible to increase()/rate() for
    that event: every series is there at 0 before any request; no `_created` gauges."""
    llm = specrt.LLM(tiny_noeos_dir, max_seq_len=256, max_batch_size=1, dtype="float32")
    with Server(llm, spec=None) as s:
        m = s.metrics()
    label = 'model_name="tiny"'
    for reason in ("stop", "length", "abort"):
        assert m[f'vllm:request_success_total{{finished_reason="{reason}",{label}}}'] == 0
    for name in ("generation_tokens_total", "prompt_tokens_total", "spec_decode_num_drafts_total",
                 "spec_decode_num_draft_tokens_total", "spec_decode_num_accepted_tokens_total",
                 "time_to_first_token_seconds_count", "e2e_request_latency_seconds_count",
                 "inter_token_latency_seconds_count", "num_requests_running",
                 "request_queue_time_seconds_count", "request_prefill_time_seconds_count",
                 "request_decode_time_seconds_count", "request_inference_time_seconds_count",
                 "request_prompt_tokens_count", "request_generation_tokens_count",
                 "request_params_max_tokens_count", "kv_cache_usage_perc"):
        assert m[f"vllm:{name}{{{label}}}"] == 0, name
    assert not [k for k in m if "_created" in k]


def test_a_queued_request_cancelled_at_shutdown_reads_no_prompt_and_gets_no_first_token(
        tiny_noeos_dir):
    """The LLM closing (the server's shutdown) cancels a queued request with a round that
    committed nothing: an abort, but no time to first token and no prompt tokens (it never
    held a slot)."""
    llm = specrt.LLM(tiny_noeos_dir, max_seq_len=2048, max_batch_size=1, dtype="float32")
    with Server(llm, spec=None) as s:
        holder = llm.submit(list(range(1, 9)), max_new_tokens=1900)     # the only slot
        holder.handle.next_step(TIMEOUT)
        m0 = s.metrics()
        out = {}
        thread = threading.Thread(target=lambda: out.setdefault("r", s.raw(
            "POST", "/v1/completions", {"model": "tiny", "prompt": list(range(1, 51)),
                                        "max_tokens": 8, "temperature": 0})))
        thread.start()
        deadline = time.monotonic() + TIMEOUT
        while not llm.scheduler.pending:
            assert time.monotonic() < deadline, "the request was never queued"
            time.sleep(0.002)
        llm.close()
        thread.join(TIMEOUT)
        m1 = s.metrics()
    status, _, body = out["r"]
    assert status == 200 and json.loads(body)["choices"][0]["finish_reason"] == "abort"
    label = 'model_name="tiny"'
    assert m1[f'vllm:request_success_total{{finished_reason="abort",{label}}}'] == 1
    for name in ("time_to_first_token_seconds_count", "prompt_tokens_total"):
        assert m1[f"vllm:{name}{{{label}}}"] == m0[f"vllm:{name}{{{label}}}"], name


def test_each_drafted_position_has_its_acceptance_series_from_its_first_round():
    """A round drafting 3 and accepting 2 creates position 2's series at 0, so the first
    acceptance there is an increase() a dashboard sees."""
    from specrt.engine.request import Step
    from specrt.serve.metrics import ServerMetrics

    m = ServerMetrics("tiny", lambda: 0, lambda: 0, lambda: 0.0, 2048)
    m.round(Step("r", 1, [1, 2, 3], "draft_model:3", [1, 2, 9], 2), 3)
    text = m.exposition().decode()
    per_pos = dict(re.findall(r'accepted_tokens_per_pos_total\{model_name="tiny",'
                              r'position="(\d)"\} (\S+)', text))
    assert per_pos == {"0": "1.0", "1": "1.0", "2": "0.0"}


def test_rounds_run_past_a_stop_string_are_counted_in_the_speculative_counters(llm):
    """The engine runs ahead of a reader; a stop string seen late cancels a request whose
    later rounds already drafted and verified. Those rounds are work the engine did: the
    server's speculative counters match the engine's own count of the request (its stats),
    while only the ids up to the stop reach the client."""
    from specrt.serve.generation import Generation
    from specrt.serve.metrics import ServerMetrics

    prompt = llm.encode("for i in range(10):")
    budget = 40
    whole = llm.generate(prompt, max_new_tokens=budget, speculative=SPEC)
    stop = llm.tokenizer.decode(whole.token_ids[20:22])
    metrics = ServerMetrics("tiny", lambda: 0, lambda: 0, lambda: 0.0, 2048)

    async def run():
        gen = Generation(specrt.AsyncLLM(llm=llm), metrics, prompt,
                         dict(max_new_tokens=budget, stop=[stop], speculative=SPEC),
                         time.perf_counter())
        chunk = await gen.start()
        deadline = time.monotonic() + TIMEOUT
        while llm.running:                  # the engine finishes the whole budget unread
            assert time.monotonic() < deadline, "the request did not finish"
            await asyncio.sleep(0.005)
        while chunk.finish_reason is None:
            chunk = await gen.next()
        await gen.close()
        return chunk

    last = asyncio.run(run())
    assert last.finish_reason == "stop" and last.stats["new_tokens"] < budget
    assert last.tail, "the engine ran no round past the stop string"
    text = metrics.exposition().decode()

    def value(name):
        return float(re.search(rf'^vllm:{name}_total\{{model_name="tiny"\}} (\S+)$', text,
                               re.M).group(1))
    assert value("spec_decode_num_draft_tokens") == last.stats["num_draft_tokens"]
    assert value("spec_decode_num_accepted_tokens") == last.stats["num_accepted_tokens"]
    assert value("spec_decode_num_drafts") == last.stats["num_drafts"]
    assert value("generation_tokens") == last.stats["new_tokens"]


def test_a_body_or_prompt_too_long_to_fit_is_refused_before_it_is_read_or_tokenized(server):
    """A prompt with more characters than max_seq_len tokens can hold is a 400 without
    tokenizing it, naming the field and the server's flag, and a body past what such a prompt
    needs a 413 before the app reads it (megabytes of prompt took tens of seconds to
    tokenize, only to be refused); the server goes on serving."""
    most = server.llm.tokenizer.max_chars(server.llm.max_seq_len)
    status, _, body = server.raw("POST", "/v1/completions",
                                 {"model": "tiny", "prompt": "a" * (most + 1), "max_tokens": 1})
    error = json.loads(body)["error"]
    assert status == 400 and f"the prompt is {most + 1:,} characters" in error["message"]
    assert error["param"] == "prompt" and "raise the server's --max-model-len" in \
        error["message"] and "max_seq_len" not in error["message"], error
    error = _error(server.raw("POST", "/v1/chat/completions", {"model": "tiny", "messages": [
        {"role": "user", "content": "a" * (most + 1)}]}))
    assert error["param"] == "messages" and error["message"].startswith(
        f"the messages' content is {most + 1:,} characters"), error
    m0 = server.metrics()
    huge = json.dumps({"model": "tiny", "prompt": "hi", "user": "x" * (13 * most + (1 << 20))})
    status, _, body = server.raw("POST", "/v1/completions", huge)
    error = json.loads(body)["error"]
    assert status == 413 and error["code"] == "request_too_large", body[:200]
    assert server.metrics()['specrt:request_failure_total{model_name="tiny",status="413"}'] \
        == m0.get('specrt:request_failure_total{model_name="tiny",status="413"}', 0) + 1
    chunks = (huge[i:i + (1 << 20)].encode() for i in range(0, len(huge), 1 << 20))
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=TIMEOUT)
    try:                                    # no Content-Length: counted as it streams in
        conn.request("POST", "/v1/completions", body=chunks, encode_chunked=True,
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 413 and json.loads(resp.read())["error"]["code"] == \
            "request_too_large"
    finally:
        conn.close()
    res = server.client().completions.create(model="tiny", prompt="hi", max_tokens=3)
    assert res.usage.completion_tokens == 3


def test_head_is_answered_wherever_get_is(server):
    """Health checkers send HEAD: /health, /v1/models and /metrics answer it as GET, with no
    body (it was a 405)."""
    for path in ("/health", "/v1/models", "/metrics"):
        get_status, _, _ = server.raw("GET", path)
        status, _, body = server.raw("HEAD", path)
        assert status == get_status == 200 and body == b"", (path, status)
    ids = [op.get("operationId") for item in server.app.openapi()["paths"].values()
           for op in item.values()]
    assert len(ids) == len(set(ids)), ids            # the schema's operation ids stay unique


@pytest.mark.parametrize("field, raw", [("temperature", "NaN"), ("temperature", "true"),
                                        ("temperature", "-1"), ("top_p", "NaN"),
                                        ("top_p", "false"), ("top_p", "0")])
def test_a_bad_temperature_or_top_p_says_what_the_field_takes(server, field, raw):
    """NaN was told "should be greater than or equal to 0", a bool named each number shape
    pydantic tried ("temperature.int: ...; temperature.float: ..."): one message naming the
    field's range, and the field as `param`."""
    body = '{"model": "tiny", "prompt": "hi", "max_tokens": 2, "%s": %s}' % (field, raw)
    status, _, text = server.raw("POST", "/v1/completions", body)
    error = json.loads(text)["error"]
    assert status == 400 and error["param"] == field, error
    assert error["message"].startswith(f"{field} must be a finite number in "), error


def test_chat_template_fields_and_stream_options_as_in_vllm(server, client):
    """A prefilled reply (continue_final_message) is continued, not answered anew; a field the
    template cannot take, or stream_options on an unstreamed request, is a 400 naming it."""
    turns = [{"role": "user", "content": "def add(a, b):"},
             {"role": "assistant", "content": "return a"}]
    res = client.chat.completions.create(
        model="tiny", messages=turns, max_tokens=6, temperature=0,
        extra_body={"add_generation_prompt": False, "continue_final_message": True,
                    "chat_template_kwargs": {"unused": 1}, "speculative": False})
    ids = server.llm.encode(messages=turns, add_generation_prompt=False,
                            continue_final_message=True)
    assert res.usage.prompt_tokens == len(ids)
    assert res.choices[0].message.content == server.llm.generate(ids, max_new_tokens=6).text
    chat = {"model": "tiny", "messages": turns[:1], "max_tokens": 2}
    for extra, param in [({"continue_final_message": True}, None),
                         ({"chat_template_kwargs": {"tokenize": True}}, None),
                         ({"chat_template_kwargs": [1]}, "chat_template_kwargs"),
                         ({"add_generation_prompt": "no"}, "add_generation_prompt"),
                         ({"stream_options": {"include_usage": True}}, "stream_options")]:
        error = _error(server.raw("POST", "/v1/chat/completions", {**chat, **extra}))
        assert error["message"] and (param is None or error["param"] == param), (extra, error)
    error = _error(server.raw("POST", "/v1/completions", {
        "model": "tiny", "prompt": "hi", "stream": False,
        "stream_options": {"continuous_usage_stats": True}}))
    assert error["param"] == "stream_options" and "stream" in error["message"], error
    # ... but options that ask for nothing pass, as in vLLM
    assert server.raw("POST", "/v1/completions", {"model": "tiny", "prompt": "hi",
                                                  "max_tokens": 2, "stream_options": {}})[0] == 200
    for field, value in [("chat_template", "{{ raise_exception('mine') }}"),
                         ("documents", [{"text": "x"}])]:     # refused, not ignored
        error = _error(server.raw("POST", "/v1/chat/completions", {**chat, field: value}))
        assert error["param"] == field and "not supported" in error["message"], error
    assert complete(client, "hi", max_tokens=2).usage.completion_tokens == 2    # still serving


def test_bad_message_content_gets_one_message_saying_what_content_takes(server):
    """pydantic names each shape of the content union it tried ("messages.0.content.str: ...;
    messages.0.content.list[TextPart].0.type: ..."): the client is told the forms once."""
    for content in (5, None, [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}],
                    [{"type": "text"}]):
        error = _error(server.raw("POST", "/v1/chat/completions", {
            "model": "tiny", "messages": [{"role": "user", "content": "hi"},
                                          {"role": "user", "content": content}]}))
        assert error["param"] == "messages.1.content", error
        assert error["message"].startswith("messages.1.content must be a string or a list of "
                                           "{\"type\": \"text\"") and "[" not in \
            error["message"].split("must be")[0], error


def test_a_client_gone_mid_upload_is_not_counted_as_a_bad_request(server):
    """A client that disconnects before its body is whole sent nothing wrong and is owed no
    answer: it is not a 400 in specrt:request_failure_total (it was)."""
    m0 = server.metrics()
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000\r\n\r\n{\"model\": \"tiny\", ")
    for _ in range(3):
        with socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT) as s:
            s.sendall(head)
            time.sleep(0.1)
    time.sleep(1.0)           # the server sees each disconnect within milliseconds
    m1 = server.metrics()
    changed = {k: m1[k] - m0.get(k, 0) for k in m1
               if "request_failure_total" in k and m1[k] != m0.get(k, 0)}
    assert changed == {}
    assert complete(server.client(), "hi", max_tokens=2).usage.completion_tokens == 2


def test_a_model_without_a_tokenizer_serves_token_id_prompts(tmp_path):
    from tests.tiny import make_model

    llm = specrt.LLM(make_model(tmp_path / "m", tokenizer=False, eos=False), max_seq_len=64,
                     dtype="float32")
    want = llm.generate([1, 2, 3], max_new_tokens=4).token_ids
    with Server(llm, spec=None) as s:
        greedy = {"model": "tiny", "prompt": [1, 2, 3], "max_tokens": 4, "temperature": 0}
        status, _, body = s.raw("POST", "/v1/completions", greedy)
        assert status == 200, body
        choice = json.loads(body)["choices"][0]       # no text to answer with: its ids
        assert choice["token_ids"] == want and choice["prompt_token_ids"] == [1, 2, 3]
        assert json.loads(body)["usage"]["completion_tokens"] == 4
        status, _, body = s.raw("POST", "/v1/completions", {**greedy, "stream": True})
        events = [json.loads(line[6:]) for line in body.decode().splitlines()
                  if line.startswith("data: {")]
        assert [t for e in events for t in e["choices"][0].get("token_ids", [])] == want
        status, _, body = s.raw("POST", "/v1/completions", {**greedy, "return_token_ids": False})
        assert "token_ids" not in json.loads(body)["choices"][0]      # asked not to
        error = _error(s.raw("POST", "/v1/completions", {"model": "tiny", "prompt": "hi"}))
        assert "token ids" in error["message"], error
        error = _error(s.raw("POST", "/detokenize", {"model": "tiny", "tokens": [1, 2]}))
        assert error["message"].endswith("ids cannot be turned into text"), error
        assert str(tmp_path) not in error["message"]          # no server paths to clients
        error = _error(s.raw("POST", "/tokenize", {"model": "tiny", "prompt": "hi"}))
        assert "no text to tokenize" in error["message"], error
        error = _error(s.raw("POST", "/v1/completions", {**greedy, "stop": "a"}))
        assert error["param"] == "stop" and "no tokenizer" in error["message"], error
        # a body past what 64 token ids need is refused unread (it was parsed whole: 20 MB)
        status, _, body = s.raw("POST", "/v1/completions",
                                b'{"model": "tiny", "prompt": [' + b"1, " * 600_000 + b"1]}")
        assert status == 413, body


def test_tokenize_detokenize_and_version_as_in_vllm(server, client):
    """/tokenize gives the ids the completion and chat endpoints run (their usage counts
    them), /detokenize the text back, special tokens included; bad input is a 400."""
    def post(path, body):
        status, _, raw = server.raw("POST", path, {"model": "tiny", **body})
        assert status == 200, raw
        return json.loads(raw)

    out = post("/tokenize", {"prompt": "def add(a, b):", "return_token_strs": True})
    assert out["tokens"] == server.llm.encode("def add(a, b):", chat=False)
    assert out["count"] == len(out["tokens"]) and out["max_model_len"] == 2048
    assert len(out["token_strs"]) == out["count"] and all(isinstance(t, str)
                                                          for t in out["token_strs"])
    assert complete(client, "def add(a, b):", max_tokens=1).usage.prompt_tokens == out["count"]
    turns = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "def"}]
    chat = post("/tokenize", {"messages": turns, "add_generation_prompt": False,
                              "continue_final_message": True})
    assert chat["token_strs"] is None
    assert post("/detokenize", {"tokens": chat["tokens"]})["prompt"] == \
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\ndef"
    res = client.chat.completions.create(model="tiny", messages=turns[:1], max_tokens=1)
    assert res.usage.prompt_tokens == post("/tokenize", {"messages": turns[:1]})["count"]
    for path, body, param in [("/tokenize", {}, None),
                              ("/tokenize", {"prompt": "x", "messages": turns}, None),
                              ("/tokenize", {"messages": []}, "messages"),
                              ("/tokenize", {"prompt": "x", "model": "other"}, "model"),
                              ("/tokenize", {"prompt": "x", "continue_final_message": True},
                               "continue_final_message"),
                              ("/tokenize", {"prompt": "x", "chat_template_kwargs": {"a": 1}},
                               "chat_template_kwargs"),
                              ("/tokenize", {"prompt": "x", "add_generation_prompt": False},
                               "add_generation_prompt"),
                              ("/detokenize", {"tokens": [1, 10**6]}, "tokens"),
                              ("/detokenize", {"tokens": [-1]}, "tokens"),
                              ("/detokenize", {"tokens": "12"}, "tokens")]:
        error = _error(server.raw("POST", path, {"model": "tiny", **body}))
        assert error["message"] and error["param"] == param, (path, body, error)
    status, _, raw = server.raw("GET", "/version")
    assert status == 200 and json.loads(raw) == {"version": specrt.__version__}
    assert server.raw("HEAD", "/version")[0] == 200
    # fields the chat endpoint refuses, /tokenize refuses too; special tokens as they add them
    for body, param in [({"messages": turns, "chat_template": "{{ 'X' }}"}, "chat_template"),
                        ({"messages": turns, "tools": [{"type": "function"}]}, "tools"),
                        ({"prompt": "x", "add_special_tokens": False}, "add_special_tokens"),
                        ({"messages": turns, "add_special_tokens": True},
                         "add_special_tokens")]:
        error = _error(server.raw("POST", "/tokenize", {"model": "tiny", **body}))
        assert error["param"] == param, (body, error)
    assert post("/tokenize", {"prompt": "x", "add_special_tokens": True})["count"] == \
        len(server.llm.encode("x", chat=False))
    # template fields at the values that ask for nothing are fine with a prompt
    assert post("/tokenize", {"prompt": "x", "chat_template_kwargs": {},
                              "add_generation_prompt": True})["count"] == \
        len(server.llm.encode("x", chat=False))
    assert post("/tokenize", {"prompt": "", "return_token_strs": True}) == {
        "count": 0, "max_model_len": 2048, "tokens": [], "token_strs": []}


def test_served_name_defaults_to_a_hub_id_as_given(tmp_path):
    """vLLM serves --model ORG/NAME as "ORG/NAME"; its snapshot directory is a commit hash,
    which clients sending the id were told does not exist."""
    from specrt.serve.cli import default_served_name

    snapshot = tmp_path / "snapshots" / ("ab" * 20)
    assert default_served_name("Qwen/Qwen2.5-0.5B", snapshot) == "Qwen/Qwen2.5-0.5B"
    assert default_served_name("Qwen/Qwen2.5-0.5B@main", snapshot) == "Qwen/Qwen2.5-0.5B"
    assert default_served_name(str(tmp_path / "mymodel"), tmp_path / "mymodel") == "mymodel"
    assert default_served_name(None, tmp_path / "qwen2.5-coder-1.5b-instruct") == \
        "qwen2.5-coder-1.5b-instruct"
    assert default_served_name("qwen2.5-coder-1.5b-instruct",
                               tmp_path / "qwen2.5-coder-1.5b-instruct") == \
        "qwen2.5-coder-1.5b-instruct"


def test_a_draft_named_in_the_servers_config_is_its_draft(tiny_noeos_dir, tiny_draft_dir,
                                                          tmp_path):
    """vLLM names the draft in --speculative-config's "model": the real server started so
    loads it as its draft and drafts with it, where it answered every request with a 400
    ("this server has no draft model")."""
    import subprocess
    import sys
    import urllib.request
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]
    spec = {"method": "draft_model", "num_speculative_tokens": 3, "model": str(tiny_draft_dir)}
    env = dict(os.environ, PYTHONPATH=str(root),
               SPECRT_CALIBRATION=str(tmp_path / "calibration.json"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "specrt.serve", "--model", str(tiny_noeos_dir), "--port",
         str(port), "--host", "127.0.0.1", "--dtype", "float32", "--max-model-len", "128",
         "--served-model-name", "tiny", "--speculative-config", json.dumps(spec)],
        cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stderr.read()
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=2):
                    break
            except OSError:
                assert time.monotonic() < deadline, "the server did not start in 120 s"
                time.sleep(0.3)
        body = json.dumps({"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 8,
                           "temperature": 0}).encode()
        request = urllib.request.Request(f"{base}/v1/completions", body,
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
            assert response.status == 200
            answer = json.loads(response.read())
        with urllib.request.urlopen(f"{base}/metrics", timeout=TIMEOUT) as response:
            metrics = response.read().decode()
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    llm = specrt.LLM(tiny_noeos_dir, max_seq_len=128, dtype="float32")
    plain = llm.generate([5, 6, 7], max_new_tokens=8)
    assert answer["choices"][0]["text"] == plain.text
    drafts = [line for line in metrics.splitlines()
              if line.startswith('vllm:spec_decode_num_drafts_total{model_name="tiny"}')]
    assert drafts and float(drafts[0].split()[-1]) > 0, metrics


def test_two_different_drafts_are_refused_by_the_servers_flags(tiny_noeos_dir, tiny_draft_dir):
    """--draft A beside a config naming B would load both and draft with B only; the same
    model named twice is one draft."""
    from specrt.errors import ArgumentError
    from specrt.serve.cli import build_parser, check_flags

    def flags(named):
        return build_parser().parse_args(["--model", str(tiny_noeos_dir), "--draft",
                                          str(tiny_draft_dir), "--speculative-config",
                                          json.dumps({"model": str(named)})])

    with pytest.raises(ArgumentError, match="name two draft models"):
        check_flags(flags(tiny_noeos_dir))
    assert check_flags(flags(tiny_draft_dir)).draft == str(tiny_draft_dir)
