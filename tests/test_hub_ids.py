"""Models by Hugging Face id (`org/name`, `org/name@revision`), resolved through
huggingface_hub's cache, with no network.

The end-to-end tests lay a tiny model out exactly as huggingface_hub caches a download
(`hub/models--org--name/{refs/main, snapshots/<commit>/<file> -> ../../blobs/<hash>, blobs/}`)
under a temporary HF_HOME, and run specrt in a subprocess with HF_HUB_OFFLINE=1: huggingface_hub
reads HF_HOME and HF_HUB_OFFLINE once, at import, so only a fresh interpreter honours them the
way a user's shell does. HF_ENDPOINT points at a closed local port, so a stray request fails
at once rather than reaching the network.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import specrt
from specrt.errors import SpecrtError
from specrt.hub import resolve

ROOT = Path(__file__).resolve().parents[1]
REPO_ID = "tiny-org/tiny-qwen2"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
PROMPT = [5, 17, 42, 5, 17]


def _blob_name(data: bytes, lfs: bool) -> str:
    # The hub names a blob by its etag: sha256 for LFS files, the git blob sha1 otherwise.
    if lfs:
        return hashlib.sha256(data).hexdigest()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def make_hub_cache(hf_home: Path, repo_id: str, commit: str, model_dir: Path) -> Path:
    """`model_dir`'s files as huggingface_hub would have cached `repo_id` at `commit`."""
    repo = hf_home / "hub" / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)     # no newline, as the hub writes it
    for f in sorted(p for p in model_dir.rglob("*") if p.is_file()):
        data = f.read_bytes()
        blob = repo / "blobs" / _blob_name(data, f.suffix == ".safetensors")
        blob.write_bytes(data)
        link = snapshot / f.relative_to(model_dir)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    return snapshot


@pytest.fixture(scope="module")
def hf_home(tmp_path_factory, tiny_noeos_dir):
    home = tmp_path_factory.mktemp("hf_home")
    make_hub_cache(home, REPO_ID, COMMIT, tiny_noeos_dir)
    return home


SCRIPT = """
import json, sys
import specrt
repo, commit, prompt = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
out = {}
for key, model in (("main", repo), ("pinned", f"{repo}@{commit}")):
    llm = specrt.LLM(model, dtype="float32")   # as the expected tokens below
    res = llm.generate(prompt, max_new_tokens=12, chat=False)
    out[key] = {"dir": str(llm.model_dir), "tokens": res.token_ids}
for key, model in (("unknown", "tiny-org/no-such-model"), ("bad_rev", f"{repo}@v9")):
    try:
        specrt.LLM(model)
    except specrt.SpecrtError as e:
        out[key] = str(e)
print(json.dumps(out))
"""


def test_llm_loads_a_hub_id_from_the_cache_offline(hf_home, tiny_noeos_dir):
    env = {k: v for k, v in os.environ.items()
           if k not in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_CACHE")}
    env.update(HF_HOME=str(hf_home), HF_HUB_OFFLINE="1", HF_ENDPOINT="http://127.0.0.1:9",
               PYTHONPATH=str(ROOT))
    run = subprocess.run([sys.executable, "-c", SCRIPT, REPO_ID, COMMIT, json.dumps(PROMPT)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.splitlines()[-1])

    snapshot = hf_home / "hub" / "models--tiny-org--tiny-qwen2" / "snapshots" / COMMIT
    llm = specrt.LLM(tiny_noeos_dir, dtype="float32")
    expected = llm.generate(PROMPT, max_new_tokens=12).token_ids
    for key in ("main", "pinned"):
        assert Path(out[key]["dir"]) == snapshot
        assert out[key]["tokens"] == expected
    # Not cached, and offline: the message names the id, the cause and the way out.
    for key, model in (("unknown", "tiny-org/no-such-model"), ("bad_rev", f"{REPO_ID}@v9")):
        message = out[key]
        assert repr(model) in message and "HF_HUB_OFFLINE is set" in message
        assert "hf download" in message


def test_snapshot_download_is_asked_for_model_files_only(monkeypatch, tmp_path):
    import huggingface_hub

    calls = []

    def fake_snapshot_download(repo_id, revision=None, allow_patterns=None, **kwargs):
        calls.append((repo_id, revision, allow_patterns))
        return str(tmp_path)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    assert resolve.resolve_model_dir("Qwen/Qwen2.5-Coder-1.5B-Instruct") == tmp_path
    assert resolve.resolve_model_dir("Qwen/Qwen2.5-Coder-1.5B-Instruct@v1.0") == tmp_path
    assert [c[:2] for c in calls] == [("Qwen/Qwen2.5-Coder-1.5B-Instruct", None),
                                      ("Qwen/Qwen2.5-Coder-1.5B-Instruct", "v1.0")]
    patterns = calls[0][2]
    assert {"config.json", "*.safetensors", "tokenizer.json"} <= set(patterns)
    assert not any("bin" in p or "gguf" in p or p == "*" for p in patterns)


def test_network_error_is_a_specrt_error(monkeypatch):
    import huggingface_hub
    from huggingface_hub import constants
    from huggingface_hub.errors import LocalEntryNotFoundError

    def unreachable(*args, **kwargs):
        raise LocalEntryNotFoundError("An error happened while trying to locate the files on "
                                      "the Hub: ConnectError")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", unreachable)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    with pytest.raises(SpecrtError, match=r"could not download 'org/model'.*network"):
        resolve.resolve_model_dir("org/model")

    def connection_reset(*args, **kwargs):
        raise ConnectionResetError("connection reset by peer")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", connection_reset)
    with pytest.raises(SpecrtError, match=r"could not fetch 'org/model'.*ConnectionResetError"):
        resolve.resolve_model_dir("org/model")


@pytest.mark.parametrize("model", ["/no/such/dir", "./org/model", "a/b/c", "~/models/x"])
def test_paths_are_not_taken_for_hub_ids(model, monkeypatch):
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "snapshot_download", pytest.fail)
    with pytest.raises(SpecrtError, match="does not exist"):
        resolve.resolve_model_dir(model)


@pytest.mark.parametrize("name", ["models/qwen.gguf", "org/model"])
def test_a_file_is_named_as_a_file_not_looked_up_on_the_hub(name, tmp_path, monkeypatch):
    """An existing file, even one whose relative path looks like `org/name`, is neither a
    model directory nor a Hugging Face id: one error says so (and how to convert a GGUF)."""
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "snapshot_download", pytest.fail)
    monkeypatch.chdir(tmp_path)
    (tmp_path / name).parent.mkdir()
    (tmp_path / name).write_bytes(b"GGUF")
    with pytest.raises(SpecrtError, match="is a file, not a model directory") as e:
        resolve.resolve_model_dir(name)
    assert ("python -m specrt.models convert" in str(e.value)) == name.endswith(".gguf")


def test_a_mistyped_relative_directory_is_named_besides_the_hub_failure(tmp_path, monkeypatch):
    """`review/tinyy` where review/ exists reads as an `org/name` id, and the hub lookup fails
    (here: offline); the error also says there is no such directory, so the typo shows."""
    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError

    def unreachable(*args, **kwargs):
        raise LocalEntryNotFoundError("cannot reach the Hub")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", unreachable)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "review" / "tiny").mkdir(parents=True)
    with pytest.raises(SpecrtError, match="there is no directory") as e:
        resolve.resolve_model_dir("review/tinyy")
    assert str(tmp_path / "review" / "tinyy") in str(e.value)
    assert "Hugging Face" in str(e.value)
    with pytest.raises(SpecrtError) as e:             # no such parent: an id, no path hint
        resolve.resolve_model_dir("some-org/model")
    assert "no directory" not in str(e.value)
