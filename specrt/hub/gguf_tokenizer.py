"""The tokenizer side of a GGUF conversion: tokenizer files (through transformers' GGUF reader)
and generation_config.json's stop tokens. `specrt.hub.gguf_convert` calls these; they know
nothing about weights. The tokenizer is built (and so its metadata checked) before anything is
written, and saved with its write failures as OSError."""
from __future__ import annotations

import errno
import json
import logging
import os
import re
from pathlib import Path

from specrt.errors import UnsupportedGGUF

log = logging.getLogger(__name__)

# The fix named by every "this metadata is malformed" message.
REMAKE = ("the file is damaged or was not written by llama.cpp's convert_hf_to_gguf.py; "
          "download it again or re-create it")


# --- the tokenizer: built (and so checked) before anything is written ---------------------
def _strings(reader, key: str) -> list[str] | None:
    """String-array metadata `key` (None when absent), each entry decoded as strict UTF-8."""
    from gguf import GGUFValueType

    field = reader.fields.get(key)
    if field is None:
        return None
    if field.types == [GGUFValueType.ARRAY] and not field.data:
        return []                                  # an empty array names no element type
    if field.types[0] != GGUFValueType.ARRAY or field.types[-1] != GGUFValueType.STRING:
        raise UnsupportedGGUF(f"GGUF metadata {key!r} must be an array of strings; {REMAKE}")
    out = []
    for i, idx in enumerate(field.data):
        try:
            out.append(bytes(field.parts[idx]).decode("utf-8"))
        except UnicodeDecodeError as e:
            raise UnsupportedGGUF(f"GGUF metadata {key}[{i}] is not UTF-8 (byte "
                                  f"{e.object[e.start]:#04x} at {e.start}); {REMAKE}") from None
    return out


def _spellings(tokens: list[str]) -> set[str]:
    """Every name a token may have in the BPE vocabulary transformers builds: as stored, or
    (byte-level BPE) respelled in GPT-2's byte alphabet when it uses other characters."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    spelling = bytes_to_unicode()
    alphabet = set(spelling.values())
    respelled = {"".join(spelling[b] for b in t.encode("utf-8"))
                 for t in tokens if not set(t) <= alphabet}
    return set(tokens) | respelled


def _check_merges(tokens: list[str], merges: list[str]) -> None:
    """Merge "a b" needs a, b and ab in the vocabulary: a missing ab makes the Rust tokenizers
    panic (a long backtrace on stderr) instead of raising, so it is refused here first."""
    vocab = _spellings(tokens)  # a superset of the real vocabulary: never refuses a good file
    for i, merge in enumerate(merges):
        pair = merge.split(" ")
        if len(pair) != 2:
            raise UnsupportedGGUF(f"GGUF metadata tokenizer.ggml.merges[{i}] {merge!r} is not "
                                  f"two tokens separated by one space; {REMAKE}")
        for token in (*pair, "".join(pair)):
            if token not in vocab:
                raise UnsupportedGGUF(
                    f"GGUF metadata tokenizer.ggml.merges[{i}] {merge!r} needs the token "
                    f"{token!r}, which tokenizer.ggml.tokens lacks; {REMAKE}")


def _check_tokenizer_metadata(reader, vocab_size: int) -> None:
    """Refuse, naming the key, the tokenizer metadata known to break transformers' reader, and
    a vocabulary larger than the model's embedding (`vocab_size` rows; fewer tokens than rows
    is padding, as Qwen2's checkpoints have)."""
    tokens = _strings(reader, "tokenizer.ggml.tokens")
    if tokens is None:
        raise UnsupportedGGUF("GGUF metadata lacks 'tokenizer.ggml.tokens'")
    if not tokens:
        raise UnsupportedGGUF(f"GGUF metadata 'tokenizer.ggml.tokens' is empty; {REMAKE}")
    for key, field in reader.fields.items():    # bos, eos, unknown, padding, separator ...
        if key.startswith("tokenizer.ggml.") and key.endswith("_token_id"):
            value = field.contents()
            if not isinstance(value, int) or isinstance(value, bool) \
                    or not 0 <= value < len(tokens):
                raise UnsupportedGGUF(f"GGUF metadata {key!r} is {repr(value)[:40]}, but the "
                                      f"token ids run from 0 to {len(tokens) - 1}; {REMAKE}")
    if len(tokens) > vocab_size:
        raise UnsupportedGGUF(f"GGUF metadata tokenizer.ggml.tokens has {len(tokens)} entries, "
                              f"but token_embd.weight has {vocab_size} rows: the tokenizer "
                              f"would emit ids the model has no embedding for; {REMAKE}")
    merges = _strings(reader, "tokenizer.ggml.merges")
    if merges is None and "tokenizer.ggml.scores" not in reader.fields:
        raise UnsupportedGGUF("GGUF metadata has neither 'tokenizer.ggml.merges' nor "
                              f"'tokenizer.ggml.scores', so it describes no tokenizer; {REMAKE}")
    if merges is not None:
        _check_merges(tokens, merges)


def _is_panic(e: BaseException) -> bool:
    """A Rust panic in `tokenizers`: pyo3's PanicException derives from BaseException only."""
    return type(e).__name__ == "PanicException"


def _failure(e: BaseException) -> str:
    """`Type: first line of the message`, at most ~200 characters, for one-line errors."""
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0][:200]}" if lines else type(e).__name__


def _build_tokenizer(gguf_path: Path, config: dict, chat_template: str | None):
    """transformers' tokenizer for the GGUF's metadata, set up as the converted model's."""
    from tokenizers import normalizers
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name,
                                        local_files_only=True)
    if config["model_type"] == "qwen2":
        # Upstream Qwen2 tokenizers NFC-normalize; GGUF has no field for it, so it is lost.
        tok.backend_tokenizer.normalizer = normalizers.NFC()
    tok.model_max_length = config["max_position_embeddings"]
    tok.chat_template = chat_template
    return tok


def load_tokenizer(reader, gguf_path: Path, config: dict, chat_template: str | None):
    """The converted model's tokenizer, built before anything is written. Any failure to build
    it, a Rust panic included (never KeyboardInterrupt/SystemExit), is UnsupportedGGUF."""
    _check_tokenizer_metadata(reader, config["vocab_size"])
    try:
        tok = _build_tokenizer(gguf_path, config, chat_template)
    except UnsupportedGGUF:
        raise
    except BaseException as e:
        if not (isinstance(e, Exception) or _is_panic(e)):
            raise
        log.debug("building the tokenizer of %s failed", gguf_path, exc_info=True)
        raise UnsupportedGGUF(f"the GGUF's tokenizer metadata cannot be read ({_failure(e)}); "
                              f"{REMAKE}") from None
    # what loading the result checks (Tokenizer.check_fits), here before anything is written
    top = max(tok.get_vocab().values(), default=-1)
    if top >= config["vocab_size"]:
        raise UnsupportedGGUF(f"the GGUF's tokenizer, as transformers builds it, has ids up to "
                              f"{top}, past the {config['vocab_size']} rows of token_embd.weight "
                              "(a tokenizer model that adds tokens the vocabulary lacks, such "
                              f"as 'llama' without <s>, </s>, <unk>?); {REMAKE}")
    return tok


def _os_error(e: BaseException, path: Path) -> OSError:
    """The OSError behind a write failure the Rust tokenizers report as a plain Exception,
    e.g. "No space left on device (os error 28)"; EIO when the message names no errno."""
    found = re.search(r"os error (\d+)", str(e))
    if found:
        code = int(found.group(1))
        return OSError(code, os.strerror(code), str(path))
    return OSError(errno.EIO, f"cannot write the tokenizer ({_failure(e)})", str(path))


def save_tokenizer(tok, out_dir: Path, chat_template: str | None) -> None:
    """tokenizer.json, tokenizer_config.json and (when the GGUF has a chat template)
    chat_template.jinja. A failed write is an OSError naming the file (ENOSPC: disk full)."""
    try:
        tok.save_pretrained(str(out_dir))
    except OSError:
        raise
    except BaseException as e:
        if not (isinstance(e, Exception) or _is_panic(e)):
            raise
        raise _os_error(e, out_dir / "tokenizer.json") from None
    # transformers 5 writes the template to chat_template.jinja only; readers that use plain
    # `tokenizers` + jinja2 expect it inline, as upstream Qwen ships it.
    cfg_path = out_dir / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    for key in ("is_local", "local_files_only"):  # artefacts of loading from a local path
        cfg.pop(key, None)
    if chat_template is not None:
        cfg["chat_template"] = chat_template
    cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")


# Qwen's end of a chat turn and end of text: stop tokens too when the vocabulary has them.
QWEN_STOPS = ("<|im_end|>", "<|endoftext|>")


def generation_config(config: dict, token_ids: dict[str, int], pad: int | None = None) -> dict:
    """Stop on the GGUF's eos token and, like Qwen's, on <|im_end|> and <|endoftext|> when the
    vocabulary has them. Pad with <|endoftext|> when there is one, else the GGUF's `pad`.

    No sampling settings: the GGUF does not carry them, so transformers defaults to greedy.
    """
    eos = [config["eos_token_id"]]
    eos += [token_ids[t] for t in QWEN_STOPS if t in token_ids and token_ids[t] not in eos]
    pad = token_ids.get("<|endoftext|>", pad)
    gen = {"bos_token_id": config["bos_token_id"], "pad_token_id": pad, "eos_token_id": eos}
    return {k: v for k, v in gen.items() if v is not None}


def special_token_ids(reader, names: tuple[str, ...]) -> dict[str, int]:
    """{name: id} of those `names` the vocabulary holds (possibly none)."""
    field, found = reader.fields.get("tokenizer.ggml.tokens"), {}
    if field is None:
        raise UnsupportedGGUF("GGUF metadata lacks 'tokenizer.ggml.tokens'")
    # Special tokens sit at the end of the vocabulary: scan backwards, decoding only what we pass.
    for idx in range(len(field.data) - 1, -1, -1):
        text = bytes(field.parts[field.data[idx]]).decode("utf-8", "replace")
        if text in names:
            found[text] = idx
            if len(found) == len(names):
                break
    return found


