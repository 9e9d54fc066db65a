"""`python -m specrt.generate`: the generation command line (one of the CLIs, the only printers).

With no --model it runs the default pair (Qwen2.5-Coder-1.5B-Instruct verified by
Qwen2.5-Coder-0.5B-Instruct drafts), fetching it first if needed; with no --prompt it answers a
built-in coding prompt. The answer streams to stdout as rounds commit; a summary line (and the
per-round trace with --trace) goes to stderr, so stdout holds only the answer (or, with --json,
one JSON object).

Every flag is checked by the API's own validators before anything is fetched or loaded. Exit
status, the same in every specrt command: 0 done, 2 bad input (one `error: ...` line on stderr),
1 a runtime failure (network, disk, or an internal error; SPECRT_DEBUG=1 shows its traceback),
130 on Ctrl-C; a closed pipe (`| head`) ends quietly.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import re
import sys

from specrt.api.args import DTYPE_NAMES, QUANT_NAMES
from specrt.commands import interruptible, named_flags, say, write_out

DEFAULT_PROMPT = ("Write a Python function `merge_intervals(intervals)` that merges "
                  "overlapping intervals and returns them sorted. Include a docstring.")


def build_parser() -> argparse.ArgumentParser:
    from specrt.commands import OneLineParser, prog_name

    p = OneLineParser(prog=prog_name("specrt.generate", "specrt"),
                                description="Generate text with speculative decoding.")
    add_model_args(p)
    p.add_argument("--prompt", help="prompt text (default: a built-in coding prompt)")
    p.add_argument("--prompt-file", metavar="PATH", help="read the prompt text from a file "
                   "('-': standard input)")
    p.add_argument("--system", help="a system message before the prompt (chat template)")
    p.add_argument("--prompt-ids", help="prompt as comma-separated token ids (instead of text)")
    p.add_argument("--max-new-tokens", type=int, default=128, help="(default 128)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=0, help="0 = off (default)")
    p.add_argument("--top-p", type=float, default=1.0, help="1.0 = off (default)")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=None,
                   help="stop string (repeatable); text from it on is not printed")
    add_weights_args(p)
    p.add_argument("--max-seq-len", type=int, default=4096,
                   help="tokens per sequence (prompt + answer) in the KV cache (default 4096)")
    p.add_argument("--speculative-config", default=None,
                   help="JSON with vLLM's keys: method (draft_model | ngram | auto), model, "
                        "num_speculative_tokens, prompt_lookup_min, prompt_lookup_max; "
                        "'none' for plain decoding")
    p.add_argument("--no-spec", action="store_true", help="plain decoding (no speculation)")
    p.add_argument("--no-chat", action="store_true", help="do not apply the chat template")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument("--trace", action="store_true", help="print one line per round to stderr")
    p.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=None,
                   help="run each round on static runners: the draft loop and the verify "
                        "pass (with the rollback) as two CUDA graph replays (default: on with "
                        "CUDA; every round then drafts K)")
    return p


def default_speculative(has_draft: bool) -> dict:
    if has_draft:
        return {"method": "auto", "num_speculative_tokens": 16}
    return {"method": "ngram", "num_speculative_tokens": 4}


@interruptible
def main(argv: list[str] | None = None) -> int:
    """Exit status: 0 done, 2 bad input (one `error:` line), 1 a runtime failure, 130 Ctrl-C
    (specrt.commands.run_command; SPECRT_DEBUG=1 shows an internal error's traceback)."""
    args = build_parser().parse_args(argv)
    from specrt.commands import run_command
    from specrt.logs import configure_logging

    configure_logging()
    return run_command(lambda: _run(args))


@dataclasses.dataclass(frozen=True)
class _Request:
    """Every flag of one run, checked before anything is fetched or loaded."""

    llm: object                       # specrt.api.args.LLMArgs
    prompt: str | list[int]
    max_new_tokens: int
    params: object                    # specrt.spec.sampling.SamplingParams
    stop: list[str]
    spec: object                      # SpecConfig, None (--no-spec), or "default"


def check_flags(args) -> _Request:
    """The same validators as the API (LLMArgs, SamplingParams, SpecConfig, check_stop), run
    on the flags alone: a typo costs no model load."""
    from specrt.api.args import LLMArgs, check_max_new_tokens, check_stop, check_text
    from specrt.errors import ArgumentError, SpecrtError
    from specrt.checks import check_int, show
    from specrt.spec.config import SpecConfig, means_plain
    from specrt.spec.sampling import SamplingParams

    if sys.stdout is None:          # started with `>&-`: the answer would go nowhere
        raise ArgumentError("standard output is closed, and the answer goes there: redirect "
                            "it to a file (> FILE, or > /dev/null to discard it)")
    with named_flags(_flag_of):
        llm = LLMArgs(model=args.model, draft=args.draft, dtype=args.dtype, device=args.device,
                      max_seq_len=args.max_seq_len, cuda_graphs=args.cuda_graphs,
                      draft_dtype=args.draft_dtype, draft_vocab=args.draft_vocab,
                      draft_stop=args.draft_stop)
    given = [f for f, v in (("--prompt", args.prompt), ("--prompt-ids", args.prompt_ids),
                            ("--prompt-file", args.prompt_file)) if v is not None]
    if len(given) > 1:
        raise ArgumentError(f"give one of --prompt, --prompt-ids and --prompt-file, not both "
                            f"{' and '.join(given)}")
    if args.prompt_file is not None:
        args.prompt = _read_prompt_file(args.prompt_file)
    if args.system is not None and (args.prompt_ids is not None or args.no_chat):
        raise ArgumentError("--system goes through the chat template: it cannot be used with "
                            "--prompt-ids or --no-chat")
    if args.system is not None:
        check_text("--system", args.system)
    if args.prompt_ids is not None:
        items = [t.strip() for t in args.prompt_ids.split(",")]
        if any(items) and not all(items):       # a stray comma: an id lost, or a typo
            raise ArgumentError(f"--prompt-ids has an empty item (a doubled or stray comma) in "
                                f"{show(args.prompt_ids)}; give ids like 5,6,7")
        items = [t for t in items if t]
        if not all(re.fullmatch(r"-?[0-9]+", t) for t in items):   # int() takes 1_0, ١ too
            raise ArgumentError(f"--prompt-ids must be comma-separated integers, got "
                                f"{show(args.prompt_ids)}")
        prompt = [int(t) for t in items]
        if not prompt:
            raise ArgumentError("--prompt-ids has no ids; give e.g. --prompt-ids 5,6,7")
        for t in prompt:
            check_int("a token id in --prompt-ids", t, 0, 2**31 - 1)
    else:
        name = "--prompt-file" if args.prompt_file is not None else "--prompt"
        prompt = check_text(name, args.prompt if args.prompt is not None else DEFAULT_PROMPT)
        if not prompt:
            raise ArgumentError(f"{name} is empty; give some text")
    with named_flags(_flag_of):
        params = SamplingParams(temperature=args.temperature, top_k=args.top_k,
                                top_p=args.top_p, seed=args.seed)
    flag = args.speculative_config
    plain = flag is not None and means_plain(flag)
    if args.no_spec and flag is not None and not plain:
        raise ArgumentError("--no-spec and --speculative-config contradict each other; "
                            "give one of them")
    try:
        spec = None if args.no_spec or plain else SpecConfig.parse(flag) or "default"
    except SpecrtError as e:        # the config's own words, which name its keys
        raise ArgumentError(f"--speculative-config: {e}") from None
    check_draft_given(spec, args.model, args.draft)
    if isinstance(spec, SpecConfig) and spec.method == "ngram" and args.draft is not None:
        raise ArgumentError("--draft loads a draft model, and method 'ngram' drafts from the "
                            "prompt with none: drop --draft, or use method 'draft_model' or "
                            "'auto'")
    check_draft_flags_used(args, spec, plain_loads_none=True)
    llm, spec = draft_in_config(spec, llm)
    with named_flags(_flag_of):
        max_new_tokens = check_max_new_tokens(args.max_new_tokens)
    with named_flags(lambda name: "--stop"):     # "every stop string must be ..."
        stop = check_stop(args.stop)
    return _Request(llm, prompt, max_new_tokens, params, stop, spec)


def _flag_of(name: str) -> str | None:
    """This CLI's flag for an API argument: its name spelled with dashes (`--draft-stop`), if
    this CLI has that flag."""
    flag = f"--{name.replace('_', '-')}"
    return flag if flag in _flags() else None


@functools.cache
def _flags() -> frozenset[str]:
    return frozenset(option for action in build_parser()._actions
                     for option in action.option_strings)


def check_draft_given(spec, model, draft) -> None:
    """Method draft_model needs a draft: --draft, or "model" in the config (with no --model the
    default pair brings one), and a "model" there must resolve. Checked on the flags, not
    after the load (generate), nor per request (serve: every request would get a 400)."""
    from specrt.errors import ArgumentError, SpecrtError
    from specrt.hub.resolve import is_hub_id, resolve_model_dir
    from specrt.spec.config import SpecConfig

    # its draft "model", where it is a directory or a known name (no download): before the
    # target loads, so a wrong path is not read as a wrong --model
    if isinstance(spec, SpecConfig) and spec.model is not None and not is_hub_id(spec.model):
        try:
            resolve_model_dir(spec.model)
        except SpecrtError as e:
            raise ArgumentError(f'--speculative-config "model": {e}') from None
    if (isinstance(spec, SpecConfig) and spec.method == "draft_model" and spec.model is None
            and draft is None and model is not None):
        raise ArgumentError("--speculative-config: method 'draft_model' (also the default of "
                            "a JSON object without \"method\") needs a draft model; pass "
                            "--draft DIR, put \"model\": DIR in the config, or choose "
                            "\"method\": \"ngram\"")


def draft_in_config(spec, llm):
    """(the checked LLM arguments, the config to run) where the speculative config names a
    draft "model" (vLLM's way): that model is loaded as the run's draft (`llm.draft`) and the
    config drafts with it, in place of the default pair's draft, which nothing would run (LLM
    would load it, and the named one beside it for the config). Refused beside a --draft
    naming another model: one of the two would be loaded for nothing."""
    from specrt.checks import show
    from specrt.errors import ArgumentError
    from specrt.spec.config import SpecConfig

    if not (isinstance(spec, SpecConfig) and spec.model is not None):
        return llm, spec
    if llm.draft is not None and not _same_model(llm.draft, spec.model):
        raise ArgumentError(f"--draft {show(llm.draft)} and --speculative-config \"model\" "
                            f"{show(spec.model)} name two draft models, and one runs: give one "
                            "of them")
    return (dataclasses.replace(llm, draft=spec.model),
            dataclasses.replace(spec, model=None))


def _same_model(a, b) -> bool:
    """Whether two model arguments name one model: the same text, or the same directory
    (found without a download; a hub id is compared as written)."""
    from specrt.errors import SpecrtError
    from specrt.hub.resolve import is_hub_id, resolve_model_dir

    if os.fspath(a) == os.fspath(b):
        return True
    try:
        return not (is_hub_id(a) or is_hub_id(b)) and os.path.realpath(
            resolve_model_dir(a)) == os.path.realpath(resolve_model_dir(b))
    except SpecrtError:
        return False


def check_draft_flags_used(args, spec, plain_loads_none: bool = False) -> None:
    """A flag that changes only the draft model, when no draft model will load (--model
    without --draft, and no "model" in --speculative-config; or, with plain_loads_none,
    plain decoding (generate's --no-spec / --speculative-config none) and method ngram,
    which generate runs with no draft), would be ignored: refused. (The server loads its
    draft whatever its own config: a request may ask for it.)"""
    from specrt.errors import ArgumentError
    from specrt.spec.config import SpecConfig

    ngram = isinstance(spec, SpecConfig) and spec.method == "ngram"   # (with no "model")
    plain = plain_loads_none and (spec is None or ngram)
    if not plain and (args.model is None or args.draft is not None or (
            isinstance(spec, SpecConfig) and spec.model is not None)):
        return
    draft_flags = argparse.ArgumentParser(add_help=False)     # the flags and their defaults
    add_draft_args(draft_flags)
    for action in draft_flags._actions:
        if getattr(args, action.dest) != action.default:
            flag = action.option_strings[0]
            if plain and ngram:
                raise ArgumentError(f"{flag} sets up a draft model, and method 'ngram' drafts "
                                    f"from the prompt with none: drop {flag}, or use method "
                                    "'draft_model' or 'auto'")
            if plain:
                raise ArgumentError(f"{flag} sets up a draft model, and plain decoding "
                                    "(--no-spec, --speculative-config none) loads none: drop "
                                    f"{flag}, or speculate")
            raise ArgumentError(f"{flag} sets up a draft model, and none is loaded: add "
                                "--draft DIR, or drop " + flag)


# More than any prompt that fits a cache: a file past it (or an endless device) is a mistake,
# refused before it fills the memory.
MAX_PROMPT_FILE_BYTES = 64 << 20


def _read_prompt_file(path: str) -> str:
    """The file's text (`-`: standard input's bytes), which must be UTF-8, less a leading
    byte-order mark (Windows editors write one; the model would read it as 3 tokens); a device
    or more than MAX_PROMPT_FILE_BYTES is refused (a pipe or FIFO is read, as `<(cmd)` gives
    one)."""
    import stat

    from specrt.errors import ArgumentError

    where = "standard input" if path == "-" else path
    try:
        if path == "-":
            if sys.stdin is None:       # started with `<&-`
                raise ArgumentError("--prompt-file -: standard input is closed; give the "
                                    "prompt on standard input, or a file")
            if not hasattr(sys.stdin, "buffer"):         # a text stream put there (tests)
                return sys.stdin.read()
            data = sys.stdin.buffer.read(MAX_PROMPT_FILE_BYTES + 1)
        else:
            with open(path, "rb") as f:
                mode = os.fstat(f.fileno()).st_mode
                if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
                    raise ArgumentError(f"--prompt-file {where} is a device, not a file; give "
                                        "a text file, or - for standard input")
                data = f.read(MAX_PROMPT_FILE_BYTES + 1)
    except OSError as e:
        raise ArgumentError(f"--prompt-file {where}: cannot read it ({e.strerror or e})") \
            from None
    if len(data) > MAX_PROMPT_FILE_BYTES:
        raise ArgumentError(f"--prompt-file {where} holds more than "
                            f"{MAX_PROMPT_FILE_BYTES >> 20} MiB, more than any prompt that fits "
                            "a cache; give a shorter text")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        at = e.start + (3 if data.startswith(b"\xef\xbb\xbf") else 0)    # past the mark
        raise ArgumentError(f"--prompt-file {where} is not valid UTF-8 ({e.reason} at byte "
                            f"{at}); save it as UTF-8 text") from None


def _check_length(req: _Request, spec, prompt_tokens: int | None = None) -> None:
    """prompt + max_new_tokens (+ K + 1) must fit in --max-seq-len: checked on the flags
    before anything is fetched (spec None while the default's K is unknown; a text prompt
    counts as one token), again with the config the pair gives, and after the load with the
    prompt's ids (`prompt_tokens`)."""
    from specrt.engine.request import check_length

    n = len(req.prompt) if isinstance(req.prompt, list) else 1
    check_length(prompt_tokens or n, req.max_new_tokens, spec, req.llm.max_seq_len,
                 "--max-seq-len")


def _run(args) -> int:
    from specrt.api.llm import LLM
    from specrt.hub.resolve import resolve_pair
    from specrt.spec.config import SpecConfig

    req = check_flags(args)
    # Before a fetch: the length with what the flags fix (the default's K needs the pair).
    _check_length(req, None if req.spec == "default" else req.spec)
    # plain decoding (--no-spec) and prompt lookup load no draft: nor the default pair's
    spec = req.spec
    drafts = spec == "default" or (isinstance(spec, SpecConfig) and spec.method != "ngram")
    model, draft = resolve_pair(req.llm.model, req.llm.draft if drafts else None,
                                progress=True, default_draft=drafts)
    if spec == "default":
        spec = SpecConfig.parse(default_speculative(draft is not None))
    _check_length(req, spec)
    dtype = str(req.llm.dtype).removeprefix("torch.")
    say(f"loading {model}" + (f" with draft {draft}" if draft else "") + f" ({dtype}, "
        f"{req.llm.device})")
    llm = LLM(model=model, draft=draft, dtype=req.llm.dtype, device=req.llm.device,
              max_seq_len=req.llm.max_seq_len, cuda_graphs=req.llm.cuda_graphs,
              draft_dtype=args.draft_dtype, draft_vocab=args.draft_vocab,
              draft_stop=args.draft_stop)
    prompt, messages = req.prompt, None
    if args.system is not None:
        prompt, messages = None, [{"role": "system", "content": args.system},
                                  {"role": "user", "content": req.prompt}]
    p = req.params
    interrupted = written = False
    try:
        ids = llm.request_ids(prompt, messages, chat=False if args.no_chat else None)
        _check_length(req, spec, len(ids))
        run = llm.submit(ids, max_new_tokens=req.max_new_tokens, temperature=p.temperature,
                         top_k=p.top_k, top_p=p.top_p, seed=p.seed, stop=req.stop or None,
                         speculative=spec)
        for chunk in run.chunks():
            if args.trace:
                if chunk.step is not None and chunk.step.index > 0:
                    say(_trace_line(llm, chunk.step))
                for step in chunk.tail:          # rounds run past a stop string
                    if step.plan:                # (not the cancel that ended them)
                        say(_trace_line(llm, step, dropped=True))
            if args.json:
                continue
            out = chunk.text
            if llm.tokenizer is None:     # no text: the answer is its ids, space-separated
                out = " ".join(map(str, chunk.token_ids))
                out = " " + out if out and written else out
            written = written or bool(out)
            if out:
                write_out(out)
    except KeyboardInterrupt:
        # No close: it would wait for the scheduler thread's work in progress (a calibration
        # for `auto` takes seconds); run_command ends the process without it.
        interrupted = True
        raise
    finally:
        if not interrupted:
            llm.close()
    result = run.result()
    if args.json:
        write_out(json.dumps({"token_ids": result.token_ids, "text": result.text,
                              "finish_reason": result.finish_reason, "stats": result.stats})
                  + "\n")
    else:
        write_out("\n")               # a closed pipe surfaces here, inside run_command
    say(summary_line(result.stats, spec))
    return 0


def summary_line(stats: dict, spec) -> str:
    from specrt.spec.config import SpecConfig

    cfg = SpecConfig.parse(spec)
    method = "plain" if cfg is None else f"{cfg.method} K={cfg.num_speculative_tokens}"
    return (f"[specrt] {stats['new_tokens']} new tokens in {stats['seconds']:.2f} s "
            f"({stats['tokens_per_second']:.2f} tok/s) | {method} | acceptance "
            f"{stats['acceptance_rate']:.1%} | mean acceptance length "
            f"{stats['mean_acceptance_length']:.2f} | {stats['target_passes']} target passes")


def _trace_line(llm, step, dropped: bool = False) -> str:
    def show(ids):
        if llm.tokenizer is None:
            return ",".join(str(t) for t in ids)
        return ",".join(json.dumps(llm.tokenizer.token_text(t)) for t in ids)

    drafts = step.draft_tokens
    kept = step.num_accepted
    target = step.new_tokens[kept:]
    return (f"round {step.index} | {step.plan} | draft: {show(drafts) or '-'} | "
            f"kept {kept}/{len(drafts)} | target: {show(target) or '-'}"
            + (" | past the stop string: dropped" if dropped else ""))


def add_model_args(p: argparse.ArgumentParser) -> None:
    """--model and --draft, shared by this CLI and specrt-serve."""
    p.add_argument("--model", help="target model: a directory, a known name or a Hugging "
                   "Face id org/name[@revision] (default: the fetched "
                   "qwen2.5-coder-1.5b-instruct)")
    p.add_argument("--draft", help="draft model, given as --model is (default with no "
                   "--model: qwen2.5-coder-0.5b-instruct)")


def add_weights_args(p: argparse.ArgumentParser) -> None:
    """--dtype, the draft's flags (`add_draft_args`) and --device, shared by this CLI and
    specrt-serve."""
    p.add_argument("--dtype", default="auto", choices=DTYPE_NAMES,
                   help="auto (default): bfloat16 on a CUDA device with bf16 or where "
                        "specrt's CPU kernels run it, else float32")
    add_draft_args(p)
    p.add_argument("--device", default=None,
                   help="cpu, cuda or cuda:N (default: cuda if available)")


def add_draft_args(p: argparse.ArgumentParser) -> None:
    """--draft-dtype, --draft-vocab and --draft-stop (`add_weights_args`)."""
    p.add_argument("--draft-dtype", default="auto",
                   choices=("auto", *QUANT_NAMES, *DTYPE_NAMES[1:]),
                   help="the draft model's weights: auto (default) = int8 where the CPU int8 "
                        "kernel runs, else --dtype; int8 or int4 (CPU only; int4: input sizes "
                        "multiples of 128); or --dtype itself. The output does not change: "
                        "only the target decides what is emitted")
    p.add_argument("--draft-vocab", default="auto", type=draft_vocab_flag,
                   help="token ids the draft scores: auto (default: the first 49152 and the "
                        "special tokens when the vocabulary is over twice that), all, or N; "
                        "a shortlisted draft also scores the ids its request has read")
    from specrt.spec.config import DRAFT_STOP

    p.add_argument("--draft-stop", default=DRAFT_STOP, type=float, metavar="P",
                   help="the draft model stops a round's drafts after a guess it gives less "
                        f"than this probability (default {DRAFT_STOP}; 0: never). The "
                        "output does not change")


def draft_vocab_flag(value: str):
    """--draft-vocab: 'auto', 'all' (None) or a count (checked by LLMArgs)."""
    if value in ("auto", "all"):
        return None if value == "all" else value
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected auto, all or a token count, got {value!r}")


if __name__ == "__main__":
    sys.exit(main())
