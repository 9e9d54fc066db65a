"""Which model directories a benchmark runs on: --model / --draft, or the fetched default pair.

`default_pair()` is the only place in benchmarks/ that asks specrt (`specrt.hub`) where the
default pair lives. Unlike `specrt.hub.resolve_pair`, nothing here downloads: a missing default
model is an error that says how to fetch it.
"""
from __future__ import annotations

from pathlib import Path

from benchmarks.harness.cli import fail

FETCH_HINT = "python -m specrt.models fetch"


def default_pair() -> tuple[Path, Path]:
    """(target_dir, draft_dir) of the default pair once fetched; not checked, never fetched."""
    from specrt.hub import DEFAULT_DRAFT, DEFAULT_TARGET, model_dir

    return model_dir(DEFAULT_TARGET), model_dir(DEFAULT_DRAFT)


def _check(path: Path, role: str, default: bool) -> Path:
    ok = path.is_dir() and (path / "config.json").is_file() and any(path.glob("*.safetensors"))
    if ok:
        return path
    if default:
        fail(f"the default {role} model is not fetched ({path} is missing or incomplete); "
             f"run: {FETCH_HINT}")
    fail(f"{role} model directory {path} does not exist or has no config.json + "
         f"*.safetensors; pass a Hugging Face-style directory, or fetch the default pair "
         f"with: {FETCH_HINT}")


def resolve_models(args, need_draft: bool = True) -> tuple[Path, Path | None]:
    """(target_dir, draft_dir): --model/--draft, defaulting to the fetched pair. The default
    draft is used only with the default target (a custom target gets --draft or none)."""
    given_draft = getattr(args, "draft", None) if need_draft else None
    if args.model:
        target = _check(Path(args.model).expanduser(), "target", False)
    else:
        target = _check(default_pair()[0], "target", True)
    if given_draft:
        return target, _check(Path(given_draft).expanduser(), "draft", False)
    if need_draft and not args.model:
        return target, _check(default_pair()[1], "draft", True)
    return target, None


def resolve_with_draft(args, why: str) -> tuple[Path, Path]:
    """(target_dir, draft_dir) for a benchmark that needs the draft model (`why`: what for);
    fails, before any model loads, when --model is given without --draft."""
    target, draft = resolve_models(args)
    if draft is None:
        fail(f"a draft model is needed ({why}) and --model was given without --draft: pass "
             "--draft DIR too, or neither for the default pair")
    return target, draft
