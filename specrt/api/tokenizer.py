"""Text <-> token ids at the edge of the system, plus the draft/target vocabulary check.

The engine never sees text. This wraps the model directory's `tokenizer.json` (through
transformers' fast tokenizer class, for its chat-template support); streaming detokenization
lives in `specrt.api.text_stream`.
"""
from __future__ import annotations

from pathlib import Path

from specrt.errors import SpecrtError


ROLES = ("system", "user", "assistant")


class Tokenizer:
    def __init__(self, model_dir: str | Path):
        model_dir = Path(model_dir)
        try:
            from transformers import AutoTokenizer
            from transformers.utils import logging as hf_logging

            # Quiet transformers' load-time notices for this call only: a host process's own
            # logging settings are not ours to change.
            verbosity = hf_logging.get_verbosity()
            hf_logging.set_verbosity_error()
            try:
                self._tok = AutoTokenizer.from_pretrained(str(model_dir))
            finally:
                hf_logging.set_verbosity(verbosity)
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
            return self.encode_messages([{"role": "user", "content": text}])
        return self._tok.encode(text)

    def encode_messages(self, messages: list[dict]) -> list[int]:
        """Chat messages [{"role": "system" | "user" | "assistant", "content": str}, ...]
        through the chat template, ending with the prompt for the assistant's next turn."""
        if not self.has_chat_template:
            raise SpecrtError("chat messages need a chat template, and this tokenizer has none; "
                              "pass a plain prompt instead")
        if not isinstance(messages, (list, tuple)) or not messages:
            raise SpecrtError("messages must be a non-empty list of {\"role\", \"content\"}")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or m.get("role") not in ROLES \
                    or not isinstance(m.get("content"), str):
                raise SpecrtError(f"message {i} must be {{\"role\": one of {', '.join(ROLES)}, "
                                  f"\"content\": a string}}, got {m!r}")
        text = self._tok.apply_chat_template([{"role": m["role"], "content": m["content"]}
                                              for m in messages],
                                             tokenize=False, add_generation_prompt=True)
        return self._tok.encode(text, add_special_tokens=False)

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
