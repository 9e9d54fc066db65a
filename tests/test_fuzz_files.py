"""Bad model files get one SpecrtError, never a raw traceback, a hang or an allocation storm.

Property-based (hypothesis, derandomized so CI is reproducible, ~300 examples, well under a
minute on 2 cores): a copy of the tiny model with a mutated config.json, generation_config.json,
shard index or tokenizer_config.json must either load and generate, or raise SpecrtError, within
a hang bound (TIME_BOUND_S). Then one plain test per family (issue 18): config values, shard
index, files that are not regular files (run in a subprocess with a timeout, so a regression
cannot hang the suite), sizes checked before allocation, tokenizer files, and the chat template.

Distinct bad-file inputs exercised by the plain tests: 20 config values + 6 index + 4 file
types + 4 size/memory + 9 tokenizer/template = 43 (listed below), on top of the 240 generated
ones; test_errors.py and test_models.py (checksum, stale leftovers) add 5 more.
"""
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import specrt
from specrt.errors import (ConfigValueError, IndexFileError, MemoryCapacityError, SpecrtError,
                           TokenizerFileError, WeightsSizeError)
from tests.helpers import copy_model, edit_json, run_bounded

REPO = Path(__file__).resolve().parents[1]
# A hang bound, not a timing assertion: a load and two generations of the tiny model take well
# under a second, but on a busy shared machine a sound one can take many.
TIME_BOUND_S = 60.0
FUZZ = settings(max_examples=80, derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])

# --------------------------------------------------------------------------- helpers


def _load_and_generate(d: Path) -> None:
    llm = specrt.LLM(d, max_seq_len=32, dtype="float32")
    try:
        llm.generate([1, 2], max_new_tokens=2)
        if llm.tokenizer is not None:
            llm.generate("def", max_new_tokens=2, chat=llm.tokenizer.has_chat_template)
    finally:
        llm.close()


def _outcome(d: Path) -> BaseException | None:
    """Load (and generate from) `d` in a thread; fail if it takes longer than TIME_BOUND_S.
    Returns the exception raised, or None."""
    kind, value = run_bounded(lambda: _load_and_generate(d), TIME_BOUND_S)
    assert kind != "hang", f"loading {d} took more than {TIME_BOUND_S} s"
    return None if kind == "ok" else value


def _assert_clear(d: Path) -> None:
    err = _outcome(d)
    event("loaded" if err is None else type(err).__name__)
    if err is not None and not isinstance(err, SpecrtError):
        raise AssertionError(f"raw {type(err).__name__} for {d}") from err
    shutil.rmtree(d.parent, ignore_errors=True)


# --------------------------------------------------------------------------- strategies

EXTREMES = [0, -1, 1, 2, 3, 7, 2 ** 31, 2 ** 63, 10 ** 30, 3_000_000, 0.5, 320.7, 1e308,
            -0.0, float("nan"), float("inf"), True, False, None, "", "abc", "false", "1"]
scalars = st.one_of(st.sampled_from(EXTREMES), st.integers(-5, 5000),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=6))
junk = st.recursive(scalars, lambda c: st.one_of(
    st.lists(c, max_size=3), st.dictionaries(st.text(max_size=6), c, max_size=3)), max_leaves=6)
CONFIG_KEYS = ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
               "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps",
               "rope_theta", "rope_parameters", "rope_scaling", "max_position_embeddings",
               "tie_word_embeddings", "attention_bias", "eos_token_id", "bos_token_id",
               "architectures", "model_type", "layer_types", "use_sliding_window", "mlp_bias",
               "hidden_act"]
# (key, None) deletes the key; (key, value) sets it
edits = st.lists(st.tuples(st.sampled_from(CONFIG_KEYS),
                           st.one_of(st.none(), st.just("<delete>"), junk)), min_size=1,
                 max_size=3)


def _apply(raw: dict, changes) -> dict:
    for key, value in changes:
        if value == "<delete>":
            raw.pop(key, None)
        else:
            raw[key] = value
    return raw


@pytest.fixture(scope="module")
def sharded_dir(tiny_dir, tmp_path_factory):
    """tiny_dir split into two shards with a model.safetensors.index.json."""
    from safetensors.torch import load_file, save_file

    d = tmp_path_factory.mktemp("sharded") / "m"
    shutil.copytree(tiny_dir, d)
    sd = load_file(d / "model.safetensors")
    (d / "model.safetensors").unlink()
    names = sorted(sd)
    halves = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    weight_map = {}
    for fname, part in halves.items():
        save_file({n: sd[n] for n in part}, d / fname, metadata={"format": "pt"})
        weight_map.update({n: fname for n in part})
    (d / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map}))
    return d


# --------------------------------------------------------------------------- fuzz


@FUZZ
@given(changes=edits)
def test_fuzz_config_json(tiny_dir, changes):
    d = copy_model(tiny_dir)
    edit_json(d / "config.json", lambda raw: _apply(raw, changes))
    _assert_clear(d)


@settings(FUZZ, max_examples=40)
@given(changes=st.lists(st.tuples(st.sampled_from(["eos_token_id", "bos_token_id",
                                                   "pad_token_id"]),
                                  st.one_of(st.just("<delete>"), junk)), min_size=1,
                        max_size=2))
def test_fuzz_generation_config(tiny_dir, changes):
    d = copy_model(tiny_dir)
    edit_json(d / "generation_config.json", lambda raw: _apply(raw, changes))
    _assert_clear(d)


shard_values = st.one_of(junk, st.sampled_from(
    ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "config.json",
     "../m/model-00001-of-00002.safetensors", "/etc/hostname", "missing.safetensors", ".",
     "nested/x.safetensors", ""]))


@settings(FUZZ, max_examples=60)
@given(index=st.one_of(
    junk,
    st.fixed_dictionaries({"weight_map": junk}),
    st.tuples(st.integers(0, 40), shard_values)))
def test_fuzz_shard_index(sharded_dir, index):
    d = copy_model(sharded_dir)
    path = d / "model.safetensors.index.json"
    if isinstance(index, tuple):            # redirect one tensor of a valid index
        pos, value = index

        def mutate(raw):
            names = sorted(raw["weight_map"])
            raw["weight_map"][names[pos % len(names)]] = value
            return raw
        edit_json(path, mutate)
    else:
        path.write_text(json.dumps(index))
    _assert_clear(d)


TOKENIZER_KEYS = ["chat_template", "eos_token", "pad_token", "bos_token", "unk_token",
                  "model_max_length", "added_tokens_decoder", "tokenizer_class",
                  "additional_special_tokens", "extra_special_tokens",
                  "clean_up_tokenization_spaces"]
templates = st.sampled_from(["{% for m in messages %}", "{{ 1/0 }}", "{{ raise_exception('x') }}",
                             "{{ messages | nofilter }}", "{% if %}", "ok", ""])


@settings(FUZZ, max_examples=60)
@given(changes=st.lists(st.tuples(st.sampled_from(TOKENIZER_KEYS),
                                  st.one_of(st.just("<delete>"), junk, templates)),
                        min_size=1, max_size=3),
       whole=st.one_of(st.none(), junk))
def test_fuzz_tokenizer_config(tiny_dir, changes, whole):
    d = copy_model(tiny_dir)
    (d / "chat_template.jinja").unlink()    # so tokenizer_config.json's template is the one used
    path = d / "tokenizer_config.json"
    if whole is not None and not isinstance(whole, dict):
        path.write_text(json.dumps(whole))
    else:
        edit_json(path, lambda raw: _apply(raw, changes))
    _assert_clear(d)


# --------------------------------------------------------------------------- one test per family


@pytest.mark.parametrize("changes, pattern", [
    ({"num_attention_heads": 0}, "num_attention_heads must be an integer in \\[1, "),
    ({"vocab_size": "abc"}, "vocab_size must be an integer.*got 'abc'"),
    ({"vocab_size": None}, "vocab_size"),
    ({"vocab_size": 320.7}, "vocab_size.*got 320.7"),
    ({"vocab_size": True}, "vocab_size.*got True"),
    ({"hidden_size": -64}, "hidden_size"),
    ({"rms_norm_eps": "x"}, "rms_norm_eps must be a positive number"),
    ({"rms_norm_eps": float("nan")}, "rms_norm_eps"),
    ({"max_position_embeddings": None}, "max_position_embeddings.*got None"),
    ({"eos_token_id": "abc"}, "eos_token_id.*got 'abc'"),
    ({"eos_token_id": [1, None]}, "eos_token_id.*got \\[1, None\\]"),
    ({"eos_token_id": 10 ** 6}, "eos_token_id.*\\[0, 320\\)"),
    ({"architectures": [["x"]]}, "architectures must be a list of class names"),
    ({"tie_word_embeddings": "false"}, "tie_word_embeddings must be true or false"),
    ({"rope_theta": True}, "rope_theta must be a positive number.*got True"),
    ({"rope_theta": float("inf")}, "rope_theta"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": "x"}}, "rope_theta"),
    ({"hidden_size": 66}, "hidden_size \\(66\\) is not divisible by num_attention_heads"),
    ({"num_hidden_layers": 3_000_000}, "num_hidden_layers must be an integer in \\[1, 4096\\]"),
    ({"layer_types": 5}, "layer_types must be a list of strings"),
])
def test_config_values_are_checked(tiny_dir, changes, pattern):
    d = copy_model(tiny_dir)
    edit_json(d / "config.json", lambda raw: {**raw, **changes})
    with pytest.raises(ConfigValueError, match=pattern):
        specrt.LLM(d, dtype="float32")


@pytest.mark.parametrize("weight_map, pattern", [
    ([], "weight_map must be a non-empty object"),
    ({}, "weight_map must be a non-empty object"),
    ("x", "weight_map must be a non-empty object"),
    ({"model.norm.weight": 5}, "must be a shard file name, got 5"),
    ({"model.norm.weight": "../../etc/hostname"}, "outside the model directory"),
    ({"model.norm.weight": "/etc/hostname"}, "outside the model directory"),
])
def test_shard_index_is_checked(sharded_dir, weight_map, pattern):
    d = copy_model(sharded_dir)
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(IndexFileError, match=pattern):
        specrt.LLM(d, dtype="float32")


def test_an_index_that_puts_a_tensor_in_the_wrong_shard_is_blamed_not_the_shard(sharded_dir):
    """It read 'cannot read ...: File does not contain tensor ...; the file is corrupt or
    truncated' about a sound shard."""
    d = copy_model(sharded_dir)
    index = json.loads((d / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    name = next(n for n, f in index["weight_map"].items() if f == shards[0])
    index["weight_map"][name] = shards[1]
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(IndexFileError, match=rf"weight_map puts '{re.escape(name)}' in "
                                             rf"{shards[1]}, which does not hold it"):
        specrt.LLM(d, dtype="float32")


@pytest.mark.parametrize("name, make", [
    ("model.safetensors", os.mkfifo),
    ("config.json", os.mkfifo),
    ("tokenizer_config.json", os.mkfifo),
    ("tokenizer.json", os.mkdir),
])
def test_files_that_are_not_regular_files(tiny_dir, name, make):
    """Run in a subprocess with a timeout: if the check regresses, opening a FIFO blocks
    forever, and the suite must fail, not hang."""
    d = copy_model(tiny_dir)
    (d / name).unlink()
    make(d / name)
    code = ("import specrt, sys\n"
            "try:\n    specrt.LLM(sys.argv[1])\n"
            "except specrt.errors.NotRegularFileError as e:\n    print(e); sys.exit(3)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(d)], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert f"{name} is a" in proc.stdout and "not a regular file" in proc.stdout


@pytest.mark.parametrize("dtype", [torch.int32, torch.uint16, torch.bool, torch.float16])
def test_weights_stored_as_another_dtype(tiny_dir, dtype):
    """Integer or bool weights of the right shape used to load (cast to floats) and generate
    garbage; one tensor in fp16 among fp32 ones is a float checkpoint and loads."""
    from safetensors.torch import load_file, save_file

    d = copy_model(tiny_dir)
    tensors = load_file(d / "model.safetensors")
    name = "model.layers.0.self_attn.q_proj.weight"
    tensors[name] = tensors[name].to(dtype)
    save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})
    if dtype == torch.float16:
        _load_and_generate(d)
        return
    with pytest.raises(specrt.errors.CheckpointError,
                       match=rf"{name}' in model.safetensors is stored as \w+; specrt loads "
                             "float checkpoints"):
        specrt.LLM(d, dtype="float32")


@pytest.mark.parametrize("dtype", [torch.float64, torch.int8])
def test_a_whole_checkpoint_in_another_dtype_is_refused_for_its_dtype(tiny_dir, dtype):
    """Every tensor in F64 (twice the bytes) or I8 (half): the size check ran first and blamed
    config.json ("does not match the checkpoint"), which was right."""
    from safetensors.torch import load_file, save_file

    d = copy_model(tiny_dir)
    tensors = {k: v.to(dtype) for k, v in load_file(d / "model.safetensors").items()}
    save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(specrt.errors.CheckpointError, match=r"is stored as (F64|I8); specrt "
                                                            "loads float checkpoints"):
        specrt.LLM(d, dtype="float32")


def test_a_quantized_checkpoint_is_refused_by_name(tiny_dir):
    d = copy_model(tiny_dir)
    edit_json(d / "config.json",
              lambda raw: {**raw, "quantization_config": {"quant_method": "gptq", "bits": 4}})
    with pytest.raises(specrt.errors.ConfigError, match="quantization_config is set"):
        specrt.LLM(d, dtype="float32")


def test_unreadable_weights_say_permission_denied(tiny_dir, monkeypatch):
    """What the OS raises for a file the user may not read (safetensors reported it as "No
    such file or directory"; a sharded checkpoint got a raw PermissionError)."""
    from specrt.model import loader

    d = copy_model(tiny_dir)

    def no_weights(path, *args, **kwargs):
        if str(path).endswith(".safetensors"):
            raise PermissionError(13, "Permission denied", str(path))
        return open(path, *args, **kwargs)

    monkeypatch.setattr(loader, "open", no_weights, raising=False)
    with pytest.raises(specrt.errors.CheckpointError,
                       match=r"cannot read weights file .*model.safetensors: permission denied"):
        specrt.LLM(d, dtype="float32")


def test_config_size_checked_against_weight_files(tiny_dir, monkeypatch):
    from specrt.model import loader

    d = copy_model(tiny_dir)
    edit_json(d / "config.json", lambda raw: {**raw, "num_hidden_layers": 4000})
    tables = []                     # configs a per-layer table of tensor shapes was built for
    real = loader.expected_shapes
    monkeypatch.setattr(loader, "expected_shapes",
                        lambda cfg: (tables.append(cfg.num_layers), real(cfg))[1])
    with pytest.raises(WeightsSizeError, match="num_hidden_layers=4000.*does not match"):
        specrt.LLM(d, dtype="float32")
    assert tables == []             # refused on sizes alone, before any per-layer table
    edit_json(d / "config.json", lambda raw: {**raw, "num_hidden_layers": 1})
    with pytest.raises(WeightsSizeError):
        specrt.LLM(d, dtype="float32")


def test_kv_cache_checked_against_available_memory(tiny_dir, monkeypatch):
    from specrt.model import kv_cache

    with pytest.raises(MemoryCapacityError, match="lower max_seq_len or max_batch_size"):
        specrt.LLM(tiny_dir, max_seq_len=2 ** 20, max_batch_size=1024, dtype="float32")   # ~550 GB
    # one row (checked at load) fits in 8 MB, the engine's 8-row cache (16.8 MB) does not
    monkeypatch.setattr(kv_cache, "available_memory", lambda device: 8 << 20)
    with pytest.raises(MemoryCapacityError,
                       match=r"needs 16.8 MB .*max_batch_size 8 .*max_seq_len 4096.*has 8.4 MB"):
        specrt.LLM(tiny_dir, max_seq_len=4096, max_batch_size=8, dtype="float32")


def _drop(key):
    def mutate(raw):
        raw.pop(key)
        return raw
    return mutate


@pytest.mark.parametrize("fname, mutate, pattern", [
    ("tokenizer.json", lambda raw: {"version": "1.0"}, "tokenizer.json is not a tokenizers file"),
    ("tokenizer.json", _drop("added_tokens"), "added_tokens"),
    ("tokenizer.json", lambda raw: {**raw, "model": {"type": "Nope"}}, "cannot load the tokenizer"),
    ("tokenizer_config.json", lambda raw: [1, 2], "must hold a JSON object"),
    ("tokenizer_config.json", lambda raw: {**raw, "eos_token": 5}, "eos_token must be"),
    ("tokenizer_config.json", lambda raw: {**raw, "added_tokens_decoder": {"x": 1}},
     "cannot load the tokenizer"),
    # a typo in a token field: transformers added it as a new token past the vocabulary, and
    # the tokenizer was said to belong to another model
    ("tokenizer_config.json", lambda raw: {**raw, "eos_token": "<|im_end>"},
     r"eos_token '<\|im_end>' is not a token of tokenizer.json \(did you mean '<\|im_end\|>'"),
    ("tokenizer_config.json", lambda raw: {**raw, "pad_token": {"content": "<pad>"}},
     "pad_token '<pad>' is not a token of tokenizer.json; correct it"),
])
def test_tokenizer_files_are_checked(tiny_dir, fname, mutate, pattern):
    d = copy_model(tiny_dir)
    edit_json(d / fname, mutate)
    with pytest.raises(TokenizerFileError, match=pattern):
        specrt.LLM(d, dtype="float32")


@pytest.mark.parametrize("template", ["{% for m in messages %}", "{{ 1/0 }}",
                                      "{{ undefined_name.attr }}"])
def test_broken_chat_template(tiny_dir, template):
    d = copy_model(tiny_dir)
    (d / "chat_template.jinja").write_text(template)
    llm = specrt.LLM(d, max_seq_len=32, dtype="float32")
    try:
        with pytest.raises(TokenizerFileError, match="chat_template.jinja fails.*chat=False"):
            llm.generate("hi", max_new_tokens=2, chat=True)
        assert llm.generate("hi", max_new_tokens=2, chat=False).token_ids   # plain text works
    finally:
        llm.close()


def test_a_template_that_refuses_the_messages_blames_them_not_the_file(tiny_dir):
    """raise_exception(...) is a template turning down the caller's messages on purpose (roles
    that do not alternate): the caller's error, worded as the template words it."""
    d = copy_model(tiny_dir)
    (d / "chat_template.jinja").write_text(
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('the first message must be "
        "the user\\'s') }}{% endif %}{{ messages[0]['content'] }}")
    llm = specrt.LLM(d, max_seq_len=32, dtype="float32")
    try:
        with pytest.raises(SpecrtError) as caught:
            llm.generate(messages=[{"role": "assistant", "content": "hi"}], max_new_tokens=2)
        assert not isinstance(caught.value, TokenizerFileError)
        assert str(caught.value) == ("the model's chat template refuses these messages: the "
                                     "first message must be the user's")
        assert llm.generate(messages=[{"role": "user", "content": "hi"}],
                            max_new_tokens=2).token_ids
    finally:
        llm.close()


def test_a_tokenizer_of_another_model_is_refused_at_load(tiny_dir, tmp_path):
    """A tokenizer emitting ids past the embedding rows loaded, and a text prompt then failed
    with 'token id 386 outside the model's vocabulary', blaming the user's text."""
    from tests.tiny import make_model

    bigger = make_model(tmp_path / "big", "qwen2", vocab_size=400)
    d = copy_model(tiny_dir)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(bigger / name, d / name)
    with pytest.raises(TokenizerFileError, match="emits ids up to 399, past the model's "
                                                 "vocab_size 320"):
        specrt.LLM(d, dtype="float32", max_seq_len=32)


def test_chat_template_kwargs_reach_the_template_and_their_failures_blame_them(tiny_dir):
    d = copy_model(tiny_dir)
    (d / "chat_template.jinja").write_text(
        "{% if terse %}T:{% endif %}{{ messages[0]['content'] }}{{ 10 // (width if width is defined else 1) }}")
    llm = specrt.LLM(d, max_seq_len=32, dtype="float32")
    try:
        turns = [{"role": "user", "content": "hi"}]
        assert llm.tokenizer.chat_text(turns) == "hi10"
        assert llm.tokenizer.chat_text(turns, template_kwargs={"terse": True, "width": 5}) == \
            "T:hi2"
        with pytest.raises(SpecrtError) as caught:
            llm.encode(messages=turns, chat_template_kwargs={"width": 0})
        assert not isinstance(caught.value, TokenizerFileError)
        assert "fails with chat_template_kwargs ['width'] (ZeroDivisionError" in \
            str(caught.value)
    finally:
        llm.close()
