"""The OpenAI request bodies the server accepts, and the response bodies it sends.

Requests are pydantic models in strict mode: a known field of the wrong type ("max_tokens":
"5", "stop": 3) is a 400. An OpenAI or vLLM field this server does not implement (`logprobs`,
`echo`, `presence_penalty`, `tools`, ...: `UNSUPPORTED`) is a 400 naming it, unless it holds the
value that asks for nothing (null, false, 0, ...), which is what clients send by default; any
other field (`user`, ...) is ignored. Responses are plain dicts in OpenAI's shapes. Nothing here
talks to the engine.
"""
from __future__ import annotations

import time
import uuid
from typing import Literal, Optional, Union

from pydantic import (BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr,
                      field_validator, model_validator)

from specrt.spec.sampling import MAX_TEMPERATURE

# engine finish reason -> OpenAI's ("eos": the model ended its answer; "stop": a stop string)
FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length", "cancelled": "abort"}
Number = Union[StrictInt, StrictFloat]


COMPLETION_MAX_TOKENS = 16     # a completion's budget when it names none (OpenAI's default;
                               # capped by the room the prompt leaves, as a chat request's)
CHAT_MAX_TOKENS = 256          # a chat request's budget when it names none (capped by room)

# Fields of OpenAI's or vLLM's requests that this server does not implement, with the values
# that ask for nothing of them (accepted; any other value is refused rather than ignored).
UNSUPPORTED: dict[str, tuple] = {
    "logprobs": (None, False), "top_logprobs": (None, 0), "echo": (None, False),
    "best_of": (None, 1), "suffix": (None, ""), "logit_bias": (None, {}),
    "presence_penalty": (None, 0), "frequency_penalty": (None, 0),
    "repetition_penalty": (None, 1), "min_p": (None, 0), "min_tokens": (None, 0),
    "ignore_eos": (None, False), "response_format": (None, {"type": "text"}),
    "tools": (None, []), "tool_choice": (None, "none", "auto"), "functions": (None, []),
    "function_call": (None, "none", "auto"), "guided_json": (None,), "guided_regex": (None,),
    "guided_choice": (None,), "guided_grammar": (None,), "structured_outputs": (None,),
    # vLLM's sampling extensions (the text already skips special tokens, as theirs does)
    "stop_token_ids": (None, []), "include_stop_str_in_output": (None, False),
    "skip_special_tokens": (None, True), "spaces_between_special_tokens": (None, True),
    "prompt_logprobs": (None,), "truncate_prompt_tokens": (None,), "allowed_token_ids": (None,),
    "bad_words": (None, []), "use_beam_search": (None, False), "length_penalty": (None, 1),
    "priority": (None, 0), "logits_processors": (None,),
    "return_tokens_as_token_ids": (None, False),
    # a request's own template would run client code in the server (vLLM refuses it too,
    # unless started with --trust-request-chat-template)
    "chat_template": (None,), "documents": (None, []),
}


# What a field of several accepted shapes takes, said when a request's value fits none of them
# (pydantic would name each shape it tried: "prompt.list[int].0: Input should be ...").
FIELD_FORMS = {
    "prompt": "a string or a list of token ids (one prompt per request: send a batch of "
              "prompts as one request each)",
    "stop": "a string or a list of strings",
    # a number's range errors too: NaN was told "should be greater than or equal to 0"
    "temperature": f"a finite number in [0, {MAX_TEMPERATURE:g}], or null (1.0)",
    "top_p": "a finite number in (0, 1], or null (1.0)",
    "top_k": "an integer >= 1, or 0, -1 or null (no top-k)",
    "speculative": "an object of vLLM's speculative-config keys, false (plain decoding) or "
                   "null (the server's --speculative-config)",
    # N: any message's index
    "messages.N.content": "a string or a list of {\"type\": \"text\", \"text\": a string} "
                          "parts (text only: this server takes no images or audio)",
}


# Fields that take null for their default, as vLLM's Optional fields do ("stream": null is a
# stream of nothing: false).
NULL_IS_DEFAULT = frozenset({"n", "stream", "include_usage", "add_generation_prompt",
                             "continue_final_message", "return_token_strs"})


class _Base(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)   # extras: see `unsupported`

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data):
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if v is not None or k not in NULL_IS_DEFAULT}
        return data

    def unsupported(self) -> tuple[str, object] | None:
        """The first field of UNSUPPORTED set to a value that asks for something."""
        for name, value in (self.model_extra or {}).items():
            if name in UNSUPPORTED and value not in UNSUPPORTED[name]:
                return name, value
        return None


class StreamOptions(_Base):
    include_usage: StrictBool = False


class _Sampling(_Base):
    """Fields both endpoints share."""

    model: Optional[StrictStr] = None
    temperature: Optional[Number] = Field(None, ge=0.0, le=MAX_TEMPERATURE)  # None: 1.0
    top_p: Optional[Number] = Field(None, gt=0.0, le=1.0)
    top_k: Optional[StrictInt] = Field(None, ge=-1)   # an extension, as in vLLM (-1: off)
    seed: Optional[StrictInt] = None
    stop: Union[StrictStr, list[StrictStr], None] = None
    n: StrictInt = 1
    stream: StrictBool = False
    stream_options: Optional[StreamOptions] = None
    # specrt's extension: absent or null = the server's --speculative-config; false = plain
    # decoding; an object = that config (vLLM's keys) for this request.
    speculative: Union[dict, Literal[False], None] = None
    # vLLM's: the answer's token ids (and the prompt's) beside its text; null = only for a
    # model without a tokenizer, whose answers have no text
    return_token_ids: Optional[StrictBool] = None

    @field_validator("speculative", mode="before")
    @classmethod
    def _false_not_zero(cls, value):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            raise ValueError("a number is not a speculative config")   # 0 == False in Python
        return value

    def top_k_or_off(self) -> int:
        """top_k for the engine: 0 (off) for null or vLLM's -1."""
        return 0 if self.top_k in (None, -1) else self.top_k

    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


class CompletionRequest(_Sampling):
    prompt: Union[StrictStr, list[StrictInt]]
    max_tokens: Optional[StrictInt] = None     # None: room left, at most COMPLETION_MAX_TOKENS

    def token_budget(self) -> tuple[Optional[int], str]:
        """(the budget the request set, or None; the field that set it)."""
        return self.max_tokens, "max_tokens"


class TextPart(_Base):
    type: Literal["text"]
    text: StrictStr


class ChatMessage(_Base):
    role: Literal["system", "user", "assistant", "developer"]
    content: Union[StrictStr, list[TextPart]]

    def as_dict(self) -> dict:
        content = self.content if isinstance(self.content, str) else \
            "".join(p.text for p in self.content)
        # OpenAI's newer "developer" role is the system prompt of older templates
        return {"role": "system" if self.role == "developer" else self.role, "content": content}


class _ChatTemplate(_Base):
    """vLLM's chat-template fields (Tokenizer.chat_text): a prefilled reply to continue, and
    variables for the template."""

    add_generation_prompt: StrictBool = True
    continue_final_message: StrictBool = False
    chat_template_kwargs: Optional[dict] = None

    def template_options(self) -> dict:
        """LLM.encode's keywords for the messages' template."""
        return dict(add_generation_prompt=self.add_generation_prompt,
                    continue_final_message=self.continue_final_message,
                    chat_template_kwargs=self.chat_template_kwargs)


class ChatCompletionRequest(_Sampling, _ChatTemplate):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: Optional[StrictInt] = None        # None: room left, at most CHAT_MAX_TOKENS
    max_completion_tokens: Optional[StrictInt] = None        # OpenAI's newer name for it

    def token_budget(self) -> tuple[Optional[int], str]:
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens, "max_completion_tokens"
        return self.max_tokens, "max_tokens"


class TokenizeRequest(_ChatTemplate):
    """vLLM's /tokenize: a prompt as /v1/completions reads it, or chat messages as
    /v1/chat/completions does (with its template fields)."""

    model: Optional[StrictStr] = None
    prompt: Optional[StrictStr] = None
    messages: Optional[list[ChatMessage]] = Field(None, min_length=1)
    return_token_strs: StrictBool = False
    add_special_tokens: Optional[StrictBool] = None     # None: as the endpoint would


class DetokenizeRequest(_Base):
    model: Optional[StrictStr] = None
    tokens: list[StrictInt]


# --- responses ---------------------------------------------------------------------------------
def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def completion(rid: str, model: str, text: str, finish: str | None, use: dict | None,
               chunk: bool = False, ids: list[int] | None = None,
               prompt_ids: list[int] | None = None) -> dict:
    """A /v1/completions body (the whole answer) or one of its stream chunks; with `ids`, the
    choice's token ids (and, given, the prompt's: vLLM's `return_token_ids`)."""
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    if prompt_ids is not None:
        choice["prompt_token_ids"] = prompt_ids
    if ids is not None:
        choice["token_ids"] = ids
    body = {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": [choice]}
    if use is not None or not chunk:
        body["usage"] = use
    return body


def chat_completion(rid: str, model: str, text: str, finish: str, use: dict,
                    ids: list[int] | None = None, prompt_ids: list[int] | None = None) -> dict:
    choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
              "finish_reason": finish}
    if ids is not None:
        choice["token_ids"] = ids
    body = {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [choice], "usage": use}
    if prompt_ids is not None:
        body["prompt_token_ids"] = prompt_ids
    return body


def chat_chunk(rid: str, model: str, delta: dict | None, finish: str | None,
               use: dict | None = None, ids: list[int] | None = None,
               prompt_ids: list[int] | None = None) -> dict:
    """One chat stream chunk; delta None: the usage-only chunk (no choices)."""
    choices = [] if delta is None else [{"index": 0, "delta": delta, "logprobs": None,
                                         "finish_reason": finish}]
    if choices and ids is not None:
        choices[0]["token_ids"] = ids
    body = {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()),
            "model": model, "choices": choices}
    if prompt_ids is not None:
        body["prompt_token_ids"] = prompt_ids
    if use is not None:
        body["usage"] = use
    return body


def tokenized(ids: list[int], max_model_len: int, token_strs: list[str] | None) -> dict:
    return {"count": len(ids), "max_model_len": max_model_len, "tokens": ids,
            "token_strs": token_strs}


def models_list(name: str, created: int, max_model_len: int) -> dict:
    return {"object": "list", "data": [{"id": name, "object": "model", "created": created,
                                        "owned_by": "specrt", "root": name,
                                        "max_model_len": max_model_len}]}
