"""benchmarks.vocab_ops runs end to end on a small vocabulary and reports every comparison."""
import json

import pytest

from benchmarks import vocab_ops
from specrt.kernels.cpu import ops


@pytest.mark.skipif(not ops.AVAILABLE, reason="no C++ CPU ops here: the benchmark refuses")
def test_vocab_ops_times_each_pair_after_checking_they_agree(capsys, tmp_path):
    results = tmp_path / "RESULTS.md"
    assert vocab_ops.main(["--rounds", "2", "--vocab", "300", "--shortlist", "120",
                           "--results-md", str(results)]) == 0
    rows = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["rows"]
    whats = [r["what"] for r in rows]
    assert whats[:4] == ["argmax, 1 row", "argmax, 6 rows", "argmax, 17 rows",
                         "draft confidence, shortlisted row"]
    assert [w.split(" (")[0] for w in whats[4:6]] == ["top-p 0.9 cut, peaked row",
                                                      "top-p 0.9 cut, flat row"]
    assert whats[6:] == ["Exp(1) noise of one sampled position",
                         "a lone request's [1, 17, V] logits"]
    assert all(float(r["before_us"]) > 0 and float(r["now_us"]) > 0 for r in rows)
    assert vocab_ops.SECTION in results.read_text()
