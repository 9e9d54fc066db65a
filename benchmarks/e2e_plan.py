"""What an end-to-end run will do: command-line arguments -> a RunConfig (the --quick
defaults, checks, the model pair, the methods to run) and the prompts.

Planning fails early with a clear message (harness.cli.fail) on bad arguments; it loads no
model and measures nothing.
"""
from __future__ import annotations

import json
from pathlib import Path

from benchmarks.e2e_records import TASKS, Method, Prompt, RunConfig
from benchmarks.harness import cli, model_dirs

METHOD_SYNTAX = "plain, draft_model:K, ngram:K, auto:K, hf:plain, hf:assisted:K, hf:lookup:K"


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


def build_config(args) -> RunConfig:
    """Check the arguments, set torch up, find the models and plan the methods."""
    apply_quick_defaults(args)
    if args.max_new_tokens < 1 or args.prompts_per_task < 1 or args.repeats < 1:
        cli.fail("--max-new-tokens, --prompts-per-task and --repeats must be >= 1")
    tasks = tuple(t.strip() for t in args.tasks.split(",") if t.strip())
    for t in tasks:
        if t not in TASKS:
            cli.fail(f"unknown task {t!r}; tasks are {', '.join(TASKS)}")
    cli.setup_torch(args.threads, args.device)
    target, draft = model_dirs.resolve_models(args)
    methods, notes = plan_methods(args, has_draft=draft is not None)
    return RunConfig(target=target, draft=draft, dtype=args.dtype, device=args.device,
                     threads=args.threads, max_new_tokens=args.max_new_tokens,
                     max_seq_len=args.max_seq_len, tasks=tasks,
                     prompts_per_task=args.prompts_per_task, repeats=args.repeats,
                     methods=tuple(methods), quick=args.quick,
                     show_progress=not args.no_progress, notes=tuple(notes))


def _parse_method(tok: str, ks: list[int], hf_ks: list[int], auto_k: int) -> list[Method]:
    """One --methods entry -> its methods ('ngram' alone: every K in --ks)."""
    parts = tok.split(":")
    engine = "hf" if parts[0] == "hf" else "specrt"
    parts = parts[1:] if engine == "hf" else parts
    kinds = (("plain", "assisted", "lookup") if engine == "hf"
             else ("plain", "draft_model", "ngram", "auto"))
    if not parts or parts[0] not in kinds or len(parts) > 2:
        cli.fail(f"unknown method {tok!r} in --methods; use {METHOD_SYNTAX}")
    kind = parts[0]
    if kind == "plain":
        return [Method(engine, "plain")]
    if len(parts) == 2:
        return [Method(engine, kind, cli.positive_ints(parts[1], f"K of {tok!r}")[0])]
    if kind == "auto":
        return [Method(engine, kind, auto_k)]
    return [Method(engine, kind, k) for k in (hf_ks if engine == "hf" else ks)]


def plan_methods(args, has_draft: bool) -> tuple[list[Method], list[str]]:
    """(methods in run order: specrt's then HF's, notes on what was added or skipped)."""
    ks = cli.positive_ints(args.ks, "--ks", unique_sorted=True)
    hf_ks = cli.positive_ints(args.hf_k, "--hf-k", unique_sorted=True)
    notes = []
    default_hf = ([Method("hf", "plain")] + [Method("hf", "assisted", k) for k in hf_ks]
                  + [Method("hf", "lookup", k) for k in hf_ks])
    if args.methods:
        sp, hf = [], []
        for tok in (t.strip() for t in args.methods.split(",") if t.strip()):
            for m in _parse_method(tok, ks, hf_ks, args.auto_k):
                if m not in sp + hf:
                    (hf if m.engine == "hf" else sp).append(m)
        if Method("specrt", "plain") not in sp:
            sp.insert(0, Method("specrt", "plain"))
            notes.append("plain added: it is the baseline of every speedup and of exactness")
        if not hf:
            hf = default_hf
        elif Method("hf", "plain") not in hf:
            hf.insert(0, Method("hf", "plain"))
    else:
        sp = ([Method("specrt", "plain")] + [Method("specrt", "draft_model", k) for k in ks]
              + [Method("specrt", "ngram", k) for k in ks]
              + [Method("specrt", "auto", args.auto_k)])
        hf = default_hf
    methods = sp + ([] if args.no_hf else hf)
    if not has_draft and any(m.needs_draft for m in methods):
        notes.append("draft_model, auto and hf:assisted skipped: no draft model (pass --draft)")
        methods = [m for m in methods if not m.needs_draft]
    return methods, notes


def load_prompts(path: str, tasks: tuple[str, ...], per_task: int) -> list[Prompt]:
    """The first `per_task` prompts of each task in the prompts file, task by task."""
    try:
        data = json.loads(Path(path).read_text())["tasks"]
    except (OSError, ValueError, KeyError) as e:
        cli.fail(f"cannot read prompts from {path}: {e}")
    out = []
    for t in tasks:
        if t not in data:
            cli.fail(f"task {t!r} is not in {path} (it has {', '.join(data)})")
        out += [Prompt(t, p["id"], p["prompt"]) for p in data[t][:per_task]]
    return out
