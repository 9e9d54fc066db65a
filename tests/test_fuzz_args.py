"""Every bad argument, flag or state file gets a clear answer (issue 18): property-based fuzzing
of `LLM(...)`, `generate`, `python -m specrt.generate` (in-process) and calibration.json, plus
the explicit probe list of tests/bad_inputs.py.

Outcomes are: success, or a SpecrtError (CLI: exit 2 and one `error:` line, no traceback) within
a time bound. Bounded for CI: derandomized, a deadline per example, 253 examples in all (100
generate, 40 LLM(...), 80 CLI, 30 + 3 explicit calibration files; about 15 s on 2 cores).

Probe (256 bad inputs: 57 LLM(...), 79 generate, 8 stream, 41 speculative configs, 56 generate
CLI invocations, 8 models CLI invocations, 7 cache/calibration paths), measured with
    python -m pytest -q -p no:cacheprovider tests/test_fuzz_args.py -k probe -s
256 clear SpecrtError (or exit 2 with one line) / 0 raw traceback / 0 silently accepted / 0 hang
(2026-12-04).
"""
import contextlib
import io
import json
import math
import os
import time

import pytest
from hypothesis import HealthCheck, event, example, given, settings, strategies as st

import specrt
from specrt.api import cli
from specrt.errors import SpecrtError
from specrt.hub import cli as models_cli
from specrt.hub.paths import cache_dir
from specrt.spec import calibration
from tests.bad_inputs import CASES
from tests.helpers import run_bounded

FUZZ = settings(max_examples=100, deadline=5000, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))
SECONDS = 20          # no single call may take longer: a hang is a failure


@pytest.fixture(scope="module")
def llm(tiny_dir):
    llm = specrt.LLM(tiny_dir, max_seq_len=64, dtype="float32")
    yield llm
    llm.close()


def _timed(fn):
    """('ok' | 'error' | 'traceback' | 'hang', value or exception), run in a thread."""
    return run_bounded(fn, SECONDS)


def _cli(main, argv):
    """(exit status, stderr) of a CLI's main run in-process."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as e:               # argparse
            code = e.code
    return code, err.getvalue()


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "error:" in line]


# --- the probe list ----------------------------------------------------------------------------

def _probe(case, llm, tiny_dir, tmp_path, monkeypatch):
    family, arg, expect = case
    if family == "llm":
        return _timed(lambda: specrt.LLM(**{"model": tiny_dir, "max_seq_len": 64, **arg}).close())
    if family in ("generate", "stream"):
        prompt, kwargs = arg
        if family == "stream":
            return _timed(lambda: list(llm.stream(prompt, **kwargs)))
        return _timed(lambda: llm.generate(prompt, **{"max_new_tokens": 4, **kwargs}))
    if family == "spec":
        return _timed(lambda: llm.generate([1, 2], max_new_tokens=4, speculative=arg))
    if family in ("cli", "models"):
        main = cli.main if family == "cli" else models_cli.main
        arg = [str(tiny_dir) if a == "DRAFTDIR" else a for a in arg]    # a real model folder
        argv = ["--model", str(tiny_dir), "--dtype", "float32", *arg] if family == "cli" else arg
        out = _timed(lambda: _cli(main, argv))
        if out[0] != "ok":
            return out
        code, err = out[1]
        if code == 2 and len(_error_lines(err)) == 1 and "Traceback" not in err:
            return "error", SpecrtError(_error_lines(err)[0])
        return ("ok" if code == 0 else "traceback"), err
    afile = tmp_path / "afile"
    afile.write_text("x")
    value = arg.replace("FILE", str(afile)).replace("DIR", str(tmp_path))
    if family == "cache" or arg == "CACHEFILE":
        monkeypatch.setenv("SPECRT_CACHE", value.replace("CACHE", ""))
        monkeypatch.setenv("SPECRT_CALIBRATION", "")
    else:
        monkeypatch.setenv("SPECRT_CALIBRATION", value)
    fn = cache_dir if family == "cache" else calibration.disk_path
    return _timed(fn)


def test_probe(llm, tiny_dir, tmp_path, monkeypatch):
    counts = {"clear": 0, "traceback": 0, "silent": 0, "hang": 0}
    wrong = []
    for case in CASES:
        with monkeypatch.context() as mp:
            kind, value = _probe(case, llm, tiny_dir, tmp_path, mp)
        outcome = {"error": "clear", "ok": "silent"}.get(kind, kind)
        if outcome == "clear" and case[2] not in str(value):
            wrong.append((case, str(value)))
        counts[outcome] += 1
        if outcome != "clear":
            wrong.append((case, f"{kind}: {value!r}"[:300]))
    print(f"\nprobe: {len(CASES)} bad inputs -> {counts['clear']} clear SpecrtError / "
          f"{counts['traceback']} raw traceback / {counts['silent']} silently accepted / "
          f"{counts['hang']} hang")
    assert counts["clear"] == len(CASES) and not wrong, wrong


# --- fuzzing -----------------------------------------------------------------------------------

HOSTILE = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-2**70, max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8), st.binary(max_size=4),
    st.lists(st.integers(-5, 400), max_size=3), st.lists(st.none() | st.text(max_size=2),
                                                        max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


def _expect_success_or_error(fn):
    t0 = time.perf_counter()
    kind, value = _timed(fn)
    assert kind in ("ok", "error"), f"{kind}: {value!r}"
    assert time.perf_counter() - t0 < SECONDS
    return kind, value


@FUZZ
@given(kwargs=st.fixed_dictionaries({}, optional={
    "max_new_tokens": st.one_of(HOSTILE, st.integers(1, 6)),
    "temperature": st.one_of(HOSTILE, st.floats(0, 2)),
    "top_k": st.one_of(HOSTILE, st.integers(0, 400)),
    "top_p": st.one_of(HOSTILE, st.floats(0.01, 1)),
    "seed": st.one_of(HOSTILE, st.integers(0, 2**63 - 1)),
    "stop": st.one_of(HOSTILE, st.text(min_size=1, max_size=3)),
    "chat": st.one_of(HOSTILE, st.booleans()),
    "speculative": st.one_of(HOSTILE, st.fixed_dictionaries({}, optional={
        "method": st.sampled_from(["ngram", "auto", "draft_model", "x"]) | HOSTILE,
        "num_speculative_tokens": st.integers(-2, 20) | HOSTILE,
        "prompt_lookup_min": st.integers(-1, 70) | HOSTILE,
        "prompt_lookup_max": st.integers(-1, 2**41) | HOSTILE,
        "model": HOSTILE}))}),
    prompt=st.one_of(HOSTILE, st.lists(st.integers(0, 319), min_size=1, max_size=4),
                     st.text(max_size=6), st.lists(st.lists(st.integers(0, 319), max_size=2),
                                                   max_size=2)))
def test_fuzz_generate(llm, prompt, kwargs):
    kwargs.setdefault("max_new_tokens", 3)
    _expect_success_or_error(lambda: llm.generate(prompt, **kwargs))


@settings(FUZZ, max_examples=40)
@given(kwargs=st.fixed_dictionaries({}, optional={
    "dtype": st.sampled_from(["float32", "float16", "bfloat16", "int8"]) | HOSTILE,
    "device": st.sampled_from(["cpu", "cuda", "meta", "cpu:0"]) | HOSTILE,
    "max_seq_len": st.integers(2, 64) | HOSTILE,
    "max_batch_size": st.integers(1, 3) | HOSTILE,
    "max_queue": st.integers(0, 8) | HOSTILE,
    "cuda_graphs": st.sampled_from([None, False]) | HOSTILE,
    "draft_stop": st.floats(0.0, 1.0) | HOSTILE,
    "draft": HOSTILE}))
def test_fuzz_llm_constructor(tiny_dir, kwargs):
    if isinstance(kwargs.get("max_seq_len"), int) and kwargs["max_seq_len"] > 64:
        kwargs["max_seq_len"] = 64          # keep a valid construction cheap
    _expect_success_or_error(lambda: specrt.LLM(tiny_dir, **kwargs).close())


FLAG = st.one_of(st.sampled_from(["0", "1", "-1", "nan", "inf", "1e12", "", "x", "4096",
                                  "18446744073709551616", "0.5", "{", '{"method": "ngram"}']),
                 st.text(alphabet="0123456789-.,e{}[]\"':abcnx ", max_size=10))


@settings(FUZZ, max_examples=80)
@given(flags=st.lists(st.tuples(st.sampled_from(
    ["--max-new-tokens", "--temperature", "--top-k", "--top-p", "--seed", "--stop",
     "--max-seq-len", "--device", "--speculative-config", "--prompt-ids", "--prompt",
     "--draft", "--draft-stop"]), FLAG), max_size=3))
def test_fuzz_cli(tiny_dir, flags):
    argv = ["--model", str(tiny_dir), "--dtype", "float32", "--max-new-tokens", "2"]
    for name, value in flags:
        argv += [f"{name}={value}"]
    kind, out = _expect_success_or_error(lambda: _cli(cli.main, argv))
    code, err = out
    assert code in (0, 2), (argv, code, err)
    assert "Traceback" not in err
    if code == 2:
        assert len(_error_lines(err)) == 1, err


JSONISH = st.recursive(st.none() | st.booleans() | st.integers(-3, 3) | st.floats()
                       | st.text(max_size=3),
                       lambda inner: st.lists(inner, max_size=3)
                       | st.dictionaries(st.text(max_size=3), inner, max_size=3), max_leaves=8)


VALID_CURVE = st.lists(st.floats(min_value=1e-6, max_value=10.0), min_size=1, max_size=8)


@settings(FUZZ, max_examples=30, deadline=20000)
@given(content=st.one_of(JSONISH.map(json.dumps), st.text(max_size=12),
                         st.lists(st.floats() | st.integers(-1, 2) | st.none(), max_size=40)
                         .map(lambda v: json.dumps({"KEY": v})),
                         VALID_CURVE.map(lambda v: json.dumps({"KEY": v}))))
@example(content=json.dumps({"KEY": [0.5, 0.25, 1.0, 2.0]}))      # valid: used as it is
@example(content=json.dumps({"KEY": [0.5, 0.25, 1.0]}))           # valid, but not 4 long
@example(content=json.dumps({"KEY": [0.5, 0.25, 1.0, -2.0]}))     # 4 long, not valid
def test_fuzz_calibration_file(llm, tmp_path_factory, content):
    """A cached entry under the model's key is used as it is if it is a valid curve of the
    length asked for; anything else is measured again and the file rewritten with it, unless
    the file never held calibrations (not a JSON object's text), which is left alone."""
    path = tmp_path_factory.mktemp("cal") / "calibration.json"
    model = llm.target
    key = calibration.calibration_key(model, 4)   # what forward_seconds keys one model by
    text = content.replace("KEY", key)
    try:
        raw = json.loads(text)
    except ValueError:
        raw = None
    entry = raw.get(key) if isinstance(raw, dict) else None
    usable = calibration.valid_entry(key, entry) and len(entry) == 4
    event("entry used as it is" if usable else "measured again")
    measured = []
    real_measure = calibration._measure
    old = os.environ.get("SPECRT_CALIBRATION")
    os.environ["SPECRT_CALIBRATION"] = str(path)
    calibration._measure = lambda *a: (measured.append(a), real_measure(*a))[1]
    try:
        calibration._cache.clear()
        path.write_text(text)
        curve = calibration.forward_seconds(model, 4)     # the entry point `auto` plans from
        assert len(curve) == 4 and all(math.isfinite(x) and x > 0 for x in curve)
        assert bool(measured) != usable, (usable, entry)
        if usable:
            assert curve == [float(x) for x in entry]
        if calibration.foreign_text(text):              # someone else's file: left alone
            assert path.read_text() == text
            return
        saved = json.loads(path.read_text())
        assert isinstance(saved, dict)
        assert all(calibration.valid_entry(k, v) for k, v in saved.items())
        assert saved[key] == curve                      # a re-measured curve replaced it
    finally:
        calibration._measure = real_measure
        calibration._cache.clear()
        if old is None:
            os.environ.pop("SPECRT_CALIBRATION", None)
        else:
            os.environ["SPECRT_CALIBRATION"] = old


def test_auto_survives_a_bad_calibration_file(tiny_dir, tmp_path, monkeypatch, caplog):
    path = tmp_path / "calibration.json"
    monkeypatch.setenv("SPECRT_CALIBRATION", str(path))
    ours = f"m|{calibration._SCHEME}"                 # a calibration's key: its file, healed
    for content in ("0", "[]", '"x"', '{"k": [0, -1]}', '{"k": [NaN]}', "{",
                    '{"%s": [0, -1]}' % ours, '{"%s": [NaN]}' % ours):
        calibration._cache.clear()
        path.write_text(content)
        llm = specrt.LLM(tiny_dir, max_seq_len=64, dtype="float32")
        try:
            res = llm.generate([1, 2, 3], max_new_tokens=4,
                               speculative={"method": "auto", "num_speculative_tokens": 3})
        finally:
            llm.close()
        assert len(res.token_ids) >= 1
        if calibration.foreign_text(content):     # not a calibration file: left alone
            assert path.read_text() == content
            continue
        saved = json.loads(path.read_text())
        assert saved and all(calibration.valid_entry(k, v) for k, v in saved.items())
    assert "ignoring" in caplog.text
    calibration._cache.clear()
