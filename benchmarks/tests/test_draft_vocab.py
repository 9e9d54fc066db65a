"""benchmarks.draft_vocab: top-1 agreement of a draft per vocabulary, read ids counted from the
position after they are read."""
import json

import pytest
import torch

import specrt
from benchmarks import draft_vocab


def test_a_read_id_counts_from_the_position_after_it_is_read():
    """Ids 8 and 9 lie past a shortlist of 0-4. 8 is in the prompt: scored from the first
    position. 9 is read once the answer emits it: not at its first position, at the next."""
    prompt, output = [8], [8, 9, 9]
    logits = torch.full((3, 10), -5.0)                           # [N, V]
    logits[:, 0] = 0.0                                           # the best shortlisted id
    logits[0, 8] = 2.0
    logits[1:, 9], logits[1:, 8] = 3.0, 1.0
    scored = list(range(5))
    assert draft_vocab.agreement(logits, prompt, output, scored, read_ids=False) == 0.0
    assert draft_vocab.agreement(logits, prompt, output, scored, read_ids=True) == 2 / 3
    assert draft_vocab.agreement(logits, prompt, output, list(range(10)), False) == 1.0


def test_draft_vocab_compares_each_vocabulary_on_recorded_answers(tiny_noeos_dir,
                                                                 tiny_draft_dir, tmp_path,
                                                                 capsys):
    llm = specrt.LLM(tiny_noeos_dir, dtype="float32", max_seq_len=128)
    try:
        traces = {}
        for i, prompt in enumerate([[*range(40, 60), 250, 300], [*range(90, 130)]]):
            out = llm.generate(prompt, max_new_tokens=12).token_ids
            traces[f"check:code:p{i}"] = {"prompt": prompt, "output": out}
    finally:
        llm.close()
    path = tmp_path / "traces.json"
    path.write_text(json.dumps({"traces": traces}))
    assert draft_vocab.main(["--model", str(tiny_noeos_dir), "--draft", str(tiny_draft_dir),
                             "--traces", str(path), "--sizes", "100,200", "--no-record",
                             "--no-progress"]) == 0
    rows = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["rows"]
    assert [(r["ids"], r["read_ids"]) for r in rows] == [
        (100, False), (100, True), (200, False), (200, True), ("all", False)]
    assert all(0.0 <= r["agreement"] <= 1.0 and set(r["by_set"]) == {"check"} for r in rows)
    assert rows[2]["lowest_change"] == 0.0       # the baseline against itself
    assert rows[0]["head_mb"] < rows[2]["head_mb"] < rows[4]["head_mb"]


@pytest.mark.parametrize("argv, message", [
    (["--sizes", "400"], "--sizes: every size is at least the draft's vocabulary"),
    (["--traces", "/nonexistent.json"], "not a trace file of benchmarks.auto_replay record"),
])
def test_draft_vocab_refuses_what_it_cannot_measure(argv, message, tiny_noeos_dir,
                                                    tiny_draft_dir, tmp_path, capsys):
    path = tmp_path / "traces.json"
    path.write_text(json.dumps({"traces": {"check:code:p": {"prompt": [1, 2], "output": [3]}}}))
    with pytest.raises(SystemExit) as e:
        draft_vocab.main(["--model", str(tiny_noeos_dir), "--draft", str(tiny_draft_dir),
                          "--traces", str(path), "--no-record", "--no-progress", *argv])
    assert e.value.code == 2 and message in capsys.readouterr().err
