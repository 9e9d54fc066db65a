"""Hugging Face transformers: the comparison the benchmarks measure specrt against, never the
runtime. Every use of transformers' models in benchmarks/ goes through here.

Greedy only: sampling options a checkpoint's generation_config may carry are switched off
explicitly, so HF and specrt decode the same way. Loading and generating run on a thread that
ends with the call (machine.on_own_thread), so HF's torch ops leave no OpenMP team alive beside
an `LLM`'s. This module loads and generates; it does not time, print or judge the output.
"""
from __future__ import annotations

from pathlib import Path

from benchmarks.harness.cli import fail
from benchmarks.harness.machine import on_own_thread


def load(model_dir: Path, dtype: str, device: str = "cpu"):
    """transformers' own model for `model_dir` in `dtype` (a torch dtype name), eval mode,
    quiet; fails (exit 2) when transformers cannot load it."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        return on_own_thread(lambda: AutoModelForCausalLM.from_pretrained(
            str(model_dir), dtype=getattr(torch, dtype)).to(device).eval(), "hf-load")
    except (OSError, ValueError) as e:
        fail(f"transformers cannot load {model_dir}: {e}")


def generate(model, ids: list[int], max_new_tokens: int, force_length: bool = False,
             eos_ids=None, **kwargs) -> list[int]:
    """Greedy `model.generate` on one prompt of token ids -> the new token ids.
    force_length: exactly max_new_tokens (no stop at EOS); kwargs go to `generate`."""
    import torch

    x = torch.tensor([ids], dtype=torch.long, device=model.device)     # [1, prompt]
    eos = list(eos_ids) if eos_ids else model.generation_config.eos_token_id
    pad = eos[0] if isinstance(eos, (list, tuple)) else eos

    def run():
        with torch.inference_mode():
            return model.generate(x, attention_mask=torch.ones_like(x), do_sample=False,
                                  temperature=None, top_p=None, top_k=None,
                                  repetition_penalty=None, max_new_tokens=max_new_tokens,
                                  min_new_tokens=max_new_tokens if force_length else None,
                                  eos_token_id=eos, pad_token_id=pad, **kwargs)

    out = on_own_thread(run, "hf-generate")
    return out[0, len(ids):].tolist()                                  # out: [1, prompt + new]


def assisted_kwargs(assistant, k: int) -> dict:
    """`generate` kwargs for assisted decoding with `assistant` proposing exactly k tokens per
    round (constant schedule, confidence threshold off). Sets the assistant's
    generation_config: that is where transformers reads these knobs from."""
    gc = assistant.generation_config
    gc.num_assistant_tokens = k
    gc.num_assistant_tokens_schedule = "constant"
    gc.assistant_confidence_threshold = 0.0      # else K shrinks on low draft confidence
    return {"assistant_model": assistant}


def lookup_kwargs(k: int, max_ngram: int = 3) -> dict:
    """`generate` kwargs for prompt-lookup decoding: k tokens per round, n-grams up to
    max_ngram."""
    return {"prompt_lookup_num_tokens": k, "max_matching_ngram_size": max_ngram}
