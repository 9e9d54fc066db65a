"""Tiny random models and a tiny tokenizer, built on the fly so tests need no downloads.

Models are made with transformers' own config classes and `save_pretrained`, so the files are
exactly what a real checkpoint looks like, and transformers' modeling code is the reference.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "The quick brown fox jumps over the lazy dog.",
    "Speculative decoding drafts tokens and verifies them in one pass.",
    "for i in range(10):\n    print(i)\n",
    "A refrigerator keeps food cold by moving heat outside.",
    "Once upon a time there was a small model and a big model.",
]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                 "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
                 "{% endif %}")


def save_tokenizer(out_dir: Path, vocab_size: int = 320, corpus=None) -> dict[str, int]:
    """A byte-level BPE trained on CORPUS (deterministic), saved with a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator((corpus or CORPUS) * 4, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>",
                                   additional_special_tokens=["<|im_start|>"])
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out_dir))
    return {s: tok.token_to_id(s) for s in SPECIALS}


def make_model(out_dir: Path, kind: str = "qwen2", vocab_size: int = 320, hidden: int = 64,
               layers: int = 2, heads: int = 4, kv_heads: int = 2, seed: int = 0,
               tokenizer: bool = True, eos: bool = True, max_shard_size=None,
               dtype=torch.float32, noise_from: Path | None = None, noise: float = 0.0,
               scale_logits: float = 1.0, corpus=None) -> Path:
    """Save a random Qwen2 (q/k/v bias, untied head) or Llama-style (no bias, tied) model.

    noise_from: start from that model's weights plus Gaussian noise of relative size `noise`
    (a draft that agrees with the target most of the time).
    """
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    specials = save_tokenizer(out_dir, vocab_size, corpus) if tokenizer else {}
    eos_id = specials.get("<|im_end|>", vocab_size - 1) if eos else None
    common = dict(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                  num_hidden_layers=layers, num_attention_heads=heads,
                  num_key_value_heads=kv_heads, max_position_embeddings=1024,
                  eos_token_id=eos_id, bos_token_id=None)
    torch.manual_seed(seed)
    if kind == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common, tie_word_embeddings=False))
    elif kind == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common, tie_word_embeddings=True))
    else:
        raise ValueError(kind)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 0.5)
            elif "norm" not in name:
                p.normal_(0.0, 0.08)
        if scale_logits != 1.0:
            model.get_output_embeddings().weight.mul_(scale_logits)
        if noise_from is not None:
            ref = type(model).from_pretrained(str(noise_from), dtype=torch.float32)
            ref_params = dict(ref.named_parameters())
            for name, p in model.named_parameters():
                base = ref_params[name]
                p.copy_(base + noise * base.std() * torch.randn_like(base))
    model.to(dtype)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(str(out_dir), **kwargs)
    if eos_id is not None:
        (out_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": [eos_id]}))
    return out_dir


def hf_model(model_dir: Path, dtype=torch.float32):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype).eval()


def hf_cache_kwarg(hf) -> str:
    """The name transformers' forward takes its KV cache by: `cache` since 5.2x, where
    `past_key_values` warns that it is deprecated; the GPU image's 5.17 knows only the old."""
    import inspect

    params = inspect.signature(hf.forward).parameters
    return "cache" if "cache" in params else "past_key_values"
