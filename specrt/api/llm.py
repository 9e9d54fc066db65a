"""`specrt.LLM`: the public, text-level API that services embed.

    llm = specrt.LLM(model="DIR", draft="DRAFT_DIR", max_batch_size=4)
    res = llm.generate("Write quicksort in Python", chat=True,
                       speculative={"method": "draft_model", "num_speculative_tokens": 4})
    res.token_ids, res.text, res.finish_reason, res.stats
    for chunk in llm.stream(messages=[{"role": "user", "content": "Explain a hash map"}]):
        print(chunk.text, end="")

This is the text edge: prompts may be strings (tokenized here, chat template optional),
chat messages, or token-id lists; stop strings are matched here on the decoded text.
Everything below works on token ids. Every method is safe from any thread: requests go to
one scheduler thread that owns the model (`specrt.engine.scheduler`) and run batched with
whatever else is in flight, each giving exactly the tokens it would give alone. For asyncio,
see `specrt.AsyncLLM`.
"""
from __future__ import annotations

import dataclasses
import inspect
import logging
import numbers
import os
import threading
import weakref
from pathlib import Path
from typing import Iterator, Sequence

from specrt.api.args import (LLMArgs, check_max_new_tokens, check_positional,
                              check_request_kwargs, check_stop, check_text, given_once,
                              keywords_checked)
from specrt.api.run import Chunks, GenerationResult, StreamChunk, TextRun
from specrt.api.text_stream import TextStream
from specrt.api.tokenizer import Tokenizer, check_compatible, check_template_kwargs
from specrt.engine.engine import Engine
from specrt.engine.request import Request, check_token_ids
from specrt.engine.scheduler import Scheduler
from specrt.errors import (ClosedError, ConfigError, QueueFullError, SpecrtError,
                           TextTooLongError)
from specrt.checks import check_bool, check_int
from specrt.hub.resolve import resolve_model_dir, resolve_pair
from specrt.model.backends.quantized import auto_draft_format
from specrt.model.config import ModelConfig
from specrt.model.transformer import Transformer
from specrt.spec.config import DRAFT_STOP, MAX_SPECULATIVE_TOKENS, SpecConfig
from specrt.spec.costs import CostModel
from specrt.spec.drafters.draft_model import draft_head_rows
from specrt.spec.sampling import SamplingParams

__all__ = ["LLM", "GenerationResult", "StreamChunk"]
log = logging.getLogger(__name__)
MAX_DRAFT_ENGINES = 2    # engines kept for drafts named per request (each holds a draft model)


class LLM:
    @keywords_checked
    def __init__(self, model: str | Path | None = None, draft: str | Path | None = None,
                 dtype: str = "auto", device: str | None = None, max_seq_len: int = 4096,
                 max_batch_size: int = 1, cuda_graphs: bool | None = None,
                 max_queue: int = 256, draft_dtype: str = "auto", draft_vocab="auto",
                 draft_stop: float = DRAFT_STOP):
        """The defaults (the same as the CLIs'): device None = CUDA if available, else the CPU;
        dtype "auto" = bfloat16 on a CUDA device with bf16 or where specrt's CPU kernels run
        it (AVX-512 BF16 or AVX2), else float32;
        cuda_graphs None = on with CUDA; draft_dtype "auto" = the draft model's weights in int8
        where the CPU int8 kernel runs (the output is unchanged: only the target decides what
        is emitted), else in dtype; draft_vocab: the draft scores only the token ids below it
        (and the special tokens) and the ids its request has read, "auto" = 49152 for
        vocabularies over twice that (65536 with cuda_graphs, whose draft reads no ids: see
        specrt.spec.drafters.draft_model.shortlist), None = every token; draft_stop: the draft
        model stops a request's drafts in a round after a guess it gives less than this
        probability (0 = never; with cuda_graphs every round drafts K, and another value than
        0 or the default is refused). Every argument is
        checked (specrt.api.args) before any file is read."""
        args = LLMArgs(model, draft, dtype, device, max_seq_len, max_batch_size, cuda_graphs,
                       max_queue, draft_dtype, draft_vocab, draft_stop)
        self.draft_dtype, self.draft_vocab = args.draft_dtype, args.draft_vocab
        self.draft_stop = args.draft_stop
        self.dtype, self.device = args.dtype, args.device
        max_seq_len, max_batch_size = args.max_seq_len, args.max_batch_size
        # No model: the default pair, fetched on first use.
        self.model_dir, draft_dir = resolve_pair(args.model, args.draft)
        self.max_seq_len = max_seq_len
        self.max_batch_size = max_batch_size
        self.max_queue = args.max_queue
        # Static runners for the draft loop and the verify pass (CUDA graphs on CUDA, run
        # eagerly elsewhere; every round then drafts K): on by default on CUDA only.
        self.cuda_graphs = (self.device.type == "cuda") if args.cuda_graphs is None \
            else args.cuda_graphs
        self.draft_dir = draft_dir

        def build() -> Engine:     # on the scheduler's thread, which then runs every round
            target = Transformer.from_dir(self.model_dir, self.dtype, self.device, max_seq_len)
            self.tokenizer = (Tokenizer(self.model_dir) if Tokenizer.available(self.model_dir)
                              else None)
            if self.tokenizer is not None:
                self.tokenizer.check_fits(target.cfg.vocab_size)
            draft_model = self._load_draft(target, draft_dir) if draft_dir is not None else None
            return Engine(target, draft_model, max_batch_size, max_seq_len,
                          static=self.cuda_graphs, draft_stop=self.draft_stop)

        self.scheduler = Scheduler(build, self.max_queue)
        self.engine = self.scheduler.engine
        self.target = self.engine.target
        trained = self.target.cfg.max_position_embeddings
        if self.max_seq_len > trained:
            # as vLLM refuses by default: rotary positions past those the model was trained on
            # run, but what the model says there degrades
            log.warning("max_seq_len %d is past the %d positions %s was trained for: text "
                        "beyond them runs but its quality degrades; pass max_seq_len=%d "
                        "(CLI: --max-seq-len, server: --max-model-len) to stay within them",
                        self.max_seq_len, trained, self.model_dir, trained)
        self.eos_ids = set(self.target.cfg.eos_token_ids)
        self._schedulers: dict[str | None, Scheduler] = {_real(draft_dir): self.scheduler}
        self._schedulers_lock = threading.Lock()     # callers' threads add engines
        self._closed = False                         # set by close(), under that lock
        # Dropped without close(), an LLM's engines stop with it: their threads hold nothing
        # of it (Scheduler drops what built an engine), so this runs once nothing else does,
        # and leaves each thread to end after its round (not waiting: it may run on any
        # thread, a scheduler's own included). At exit the scheduler module closes them all.
        finalizer = weakref.finalize(self, _stop_engines, self._schedulers)
        finalizer.atexit = False

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _load_draft(self, target: Transformer, draft_dir: Path) -> Transformer:
        cfg = ModelConfig.from_dir(draft_dir)
        quant = self.draft_dtype
        if quant == "auto":
            quant = auto_draft_format(cfg, self.device, self.dtype)
        draft_model = Transformer.from_dir(
            draft_dir, self.dtype, self.device, self.max_seq_len, quant=quant,
            head_rows=draft_head_rows(cfg, self.tokenizer, self.draft_vocab,
                                      reads_ids=not self.cuda_graphs),
            screen=False)       # a draft's passes read its confidence too, never argmax alone
        draft_tok = Tokenizer(draft_dir) if Tokenizer.available(draft_dir) else None
        check_compatible(self.tokenizer, draft_tok, target.cfg.vocab_size,
                         draft_model.cfg.vocab_size, str(self.model_dir), str(draft_dir))
        return draft_model

    def _scheduler_for(self, spec: SpecConfig | None) -> Scheduler:
        """A speculative config naming another draft "model" gets its own engine (sharing the
        target's weights, with its own caches and thread), keyed by the draft's real path."""
        if spec is None or spec.model is None:
            return self.scheduler
        key = _real(resolve_model_dir(spec.model))
        with self._schedulers_lock:         # two threads naming one new draft: one engine
            if self._closed:
                raise ClosedError("this LLM was closed; create a new one")
            if key not in self._schedulers:
                if len(self._schedulers) > MAX_DRAFT_ENGINES:
                    raise ConfigError(f"at most {MAX_DRAFT_ENGINES} other draft models can be "
                                      "named per request; load the draft you need with "
                                      "LLM(draft=...)")
                self._schedulers[key] = Scheduler(
                    lambda: Engine(self.target, self._load_draft(self.target, Path(key)),
                                   self.max_batch_size, self.max_seq_len,
                                   static=self.cuda_graphs, draft_stop=self.draft_stop),
                    self.max_queue)
            return self._schedulers[key]

    def prepare(self, speculative=None) -> None:
        """Load the engine that requests with this `speculative` config run on, if a draft
        model it names is not loaded yet (a request naming it loads it otherwise: seconds a
        benchmark may want outside its timings)."""
        self._scheduler_for(SpecConfig.parse(speculative))

    @keywords_checked
    def cost_model(self, max_k: int = MAX_SPECULATIVE_TOKENS) -> CostModel:
        """What `auto` with num_speculative_tokens = max_k plans with: this machine's
        calibrated forward times of the target and the draft (a one-off measurement of a few
        seconds, then cached per machine and build; `specrt.spec.costs`), timed on the
        scheduler's thread, where the rounds run."""
        max_k = check_int("max_k", max_k, 1, MAX_SPECULATIVE_TOKENS)
        return self.scheduler.call(lambda: self.engine.cost_model(max_k))

    @property
    def pending(self) -> int:
        """Requests waiting for a slot, over every engine (the default draft's and any other a
        speculative config named)."""
        return sum(s.pending for s in list(self._schedulers.values()))

    @property
    def running(self) -> int:
        """Requests holding a slot, over every engine."""
        return sum(s.running for s in list(self._schedulers.values()))

    @property
    def kv_cache_usage(self) -> float:
        """The share (0..1) of the KV cache's positions, over every engine, that hold running
        requests' tokens (their prompts and what they have committed); each engine's cache is
        max_batch_size x max_seq_len positions, allocated at load."""
        used = total = 0
        for scheduler in list(self._schedulers.values()):
            u, t = scheduler.kv_positions()
            used, total = used + u, total + t
        return used / total if total else 0.0

    def close(self) -> None:
        """Cancel every request and stop the scheduler threads."""
        with self._schedulers_lock:
            self._closed = True             # no engine for a new draft is built after this
            schedulers = list(self._schedulers.values())
        for scheduler in schedulers:
            scheduler.close()

    # --- text -> ids ------------------------------------------------------------------------
    @keywords_checked
    def encode(self, prompt: str | Sequence[int] | None = None, chat: bool = False,
               messages: list[dict] | None = None, *, add_generation_prompt: bool = True,
               continue_final_message: bool = False,
               chat_template_kwargs: dict | None = None) -> list[int]:
        """Token ids of a text prompt (chat: through the chat template), of chat `messages`
        ([{"role": "system" | "user" | "assistant", "content": str}]), or a token-id list.
        The keywords after `messages` shape the template's output as in vLLM (see
        `Tokenizer.chat_text`): continue_final_message=True (with add_generation_prompt=False)
        leaves the last assistant message open for the model to continue."""
        if messages is None and (  # with messages, Tokenizer.chat_text checks the options
                not check_bool("add_generation_prompt", add_generation_prompt)
                or check_bool("continue_final_message", continue_final_message)
                or check_template_kwargs(chat_template_kwargs)):
            raise SpecrtError("add_generation_prompt, continue_final_message and "
                              "chat_template_kwargs apply to chat messages: pass messages=[...]")
        if messages is not None:
            if prompt is not None:
                raise SpecrtError("give a prompt or messages, not both")
            texts = [m["content"] for m in (messages if isinstance(messages, (list, tuple))
                                            else ()) if isinstance(m, dict)
                     and isinstance(m.get("content"), str)]
            for text in texts:
                check_text("a message's content", text)
            self._check_fits(sum(map(len, texts)), "the messages' content")
            return self._need_tokenizer().encode_messages(
                messages, add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
                template_kwargs=chat_template_kwargs)
        if chat and prompt is not None and not isinstance(prompt, str):
            raise SpecrtError("chat=True applies the chat template to a text prompt, and this "
                              "one is token ids, which are sent as they are: leave chat out, "
                              "or pass the text")
        if hasattr(prompt, "tolist") and getattr(prompt, "ndim", None) == 1:
            prompt = prompt.tolist()               # a numpy array or a tensor of ids, as decode
        if isinstance(prompt, str):
            self._check_fits(len(prompt), "the prompt")
            ids = self._need_tokenizer().encode(check_text("the prompt", prompt), chat=chat)
        elif isinstance(prompt, (list, tuple)):
            ids = list(prompt)
            if ids and all(isinstance(t, (list, tuple)) for t in ids):
                raise SpecrtError("one prompt was expected and this is a batch of "
                                  f"{len(ids)}: generate() takes a batch; submit one at a time")
            if ids and all(isinstance(t, dict) for t in ids):
                raise SpecrtError("this prompt is chat messages: pass them as messages=[...], "
                                  "one conversation per call (a batch is of texts or "
                                  "token-id lists)")
            if not all(isinstance(t, numbers.Integral) and not isinstance(t, bool)
                       for t in ids):
                raise SpecrtError("a token-id prompt must be a list of ints")
            ids = [int(t) for t in ids]                 # numpy's integers too
            check_token_ids(ids, self.target.cfg.vocab_size)
        else:
            raise SpecrtError(f"a prompt must be a string or a list of token ids, got "
                              f"{type(prompt).__name__}")
        if not ids:
            raise SpecrtError("the prompt is empty: give some text or at least one token id")
        return ids

    @keywords_checked
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """The text of token ids, special tokens included unless skip_special_tokens (as
        Hugging Face's decode; a generation's own text skips them)."""
        skip = check_bool("skip_special_tokens", skip_special_tokens)
        if hasattr(ids, "tolist") and getattr(ids, "ndim", None) == 1:
            ids = ids.tolist()                       # a numpy array or a tensor of ids
        if not isinstance(ids, (list, tuple)) or not all(
                isinstance(t, numbers.Integral) and not isinstance(t, bool) for t in ids):
            raise SpecrtError("decode takes a list of token ids (ints)")
        vocab = self.target.cfg.vocab_size
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise SpecrtError(f"token id {int(bad[0])} is outside the model's vocabulary "
                              f"0..{vocab - 1}")
        return self._need_tokenizer("ids cannot be turned into text").decode(
            [int(t) for t in ids], skip_special_tokens=skip)

    def _check_fits(self, chars: int, what: str) -> None:
        """CapacityError for text too long to fit max_seq_len tokens, before tokenizing it."""
        most = self._need_tokenizer().max_chars(self.max_seq_len)
        if chars > most:
            raise TextTooLongError(what, chars, most, self.max_seq_len)

    def _need_tokenizer(self, without: str = "pass token ids instead of text") -> Tokenizer:
        """The tokenizer, or an error saying what cannot be done `without` it."""
        if self.tokenizer is None:
            raise SpecrtError(f"this model has no tokenizer (no tokenizer.json in its "
                              f"directory): {without}")
        return self.tokenizer

    # --- requests ---------------------------------------------------------------------------
    @keywords_checked
    def submit(self, prompt=None, *, messages: list[dict] | None = None,
               max_new_tokens: int = 128, temperature: float = 0.0, top_k: int = 0,
               top_p: float = 1.0, seed: int | None = None, stop: str | list[str] | None = None,
               chat: bool | None = None, speculative=None) -> TextRun:
        """Start one request; its chunks come from the returned run (`chunks()`). chat None:
        a text prompt goes through the chat template when the tokenizer has one (instruct
        models); chat=False sends the raw text. QueueFullError when `max_queue` requests
        already wait."""
        return self._start(self._prepare(prompt, messages, max_new_tokens, temperature, top_k,
                                         top_p, seed, stop, chat, speculative))

    def _prepare(self, prompt, messages, max_new_tokens, temperature, top_k, top_p, seed, stop,
                 chat, speculative) -> _Prepared:
        """`submit`'s request checked (as the engine that runs it will: its length too) and
        encoded, not queued yet."""
        max_new_tokens = check_max_new_tokens(max_new_tokens)
        params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
        spec = SpecConfig.parse(speculative)
        stops = check_stop(stop)
        ids = self.request_ids(prompt, messages, chat)
        text = TextStream(self.tokenizer, stops)
        request = Request(tuple(ids), max_new_tokens, params, spec, frozenset(self.eos_ids))
        scheduler = self._scheduler_for(spec)
        scheduler.check(request)
        return _Prepared(scheduler, request, text)

    def _start(self, prepared: _Prepared) -> TextRun:
        """Queue a prepared request (QueueFullError when the queue is full); the run keeps
        this LLM alive (`LLM(...).submit(...)` holds no other reference to it)."""
        return TextRun(prepared.scheduler.submit(prepared.request), prepared.text, owner=self)

    def request_ids(self, prompt=None, messages: list[dict] | None = None,
                    chat: bool | None = None) -> list[int]:
        """The token ids `submit` runs for a prompt or chat messages. chat None: a text prompt
        goes through the chat template when the tokenizer has one; chat=False: raw text."""
        chat = check_bool("chat", chat, allow_none=True)
        if isinstance(prompt, str) and not prompt:     # before a template wraps it in turns
            raise SpecrtError("the prompt is empty: give some text or at least one token id")
        if chat is False and messages is not None:
            raise SpecrtError("chat=False sends raw text, and messages always go through the "
                              "chat template: leave chat out, or pass the text as the prompt")
        if chat is None:
            chat = isinstance(prompt, str) and self.tokenizer is not None \
                and self.tokenizer.has_chat_template
        return self.encode(prompt, chat, messages)

    @given_once
    def prepare_all(self, prompt=None, **kwargs) -> list[_Prepared]:
        """generate's requests (LLM's and AsyncLLM's), every one checked and encoded before
        any runs: a bad prompt in a batch runs none of it. `start_in_batch` queues them."""
        check_request_kwargs(kwargs)
        submit = inspect.signature(self.submit)          # its defaults, for every prompt

        def prepare(p) -> _Prepared:
            args = submit.bind(p, **kwargs)
            args.apply_defaults()
            return self._prepare(**args.arguments)

        return [prepare(p) for p in (prompt if is_batch(prompt) else [prompt])]

    def start_in_batch(self, prepared: _Prepared,
                       runs: list[TextRun]) -> tuple[TextRun | None, TextRun | None]:
        """Queue a prepared request of a batch whose earlier requests are `runs`: (its run,
        None); or, the queue being full, (None, the oldest of `runs` still going), whose end
        makes room: read it to its end and call again. With none of them going, the queue is
        full of other callers' requests: QueueFullError."""
        try:
            return self._start(prepared), None
        except QueueFullError:
            going = next((r for r in runs if r.finish_reason is None), None)
            if going is None:
                raise
            return None, going

    @given_once
    def submit_stream(self, prompt=None, **kwargs) -> TextRun:
        """stream's request (LLM's and AsyncLLM's): the keywords checked, one prompt."""
        check_request_kwargs(kwargs)
        if is_batch(prompt):
            raise SpecrtError("stream takes one prompt; use generate for a batch")
        return self.submit(prompt, **kwargs)

    @given_once
    def generate(self, prompt=None, *extra, **kwargs):
        """Generate for one prompt (str, token ids, or messages=[...]) -> GenerationResult, or
        for a list of prompts -> list[GenerationResult], each equal to its single run (a
        batch of any size: what the queue cannot hold waits for room). Options by keyword."""
        check_positional("generate", extra)
        prepared = self.prepare_all(prompt, **kwargs)
        runs: list[TextRun] = []
        try:
            for p in prepared:        # a batch larger than the queue waits for room in it
                run, going = self.start_in_batch(p, runs)
                while run is None:
                    for _ in going.chunks():
                        pass
                    run, going = self.start_in_batch(p, runs)
                runs.append(run)
            for run in runs:
                for _ in run.chunks():
                    pass
        finally:
            for run in runs:     # an error or Ctrl-C: nobody will read the others (no-op for
                run.handle.cancel()                                  # the runs that finished)
        results = [run.result() for run in runs]
        return results if is_batch(prompt) else results[0]

    @given_once
    def stream(self, prompt=None, *extra, **kwargs) -> Iterator[StreamChunk]:
        """Yield a StreamChunk (text delta, token ids; finish reason and stats on the last) as
        each round commits, from the first `next()` on (the request is checked and submitted
        then; options by keyword). Closing or dropping the iterator cancels the request;
        several threads may step it at once (each chunk goes to one of them)."""
        check_positional("stream", extra)
        return Chunks(lambda: self.submit_stream(prompt, **kwargs))


@dataclasses.dataclass
class _Prepared:
    """A request checked and encoded, and the scheduler it runs on (`LLM._prepare`)."""

    scheduler: Scheduler
    request: Request
    text: TextStream


def is_batch(prompt) -> bool:
    """A list of prompts (texts, token-id lists, or 1-D numpy arrays or tensors of ids), not
    one prompt's token ids (numpy's integer scalars among them: 0-D)."""
    if not (isinstance(prompt, (list, tuple)) and len(prompt) > 0):
        return False
    first = prompt[0]
    return isinstance(first, (str, list, tuple)) or (
        hasattr(first, "tolist") and getattr(first, "ndim", None) == 1)


def _stop_engines(schedulers: dict) -> None:
    """An LLM's finalizer: close each of its schedulers without waiting for its thread."""
    for scheduler in list(schedulers.values()):
        scheduler.close(wait=False)


def _real(path: Path | None) -> str | None:
    return os.path.realpath(path) if path is not None else None
