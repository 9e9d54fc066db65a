"""benchmarks.verify_vs_step prices each pass against its floors, timed beside it."""
import json

import pytest

from benchmarks import verify_vs_step
from specrt.kernels.cpu import compute


def test_a_pass_is_over_the_higher_floor_of_its_own_repeat():
    """Each repeat's time over max(its read, the pass's flops at its peak): the median ratio;
    the floor that held it in most repeats; the flop rate at the median time."""
    floors = [(0.05, 1e9), (0.05, 4e9), (0.2, 1e9)]     # (read s, peak flop/s) per repeat
    out = verify_vs_step._against_floors([0.3, 0.1, 0.3], floors, 1e8)
    # floors: compute 0.1 > read 0.05; read 0.05 > compute 0.025; read 0.2 > compute 0.1
    assert out["over_floor"] == pytest.approx(2.0)            # median of 3.0, 2.0, 1.5
    assert out["over_sum"] == pytest.approx(0.1 / 0.075)      # of 2.0, 1.33, 1.0
    assert out["held_by"] == "read"
    assert out["gflops"] == pytest.approx(1e8 / 0.3 / 1e9)
    assert out["floor_read_ms"] == pytest.approx(50.0)
    assert out["peak_gflops"] == pytest.approx(1.0)


@pytest.mark.skipif(not compute.AVAILABLE or compute.amx(),
                    reason="needs the C++ probes, and bf16 passes off AMX tiles")
def test_a_bf16_run_reports_each_pass_over_its_floors(tiny_noeos_dir, tmp_path, capsys):
    verify_vs_step.main(["--no-draft", "--model", str(tiny_noeos_dir), "--dtype", "bfloat16",
                         "--prefix", "8", "--tokens", "1,3", "--repeats", "2", "--warmup", "0",
                         "--no-progress", "--no-record", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert "over the floor" in out and "the dot-product peak" in out
    rows = json.loads((tmp_path / "verify_vs_step.json").read_text())["rows"]
    assert [r["T"] for r in rows] == [1, 3]
    for r in rows:
        assert 0 < r["over_sum"] < r["over_floor"] and r["held_by"] in ("read", "compute")
        assert r["peak_gflops"] > 0 and r["floor_read_ms"] > 0


def test_an_fp32_run_has_no_floors(tiny_noeos_dir, tmp_path, capsys):
    """The compute probe times the bf16 kernels' instruction: an fp32 pass is not priced."""
    verify_vs_step.main(["--no-draft", "--model", str(tiny_noeos_dir), "--dtype", "float32",
                         "--prefix", "8", "--tokens", "1", "--repeats", "1", "--warmup", "0",
                         "--no-progress", "--no-record", "--out", str(tmp_path)])
    assert "over the floor" not in capsys.readouterr().out
    rows = json.loads((tmp_path / "verify_vs_step.json").read_text())["rows"]
    assert "over_floor" not in rows[0]
