"""The runtime on CUDA, on tiny random models: exactness of speculative decoding with and
without CUDA graphs, the Triton attention path against the CPU model, and the static-buffer
discipline of the captured graphs.

GPU-only (skipped without CUDA); benchmarks/gpu_check.sh runs it on a GPU machine. The CPU
versions of these checks live in test_speculative.py and test_cuda_graph.py; here the same
claims are checked where it matters: Triton kernels compiled, graphs really captured.
In bf16 too, speculative output must equal plain output token for token: the CUDA backend's
decode and verify passes are batch invariant (section (c) says why and within which sizes).
"""
import contextlib
import gc

import pytest
import torch

import specrt
from specrt.model import Transformer
from specrt.model.backends import cuda as cuda_backend


def first_difference(a, b) -> int | None:
    """Index of the first position where two token lists differ (None if equal)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y),
                None if len(a) == len(b) else min(len(a), len(b)))


pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="needs CUDA: run by benchmarks/gpu_check.sh on a GPU machine")

PROMPTS = [[5, 6, 7, 8], list(range(40, 70)), [250, 3], [9, 9, 9, 9, 9, 9]]
SINGLE = PROMPTS[:2]                 # batch-1 runs, one prompt at a time
BATCH = PROMPTS[1:]                  # one batch of 3 (ragged lengths)
NEW = 40
SPECS = {
    "draft_model:1": {"method": "draft_model", "num_speculative_tokens": 1},
    "draft_model:4": {"method": "draft_model", "num_speculative_tokens": 4},
    "draft_model:8": {"method": "draft_model", "num_speculative_tokens": 8},
    "ngram:4": {"method": "ngram", "num_speculative_tokens": 4},
    "auto:4": {"method": "auto", "num_speculative_tokens": 4},
}


@pytest.fixture(scope="module")
def llms(tiny_noeos_dir, tiny_draft_dir):
    """(dtype, cuda_graphs) -> LLM on CUDA, built on first use. The eager engines draft all
    K, as the graphed ones always do: draft_stop 0 and no cut at the budget (`cut_short`; the
    tiny draft is never sure: with a stop, every eager round would draft 1, and a seeded
    sampled request would not draw what it draws on the graphed engine)."""
    built = {}

    def get(dtype: str, graphs: bool) -> specrt.LLM:
        if (dtype, graphs) not in built:
            llm = built[(dtype, graphs)] = specrt.LLM(
                tiny_noeos_dir, draft=tiny_draft_dir, dtype=dtype, device="cuda",
                max_seq_len=256, max_batch_size=3, cuda_graphs=graphs, draft_stop=0.0)
            llm.engine.draft_drafter.cut_short = False
        return built[(dtype, graphs)]
    return get


def run(llm, spec=None) -> list[list[int]]:
    """Outputs for SINGLE (batch 1, one by one) followed by BATCH (one batch of 3)."""
    single = [llm.generate(p, max_new_tokens=NEW, speculative=spec).token_ids for p in SINGLE]
    batch = [r.token_ids for r in llm.generate(BATCH, max_new_tokens=NEW, speculative=spec)]
    return single + batch


@pytest.fixture(scope="module")
def plain(llms):
    """(dtype, graphs) -> plain greedy outputs, same prompts and batch composition as run()."""
    cache = {}

    def get(dtype: str, graphs: bool) -> list[list[int]]:
        if (dtype, graphs) not in cache:
            cache[(dtype, graphs)] = run(llms(dtype, graphs))
        return cache[(dtype, graphs)]
    return get


def _runners(llm) -> list:
    eng = llm.engine
    loops = list(eng.draft_drafter._loops.values()) if eng.draft_drafter else []
    return eng.graphs.runners() + loops


def _captured(llm) -> list:
    return [r.graph for r in _runners(llm)]


# --- (a) fp32: speculative == plain, token for token --------------------------------------
@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
@pytest.mark.parametrize("name", list(SPECS))
def test_fp32_greedy_speculative_equals_plain(llms, plain, name, graphs):
    llm = llms("float32", graphs)
    out = run(llm, SPECS[name])
    ref = plain("float32", graphs)
    for i, (got, want) in enumerate(zip(out, ref)):
        assert got == want, (f"{name} graphs={graphs} output {i} first differs at token "
                             f"{first_difference(got, want)}")
    assert all(len(o) == NEW for o in out)
    if graphs:
        graphs_ = _captured(llm)
        assert graphs_ and all(g is not None for g in graphs_), "CUDA graphs were not captured"


# --- (b) the CUDA-graph path produces the eager path's outputs ------------------------------
@pytest.mark.parametrize("name", [None] + list(SPECS))
def test_fp32_graphs_equal_eager(llms, name):
    spec = SPECS[name] if name else None
    assert run(llms("float32", True), spec) == run(llms("float32", False), spec)


@pytest.mark.parametrize("name", ["draft_model:4", "ngram:4"])
def test_fp32_sampled_graphs_equal_eager(llms, name):
    """A seeded sampled request (temperature, top-k, top-p) gets the same tokens through the
    graphed round (warp, draws and rejection sampling inside the replays) as through the eager
    one, alone and in a batch. On CUDA a reduction's rounding can depend on the batch shape
    (`warp_rows`), so a token could differ at a tie within the last bit: vanishingly rare at
    these sizes, and a failure here names the first difference to check for one."""
    kw = dict(max_new_tokens=NEW, speculative=SPECS[name], temperature=0.9, top_k=50,
              top_p=0.95, seed=7)
    outs = []
    for graphs in (True, False):
        llm = llms("float32", graphs)
        single = [llm.generate(p, **kw).token_ids for p in SINGLE]
        batch = [r.token_ids for r in llm.generate(BATCH, **kw)]
        outs.append(single + batch)
    for i, (got, want) in enumerate(zip(*outs)):
        assert got == want, (f"{name} output {i} first differs at token "
                             f"{first_difference(got, want)}")


def test_graphs_llm_really_uses_graphs(llms):
    llm = llms("float32", True)
    assert llm.engine.static
    run(llm, SPECS["draft_model:4"])
    assert llm.engine.draft_drafter._loops, "the draft loop never went through the runner"
    assert all(g is not None for g in _captured(llm))


@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.9, "top_p": 0.9, "seed": 3}],
                         ids=["greedy", "sampled"])
def test_round_is_two_replays_and_one_sync(llms, sampling):
    """Every graph was captured at load into the one pool; a round's device section (draft
    replay, verify replay), greedy or sampled, runs under sync debug mode "error" and each
    round reads back once."""
    llm = llms("float32", True)
    eng = llm.engine
    captured = eng.graphs.pool.captured
    assert captured == len(_runners(llm)) and all(g is not None for g in _captured(llm))

    @contextlib.contextmanager
    def no_sync():
        torch.cuda.set_sync_debug_mode("error")
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode("default")
    eng.graphs.section_guard = no_sync
    try:
        before = eng.graphs.read_backs
        res = llm.generate(PROMPTS[1], max_new_tokens=NEW, speculative=SPECS["draft_model:4"],
                           **sampling)
    finally:
        eng.graphs.section_guard = contextlib.nullcontext
    rounds = res.stats["target_passes"] - 1
    assert rounds > 0 and eng.graphs.read_backs - before == rounds
    assert eng.graphs.pool.captured == captured, "a graph was captured mid-generation"


# --- (c) bf16: speculative == plain, token for token -------------------------------------
# Why this holds in bf16, not only in fp32 (issue 15, item 3): every op of a CUDA decode or
# verify pass whose result for a token could depend on how many tokens share the pass has a
# fixed reduction order -- attention splits at fixed key positions with one query tile for every
# T (`verify_attention`), RMSNorm per row (`add_rms_norm`), the four projections and the output
# head through the batch-invariant matmul (one 16-row tile shape, fixed k order, split-K fixed per
# weight; fp32 logits straight from its accumulator) -- and a pass with padding is computed
# whole through the same kernels. So a verify pass of K + 1 tokens gives each token the bits of
# its decode step and greedy acceptance reads the argmax plain decoding reads. The promise
# holds for passes of at most MAX_MATMUL_ROWS rows in all (cuBLAS decides beyond); checked below.
@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
@pytest.mark.parametrize("name", list(SPECS))
def test_bf16_greedy_speculative_equals_plain(llms, plain, name, graphs):
    rows = len(BATCH) * (SPECS[name]["num_speculative_tokens"] + 1)
    assert rows <= cuda_backend.MAX_MATMUL_ROWS, "a verify pass past the batch-invariant size"
    llm = llms("bfloat16", graphs)
    before = llm.engine.graphs.read_backs if graphs else 0
    out = run(llm, SPECS[name])
    ref = plain("bfloat16", graphs)
    if graphs:   # rounds took the two-replays-one-sync path (StaticRound.run)
        assert llm.engine.graphs.read_backs > before
    assert all(len(o) == NEW for o in out), f"{name}: a row stopped early"
    for i, (got, want) in enumerate(zip(out, ref)):
        assert got == want, (f"bf16 {name} graphs={graphs} output {i} first differs at token "
                             f"{first_difference(got, want)}")


def test_bf16_graphs_equal_eager(llms, plain):
    """The captured graphs replay the eager passes' kernels on the same inputs: equal outputs."""
    a, b = plain("bfloat16", True), plain("bfloat16", False)
    for i, (x, y) in enumerate(zip(a, b)):
        assert x == y, f"plain bf16 output {i}: graphs vs eager first differ at token " \
                       f"{first_difference(x, y)}"


# --- (d) the CUDA model (Triton verify attention) against the CPU model (SDPA) ---------------
def test_cuda_fp32_logits_match_cpu(tiny_noeos_dir):
    # S_max = 1024: the kernel splits each row's keys over several programs (flash-decoding)
    cpu = Transformer.from_dir(tiny_noeos_dir, "float32", "cpu", max_seq_len=1024)
    gpu = Transformer.from_dir(tiny_noeos_dir, "float32", "cuda", max_seq_len=1024)
    cc, gc_ = cpu.new_cache(2, 1024), gpu.new_cache(2, 1024)
    gen = torch.Generator().manual_seed(0)

    def both(ids, **kw):
        want = cpu.forward(ids, cc, **kw)
        got = gpu.forward(ids.cuda(), gc_, **kw).cpu()
        assert cc.host_lengths() == gc_.host_lengths()
        return got, want

    def check(what, ids, **kw):
        got, want = both(ids, **kw)
        if kw.get("num_valid"):       # padding positions' logits are meaningless
            for b, n in enumerate(kw["num_valid"]):
                torch.testing.assert_close(got[b, :n], want[b, :n], atol=1e-3, rtol=1e-3,
                                           msg=lambda m: f"{what}, row {b}: {m}")
        else:
            torch.testing.assert_close(got, want, atol=1e-3, rtol=1e-3,
                                       msg=lambda m: f"{what}: {m}")

    check("prefill T=7 (kernel on CUDA)", torch.randint(0, 300, (2, 7), generator=gen))
    for step in range(4):
        check(f"decode step {step}", torch.randint(0, 300, (2, 1), generator=gen))
    check("verify T=9", torch.randint(0, 300, (2, 9), generator=gen))
    cc.truncate([15, 12])
    gc_.truncate([15, 12])                                     # rollback, ragged rows
    check("verify T=5 after rollback", torch.randint(0, 300, (2, 5), generator=gen))
    check("decode, rows at different lengths", torch.randint(0, 300, (2, 1), generator=gen))
    check("verify T=17 (largest kernel tile)", torch.randint(0, 300, (2, 17), generator=gen))
    check("ragged T=3 (SDPA on CUDA)", torch.randint(0, 300, (2, 3), generator=gen),
          num_valid=[3, 1])
    check("long prefill T=40 (SDPA)", torch.randint(0, 300, (2, 40), generator=gen))
    # a fresh batch-1 long prompt, then decode against a cache longer than one block
    cc.reset()
    gc_.reset()
    check("prefill T=300", torch.randint(0, 300, (1, 300), generator=gen))
    check("decode at 300", torch.randint(0, 300, (1, 1), generator=gen))
    check("verify T=9 at 301", torch.randint(0, 300, (1, 9), generator=gen))


# --- (e) the graph runners never reallocate -------------------------------------------------
def test_no_buffer_is_reallocated_across_100_rounds(llms):
    llm = llms("float32", True)
    spec = SPECS["draft_model:4"]
    llm.generate(PROMPTS[:2], max_new_tokens=8, speculative=spec)       # build the runners
    eng = llm.engine
    drafter = eng.draft_drafter
    runners = _runners(llm)
    graphs = [r.graph for r in runners]
    assert graphs and all(g is not None for g in graphs)
    ptrs = lambda: [t.data_ptr() for r in runners for t in r.buffers()] + [  # noqa: E731
        eng.graphs.logits.data_ptr(),
        eng.cache.k.data_ptr(), eng.cache.v.data_ptr(), eng.cache.lengths.data_ptr(),
        drafter.cache.k.data_ptr(), drafter.cache.v.data_ptr(), drafter.cache.lengths.data_ptr()]
    before = ptrs()
    gc.collect()
    torch.cuda.synchronize()
    mem_before = torch.cuda.memory_allocated()
    rounds = 0
    for _ in range(12):
        res = llm.generate(PROMPTS[:2], max_new_tokens=NEW, speculative=spec)
        rounds += res[0].stats["target_passes"] - 1
        assert ptrs() == before
    del res
    gc.collect()
    torch.cuda.synchronize()
    assert rounds >= 100
    assert _runners(llm) == runners
    assert [r.graph for r in runners] == graphs, "a graph was re-captured"
    # no per-round allocation survives a generation (1 MiB of slack for allocator rounding)
    assert torch.cuda.memory_allocated() <= mem_before + (1 << 20)


def test_split_k_launches_on_two_streams_do_not_share_tickets():
    """The split-merge tickets were one buffer per device: a launch on another stream (an
    engine warming up its graphs on a side stream while another runs its rounds) drew tickets
    from the same counters and made tiles merge before their splits were written. Each stream
    has its own buffer now (specrt.kernels.triton.tickets)."""
    from specrt.kernels.triton import matmul as mm

    torch.manual_seed(0)
    x = torch.randn(4, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(1536, 4096, device="cuda", dtype=torch.bfloat16)
    assert mm.split_blocks_for(1536, 4096, torch.bfloat16) < 4096 // mm.block_k_for(
        torch.bfloat16)                                  # the launches really split k
    want = mm.matmul(x, w)
    torch.cuda.synchronize()
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    outs = []
    for _ in range(50):
        for s in streams:
            with torch.cuda.stream(s):
                outs += [mm.matmul(x, w) for _ in range(4)]
        torch.cuda.synchronize()
    bad = sum(not torch.equal(o, want) for o in outs)
    assert bad == 0, f"{bad} of {len(outs)} launches differ"
