"""`python -m specrt.generate` end to end on a tiny model, in a subprocess like a user runs it."""
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args, check=True):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "specrt.generate", *map(str, args)],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def test_json_output_matches_the_api(tiny_noeos_dir):
    import specrt

    proc = run_cli("--model", tiny_noeos_dir, "--prompt-ids", "5,6,7", "--max-new-tokens", 12,
                   "--dtype", "float32", "--no-spec", "--json")
    out = json.loads(proc.stdout)
    llm = specrt.LLM(tiny_noeos_dir, max_seq_len=64, dtype="float32")
    assert out["token_ids"] == llm.generate([5, 6, 7], max_new_tokens=12).token_ids
    assert out["stats"]["new_tokens"] == 12
    assert "12 new tokens" in proc.stderr and "tok/s" in proc.stderr


def test_streams_text_and_traces_rounds(tiny_noeos_dir, tiny_draft_dir):
    spec = json.dumps({"method": "draft_model", "num_speculative_tokens": 3})
    proc = run_cli("--model", tiny_noeos_dir, "--draft", tiny_draft_dir, "--prompt", "def add",
                   "--max-new-tokens", 16, "--dtype", "float32", "--speculative-config", spec,
                   "--trace")
    rounds = [line for line in proc.stderr.splitlines() if line.startswith("round ")]
    # each round drafts, but the last may be a plain step: with one token left, no guess could
    # add one (DraftContext.room)
    drafted = [r for r in rounds if "| draft_model:3 |" in r]
    assert drafted and rounds[:len(drafted)] == drafted and len(rounds) - len(drafted) <= 1
    assert all("kept" in r for r in drafted)
    assert "draft_model K=3" in proc.stderr and "acceptance" in proc.stderr
    api = json.loads(run_cli("--model", tiny_noeos_dir, "--draft", tiny_draft_dir, "--prompt",
                             "def add", "--max-new-tokens", 16, "--dtype", "float32",
                             "--no-spec", "--json").stdout)
    assert proc.stdout.rstrip("\n") == api["text"]


@pytest.mark.parametrize("args, message", [
    (["--speculative-config", '{"method": "medusa"}'], "draft_model, ngram, auto"),
    (["--speculative-config", '{"num_speculative_tokens": 0}'], "num_speculative_tokens"),
    (["--prompt-ids", "1,x"], "--prompt-ids must be comma-separated integers"),
    (["--max-seq-len", "8", "--prompt-ids", "1,2,3"], "exceeds max_seq_len"),
    (["--no-spec", "--speculative-config", '{"method": "ngram"}'], "contradict each other"),
    (["--draft", "{model}", "--draft-vocab", "0"], "'all' (the CLIs)"),
    (["--draft", "{model}", "--no-spec", "--draft-stop", "0.3"], "plain decoding (--no-spec"),
    (["--draft", "{model}", "--speculative-config", "none", "--draft-dtype", "float32"],
     "--draft-dtype sets up a draft model, and plain decoding"),
    (["--speculative-config", '{"method": "ngram"}', "--draft-stop", "0.3"],
     "--draft-stop sets up a draft model, and method 'ngram' drafts from the prompt with none"),
])
def test_bad_input_is_one_clear_line(tiny_noeos_dir, args, message):
    args = [a.replace("{model}", str(tiny_noeos_dir)) for a in args]
    proc = run_cli("--model", tiny_noeos_dir, "--dtype", "float32", *args, check=False)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_cli_module_runs_as_a_script_too():
    """`python -m specrt.api.cli` is the same command as `python -m specrt.generate`."""
    proc = subprocess.run([sys.executable, "-m", "specrt.api.cli", "--help"], capture_output=True,
                          text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=ROOT,
                          timeout=120)
    assert proc.returncode == 0 and "--draft-stop" in proc.stdout, proc.stderr


def test_missing_model_dir_names_the_fetch_command(tmp_path):
    proc = run_cli("--model", tmp_path / "missing", check=False)
    assert proc.returncode == 2 and "python -m specrt.models fetch" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_system_message_and_prompt_from_stdin_reach_the_chat_template(tiny_dir):
    """--prompt-file - reads the prompt from stdin; --system puts a system turn before it; the
    CLI's answer equals the API's for the same messages."""
    import specrt

    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-m", "specrt.generate", "--model", str(tiny_dir), "--prompt-file", "-",
         "--system", "Answer briefly.", "--max-new-tokens", "8", "--dtype", "float32",
         "--no-spec", "--json"], input="def add(a, b):", capture_output=True, text=True,
        env=env, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    llm = specrt.LLM(tiny_dir, max_seq_len=64, dtype="float32")
    messages = [{"role": "system", "content": "Answer briefly."},
                {"role": "user", "content": "def add(a, b):"}]
    ids = llm.encode(messages=messages)
    assert "Answer briefly." in llm.tokenizer._tok.decode(ids)       # the system turn is there
    want = llm.generate(messages=messages, max_new_tokens=8).token_ids
    assert json.loads(proc.stdout)["token_ids"] == want
    assert ids != llm.encode("def add(a, b):", chat=True)             # the system turn counted
    llm.close()


def test_prompt_file_conflicts_and_unreadable_file_are_one_line(tmp_path, tiny_dir):
    both = run_cli("--model", tiny_dir, "--prompt", "x", "--prompt-file", "-", check=False)
    assert both.returncode == 2 and "not both" in both.stderr
    missing = run_cli("--model", tiny_dir, "--prompt-file", tmp_path / "nope.txt", check=False)
    assert missing.returncode == 2 and "--prompt-file" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1


def test_speculative_config_none_is_plain_decoding(tiny_noeos_dir, tiny_draft_dir):
    """`--speculative-config none` means what it means for `specrt.serve`: no speculation."""
    common = ("--model", tiny_noeos_dir, "--draft", tiny_draft_dir, "--prompt-ids", "5,6,7",
              "--max-new-tokens", 10, "--dtype", "float32", "--json")
    none = json.loads(run_cli(*common, "--speculative-config", "none").stdout)
    plain = json.loads(run_cli(*common, "--no-spec").stdout)
    spec = json.loads(run_cli(*common, "--speculative-config",
                              '{"method": "draft_model", "num_speculative_tokens": 3}').stdout)
    assert none["token_ids"] == plain["token_ids"] == spec["token_ids"]
    assert none["stats"]["num_drafts"] == plain["stats"]["num_drafts"] == 0
    assert spec["stats"]["num_drafts"] > 0


def test_draft_model_without_a_draft_is_refused_before_anything_loads(tmp_path):
    """'{}' is method draft_model; with --model and no --draft it cannot run: refused on the
    flags (the missing model directory is not even looked at), naming --draft."""
    for spec in ("{}", '{"method": "draft_model", "num_speculative_tokens": 3}'):
        proc = run_cli("--model", tmp_path / "missing", "--speculative-config", spec,
                       check=False)
        assert proc.returncode == 2 and "--draft" in proc.stderr, proc.stderr
        assert "does not exist" not in proc.stderr and "Traceback" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1


def test_max_new_tokens_past_max_seq_len_is_refused_before_a_fetch(tmp_path):
    """The flags alone already exceed --max-seq-len: refused before the pair is resolved (the
    missing model directory is not even looked at, nothing is fetched), naming the flag."""
    proc = run_cli("--model", tmp_path / "missing", "--max-new-tokens", "5000",
                   "--max-seq-len", "64", check=False)
    assert proc.returncode == 2 and "exceeds max_seq_len" in proc.stderr, proc.stderr
    assert "--max-seq-len" in proc.stderr and "does not exist" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_a_prompt_files_byte_order_mark_is_not_part_of_the_prompt(tmp_path):
    """Windows editors start UTF-8 files with a byte-order mark, which the tokenizer would read
    as three tokens the user never wrote: --prompt-file drops it (one at the start only)."""
    from specrt.api.cli import _read_prompt_file
    from specrt.errors import ArgumentError

    path = tmp_path / "prompt.txt"
    path.write_bytes("\ufeffdef add(a, b):\n".encode("utf-8"))
    assert _read_prompt_file(str(path)) == "def add(a, b):\n"
    path.write_bytes("x\ufeffy".encode("utf-8"))
    assert _read_prompt_file(str(path)) == "x\ufeffy"
    path.write_bytes(b"\xef\xbb\xbfab\xff")         # a bad byte is named where it is in the file
    with pytest.raises(ArgumentError, match="at byte 5"):
        _read_prompt_file(str(path))


@pytest.mark.parametrize("source", ["stdin", "file"])
def test_a_prompt_file_that_is_not_utf8_names_prompt_file(source, tmp_path):
    path = tmp_path / "prompt.txt"
    path.write_bytes(b"def f(\xff):")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-m", "specrt.generate", "--model", str(tmp_path / "missing"),
         "--prompt-file", "-" if source == "stdin" else str(path)],
        input=path.read_bytes(), capture_output=True, env=env, cwd=ROOT, timeout=120)
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert err.startswith("error: --prompt-file") and "not valid UTF-8" in err, err
    assert "surrogate" not in err and len(err.strip().splitlines()) == 1


def test_the_commands_import_no_torch_before_their_handlers_run():
    """A CLI module (the console scripts' targets) imports torch only inside main, where a
    Ctrl-C meets specrt's handler (tests/test_interrupts.py sends it)."""
    code = ("import sys, specrt.api.cli, specrt.serve.cli, specrt.hub.cli, specrt.generate, "
            "specrt.serve; print('torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=ROOT, timeout=60)
    assert proc.stdout.strip() == "False", proc.stderr


def test_ctrl_c_with_only_foreign_threads_left_returns_130_in_process(capsys):
    """Only a specrt thread still running (a scheduler's) makes run_command end the process at
    once (tests/test_interrupts.py); others, such as tqdm's monitor, leave it to return 130."""
    import threading

    from specrt.commands import run_command

    stop = threading.Event()

    def body():
        threading.Thread(target=stop.wait, name="tqdm_monitor", daemon=True).start()
        raise KeyboardInterrupt

    try:
        assert run_command(body) == 130
    finally:
        stop.set()
    assert capsys.readouterr().err.strip() == "interrupted"


@pytest.mark.parametrize("flag, value", [("--draft-stop", "2"), ("--top-p", "0"),
                                         ("--seed", "-3"), ("--max-seq-len", "0"),
                                         ("--max-new-tokens", "0")])
def test_a_bad_value_names_the_flag_that_set_it(flag, value):
    """The API's checks name its argument (draft_stop); the CLI's line names the flag."""
    proc = run_cli("--model", "/nonexistent", flag, value, check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith(f"error: {flag}: {flag[2:].replace('-', '_')} must"), \
        proc.stderr


def test_an_error_is_prefixed_only_with_a_flag_this_cli_has():
    """named_flags prefixes an API error with the flag its first word names; a message that
    starts with any other word (`invalid ...`) must not become `--invalid: invalid ...`."""
    from specrt.api.cli import _flag_of

    assert _flag_of("draft_dtype") == "--draft-dtype" and _flag_of("seed") == "--seed"
    assert _flag_of("invalid") is None and _flag_of("unsupported") is None
    assert _flag_of("the") is None


def test_a_model_without_a_tokenizer_prints_its_answer_as_ids(tmp_path):
    """Only a line break came out: the answer was lost unless --json was given."""
    from tests.tiny import make_model

    model = make_model(tmp_path / "m", "qwen2", tokenizer=False, eos=False)
    proc = run_cli("--model", model, "--prompt-ids", "5,6,7", "--max-new-tokens", 6,
                   "--dtype", "float32", "--no-spec")
    api = json.loads(run_cli("--model", model, "--prompt-ids", "5,6,7", "--max-new-tokens", 6,
                             "--dtype", "float32", "--no-spec", "--json").stdout)
    assert proc.stdout == " ".join(map(str, api["token_ids"])) + "\n"


def test_the_trace_shows_every_round_the_summary_counts_rounds_past_a_stop_too(
        tiny_noeos_dir, tiny_draft_dir, monkeypatch, capsys):
    """The engine runs ahead of the reader; rounds it ran past a stop string (the reader saw
    the stop late: here its first trace line is slow) are in the stats' target passes, so
    the trace shows them too, marked as dropped: one line per round."""
    import time

    import specrt
    from specrt.api import cli

    spec = {"method": "draft_model", "num_speculative_tokens": 3}
    llm = specrt.LLM(tiny_noeos_dir, draft=tiny_draft_dir, max_seq_len=256, dtype="float32",
                     draft_stop=0.0)
    ids = llm.generate("def add", max_new_tokens=40, speculative=spec).token_ids
    stop = llm.tokenizer.decode(ids[24:26])
    llm.close()
    real, calls = cli._trace_line, []

    def slow(*args, **kwargs):
        if not calls:
            time.sleep(0.5)            # meanwhile the engine runs the whole budget
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(cli, "_trace_line", slow)
    assert cli.main(["--model", str(tiny_noeos_dir), "--draft", str(tiny_draft_dir),
                     "--prompt", "def add", "--max-new-tokens", "40", "--dtype", "float32",
                     "--speculative-config", json.dumps(spec), "--draft-stop", "0",
                     "--stop", stop, "--trace", "--json"]) == 0
    out, err = capsys.readouterr()
    stats = json.loads(out)["stats"]
    rounds = [line for line in err.splitlines() if line.startswith("round ")]
    assert json.loads(out)["finish_reason"] == "stop"
    assert len(rounds) == stats["target_passes"] - 1           # the prefill is no round
    past = [r for r in rounds if r.endswith("| past the stop string: dropped")]
    assert past and rounds[-len(past):] == past


def test_a_text_prompt_past_max_seq_len_names_the_flag_after_the_load(tiny_dir):
    """A text prompt's length is known only once it is tokenized, after the load: the error
    still names --max-seq-len (the engine's own says max_seq_len, the API's name)."""
    proc = run_cli("--model", tiny_dir, "--prompt", "Once upon a time " * 20, "--no-chat",
                   "--max-new-tokens", 40, "--max-seq-len", 64, "--dtype", "float32",
                   "--no-spec", check=False)
    assert proc.returncode == 2, proc.stderr
    assert "exceeds max_seq_len (64); raise --max-seq-len" in proc.stderr, proc.stderr


def _run_with_fds(args, stdin=None, stdout=subprocess.PIPE, close_fds=()):
    """The CLI started with some of its standard descriptors closed (`<&-`, `>&-`)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    closes = " ".join(f"{fd}>&-" for fd in close_fds)
    cmd = " ".join([sys.executable, "-m", "specrt.generate", *map(str, args)])
    return subprocess.run(f"exec {cmd} {closes}", shell=True, stdin=stdin, stdout=stdout,
                          stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT, timeout=300)


def test_closed_or_full_standard_streams_are_one_line_not_an_internal_error(tiny_noeos_dir):
    """stdin closed under --prompt-file - and stdout closed are bad input (2), said before
    the load; a full stdout (/dev/full) is a runtime failure (1): never "internal error"."""
    common = ["--model", tiny_noeos_dir, "--max-new-tokens", 4, "--dtype", "float32",
              "--no-spec"]
    proc = _run_with_fds(common + ["--prompt-file", "-"], close_fds=(0,))
    assert proc.returncode == 2 and "standard input is closed" in proc.stderr, proc.stderr
    proc = _run_with_fds(common + ["--prompt-ids", "5,6"], stdout=None, close_fds=(1,))
    assert proc.returncode == 2 and "standard output is closed" in proc.stderr, proc.stderr
    if Path("/dev/full").exists():
        with open("/dev/full", "w") as full:
            proc = _run_with_fds(common + ["--prompt-ids", "5,6"], stdout=full)
        assert proc.returncode == 1, proc.stderr
        assert "cannot write to standard output" in proc.stderr, proc.stderr
        assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr


def test_standard_error_closed_full_or_broken_still_gives_the_answer(tiny_noeos_dir):
    """Diagnostics are best effort: with stderr closed (`2>&-`) the "loading" line went into
    stdout, before --json's object; into /dev/full the run ended as an "internal error" with
    no answer; into a pipe whose reader had gone it exited 0 with no answer (read as stdout's
    reader having had enough)."""
    common = ["--model", tiny_noeos_dir, "--prompt-ids", "5,6", "--max-new-tokens", 4,
              "--dtype", "float32", "--no-spec", "--json"]
    want = json.loads(run_cli(*common).stdout)["token_ids"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "specrt.generate", *map(str, common)]
    read, broken = os.pipe()
    os.close(read)
    targets = {"closed": None, "broken": broken}
    if Path("/dev/full").exists():
        targets["full"] = os.open("/dev/full", os.O_WRONLY)
    try:
        for name, fd in targets.items():
            if fd is None:
                proc = subprocess.run(" ".join(map(shlex.quote, cmd)) + " 2>&-", shell=True,
                                      capture_output=False, stdout=subprocess.PIPE,
                                      text=True, env=env, cwd=ROOT, timeout=300)
            else:
                proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=fd, text=True,
                                      env=env, cwd=ROOT, timeout=300)
            assert proc.returncode == 0, name
            assert json.loads(proc.stdout)["token_ids"] == want, (name, proc.stdout)
    finally:
        for fd in targets.values():
            if fd is not None:
                os.close(fd)


def test_a_reader_that_closed_stdout_ends_the_command_quietly(tiny_noeos_dir):
    """`... | head -c 5`: the answer's reader has had enough; exit 0, nothing on stderr."""
    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run([sys.executable, "-m", "specrt.generate", "--model",
                               str(tiny_noeos_dir), "--prompt-ids", "5,6", "--max-new-tokens",
                               "4", "--dtype", "float32", "--no-spec"], stdout=write,
                              stderr=subprocess.PIPE, text=True, timeout=300, cwd=ROOT,
                              env=dict(os.environ, PYTHONPATH=str(ROOT)))
    finally:
        os.close(write)
    assert proc.returncode == 0, proc.stderr
    assert "error" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("flags, start", [
    (["--stop", ""], "error: --stop: every stop string must be a non-empty string"),
    (["--speculative-config", '{"method": "ngram", "foo": 1}'],
     "error: --speculative-config: unknown speculative config key(s) 'foo'"),
    (["--speculative-config", '{"num_speculative_tokens": 0}'],
     "error: --speculative-config: num_speculative_tokens (K) must be")])
def test_a_stop_or_speculative_config_error_names_its_flag(tiny_noeos_dir, flags, start):
    """Every other flag's error starts with the flag; these two did not."""
    proc = run_cli("--model", tiny_noeos_dir, "--prompt-ids", "5", *flags, check=False)
    assert proc.returncode == 2 and proc.stderr.startswith(start), proc.stderr


@pytest.mark.parametrize("module", ["specrt.generate", "specrt.serve", "specrt.models"])
def test_help_into_a_full_stdout_is_a_failure(module):
    """argparse wrote --help into /dev/full and exited 0 with nothing said."""
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", module, "--help"], stdout=full,
                              stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.startswith("error: cannot write to standard output"), proc.stderr


def _drafts_loaded(monkeypatch) -> list[str]:
    """The draft directories LLMs load from here on, in order."""
    from specrt.api.llm import LLM

    loaded, real = [], LLM._load_draft

    def spy(self, target, draft_dir):
        loaded.append(os.path.realpath(draft_dir))
        return real(self, target, draft_dir)

    monkeypatch.setattr(LLM, "_load_draft", spy)
    return loaded


def test_a_draft_named_in_the_config_is_the_one_draft_loaded(tiny_noeos_dir, tiny_draft_dir,
                                                             monkeypatch, capsys):
    """vLLM names the draft in the config's "model": it is loaded once, as the run's draft,
    and drafts as --draft would; --draft naming the same model too loads it once."""
    from specrt.api import cli

    loaded = _drafts_loaded(monkeypatch)
    common = ["--model", str(tiny_noeos_dir), "--prompt-ids", "5,6,7", "--max-new-tokens", "10",
              "--dtype", "float32", "--json"]
    named = {"method": "draft_model", "num_speculative_tokens": 3, "model": str(tiny_draft_dir)}
    runs = {}
    for extra in (["--speculative-config", json.dumps(named)],
                  ["--speculative-config", json.dumps(named), "--draft", str(tiny_draft_dir)],
                  ["--draft", str(tiny_draft_dir), "--speculative-config",
                   json.dumps({k: v for k, v in named.items() if k != "model"})]):
        loaded.clear()
        assert cli.main(common + extra) == 0
        assert loaded == [os.path.realpath(tiny_draft_dir)], extra
        runs[len(runs)] = json.loads(capsys.readouterr().out)
    assert runs[0]["token_ids"] == runs[1]["token_ids"] == runs[2]["token_ids"]
    assert runs[0]["stats"]["num_drafts"] == runs[2]["stats"]["num_drafts"] > 0


def test_two_different_drafts_are_refused_on_the_flags(tiny_noeos_dir, tiny_draft_dir):
    """--draft A and a config naming B loaded both, and ran B only."""
    proc = run_cli("--model", tiny_noeos_dir, "--draft", tiny_draft_dir, "--prompt-ids", "5",
                   "--speculative-config", json.dumps({"model": str(tiny_noeos_dir)}),
                   check=False)
    assert proc.returncode == 2 and "name two draft models" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("flags,fetched", [
    (["--no-spec"], ["target"]),
    (["--speculative-config", "none"], ["target"]),
    (["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}'], ["target"]),
    ([], ["target", "draft"])])
def test_the_default_pairs_draft_is_fetched_only_for_a_run_that_drafts_with_it(
        flags, fetched, tiny_noeos_dir, tiny_draft_dir, monkeypatch, capsys):
    """Plain decoding and prompt lookup need no draft: with no --model they fetched (and
    prompt lookup loaded) the default pair's draft anyway, and failed where it could not be
    downloaded."""
    from specrt.api import cli
    from specrt.hub import fetch, resolve

    got = []
    dirs = {resolve.DEFAULT_TARGET: ("target", tiny_noeos_dir),
            resolve.DEFAULT_DRAFT: ("draft", tiny_draft_dir)}

    def ensure(name, progress=False):
        got.append(dirs[name][0])
        return dirs[name][1]

    monkeypatch.setattr(fetch, "ensure_model", ensure)
    loaded = _drafts_loaded(monkeypatch)
    assert cli.main(flags + ["--prompt-ids", "5,6,7", "--max-new-tokens", "6", "--dtype",
                             "float32", "--json"]) == 0
    assert got == fetched
    assert loaded == ([os.path.realpath(tiny_draft_dir)] if "draft" in fetched else [])
    assert len(json.loads(capsys.readouterr().out)["token_ids"]) == 6


@pytest.mark.parametrize("command", ["generate", "serve"])
def test_a_configs_draft_keeps_the_draft_flags_given_with_it(command, tiny_noeos_dir,
                                                            tiny_draft_dir):
    """The config's "model" becomes the checked arguments' draft: checked again, a
    --draft-dtype equal to --dtype (already normalized to "as the target's") was refused."""
    if command == "serve":
        from specrt.serve.cli import build_parser, check_flags
        argv = []
    else:
        from specrt.api.cli import build_parser, check_flags
        argv = ["--prompt-ids", "5"]
    spec = json.dumps({"method": "draft_model", "num_speculative_tokens": 3,
                       "model": str(tiny_draft_dir)})
    checked = check_flags(build_parser().parse_args(argv + [
        "--model", str(tiny_noeos_dir), "--dtype", "float32", "--draft-dtype", "float32",
        "--draft-stop", "0.3", "--speculative-config", spec]))
    llm = checked if command == "serve" else checked.llm
    assert (llm.draft, llm.draft_dtype, llm.draft_stop) == (str(tiny_draft_dir), None, 0.3)


def test_draft_flags_for_prompt_lookup_on_the_default_pair_are_refused_before_a_fetch(tmp_path):
    """With no --model, method ngram runs the default pair's target alone (3123891): a draft
    flag beside it was silently ignored."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), SPECRT_CACHE=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, "-m", "specrt.generate", "--speculative-config",
                           '{"method": "ngram"}', "--draft-stop", "0.3", "--prompt-ids", "5"],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == ("error: --draft-stop sets up a draft model, and method "
                                   "'ngram' drafts from the prompt with none: drop "
                                   "--draft-stop, or use method 'draft_model' or 'auto'")
    assert not list((tmp_path / "cache").rglob("*.safetensors"))
