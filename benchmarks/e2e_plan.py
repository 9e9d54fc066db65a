"""What an end-to-end run will do: command-line arguments -> a RunConfig (the --quick
defaults, checks, the model pair, the methods to run) and the prompts.

Planning fails early with a clear message (harness.cli.fail) on bad arguments; it loads no
model and measures nothing.
"""
from __future__ import annotations

import json
from pathlib import Path

from benchmarks.e2e_records import Method, Prompt, RunConfig
from benchmarks.harness import cli, model_dirs

METHOD_SYNTAX = ("plain, draft_model:K, ngram:K, auto:K, hf:plain, hf:assisted:K, hf:lookup:K, "
                 "llamacpp:plain, llamacpp:draft:K, llamacpp:ngram-simple:K, "
                 "llamacpp:ngram-map-k:K")
KINDS = {"specrt": ("plain", "draft_model", "ngram", "auto"),
         "hf": ("plain", "assisted", "lookup"),
         "llamacpp": ("plain", "draft", "ngram-simple", "ngram-map-k")}


def apply_quick_defaults(args) -> None:
    """Fill the options whose default depends on --quick (in place)."""
    if args.max_new_tokens is None:
        args.max_new_tokens = 64 if args.quick else 128
    if args.prompts_per_task is None:
        args.prompts_per_task = 1 if args.quick else 3
    if args.ks is None:
        args.ks = "2,4" if args.quick else "1,2,4,8"
    if args.hf_k is None:
        args.hf_k = "4" if args.quick else "4,8"
    if args.llamacpp_ks is None:
        args.llamacpp_ks = "2,4" if args.quick else "2,4,8"


def build_config(args) -> RunConfig:
    """Check the arguments, set torch up, find the models and plan the methods."""
    apply_quick_defaults(args)
    if args.max_new_tokens < 1 or args.prompts_per_task < 1 or args.repeats < 1:
        cli.fail("--max-new-tokens, --prompts-per-task and --repeats must be >= 1")
    # default: every task of the prompts file (checked against the file by load_prompts)
    tasks = tuple(t.strip() for t in (args.tasks or "").split(",") if t.strip()) or \
        tuple(prompt_tasks(args.prompts))
    target, draft = model_dirs.resolve_models(args)
    methods, notes = plan_methods(args, has_draft=draft is not None)
    lc_dir = None
    if any(m.engine == "llamacpp" for m in methods):
        lc_dir = find_llamacpp(args, target, draft if any(
            m.engine == "llamacpp" and m.needs_draft for m in methods) else None)
    cli.setup_torch(args.threads, args.device)
    return RunConfig(target=target, draft=draft, dtype=args.dtype, device=args.device,
                     threads=args.threads, max_new_tokens=args.max_new_tokens,
                     max_seq_len=args.max_seq_len, tasks=tasks,
                     prompts_per_task=args.prompts_per_task, repeats=args.repeats,
                     methods=tuple(methods), quick=args.quick,
                     show_progress=not args.no_progress, prompts=Path(args.prompts),
                     notes=tuple(notes),
                     llamacpp_dir=lc_dir, llamacpp_timeout=args.llamacpp_timeout)


def find_llamacpp(args, target: Path, draft: Path | None) -> Path:
    """The `make bench-llamacpp` cache folder, or exit 2 saying how to build it."""
    from benchmarks.llamacpp import install

    if args.device != "cpu":
        cli.fail("--llamacpp compares CPU decoding; use --device cpu")
    try:
        return install.find(args.llamacpp_dir and Path(args.llamacpp_dir),
                            [m for m in (target, draft) if m]).root
    except install.NotInstalled as e:
        cli.fail(str(e))


def _parse_method(tok: str, ks: dict[str, list[int]], auto_k: int) -> list[Method]:
    """One --methods entry -> its methods ('ngram' alone: every K of its engine)."""
    parts = tok.split(":")
    engine = parts[0] if parts[0] in ("hf", "llamacpp") else "specrt"
    parts = parts[1:] if engine != "specrt" else parts
    if not parts or parts[0] not in KINDS[engine] or len(parts) > 2:
        cli.fail(f"unknown method {tok!r} in --methods; use {METHOD_SYNTAX}")
    kind = parts[0]
    if kind == "plain":
        return [Method(engine, "plain")]
    if len(parts) == 2:
        return [Method(engine, kind, cli.positive_ints(parts[1], f"K of {tok!r}")[0])]
    if kind == "auto":
        return [Method(engine, kind, auto_k)]
    return [Method(engine, kind, k) for k in ks[engine]]


def _defaults(engine: str, ks: list[int], auto_k: int) -> list[Method]:
    return [Method(engine, "plain")] + [Method(engine, kind, k) for kind in KINDS[engine][1:]
                                        for k in ((auto_k,) if kind == "auto" else ks)]


def interleave(a: list[Method], b: list[Method]) -> list[Method]:
    """a[0], b[0], a[1], b[1], ... then the rest of the longer: the two systems' methods
    alternate, so drift within a prompt's sweep hits both alike."""
    out = []
    for i in range(max(len(a), len(b))):
        out += a[i:i + 1] + b[i:i + 1]
    return out


def plan_methods(args, has_draft: bool) -> tuple[list[Method], list[str]]:
    """(methods in run order: specrt's alternating with llama.cpp's, then HF's; notes on what
    was added or skipped)."""
    ks = {"specrt": cli.positive_ints(args.ks, "--ks", unique_sorted=True),
          "hf": cli.positive_ints(args.hf_k, "--hf-k", unique_sorted=True),
          "llamacpp": cli.positive_ints(args.llamacpp_ks, "--llamacpp-ks", unique_sorted=True)}
    notes = []
    by = {e: [] for e in KINDS}
    for tok in (t.strip() for t in (args.methods or "").split(",") if t.strip()):
        for m in _parse_method(tok, ks, args.auto_k):
            if m not in by[m.engine]:
                by[m.engine].append(m)
    if by["llamacpp"] and not args.llamacpp:
        cli.fail("llamacpp:... methods need --llamacpp")
    if not args.methods:
        by["specrt"] = _defaults("specrt", ks["specrt"], args.auto_k)
    elif Method("specrt", "plain") not in by["specrt"]:
        by["specrt"].insert(0, Method("specrt", "plain"))
        notes.append("plain added: it is the baseline of every speedup and of exactness")
    for e in ("hf", "llamacpp"):
        if not by[e]:
            by[e] = _defaults(e, ks[e], args.auto_k)
        elif Method(e, "plain") not in by[e]:
            by[e].insert(0, Method(e, "plain"))
    methods = interleave(by["specrt"], by["llamacpp"] if args.llamacpp else [])
    methods += [] if args.no_hf else by["hf"]
    if not has_draft and any(m.needs_draft for m in methods):
        notes.append("draft_model, auto, hf:assisted and llamacpp:draft skipped: no draft "
                     "model (pass --draft)")
        methods = [m for m in methods if not m.needs_draft]
    return methods, notes


PROMPT_FORMAT = ('{"tasks": {"TASK": [{"id": "...", "prompt": "..."} or {"id": "...", '
                 '"messages": [{"role": "...", "content": "..."}, ...]}, ...]}}')


def prompt_tasks(path: str) -> dict:
    """The "tasks" of a prompts file (benchmarks/prompts.json format): at least one task."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        cli.fail(f"cannot read the prompts file {path}: {e.strerror or e}")
    try:
        tasks = json.loads(text)["tasks"]
    except (ValueError, KeyError, TypeError) as e:
        cli.fail(f"{path} is not a prompts file ({type(e).__name__}: {e}); the format: "
                 f"{PROMPT_FORMAT}")
    if not isinstance(tasks, dict) or not tasks:
        cli.fail(f"{path} has no tasks; the format: {PROMPT_FORMAT}")
    return tasks


def _prompt(path: str, task: str, item) -> Prompt:
    """One item of a task, or exit 2 naming it."""
    try:
        text = item["prompt"] if "prompt" in item else tuple(
            (m["role"], m["content"]) for m in item["messages"])
        ok = isinstance(item["id"], str) and (isinstance(text, str) or (
            text and all(isinstance(x, str) for m in text for x in m)))
    except (KeyError, TypeError):
        ok = False
    if not ok:
        cli.fail(f"{path}: an item of task {task!r} is not a prompt ({str(item)[:60]}); the "
                 f"format: {PROMPT_FORMAT}")
    return Prompt(task, item["id"], text)


def load_prompts(path: str, tasks: tuple[str, ...], per_task: int) -> list[Prompt]:
    """The first `per_task` prompts of each task in the prompts file, task by task. A prompt is
    a text ("prompt", sent as one user message) or a conversation ("messages"). Exits 2 on a
    file without tasks, a task that is not there or has no prompts, and a malformed item."""
    data = prompt_tasks(path)
    out = []
    for t in tasks:
        if t not in data:
            cli.fail(f"task {t!r} is not in {path} (it has {', '.join(data)})")
        if not isinstance(data[t], list) or not data[t]:
            cli.fail(f"task {t!r} of {path} has no prompts: give it some, or leave it out "
                     "with --tasks")
        out += [_prompt(path, t, p) for p in data[t][:per_task]]
    return out
