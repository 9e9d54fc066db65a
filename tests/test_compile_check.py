"""The GPU compile check's variant list and its failure modes (the compiling itself runs in
`make compile-check`, a step of `make test`: ~1.5 min on 2 cores, too long to repeat here)."""
import ast
import importlib
import pathlib

import torch

from specrt.kernels import compile_check, reference

TRITON_DIR = pathlib.Path(compile_check.__file__).parent / "triton"


def _kernel_names() -> set[str]:
    """Every `@triton.jit` function named `_*_kernel` in specrt/kernels/triton (launchable)."""
    names = set()
    for path in TRITON_DIR.glob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name.endswith("_kernel") and any(
                    "jit" in ast.unparse(d) for d in node.decorator_list):
                names.add(f"{path.stem}.{node.name}")
    return names


def test_every_triton_kernel_is_in_the_check():
    assert {v.kernel for v in compile_check.all_variants()} == _kernel_names()


class _Recorder:
    """Stands in for a jitted kernel: records what a launcher passes, then launches it."""

    def __init__(self, name, kernel, seen):
        self.name, self.kernel, self.seen = name, kernel, seen

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            dtypes = [a.dtype for a in args[:1] if isinstance(a, torch.Tensor)]
            out = args[3].dtype if self.name == "matmul._matmul_kernel" else dtypes[0]
            self.seen.append((self.name, dtypes[0], out, kwargs))
            return self.kernel[grid](*args, **kwargs)
        return launch


def test_launches_are_variants_of_the_check(monkeypatch):
    """Every launch the launchers make (constants, warps, data dtype) is one of the variants
    the check compiles: the list is the launchers' choices, not a hand-kept copy."""
    variants = {(v.kernel, v.constants, v.num_warps, v.dtype, v.num_stages, v.out)
                for v in compile_check.all_variants()}
    seen = []
    for qualified in _kernel_names():
        module, name = qualified.split(".")
        mod = importlib.import_module(f"specrt.kernels.triton.{module}")
        monkeypatch.setattr(mod, name, _Recorder(qualified, getattr(mod, name), seen))
    attn = importlib.import_module("specrt.kernels.triton.verify_attention")
    acc = importlib.import_module("specrt.kernels.triton.acceptance")
    rms = importlib.import_module("specrt.kernels.triton.add_rms_norm")
    silu = importlib.import_module("specrt.kernels.triton.silu_mul")
    mm = importlib.import_module("specrt.kernels.triton.matmul")
    for dtype in (torch.float32, torch.float16):
        q = torch.randn(1, 2, 2, 64).to(dtype)
        k, v = torch.randn(1, 1, 96, 64).to(dtype), torch.randn(1, 1, 96, 64).to(dtype)
        lens = torch.tensor([40], dtype=torch.int32)
        attn.verify_attention(q, k, v, lens, split_keys=64)
        qkv = torch.randn(1, 2, 4 * 64).to(dtype)
        cos, sin = torch.ones(96, 64).to(dtype), torch.zeros(96, 64).to(dtype)
        attn.rope_verify_attention(qkv, torch.zeros(256).to(dtype), cos, sin, k, v, lens, 2)
        rms.add_rms_norm(torch.randn(2, 100).to(dtype), torch.randn(2, 100).to(dtype),
                         torch.ones(100).to(dtype), 1e-6)
        rms.add_rms_norm(torch.randn(2, 100).to(dtype), None, torch.ones(100).to(dtype), 1e-6)
        silu.silu_mul(torch.randn(2, 100).to(dtype))
        w = torch.randn(40, 300).to(dtype)
        for out_dtype in (None, torch.float32):
            mm.matmul(torch.randn(3, 300).to(dtype), w, torch.randn(40).to(dtype), out_dtype)
            mm.matmul(torch.randn(3, 300).to(dtype), w, None, out_dtype)
        p = torch.softmax(torch.randn(2, 4, 300), -1).to(dtype)
        drafts = torch.randint(0, 300, (2, 3))
        acc.greedy_accept(p, drafts)
        u, noise = reference.draw_randomness(2, 3, 300)
        acc.rejection_sample(p, p[:, :3].contiguous(), drafts, u, noise)
        acc.rejection_sample(p, None, drafts, u, noise)
    tl_dtype = {torch.float32: "fp32", torch.float16: "fp16"}
    assert {name for name, _, _, _ in seen} == _kernel_names()
    for name, dtype, out, kwargs in seen:
        warps = kwargs.pop("num_warps", 4)
        stages = kwargs.pop("num_stages", None)
        found = [v for v in variants if v[0] == name and dict(v[1]) == kwargs and v[2] == warps
                 and v[3] in ("", tl_dtype[dtype]) and v[4] in (None, stages)
                 and v[5] in ({"", tl_dtype[out]} if out == dtype else {tl_dtype[out]})]
        assert found, (f"launch {name} {dtype}->{out} {kwargs} warps={warps} stages={stages} "
                       "is not compiled by the check")


def test_bf16_spills_fail_and_other_dtypes_do_not():
    bf16, fp32 = (compile_check._variant("silu_mul", "_silu_mul_kernel", {"I": "i32"},
                                         {"BLOCK": 1024}, 4, dt) for dt in ("bf16", "fp32"))
    spilled = compile_check.Outcome("x", 90, 1.0, registers=255, spill_bytes=64, shared=0)
    assert compile_check.problems(spilled, bf16) and not compile_check.problems(spilled, fp32)
    big = compile_check.Outcome("x", 80, 1.0, registers=32, spill_bytes=0, shared=200_000)
    assert "shared memory" in compile_check.problems(big, fp32)[0]


def test_missing_ptxas_fails_loudly(monkeypatch, capsys):
    monkeypatch.setattr(compile_check, "ptxas_path", lambda: None)
    assert compile_check.main([]) == 1
    assert "ptxas is missing" in capsys.readouterr().err
