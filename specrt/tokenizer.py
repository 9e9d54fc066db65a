"""Text <-> token ids at the edge of the system, plus the draft/target vocabulary check.

The engine never sees text. This wraps the model directory's `tokenizer.json` (through
transformers' fast tokenizer class, for its chat-template support) and adds the one thing a
streaming server needs: turning a growing list of ids into text deltas that never split a
multi-byte character and never show text past a stop string.
"""
from __future__ import annotations

from pathlib import Path

from specrt.errors import SpecrtError


class Tokenizer:
    def __init__(self, model_dir: str | Path):
        model_dir = Path(model_dir)
        try:
            from transformers import AutoTokenizer
            from transformers.utils import logging as hf_logging

            hf_logging.set_verbosity_error()
            self._tok = AutoTokenizer.from_pretrained(str(model_dir))
        except (OSError, ValueError) as e:
            raise SpecrtError(f"cannot load the tokenizer in {model_dir}: {e}") from None
        self.has_chat_template = bool(getattr(self._tok, "chat_template", None))

    @staticmethod
    def available(model_dir: str | Path) -> bool:
        return (Path(model_dir) / "tokenizer.json").is_file()

    def encode(self, text: str, chat: bool = False) -> list[int]:
        if chat:
            if not self.has_chat_template:
                raise SpecrtError("chat=True but this tokenizer has no chat template; "
                                  "pass chat=False (CLI: --no-chat)")
            text = self._tok.apply_chat_template([{"role": "user", "content": text}],
                                                 tokenize=False, add_generation_prompt=True)
            return self._tok.encode(text, add_special_tokens=False)
        return self._tok.encode(text)

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)

    def token_text(self, token_id: int) -> str:
        """How one token reads on its own (for traces)."""
        return self._tok.decode([token_id], skip_special_tokens=False)

    def vocab(self) -> dict[str, int]:
        return self._tok.get_vocab()

    def special_tokens(self) -> dict[str, int]:
        return {t: self._tok.convert_tokens_to_ids(t) for t in self._tok.all_special_tokens}


def check_compatible(target: Tokenizer | None, draft: Tokenizer | None,
                     target_vocab_size: int, draft_vocab_size: int,
                     target_name: str, draft_name: str) -> None:
    """Refuse a draft whose token ids mean something else to the target.

    Every id the draft tokenizer can emit must map to the same token string in the target's,
    and special tokens must agree. Embedding sizes may differ (checkpoints pad them).
    """
    if target is None or draft is None:
        if target_vocab_size != draft_vocab_size:
            raise SpecrtError(
                f"cannot check draft {draft_name} against target {target_name}: a tokenizer.json "
                f"is missing and their vocab sizes differ ({draft_vocab_size} vs "
                f"{target_vocab_size}); use a draft model with the target's tokenizer")
        return
    t_vocab, d_vocab = target.vocab(), draft.vocab()
    t_by_id = {i: tok for tok, i in t_vocab.items()}
    for tok, i in sorted(d_vocab.items(), key=lambda kv: kv[1]):
        if t_by_id.get(i) != tok:
            raise SpecrtError(
                f"draft model {draft_name} and target {target_name} have different vocabularies: "
                f"id {i} is {tok!r} for the draft but {t_by_id.get(i)!r} for the target. "
                "Speculative decoding compares token ids, so the draft must share the target's "
                "tokenizer (e.g. a smaller model of the same family)")
    if target.special_tokens() != draft.special_tokens():
        raise SpecrtError(
            f"draft model {draft_name} and target {target_name} have different special tokens "
            f"({draft.special_tokens()} vs {target.special_tokens()}); use a draft with the "
            "target's tokenizer")
    if max(d_vocab.values(), default=0) >= target_vocab_size:
        raise SpecrtError(f"draft tokenizer of {draft_name} emits ids beyond the target's "
                          f"vocab_size {target_vocab_size}")


class TextStream:
    """Incremental detokenization of one row, with stop strings.

    `push(ids)` returns the text that may be shown now. Text that could still turn into a stop
    string (a suffix that is a prefix of one) or that ends in an incomplete UTF-8 sequence is
    held back until the next push. After a stop string is found, `stopped` is set and the text
    before it is final.
    """

    def __init__(self, tokenizer: Tokenizer | None, stop: list[str] | None):
        self.tokenizer = tokenizer
        self.stop = [s for s in (stop or []) if s]
        if self.stop and tokenizer is None:
            raise SpecrtError("stop strings need a tokenizer, and this model directory has no "
                              "tokenizer.json")
        self.ids: list[int] = []
        self.text = ""          # text so far (cut before a stop string once stopped)
        self.emitted = 0        # characters of self.text already returned
        self.stopped = False
        self.stop_token_count: int | None = None   # ids needed to produce the kept text

    def push(self, ids: list[int], final: bool = False) -> str:
        if self.tokenizer is None or self.stopped:
            self.ids += ids
            return ""
        for t in ids:      # token by token, so a stop string is cut at the token completing it
            self.ids.append(t)
            if not self.stop:
                continue
            text = self.tokenizer.decode(self.ids)
            hit = min((i for i in (text.find(s) for s in self.stop) if i >= 0), default=-1)
            if hit >= 0:
                self.text = text[:hit]
                self.stopped = True
                self.stop_token_count = len(self.ids)
                return self._release(final=True)
        self.text = self.tokenizer.decode(self.ids)
        return self._release(final)

    def _release(self, final: bool) -> str:
        end = len(self.text)
        if not final:
            if self.text.endswith("\ufffd"):          # an unfinished multi-byte character
                end -= 1
            for s in self.stop:                       # a suffix that may grow into a stop string
                for n in range(min(len(s) - 1, end), 0, -1):
                    if self.text[:end].endswith(s[:n]):
                        end -= n
                        break
        end = max(end, self.emitted)
        delta = self.text[self.emitted:end]
        self.emitted = end
        return delta
