"""A GGUF header walked once, every length checked against the bytes left, before gguf's reader
trusts it.

`gguf.GGUFReader` believes the counts a header states: a metadata array claiming 2^60 integers
makes it read past the end of the file, where it gets empty arrays, never advances, and appends
to a list until memory runs out. This walk reads lengths and counts only (never the values),
in O(entries) steps, and refuses what the file cannot hold: a count or length larger than the
bytes left, a metadata key stated twice (the reader raises a bare KeyError), a value type GGUF
does not define, and a big-endian file (transformers' tokenizer reader cannot read one). Files
of another GGUF version are left to the reader, which refuses them.

Layout (GGUF v2 and v3, little-endian): "GGUF", u32 version, u64 tensor count, u64 metadata
count; each metadata entry a string key, u32 value type, value (a string is u64 length + bytes,
an array u32 element type + u64 count + elements); then each tensor's string name, u32 n_dims,
n_dims u64 dimensions, u32 type, u64 data offset.
"""
from __future__ import annotations

import mmap
import struct
from pathlib import Path

from specrt.errors import UnsupportedGGUF
from specrt.hub.gguf_tokenizer import REMAKE

# Value type -> size in bytes of its fixed-size values (8 = string, 9 = array: variable).
_FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9
_MAX_DEPTH = 64         # arrays of arrays: GGUF allows any depth; deeper than this would only
                        # exhaust the walk's recursion (no model nests even two levels)
# gguf's reader and transformers' tokenizer reader spend ~1.3 KB of memory and ~10 us on each
# metadata value (a 2.3 MB file with one array of 2,000,000 bytes: 51 s, 3 GB), so counts
# that no model needs are refused: a model states a few dozen keys, and only its tokenizer's
# arrays (tokens, scores, types, merges) run long, to a few hundred thousand.
_MAX_KEYS = 4096
_MAX_TOKENIZER_ITEMS = 1 << 20
_MAX_ITEMS = 1 << 16


def shown(name: bytes | str, limit: int = 60) -> str:
    """A name from the file as messages quote it: repr'd, cut to `limit` characters (a garbled
    length can make a "name" of megabytes)."""
    if isinstance(name, bytes):
        name = name.decode("utf-8", "replace")
    text = repr(name)
    return text if len(text) <= limit else text[:limit - 4] + "...'"


class _Walk:
    def __init__(self, buf, size: int):
        self.buf, self.size, self.at = buf, size, 0

    def fail(self, what: str) -> None:
        raise UnsupportedGGUF(f"GGUF header: {what} (at byte {self.at} of {self.size}); "
                              f"{REMAKE}")

    def take(self, n: int, what: str) -> int:
        """Skip n bytes; their start."""
        if n > self.size - self.at:
            self.fail(f"{what} needs {n} bytes, but only {self.size - self.at} remain")
        start, self.at = self.at, self.at + n
        return start

    def u32(self, what: str) -> int:
        return struct.unpack_from("<I", self.buf, self.take(4, what))[0]

    def u64(self, what: str) -> int:
        return struct.unpack_from("<Q", self.buf, self.take(8, what))[0]

    def string(self, what: str) -> bytes:
        n = self.u64(f"the length of {what}")
        start = self.take(n, what)
        return bytes(self.buf[start:start + n])

    def count(self, what: str, least_bytes: int) -> int:
        """A u64 count of items of at least `least_bytes` each, refused when they cannot fit."""
        n = self.u64(f"the count of {what}")
        if n * least_bytes > self.size - self.at:
            self.fail(f"{n} {what} claimed, but only {self.size - self.at} bytes remain")
        return n

    def items(self, key: str, least_bytes: int, most: int) -> int:
        """An array's element count (`count`), refused past `most`."""
        n = self.count(f"elements of {key}", least_bytes)
        if n > most:
            raise UnsupportedGGUF(f"GGUF metadata {key} holds {n:,} values, more than specrt "
                                  f"reads for such a key ({most:,}): reading them would take "
                                  "minutes and gigabytes; re-create the GGUF without it")
        return n

    def value(self, kind: int, key: str, most: int, depth: int = 0) -> None:
        """Skip the value of metadata `key` (as `shown` quotes it), an array of at most `most`
        elements (nested arrays too)."""
        if kind in _FIXED:
            self.take(_FIXED[kind], f"the value of {key}")
        elif kind == _STRING and depth == 0:
            text = self.string(f"the string value of {key}")
            try:            # else the readers fail on it later, blaming the tokenizer's metadata
                text.decode("utf-8")
            except UnicodeDecodeError as e:
                raise UnsupportedGGUF(f"GGUF metadata {key} is not UTF-8 text (byte {e.start}: "
                                      f"{e.reason}); {REMAKE}") from None
        elif kind == _STRING:       # an array's: the tokenizer's checks name the entry
            self.string(f"the string value of {key}")
        elif kind == _ARRAY and depth < _MAX_DEPTH:
            item = self.u32(f"the element type of {key}")
            if item in _FIXED:
                n = self.items(key, _FIXED[item], most)
                self.take(n * _FIXED[item], f"the elements of {key}")
            elif item in (_STRING, _ARRAY):
                for _ in range(self.items(key, 8 if item == _STRING else 12, most)):
                    self.value(item, key, most, depth + 1)
            else:
                self.fail(f"metadata {key} is an array of unknown value type {item}")
        elif kind == _ARRAY:
            raise UnsupportedGGUF(f"GGUF metadata {key} nests arrays more than {_MAX_DEPTH} "
                                  "levels deep, which specrt does not read")
        else:
            self.fail(f"metadata {key} has unknown value type {kind}")


def check_header(path: Path) -> None:
    """UnsupportedGGUF if the header of the GGUF at `path` (a regular file that starts with
    b"GGUF") states more than the file holds, repeats a metadata key, names a value type GGUF
    does not define, nests arrays past _MAX_DEPTH, states more keys or array values than a
    model needs (_MAX_KEYS, _MAX_ITEMS), holds a string value that is not UTF-8, or is
    big-endian."""
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        if size < 24:
            raise UnsupportedGGUF(f"GGUF header: the file is {size} bytes, shorter than a "
                                  f"header; {REMAKE}")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            walk = _Walk(buf, size)
            walk.take(4, "the magic")
            version = walk.u32("the version")
            if version & 0xFFFF == 0 and version:
                raise UnsupportedGGUF("big-endian GGUF files are not supported: re-create it "
                                      "little-endian (convert_hf_to_gguf.py without --bigendian)")
            if version not in (2, 3):
                return                      # the reader names the versions it reads
            tensors = walk.u64("the tensor count")
            keys, seen = walk.count("metadata entries", 8 + 4 + 1), set()
            if keys > _MAX_KEYS:
                raise UnsupportedGGUF(f"the GGUF states {keys:,} metadata keys, more than "
                                      f"specrt reads ({_MAX_KEYS:,}; a model has a few dozen); "
                                      "re-create the GGUF without the extra keys")
            for _ in range(keys):
                key = walk.string("a metadata key")
                name = shown(key)
                if key in seen:
                    walk.fail(f"metadata key {name} appears twice")
                seen.add(key)
                walk.value(walk.u32(f"the value type of {name}"), name,
                           _MAX_TOKENIZER_ITEMS if key.startswith(b"tokenizer.") else _MAX_ITEMS)
            if tensors * (8 + 4 + 4 + 8) > size - walk.at:
                walk.fail(f"{tensors} tensors claimed, but only {size - walk.at} bytes remain")
            for _ in range(tensors):
                name = shown(walk.string("a tensor name"))
                n_dims = walk.u32(f"the dimension count of tensor {name}")
                walk.take(8 * n_dims, f"the dimensions of tensor {name}")
                walk.take(4 + 8, f"the type and data offset of tensor {name}")
