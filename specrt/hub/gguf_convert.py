"""Convert a llama.cpp GGUF file of a Qwen2 or Llama model into a Hugging Face-style directory.

The output directory holds `config.json`, `generation_config.json`, `tokenizer.json`,
`tokenizer_config.json` (with the chat template inline, when the GGUF has one),
`chat_template.jinja` (likewise), a single
`model.safetensors` in bfloat16, loadable by `transformers` and by specrt's own loader, and
`specrt-checksum.json`, its sha256, which specrt's loader verifies.

Weights are dequantized tensor by tensor (in row chunks) with `gguf.quants.dequantize` and
rounded to bf16 with torch's round-to-nearest-even, so every output tensor equals
`dequantize(...)` rounded to bf16 exactly. The safetensors file is written as a stream, one
tensor after another, because holding the whole bf16 model in memory (3.1 GB for the 1.5B,
twice that while `save_file` runs next to the memory-mapped GGUF) is what we avoid: peak RSS
stays near the largest tensor in fp32 plus the pages of the GGUF the kernel has mapped in.

llama.cpp's converter permutes the q/k rows of the llama architecture (within each head,
rotate-half order becomes interleaved pairs: `LlamaModel.permute`), but not those of qwen2 (both
models use the same rotate-half rope). So qwen2 tensors are only renamed; llama q/k rows are put
back with `unpermute_rows`, head by head. A GGUF without `output.weight` has tied embeddings.
GGUF lists dimensions fastest-first; the arrays `GGUFReader` exposes are already row-major
[out, in], which is the Hugging Face layout.

This module knows nothing about where GGUF files come from (see `specrt.hub.fetch`).
"""
from __future__ import annotations

import errno
import functools
import hashlib
import json
import math
import os
import re
import shutil
import struct
import tempfile
from pathlib import Path

import numpy as np
import torch

from specrt.errors import ConfigError, SpecrtError, UnsupportedGGUF
from specrt.hub.gguf_header import check_header, shown
from specrt.hub.gguf_tokenizer import (QWEN_STOPS, REMAKE as _REMAKE, generation_config,
                                      load_tokenizer, save_tokenizer, special_token_ids)
from specrt.model import checksum
from specrt.model.files import check_regular, umask

# Elements dequantized at once: bounds the fp32 scratch (64 MiB) for the 151936-row embeddings.
_CHUNK_ELEMENTS = 1 << 24

# llama.cpp tensor name (inside `blk.N.` for per-layer ones) -> Hugging Face name.
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_LAYER_RE = re.compile(r"blk\.(\d+)\.(.+)")


ARCHITECTURES = {"qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM"}


def hf_name(gguf_name: str) -> str:
    """Hugging Face parameter name of a llama.cpp tensor name, e.g. blk.3.attn_q.bias."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = _LAYER_RE.fullmatch(gguf_name)
    if m and m.group(2) in _LAYER_NAMES:
        return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}"
    raise UnsupportedGGUF(f"unexpected tensor {shown(gguf_name)}")


_REQUIRED = object()


def _field(reader, key: str, default=_REQUIRED):
    field = reader.fields.get(key)
    if field is None:
        if default is not _REQUIRED:
            return default
        raise UnsupportedGGUF(f"GGUF metadata lacks {key!r}")
    try:
        return field.contents()
    except (ValueError, IndexError) as e:  # e.g. a string that is not UTF-8
        raise UnsupportedGGUF(f"GGUF metadata {key!r} cannot be read ({e}); {_REMAKE}") from None


def _stored_as(reader, key: str, value) -> str:
    """How the file stores `key`, for messages: e.g. "string 'two'"."""
    kind = reader.fields[key].types[0].name.lower()
    text = repr(value)
    return f"{kind} {text if len(text) <= 40 else text[:37] + '...'}"


def _number(reader, key: str, kind: type, default=_REQUIRED):
    """Numeric metadata `key` as `kind` (int or float); `default` when the key is absent.
    A string, array, bool, float (for int, even 1.0) or non-finite value is refused, naming
    the key."""
    value = _field(reader, key, default)
    if key not in reader.fields:
        return value
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok and kind is int:
        ok = isinstance(value, int)     # llama.cpp stores counts as integers, never as floats
    if not ok:
        want = "an integer" if kind is int else "a finite number"
        raise UnsupportedGGUF(f"GGUF metadata {key!r} must be {want}, but the file stores "
                              f"{_stored_as(reader, key, value)}; {_REMAKE}")
    return kind(value)


def _string(reader, key: str, default=_REQUIRED):
    """String metadata `key` (or `default` when absent); any other type is refused."""
    value = _field(reader, key, default)
    if key in reader.fields and not isinstance(value, str):
        raise UnsupportedGGUF(f"GGUF metadata {key!r} must be a string, but the file stores "
                              f"{_stored_as(reader, key, value)}; {_REMAKE}")
    return value


def _f32(x: float) -> float:
    # GGUF stores these as float32: 1e-6 reads back as 9.999999974752427e-07.
    return float(str(np.float32(x)))


def _check_rope(reader, arch: str, head_dim: int) -> None:
    """Refuse what specrt's rope cannot do: scaled or partial rotary embeddings."""
    scaling = _field(reader, f"{arch}.rope.scaling.type", "none")
    if scaling not in ("none", ""):
        raise UnsupportedGGUF(f"rope scaling {scaling!r} is not supported (plain rope only)")
    if any(t.name == "rope_freqs.weight" for t in reader.tensors):
        raise UnsupportedGGUF("rope frequency factors (rope_freqs.weight, Llama 3.1-style rope "
                              "scaling) are not supported (plain rope only)")
    rot = _number(reader, f"{arch}.rope.dimension_count", int, head_dim)
    if rot != head_dim:
        raise UnsupportedGGUF(f"partial rotary embeddings ({arch}.rope.dimension_count {rot}, "
                              f"head_dim {head_dim}) are not supported")


def read_config(reader) -> dict:
    """config.json contents for the model in an open `gguf.GGUFReader`."""
    arch = _string(reader, "general.architecture")
    if arch not in ARCHITECTURES:
        raise UnsupportedGGUF(f"architecture {arch!r} is not supported; specrt converts "
                              f"{' and '.join(map(repr, ARCHITECTURES))} GGUFs")
    names = {t.name: t for t in reader.tensors}
    if "token_embd.weight" not in names:
        raise UnsupportedGGUF("GGUF has no token_embd.weight")
    embd_shape = names["token_embd.weight"].shape.tolist()  # fastest-first: [hidden, vocab]
    if len(embd_shape) != 2:
        raise UnsupportedGGUF(f"token_embd.weight has shape {embd_shape[::-1]}, but it must "
                              f"be 2-D [vocab, hidden]; {_REMAKE}")

    def key(name: str, default=_REQUIRED, kind: type = int):
        return _number(reader, f"{arch}.{name}", kind, default)

    hidden, heads = key("embedding_length"), key("attention.head_count")
    head_dim = _head_dim(arch, key("attention.key_length", 0), hidden, heads)
    _check_rope(reader, arch, head_dim)
    n_layers = key("block_count")
    bos = _number(reader, "tokenizer.ggml.bos_token_id", int, None)
    config = {
        "architectures": [ARCHITECTURES[arch]],
        "model_type": arch,
        "vocab_size": int(embd_shape[1]),
        "hidden_size": hidden,
        "intermediate_size": key("feed_forward_length"),
        "num_hidden_layers": n_layers,
        "num_attention_heads": heads,
        "num_key_value_heads": key("attention.head_count_kv", heads),
        "hidden_act": "silu",
        "attention_bias": arch == "qwen2",
        "attention_dropout": 0.0,
        "rms_norm_eps": _f32(key("attention.layer_norm_rms_epsilon", kind=float)),
        "rope_theta": _f32(key("rope.freq_base", 10000.0, kind=float)),
        "rope_scaling": None,
        "max_position_embeddings": key("context_length"),
        "tie_word_embeddings": "output.weight" not in names,
        "bos_token_id": bos,
        "eos_token_id": _number(reader, "tokenizer.ggml.eos_token_id", int),
        "initializer_range": 0.02,
        "use_cache": True,
        "torch_dtype": "bfloat16",
        "dtype": "bfloat16",
    }
    if head_dim != hidden // heads:
        config["head_dim"] = head_dim
    if arch == "qwen2":
        config.update(use_sliding_window=False, sliding_window=None, max_window_layers=n_layers)
    else:
        config.update(mlp_bias=False, pretraining_tp=1)
    return config


def _head_dim(arch: str, key_length: int, hidden: int, heads: int) -> int:
    """Per-head width: `{arch}.attention.key_length`, else hidden / heads; rope needs it even."""
    if heads < 1:
        raise UnsupportedGGUF(f"GGUF metadata {arch}.attention.head_count is {heads}, but it "
                              f"must be at least 1; {_REMAKE}")
    if key_length:
        head_dim, source = key_length, f"{arch}.attention.key_length is {key_length}"
    else:
        head_dim = hidden // heads
        source = (f"{arch}.embedding_length / {arch}.attention.head_count is "
                  f"{hidden} / {heads} = {head_dim}")
    if head_dim % 2:
        raise UnsupportedGGUF(f"GGUF metadata {source}, but rope needs an even head "
                              f"dimension; {_REMAKE}")
    return head_dim


def permuted_rows(config: dict) -> dict[str, int]:
    """{hf_name: rows per head} of the tensors llama.cpp permuted (llama q_proj, k_proj)."""
    if config["model_type"] != "llama":
        return {}
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    return {f"model.layers.{n}.self_attn.{proj}_proj.weight": head_dim
            for n in range(config["num_hidden_layers"]) for proj in ("q", "k")}


def unpermute_rows(w: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Inverse of llama.cpp's `LlamaModel.permute` for rows [n_head * head_dim, ...]:
    it maps each head's rows (i, half h) to 2 * i + h; this puts them back."""
    shape = w.shape
    n_head = shape[0] // head_dim
    return w.reshape(n_head, head_dim // 2, 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def expected_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """Every parameter the converted checkpoint holds, with its [out, in] shape: the loader's
    own table for this config, so the two can never disagree."""
    from specrt.model.config import ModelConfig
    from specrt.model.loader import expected_shapes as loader_shapes

    try:
        model_config = ModelConfig.from_dict(config, source="GGUF metadata")
    except ConfigError as e:  # the values come from the GGUF: report them as its problem
        raise UnsupportedGGUF(str(e)) from None
    return loader_shapes(model_config)


def plan_tensors(reader, config: dict) -> list[tuple[str, object, tuple[int, ...]]]:
    """[(hf_name, ReaderTensor, shape)] in file order, checked against the config.

    Fails before anything is written if a tensor is missing, unknown or mis-shaped.
    """
    want = expected_shapes(config)
    plan = []
    for t in reader.tensors:
        name = hf_name(t.name)
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))  # GGUF dims are fastest-first
        if name not in want:
            raise UnsupportedGGUF(
                f"tensor {shown(t.name)}: the model the metadata describes has no parameter "
                f"{shown(name)} ({config['num_hidden_layers']} layers); {_REMAKE}")
        if want[name] != shape:
            raise UnsupportedGGUF(
                f"{shown(t.name)} -> {shown(name)}: shape {shape}, config wants "
                f"{want[name]}")
        if not _can_dequantize(t.tensor_type):
            raise UnsupportedGGUF(f"{t.name} is stored as {t.tensor_type.name}, which specrt "
                                  "cannot convert; use a GGUF whose tensors are F32, F16, BF16 "
                                  "or a llama.cpp quantization such as Q8_0 or Q4_K_M")
        plan.append((name, t, shape))
    missing = sorted(set(want) - {name for name, _, _ in plan})
    if missing:
        raise UnsupportedGGUF(f"GGUF lacks {len(missing)} tensors, e.g. {missing[:3]}")
    _check_tensor_data(reader)
    return plan


def _check_tensor_data(reader) -> None:
    """Every tensor's data lies inside the file's data section, at an offset aligned as the
    file states, and apart from every other tensor's: the reader takes the offsets on trust,
    so overlapping or wrapped-around ones would convert other bytes (the header's, another
    tensor's) into weights."""
    size = len(reader.data)                     # the whole file, memory-mapped as bytes
    spans = []
    for t in reader.tensors:
        offset = int(t.field.parts[-1][0])                   # relative to the data section
        n_bytes = int(t.n_bytes)
        where = (f"is not a multiple of the alignment {reader.alignment}"
                 if offset % reader.alignment else
                 f"puts its {n_bytes} bytes past the end of the file ({size} bytes)"
                 if reader.data_offset + offset + n_bytes > size else None)
        if where:
            raise UnsupportedGGUF(f"tensor {t.name}: its data offset {offset} {where}; "
                                  f"{_REMAKE}")
        spans.append((offset, offset + n_bytes, t.name))
    spans.sort()
    for (_, end, first), (start, _, second) in zip(spans, spans[1:]):
        if start < end:
            raise UnsupportedGGUF(f"tensors {first} and {second} overlap in the file's data; "
                                  f"{_REMAKE}")


@functools.cache
def _can_dequantize(qtype) -> bool:
    """Whether `gguf.quants.dequantize` knows `qtype` (not F64, integer types, Q8_1, Q8_K...):
    tried on one zero block, so this follows whatever the installed gguf supports."""
    from gguf.constants import GGML_QUANT_SIZES
    from gguf.quants import dequantize

    if qtype not in GGML_QUANT_SIZES:
        return False
    _, type_size = GGML_QUANT_SIZES[qtype]
    try:
        dequantize(np.zeros((1, type_size), dtype=np.uint8), qtype)
    except NotImplementedError:
        return False
    return True


def dequantize_bf16(tensor, row_start: int = 0, row_stop: int | None = None) -> torch.Tensor:
    """Rows [row_start, row_stop) of a GGUF tensor as bf16 (round-to-nearest-even from fp32)."""
    from gguf.quants import dequantize

    data = tensor.data if tensor.data.ndim == 1 else tensor.data[row_start:row_stop]
    fp32 = np.ascontiguousarray(dequantize(np.asarray(data), tensor.tensor_type), dtype=np.float32)
    if not fp32.flags.writeable:  # F32 tensors come back as views of the read-only memmap
        fp32 = fp32.copy()
    return torch.from_numpy(fp32).to(torch.bfloat16)


def write_safetensors(plan, path: Path, progress: bool = True,
                      permuted: dict[str, int] | None = None) -> str:
    """Stream every planned tensor, dequantized to bf16, into one safetensors file; returns
    the file's sha256, hashed as it is written (no second read of 3 GB).

    permuted: {hf_name: rows per head} of tensors whose rows llama.cpp permuted; they are read
    in chunks of whole heads and put back with `unpermute_rows`.
    """
    permuted = permuted or {}
    from tqdm import tqdm

    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, _, shape in plan:
        nbytes = 2 * int(np.prod(shape))
        header[name] = {"dtype": "BF16", "shape": list(shape),
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the format pads the header so tensor data is 8-aligned

    bar = tqdm(total=offset, unit="B", unit_scale=True, desc="convert weights",
               disable=None if progress else True)      # None: no bar when not a terminal
    digest = hashlib.sha256()
    with open(path, "wb") as f, bar:
        def write(data) -> None:  # bytes or a contiguous array: both are buffers
            digest.update(data)
            f.write(data)

        write(struct.pack("<Q", len(blob)))
        write(blob)
        for name, tensor, shape in plan:
            rows = shape[0] if len(shape) == 2 else 1
            step = max(1, _CHUNK_ELEMENTS // (int(np.prod(shape)) // rows))
            head = permuted.get(name)
            if head:
                step = max(head, step - step % head)
            for r in range(0, rows, step):
                chunk = dequantize_bf16(tensor, r, r + step)
                if not torch.isfinite(chunk).all():
                    raise UnsupportedGGUF(f"tensor {tensor.name} holds NaN or infinite values "
                                          f"(rows {r}..{min(r + step, rows) - 1}); {_REMAKE}")
                if head:
                    chunk = unpermute_rows(chunk, head)
                write(chunk.view(torch.int16).numpy())
                bar.update(2 * chunk.numel())
        f.flush()
        os.fsync(f.fileno())
    return digest.hexdigest()


def _open(gguf_path: Path):
    """A `gguf.GGUFReader` of the file; UnsupportedGGUF when it is not a readable GGUF."""
    from gguf import GGUFReader

    check_regular(gguf_path, "GGUF file")      # a FIFO would block the read below forever
    with open(gguf_path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise UnsupportedGGUF("not a GGUF file (it does not start with the bytes 'GGUF')")
    check_header(gguf_path)
    try:
        with np.errstate(over="ignore"):    # a lying tensor offset: refused by plan_tensors
            return GGUFReader(str(gguf_path))
    except (ValueError, IndexError, KeyError, OverflowError) as e:  # a garbled header
        raise UnsupportedGGUF(f"not a readable GGUF file ({type(e).__name__}: {e}); "
                              f"{_REMAKE}") from None


def _tokenizer_settings(reader) -> tuple[dict[str, int], int | None, str | None]:
    """(Qwen stop-token ids, pad id, chat template) of the GGUF; refuses other tokenizers."""
    tokenizer = _field(reader, "tokenizer.ggml.model", None)
    if tokenizer not in ("gpt2", "llama"):  # what transformers' GGUF reader builds for these
        raise UnsupportedGGUF(f"tokenizer {tokenizer!r} is not supported ('gpt2' BPE or "
                              "'llama' sentencepiece)")
    token_ids = special_token_ids(reader, QWEN_STOPS)
    pad = _number(reader, "tokenizer.ggml.padding_token_id", int, None)
    template = _string(reader, "tokenizer.chat_template", None)
    if template is not None:
        _check_template(template)
    return token_ids, pad, template


def _check_template(template: str) -> None:
    """A chat template that does not compile is refused at conversion, not at the first chat
    request (compiled as transformers compiles it: a sandboxed Jinja environment)."""
    from jinja2 import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    try:
        ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).parse(template)
    except TemplateError as e:
        line = f" (line {e.lineno})" if getattr(e, "lineno", None) else ""
        raise UnsupportedGGUF(f"GGUF metadata 'tokenizer.chat_template' is not a valid Jinja "
                              f"template: {e.message}{line}; {_REMAKE}") from None


def convert_gguf(gguf_path, out_dir, progress: bool = True) -> Path:
    """Convert `gguf_path` into the directory `out_dir` (which must not exist yet).

    Everything that can be refused (metadata, tensor types and shapes, the tokenizer) is
    checked before anything is written. Atomic: everything is built in a temporary sibling
    directory that is renamed into place at the end, and removed if anything (including
    KeyboardInterrupt) stops the conversion.
    Raises UnsupportedGGUF for a file that is not a well-formed qwen2 or llama model, OSError
    for a failed write (ENOSPC when the disk is full), SpecrtError when out_dir appears
    meanwhile (nothing of it is touched).
    """
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    if out_dir.exists():
        raise FileExistsError(f"{out_dir} already exists")
    reader = _open(gguf_path)
    config = read_config(reader)
    plan = plan_tensors(reader, config)
    token_ids, pad, chat_template = _tokenizer_settings(reader)
    tok = load_tokenizer(reader, gguf_path, config, chat_template)

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    # the name cut short: its temporary name must stay within a name's 255 bytes too
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{out_dir.name[:40]}-", dir=out_dir.parent))
    try:
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        (tmp / "generation_config.json").write_text(
            json.dumps(generation_config(config, token_ids, pad), indent=2) + "\n")
        save_tokenizer(tok, tmp, chat_template)
        del tok
        sha256 = write_safetensors(plan, tmp / "model.safetensors", progress,
                                   permuted_rows(config))
        # verified in full at the first load, then by size + mtime (specrt.model.checksum)
        checksum.record_conversion(tmp, "model.safetensors",
                                   (tmp / "model.safetensors").stat().st_size, sha256)
        os.chmod(tmp, 0o777 & ~umask())   # mkdtemp makes it private; the result is a normal dir
        _sync_tree(tmp)
        try:
            os.replace(tmp, out_dir)
        except OSError as e:
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                raise
            raise SpecrtError(f"{out_dir} appeared while this conversion ran (another one "
                              "into the same folder?); it is kept and this conversion was "
                              "discarded") from None
        _sync(out_dir.parent)               # the rename itself
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def _sync_tree(root: Path) -> None:
    """Flush every file under `root`, then `root` itself, to the disk: renamed into place
    before that, a crash or power loss could leave a complete-looking model whose small files
    (config.json, the tokenizer) are empty."""
    for path in sorted(root.rglob("*")):
        if path.is_file():
            _sync(path)
    _sync(root)


def _sync(path: Path) -> None:
    """fsync a file, or a directory (its entries); a directory the platform cannot open is
    skipped."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        if path.is_dir():
            return
        raise
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
