"""The pure helpers of the llama.cpp side-by-side benchmark (benchmarks/llamacpp/): reading
llama.cpp's output and building its command lines.

These helpers decide what the llama.cpp numbers mean, and llama.cpp is an optional build, so
the canned text below (copied from real runs of llama-cpp-python 0.3.36's vendored llama.cpp on
this machine, trimmed) stands in for it. Nothing here needs llama.cpp or a model. The decode-only
speed both systems are ranked by is tested here too (specrt's side of it).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.llamacpp import commands, install, parse

PROMPT = ("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
          "assistant.<|im_end|>\n<|im_start|>user\nWrite a haiku about \\n in C.<|im_end|>\n"
          "<|im_start|>assistant\n")

COMPLETION_STDERR = """\
0.03.622.986 I llama_completion: prompt: '<|im_start|>system
You are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>
<|im_start|>user
Write a haiku about \\n in C.<|im_end|>
<|im_start|>assistant
'
0.03.623.003 I llama_completion: number of tokens in prompt = 6
0.03.623.004 I 151644 -> '<|im_start|>'
0.03.623.005 I   8948 -> 'system'
0.03.623.006 I    198 -> '
'
0.03.623.007 I   2610 -> 'You'
0.03.623.024 I   1124 -> ' \\'
0.03.623.028 I    198 -> '
'
0.03.623.029 I 
0.03.623.055 I generate: n_ctx = 4096, n_batch = 2048, n_predict = 8, n_keep = 0
0.24.697.251 I common_perf_print:    sampling time =       3.41 ms
0.24.697.254 I common_perf_print:    samplers time =       0.73 ms /    47 tokens
0.24.697.292 I common_perf_print:        load time =    3134.60 ms
0.24.697.294 I common_perf_print: prompt eval time =    2633.65 ms /    39 tokens (   67.53 ms per token,    14.81 tokens per second)
0.24.697.296 I common_perf_print:        eval time =   18436.48 ms /     7 runs   ( 2633.78 ms per token,     0.38 tokens per second)
0.24.697.296 I common_perf_print:       total time =   21074.66 ms /    46 tokens
"""
COMPLETION_STDOUT = "In C,\nAha, aha\n\n"

SPECULATIVE_STDERR = """\
0.03.681.811 I common_speculative_init_result: loading draft model '/x/qwen2.5-coder-0.5b-instruct.gguf'
0.57.754.151 I encoded   39 tokens in    5.340 seconds, speed:    7.304 t/s
0.57.754.154 I decoded   13 tokens in   42.692 seconds, speed:    0.305 t/s
0.57.754.154 I 
0.57.754.155 I n_draft   = 4
0.57.754.155 I n_predict = 13
0.57.754.155 I n_drafted = 10
0.57.754.156 I n_accept  = 10
0.57.754.157 I accept    = 100.000%
0.57.754.204 I 
0.57.754.204 I target:

0.57.754.209 I common_perf_print: prompt eval time =   29333.82 ms /    53 tokens (  553.47 ms per token,     1.81 tokens per second)
0.57.754.211 I common_perf_print:        eval time =       0.00 ms /     1 runs   (    0.00 ms per token,      inf tokens per second)
"""
SPECULATIVE_STDOUT = "\n\n" + PROMPT + "In C,\nAha, aha,\nIn C.\n\n\n\n"


def test_completion_reads_text_prompt_ids_and_the_eval_line_as_decode():
    t = parse.completion(COMPLETION_STDOUT, COMPLETION_STDERR)
    assert t.text == "In C,\nAha, aha"
    assert (t.prompt_tokens, t.prompt_seconds) == (39, pytest.approx(2.63365))
    # decode-only = the eval line's runs and ms, not the prompt eval line ("prompt eval time"
    # also contains "eval time")
    assert (t.decode_tokens, t.decode_seconds) == (7, pytest.approx(18.43648))
    assert t.decode_tok_s == pytest.approx(7 / 18.43648)
    # the newline token's piece spans two lines; a prompt's literal backslash stays one token
    assert t.prompt_ids == (151644, 8948, 198, 2610, 1124, 198)
    assert t.drafted is None


def test_completion_strips_end_of_text_and_needs_the_timing_lines():
    t = parse.completion("Done." + parse.END_OF_TEXT + "\n\n", COMPLETION_STDERR)
    assert t.text == "Done."
    with pytest.raises(parse.ParseError, match="eval time"):
        parse.completion("x", COMPLETION_STDERR.replace("eval time", "evaluation"))


def test_prompt_ids_count_must_match_the_listing():
    short = COMPLETION_STDERR.replace("prompt = 6", "prompt = 7")
    with pytest.raises(parse.ParseError, match="6 of 7"):
        parse.prompt_ids(short)
    assert parse.prompt_ids("no verbose prompt here") == ()


def test_both_tools_whole_request_counts_every_generated_token():
    """llama-completion's eval runs are the tokens after the first (its prompt pass made that
    one); llama-speculative-simple's decoded count holds every token (its prompt pass stops one
    token short): 3 rounds accepting 10 drafts = 13 tokens, the first included. The whole
    request counts the tokens generated alike for specrt and both tools."""
    from benchmarks.e2e_llamacpp import generated_tokens
    from benchmarks.e2e_records import Measurement, Method

    spec = parse.speculative_simple(SPECULATIVE_STDOUT, SPECULATIVE_STDERR, PROMPT)
    assert spec.decode_tokens == spec.accepted + 3
    plain = parse.completion(COMPLETION_STDOUT, COMPLETION_STDERR)
    assert not commands.decode_counts_first_token("plain")
    assert all(commands.decode_counts_first_token(k) for k in commands.KINDS[1:])

    def rec(method, decode_tokens):
        return Measurement(task="t", prompt="p", method=method, prompt_tokens=39, ids=(),
                           wall=1.0, walls=(1.0,), first_diff=None, a=float("nan"),
                           drafted_rounds=0, rejections=0, stats=None,
                           decode_tokens=decode_tokens, decode_seconds=1.0)

    assert generated_tokens(rec(Method("llamacpp", "plain"), plain.decode_tokens)) == 8
    assert generated_tokens(rec(Method("llamacpp", "draft", 4), spec.decode_tokens)) == 13
    assert generated_tokens(rec(Method("llamacpp", "ngram-map-k", 4), 13)) == 13
    # specrt's decode phase (timing.decode_phase) is the tokens after the first, as plain's
    assert generated_tokens(rec(Method("specrt", "draft_model", 3), 12)) == 13


def test_speculative_simple_reads_decoded_line_and_draft_counts():
    t = parse.speculative_simple(SPECULATIVE_STDOUT, SPECULATIVE_STDERR, PROMPT)
    assert t.text == "In C,\nAha, aha,\nIn C."
    assert (t.prompt_tokens, t.prompt_seconds) == (39, pytest.approx(5.340))
    # its verify batches count as "prompt eval" in the context's lines; decoded is the loop
    assert (t.decode_tokens, t.decode_seconds) == (13, pytest.approx(42.692))
    assert (t.drafted, t.accepted) == (10, 10)
    with pytest.raises(parse.ParseError, match="echo the prompt"):
        parse.speculative_simple(SPECULATIVE_STDOUT, SPECULATIVE_STDERR, "another prompt")


def _job(kind: str, k: int = 0) -> commands.Job:
    return commands.Job(kind=kind, k=k, target=Path("/g/t.gguf"), draft=Path("/g/d.gguf"),
                        prompt=PROMPT, max_new_tokens=128, threads=2, ctx=4096)


def _flag(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


def test_plain_runs_llama_completion_greedy_on_the_formatted_prompt():
    cmd = commands.argv(Path("/b"), _job("plain"))
    assert cmd[0] == "/b/llama-completion"
    assert _flag(cmd, "-p") == PROMPT            # as given: no -f (drops the final newline)
    assert "--no-escape" in cmd                  # else -p's "\\n" would become a newline
    assert (_flag(cmd, "--temp"), _flag(cmd, "--top-k")) == ("0", "1")
    assert (_flag(cmd, "-t"), _flag(cmd, "-tb"), _flag(cmd, "-n")) == ("2", "2", "128")
    assert {"-no-cnv", "--no-display-prompt", "--verbose-prompt"} <= set(cmd)


def test_speculative_methods_use_this_versions_flags():
    d = commands.argv(Path("/b"), _job("draft", 4))
    assert d[0] == "/b/llama-speculative-simple"
    assert _flag(d, "--spec-type") == "draft-simple"
    assert (_flag(d, "-md"), _flag(d, "--spec-draft-n-max")) == ("/g/d.gguf", "4")
    assert (_flag(d, "-td"), _flag(d, "-tbd"), _flag(d, "--spec-draft-p-min")) == ("2", "2", "0")
    for kind in ("ngram-simple", "ngram-map-k"):
        c = commands.argv(Path("/b"), _job(kind, 8))
        assert _flag(c, "--spec-type") == kind and "-md" not in c
        assert _flag(c, f"--spec-{kind}-size-m") == "8"
        assert _flag(c, f"--spec-{kind}-size-n") == str(commands.NGRAM_N)
    with pytest.raises(ValueError, match="K >= 1"):
        commands.argv(Path("/b"), _job("draft", 0))
    with pytest.raises(ValueError, match="unknown"):
        commands.argv(Path("/b"), _job("lookahead", 2))


def test_missing_build_says_how_to_make_it(tmp_path):
    with pytest.raises(install.NotInstalled, match="make bench-llamacpp"):
        install.find(tmp_path, [Path("/m/qwen")])
    bin_dir = tmp_path / "build" / "bin"
    bin_dir.mkdir(parents=True)
    for b in install.BINARIES:
        (bin_dir / b).write_text("")
    (tmp_path / "gguf").mkdir()
    (tmp_path / "gguf" / "qwen-bf16.gguf").write_text("")
    assert install.find(tmp_path, [Path("/m/qwen")]).gguf(Path("/m/qwen")) == \
        tmp_path / "gguf" / "qwen-bf16.gguf"


def _plan(*argv: str) -> list[str]:
    from benchmarks import e2e, e2e_plan

    args = e2e.build_parser().parse_args(list(argv))
    e2e_plan.apply_quick_defaults(args)
    return [m.label for m in e2e_plan.plan_methods(args, has_draft=True)[0]]


def test_llamacpp_methods_alternate_with_specrts_and_keep_their_plain():
    assert _plan("--quick", "--no-hf", "--llamacpp", "--llamacpp-ks", "4") == [
        "plain", "llamacpp:plain", "draft_model:2", "llamacpp:draft:4", "draft_model:4",
        "llamacpp:ngram-simple:4", "ngram:2", "llamacpp:ngram-map-k:4", "ngram:4", "auto:16"]
    assert _plan("--no-hf", "--llamacpp", "--methods", "ngram:4,llamacpp:ngram-map-k:8") == [
        "plain", "llamacpp:plain", "ngram:4", "llamacpp:ngram-map-k:8"]
    assert not any(m.startswith("llamacpp") for m in _plan("--quick", "--no-hf"))
    with pytest.raises(SystemExit) as e:
        _plan("--methods", "llamacpp:plain")      # llama.cpp methods need --llamacpp
    assert e.value.code == 2


def test_specrt_decode_speed_counts_the_tokens_after_the_prompts_pass():
    """The prompt's pass makes the first token: decode-only speed is the other tokens over the
    seconds after that pass (what every benchmark's decode-only column reads)."""
    from types import SimpleNamespace

    from benchmarks.harness import timing

    res = SimpleNamespace(token_ids=[7] * 65, stats={"seconds": 4.5, "prefill_seconds": 0.5})
    assert timing.decode_phase(res) == (64, 4.0)
    assert timing.decode_speed(res) == 16.0
    empty = SimpleNamespace(token_ids=[7], stats={"seconds": 0.5, "prefill_seconds": 0.5})
    assert timing.decode_speed(empty) != timing.decode_speed(empty)          # NaN


def test_side_by_side_ranks_each_system_by_decode_and_by_the_whole_request():
    """llama.cpp's draft reads the prompt before its decode clock starts, specrt's inside its
    decode phase: the task line ranks both systems by decode-only speed and, separately, by
    the whole request (tokens / wall time), where the two cut their timings alike."""
    from types import SimpleNamespace

    from benchmarks.e2e_llamacpp import side_by_side
    from benchmarks.e2e_records import Measurement, Method

    def run(method, decode_s, wall, ids=(1, 2, 3)):
        return Measurement(task="code", prompt="p", method=method, prompt_tokens=50, ids=ids,
                           wall=wall, walls=(wall,), first_diff=None, a=float("nan"),
                           drafted_rounds=0, rejections=0, stats=None,
                           decode_tokens=9, decode_seconds=decode_s)

    methods = (Method("specrt", "plain"), Method("llamacpp", "plain"),
               Method("specrt", "draft_model", 3), Method("llamacpp", "draft", 4))
    records = [run(methods[0], 3.0, 4.0), run(methods[1], 3.0, 4.0),
               run(methods[2], 1.5, 2.5),      # its draft's prompt pass inside the 1.5 s
               run(methods[3], 1.0, 4.5)]      # ... and llama.cpp's only in the wall
    config = SimpleNamespace(tasks=("code",), methods=methods, threads=2)
    side = side_by_side(SimpleNamespace(config=config, measurements=records))
    (line,) = side.tasks
    assert (line.specrt_best, line.llamacpp_best) == ("draft_model:3", "llamacpp:draft:4")
    assert line.best_ratio == pytest.approx((9 / 1.5) / (9 / 1.0))
    assert (line.specrt_best_whole, line.llamacpp_best_whole) == ("draft_model:3",
                                                                  "llamacpp:plain")
    assert line.best_whole_ratio == pytest.approx((10 / 2.5) / (10 / 4.0))
    # 9 decode tokens: specrt and llama-completion made the first token before them (10 in
    # all), llama-speculative-simple's 9 include it
    assert [r.whole_tok_s for r in side.rows] == pytest.approx([2.5, 2.5, 4.0, 9 / 4.5])
    # a saved run (e2e.json) renders the same lines again
    from benchmarks.e2e_llamacpp import from_saved
    payload = {"config": {"tasks": ["code"], "methods": [m.label for m in methods]},
               "records": [r.json() for r in records],
               "llamacpp": side.json()}
    again = from_saved(payload)
    assert again.tasks == side.tasks and again.plain_vs_plain == side.plain_vs_plain
    with pytest.raises(ValueError, match="llamacpp"):
        from_saved({"records": []})


def test_every_method_moves_through_the_sweep_across_repeats():
    """benchmarks.e2e's run order: every sweep runs each method once, and over the repeats a
    method does not keep one place (reversing alone kept the last-listed one at an end in
    every repeat, where it measured 10-20% slower)."""
    from benchmarks.e2e_measure import run_order

    methods = [f"m{i}" for i in range(10)]
    for repeats in (1, 2, 3, 5):
        orders = [run_order(methods, i, r, repeats) for r in range(repeats) for i in range(2)]
        assert all(sorted(o) == sorted(methods) for o in orders)
        if repeats > 1:
            for m in methods:
                assert len({o.index(m) for o in orders}) > 1, (repeats, m)
    ends = [run_order(methods, 0, r, 3)[k] for r in range(3) for k in (0, -1)]
    assert ends.count("m9") < 3           # the last-listed method is not at an end every time
    assert run_order([], 0, 0, 3) == []


def test_auto_against_the_fixed_setting_chosen_on_the_other_repeats():
    """Two fixed settings equally fast but noisy: the best of them picked on the same repeats
    reads high (auto, as fast as either, is below 100% of it), the one chosen on the other
    repeats does not; a setting truly faster is chosen whichever repeat is left out."""
    from benchmarks.e2e_records import Method, MethodSummary
    from benchmarks.e2e_summary import out_of_sample

    def row(kind, k, *speeds):
        return MethodSummary(method=Method("specrt", kind, k), prompts=1, new_tokens=1,
                             seconds=1.0, tok_s=max(speeds), mismatches=0, first_diffs=(None,),
                             repeat_tok_s=speeds)

    auto = row("auto", 16, 10.0, 10.0, 10.0)
    a, b = row("ngram", 8, 12.0, 8.0, 10.0), row("draft_model", 2, 8.0, 12.0, 10.0)
    # left out 0: b (12 vs 9 over repeats 1, 2) -> 10/8; 1: a -> 10/8; 2: a or b (tie) -> 10/10
    assert out_of_sample(auto, [a, b]) == pytest.approx((10 / 8 * 10 / 8 * 1.0) ** (1 / 3))
    assert auto.tok_s / max(a.tok_s, b.tok_s) < 1.0 < out_of_sample(auto, [a, b])
    fast = row("draft_model", 5, 20.0, 19.0, 21.0)
    assert out_of_sample(auto, [a, b, fast]) == pytest.approx(
        (10 / 20 * 10 / 19 * 10 / 21) ** (1 / 3))
    assert out_of_sample(row("auto", 16, 10.0), [row("ngram", 8, 9.0)]) is None


def test_prompts_files_are_checked_before_the_run(tmp_path, capsys):
    """benchmarks.e2e: a prompts file with no tasks, an empty task or a malformed item exits 2
    naming it, before any model loads; a file other than the tuning set records a section of
    its own."""
    import json
    from types import SimpleNamespace

    from benchmarks import e2e, e2e_plan

    def load(tasks, only=None):
        path = tmp_path / "p.json"
        path.write_text(json.dumps({"tasks": tasks}))
        with pytest.raises(SystemExit) as err:
            e2e_plan.load_prompts(str(path), only or tuple(e2e_plan.prompt_tasks(path)), 1)
        assert err.value.code == 2
        return capsys.readouterr().err

    assert "has no tasks" in load({})
    assert "task 'code'" in load({"code": [], "story": [{"id": "a", "prompt": "x"}]})
    assert "is not a prompt" in load({"code": [{"id": "a"}]})
    assert "is not a prompt" in load({"code": [{"id": "a", "messages": "hi"}]})
    assert "'edit' is not in" in load({"code": [{"id": "a", "prompt": "x"}]}, ("edit",))
    tuning = SimpleNamespace(prompts=e2e.PROMPTS)
    assert e2e.section(e2e.SECTION, tuning) == e2e.SECTION
    other = e2e.section(e2e.SECTION, SimpleNamespace(prompts=tmp_path / "p.json"))
    assert other.startswith(e2e.SECTION) and other.endswith("p.json")
