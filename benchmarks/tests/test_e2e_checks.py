"""What the benchmarks count as "the same tokens": every repeat of a speculative method against
plain greedy, and two systems' plain outputs where one ended at an EOS the other never prints.
Fake runners and canned records: no model is loaded."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from benchmarks import e2e_measure
from benchmarks.e2e_records import Measurement, Method, Prompt, RunConfig

PLAIN, NGRAM = Method("specrt", "plain"), Method("specrt", "ngram", 4)


class OneBadRepeat:
    """A Runner whose n-gram method emits a wrong token in repeat `bad` only."""
    bad = 0

    def __init__(self, config):
        self.repeat = {}

    def encode(self, text):
        return e2e_measure.Encoded([1, 2, 3], text)

    def run(self, m, p, max_new):
        ids = (5,) * max_new
        if max_new != 4:                            # not the warm-up
            r = self.repeat[m] = self.repeat.get(m, -1) + 1
            if m == NGRAM and r == self.bad:
                ids = (5, 9) + ids[2:]
        return e2e_measure.Generation(ids, 1.0, {}, decode=(max_new - 1, 0.9))


def test_a_mismatch_in_any_repeat_is_reported(monkeypatch):
    """Only the last repeat's output was compared with plain greedy: a wrong token in the
    first of three repeats went unreported ("0 of N outputs differ")."""
    monkeypatch.setattr(e2e_measure, "Runner", OneBadRepeat)
    config = RunConfig(target=Path("/t"), draft=None, dtype="float32", device="cpu",
                       threads=1, max_new_tokens=8, max_seq_len=64, tasks=("code",),
                       prompts_per_task=1, repeats=3, methods=(PLAIN, NGRAM), quick=False,
                       show_progress=False, prompts=Path("/p.json"))
    for bad, expected in ((0, 1), (2, 1), (3, None)):       # 3: no repeat is wrong
        OneBadRepeat.bad = bad
        records, _, _ = e2e_measure.measure(config, [Prompt("code", "p0", "hi")])
        by_method = {r.method: r for r in records}
        assert by_method[NGRAM].first_diff == expected, bad
        assert by_method[PLAIN].first_diff is None


LLAMA_PLAIN, LLAMA_DRAFT = Method("llamacpp", "plain"), Method("llamacpp", "draft", 4)


class DraftCrashesOnP1:
    """A Runner whose llama.cpp draft:4 crashes on prompt p1 (and whose llama.cpp plain
    crashes everywhere when `plain_crashes`); counts every call per method."""
    plain_crashes = False

    def __init__(self, config):
        self.calls = DraftCrashesOnP1.calls = {}

    def encode(self, text):
        return e2e_measure.Encoded([1, 2, 3], text)

    def run(self, m, p, max_new):
        from benchmarks.llamacpp.run import LlamaCppFailed

        self.calls[m] = self.calls.get(m, 0) + 1
        if (m == LLAMA_DRAFT and p.text == "p1") or (m == LLAMA_PLAIN and self.plain_crashes):
            raise LlamaCppFailed(f"llama.cpp {m.kind} exited with -11:\nSegmentation fault")
        return e2e_measure.Generation((5,) * max_new, 1.0, {}, decode=(max_new - 1, 0.9))


def test_a_failed_llamacpp_method_is_left_out_and_the_sweep_goes_on(monkeypatch, capsys):
    """One llama.cpp crash on one prompt ended the whole sweep (exit 2, nothing written): the
    method that failed is now left out, with a note saying where and why, and every other
    method is measured on every prompt. llama.cpp's plain decoding failing still ends the run:
    its side of the table has no reference without it."""
    from benchmarks.e2e_llamacpp import side_by_side
    from benchmarks.e2e_summary import summarize

    monkeypatch.setattr(e2e_measure, "Runner", DraftCrashesOnP1)
    methods = (PLAIN, NGRAM, LLAMA_PLAIN, LLAMA_DRAFT)
    config = RunConfig(target=Path("/t"), draft=Path("/d"), dtype="float32", device="cpu",
                       threads=1, max_new_tokens=8, max_seq_len=64, tasks=("code",),
                       prompts_per_task=3, repeats=2, methods=methods, quick=False,
                       show_progress=False, prompts=Path("/p.json"))
    prompts = [Prompt("code", f"p{i}", f"p{i}") for i in range(3)]
    records, _, left = e2e_measure.measure(config, prompts)

    assert left.methods == (PLAIN, NGRAM, LLAMA_PLAIN)
    assert len(left.notes) == 1 and "llamacpp:draft:4" in left.notes[0]
    assert "code/p1" in left.notes[0] and "exited with -11" in left.notes[0]
    assert "llamacpp:draft:4 failed on code/p1" in capsys.readouterr().err
    assert {r.method for r in records} == {PLAIN, NGRAM, LLAMA_PLAIN}
    for m in (PLAIN, NGRAM):                        # every prompt, every repeat
        assert sorted(len(r.walls) for r in records if r.method == m) == [2, 2, 2]
    # not run again after its failure: p0 and p1 of the first repeat at most
    assert DraftCrashesOnP1.calls[LLAMA_DRAFT] <= 2
    side = side_by_side(summarize(left, {"load_average_end": [0.0]}, records, 1.0))
    assert {r.method for r in side.rows} == {"plain", "ngram:4", "llamacpp:plain"}

    DraftCrashesOnP1.plain_crashes = True
    try:
        with pytest.raises(SystemExit) as exit_:
            e2e_measure.measure(config, prompts)
    finally:
        DraftCrashesOnP1.plain_crashes = False
    assert exit_.value.code == 2
    assert "llama.cpp plain exited with -11" in capsys.readouterr().err


def _record(method, ids, finish_reason=None):
    return Measurement(task="code", prompt="p", method=method, prompt_tokens=5, ids=ids,
                       wall=1.0, walls=(1.0,), first_diff=None, a=float("nan"),
                       drafted_rounds=0, rejections=0, stats=None, decode_tokens=3,
                       decode_seconds=1.0, finish_reason=finish_reason)


def test_llamacpp_plain_is_compared_without_the_eos_specrt_stopped_at():
    """llama.cpp prints no end-of-generation token; specrt's ids keep the EOS that ended the
    answer, so equal answers read as "first difference at the last token"."""
    from benchmarks.e2e_llamacpp import side_by_side

    methods = (PLAIN, Method("llamacpp", "plain"))
    config = SimpleNamespace(tasks=("code",), methods=methods, threads=2)
    eos = 151645

    def first_diff(specrt_ids, finish_reason, llamacpp_ids):
        records = [_record(methods[0], specrt_ids, finish_reason),
                   _record(methods[1], llamacpp_ids)]
        side = side_by_side(SimpleNamespace(config=config, measurements=records))
        return side.plain_vs_plain["code/p"]

    assert first_diff((7, 8, eos), "eos", (7, 8)) is None
    assert first_diff((7, 8, 9), "length", (7, 8, 9)) is None
    assert first_diff((7, 8, 9), "length", (7, 8)) == 2          # llama.cpp stopped early
    assert first_diff((7, 6, eos), "eos", (7, 8)) == 1           # a real difference


def test_decode_compares_hf_before_the_eos_specrt_stopped_at():
    """HF runs with min_new_tokens = n (its EOS masked), so it cannot stop where specrt did;
    the tokens before specrt's EOS are what both must agree on."""
    from benchmarks.decode import summarize_runs

    def run(ids, finish_reason):
        return {"tok_s": 10.0, "new_tokens": len(ids), "prefill_s": 0.1, "seconds": 1.0,
                "ids": list(ids), "gb_per_s": 40.0, "finish_reason": finish_reason}

    def hf(ids):
        return {"tok_s": 5.0, "prefill_s": 0.1, "seconds": 2.0, "ids": list(ids)}

    out = summarize_runs("bfloat16", 10**9, 5, 6, [run((7, 8, 2), "eos")], [hf((7, 8, 3, 4))])
    assert out["same_tokens_as_hf"] and out["first_difference_vs_hf"] is None
    out = summarize_runs("bfloat16", 10**9, 5, 6, [run((7, 6, 2), "eos")], [hf((7, 8, 3, 4))])
    assert out["first_difference_vs_hf"] == 1
    out = summarize_runs("bfloat16", 10**9, 5, 3, [run((7, 8, 2), "length")], [hf((7, 8, 3))])
    assert out["first_difference_vs_hf"] == 2


def test_results_files_are_replaced_whole(tmp_path, monkeypatch):
    """e2e.json (which benchmarks.e2e_llamacpp reads back), kernels.json and the plots were
    written in place: a run killed mid-write left half a file. A write that fails now leaves
    the old file and no temp file."""
    from benchmarks.harness import results

    target = tmp_path / "e2e.json"
    target.write_text("old")
    results.write_atomically(target, "new")
    assert target.read_text() == "new"

    real_write = Path.write_text

    def full_disk(self, text, *args, **kwargs):     # half the text lands, then the disk is full
        real_write(self, text[: len(text) // 2], *args, **kwargs)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full_disk)
    with pytest.raises(OSError):
        results.write_atomically(target, "newer text")
    monkeypatch.undo()
    assert target.read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["e2e.json"]


def test_count_flags_refuse_zero_before_any_model_loads():
    """`layer_loop --rounds 0` loaded four models, then failed on an empty median with a
    traceback; every count flag of the benchmarks is checked by the parser now."""
    import argparse

    from benchmarks.harness import cli

    assert cli.count("3") == 3
    for bad in ("0", "-2", "x", "1.5"):
        with pytest.raises(argparse.ArgumentTypeError):
            cli.count(bad)
    from benchmarks import decode, e2e, layer_loop

    for main, argv in ((layer_loop.main, ["--rounds", "0"]), (e2e.main, ["--auto-k", "0"]),
                       (e2e.main, ["--repeats", "0"]), (decode.main, ["--new-tokens", "0"])):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2, argv
