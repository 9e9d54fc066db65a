"""The default real pair (Qwen2.5-Coder-1.5B/0.5B-Instruct) through specrt on CPU: the draft
against Hugging Face in fp32, and speculative decoding with the shipped defaults (the dtype
"auto" picks, the draft in int8 where the CPU's int8 kernel runs, its shortlisted vocabulary)
against plain decoding."""
import pytest
import torch

import specrt
from specrt import models

pytestmark = pytest.mark.real_model

PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "Explain what a hash map is in two sentences.",
    "Rewrite this sentence in the passive voice: The cat chased the mouse.",
]


@pytest.fixture(scope="module")
def draft_dir(model_dirs):
    return model_dirs[models.DEFAULT_DRAFT]


@pytest.fixture(scope="module")
def target_dir(model_dirs):
    return model_dirs[models.DEFAULT_TARGET]


def test_real_draft_matches_transformers(draft_dir):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(draft_dir), dtype=torch.float32).eval()
    llm = specrt.LLM(draft_dir, dtype="float32", max_seq_len=256)
    for prompt in PROMPTS:
        ids = llm.encode(prompt, chat=True)
        with torch.no_grad():
            ref = hf(torch.tensor([ids])).logits[0]
        ours = llm.target.forward(torch.tensor([ids]), llm.target.new_cache(1, 256))[0]
        rel = ((ours - ref).norm() / ref.norm()).item()
        assert rel < 1e-3, f"prefill logits differ by {rel:.2e} (relative)"
        hf_ids = hf.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False,
                             eos_token_id=None, pad_token_id=0)[0, len(ids):].tolist()
        ours = llm.generate(ids, max_new_tokens=32).token_ids
        assert ours == hf_ids[: len(ours)]
        assert len(ours) == 32 or ours[-1] in llm.eos_ids     # stopped early only at EOS


@pytest.fixture(scope="module")
def pair(target_dir, draft_dir):
    return specrt.LLM(target_dir, draft=draft_dir, max_seq_len=512)     # the defaults


@pytest.fixture(scope="module")
def plain(pair):
    return {p: pair.generate(p, chat=True, max_new_tokens=48) for p in PROMPTS[:2]}


@pytest.mark.parametrize("spec", [{"method": "draft_model", "num_speculative_tokens": 4},
                                  {"method": "ngram", "num_speculative_tokens": 4}],
                         ids=["draft_model", "ngram"])
def test_real_pair_speculative_greedy_equals_plain(pair, plain, spec):
    for prompt in PROMPTS[:2]:
        fast = pair.generate(prompt, chat=True, max_new_tokens=48, speculative=spec)
        assert fast.token_ids == plain[prompt].token_ids
        assert fast.text == plain[prompt].text
        if spec["method"] == "draft_model":
            assert fast.stats["acceptance_rate"] > 0.3      # a real draft, really agreeing
