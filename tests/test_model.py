"""The runtime against transformers' own Qwen2/Llama code, on tiny random checkpoints (fp32)."""
import re

import pytest
import torch

import specrt
from specrt.model import Transformer
from tests.tiny import hf_cache_kwarg, hf_model, make_model


@pytest.fixture(params=["qwen2", "llama"])
def model_dir(request, tiny_noeos_dir, tiny_llama_dir):
    return tiny_noeos_dir if request.param == "qwen2" else tiny_llama_dir


def test_prefill_and_decode_logits_match_transformers(model_dir):
    hf = hf_model(model_dir)
    ours = Transformer.from_dir(model_dir, max_seq_len=128)
    cache = ours.new_cache(1, 128)
    ids = torch.tensor([[3, 17, 42, 99, 5, 250, 8]])
    with torch.no_grad():
        ref = hf(ids, use_cache=True)
    got = ours.forward(ids, cache)
    torch.testing.assert_close(got, ref.logits, atol=1e-4, rtol=1e-4)
    past = ref.past_key_values
    seq = ids
    for step in range(6):
        nxt = got[:, -1:].argmax(-1)
        with torch.no_grad():
            ref = hf(nxt, use_cache=True, **{hf_cache_kwarg(hf): past})
        past = ref.past_key_values
        got = ours.forward(nxt, cache)
        torch.testing.assert_close(got, ref.logits, atol=1e-4, rtol=1e-4,
                                   msg=lambda m: f"decode step {step}: {m}")
        seq = torch.cat([seq, nxt], 1)
    assert cache.host_lengths() == [seq.shape[1]]


def test_64_greedy_tokens_equal_transformers_generate(model_dir):
    hf = hf_model(model_dir)
    llm = specrt.LLM(model_dir, max_seq_len=256, dtype="float32")
    for prompt in ([1, 2, 3, 4, 5], [200, 7, 19]):
        ref = hf.generate(torch.tensor([prompt]), max_new_tokens=64, do_sample=False,
                          eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
        res = llm.generate(prompt, max_new_tokens=64)
        assert res.token_ids == ref
        assert res.stats["new_tokens"] == 64 and res.finish_reason == "length"


def test_batch_rows_equal_single_runs(tiny_noeos_dir):
    llm = specrt.LLM(tiny_noeos_dir, max_seq_len=256, max_batch_size=3, dtype="float32")
    prompts = [[5, 6, 7], list(range(10, 31)), [250]]
    batch = llm.generate(prompts, max_new_tokens=24)
    assert [r.token_ids for r in batch] == [llm.generate(p, max_new_tokens=24).token_ids
                                            for p in prompts]


def test_rollback_then_forward_equals_fresh_prefix(tiny_noeos_dir):
    model = Transformer.from_dir(tiny_noeos_dir, max_seq_len=64)
    ids = torch.randint(0, 300, (1, 10), generator=torch.Generator().manual_seed(1))
    cache = model.new_cache(1, 64)
    model.forward(ids, cache)
    cache.truncate([6])                                   # roll back 4 tokens
    nxt = torch.tensor([[77, 78]])
    got = model.forward(nxt, cache)
    fresh = model.new_cache(1, 64)
    ref = model.forward(torch.cat([ids[:, :6], nxt], 1), fresh)[:, -2:]
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


def test_an_engine_longer_than_the_rotary_tables_is_refused(tiny_noeos_dir):
    """Positions past the tables the model was loaded for would be clamped: wrong, silently."""
    from specrt.engine.engine import Engine
    from specrt.errors import ConfigError

    model = Transformer.from_dir(tiny_noeos_dir, max_seq_len=64)
    assert model.max_positions == 64 and Engine(model, max_seq_len=64).max_seq_len == 64
    with pytest.raises(ConfigError, match="target model was loaded for \\(64 positions\\)"):
        Engine(model, max_seq_len=65)


def test_sharded_checkpoint_in_the_hugging_face_cache_layout_loads(tmp_path):
    """The hub's cache links every file of snapshots/<rev>/ to ../../blobs/<hash>; a shard
    named inside the directory was refused as "outside the model directory" because its link
    resolves into blobs/."""
    d = make_model(tmp_path / "sharded", "qwen2", seed=3, eos=False, tokenizer=False,
                   max_shard_size="60KB")
    blobs, snap = tmp_path / "hub" / "blobs", tmp_path / "hub" / "snapshots" / "abc123"
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    for i, f in enumerate(sorted(d.iterdir())):
        f.rename(blobs / f"blob{i}")
        (snap / f.name).symlink_to(f"../../blobs/blob{i}")
    assert len(list(snap.glob("model-*.safetensors"))) > 1
    ours = Transformer.from_dir(snap, max_seq_len=32)
    ids = torch.tensor([[1, 2, 3, 4]])
    torch.testing.assert_close(ours.forward(ids, ours.new_cache(1, 32)),
                               hf_model(snap)(ids).logits, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("backend", ["torch_ref", "cpu_native"])
@pytest.mark.parametrize("max_seq_len", [0, -5, 2.5, True])
def test_a_max_seq_len_below_one_is_refused_at_load(tiny_noeos_dir, backend, max_seq_len):
    """0 rows of rotary tables: the C++ layer loop read row -1 of an empty table (a segfault),
    torch_ref raised an IndexError, and -5 a RuntimeError from torch.arange."""
    from specrt.errors import ArgumentError

    with pytest.raises(ArgumentError, match="max_seq_len must be an integer >= 1"):
        Transformer.from_dir(tiny_noeos_dir, dtype="bfloat16", max_seq_len=max_seq_len,
                             backend=backend)


@pytest.mark.parametrize("rows", [[0, 5, 1000], [0, -1]])
def test_head_rows_outside_the_vocabulary_are_refused(tiny_noeos_dir, rows):
    """1000 >= V gave an IndexError; -1 was kept, scoring the last id under the name -1."""
    from specrt.errors import ArgumentError

    with pytest.raises(ArgumentError, match=r"head_rows\[\] must be an integer in 0\.\.319"):
        Transformer.from_dir(tiny_noeos_dir, max_seq_len=16, head_rows=rows)


@pytest.mark.parametrize("backend", ["torch_ref", "cpu_native"])
def test_a_pass_of_bad_ids_or_counts_is_one_value_error(tiny_noeos_dir, backend):
    """-1 was read as the last id (an embedding lookup wraps), silently; the others raised
    IndexErrors or unpacking errors from inside the backends."""
    model = Transformer.from_dir(tiny_noeos_dir, dtype="bfloat16", max_seq_len=16,
                                 backend=backend)
    V = model.cfg.vocab_size
    bad = [(torch.tensor([[3, -1]]), {}, f"token ids in 0..{V - 1}, got -1"),
           (torch.tensor([[3, V]]), {}, f"token ids in 0..{V - 1}, got {V}"),
           (torch.tensor([[3.0, 4.0]]), {}, "an int64 tensor"),
           (torch.tensor([3, 4]), {}, "an int64 tensor"),
           (torch.zeros(1, 0, dtype=torch.long), {}, "T >= 1"),
           (torch.tensor([[3], [4], [5]]), {}, "B <= 2"),
           (torch.tensor([[3, 4]]), {"num_valid": [5]}, "num_valid must be 1 ints in 0..2"),
           (torch.tensor([[3, 4]]), {"num_valid": [-1]}, "num_valid must be 1 ints in 0..2"),
           (torch.tensor([[3, 4]]), {"num_valid": [1, 2]}, "num_valid must be 1 ints in 0..2")]
    for ids, kwargs, message in bad:
        cache = model.new_cache(2, 16)
        with pytest.raises(ValueError, match=f"^forward: .*{re.escape(message)}"):
            model.forward(ids, cache, **kwargs)
        assert cache.host_lengths() == [0, 0]          # refused before anything was written
    out = model.forward(torch.tensor([[3, V - 1]]), model.new_cache(2, 16))
    assert out.shape == (1, 2, V)


def test_sharded_checkpoint_loads(tmp_path):
    d = make_model(tmp_path / "sharded", "qwen2", seed=3, eos=False, tokenizer=False,
                   max_shard_size="60KB")
    assert (d / "model.safetensors.index.json").exists()
    assert len(list(d.glob("model-*.safetensors"))) > 1
    hf = hf_model(d)
    ours = Transformer.from_dir(d, max_seq_len=32)
    ids = torch.tensor([[1, 2, 3, 4]])
    torch.testing.assert_close(ours.forward(ids, ours.new_cache(1, 32)),
                               hf(ids).logits, atol=1e-4, rtol=1e-4)


def test_bf16_load_and_generate(tiny_noeos_dir):
    llm = specrt.LLM(tiny_noeos_dir, dtype="bfloat16", max_seq_len=64)
    assert llm.target.embed.dtype == torch.bfloat16
    assert llm.engine.cache.k.dtype == torch.bfloat16
    ours = llm.target.forward(torch.tensor([[1, 2, 3]]), llm.target.new_cache(1, 64))
    ref = hf_model(tiny_noeos_dir, torch.bfloat16)(torch.tensor([[1, 2, 3]])).logits.float()
    torch.testing.assert_close(ours, ref, atol=0.1, rtol=0.05)
    assert len(llm.generate([1, 2, 3], max_new_tokens=8).token_ids) == 8


def test_classic_and_transformers5_config_dialects_agree(tiny_noeos_dir, tmp_path):
    import json
    import shutil

    from specrt.model.config import ModelConfig

    new = ModelConfig.from_dir(tiny_noeos_dir)
    raw = json.loads((tiny_noeos_dir / "config.json").read_text())
    theta = raw.pop("rope_parameters")["rope_theta"]
    raw.pop("layer_types", None)
    raw.update(rope_theta=theta, rope_scaling=None)
    classic_dir = tmp_path / "classic"
    shutil.copytree(tiny_noeos_dir, classic_dir)
    (classic_dir / "config.json").write_text(json.dumps(raw))
    assert ModelConfig.from_dir(classic_dir) == new


@pytest.mark.parametrize("same", [False, True])
def test_a_tied_config_with_its_own_lm_head_runs_as_transformers_does(tiny_llama_dir, tmp_path,
                                                                     same, caplog):
    """Some fine-tunes keep tie_word_embeddings true yet store a trained lm_head.weight:
    transformers then uses it (unties); so must specrt, and say so. An equal copy is dropped."""
    from safetensors.torch import load_file, save_file

    from tests.helpers import copy_model

    d = copy_model(tiny_llama_dir, tmp_path / "m")
    weights = load_file(d / "model.safetensors")
    assert "lm_head.weight" not in weights
    embed = weights["model.embed_tokens.weight"]
    weights["lm_head.weight"] = embed.clone() if same else torch.randn(
        embed.shape, generator=torch.Generator().manual_seed(0))
    save_file(weights, d / "model.safetensors", metadata={"format": "pt"})
    ids = torch.tensor([[3, 17, 42, 99, 5]])
    with torch.no_grad():
        ref = hf_model(d)(ids).logits
    with caplog.at_level("WARNING", logger="specrt.model"):
        ours = Transformer.from_dir(d, max_seq_len=64)
    torch.testing.assert_close(ours.forward(ids, ours.new_cache(1, 64)), ref, atol=1e-4,
                               rtol=1e-4)
    assert ("differs from the embeddings" in caplog.text) == (not same), caplog.text
    assert (ours.lm_head.weight.data_ptr() == ours.embed.data_ptr()) == same


@pytest.mark.parametrize("rope, theta", [
    ({"rope_scaling": {"rope_type": "default", "rope_theta": 50.0}}, 50.0),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 50.0}}, 50.0),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 50.0},
      "rope_scaling": {"rope_type": "default", "rope_theta": 300.0}}, 300.0),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 50.0},
      "rope_scaling": {"rope_type": "default"}}, 7.0),
])
def test_rope_theta_is_read_where_transformers_reads_it(tiny_noeos_dir, tmp_path, rope, theta):
    """rope_scaling, when set, stands in for rope_parameters; a block's rope_theta wins over
    the top level's (here 7)."""
    from tests.helpers import copy_model, edit_json

    d = copy_model(tiny_noeos_dir, tmp_path / "m")
    edit_json(d / "config.json", lambda c: {**c, "rope_theta": 7.0, **rope})
    ids = torch.tensor([[3, 17, 42, 99, 5, 250, 8, 11]])
    with torch.no_grad():
        ref = hf_model(d)(ids).logits
    ours = Transformer.from_dir(d, max_seq_len=64)
    assert ours.cfg.rope_theta == theta
    torch.testing.assert_close(ours.forward(ids, ours.new_cache(1, 64)), ref, atol=1e-4,
                               rtol=1e-4)
