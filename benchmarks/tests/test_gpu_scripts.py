"""The GPU check's measurement scripts run end to end on CPU (`--tiny`: a tiny fp32 model, the
Triton kernels under the interpreter), so a broken script is found here, not in the few
minutes a GPU is lent."""
import json

from benchmarks import gpu_kernels, gpu_probe


def test_gpu_probe_tiny_writes_every_section(tmp_path, capsys):
    out = tmp_path / "probe.json"
    assert gpu_probe.main(["--tiny", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    m = res["models"]["tiny"]
    assert {"decode_ms", "verify_over_step", "before_after", "exact", "round",
            "sampled_round"} <= set(m)
    assert m["round"]["read_backs_per_round"] == 1.0          # one host read-back a round
    assert res["pair"]["round_ms"] > 0 and res["pair"]["k"] == 4
    assert "| tiny/tiny | greedy round, K=4" in capsys.readouterr().out


def test_gpu_kernels_tiny_checks_every_candidate_tile(tmp_path, capsys):
    out = tmp_path / "kernels.json"
    assert gpu_kernels.main(["--tiny", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    parts = res["matmul"]["shapes"]["tiny"]["parts"]
    assert set(parts) == {"qkv", "o", "gate_up", "down", "head"}
    for part in parts.values():
        for name, row in part["tiles"].items():
            assert "error" not in row, (name, row)
            assert row["invariant"] and row["max_err"] < 1e-4, (name, row)
    assert res["attention"] and all(r["max_diff_vs_64"] < 1e-5 for r in res["attention"])
    assert "fused decode attention" in capsys.readouterr().out
