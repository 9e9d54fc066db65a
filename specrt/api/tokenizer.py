"""Text <-> token ids at the edge of the system, plus the draft/target vocabulary check.

The engine never sees text. This wraps the model directory's `tokenizer.json` (through
transformers' fast tokenizer class, for its chat-template support); streaming detokenization
lives in `specrt.api.text_stream`.
"""
from __future__ import annotations

import difflib
import functools
import inspect
import os
import re
from pathlib import Path

from specrt.checks import check_bool
from specrt.errors import SpecrtError, TokenizerFileError
from specrt.model.files import check_model_dir, read_json


ROLES = ("system", "user", "assistant")
_BYTE_TOKEN = re.compile(r"<0x[0-9A-F]{2}>")


_TOKEN_FIELDS = ("bos_token", "eos_token", "pad_token", "unk_token", "sep_token", "cls_token",
                 "mask_token")


class Tokenizer:
    def __init__(self, model_dir: str | Path):
        model_dir = Path(model_dir)
        check_model_dir(model_dir)
        _check_files(model_dir)
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
        except Exception as e:  # noqa: BLE001 - the `tokenizers` library raises bare Exception
            # The boundary of a third-party reader of user files: OSError, ValueError (JSON,
            # huggingface_hub's validation), KeyError/TypeError (a wrong schema) and tokenizers'
            # bare Exception all mean "these files are bad", and become one clear error.
            raise TokenizerFileError(
                f"cannot load the tokenizer in {model_dir} ({type(e).__name__}: "
                f"{_first_line(e)}); its tokenizer.json, tokenizer_config.json or config.json is "
                "malformed: re-download them from the model's source, or remove tokenizer.json to "
                "pass token ids only") from None
        self.model_dir = model_dir
        self.has_chat_template = bool(getattr(self._tok, "chat_template", None))
        self._longest: int | None = None      # characters of the longest vocabulary entry
        self._byte_ids: frozenset[int] | None = None

    def max_chars(self, tokens: int) -> int:
        """More characters than any text of `tokens` tokens has: each token stands for at most
        its longest vocabulary entry's characters, and a normalizer may merge a few code
        points into one (NFC), so 4x that. A longer prompt cannot fit, and is refused without
        tokenizing it (megabytes take tens of seconds)."""
        if self._longest is None:
            self._longest = max(map(len, self._tok.get_vocab()), default=1)
        return 4 * tokens * self._longest

    @staticmethod
    def available(model_dir: str | Path) -> bool:
        # lexists, not is_file: a FIFO or directory named tokenizer.json is reported, not skipped
        return os.path.lexists(Path(model_dir) / "tokenizer.json")

    def encode(self, text: str, chat: bool = False) -> list[int]:
        if chat:
            if not self.has_chat_template:
                raise SpecrtError("chat=True but this tokenizer has no chat template; "
                                  "pass chat=False (CLI: --no-chat)")
            return self.encode_messages([{"role": "user", "content": text}])
        return self._tok.encode(text)

    def encode_messages(self, messages: list[dict], **options) -> list[int]:
        """Chat messages [{"role": "system" | "user" | "assistant", "content": str}, ...]
        through the chat template, ending with the prompt for the assistant's next turn (the
        options: `chat_text`'s)."""
        return self._tok.encode(self.chat_text(messages, **options), add_special_tokens=False)

    def chat_text(self, messages: list[dict], add_generation_prompt: bool = True,
                  continue_final_message: bool = False,
                  template_kwargs: dict | None = None) -> str:
        """The text encode_messages() tokenizes: the messages through the chat template (for
        tools that take formatted text). As in vLLM and transformers: add_generation_prompt
        ends it with the prompt for the assistant's next turn; continue_final_message leaves
        the last message open so the answer continues it (an assistant's: a prefilled reply);
        template_kwargs are more variables for the template (e.g. a flag it reads)."""
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
        add_generation_prompt, continue_final_message = check_turn_options(
            add_generation_prompt, continue_final_message)
        extra = check_template_kwargs(template_kwargs)
        try:
            text = self._tok.apply_chat_template([{"role": m["role"], "content": m["content"]}
                                                  for m in messages], tokenize=False,
                                                 add_generation_prompt=add_generation_prompt,
                                                 continue_final_message=continue_final_message,
                                                 **extra)
        except Exception as e:  # noqa: BLE001 - the template is user code run by jinja2
            from jinja2 import TemplateError

            if type(e) is TemplateError:
                # exactly TemplateError (no subclass): the template's raise_exception(...)
                # refusing these messages on purpose, e.g. roles that do not alternate
                raise SpecrtError(f"the model's chat template refuses these messages: "
                                  f"{_first_line(e)}") from None
            if continue_final_message or extra:
                try:       # the template works without the options: they are to blame
                    self.chat_text(messages, add_generation_prompt)
                except SpecrtError:
                    pass
                else:
                    raise SpecrtError(
                        "the model's chat template fails with "
                        + " and ".join(["continue_final_message"] * continue_final_message
                                       + [f"chat_template_kwargs {sorted(extra)}"] * bool(extra))
                        + f" ({type(e).__name__}: {_first_line(e)}); leave them out") from None
            # a syntax error, an undefined name, or anything its expressions raise ({{ 1/0 }}):
            # the file's fault
            raise TokenizerFileError(
                f"the chat template in {self._template_file()} fails ({type(e).__name__}: "
                f"{_first_line(e)}); fix the template, or pass a plain prompt with chat=False "
                "(CLI: --no-chat)") from None
        return text

    def _template_file(self) -> Path:
        for name in ("chat_template.jinja", "chat_template.json"):
            if (self.model_dir / name).exists():
                return self.model_dir / name
        return self.model_dir / "tokenizer_config.json"

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def byte_ids(self) -> frozenset[int]:
        """Ids of byte-fallback tokens ("<0xE4>"), which the decoder joins into characters
        (SentencePiece models: Llama, Mistral); none for byte-level BPE (Qwen2's)."""
        if self._byte_ids is None:
            vocab = self._tok.get_vocab()
            ids = frozenset(i for t, i in vocab.items() if _BYTE_TOKEN.fullmatch(t))
            probe = vocab.get("<0x41>")               # decodes to "A" where bytes are joined
            self._byte_ids = ids if probe is not None and self._tok.decode([probe]) == "A" \
                else frozenset()
        return self._byte_ids

    def token_strs(self, ids: list[int]) -> list[str]:
        """Each id's vocabulary entry, as stored (byte-level BPE: "Ġthe" for " the")."""
        return self._tok.convert_ids_to_tokens(ids)

    def token_text(self, token_id: int) -> str:
        """How one token reads on its own (for traces)."""
        return self._tok.decode([token_id], skip_special_tokens=False)

    def vocab(self) -> dict[str, int]:
        return self._tok.get_vocab()

    def check_fits(self, vocab_size: int) -> None:
        """Refuse a tokenizer that emits ids past the model's embedding rows: it belongs to
        another model (otherwise a text prompt fails later, blaming the prompt's ids)."""
        top = max(self.vocab().values(), default=-1)
        if top >= vocab_size:
            raise TokenizerFileError(
                f"the tokenizer in {self.model_dir} emits ids up to {top}, past the model's "
                f"vocab_size {vocab_size} (config.json): it belongs to another model; use the "
                "model's own tokenizer files")

    def special_tokens(self) -> dict[str, int]:
        return {t: self._tok.convert_tokens_to_ids(t) for t in self._tok.all_special_tokens}

    def special_ids(self) -> list[int]:
        """Ids of the special and added tokens (chat markers, EOS, tool tags, ...)."""
        added = getattr(self._tok, "added_tokens_decoder", {}) or {}
        return sorted(set(self.special_tokens().values()) | set(added))


@functools.cache
def _template_reserved() -> frozenset[str]:
    """Names a template variable may not take: the parameters of transformers' chat-template
    calls (a variable of one of those names would change how they run, or fail in them),
    and `messages`, which the template reads."""
    from transformers import PreTrainedTokenizerBase
    from transformers.utils import chat_template_utils

    calls = [PreTrainedTokenizerBase.apply_chat_template,
             getattr(chat_template_utils, "render_jinja_template", None)]
    names = {"self", "messages"}
    for call in filter(None, calls):
        names |= {p.name for p in inspect.signature(call).parameters.values()
                  if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
    return frozenset(names)


def check_template_kwargs(kwargs) -> dict:
    """chat_template_kwargs: None or {name: JSON-like value}, named like a template variable
    and none of apply_chat_template's own parameters."""
    if kwargs is None:
        return {}
    if not isinstance(kwargs, dict):
        raise SpecrtError(f"chat_template_kwargs must be an object of template variables, got "
                          f"{type(kwargs).__name__}")
    for name in kwargs:
        if not isinstance(name, str) or not name.isidentifier():
            raise SpecrtError(f"chat_template_kwargs: {name!r} is not a template variable name")
        if name in _template_reserved():
            raise SpecrtError(f"chat_template_kwargs may not set {name!r}: it is a parameter of "
                              "the template's call, not a variable"
                              + ("; use the request's field of that name"
                                 if name in ("add_generation_prompt", "continue_final_message")
                                 else ""))
    return dict(kwargs)


def check_turn_options(add_generation_prompt, continue_final_message) -> tuple[bool, bool]:
    """(add_generation_prompt, continue_final_message), checked: booleans, and not both on.
    One wording for a Python caller and a server's JSON request alike."""
    add_generation_prompt = check_bool("add_generation_prompt", add_generation_prompt)
    continue_final_message = check_bool("continue_final_message", continue_final_message)
    if continue_final_message and add_generation_prompt:
        raise SpecrtError("continue_final_message continues the last message, and "
                          "add_generation_prompt (on by default) starts a new one: turn "
                          "add_generation_prompt off")
    return add_generation_prompt, continue_final_message


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:200] if text else "no details"


def _check_files(model_dir: Path) -> None:
    """The shapes transformers assumes without checking, checked before it reads the files."""
    fix = "re-download the tokenizer files from the model's source"
    path = model_dir / "tokenizer.json"
    tok = read_json(path, "tokenizer", fix=fix, error=TokenizerFileError)
    added = tok.get("added_tokens")
    if not isinstance(tok.get("model"), dict) or not isinstance(added, list) or not all(
            isinstance(t, dict) and isinstance(t.get("id"), int)
            and isinstance(t.get("content"), str) for t in added):
        raise TokenizerFileError(
            f"{path} is not a tokenizers file: it needs a \"model\" object and an "
            f"\"added_tokens\" list of {{\"id\": int, \"content\": str}}; {fix}")
    path = model_dir / "tokenizer_config.json"
    if not os.path.lexists(path):
        return
    cfg = read_json(path, "tokenizer config", fix=fix, error=TokenizerFileError)

    def bad(key, want):
        raise TokenizerFileError(f"{path}: {key} must be {want}, got {cfg[key]!r:.80}; {fix}")

    template = cfg.get("chat_template")
    if template is not None and not isinstance(template, str) and not (
            isinstance(template, list) and all(isinstance(t, dict) and isinstance(
                t.get("name"), str) and isinstance(t.get("template"), str) for t in template)):
        bad("chat_template", "a string or a list of {\"name\", \"template\"}")
    for key in _TOKEN_FIELDS:
        if cfg.get(key) is not None and not isinstance(cfg[key], (str, dict)):
            bad(key, "a token string or an added-token object")
    length = cfg.get("model_max_length")
    if length is not None and (isinstance(length, bool) or not isinstance(length, (int, float))
                               or length <= 0):
        bad("model_max_length", "a positive number")
    for key, kind in (("added_tokens_decoder", dict), ("tokenizer_class", str)):
        if cfg.get(key) is not None and not isinstance(cfg[key], kind):
            bad(key, f"a JSON {'object' if kind is dict else 'string'}")
    extra = cfg.get("additional_special_tokens", cfg.get("extra_special_tokens"))
    if extra is not None and not isinstance(extra, (list, dict)):
        bad("additional_special_tokens" if "additional_special_tokens" in cfg
            else "extra_special_tokens", "a list of token strings")
    _check_named_tokens(path, cfg, tok)


def _check_named_tokens(path: Path, cfg: dict, tok: dict) -> None:
    """A token field (eos_token, ...) of tokenizer_config.json must name a token of
    tokenizer.json: transformers adds one it lacks as a new token at the next free id, so a
    typo ("<|im_end>") became an id past the model's vocabulary, blamed on the whole tokenizer
    ("it belongs to another model"), or an EOS no answer ever ends with."""
    known = _file_tokens(tok)
    if known is None:                   # a vocabulary layout not read here
        return
    for key in _TOKEN_FIELDS:
        value = cfg.get(key)
        value = value.get("content") if isinstance(value, dict) else value
        if isinstance(value, str) and value not in known:
            specials = [t["content"] for t in tok["added_tokens"]]
            close = difflib.get_close_matches(value, specials, n=1, cutoff=0.6)
            raise TokenizerFileError(
                f"{path}: {key} {value!r:.80} is not a token of tokenizer.json"
                + (f" (did you mean {close[0]!r}?)" if close else "")
                + "; correct it, or re-download the tokenizer files from the model's source")


def _file_tokens(tok: dict) -> set[str] | None:
    """The tokens of a tokenizers file: its model's vocabulary (BPE and WordPiece: an object
    of token -> id; Unigram: a list of [token, score]) and its added tokens; None for a layout
    not known here."""
    vocab = tok["model"].get("vocab")
    if isinstance(vocab, dict):
        tokens = set(vocab)
    elif isinstance(vocab, list) and all(isinstance(v, list) and v for v in vocab):
        tokens = {v[0] for v in vocab}
    else:
        return None
    return tokens | {t["content"] for t in tok["added_tokens"]}


def check_compatible(target: Tokenizer | None, draft: Tokenizer | None,
                     target_vocab_size: int, draft_vocab_size: int,
                     target_name: str, draft_name: str) -> None:
    """Refuse a draft whose token ids mean something else to the target.

    Every id the draft tokenizer can emit must map to the same token string in the target's,
    and every token either one calls special must have the same id in both. Embedding sizes
    may differ (checkpoints pad them).
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
    # Which tokens each config *names* special may differ (a base model's eos_token is
    # <|endoftext|>, its instruct model's <|im_end|>): the target alone decides where an answer
    # ends. What must agree is the id of every token either one calls special.
    for tok in sorted(set(target.special_tokens()) | set(draft.special_tokens())):
        if t_vocab.get(tok) != d_vocab.get(tok):
            raise SpecrtError(
                f"draft model {draft_name} and target {target_name} disagree on the special "
                f"token {tok!r}: id {d_vocab.get(tok)} for the draft, {t_vocab.get(tok)} for "
                "the target; use a draft with the target's tokenizer")
    if max(d_vocab.values(), default=0) >= target_vocab_size:
        raise SpecrtError(f"draft tokenizer of {draft_name} emits ids beyond the target's "
                          f"vocab_size {target_vocab_size}")
