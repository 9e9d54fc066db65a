"""A bf16 prompt prefilled alone takes the library GEMM from `gemv.PROMPT_LIBRARY_ROWS` tokens
(where oneDNN has AMX it is several times faster than the skinny kernels there), while every
pass that may be shared keeps the kernels' bits; so the engine prefills such a prompt alone,
and a request's tokens still never depend on who else was admitted with it."""
import pytest
import torch
import torch.nn.functional as F

import specrt
from specrt.engine import engine as engine_mod
from specrt.kernels.cpu import gemv, gemv_amx, ops as cpu_ops
from specrt.model import Transformer
from specrt.model.backends.base import Pass
from specrt.model.backends.torch_ref import TorchReference

needs_kernel = pytest.mark.skipif(not cpu_ops.AVAILABLE,
                                  reason="CPU lacks AVX-512 BF16 and AVX2: the PyTorch path serves")
FROM = 9          # PROMPT_LIBRARY_ROWS as on a CPU with AMX, whatever this one has


@pytest.fixture
def library_from_9(monkeypatch):
    """Also keeps bf16 models off AMX tiles (a model packed for them runs every pass there)."""
    monkeypatch.setattr(gemv, "PROMPT_LIBRARY_ROWS", FROM)
    monkeypatch.setattr(gemv_amx, "AVAILABLE", False)


def _library_calls(monkeypatch) -> list:
    """Row counts of every `F.linear` call from now on."""
    seen, real = [], F.linear
    monkeypatch.setattr(F, "linear", lambda x, w, b=None: seen.append(x.numel() // x.shape[-1])
                        or real(x, w, b))
    return seen


@needs_kernel
def test_a_lone_bf16_prompt_takes_the_library_from_prompt_library_rows(tiny_noeos_dir,
                                                                       library_from_9,
                                                                       monkeypatch):
    model = Transformer.from_dir(tiny_noeos_dir, dtype="bfloat16", max_seq_len=64)
    assert model.backend.name == "cpu_native"
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.cfg.vocab_size, (2, 20), generator=g)
    seen = _library_calls(monkeypatch)

    def hidden(x, starts, valid, model=model):
        cache = model.new_cache(len(starts), 64)
        cache.advance(starts)
        return model.backend.hidden(model, x, cache, Pass(x.shape[1], starts, valid))

    short = hidden(ids[:1, :FROM - 1], [0], [FROM - 1])
    assert seen == [], "a prompt of PROMPT_LIBRARY_ROWS - 1 tokens stays on the kernels"
    hidden(ids[:1, :12], [5], [12])
    hidden(ids[:, :12], [0, 0], [12, 12])
    assert seen == [], "a pass after position 0, or of two rows, stays on the kernels"
    lone = hidden(ids[:1, :FROM], [0], [FROM])
    assert seen == [FROM] * 4 * model.cfg.num_layers
    # ... with the bits of the reference's loop on the library GEMM
    ref = Transformer.from_dir(tiny_noeos_dir, dtype="bfloat16", max_seq_len=64,
                               backend="torch_ref")
    want = hidden(ids[:1, :FROM], [0], [FROM], model=ref)
    assert torch.equal(lone, want)
    # and the shorter prompt has the kernels' bits: those of its tokens in a verify-sized pass
    # shared with another row
    shared = hidden(ids[:, :FROM - 1], [0, 0], [FROM - 1, FROM - 1])
    assert torch.equal(short, shared[:FROM - 1])


@needs_kernel
def test_shared_prompt_tokens(tiny_noeos_dir, tiny128_dir, library_from_9):
    bf16 = Transformer.from_dir(tiny_noeos_dir, dtype="bfloat16", max_seq_len=64)
    fp32 = Transformer.from_dir(tiny_noeos_dir, dtype="float32", max_seq_len=64)
    int8 = Transformer.from_dir(tiny128_dir, dtype="bfloat16", max_seq_len=64, quant="int8")
    backend = bf16.backend
    assert backend.shared_prompt_tokens(bf16) == FROM - 1
    assert backend.shared_prompt_tokens(fp32) == backend.batch_invariant_tokens
    assert backend.shared_prompt_tokens(int8) == backend.batch_invariant_tokens
    assert TorchReference().shared_prompt_tokens(bf16) == 0


@pytest.mark.skipif(not gemv_amx.AVAILABLE, reason="this CPU has no AMX-BF16")
def test_a_model_on_amx_tiles_shares_prompts_up_to_the_batch_invariant_length(tiny_noeos_dir):
    """On AMX tiles a prompt's pass of any length up to 32 tokens has the bits of its rows
    alone, as fast as the library's: nothing to keep apart."""
    model = Transformer.from_dir(tiny_noeos_dir, dtype="bfloat16", max_seq_len=64)
    assert model.backend.amx
    assert model.backend.shared_prompt_tokens(model) == model.backend.batch_invariant_tokens


@needs_kernel
@pytest.mark.parametrize("speculative", [None, {"method": "ngram", "num_speculative_tokens": 4}])
def test_prompts_admitted_together_give_their_tokens_alone(tiny_noeos_dir, library_from_9,
                                                           monkeypatch, speculative):
    """Three prompts admitted in one step: the two of PROMPT_LIBRARY_ROWS tokens or more are
    prefilled each on its own (on the library), the short one in a pass of its own kind, and
    each request's tokens are those it gets alone."""
    llm = specrt.LLM(tiny_noeos_dir, dtype="bfloat16", max_seq_len=128, max_batch_size=3)
    prompts = [[5, 9, 2, 31, 7, 7, 1, 3, 8, 8, 2, 11], [12, 3, 3, 40],
               [77, 1, 2, 77, 1, 2, 77, 1, 2, 9, 4, 4, 5, 6, 7, 20, 21, 22, 23, 24]]
    alone = [llm.generate(p, max_new_tokens=24, speculative=speculative).token_ids
             for p in prompts]
    groups = []
    real = engine_mod.Engine._prefill
    monkeypatch.setattr(engine_mod.Engine, "_prefill",
                        lambda self, group: groups.append(len(group)) or real(self, group))
    got = llm.generate(prompts, max_new_tokens=24, speculative=speculative)
    assert [r.token_ids for r in got] == alone
    assert sorted(groups) == [1, 1, 1], "each prompt past 8 tokens is prefilled on its own"
