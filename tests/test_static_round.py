"""The graphed round (`specrt.engine.static_round`), its bodies run eagerly on the CPU on the
same static buffers: greedy speculative output equals plain greedy output token for token, a
seeded sampled request gets the eager engine's tokens, the device section between staging and
read-back never syncs with the host, each round reads back exactly once, and no buffer is
reallocated across rounds."""
import os
import sys

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from specrt.engine.engine import Engine
from specrt.engine.request import Request
from specrt.model.backends import cuda as cuda_backend
from specrt.model.config import ModelConfig
from specrt.model.loader import load_state_dict
from specrt.model.transformer import Transformer
from specrt.spec.config import SpecConfig
from specrt.spec.sampling import SamplingParams
from tests.tiny import make_model

MAX_SEQ = 128
PROMPTS = [list(range(40, 70)), [5, 6, 7, 8], [250, 3], [9, 9, 9, 9, 9, 9]]
BUDGETS = [40, 23, 31, 17]           # rows finish at different rounds: idle rows in the batch


def _drafting_k(engine: Engine) -> Engine:
    """An eager engine whose draft model drafts all K every round, as the static loop does
    (no stop on its confidence, at an end id or at the budget), so that a seeded sampled
    request draws what it draws on the static path."""
    engine.draft_drafter.stop_below = 0.0
    engine.draft_drafter.cut_short = False
    return engine


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """Head size 64 (what the CUDA backend's fused kernels serve) and a draft that agrees with
    the target most of the time."""
    shape = dict(hidden=128, heads=2, kv_heads=1, eos=False)
    target = make_model(tmp_path_factory.mktemp("round_target"), "qwen2", seed=3, **shape)
    draft = make_model(tmp_path_factory.mktemp("round_draft"), "qwen2", seed=4,
                       noise_from=target, noise=0.05, **shape)
    return target, draft


def _model(model_dir, backend) -> Transformer:
    cfg = ModelConfig.from_dir(model_dir)
    return Transformer(cfg, load_state_dict(model_dir, cfg, torch.float32), MAX_SEQ, backend)


@pytest.fixture(scope="module")
def models(dirs):
    """backend name -> (target, draft)."""
    return {name: (_model(dirs[0], make()), _model(dirs[1], make()))
            for name, make in (("torch_ref", lambda: "torch_ref"), ("cuda", cuda_backend.Cuda))}


def generate(engine: Engine, prompts, spec: SpecConfig | None, params=None, budgets=BUDGETS,
             record: list | None = None) -> tuple[list[list[int]], int]:
    """(each prompt's output, the rounds it took), all prompts admitted at once; `record`
    gets every step."""
    params = params or [SamplingParams()] * len(prompts)
    reqs = [Request(tuple(p), n, q, spec) for p, n, q in zip(prompts, budgets, params)]
    out = {r.request_id: [] for r in reqs}
    for r in reqs:
        engine.reserve(r)
    steps = engine.prefill_reserved()
    rounds = 0
    while steps:
        for s in steps:
            out[s.request_id] += s.new_tokens
        if record is not None:
            record += steps
        steps = engine.step()
        rounds += bool(steps)
        # the host mirrors (what eager passes and capacity checks read) match the device
        for cache in (engine.cache, engine.draft_drafter.cache if engine.draft_drafter else None):
            if cache is not None:
                assert cache.host_lengths() == cache.lengths.tolist()
    return [out[r.request_id] for r in reqs], rounds


class NoHostSync(TorchDispatchMode):
    """Fails on what would sync the host with a GPU or build a tensor from Python data: reading
    a tensor's value (`item`, `bool`, `int`, `tolist`, `numpy`) or `torch.tensor(list)`.

    Except inside CPU_ONLY: input checks that run only on CPU tensors (`if not q.is_cuda:` in
    the Triton launcher, `if not lens.is_cuda:` in the reference attention, which CUDA tensors
    never reach: the dispatcher sends them to Triton)."""

    FORBIDDEN = {"_local_scalar_dense", "item", "lift_fresh", "lift_fresh_copy", "is_nonzero",
                 "equal"}
    CPU_ONLY = {("verify_attention.py", "_check_common"), ("reference.py", "verify_attention")}

    def __init__(self):
        super().__init__()
        self.ops = 0
        self.cpu_only_reads = 0

    def __enter__(self):
        self._saved = torch.Tensor.tolist, torch.Tensor.numpy

        def refuse(*_, **__):
            raise AssertionError("the device section read a tensor on the host")
        torch.Tensor.tolist = torch.Tensor.numpy = refuse       # not dispatched: caught here
        return super().__enter__()

    def __exit__(self, *exc):
        torch.Tensor.tolist, torch.Tensor.numpy = self._saved
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.__name__.split(".")[0] in self.FORBIDDEN:
            if not _called_from(self.CPU_ONLY):
                raise AssertionError(f"host sync in the device section: {func}")
            self.cpu_only_reads += 1
        self.ops += 1
        return func(*args, **(kwargs or {}))


def _called_from(sites: set[tuple[str, str]]) -> bool:
    frame = sys._getframe(1)
    while frame is not None:
        if (os.path.basename(frame.f_code.co_filename), frame.f_code.co_name) in sites:
            return True
        frame = frame.f_back
    return False


@pytest.mark.parametrize("read", [lambda t: t[0].item(), lambda t: bool(t.sum()),
                                  lambda t: int(t[0]), lambda t: t.tolist(),
                                  lambda t: torch.tensor([1, 2]), lambda t: t.numpy()],
                         ids=["item", "bool", "int", "tolist", "tensor-from-list", "numpy"])
def test_no_host_sync_catches_reads(read):
    with pytest.raises(AssertionError):
        with NoHostSync():
            read(torch.arange(3))
    assert torch.arange(3).tolist() == [0, 1, 2]        # the patch is undone


def _checked_engine(target, draft, batch) -> tuple[Engine, list[NoHostSync]]:
    """A static engine whose every device section runs under NoHostSync."""
    engine = Engine(target, draft, batch, MAX_SEQ, static=True)
    sections = []

    def guard():
        sections.append(NoHostSync())
        return sections[-1]
    engine.graphs.section_guard = guard
    return engine, sections


@pytest.mark.parametrize("batch", [1, 2, 4])
@pytest.mark.parametrize("k", [1, 3, 6])
def test_greedy_static_round_equals_plain(models, k, batch):
    target, draft = models["torch_ref"]
    prompts = PROMPTS[:batch]
    plain, _ = generate(Engine(target, None, batch, MAX_SEQ), prompts, None)
    engine, sections = _checked_engine(target, draft, batch)
    got, rounds = generate(engine, prompts, SpecConfig("draft_model", k))
    assert got == plain
    assert [len(o) for o in got] == BUDGETS[:batch]
    # Every round was the graphed one: one device section, one read-back, drafts from the
    # static loop (whose catch-up ran inside the section).
    assert rounds > 0 and len(sections) == rounds == engine.graphs.read_backs
    assert all(s.ops > 0 for s in sections)
    assert {key[1] for key in engine.draft_drafter._loops} == {k}
    # n-gram drafts (host tokens, staged) through the same path
    steps = []
    ngram, rounds = generate(engine, prompts, SpecConfig("ngram", k), record=steps)
    assert ngram == plain
    assert len(sections) == engine.graphs.read_backs
    # prompt lookup drafted, and was right at times (not plain steps throughout)
    assert sum(len(s.draft_tokens) for s in steps) > 0 and sum(s.num_accepted for s in steps) > 0


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_static_round_triton_kernels(models, monkeypatch, sampled):
    """The same through the CUDA backend's bodies and the Triton kernels (interpreted: slow,
    so short), acceptance included: greedy rows equal plain decoding, and a seeded sampled
    row gets the tokens the eager engine (same kernels) gives it."""
    monkeypatch.setenv("SPECRT_KERNELS", "triton")
    target, draft = models["cuda"]
    budgets = [5, 3]
    params = [SamplingParams(temperature=0.8, top_k=30, seed=2), SamplingParams()] if sampled \
        else None
    spec = SpecConfig("draft_model", 2)
    plain, _ = generate(Engine(target, None, 2, MAX_SEQ), PROMPTS[:2], None, budgets=budgets)
    engine, sections = _checked_engine(target, draft, 2)
    got, rounds = generate(engine, PROMPTS[:2], spec, params, budgets=budgets)
    assert got[1] == plain[1]
    if sampled:
        eager, _ = generate(_drafting_k(Engine(target, draft, 2, MAX_SEQ)), PROMPTS[:2],
                            spec, params, budgets=budgets)
        assert got == eager
    else:
        assert got == plain
    assert rounds > 0 and len(sections) == rounds == engine.graphs.read_backs


SAMPLED = [SamplingParams(temperature=1.0, seed=11),
           SamplingParams(),                                     # greedy beside sampled rows
           SamplingParams(temperature=0.7, top_k=20, seed=12),
           SamplingParams(temperature=1.3, top_p=0.9, seed=13)]


@pytest.mark.parametrize("spec", [SpecConfig("draft_model", 3), SpecConfig("draft_model", 1),
                                  SpecConfig("ngram", 4)], ids=["draft_model:3", "draft_model:1",
                                                                 "ngram:4"])
def test_sampled_static_round_equals_eager(models, spec):
    """Rounds with sampled rows take the static path too (two replays, one read-back, no host
    sync between), and a seeded request gets exactly the tokens the eager engine gives it:
    the same randomness drawn in the same order, the same warp (`warp_rows`), the same
    acceptance. Greedy rows beside sampled ones still get plain greedy output."""
    target, draft = models["torch_ref"]
    plain, _ = generate(Engine(target, None, 4, MAX_SEQ), PROMPTS, None)
    # the static loop drafts all K: so does the eager engine compared with it
    eager, _ = generate(_drafting_k(Engine(target, draft, 4, MAX_SEQ)), PROMPTS, spec,
                        SAMPLED)
    engine, sections = _checked_engine(target, draft, 4)
    got, rounds = generate(engine, PROMPTS, spec, SAMPLED)
    assert got == eager
    assert got[1] == plain[1]
    assert [len(o) for o in got] == BUDGETS
    assert rounds > 0 and len(sections) == rounds == engine.graphs.read_backs
    # the sampled runners served the rounds while a sampled row was running
    assert any(r.sampled and r.read_back.count for r in engine.graphs.runners())
    if spec.method == "draft_model":
        assert any(key[3] for key in engine.draft_drafter._loops)


def test_sampled_static_round_alone_and_in_a_batch(models):
    """A seeded sampled request gets the same tokens alone and beside other requests on the
    static path."""
    target, draft = models["torch_ref"]
    spec = SpecConfig("draft_model", 2)
    alone, _ = generate(Engine(target, draft, 1, MAX_SEQ, static=True), PROMPTS[2:3], spec,
                        SAMPLED[2:3], BUDGETS[2:3])
    batch, _ = generate(Engine(target, draft, 4, MAX_SEQ, static=True), PROMPTS, spec, SAMPLED)
    assert batch[2] == alone[0]


def test_warm_up_builds_every_runner_and_none_is_reallocated(models):
    target, draft = models["torch_ref"]
    engine = Engine(target, draft, 2, MAX_SEQ, static=True)
    engine.warm_up(max_k=3)
    drafter = engine.draft_drafter
    assert sorted((*r.ids.shape, r.sampled) for r in engine.graphs.runners()) == \
        sorted((b, t, s) for b in (1, 2) for t in (1, 2, 3, 4) for s in (False, True))
    assert sorted(drafter._loops) == sorted((b, k, w, s) for b in (1, 2) for k in (1, 2, 3)
                                            for w in (1, 2) for s in (False, True))
    runners = engine.graphs.runners() + list(drafter._loops.values())
    ptrs = lambda: [t.data_ptr() for r in runners for t in r.buffers()] + [  # noqa: E731
        engine.cache.k.data_ptr(), engine.cache.lengths.data_ptr(), drafter.cache.k.data_ptr(),
        drafter.cache.lengths.data_ptr(), engine.graphs.logits.data_ptr()]
    before = ptrs()
    rounds = 0
    sampled = [SamplingParams(temperature=1.0, top_p=0.9, seed=5), SamplingParams()]
    for k in (1, 2, 3):
        rounds += generate(engine, PROMPTS[:2], SpecConfig("draft_model", k))[1]
        rounds += generate(engine, PROMPTS[2:], SpecConfig("ngram", k))[1]
        rounds += generate(engine, PROMPTS[:2], SpecConfig("draft_model", k), sampled)[1]
        assert ptrs() == before
    assert rounds >= 75 and engine.graphs.read_backs == rounds
    assert engine.graphs.runners() + list(drafter._loops.values()) == runners   # none added


@pytest.fixture(scope="module")
def native_bf16(dirs):
    from specrt.model.backends import cpu_native
    if not cpu_native.available(torch.bfloat16):
        pytest.skip("specrt's C++ layer ops are not built for this CPU")

    def load(model_dir):
        cfg = ModelConfig.from_dir(model_dir)
        return Transformer(cfg, load_state_dict(model_dir, cfg, torch.bfloat16), MAX_SEQ,
                           cpu_native.CpuNative())
    return load(dirs[0]), load(dirs[1])


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_static_passes_on_the_cpu_native_backend_give_the_eager_bits_in_bf16(native_bf16,
                                                                           sampled):
    """An engine with graphs on the CPU runs the static bodies eagerly; with the C++ kernels in
    bf16 they compute the eager engine's bits (the reference body's PyTorch bf16 rounding
    differs): plain decoding gives the same tokens on both engines, greedy speculation gives
    plain greedy output, and seeded sampled rows get the eager engine's tokens."""
    target, draft = native_bf16
    plain, _ = generate(Engine(target, None, 4, MAX_SEQ), PROMPTS, None)
    static_plain, _ = generate(Engine(target, None, 4, MAX_SEQ, static=True), PROMPTS, None)
    assert static_plain == plain
    spec = SpecConfig("draft_model", 3)
    params = SAMPLED if sampled else None
    eager, _ = generate(_drafting_k(Engine(target, draft, 4, MAX_SEQ)), PROMPTS, spec, params)
    got, rounds = generate(Engine(target, draft, 4, MAX_SEQ, static=True), PROMPTS, spec, params)
    assert rounds > 0 and got == eager
    if not sampled:
        assert got == plain
