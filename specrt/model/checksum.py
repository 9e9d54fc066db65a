"""The sha256 of converted weights: recorded at conversion, verified on load, cheaply.

`specrt.hub.gguf_convert` writes `specrt-checksum.json` beside the `model.safetensors` it
produced: {"file", "size", "sha256"}. The first load hashes the file in full (3 GB: a few
seconds) and, if it matches, records the file's (size, mtime_ns) as "verified"; later loads
only compare those two numbers, so a flipped byte is caught at first use and an edited or
replaced file whenever its size or mtime changes. Directories without the record (a user's
own checkpoint, or models converted before checksums existed) are not hashed at all.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from specrt.errors import ChecksumError
from specrt.model.files import check_regular, read_json, umask

CHECKSUM_FILE = "specrt-checksum.json"
_CHUNK = 1 << 22


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def write_record(model_dir: Path, record: dict) -> None:
    """Write `specrt-checksum.json` atomically (temp file + os.replace)."""
    fd, tmp = tempfile.mkstemp(prefix=".tmp-checksum-", dir=model_dir)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(record, f, indent=2)
            f.write("\n")
        os.chmod(tmp, 0o666 & ~umask())     # mkstemp made it 0600: as any new file
        os.replace(tmp, model_dir / CHECKSUM_FILE)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def record_conversion(model_dir: Path, weights: str, size: int, sha256: str) -> None:
    write_record(Path(model_dir), {"file": weights, "size": size, "sha256": sha256})


def verify(model_dir: Path, refetch: str = "python -m specrt.models fetch") -> None:
    """Raise ChecksumError if the weights recorded in `specrt-checksum.json` changed."""
    model_dir = Path(model_dir)
    path = model_dir / CHECKSUM_FILE
    if not os.path.lexists(path):
        return
    fix = (f"delete {model_dir} and re-convert it (`{refetch}` fetches and converts the "
           "default models again)")
    record = read_json(path, "checksum record", fix=fix, error=ChecksumError)
    name, size, digest = record.get("file"), record.get("size"), record.get("sha256")
    if not (isinstance(name, str) and "/" not in name and isinstance(size, int)
            and isinstance(digest, str) and len(digest) == 64):
        raise ChecksumError(f"checksum record {path} is malformed ({record!r}); {fix}")
    weights = model_dir / name
    try:
        st = check_regular(weights, "converted weights")
    except FileNotFoundError:
        raise ChecksumError(f"{weights} is missing; {fix}") from None
    stamp = [st.st_size, st.st_mtime_ns]
    if record.get("verified") == stamp:
        return
    actual = file_sha256(weights) if st.st_size == size else None
    if st.st_size != size or actual != digest:
        raise ChecksumError(
            f"{weights} changed since conversion (size {st.st_size:,} bytes, expected {size:,}; "
            f"sha256 {actual or 'not computed'}, expected {digest}): the file is corrupt or was "
            f"modified; {fix}")
    try:
        write_record(model_dir, {**record, "verified": stamp})
    except OSError:
        pass    # a read-only model directory: verify in full at every load instead
