"""The CPU kernels run at one of two levels (csrc/cpu/cpu_features.h): AVX-512 with BF16 dot
products, or AVX2 + FMA. The other kernel tests cover the level this CPU picks; on an AVX-512 CPU
this one runs them again at the AVX2 level (SPECRT_CPU_LEVEL=avx2, in a subprocess: the level
is read once per process), so both levels are tested wherever the wider one exists."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specrt.kernels.cpu import gemv, gemv_int4, gemv_int8, layers, ops

ROOT = Path(__file__).resolve().parents[1]
CPUINFO = Path("/proc/cpuinfo")


def _level(env_level: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "SPECRT_CPU_LEVEL"}
    if env_level:
        env["SPECRT_CPU_LEVEL"] = env_level
    out = subprocess.run([sys.executable, "-c", "from specrt.kernels.cpu import gemv, ops; "
                          "print(gemv.LEVEL, ops._cpu_ops.cpu_level())"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


@pytest.mark.skipif(not CPUINFO.exists(), reason="no /proc/cpuinfo to read the CPU's flags from")
def test_every_extension_is_built_at_the_best_level_the_cpu_flags_allow():
    """The flags as the kernel lists them, read apart from the extensions' own check
    (csrc/cpu/cpu_features.h): a build that lost a level, or an extension, fails here instead of
    leaving its tests skipped and decode slower."""
    line = next(x for x in CPUINFO.read_text().splitlines() if x.startswith("flags"))
    flags = set(line.split(":", 1)[1].split())
    avx2 = {"avx2", "fma", "f16c"} <= flags
    avx512 = {"avx512f", "avx512bw", "avx512vl", "avx512_bf16"} <= flags and \
        os.environ.get("SPECRT_CPU_LEVEL") != "avx2"           # forced down: AVX2
    want = "avx512" if avx512 else "avx2" if avx2 else "none"
    assert gemv.LEVEL == want
    assert gemv.AVAILABLE == ops.AVAILABLE == layers.AVAILABLE == (want != "none")
    vnni = want == "avx512" and "avx512_vnni" in flags
    assert gemv_int8.AVAILABLE == (vnni or avx2) and gemv_int4.AVAILABLE == vnni


@pytest.mark.skipif(not gemv.AVAILABLE, reason="no CPU kernels here (neither AVX-512 nor AVX2)")
def test_the_level_is_the_best_the_cpu_has_and_avx2_can_be_forced():
    assert _level(None) == [gemv.LEVEL, gemv.LEVEL]
    assert gemv.LEVEL in ("avx512", "avx2")
    assert _level("avx2") == ["avx2", "avx2"]


@pytest.mark.skipif(not (gemv.AVAILABLE and gemv.LEVEL == "avx512" and ops.AVAILABLE),
                    reason="the AVX2 level is the one this CPU runs: the other tests cover it")
def test_kernel_tests_pass_at_the_avx2_level_too():
    """The kernel tests again at the AVX2 level, with the check that every extension loaded
    there; a run where the kernels' tests skipped would also exit 0, so the only skips allowed
    are those of the kernels that exist at the AVX-512 VNNI level alone (int4, packed int8)."""
    env = {**os.environ, "SPECRT_CPU_LEVEL": "avx2"}
    guard = "tests/test_cpu_levels.py::" \
        "test_every_extension_is_built_at_the_best_level_the_cpu_flags_allow"
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                          guard, "tests/test_cpu_gemv.py",
                          "tests/test_cpu_ops.py", "tests/test_cpu_layers.py",
                          "tests/test_int8_draft.py"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    skips = [line for line in out.stdout.splitlines() if line.startswith("SKIPPED")]
    unexpected = [line for line in skips if "VNNI" not in line]
    assert not unexpected, "\n".join(unexpected)
    assert " passed" in out.stdout


def test_an_unknown_level_is_one_clear_error(monkeypatch):
    import torch

    from specrt.errors import ConfigError
    from specrt.model.backends import select_backend

    monkeypatch.setenv("SPECRT_CPU_LEVEL", "avx3")
    with pytest.raises(ConfigError, match="SPECRT_CPU_LEVEL.*avx2"):
        select_backend(torch.device("cpu"), torch.bfloat16)


def test_a_level_changed_after_the_kernels_loaded_is_refused(monkeypatch):
    """Each extension reads the level when it loads; the layer loop loads later than the
    matrix kernels, so a level set in between gave it the other layout of the int8 weights
    (a draft whose every product was wrong: acceptance collapsed, silently)."""
    import torch

    from specrt.errors import ConfigError
    from specrt.kernels.cpu.extension import CPU_LEVEL_READ
    from specrt.model.backends import select_backend

    changed = None if CPU_LEVEL_READ == "avx2" else "avx2"
    if changed is None:
        monkeypatch.delenv("SPECRT_CPU_LEVEL")
    else:
        monkeypatch.setenv("SPECRT_CPU_LEVEL", changed)
    with pytest.raises(ConfigError, match="SPECRT_CPU_LEVEL changed .* before importing"):
        select_backend(torch.device("cpu"), torch.bfloat16)
    monkeypatch.undo()
    select_backend(torch.device("cpu"), torch.bfloat16)       # as loaded: accepted
    if CPU_LEVEL_READ is None:          # "" means what unset means to the extensions
        monkeypatch.setenv("SPECRT_CPU_LEVEL", "")
        select_backend(torch.device("cpu"), torch.bfloat16)
