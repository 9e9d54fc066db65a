"""From what a user wrote (`--model`, `LLM(model=...)`) to a model directory: the one place that
resolves names, paths and the default pair."""
from __future__ import annotations

from pathlib import Path

from specrt.errors import SpecrtError
from specrt.hub.paths import model_dir
from specrt.hub.registry import DEFAULT_DRAFT, DEFAULT_TARGET, KNOWN_MODELS

__all__ = ["resolve_model_dir", "resolve_pair"]


def resolve_model_dir(model: str | Path) -> Path:
    """A directory path, or the name of a model `python -m specrt.models` knows (fetched)."""
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    if str(model) in KNOWN_MODELS:
        path = model_dir(str(model))
        if path.is_dir():
            return path
        raise SpecrtError(f"model {model!r} is not fetched yet; run: "
                          f"python -m specrt.models fetch {model}")
    raise SpecrtError(f"model directory {path} does not exist; pass a Hugging Face-style "
                      "directory (config.json + *.safetensors), or fetch the default pair with: "
                      "python -m specrt.models fetch")


def resolve_pair(model: str | Path | None, draft: str | Path | None,
                 progress: bool = False) -> tuple[Path, Path | None]:
    """(target dir, draft dir or None). No model: the default pair, fetched first if missing
    (about 1.6 GB of downloads the first time); a model without a draft runs without one."""
    if model is None:
        from specrt.hub.fetch import ensure_model

        model = ensure_model(DEFAULT_TARGET, progress=progress)
        if draft is None:
            draft = ensure_model(DEFAULT_DRAFT, progress=progress)
    return resolve_model_dir(model), resolve_model_dir(draft) if draft is not None else None
