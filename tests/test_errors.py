"""Bad input gets one SpecrtError that names the problem and the fix, never a raw traceback."""
import pytest
import torch

import specrt
from specrt.errors import CheckpointError, SpecrtError
from tests.helpers import copy_model, edit_json


def _edit_config(d, **changes):
    edit_json(d / "config.json", lambda raw: {**raw, **changes})


def test_missing_model_dir(tmp_path):
    with pytest.raises(SpecrtError, match="does not exist.*specrt.models fetch"):
        specrt.LLM(tmp_path / "nope", dtype="float32")


def test_missing_config_json(tiny_dir, tmp_path):
    d = copy_model(tiny_dir, tmp_path / "m")
    (d / "config.json").unlink()
    with pytest.raises(SpecrtError, match=r"config.json does not exist"):
        specrt.LLM(d, dtype="float32")


def test_bad_config_json(tiny_dir, tmp_path):
    d = copy_model(tiny_dir, tmp_path / "m")
    (d / "config.json").write_text("{not json")
    with pytest.raises(SpecrtError, match="not valid JSON"):
        specrt.LLM(d, dtype="float32")


def test_missing_weights(tiny_dir, tmp_path):
    d = copy_model(tiny_dir, tmp_path / "m")
    (d / "model.safetensors").unlink()
    with pytest.raises(SpecrtError, match="no model weights"):
        specrt.LLM(d, dtype="float32")


def test_corrupt_weights(tiny_dir, tmp_path):
    d = copy_model(tiny_dir, tmp_path / "m")
    data = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(data[: len(data) // 3])
    with pytest.raises(SpecrtError, match="corrupt or truncated"):
        specrt.LLM(d, dtype="float32")


def test_weights_that_make_nan_logits_are_an_error_not_an_answer_of_id_0(tiny_dir, tmp_path):
    """One NaN weight made every logit NaN, and greedy and sampled answers alike were id 0
    over and over, reported as a normal answer. Each request now fails with the cause (the
    engine takes the next one), and a sound model's answers are untouched by the check."""
    from safetensors.torch import load_file, save_file

    from specrt.errors import CheckpointError

    d = copy_model(tiny_dir, tmp_path / "m")
    sd = load_file(d / "model.safetensors")
    sd["model.layers.0.mlp.down_proj.weight"][0, 0] = float("nan")
    save_file(sd, d / "model.safetensors", metadata={"format": "pt"})
    llm = specrt.LLM(d, max_seq_len=64, dtype="float32")
    try:
        for kw in ({}, {"temperature": 1.0, "seed": 1}):
            with pytest.raises(CheckpointError, match="logits that are NaN or infinite"):
                llm.generate([5, 6, 7], max_new_tokens=4, **kw)
    finally:
        llm.close()
    sound = specrt.LLM(tiny_dir, max_seq_len=64, dtype="float32")
    try:
        assert len(sound.generate([5, 6, 7], max_new_tokens=4).token_ids) == 4
    finally:
        sound.close()


def test_a_prompt_with_nan_logits_fails_alone_beside_others_in_its_prefill(tiny_dir, tmp_path):
    """Only prompts holding a token whose embedding is NaN break: prefilled in one pass with a
    sound prompt, the whole admission failed; the sound request now gets its answer alone."""
    from safetensors.torch import load_file, save_file

    from specrt.errors import CheckpointError

    d = copy_model(tiny_dir, tmp_path / "m")
    sd = load_file(d / "model.safetensors")
    sd["model.embed_tokens.weight"][9] = float("nan")
    save_file(sd, d / "model.safetensors", metadata={"format": "pt"})
    llm = specrt.LLM(d, max_seq_len=64, dtype="float32", max_batch_size=2)
    try:
        alone = llm.generate([5, 6, 7], max_new_tokens=4, temperature=1.0, seed=3).token_ids
        for _ in range(3):
            sound = llm.submit([5, 6, 7], max_new_tokens=4, temperature=1.0, seed=3)
            broken = llm.submit([9, 5], max_new_tokens=4)
            with pytest.raises(CheckpointError, match="logits that are NaN or infinite"):
                broken.result()
            assert sound.result().token_ids == alone
    finally:
        llm.close()


def test_a_bf16_checkpoint_short_of_one_projection_names_it(tiny_dir, tmp_path):
    """At 2 bytes a parameter a missing projection also fails the size check, which blamed
    config.json ("check num_hidden_layers, hidden_size ...") for a checkpoint short of one
    tensor; the layers are the config's, so the tensor is named."""
    from safetensors.torch import load_file, save_file

    d = copy_model(tiny_dir, tmp_path / "m")
    sd = {k: v.to(torch.bfloat16) for k, v in load_file(d / "model.safetensors").items()}
    sd.pop("model.layers.1.mlp.up_proj.weight")
    save_file(sd, d / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError,
                       match="missing tensor 'model.layers.1.mlp.up_proj.weight'") as e:
        specrt.LLM(d, dtype="bfloat16")
    assert "check num_hidden_layers" not in str(e.value)


def test_missing_and_misshaped_tensor(tiny_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    d = copy_model(tiny_dir, tmp_path / "m")
    sd = load_file(d / "model.safetensors")
    sd.pop("model.layers.1.mlp.up_proj.weight")
    save_file(sd, d / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(SpecrtError, match="missing tensor 'model.layers.1.mlp.up_proj.weight'"):
        specrt.LLM(d, dtype="float32")
    sd["model.layers.1.mlp.up_proj.weight"] = sd["model.layers.1.mlp.down_proj.weight"].clone()
    save_file(sd, d / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(SpecrtError, match="'model.layers.1.mlp.up_proj.weight'.*has shape"):
        specrt.LLM(d, dtype="float32")


def test_unknown_architecture(tiny_dir, tmp_path):
    d = copy_model(tiny_dir, tmp_path / "m")
    _edit_config(d, architectures=["GPT2LMHeadModel"], model_type="gpt2")
    with pytest.raises(SpecrtError, match="unsupported architecture 'GPT2LMHeadModel'"):
        specrt.LLM(d, dtype="float32")


@pytest.mark.parametrize("changes, pattern", [
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_type 'yarn'"),
    ({"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}},
     "rope_type 'linear'"),
    ({"use_sliding_window": True}, "use_sliding_window"),
])
def test_unsupported_config_features(tiny_dir, tmp_path, changes, pattern):
    d = copy_model(tiny_dir, tmp_path / "m")
    _edit_config(d, **changes)
    with pytest.raises(SpecrtError, match=pattern):
        specrt.LLM(d, dtype="float32")


def test_prompt_longer_than_cache(tiny_dir):
    llm = specrt.LLM(tiny_dir, max_seq_len=32, dtype="float32")
    with pytest.raises(SpecrtError, match=r"= 40 exceeds max_seq_len \(32\)"):
        llm.generate(list(range(1, 21)), max_new_tokens=20)
    with pytest.raises(SpecrtError, match=r"K\+1"):
        llm.generate(list(range(1, 21)), max_new_tokens=8,
                     speculative={"method": "ngram", "num_speculative_tokens": 8})


def test_empty_prompt(tiny_dir):
    llm = specrt.LLM(tiny_dir, max_seq_len=32, dtype="float32")
    for empty in ("", []):
        with pytest.raises(SpecrtError, match="prompt is empty"):
            llm.generate(empty, max_new_tokens=4)


def test_token_ids_outside_vocabulary(tiny_dir):
    llm = specrt.LLM(tiny_dir, max_seq_len=32, dtype="float32")
    with pytest.raises(SpecrtError, match="outside the model's vocabulary"):
        llm.generate([1, 100000], max_new_tokens=4)


def test_more_prompts_than_slots_queue_and_each_equals_its_single_run(tiny_dir):
    """Continuous batching: a third prompt waits for a free slot instead of failing."""
    llm = specrt.LLM(tiny_dir, max_seq_len=32, max_batch_size=2, dtype="float32")
    batch = llm.generate([[1], [2], [3]], max_new_tokens=2)
    assert [r.token_ids for r in batch] == [llm.generate(p, max_new_tokens=2).token_ids
                                            for p in ([1], [2], [3])]


def test_bad_sampling_params(tiny_dir):
    llm = specrt.LLM(tiny_dir, max_seq_len=32, dtype="float32")
    for kwargs, pattern in [({"temperature": -1}, "temperature"), ({"top_p": 0}, "top_p"),
                            ({"top_k": -2}, "top_k"), ({"max_new_tokens": 0}, "max_new_tokens")]:
        with pytest.raises(SpecrtError, match=pattern):
            llm.generate([1, 2], **kwargs)


def test_bad_dtype_and_device(tiny_dir):
    with pytest.raises(SpecrtError, match="dtype 'int8' is not supported"):
        specrt.LLM(tiny_dir, dtype="int8")
    for name in ("tpu:0", "tpu", "cuda:x"):
        with pytest.raises(SpecrtError) as e:
            specrt.LLM(tiny_dir, device=name, dtype="float32")
        # one sentence of ours, not torch's list of ~20 device types ("..., lazy, ;")
        assert str(e.value) == (f"device {name!r} is not a device name; use 'cpu', 'cuda' "
                                "or 'cuda:N'")
        # the model runtime's own loader checks it the same way (it raised torch's list)
        from specrt.model import Transformer

        with pytest.raises(SpecrtError) as e2:
            Transformer.from_dir(tiny_dir, device=name)
        assert str(e2.value) == str(e.value)


def test_a_file_given_as_the_model_directory_is_named_as_such(tmp_path):
    """The model runtime's loader said "cannot stat model config F/config.json: Not a
    directory; replace it with the real file"; it now says what LLM says."""
    from specrt.model import Transformer

    f = tmp_path / "model.py"
    f.write_text("")
    for load in (specrt.LLM, Transformer.from_dir):
        with pytest.raises(SpecrtError, match=f"^{f} is a file, not a model directory; pass "
                                              "the directory that holds config.json"):
            load(f)


@pytest.mark.parametrize("changes, pattern", [
    ({"num_attention_heads": 0}, "num_attention_heads must be an integer"),
    ({"tie_word_embeddings": "false"}, "tie_word_embeddings must be true or false"),
])
def test_config_value_names_field_value_and_fix(tiny_dir, tmp_path, changes, pattern):
    """More of this family, and the other bad-file families, in test_fuzz_files.py."""
    d = copy_model(tiny_dir, tmp_path / "m")
    _edit_config(d, **changes)
    with pytest.raises(SpecrtError, match=pattern + ".*fix"):
        specrt.LLM(d, dtype="float32")


def test_sharded_index_weight_map_list(tiny_dir, tmp_path):
    d = copy_model(tiny_dir, tmp_path / "m")
    (d / "model.safetensors.index.json").write_text('{"weight_map": []}')
    with pytest.raises(SpecrtError, match="weight_map must be a non-empty object"):
        specrt.LLM(d, dtype="float32")
