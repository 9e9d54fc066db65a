"""The tokenizer side of a GGUF conversion: tokenizer files (through transformers' GGUF reader)
and generation_config.json's stop tokens. `specrt.hub.gguf_convert` calls these; they know
nothing about weights."""
from __future__ import annotations

import json
from pathlib import Path

from specrt.errors import UnsupportedGGUF


def write_tokenizer(gguf_path: Path, out_dir: Path, config: dict,
                    chat_template: str | None) -> None:
    """tokenizer.json, tokenizer_config.json and (when the GGUF has a chat template)
    chat_template.jinja, via transformers' GGUF reader."""
    from tokenizers import normalizers
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name,
                                        local_files_only=True)
    if config["model_type"] == "qwen2":
        # Upstream Qwen2 tokenizers NFC-normalize; GGUF has no field for it, so it is lost.
        tok.backend_tokenizer.normalizer = normalizers.NFC()
    tok.model_max_length = config["max_position_embeddings"]
    tok.chat_template = chat_template
    tok.save_pretrained(str(out_dir))
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


