"""The public arguments of `LLM(...)` and of `generate`/`stream`/`submit`, checked in one place.

`LLMArgs` is what `LLM(...)` and the CLIs build first, before any file is read or any model
loads, so a typo costs nothing. The per-request checks (`check_stop`, `check_request_kwargs`,
...) are shared by the API and the CLIs; sampling and speculative values are checked by their
own dataclasses (`SamplingParams`, `SpecConfig`). Every failure is an `ArgumentError` naming the
argument, the value and the fix. Nothing here loads a model or touches a tensor.
"""
from __future__ import annotations

import dataclasses
import difflib
import functools
import inspect
import os
from pathlib import Path

from specrt.errors import ArgumentError
from specrt.checks import check_bool, check_device, check_int, show
from specrt.spec.config import DRAFT_STOP, check_draft_stop

MAX_SEQ_LEN = 2**20          # a KV cache longer than any Qwen2 context; beyond it, a typo
MAX_BATCH_SIZE = 1024
MAX_QUEUE = 2**20
DTYPE_NAMES = ("auto", "float32", "bfloat16", "float16")
QUANT_NAMES = ("int8", "int4")        # the draft's weight-only formats (`draft_dtype`)
REQUEST_ARGS = ("prompt", "messages", "max_new_tokens", "temperature", "top_k", "top_p", "seed",
                "stop", "chat", "speculative")


def check_path_arg(name: str, value) -> str | None:
    """A model directory or known name: a non-empty str or os.PathLike (None: the default)."""
    if value is None:
        return None
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value.strip() or "\0" in value:
        raise ArgumentError(f"{name} must be a model directory or a known model name (a "
                            f"non-empty string or path), got {show(value)}")
    return value


def check_dtype(dtype, device=None):
    """'auto' | 'float32' | 'bfloat16' | 'float16' or the matching torch.dtype -> torch.dtype.
    'auto': bfloat16 where `device` computes it natively (CUDA with bf16 support) or specrt's
    CPU kernels serve it (a CPU with AVX-512 BF16 or AVX2: they widen bf16 in registers), else
    float32."""
    import torch

    if isinstance(dtype, str) and dtype == "auto":
        return auto_dtype(device if device is not None else check_device(None))
    by_name = {n: getattr(torch, n) for n in DTYPE_NAMES if n != "auto"}
    if isinstance(dtype, str) and dtype in by_name:
        return by_name[dtype]
    if isinstance(dtype, torch.dtype) and dtype in by_name.values():
        return dtype
    raise ArgumentError(f"dtype {show(dtype)} is not supported; choose {', '.join(DTYPE_NAMES)}")


def auto_dtype(device):
    import torch

    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
    from specrt.kernels.cpu import ops

    return torch.bfloat16 if ops.AVAILABLE else torch.float32




@dataclasses.dataclass(frozen=True)
class LLMArgs:
    """`LLM(...)`'s arguments, checked and normalized (dtype and device become torch objects)."""

    model: str | Path | None = None
    draft: str | Path | None = None
    dtype: object = "auto"
    device: object = None
    max_seq_len: int = 4096
    max_batch_size: int = 1
    cuda_graphs: bool | None = None
    max_queue: int = 256
    draft_dtype: object = "auto"
    draft_vocab: object = "auto"
    draft_stop: object = DRAFT_STOP

    def __post_init__(self):
        set_ = object.__setattr__
        set_(self, "model", check_path_arg("model", self.model))
        set_(self, "draft", check_path_arg("draft", self.draft))
        set_(self, "max_seq_len", check_int(
            "max_seq_len", self.max_seq_len, 2, MAX_SEQ_LEN,
            fix="tokens per sequence (prompt + answer); 4096 is typical"))
        set_(self, "max_batch_size", check_int("max_batch_size", self.max_batch_size, 1,
                                               MAX_BATCH_SIZE, fix="requests decoded together"))
        set_(self, "max_queue", check_int("max_queue", self.max_queue, 1, MAX_QUEUE,
                                          fix="requests waiting for a slot"))
        set_(self, "cuda_graphs", check_bool("cuda_graphs", self.cuda_graphs, allow_none=True))
        set_(self, "device", check_device(self.device))
        set_(self, "dtype", check_dtype(self.dtype, self.device))
        set_(self, "draft_dtype", check_draft_dtype(self.draft_dtype, self.device, self.dtype))
        if self.draft_vocab not in ("auto", None):
            set_(self, "draft_vocab", check_int(
                "draft_vocab", self.draft_vocab, 1, 2**24,
                fix="'auto', a count of token ids, or every token: None (the API) / 'all' "
                    "(the CLIs)"))
        set_(self, "draft_stop", check_draft_stop(self.draft_stop))
        graphs = self.device.type == "cuda" if self.cuda_graphs is None else self.cuda_graphs
        if graphs and self.draft_stop not in (0.0, DRAFT_STOP):
            raise ArgumentError(f"draft_stop {self.draft_stop} would be ignored: with CUDA "
                                "graphs (on by default on CUDA; the server's always there) "
                                "every round drafts K, as a stop of 0 does; leave it out, or "
                                "turn CUDA graphs off (cuda_graphs=False, --no-cuda-graphs)")
        from specrt.spec.calibration import disk_path
        disk_path()     # SPECRT_CALIBRATION naming a folder: refused here, not by every `auto`
                        # request after the model loaded


def check_draft_dtype(value, device, dtype):
    """How the draft model's weights are stored -> "auto", "int8", "int4" or None (as the
    target's).

    "auto": quantized on the CPU where a quantized kernel runs (quantized.AUTO_DRAFT_FORMATS),
    else the model dtype (decided at load, where the draft's shapes are known); "int8" /
    "int4": weight-only int8 / int4 (CPU only; int4 needs projections whose input sizes are
    multiples of 128); a float dtype: unquantized, which must be the model's dtype; None: the
    same (this function's own answer for it, so checked arguments check again unchanged)."""
    if value is None:
        return None
    if value == "auto" or value in QUANT_NAMES:
        if value != "auto" and device.type != "cpu":
            raise ArgumentError(f"draft_dtype {value!r} runs on the CPU only (device is "
                                f"{device}); use draft_dtype='auto'")
        from specrt.model.backends.quantized import QUANT_ACTIVATIONS

        if value != "auto" and dtype not in QUANT_ACTIVATIONS:
            raise ArgumentError(f"draft_dtype {value!r} runs with bfloat16 or float32 "
                                f"activations, not {str(dtype).removeprefix('torch.')}; use "
                                "dtype bfloat16 or float32, or draft_dtype='auto'")
        return value
    try:
        same = check_dtype(value, device) == dtype
    except ArgumentError:
        same = None
    if same:
        return None
    raise ArgumentError(f"draft_dtype {show(value)} is not supported; choose 'auto', 'int8', "
                        f"'int4' or the model's dtype ({str(dtype).removeprefix('torch.')})")


def check_max_new_tokens(n) -> int:
    return check_int("max_new_tokens", n, 1, MAX_SEQ_LEN,
                     fix="the most tokens to generate; it must fit in max_seq_len")


# Each stop string is searched for after every round: thousands would slow every token.
MAX_STOP_STRINGS = 256


def check_stop(stop) -> list[str]:
    """None, a string, or a list of strings -> list; an empty stop string would end every answer
    at once, so it is a mistake, not a no-op."""
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, (list, tuple)):
        raise ArgumentError(f"stop must be a string or a list of strings, got {show(stop)}")
    if len(stops) > MAX_STOP_STRINGS:
        raise ArgumentError(f"at most {MAX_STOP_STRINGS} stop strings, got {len(stops)}; "
                            "keep the ones the answers can end with")
    for s in stops:
        if not isinstance(s, str) or not s:
            raise ArgumentError(f"every stop string must be a non-empty string, got {show(s)} "
                                f"in stop={show(stop)}; leave stop out for no stop strings")
        check_text("stop string", s)
    return list(stops)


def check_text(name: str, text: str) -> str:
    """Text the tokenizer can take: encodable as UTF-8 (a lone surrogate like '\\ud800' is not)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ArgumentError(f"{name} is not valid Unicode text ({e.reason} at position "
                            f"{e.start}); pass a str without lone surrogates") from None
    return text


def check_request_kwargs(kwargs: dict) -> None:
    """Unknown keyword arguments of generate/stream get a "did you mean", not a TypeError."""
    check_keywords(kwargs, REQUEST_ARGS)


def check_positional(method: str, extra: tuple, names: tuple[str, ...] = ("prompt",)) -> None:
    """A call given positional arguments past `names` (generate's and stream's: the prompt)
    gets an ArgumentError saying to pass them by name, not Python's TypeError."""
    if extra:
        took = ", ".join(names)
        plural = "s" if len(names) != 1 else ""
        example = f", e.g. {method}({took}, max_new_tokens=...)" if "prompt" in names else ""
        raise ArgumentError(f"{method} takes {len(names)} positional argument{plural} ({took}), "
                            f"got {len(names) + len(extra)}; pass the others by name{example}")


def check_keywords(kwargs, known) -> None:
    """ArgumentError for the first keyword not in `known`, with the nearest known one."""
    for key in kwargs:
        if key not in known:
            near = difflib.get_close_matches(str(key), known, n=1)
            raise ArgumentError(f"unknown argument {show(key)}"
                                + (f"; did you mean {near[0]!r}?" if near else
                                   f"; known: {', '.join(known)}"))


def keywords_checked(fn):
    """`fn`, a method whose signature names every keyword it takes, answering an unknown keyword
    argument (check_keywords), more positional ones than it takes (check_positional) or one
    given both ways (`given_once`) with an ArgumentError instead of Python's TypeError; the
    signature is kept for help() and editors."""
    params = inspect.signature(fn).parameters
    known = tuple(n for n, p in params.items() if n != "self" and p.kind in (
        p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
    positional = tuple(n for n, p in params.items() if p.kind == p.POSITIONAL_OR_KEYWORD)
    call = _call_name(fn)

    @functools.wraps(fn)
    def checked(*args, **kwargs):
        check_positional(call, args[len(positional):], positional[1:])   # less self
        check_keywords(kwargs, known)
        _check_given_once(call, positional, args, kwargs)
        return fn(*args, **kwargs)

    return checked


def given_once(fn):
    """`fn` (a method passing **kwargs on, such as generate) answering an argument given both
    by position and by name (`generate(ids, prompt=ids)`) with an ArgumentError: Python binds
    the arguments, and raises its TypeError, before the method's own checks run."""
    params = inspect.signature(fn).parameters
    positional = tuple(n for n, p in params.items() if p.kind == p.POSITIONAL_OR_KEYWORD)
    call = _call_name(fn)

    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def checked_async(*args, **kwargs):
            _check_given_once(call, positional, args, kwargs)
            return await fn(*args, **kwargs)

        return checked_async

    @functools.wraps(fn)
    def checked(*args, **kwargs):
        _check_given_once(call, positional, args, kwargs)
        return fn(*args, **kwargs)

    return checked


def _call_name(fn) -> str:
    owner, _, name = fn.__qualname__.rpartition(".")
    return owner if name == "__init__" else fn.__qualname__


def _check_given_once(call: str, positional: tuple[str, ...], args: tuple, kwargs: dict
                      ) -> None:
    for name in positional[:len(args)]:
        if name in kwargs:
            raise ArgumentError(f"{call} got {name} both by position and by name; give it once")
