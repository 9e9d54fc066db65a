"""Read a checkpoint's `*.safetensors` files into a flat {name: tensor} dict.

Single files and sharded checkpoints (`model.safetensors.index.json`) are both read through
`safetensors.safe_open`, which memory-maps the file, so each tensor is read once and cast straight
to the requested dtype and device. Every tensor the model needs is checked for presence and shape
here; a problem is reported by tensor name, never as a shape error deep inside a matmul. Before
any of that, the config's implied size is checked against the files' real sizes (so an absurd
layer count fails in microseconds), files are opened only if they are regular files, and
converted weights are checked against their recorded sha256 (`specrt.model.checksum`).
This module knows the checkpoint's naming scheme but nothing about running the model.
"""
from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from specrt.errors import CheckpointError, IndexFileError, WeightsSizeError
from specrt.model import checksum
from specrt.model.config import ModelConfig
from specrt.model.files import check_regular, human_bytes, read_json

log = logging.getLogger("specrt.model")

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

# Buffers some exporters write that carry no weights we need.
_IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        if dtype in DTYPES.values():
            return dtype
    elif dtype in DTYPES:
        return DTYPES[dtype]
    raise CheckpointError(f"unsupported dtype {dtype!r}; choose float32, bfloat16 or float16")


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a checkpoint must provide for `cfg`, with its shape."""
    h, i = cfg.hidden_size, cfg.intermediate_size
    shapes = {"model.embed_tokens.weight": (cfg.vocab_size, h), "model.norm.weight": (h,)}
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, h)
    for n in range(cfg.num_layers):
        p = f"model.layers.{n}."
        shapes.update({
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (cfg.q_size, h),
            p + "self_attn.k_proj.weight": (cfg.kv_size, h),
            p + "self_attn.v_proj.weight": (cfg.kv_size, h),
            p + "self_attn.o_proj.weight": (h, cfg.q_size),
            p + "mlp.gate_proj.weight": (i, h),
            p + "mlp.up_proj.weight": (i, h),
            p + "mlp.down_proj.weight": (h, i),
        })
        if cfg.attention_bias:
            shapes.update({p + "self_attn.q_proj.bias": (cfg.q_size,),
                           p + "self_attn.k_proj.bias": (cfg.kv_size,),
                           p + "self_attn.v_proj.bias": (cfg.kv_size,)})
    return shapes


def _weight_files(model_dir: Path) -> dict[str, Path]:
    """name -> file holding it, for a single-file or sharded checkpoint."""
    index = model_dir / "model.safetensors.index.json"
    if os.path.lexists(index):
        return _index_files(model_dir, index)
    single = model_dir / "model.safetensors"
    if os.path.lexists(single):
        candidates = [single]
    else:
        candidates = sorted(model_dir.glob("*.safetensors"))
    if not candidates:
        raise CheckpointError(f"no model weights in {model_dir}: expected model.safetensors or "
                              "model.safetensors.index.json (specrt reads safetensors only)")
    files = {}
    for path in candidates:
        for name in _keys(path):
            files[name] = path
    return files


def _index_files(model_dir: Path, index: Path) -> dict[str, Path]:
    fix = "re-download the checkpoint or re-create its index"
    weight_map = read_json(index, "safetensors index", fix=fix, error=IndexFileError) \
        .get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise IndexFileError(f"{index}: weight_map must be a non-empty object "
                             f"{{tensor name: shard file name}}, got {_short(weight_map)}; {fix}")
    files, shards = {}, {}
    for name, fname in weight_map.items():
        if not isinstance(fname, str) or not fname:
            raise IndexFileError(f"{index}: weight_map[{name!r}] must be a shard file name, "
                                 f"got {_short(fname)}; {fix}")
        if fname not in shards:
            path = model_dir / fname
            # The name must stay inside the directory; the file it names may be a symlink
            # elsewhere (a Hugging Face cache's snapshots/<rev>/ links every file to ../../blobs/).
            if os.path.isabs(fname) or ".." in Path(fname).parts:
                raise IndexFileError(f"{index}: weight_map[{name!r}] names {fname!r}, which is "
                                     f"outside the model directory {model_dir}; shards must sit "
                                     f"in the model directory; {fix}")
            try:
                check_regular(path, f"shard listed in {index.name}")
            except FileNotFoundError:
                raise CheckpointError(f"shard {fname} listed in {index.name} is missing from "
                                      f"{model_dir}; re-download or re-convert the model") from None
            shards[fname] = path
        files[name] = shards[fname]
    return files


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _keys(path: Path) -> list[str]:
    try:
        check_regular(path, "weights file")
    except FileNotFoundError:
        raise CheckpointError(f"weights file {path} is a broken symlink; re-download or "
                              "re-convert the model") from None
    try:
        with safe_open(str(path), framework="pt") as f:
            return list(f.keys())
    except (SafetensorError, OSError, ValueError) as e:
        raise _corrupt(path, e) from None


def expected_elements(cfg: ModelConfig) -> tuple[int, int]:
    """(elements in the embeddings and head, elements in all layers) that `cfg` implies:
    plain arithmetic, so an absurd config is caught before any per-layer table is built."""
    h, i = cfg.hidden_size, cfg.intermediate_size
    qkv = cfg.q_size + 2 * cfg.kv_size
    layer = 2 * h + qkv * h + cfg.q_size * h + 3 * i * h + (qkv if cfg.attention_bias else 0)
    outer = cfg.vocab_size * h * (1 if cfg.tie_word_embeddings else 2) + h
    return outer, cfg.num_layers * layer


def check_sizes(cfg: ModelConfig, paths, model_dir: Path) -> None:
    """Refuse a config whose parameters cannot be what the weight files hold: between 2
    (bf16/fp16) and 4 (fp32) bytes per parameter, plus headers and ignorable extras."""
    total = header = 0
    for path in set(paths):
        size = os.path.getsize(path)
        total += size
        header += min(size, 8 + _header_len(path))
    outer, layers = expected_elements(cfg)
    need = outer + layers
    # a tied checkpoint may still carry lm_head; exporters add small buffers (rope inv_freq)
    extra = (cfg.vocab_size * cfg.hidden_size if cfg.tie_word_embeddings else 0) \
        + cfg.num_layers * cfg.head_dim
    if 2 * need <= total <= 4 * (need + extra) + header:
        return
    field, value = (("num_hidden_layers", cfg.num_layers) if layers >= outer
                    else ("vocab_size", cfg.vocab_size))
    raise WeightsSizeError(
        f"config.json in {model_dir} implies {need:,} parameters ({human_bytes(2 * need)} to "
        f"{human_bytes(4 * need)} at 2-4 bytes each; largest part: {field}={value}), but the "
        f"weight files hold {human_bytes(total)}; config.json does not match the checkpoint "
        "(check num_hidden_layers, hidden_size, intermediate_size and vocab_size)")


def _layers_in(files: dict[str, Path]) -> set[int]:
    """The layer numbers N of the checkpoint's model.layers.N.* tensors."""
    found = (re.match(r"model\.layers\.(\d+)\.", name) for name in files)
    return {int(m.group(1)) for m in found if m}


def _check_missing(want: dict, files: dict[str, Path], model_dir: Path) -> None:
    missing = [n for n in want if n not in files]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise CheckpointError(f"checkpoint in {model_dir} is missing tensor {missing[0]!r}{more}; "
                              "it does not match its config.json")


def _header_len(path: Path) -> int:
    try:
        with open(path, "rb") as f:
            raw = f.read(8)
    except OSError as e:
        raise _unreadable(path, e) from None
    return int.from_bytes(raw, "little") if len(raw) == 8 else 0


def _check_float(files: dict[str, Path]) -> None:
    """Refuse weights stored as other than BF16 / F16 / F32 (quantized, F64), read from each
    file's header, before the size check would blame config.json for their size."""
    for path in dict.fromkeys(files.values()):
        try:
            with safe_open(str(path), framework="pt") as f:
                for name in f.keys():
                    stored = f.get_slice(name).get_dtype()
                    if files.get(name) == path and stored not in _FLOAT_DTYPES:
                        raise CheckpointError(
                            f"tensor {name!r} in {path.name} is stored as {stored}; specrt "
                            f"loads float checkpoints ({', '.join(sorted(_FLOAT_DTYPES))}) "
                            "only: use the model's unquantized weights")
        except (SafetensorError, OSError) as e:
            raise _corrupt(path, e) from None


def _corrupt(path: Path, error: Exception) -> CheckpointError:
    """What safetensors' failure to read `path` means; a file this process may not read
    (safetensors says "No such file") raises that instead (`_header_len`)."""
    _header_len(path)
    return CheckpointError(f"cannot read {path}: {error}; the file is corrupt or truncated, "
                           "re-download or re-convert the model")


def _unreadable(path: Path, error: OSError) -> CheckpointError:
    if isinstance(error, PermissionError):
        return CheckpointError(f"cannot read weights file {path}: permission denied; make it "
                               "readable (chmod a+r) or run as a user who may read it")
    return CheckpointError(f"cannot read weights file {path}: {error.strerror or error}")


# safetensors dtype names of the float checkpoints a model is loaded from (cast to `dtype`)
_FLOAT_DTYPES = {"BF16", "F16", "F32"}


def load_state_dict(model_dir: str | Path, cfg: ModelConfig, dtype: torch.dtype,
                    device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """Load and check every tensor `cfg` needs, cast to `dtype` on `device`."""
    model_dir = Path(model_dir)
    files = _weight_files(model_dir)
    _check_float(files)           # first: weights in another form also miss the size check
    try:
        check_sizes(cfg, files.values(), model_dir)
    except WeightsSizeError:
        # A checkpoint whose layers are the config's, short of a tensor, is short of that
        # tensor (a 2-byte checkpoint without one projection also fails the size check).
        if _layers_in(files) == set(range(cfg.num_layers)):
            _check_missing(expected_shapes(cfg), files, model_dir)
        raise
    checksum.verify(model_dir)
    want = expected_shapes(cfg)
    _check_missing(want, files, model_dir)
    # Tied embeddings with an lm_head.weight of their own: read it too; the model uses it where
    # it differs from the embeddings (as transformers does), else it is dropped
    # (`_untie_if_different`).
    head_too = cfg.tie_word_embeddings and "lm_head.weight" in files
    if head_too:
        want = {**want, "lm_head.weight": want["model.embed_tokens.weight"]}
    unexpected = [n for n in files if n not in want and not n.endswith(_IGNORED_SUFFIXES)]
    if unexpected:
        raise CheckpointError(f"checkpoint in {model_dir} has unexpected tensor {unexpected[0]!r}"
                              f" ({len(unexpected)} in all); it does not match its config.json "
                              f"({cfg.architecture})")

    out: dict[str, torch.Tensor] = {}
    by_file: dict[Path, list[str]] = {}
    for name in want:
        by_file.setdefault(files[name], []).append(name)
    for path, names in by_file.items():
        try:
            with safe_open(str(path), framework="pt") as f:
                held = set(f.keys())
                stray = [n for n in names if n not in held]
                if stray:       # only an index maps names to files: a sound shard, a wrong index
                    raise IndexFileError(
                        f"{model_dir / 'model.safetensors.index.json'}: weight_map puts "
                        f"{stray[0]!r} in {path.name}, which does not hold it; the index does "
                        "not match its shards: re-download or re-convert the model")
                for name in names:          # dtypes: checked by _check_float
                    shape = tuple(f.get_slice(name).get_shape())
                    if shape != want[name]:
                        raise CheckpointError(
                            f"tensor {name!r} in {path.name} has shape {list(shape)}, expected "
                            f"{list(want[name])} from config.json")
                    # copy=True: own the memory instead of aliasing the file mapping (mapped
                    # pages in 4 KiB TLB entries slow every later read of the weights)
                    out[name] = f.get_tensor(name).to(device=device, dtype=dtype, copy=True)
        except (SafetensorError, OSError) as e:
            raise _corrupt(path, e) from None
    if head_too:
        _untie_if_different(out, model_dir)
    return out


def _untie_if_different(weights: dict[str, torch.Tensor], model_dir: Path) -> None:
    """config.json ties the output head to the embeddings, yet the checkpoint stores an
    lm_head.weight: equal, it is dropped; different (some fine-tunes are saved so), the model
    keeps it as its head, as transformers does, and says so."""
    if torch.equal(weights["lm_head.weight"], weights["model.embed_tokens.weight"]):
        del weights["lm_head.weight"]
        return
    log.warning("%s: config.json sets tie_word_embeddings, but the checkpoint's lm_head.weight "
                "differs from the embeddings; using lm_head.weight as the output head (as "
                "transformers does); set tie_word_embeddings to false to silence this",
                model_dir)
