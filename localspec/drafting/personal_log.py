"""The personal store's file: a crash-safe append-only log of token records, scanned and repaired.

File: ``<data dir>/personal/<fingerprint[:16]>.tokens`` (the data dir is
``$LOCALSPEC_DATA_DIR``, else ``$XDG_DATA_HOME/localspec``, else
``~/.local/share/localspec``). All integers little-endian::

    magic    8 bytes  b"LSPHIST\\0"
    version  uint32   FORMAT_VERSION
    fp_len   uint32   bytes of the fingerprint that follows
    fp       ascii    the tokenizer fingerprint (gguf_info.tokenizer_fingerprint)
    records  n uint32 | crc32 uint32 (of n's 4 bytes, then the tokens) | tokens int32[n]

Why an append-only log rather than rewriting the file: two runs saving at once
would each rewrite the whole file and the last would silently drop the
other's reply; an append costs the reply's bytes, not the store's. Appends
(and the occasional compaction or repair) hold an exclusive ``flock`` on a
sidecar ``.lock`` file, which is never replaced, so every process locks the
same thing. Readers take no lock: a record still being written, or one torn
by a crash, is shorter than its length says and reads as the end of the
file; the next writer (holding the lock, so no live writer is mid-record)
truncates it away. The size stays bounded: when the file holds more than
``capacity`` by a quarter, it is compacted to the most recent
``capacity`` (temp file, fsync, ``os.replace``).

Damage never costs a good record and never stops a run. Each record is
checked on its own (its checksum covers its length and tokens), so a damaged
one is skipped: the scan resumes at the next offset where a whole record
checks out (a false match needs a 32-bit checksum collision). The first process to see damage repairs the file under
the lock: the damaged original is kept as ``NAME.corrupt-<UTC time>``, the
good records are rewritten, and one warning line goes to stderr. A file
whose header is not ours (bad magic, an unknown version, another tokenizer's
fingerprint) is moved aside the same way and a new history started; a 0-byte
file is an empty history. A file written by a newer localspec is left as it
is and nothing is saved that run. Nothing here raises for a bad file: this
is a cache, and it never blocks ``run`` or ``generate``.
"""

from __future__ import annotations

import contextlib
import os
import struct
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from localspec.drafting.suffix_array import fingerprint_difference
from localspec.paths import atomic_write

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: appends rely on O_APPEND alone
    fcntl = None  # type: ignore[assignment]

MAGIC = b"LSPHIST\0"
FORMAT_VERSION = 1
_HEADER = struct.Struct("<8sII")  # magic, version, fingerprint length
_RECORD = struct.Struct("<II")  # token count, crc32
RECORD_HEAD = _RECORD.size  # the bytes before a record's tokens
# Checksummed bytes spent looking for the next whole record after damage
# (each candidate offset costs its claimed record's length). Past it, the
# rest of the file counts as damaged: kept aside, never truncated.
_RESYNC_BUDGET = 64 << 20
_NEWEST_PLAUSIBLE_VERSION = 255  # a larger version field is damage, not a newer localspec


class Unusable(Exception):
    """The file's header is not ours; ``newer``: written by a newer localspec."""

    def __init__(self, why: str, newer: bool = False) -> None:
        super().__init__(why)
        self.why, self.newer = why, newer


@dataclass(frozen=True)
class Scan:
    """The records of a file: ``records`` as (offset of the tokens, count),
    ``damaged`` byte spans skipped, ``end`` where a torn tail starts
    (``len(buf)`` when there is none)."""

    records: list[tuple[int, int]]
    damaged: list[tuple[int, int]]
    end: int

    @property
    def damaged_bytes(self) -> int:
        return sum(stop - start for start, stop in self.damaged)


def record(doc: np.ndarray) -> bytes:
    n = struct.pack("<I", len(doc))
    payload = np.ascontiguousarray(doc, dtype="<i4").tobytes()
    return n + struct.pack("<I", zlib.crc32(payload, zlib.crc32(n))) + payload


def _record_at(buf: bytes, pos: int) -> int | None:
    """The token count of the whole record at ``pos`` when it checks out, else None."""
    if pos + _RECORD.size > len(buf):
        return None
    n, crc = _RECORD.unpack_from(buf, pos)
    stop = pos + _RECORD.size + 4 * n
    if n == 0 or stop > len(buf):
        return None
    view = memoryview(buf)
    return n if zlib.crc32(view[pos + _RECORD.size : stop], zlib.crc32(view[pos : pos + 4])) == crc else None


def _next_record(buf: bytes, pos: int, budget: list[int]) -> int | None:
    """The first offset after ``pos`` where a whole record checks out; None
    when there is none, or when ``budget[0]`` (bytes looked at or
    checksummed) runs out, which sets it to -1. Every byte offset is a
    candidate (inserted bytes shift what follows), but only those whose
    length field fits the file cost a checksum, so garbage is mostly passed
    over in a few vectorised passes."""
    size = len(buf)
    budget[0] -= size - pos
    fitting: list[np.ndarray] = []
    for first in range(pos + 1, pos + 5):  # the four alignments of a 4-byte length field
        count = (size - first - _RECORD.size) // 4 + 1
        if count <= 0:
            continue
        lengths = np.frombuffer(buf, dtype="<u4", count=count, offset=first).astype(np.int64)
        offsets = first + 4 * np.arange(count, dtype=np.int64)
        fits = (lengths > 0) & (offsets + _RECORD.size + 4 * lengths <= size)
        fitting.append(np.stack([offsets[fits], lengths[fits]], axis=1))
    if not fitting:
        return None
    candidates = np.concatenate(fitting)
    for offset, length in candidates[np.argsort(candidates[:, 0], kind="stable")].tolist():
        budget[0] -= 4 * length
        if budget[0] < 0:
            budget[0] = -1
            return None
        if _record_at(buf, offset) is not None:
            return offset
    return None


def scan_records(buf: bytes, start: int) -> Scan:
    """Every record from ``start`` that checks out, skipping damaged ones.

    Where a record does not check out, the scan resumes at the next offset
    where one does; the bytes between are damaged. When none follows, the
    rest is a torn tail if it is shorter than its length field says (an
    append cut short), else damaged too.
    """
    records: list[tuple[int, int]] = []
    damaged: list[tuple[int, int]] = []
    pos, size = start, len(buf)
    budget = [_RESYNC_BUDGET]
    while pos < size:
        n = _record_at(buf, pos)
        if n is not None:
            records.append((pos + _RECORD.size, n))
            pos += _RECORD.size + 4 * n
            continue
        following = _next_record(buf, pos, budget)
        if following is not None:
            damaged.append((pos, following))
            pos = following
            continue
        claimed = _RECORD.unpack_from(buf, pos)[0] if pos + _RECORD.size <= size else None
        torn = claimed is None or pos + _RECORD.size + 4 * claimed > size
        if budget[0] < 0 or not torn:
            damaged.append((pos, size))
            pos = size
        break
    return Scan(records, damaged, pos)


def aside_path(path: Path) -> Path:
    """``NAME.corrupt-<UTC time>``, numbered when that exists already."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    aside, i = path.with_name(f"{path.name}.corrupt-{stamp}"), 2
    while aside.exists():
        aside, i = path.with_name(f"{path.name}.corrupt-{stamp}-{i}"), i + 1
    return aside


@contextlib.contextmanager
def locked(lock_path: Path) -> Iterator[None]:
    """An exclusive lock between processes (flock on a file that is never replaced)."""
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def write_atomically(path: Path, parts: list[bytes]) -> None:
    with atomic_write(path, mode=0o600) as f:
        for part in parts:
            f.write(part)


def header_bytes(fingerprint: str) -> bytes:
    """A new file's header for a store of ``fingerprint``'s tokenizer."""
    fp = fingerprint.encode("ascii")
    return _HEADER.pack(MAGIC, FORMAT_VERSION, len(fp)) + fp


def parse_header(buf: bytes, fingerprint: str) -> int:
    """The offset of the first record of a file whose header says ``fingerprint``; Unusable when the header is
    not ours (another tokenizer's, an unknown or newer format, damage)."""
    if buf[:8] != MAGIC:
        raise Unusable("bad magic")
    if len(buf) < _HEADER.size:
        raise Unusable("header cut short")
    _, version, fp_len = _HEADER.unpack_from(buf)
    if FORMAT_VERSION < version <= _NEWEST_PLAUSIBLE_VERSION:
        raise Unusable(f"format version {version}, this localspec reads {FORMAT_VERSION}", newer=True)
    if version != FORMAT_VERSION:
        raise Unusable(f"unknown format version {version}")
    end = _HEADER.size + fp_len
    if end > len(buf):
        raise Unusable("header cut short")
    try:
        fp = buf[_HEADER.size : end].decode("ascii")
    except UnicodeDecodeError:
        raise Unusable("unreadable fingerprint") from None
    if fp != fingerprint:
        raise Unusable(f"another tokenizer's: fingerprint {fingerprint_difference(fp, fingerprint)}, "
                       "the file's vs this model's")
    return end
