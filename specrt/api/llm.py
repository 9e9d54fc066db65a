"""`specrt.LLM`: the public, text-level API that services embed.

    llm = specrt.LLM(model="DIR", draft="DRAFT_DIR")
    res = llm.generate("Write quicksort in Python", chat=True,
                       speculative={"method": "draft_model", "num_speculative_tokens": 4})
    res.token_ids, res.text, res.stats

This is the text edge: prompts may be strings (tokenized here, chat template optional) or
token-id lists; stop strings are matched here on the decoded text. Everything below it works
on token ids. One LLM may be shared by threads: generations are serialized by the engine's lock.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Iterator, Sequence

from specrt.api.text_stream import TextStream
from specrt.api.tokenizer import Tokenizer, check_compatible
from specrt.engine.engine import Engine, Generation
from specrt.errors import SpecrtError
from specrt.hub.resolve import resolve_model_dir, resolve_pair
from specrt.model.loader import parse_dtype
from specrt.model.transformer import Transformer
from specrt.spec.config import SpecConfig
from specrt.spec.sampling import SamplingParams


@dataclasses.dataclass
class GenerationResult:
    token_ids: list[int]      # new tokens only (an EOS token that ended the answer included)
    text: str                 # decoded new text, cut before any stop string
    finish_reason: str        # "eos", "stop" (a stop string) or "length"
    stats: dict               # see specrt.metrics


class LLM:
    def __init__(self, model: str | Path | None = None, draft: str | Path | None = None,
                 dtype: str = "float32", device: str = "cpu", max_seq_len: int = 4096,
                 max_batch_size: int = 1, cuda_graphs: bool | None = None):
        self.dtype = parse_dtype(dtype)
        self.device = _check_device(device)
        # No model: the default pair, fetched on first use.
        self.model_dir, draft_dir = resolve_pair(model, draft)
        self.target = Transformer.from_dir(self.model_dir, self.dtype, self.device, max_seq_len)
        self.tokenizer = Tokenizer(self.model_dir) if Tokenizer.available(self.model_dir) else None
        self.eos_ids = set(self.target.cfg.eos_token_ids)
        self.max_seq_len = max_seq_len
        # CUDA graphs for the draft loop: on by default on CUDA, meaningless elsewhere.
        self.cuda_graphs = (self.device.type == "cuda") if cuda_graphs is None else cuda_graphs
        self.draft_dir = draft_dir
        draft_model = self._load_draft(draft_dir) if draft_dir is not None else None
        self.engine = Engine(self.target, draft_model, max_batch_size, max_seq_len,
                             static=self.cuda_graphs)
        self._engines: dict[Path | None, Engine] = {self.draft_dir: self.engine}

    def _load_draft(self, draft_dir: Path) -> Transformer:
        draft_model = Transformer.from_dir(draft_dir, self.dtype, self.device, self.max_seq_len)
        draft_tok = Tokenizer(draft_dir) if Tokenizer.available(draft_dir) else None
        check_compatible(self.tokenizer, draft_tok, self.target.cfg.vocab_size,
                         draft_model.cfg.vocab_size, str(self.model_dir), str(draft_dir))
        return draft_model

    def _engine_for(self, spec: SpecConfig | None) -> Engine:
        """The engine to use: a speculative config naming another draft "model" gets its own
        engine sharing the target weights (each with its own caches), built once and kept."""
        if spec is None or spec.model is None:
            return self.engine
        draft_dir = resolve_model_dir(spec.model)
        if draft_dir not in self._engines:
            self._engines[draft_dir] = Engine(self.target, self._load_draft(draft_dir),
                                              self.engine.max_batch_size, self.max_seq_len,
                                              static=self.cuda_graphs)
        return self._engines[draft_dir]

    # --- requests ---------------------------------------------------------------------------
    def encode(self, prompt: str | Sequence[int], chat: bool = False) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise SpecrtError(f"{self.model_dir} has no tokenizer.json: pass token ids "
                                  "instead of text")
            ids = self.tokenizer.encode(prompt, chat=chat)
        else:
            ids = list(prompt)
            if not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
                raise SpecrtError("a token-id prompt must be a list of ints")
        if not ids:
            raise SpecrtError("the prompt is empty: give some text or at least one token id")
        return ids

    def start(self, prompts: list, max_new_tokens: int = 128, temperature: float = 0.0,
              top_k: int = 0, top_p: float = 1.0, seed: int | None = None,
              stop: str | list[str] | None = None, chat: bool = False,
              speculative=None) -> "_Run":
        """Low-level: begin a batch and return its runner (used by generate/stream/the CLI)."""
        params = SamplingParams(temperature=float(temperature), top_k=top_k, top_p=top_p,
                                seed=seed)
        spec = SpecConfig.parse(speculative)
        ids = [self.encode(p, chat) for p in prompts]
        engine = self._engine_for(spec)
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        gen = engine.generate(ids, max_new_tokens, params, spec, self.eos_ids)
        return _Run(gen, [TextStream(self.tokenizer, stops) for _ in ids], self.eos_ids)

    def generate(self, prompt, max_new_tokens: int = 128, temperature: float = 0.0,
                 top_k: int = 0, top_p: float = 1.0, seed: int | None = None,
                 stop: str | list[str] | None = None, chat: bool = False, speculative=None):
        """Generate for one prompt (str or token ids) -> GenerationResult, or for a list of
        prompts (at most max_batch_size, run as one batch) -> list[GenerationResult]."""
        batched = _is_batch(prompt)
        run = self.start(prompt if batched else [prompt], max_new_tokens, temperature, top_k,
                         top_p, seed, stop, chat, speculative)
        for _ in run.deltas():
            pass
        results = run.results()
        return results if batched else results[0]

    def stream(self, prompt, **kwargs) -> Iterator[str]:
        """Yield text deltas of one prompt as each round commits (multi-token chunks). Closing
        the iterator early abandons the request; the next call starts clean."""
        if _is_batch(prompt):
            raise SpecrtError("stream takes one prompt; use generate for a batch")
        run = self.start([prompt], **kwargs)
        try:
            for row, delta, _event in run.deltas():
                if delta:
                    yield delta
        finally:
            run.close()


def _is_batch(prompt) -> bool:
    return isinstance(prompt, (list, tuple)) and len(prompt) > 0 and \
        isinstance(prompt[0], (str, list, tuple))


def _check_device(device: str):
    import torch

    try:
        dev = torch.device(device)
    except RuntimeError as e:
        raise SpecrtError(f"invalid device {device!r}: {e}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SpecrtError(f"device {device!r} requested but CUDA is not available; use "
                          "--device cpu")
    return dev


class _Run:
    """One batch in flight: drives the engine's rounds and turns ids into text per row."""

    def __init__(self, gen: Generation, streams: list[TextStream], eos_ids: set[int]):
        self.gen = gen
        self.streams = streams
        self.eos_ids = eos_ids

    def deltas(self) -> Iterator[tuple[int, str, object]]:
        """Yield (row, text delta, RoundEvent) for every row after every round."""
        for event in self.gen:
            for row, ids in enumerate(event.new_tokens):
                stream = self.streams[row]
                was_stopped = stream.stopped
                delta = stream.push(ids, final=event.finished[row])
                if stream.stopped and not was_stopped:
                    # text past the stop string never reaches the caller; neither do its ids
                    self.gen.finish(row, keep=stream.stop_token_count)
                yield row, delta, event

    def close(self) -> None:
        self.gen.close()

    def results(self) -> list[GenerationResult]:
        out = []
        for row, stream in enumerate(self.streams):
            ids = self.gen.outputs[row]
            if stream.stopped:
                reason = "stop"
            elif ids and ids[-1] in self.eos_ids:
                reason = "eos"
            else:
                reason = "length"
            text = stream.text if stream.tokenizer is not None else ""
            out.append(GenerationResult(token_ids=list(ids), text=text, finish_reason=reason,
                                        stats=self.gen.stats_dict(row)))
        return out
