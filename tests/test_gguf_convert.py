"""`python -m specrt.models convert PATH.gguf OUT_DIR` on GGUFs written here from tiny models.

Each tiny Hugging Face checkpoint (tests/tiny.py) is written to a GGUF the way llama.cpp's
convert_hf_to_gguf.py lays it out: llama.cpp tensor names, F32 tensors, tokenizer metadata
built from the tiny tokenizer.json, and (llama only) q/k rows permuted by `llama_permute`, a
copy of `LlamaModel.permute`. The converted directory must then give the logits of the
original model, whose weights are rounded to bf16 as the converter rounds them.
"""
from __future__ import annotations

import errno
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from specrt.hub import gguf_convert, gguf_tokenizer
from specrt.hub.cli import main
from tests.tiny import CHAT_TEMPLATE, hf_model, make_model

_HF_TO_GGUF = {v: k for k, v in gguf_convert._GLOBAL_NAMES.items()}
_LAYER_TO_GGUF = {v: k for k, v in gguf_convert._LAYER_NAMES.items()}


def llama_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py `LlamaModel.permute`, verbatim."""
    dim = w.shape[0]
    return w.reshape(n_head, 2, dim // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _gguf_name(hf: str) -> str:
    if hf in _HF_TO_GGUF:
        return _HF_TO_GGUF[hf]
    _, _, n, rest = hf.split(".", 3)
    return f"blk.{n}.{_LAYER_TO_GGUF[rest]}"


def _tokenizer_metadata(writer, hf_dir: Path, cfg: dict, chat_template: bool) -> None:
    tok = json.loads((hf_dir / "tokenizer.json").read_text())
    vocab = dict(tok["model"]["vocab"])
    specials = {t["content"]: t["id"] for t in tok["added_tokens"]}
    vocab.update(specials)
    tokens = [f"[PAD{i}]" for i in range(cfg["vocab_size"])]
    for text, i in vocab.items():
        tokens[i] = text
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in specials or t.startswith("[PAD") else 1 for t in tokens])
    writer.add_token_merges(merges)
    writer.add_eos_token_id(cfg["eos_token_id"])
    writer.add_bos_token_id(specials["<|endoftext|>"])
    if chat_template:
        writer.add_chat_template(CHAT_TEMPLATE)


def write_gguf(hf_dir: Path, path: Path, arch: str | None = None, chat_template: bool = True,
               extra=None, tensors=None) -> Path:
    """The tiny checkpoint in `hf_dir` as llama.cpp would write it (arch: override the name;
    extra: a function of the GGUFWriter that adds (or overwrites) metadata; tensors: a function
    of {hf_name: array} giving what to write, where an (array, GGMLQuantizationType) value is
    written as that raw type)."""
    from gguf import GGUFWriter
    from safetensors.numpy import load_file

    cfg = json.loads((hf_dir / "config.json").read_text())
    arch = arch or cfg["model_type"]
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    w = GGUFWriter(str(path), arch)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_freq_base(cfg.get("rope_theta") or cfg["rope_parameters"]["rope_theta"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_rope_dimension_count(cfg["hidden_size"] // heads)
    _tokenizer_metadata(w, hf_dir, cfg, chat_template)
    if extra:
        extra(w)
    weights = load_file(str(hf_dir / "model.safetensors"))
    for name, t in (tensors(weights) if tensors else weights).items():
        if isinstance(t, tuple):
            w.add_tensor(_gguf_name(name), t[0], raw_dtype=t[1])
            continue
        if cfg["model_type"] == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            t = llama_permute(t, heads if "q_proj" in name else kv_heads)
        w.add_tensor(_gguf_name(name), np.ascontiguousarray(t, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def converted(request, tmp_path_factory):
    """(kind, tiny HF dir, converted dir) with the conversion's exit status checked.

    The converter's row chunks are shrunk to 3 rows so that chunking runs (and, for llama's
    permuted q/k, is rounded to whole heads) on these small tensors too.
    """
    kind = request.param
    root = tmp_path_factory.mktemp(f"gguf_{kind}")
    hf_dir = make_model(root / "hf", kind, seed=3)
    gguf = write_gguf(hf_dir, root / f"{kind}.gguf", chat_template=kind == "qwen2")
    out = root / "out"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gguf_convert, "_CHUNK_ELEMENTS", 3 * 64)
        assert main(["convert", "--quiet", str(gguf), str(out)]) == 0
    return kind, hf_dir, out


def test_inverse_permutation():
    w = np.arange(6 * 8 * 3, dtype=np.float32).reshape(6 * 8, 3)     # 6 heads, head_dim 8
    back = gguf_convert.unpermute_rows(torch.from_numpy(llama_permute(w, 6)), 8)
    assert torch.equal(back, torch.from_numpy(w))
    assert not np.array_equal(llama_permute(w, 6), w)


def test_logits_equal_original_rounded_to_bf16(converted):
    from specrt.model import Transformer

    kind, hf_dir, out = converted
    ref = hf_model(hf_dir)
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(p.to(torch.bfloat16).to(torch.float32))      # what the converter writes
    ids = torch.tensor([[5, 17, 42, 99, 250, 3, 301]])
    with torch.no_grad():
        want = ref(ids).logits
    ours = Transformer.from_dir(out, dtype="float32")
    got = ours.forward(ids, ours.new_cache(1, 16))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    with torch.no_grad():  # transformers reads the directory too
        torch.testing.assert_close(hf_model(out)(ids).logits, want, rtol=1e-4, atol=1e-4)


def test_config_tokenizer_and_generation_config(converted):
    from safetensors import safe_open
    from transformers import AutoTokenizer

    from specrt.hub.paths import CONVERTED_FILES

    kind, hf_dir, out = converted
    assert all((out / name).is_file() for name in CONVERTED_FILES)   # what `damage` expects
    cfg = json.loads((out / "config.json").read_text())
    gen = json.loads((out / "generation_config.json").read_text())
    with safe_open(str(out / "model.safetensors"), framework="pt") as st, \
            safe_open(str(hf_dir / "model.safetensors"), framework="pt") as orig_st:
        has_head = "lm_head.weight" in st.keys()
        has_bias = "model.layers.0.self_attn.q_proj.bias" in st.keys()
        for name in orig_st.keys():  # every tensor, q/k included, is the original in bf16
            assert torch.equal(st.get_tensor(name), orig_st.get_tensor(name).bfloat16()), name
    tok, orig = AutoTokenizer.from_pretrained(str(out)), AutoTokenizer.from_pretrained(str(hf_dir))
    text = "def add(a, b):\n    return a + b  # the quick fox"
    assert tok.encode(text, add_special_tokens=False) == orig.encode(text, add_special_tokens=False)
    eos = orig.convert_tokens_to_ids("<|im_end|>")
    assert gen["eos_token_id"][0] == cfg["eos_token_id"] == eos
    assert orig.convert_tokens_to_ids("<|endoftext|>") in gen["eos_token_id"]
    if kind == "llama":
        assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["model_type"] == "llama"
        assert cfg["tie_word_embeddings"] is True and not has_head
        assert cfg["attention_bias"] is False and not has_bias
        assert tok.chat_template is None and not (out / "chat_template.jinja").exists()
    else:
        assert cfg["architectures"] == ["Qwen2ForCausalLM"] and cfg["tie_word_embeddings"] is False
        assert has_head and has_bias and tok.chat_template == CHAT_TEMPLATE
    assert [p.name for p in out.parent.iterdir() if p.name.startswith(".tmp-")] == []


def test_bad_inputs_exit_2_with_one_line(tmp_path, capsys):
    hf_dir = make_model(tmp_path / "hf", "qwen2", seed=5, layers=1)
    good = write_gguf(hf_dir, tmp_path / "good.gguf")
    cases = [
        (["convert", str(tmp_path / "missing.gguf"), str(tmp_path / "a")], "no such file"),
        (["convert", str(tmp_path), str(tmp_path / "b")], "not a regular file"),
        (["convert", str(good), str(hf_dir)], "already exists"),
    ]
    gemma = write_gguf(hf_dir, tmp_path / "gemma.gguf", arch="gemma")
    cases.append((["convert", str(gemma), str(tmp_path / "c")], "architecture 'gemma'"))
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf at all")
    cases.append((["convert", str(tmp_path / "junk.gguf"), str(tmp_path / "d")], "not a GGUF"))
    capsys.readouterr()
    for argv, words in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and words in err[0], err
    assert not any((tmp_path / d).exists() for d in "abcd")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp-")] == []


def test_rope_scaling_refused(tmp_path, capsys):
    from gguf import RopeScalingType

    hf_dir = make_model(tmp_path / "hf", "llama", seed=4, layers=1)

    def linear(w):
        w.add_rope_scaling_type(RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(4.0)

    gguf = write_gguf(hf_dir, tmp_path / "m.gguf", extra=linear)
    capsys.readouterr()
    assert main(["convert", "-q", str(gguf), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "rope scaling 'linear' is not supported" in err[-1] and len(err) == 1
    assert not (tmp_path / "out").exists()


# --- malformed GGUFs: one UnsupportedGGUF naming the problem, before anything is written ----
@pytest.fixture(scope="module")
def tiny_qwen(tmp_path_factory) -> Path:
    return make_model(tmp_path_factory.mktemp("tiny") / "hf", "qwen2", seed=6, layers=1)


def _kv(key: str, value, vtype: str):
    from gguf import GGUFValueType

    return lambda w: w.add_key_value(key, value, GGUFValueType[vtype])


def _bad_utf8_token(w) -> None:
    tokens = list(w.kv_data[0]["tokenizer.ggml.tokens"].value)
    tokens[5] = tokens[5].encode() + b"\xaa"  # 0xaa cannot start a UTF-8 character
    w.add_token_list(tokens)


def _no_merges(w) -> None:  # and no scores: transformers then fails with KeyError 'scores'
    del w.kv_data[0]["tokenizer.ggml.merges"]


def _merge_of_unknown_tokens(w) -> None:  # "a b" but no "ab": a Rust panic in `tokenizers`
    w.add_token_list(["a", "b", "c"])
    w.add_token_types([1, 1, 1])
    w.add_token_merges(["a b"])
    w.add_eos_token_id(2)
    w.add_bos_token_id(0)


def _tokens_past_the_embedding(w) -> None:
    tokens = list(w.kv_data[0]["tokenizer.ggml.tokens"].value)
    w.add_token_list(tokens + [f"[EXTRA{i}]" for i in range(8)])
    w.add_token_types([1] * (len(tokens) + 8))


def _1d_embeddings(sd: dict) -> dict:
    return {**sd, "model.embed_tokens.weight": sd["model.embed_tokens.weight"].reshape(-1)}


def _f64_norm(sd: dict) -> dict:
    from gguf import GGMLQuantizationType

    norm = sd["model.norm.weight"].astype(np.float64)
    return {**sd, "model.norm.weight": (norm, GGMLQuantizationType.F64)}


_MALFORMED = {  # case: (write_gguf keywords, words the error must hold)
    "block_count string": ({"extra": _kv("qwen2.block_count", "two", "STRING")},
                           "'qwen2.block_count' must be an integer, but the file stores string"),
    "block_count float": ({"extra": _kv("qwen2.block_count", 1.0, "FLOAT32")},
                          "'qwen2.block_count' must be an integer, but the file stores float32"),
    "eps string": ({"extra": _kv("qwen2.attention.layer_norm_rms_epsilon", "x", "STRING")},
                   "'qwen2.attention.layer_norm_rms_epsilon' must be a finite number"),
    "context_length 0": ({"extra": _kv("qwen2.context_length", 0, "UINT32")},
                         "max_position_embeddings must be an integer in [1, "),
    "odd key_length": ({"extra": lambda w: w.add_key_length(15)},
                       "qwen2.attention.key_length is 15, but rope needs an even"),
    "1-D token_embd": ({"tensors": _1d_embeddings},
                       "token_embd.weight has shape [20480], but it must be 2-D"),
    "F64 norm": ({"tensors": _f64_norm}, "output_norm.weight is stored as F64"),
    "no merges or scores": ({"extra": _no_merges},
                            "neither 'tokenizer.ggml.merges' nor 'tokenizer.ggml.scores'"),
    "token not UTF-8": ({"extra": _bad_utf8_token}, "tokenizer.ggml.tokens[5] is not UTF-8"),
    # was "the GGUF's tokenizer metadata cannot be read (UnicodeDecodeError ...)"
    "a name that is not UTF-8": ({"extra": _kv("general.name", b"tiny\xffname", "STRING")},
                                 "metadata 'general.name' is not UTF-8 text (byte 4"),
    "merge of unknown tokens": ({"extra": _merge_of_unknown_tokens},
                                "merges[0] 'a b' needs the token 'ab'"),
    "unknown token id past the vocabulary": (
        {"extra": _kv("tokenizer.ggml.unknown_token_id", 10**6, "UINT32")},
        "'tokenizer.ggml.unknown_token_id' is 1000000, but the token ids run from 0 to"),
    "chat template that does not compile": (
        {"extra": lambda w: w.add_chat_template("{% for m in messages %}{{ m }")},
        "'tokenizer.chat_template' is not a valid Jinja template: unexpected '}'"),
    # gguf's and transformers' readers spent 51 s and 3 GB on one such array in a 2.3 MB file
    "a long array outside the tokenizer": (
        {"extra": lambda w: w.add_array("x.big", [0] * 70_000)},
        "metadata 'x.big' holds 70,000 values, more than specrt reads for such a key (65,536)"),
    # transformers' `llama` tokenizer adds <s>, </s>, <unk> past a vocabulary without them:
    # the conversion succeeded and the model did not load
    "a llama tokenizer over a vocabulary without its specials": (
        {"extra": _kv("tokenizer.ggml.model", "llama", "STRING")},
        "has ids up to 32"),
    "tokens past the embedding": ({"extra": _tokens_past_the_embedding},
                                  "tokenizer.ggml.tokens has 328 entries, but token_embd.weight "
                                  "has 320 rows"),
}


def _no_weights(*args, **kwargs):
    raise RuntimeError("weights were written before the GGUF was refused")


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def _refused_before_writing(gguf: Path, words: str, capsys, monkeypatch) -> None:
    """The library raises UnsupportedGGUF holding `words`, the CLI exits 2 with one line
    holding them, and nothing but the GGUF is left in its folder."""
    with monkeypatch.context() as mp:  # the library path (specrt.hub.fetch) sees UnsupportedGGUF
        mp.setattr(gguf_convert, "write_safetensors", _no_weights)
        with pytest.raises(gguf_convert.UnsupportedGGUF, match=re.escape(words)):
            gguf_convert.convert_gguf(gguf, gguf.parent / "lib", progress=False)
    capsys.readouterr()
    assert main(["convert", "-q", str(gguf), str(gguf.parent / "out")]) == 2
    line = _one_error_line(capsys)
    assert line.startswith(f"error: cannot convert {gguf}: ") and words in line, line
    assert sorted(p.name for p in gguf.parent.iterdir()) == [gguf.name]


@pytest.mark.parametrize("case", list(_MALFORMED))
def test_malformed_gguf_refused_before_writing(case, tiny_qwen, tmp_path, capsys, monkeypatch):
    kwargs, words = _MALFORMED[case]
    _refused_before_writing(write_gguf(tiny_qwen, tmp_path / "bad.gguf", **kwargs), words,
                            capsys, monkeypatch)


def test_tokenizer_panic_is_unsupported_gguf(tiny_qwen, tmp_path, monkeypatch):
    """Without the merges check, `tokenizers` panics (pyo3's PanicException, a BaseException):
    that too must end as UnsupportedGGUF, and nothing written."""
    gguf = write_gguf(tiny_qwen, tmp_path / "bad.gguf", extra=_merge_of_unknown_tokens)
    monkeypatch.setattr(gguf_tokenizer, "_check_merges", lambda tokens, merges: None)
    monkeypatch.setattr(gguf_convert, "write_safetensors", _no_weights)
    with pytest.raises(gguf_convert.UnsupportedGGUF,
                       match=r"tokenizer metadata cannot be read \(PanicException: "):
        gguf_convert.convert_gguf(gguf, tmp_path / "out", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.gguf"]


def test_interrupt_while_loading_tokenizer_is_not_swallowed(tiny_qwen, tmp_path, monkeypatch):
    def interrupted(*args):
        raise KeyboardInterrupt

    gguf = write_gguf(tiny_qwen, tmp_path / "m.gguf")
    monkeypatch.setattr(gguf_tokenizer, "_build_tokenizer", interrupted)
    with pytest.raises(KeyboardInterrupt):
        gguf_convert.convert_gguf(gguf, tmp_path / "out", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf"]


def _tokenizer_write_fails(monkeypatch, message: str) -> None:
    """The Rust tokenizers report a failed write of tokenizer.json as a plain Exception."""
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    def save(*args, **kwargs):
        raise Exception(message)  # noqa: TRY002 - what `tokenizers` raises

    monkeypatch.setattr(TokenizersBackend, "_save_pretrained", save)


def test_every_file_and_the_folder_reach_the_disk_before_the_rename(tiny_qwen, tmp_path,
                                                                     monkeypatch):
    """A crash after the rename must not leave a complete-looking folder with empty files."""
    gguf = write_gguf(tiny_qwen, tmp_path / "m.gguf")
    synced, renamed = [], []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        synced.append((os.readlink(f"/proc/self/fd/{fd}"), bool(renamed)))
        return real_fsync(fd)

    def replace(src, dst):
        if Path(dst) == tmp_path / "out":      # not the atomic writes of single files inside
            renamed.append(Path(src))
        return real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    out = gguf_convert.convert_gguf(gguf, tmp_path / "out", progress=False)
    tmp = renamed[-1]
    before = {Path(p) for p, after in synced if not after}
    files = {tmp / p.relative_to(out) for p in out.rglob("*") if p.is_file()}
    assert files and files <= before, files - before
    assert tmp in before                                   # the folder's entries
    assert (str(tmp_path), True) in synced                  # the rename's


def test_disk_full_while_saving_tokenizer(tiny_qwen, tmp_path, capsys, monkeypatch):
    gguf = write_gguf(tiny_qwen, tmp_path / "m.gguf")
    _tokenizer_write_fails(monkeypatch, "No space left on device (os error 28)")
    with pytest.raises(OSError) as info:
        gguf_convert.convert_gguf(gguf, tmp_path / "lib", progress=False)
    assert info.value.errno == errno.ENOSPC and info.value.filename.endswith("tokenizer.json")
    capsys.readouterr()
    assert main(["convert", "-q", str(gguf), str(tmp_path / "out")]) == 1
    line = _one_error_line(capsys)
    assert "failed: disk full (partial files were removed)" in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf"]


def test_other_tokenizer_write_failure_is_os_error(tiny_qwen, tmp_path, monkeypatch):
    gguf = write_gguf(tiny_qwen, tmp_path / "m.gguf")
    _tokenizer_write_fails(monkeypatch, "something odd\nsecond line")
    with pytest.raises(OSError, match=r"cannot write the tokenizer \(Exception: something "
                                      r"odd\).*tokenizer\.json") as info:
        gguf_convert.convert_gguf(gguf, tmp_path / "out", progress=False)
    assert info.value.errno == errno.EIO
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf"]


# --- headers that lie: the bytes of a good file edited where llama.cpp's reader trusts them ---
def _field_at(data: bytes, name: bytes) -> int:
    """The byte just past the one occurrence of the string `name` (a key or tensor name)."""
    assert data.count(name) == 1, name
    return data.index(name) + len(name)


def _lying_array_count(data: bytearray) -> None:   # an INT32 array claiming 2^60 elements
    at = _field_at(data, b"tokenizer.ggml.token_type") + 4 + 4     # value type, element type
    data[at:at + 8] = (1 << 60).to_bytes(8, "little")


def _duplicate_key(data: bytearray) -> None:       # written as qwen2.block_counX (see below)
    at = _field_at(data, b"qwen2.block_counX")
    data[at - 1:at] = b"t"


def _big_endian(data: bytearray) -> None:
    data[4:8] = data[4:8][::-1]


def _tensor_offset(name: bytes, offset):
    def edit(data: bytearray) -> None:
        at = _field_at(data, name)
        n_dims = int.from_bytes(data[at:at + 4], "little")
        at += 4 + 8 * n_dims + 4                                         # dims, type
        old = int.from_bytes(data[at:at + 8], "little")
        data[at:at + 8] = (offset(old, data) % (1 << 64)).to_bytes(8, "little")
    return edit


def _offset_of(name: bytes, data: bytes) -> int:
    at = _field_at(data, name)
    at += 4 + 8 * int.from_bytes(data[at:at + 4], "little") + 4
    return int.from_bytes(data[at:at + 8], "little")


_LYING = {  # case: (edit of the file's bytes, words the error must hold)
    "array count 2^60": (_lying_array_count,
                         "1152921504606846976 elements of 'tokenizer.ggml.token_type' claimed"),
    "key twice": (_duplicate_key, "metadata key 'qwen2.block_count' appears twice"),
    "big-endian": (_big_endian, "big-endian GGUF files are not supported"),
    "misaligned tensor": (_tensor_offset(b"blk.0.attn_v.bias", lambda old, d: old + 4),
                          "blk.0.attn_v.bias: its data offset"),
    "overlapping tensors": (_tensor_offset(b"blk.0.attn_v.bias",
                                           lambda old, d: _offset_of(b"blk.0.attn_k.bias", d)),
                            "blk.0.attn_k.bias and blk.0.attn_v.bias overlap"),
    "offset wrapping around": (_tensor_offset(b"blk.0.attn_v.bias", lambda old, d: -64),
                               "data offset 18446744073709551552 puts its"),
}


@pytest.mark.parametrize("case", list(_LYING))
def test_a_header_that_states_more_than_the_file_holds_is_refused(case, tiny_qwen, tmp_path,
                                                                   capsys, monkeypatch):
    """gguf's reader trusts the header: a scalar array claiming 2^60 elements made it append
    forever (memory grew until the process died); a key stated twice raised a bare KeyError;
    tensor offsets that overlap, are misaligned or wrap around converted other bytes into
    weights. Each is one clear UnsupportedGGUF, nothing written."""
    edit, words = _LYING[case]
    gguf = write_gguf(tiny_qwen, tmp_path / "bad.gguf",
                      extra=_kv("qwen2.block_counX", 1, "UINT32"))
    data = bytearray(gguf.read_bytes())
    edit(data)
    gguf.write_bytes(bytes(data))
    _refused_before_writing(gguf, words, capsys, monkeypatch)


def test_non_finite_weights_are_refused_and_nothing_is_left(tiny_qwen, tmp_path):
    def nan_norm(sd):
        norm = sd["model.norm.weight"].copy()
        norm[3] = np.nan
        return {**sd, "model.norm.weight": norm}

    gguf = write_gguf(tiny_qwen, tmp_path / "bad.gguf", tensors=nan_norm)
    with pytest.raises(gguf_convert.UnsupportedGGUF,
                       match=r"tensor output_norm.weight holds NaN or infinite values"):
        gguf_convert.convert_gguf(gguf, tmp_path / "out", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.gguf"]


def test_an_exception_while_the_weights_are_written_leaves_nothing(tiny_qwen, tmp_path,
                                                                   monkeypatch):
    gguf = write_gguf(tiny_qwen, tmp_path / "m.gguf")
    calls = []

    def fails_third(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise ZeroDivisionError("division by zero")
        return real(*args, **kwargs)

    real = gguf_convert.dequantize_bf16
    monkeypatch.setattr(gguf_convert, "dequantize_bf16", fails_third)
    with pytest.raises(ZeroDivisionError):
        gguf_convert.convert_gguf(gguf, tmp_path / "out", progress=False)
    assert len(calls) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf"]


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_the_library_refuses_a_gguf_path_that_is_not_a_regular_file(kind, tmp_path):
    """specrt.models.convert_gguf on a FIFO blocked forever in open()."""
    from specrt.errors import NotRegularFileError

    path = tmp_path / "m.gguf"
    os.mkfifo(path) if kind == "fifo" else path.mkdir()
    with pytest.raises(NotRegularFileError, match="not a regular file"):
        gguf_convert.convert_gguf(path, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_an_empty_token_list_is_named_as_empty():
    """gguf's writer drops an empty array, but a file can hold one (no element type is stated
    then): it was refused as "must be an array of strings"."""
    from types import SimpleNamespace

    from gguf import GGUFValueType

    empty = SimpleNamespace(types=[GGUFValueType.ARRAY], data=[], parts=[])
    reader = SimpleNamespace(fields={"tokenizer.ggml.tokens": empty})
    with pytest.raises(gguf_convert.UnsupportedGGUF, match="'tokenizer.ggml.tokens' is empty"):
        gguf_tokenizer._check_tokenizer_metadata(reader, 320)


@pytest.mark.parametrize("where", ["under a file", "in /proc"])
def test_an_output_folder_that_cannot_be_made_is_refused_before_reading(where, tiny_qwen,
                                                                         tmp_path, capsys,
                                                                         monkeypatch):
    """Found only when the output was written, after the whole GGUF was read and checked: exit
    1 and errno text about a .tmp-* folder. Now exit 2, naming the folder, before any read."""
    if where == "in /proc" and not Path("/proc/self").is_dir():
        pytest.skip("no /proc on this system")
    gguf = write_gguf(tiny_qwen, tmp_path / "m.gguf")
    (tmp_path / "afile").write_text("x")
    out = tmp_path / "afile" / "out" if where == "under a file" else Path("/proc/specrt_out")

    def not_reached(*args, **kwargs):
        raise AssertionError("the GGUF was read before the output folder was checked")
    monkeypatch.setattr(gguf_convert, "convert_gguf", not_reached)
    capsys.readouterr()
    assert main(["convert", "-q", str(gguf), str(out)]) == 2
    line = _one_error_line(capsys)
    assert ("afile is not a directory" in line if where == "under a file"
            else "cannot create a folder in /proc" in line), line


def test_the_header_walk_passes_every_value_type_the_writer_writes(tmp_path):
    """The walk that guards gguf's reader must not refuse a valid file: every scalar type,
    arrays of each, arrays of arrays five deep, empty strings and a custom alignment."""
    from gguf import GGUFReader, GGUFValueType as T, GGUFWriter

    from specrt.hub.gguf_header import check_header

    path = tmp_path / "kinds.gguf"
    w = GGUFWriter(str(path), "qwen2")
    w.add_custom_alignment(64)
    values = [(200, T.UINT8), (-5, T.INT8), (60000, T.UINT16), (-3, T.INT16),
              (4_000_000_000, T.UINT32), (-7, T.INT32), (1.5, T.FLOAT32), (True, T.BOOL),
              (2**63, T.UINT64), (-2**40, T.INT64), (2.25, T.FLOAT64), ("", T.STRING)]
    for i, (value, kind) in enumerate(values):
        w.add_key_value(f"x.scalar{i}", value, kind)
        w.add_key_value(f"x.array{i}", [value] * 3, T.ARRAY, sub_type=kind)
    w.add_key_value("x.deep", [[[[[1]]]], [[[[2, 3]]]]], T.ARRAY)
    w.add_tensor("t", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    check_header(path)
    assert len(GGUFReader(str(path)).tensors) == 1


def test_sigterm_during_a_convert_removes_its_unfinished_files(tiny_qwen, tmp_path):
    """SIGTERM (`kill`, `timeout`, a container's stop) left a .tmp-* folder of the weights
    written so far beside OUT_DIR; it now unwinds as Ctrl-C does."""
    import subprocess
    import sys

    gguf = write_gguf(tiny_qwen, tmp_path / "m.gguf")
    script = (
        "import os, signal, sys, time\n"
        "from specrt.hub import gguf_convert\n"
        "from specrt.hub.cli import main\n"
        "real = gguf_convert.write_safetensors\n"
        "def terminated(*args, **kwargs):\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    time.sleep(10)\n"
        "    return real(*args, **kwargs)\n"
        "gguf_convert.write_safetensors = terminated\n"
        "sys.exit(main(['convert', '-q', sys.argv[1], sys.argv[2]]))\n")
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    proc = subprocess.run([sys.executable, "-c", script, str(gguf), str(tmp_path / "out")],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 130, proc.stderr
    assert "interrupted; unfinished files were removed" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf"]


def test_an_output_name_of_255_bytes_converts_and_a_longer_one_is_refused_first(
        tiny_qwen, tmp_path, monkeypatch, capsys):
    """The temporary folder's name (.tmp-NAME-XXXXXXXX) passed the 255-byte limit for a
    legal name of 250 bytes, after the whole GGUF was read; a name past the limit was exit 1
    after the read too. A bad SPECRT_CACHE no longer stops a convert outside the cache."""
    gguf = write_gguf(tiny_qwen, tmp_path / "m.gguf")
    (tmp_path / "cache-file").write_text("not a folder")
    monkeypatch.setenv("SPECRT_CACHE", str(tmp_path / "cache-file"))
    assert main(["convert", "-q", str(gguf), str(tmp_path / ("n" * 255))]) == 0
    assert (tmp_path / ("n" * 255) / "config.json").is_file()
    monkeypatch.setattr(gguf_convert, "convert_gguf", lambda *a, **k: pytest.fail("read"))
    capsys.readouterr()
    assert main(["convert", "-q", str(gguf), str(tmp_path / ("n" * 256))]) == 2
    assert "past the 255 a name may have" in capsys.readouterr().err


def test_list_counts_nothing_for_a_file_renamed_away_while_it_looks(tmp_path, monkeypatch):
    """`specrt.models list` stats every file of a model; a checksum record's temporary
    renamed away between the listing and the stat was an internal error."""
    from specrt.hub import fetch

    (tmp_path / "kept").write_bytes(b"x" * 10)
    real_rglob, real_is_file = Path.rglob, Path.is_file
    monkeypatch.setattr(Path, "rglob", lambda self, pattern: [*real_rglob(self, pattern),
                                                              self / ".tmp-gone"])
    monkeypatch.setattr(Path, "is_file",       # there when listed, gone when stat'ed
                        lambda self: self.name == ".tmp-gone" or real_is_file(self))
    assert fetch._disk_usage(tmp_path) == 10


def test_an_output_that_appears_during_a_convert_is_kept_and_the_convert_discarded(
        tiny_qwen, tmp_path, monkeypatch, capsys):
    """Two converts into one folder: the loser failed with "[Errno 39] Directory not empty"
    as a runtime failure (exit 1); it is bad input (2), the winner's folder untouched and the
    loser's temporary removed."""
    gguf = write_gguf(tiny_qwen, tmp_path / "m.gguf")
    out = tmp_path / "out"
    real = gguf_convert.write_safetensors

    def another_convert_finishes_first(*args, **kwargs):
        out.mkdir()
        (out / "theirs").write_text("kept")
        return real(*args, **kwargs)

    monkeypatch.setattr(gguf_convert, "write_safetensors", another_convert_finishes_first)
    capsys.readouterr()
    assert main(["convert", "-q", str(gguf), str(out)]) == 2
    assert "appeared while this conversion ran" in _one_error_line(capsys)
    assert sorted(p.name for p in out.iterdir()) == ["theirs"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf", "out"]
