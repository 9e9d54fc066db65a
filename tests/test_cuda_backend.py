"""The CUDA backend's fused layer loop, checked without a GPU: on CPU tensors with
SPECRT_KERNELS=triton its Triton kernels (the batch-invariant matmul included) run under the
interpreter (fp32), and its logits must match the torch_ref backend's on tiny random models;
its kernels per layer are counted, and a verify pass must give each token the bits of its
decode step."""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from specrt.model.backends import cuda as cuda_backend
from specrt.model.config import ModelConfig
from specrt.model.loader import load_state_dict
from specrt.model.transformer import Transformer
from tests.tiny import make_model


def _model(model_dir, backend):
    cfg = ModelConfig.from_dir(model_dir)
    return Transformer(cfg, load_state_dict(model_dir, cfg, torch.float32), 128, backend)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """Head size 64, as the kernels need: Qwen2-style (bias, GQA 2:1) and Llama-style (no bias,
    tied head, GQA 4:2); and a 3-layer twin of the first for the per-layer count."""
    root = tmp_path_factory.mktemp("cuda_backend")
    return {
        "qwen2": make_model(root / "q", "qwen2", hidden=128, heads=2, kv_heads=1, seed=2,
                            tokenizer=False, eos=False),
        "llama": make_model(root / "l", "llama", hidden=256, heads=4, kv_heads=2, seed=3,
                            tokenizer=False, eos=False),
        "qwen2_3": make_model(root / "q3", "qwen2", hidden=128, heads=2, kv_heads=1, layers=3,
                              seed=4, tokenizer=False, eos=False),
    }


@pytest.mark.parametrize("kernels", ["triton", "reference"])
@pytest.mark.parametrize("kind", ["qwen2", "llama"])
def test_fused_layer_loop_matches_torch_ref(dirs, kind, kernels, monkeypatch):
    """Through the Triton kernels (interpreted) and through their references, whose outputs
    need not be contiguous."""
    monkeypatch.setenv("SPECRT_KERNELS", kernels)
    ref = _model(dirs[kind], "torch_ref")
    fused = _model(dirs[kind], cuda_backend.Cuda())
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, ref.cfg.vocab_size, (2, 20), generator=g)   # > 17: reference prefill
    steps = [torch.randint(0, ref.cfg.vocab_size, (2, t), generator=g) for t in (1, 4, 1, 17)]
    caches = [m.new_cache(2, 128) for m in (ref, fused)]
    for ids in [prompt] + steps:
        want = ref.forward(ids, caches[0])
        got = fused.forward(ids, caches[1])
        torch.testing.assert_close(got, want, atol=2e-4, rtol=2e-4)
    # The fused kernel wrote the decode/verify tokens' K/V where the reference did.
    n = caches[0].host_lengths()[0]
    for got, want in ((caches[1].k, caches[0].k), (caches[1].v, caches[0].v)):
        torch.testing.assert_close(got[:, :, :, :n], want[:, :, :, :n], atol=2e-4, rtol=2e-4)


def test_static_forward_matches_torch_ref(dirs, monkeypatch):
    """The graph body (hidden_static): positions from the device lengths, which it advances."""
    monkeypatch.setenv("SPECRT_KERNELS", "triton")
    ref = _model(dirs["qwen2"], "torch_ref")
    fused = _model(dirs["qwen2"], cuda_backend.Cuda())
    caches = [m.new_cache(1, 128) for m in (ref, fused)]
    prompt = torch.arange(30).view(1, 30) % ref.cfg.vocab_size
    for m, c in zip((ref, fused), caches):
        m.forward(prompt, c)
    ids = torch.tensor([[5, 6, 7]])
    want = ref.forward_static(ids, caches[0])
    got = fused.forward_static(ids, caches[1])
    torch.testing.assert_close(got, want, atol=2e-4, rtol=2e-4)
    assert caches[1].lengths.tolist() == caches[0].lengths.tolist() == [33]


class _CountKernels(TorchDispatchMode):
    """Counts the ops that launch a kernel on a GPU: not views, not allocations."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view and func.__name__.split(".")[0] not in ("empty", "empty_like"):
            self.ops.append(func.__name__)
        return func(*args, **(kwargs or {}))


def _count_pass(model, monkeypatch) -> tuple[int, list[str]]:
    """Kernels of one 4-token verify pass: aten ops seen plus one per fused-kernel call (the
    fused ops are stubbed, so their reference arithmetic does not count)."""
    calls = []

    def stub(name, make):
        def f(*args, **kwargs):
            calls.append(name)
            return make(*args)
        monkeypatch.setattr(cuda_backend, name, f)

    cfg = model.cfg
    stub("rope_verify_attention", lambda qkv, *a: torch.empty(
        qkv.shape[0], qkv.shape[1], cfg.num_heads, cfg.head_dim))
    stub("add_rms_norm", lambda x, *a: (torch.empty_like(x), x))
    stub("silu_mul", lambda gu: torch.empty(gu.shape[0], gu.shape[1] // 2))
    stub("matmul", lambda x, w, *a: torch.empty(x.shape[0], w.shape[0]))
    cache = model.new_cache(1, 64)
    lens = torch.tensor([4], dtype=torch.int32)
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.inference_mode(), _CountKernels() as mode:
        model.backend.fused_layers(model, ids, cache, lens)
    return len(mode.ops) + len(calls), mode.ops + calls


def test_eight_kernels_per_layer(dirs, monkeypatch):
    one, ops1 = _count_pass(_model(dirs["qwen2"], cuda_backend.Cuda()), monkeypatch)      # 2 layers
    three, ops3 = _count_pass(_model(dirs["qwen2_3"], cuda_backend.Cuda()), monkeypatch)  # 3 layers
    assert three - one == cuda_backend.KERNELS_PER_LAYER == 8, (ops1, ops3)
    assert one == 2 + 2 * 8, ops1      # + the embedding gather and the first input norm
    # The four projections are the batch-invariant kernel, not a library matmul.
    assert ops3.count("matmul") == 3 * 4 and not {"mm", "addmm"} & set(ops3), ops3


def _kernel_log(monkeypatch) -> list[tuple[int, int]]:
    """Spy on the backend's matmul: (rows, N) of each kernel call."""
    calls = []
    real = cuda_backend.matmul

    def spy(x, w, *args):
        calls.append((x.shape[0], w.shape[0]))
        return real(x, w, *args)
    monkeypatch.setattr(cuda_backend, "matmul", spy)
    return calls


def test_projections_and_logits_take_the_kernel_up_to_32_rows(dirs, monkeypatch):
    """Decode and verify passes of <= 32 rows in all: every matmul, the fp32 logits included,
    is the batch-invariant kernel; a 40-row prefill takes cuBLAS."""
    monkeypatch.setenv("SPECRT_KERNELS", "triton")
    model = _model(dirs["qwen2"], cuda_backend.Cuda())
    cache = model.new_cache(2, 128)
    calls = _kernel_log(monkeypatch)
    model.forward(torch.zeros(2, 20, dtype=torch.long), cache)                 # 40 rows
    assert calls == []
    model.forward(torch.ones(2, 16, dtype=torch.long), cache)                  # 32 rows
    V = model.cfg.vocab_size
    assert len(calls) == 4 * model.cfg.num_layers + 1 and calls[-1] == (32, V)
    assert all(rows == 32 for rows, _ in calls)


def _assert_verify_gives_decode_bits(model, prompt: torch.Tensor, ids: torch.Tensor
                                     ) -> torch.Tensor:
    """After `prompt` [B, P], one verify pass of ids [B, T] gives each token the bits of the
    decode step it replaces; returns the pass's logits [B, T, V]."""
    B, T = ids.shape
    caches = [model.new_cache(B, 64) for _ in range(2)]
    for c in caches:
        model.forward(prompt, c)
    verify = model.forward(ids, caches[0])                                     # [B, T, V]
    for t in range(T):
        step = model.forward(ids[:, t:t + 1], caches[1])                       # [B, 1, V]
        assert torch.equal(step[:, 0], verify[:, t]), f"token {t} differs from its decode step"
    return verify


def test_verify_rows_have_the_bits_of_their_decode_steps(dirs, monkeypatch):
    """The promise the matmul completes: a 2 x 5-token verify pass gives each token's logits
    the bits of the decode steps it replaces (fp32 under the interpreter; bf16 is
    tests/test_gpu.py's), and the padded pass of ragged rows gives the real tokens theirs.
    On the Qwen2-style model: the interpreter's time grows with the weights' tiles, and the
    Llama-style one's are 4x as many (its tied head takes the same kernel)."""
    monkeypatch.setenv("SPECRT_KERNELS", "triton")
    model = _model(dirs["qwen2"], cuda_backend.Cuda())
    g = torch.Generator().manual_seed(5)
    prompt = torch.randint(0, model.cfg.vocab_size, (2, 6), generator=g)
    ids = torch.randint(0, model.cfg.vocab_size, (2, 5), generator=g)
    verify = _assert_verify_gives_decode_bits(model, prompt, ids)              # [2, 5, V]
    cache = model.new_cache(2, 64)
    model.forward(prompt, cache)
    ragged = model.forward(ids, cache, num_valid=[5, 2])                       # padded row 1
    assert torch.equal(ragged[0], verify[0]) and torch.equal(ragged[1, :2], verify[1, :2])
    assert cache.host_lengths() == [11, 8]


def test_padded_pass_matches_torch_ref(dirs, monkeypatch):
    """Ragged rows (a row with fewer drafts, a row with none) take the fused path too: the real
    tokens' logits and K/V are the reference's; the padding's K/V stay past the lengths."""
    monkeypatch.setenv("SPECRT_KERNELS", "triton")
    ref = _model(dirs["qwen2"], "torch_ref")
    fused = _model(dirs["qwen2"], cuda_backend.Cuda())
    g = torch.Generator().manual_seed(1)
    caches = [m.new_cache(3, 64) for m in (ref, fused)]
    prompt = torch.randint(0, ref.cfg.vocab_size, (3, 7), generator=g)
    ids = torch.randint(0, ref.cfg.vocab_size, (3, 4), generator=g)
    for m, c in zip((ref, fused), caches):
        m.forward(prompt, c)
    want = ref.forward(ids, caches[0], num_valid=[4, 1, 0])
    got = fused.forward(ids, caches[1], num_valid=[4, 1, 0])
    torch.testing.assert_close(got[0], want[0], atol=2e-4, rtol=2e-4)
    torch.testing.assert_close(got[1, :1], want[1, :1], atol=2e-4, rtol=2e-4)
    assert caches[1].host_lengths() == caches[0].host_lengths() == [11, 8, 7]
    for b, n in enumerate((11, 8, 7)):
        torch.testing.assert_close(caches[1].k[:, b, :, :n], caches[0].k[:, b, :, :n],
                                   atol=2e-4, rtol=2e-4)


def test_the_backends_limits_are_the_kernels_and_the_spec_configs():
    """The backend names its kernels' limits without importing Triton (a CPU install may lack
    it), and the acceptance kernels bound K themselves: each copy must equal its source."""
    from specrt.kernels.triton import acceptance, matmul, verify_attention
    from specrt.spec.config import MAX_SPECULATIVE_TOKENS

    assert cuda_backend.KERNEL_HEAD_DIMS == verify_attention.HEAD_DIMS
    assert cuda_backend.MAX_MATMUL_ROWS == matmul.MAX_ROWS
    assert cuda_backend.MAX_KERNEL_T == MAX_SPECULATIVE_TOKENS + 1
    assert acceptance.MAX_K == MAX_SPECULATIVE_TOKENS


def test_a_row_at_the_end_of_the_cache_keeps_every_verify_pass_on_the_kernels(dirs,
                                                                              monkeypatch):
    """A padded pass computes K + 1 tokens on every row. One row near the end of the cache (a
    plain request whose budget reaches max_seq_len) had no room for its padding, and the whole
    pass, every other row's included, fell back to the reference layer loop: other arithmetic
    than the decode steps it replaces (1.5e-6 apart in fp32; in bf16 enough to flip a near
    tie). The engine's cache has room for the padding now, so no round falls back."""
    from specrt.engine.engine import Engine
    from specrt.engine.request import Request
    from specrt.model.backends.torch_ref import TorchReference
    from specrt.spec.config import SpecConfig

    monkeypatch.setenv("SPECRT_KERNELS", "reference")
    max_seq = 48
    target = _model(dirs["qwen2"], cuda_backend.Cuda())
    draft = _model(dirs["qwen2"], cuda_backend.Cuda())
    fallbacks = []
    real_hidden = TorchReference.hidden

    def spy(self, model, ids, cache, rows, last_only=False):
        if model is target and not last_only:
            fallbacks.append((ids.shape[1], list(rows.valid)))
        return real_hidden(self, model, ids, cache, rows, last_only)

    monkeypatch.setattr(TorchReference, "hidden", spy)

    def requests(spec):
        return [Request(tuple(range(40, 80)), max_seq - 40),              # fills its row
                Request((5, 6, 7, 8), 30, spec=spec), Request((9, 9, 9), 30, spec=spec)]

    def run(engine, reqs):
        out = {r.request_id: [] for r in reqs}
        for steps in engine.run(reqs):
            for s in steps:
                out[s.request_id] += s.new_tokens
        return [out[r.request_id] for r in reqs]

    for static in (True, False):
        fallbacks.clear()
        spec = run(Engine(target, draft, 3, max_seq, static=static),
                   requests(SpecConfig("draft_model", 4)))
        assert fallbacks == [], (static, fallbacks[:3])
        plain = run(Engine(target, None, 3, max_seq, static=static), requests(None))
        assert spec == plain


def test_verify_passes_past_32_rows_keep_the_bits_of_their_decode_steps(dirs, monkeypatch):
    """B (K + 1) > 32 rows (B = 2 and K = 16, or B = 4 and K >= 8) took cuBLAS, whose sums
    depend on the row count; an engine now raises its models' kernel limit to its largest
    verify pass, and such a pass gives each token its decode step's bits (prefills keep
    cuBLAS past 32 rows)."""
    from specrt.engine.engine import Engine
    from specrt.engine.static_round import MAX_T

    monkeypatch.setenv("SPECRT_KERNELS", "triton")
    model = _model(dirs["qwen2"], cuda_backend.Cuda())
    Engine(model, None, 4, 64)
    assert model.backend.kernel_rows == 4 * MAX_T
    # prefills keep the default limit: 20 rows take the kernel, 40 rows cuBLAS (< 68)
    calls = _kernel_log(monkeypatch)
    model.forward(torch.zeros(1, 20, dtype=torch.long), model.new_cache(1, 64), last_only=True)
    model.forward(torch.zeros(2, 20, dtype=torch.long), model.new_cache(2, 64), last_only=True)
    assert [rows for rows, _ in calls if rows > 2] == [20] * 4 * model.cfg.num_layers
    g = torch.Generator().manual_seed(7)
    prompt = torch.randint(0, model.cfg.vocab_size, (2, 5), generator=g)
    ids = torch.randint(0, model.cfg.vocab_size, (2, 17), generator=g)       # 34 rows
    _assert_verify_gives_decode_bits(model, prompt, ids)


@pytest.mark.parametrize("device, kernels", [("cuda", None), ("cuda", "triton"),
                                             ("cpu", "triton")])
def test_gpu_kernels_without_triton_are_one_clear_error(device, kernels, monkeypatch):
    """A CUDA torch without triton (Windows' CUDA wheels, a trimmed image) loaded the model and
    then failed in the first pass with "internal error: No module named 'triton'". The backend
    is refused when the model loads, naming the extra and the reference kernels; with
    SPECRT_KERNELS=reference it needs no triton."""
    import importlib.util

    from specrt.errors import ConfigError
    from specrt.model.backends import cpu_native, select_backend

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "triton" else real_find_spec(name, *a))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    if kernels:
        monkeypatch.setenv("SPECRT_KERNELS", kernels)
    with pytest.raises(ConfigError, match=r"need triton.*specrt\[cuda\].*SPECRT_KERNELS=reference"):
        select_backend(torch.device(device), torch.bfloat16)
    monkeypatch.setenv("SPECRT_KERNELS", "reference")
    assert type(select_backend(torch.device(device), torch.bfloat16)).__name__ == \
        ("Cuda" if device == "cuda" else
         "CpuNative" if cpu_native.available(torch.bfloat16) else "TorchReference")
