"""The bytes of a GGUF header: metadata, tensor table and data offset, validated, no weights read.

``read_header`` walks the format (documented in ggml's ``docs/gguf.md``) with ``struct``
over an ``mmap`` — or over a seekable stream such as a file on the Hub read by range
requests (``localspec.models.rangefile``), read only as far as the header goes — and
steps over long arrays nobody asked for. What the keys mean is ``gguf_info``'s business.

Why not ``gguf.GGUFReader``: it builds numpy views for every element of every array,
which took 6 s for SmolLM2 (49k tokens) and 25 s for Gemma 3 (262k tokens, scores and
types) on our 2-core dev box, against 0.03 s and 0.1 s here — and a header is read on
every ``plan`` and every model load. The ``gguf`` package still supplies the type tables.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Callable, Union

import gguf
import numpy as np

from localspec.errors import ModelFileError

_VT = gguf.GGUFValueType
_SCALARS: dict[int, struct.Struct] = {
    _VT.UINT8: struct.Struct("<B"), _VT.INT8: struct.Struct("<b"), _VT.UINT16: struct.Struct("<H"),
    _VT.INT16: struct.Struct("<h"), _VT.UINT32: struct.Struct("<I"), _VT.INT32: struct.Struct("<i"),
    _VT.FLOAT32: struct.Struct("<f"), _VT.BOOL: struct.Struct("<?"), _VT.UINT64: struct.Struct("<Q"),
    _VT.INT64: struct.Struct("<q"), _VT.FLOAT64: struct.Struct("<d"),
}
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_SMALL_ARRAY = 1024  # arrays up to this many elements are kept even when not asked for
_STREAM_BLOCK = 1 << 20  # a header read from a stream grows in whole MiB, doubling

HeaderSource = Union[str, "os.PathLike[str]", BinaryIO]
"""Where a header is read from: a GGUF path, or a seekable binary file object (e.g. a file on the
Hub read by HTTP range requests, ``localspec.models.rangefile``) whose ``name`` names it in messages."""


class _Truncated(Exception):
    """The header ends before the structure it describes (internal; becomes ModelFileError)."""


@dataclass(frozen=True)
class SkippedArray:
    """A metadata array that was stepped over rather than decoded: only its length is known."""

    count: int


@dataclass(frozen=True)
class TensorEntry:
    """One row of the tensor table: sizes from its shape and ggml type, no data read."""

    name: str
    n_elements: int
    n_bytes: int
    offset: int  # relative to the start of the tensor data section
    ggml_type: int = -1  # enum ggml_type (gguf.GGMLQuantizationType)


@dataclass(frozen=True)
class GGUFHeader:
    """A validated GGUF header: metadata as stored (arrays not asked for and longer than 1024
    elements are ``SkippedArray``), the tensor table, and where the tensor data starts.

    ``path`` names the file (a stream's ``name``); ``file_size`` is its length in bytes.
    """

    path: Path
    file_size: int
    metadata: dict[str, Any]
    tensors: tuple[TensorEntry, ...]
    data_offset: int


# --- reading the header --------------------------------------------------------------------


class _Parser:
    """Sequential little-endian reader over the header bytes; raises _Truncated past the end.

    ``buf`` holds the file's first bytes. Without ``more`` it is the whole file (an mmap). With
    ``more``, the file is ``total`` bytes long and ``more(end)`` returns a longer prefix of it, at
    least ``end`` bytes, so a stream is read only as far as the header goes.
    """

    def __init__(self, buf: Any, keep: frozenset[str], *, total: int | None = None,
                 more: Callable[[int], bytes] | None = None) -> None:
        self.buf, self.keep, self.pos, self.size = buf, keep, 0, len(buf)
        self.total = self.size if total is None else total
        self._more = more
        self.where = "the file header"

    def _need(self, end: int) -> None:
        """Make bytes ``[0, end)`` available in ``buf``; _Truncated when the file is shorter."""
        if end <= self.size:
            return
        if self._more is not None and end <= self.total:
            self.buf = self._more(end)
            self.size = len(self.buf)
        if end > self.size:
            raise _Truncated(self.where)

    def _scalar(self, s: struct.Struct) -> Any:
        if self.pos + s.size > self.size:
            self._need(self.pos + s.size)
        (value,) = s.unpack_from(self.buf, self.pos)
        self.pos += s.size
        return value

    def _claims(self, n_bytes: int, what: str) -> None:
        """A length read from the header that no file this size could hold: a damaged header (flipped
        bytes), not a short file: a copy cut short still has every length it holds right."""
        if n_bytes > self.total:
            raise ValueError(f"its header is corrupt ({self.where} claims {what} in a {self.total:,}-byte file)")

    def _name(self, limit: int, what: str) -> str:
        """A metadata key or a tensor name: short printable ASCII in any GGUF a writer made. Anything
        else means the reader lost its place: a length before it was damaged."""
        raw = self._bytes()
        if not 0 < len(raw) <= limit or not all(0x20 <= b < 0x7F for b in raw):
            shown_raw = raw[:24].decode("utf-8", errors="replace").encode("unicode_escape").decode("ascii")
            raise ValueError(f"its header is corrupt ({self.where} has {what} of {len(raw):,} bytes that is not "
                             f"a name: {shown_raw!r}{'…' if len(raw) > 24 else ''})")
        return raw.decode("ascii")

    def _bytes(self) -> bytes:
        n = self._scalar(_U64)
        self._claims(n, f"a string of {n:,} bytes")
        if self.pos + n > self.size:
            self._need(self.pos + n)
        value = self.buf[self.pos:self.pos + n]
        self.pos += n
        return value

    def _array(self, key: str) -> Any:
        elem_type, count = self._scalar(_U32), self._scalar(_U64)
        self._claims(count, f"an array of {count:,} items")
        wanted = key in self.keep or count <= _SMALL_ARRAY
        if elem_type == _VT.STRING:
            if key in self.keep:  # token texts stay bytes: llama.cpp compares them bytewise
                return [self._bytes() for _ in range(count)]
            if wanted:
                return [self._bytes().decode("utf-8", errors="replace") for _ in range(count)]
            unpack, pos, buf, size = _U64.unpack_from, self.pos, self.buf, self.size
            for _ in range(count):  # step over each string by its length
                if pos + 8 > size:
                    self._need(pos + 8)
                    buf, size = self.buf, self.size
                n = unpack(buf, pos)[0]
                if n > self.total:
                    self._claims(n, f"a string of {n:,} bytes")
                pos += 8 + n
            if pos > size:
                self._need(pos)
            self.pos = pos
            return SkippedArray(count)
        if elem_type == _VT.ARRAY:
            return [self._array(key) for _ in range(count)]
        if elem_type not in _SCALARS:
            raise ValueError(f"its header is corrupt (unknown metadata value type {elem_type} in key {key!r})")
        item = _SCALARS[elem_type]
        self._claims(count * item.size, f"an array of {count:,} items")
        end = self.pos + count * item.size
        if end > self.size:
            self._need(end)
        value: Any = SkippedArray(count)
        if wanted:
            value = np.frombuffer(self.buf, np.dtype(item.format), count, self.pos).copy()
            value = value if key in self.keep else value.tolist()
        self.pos = end
        return value

    def _value(self, key: str, value_type: int) -> Any:
        if value_type == _VT.STRING:
            return self._bytes().decode("utf-8", errors="replace")
        if value_type == _VT.ARRAY:
            return self._array(key)
        if value_type not in _SCALARS:
            raise ValueError(f"its header is corrupt (unknown metadata value type {value_type} in key {key!r})")
        return self._scalar(_SCALARS[value_type])

    def parse(self, path: Path) -> GGUFHeader:
        self.pos = 4  # past the magic, checked by the caller
        version = self._scalar(_U32)
        if version & 0xFFFF == 0 and version:
            raise ValueError("it is a big-endian GGUF, which llama.cpp on this machine cannot load")
        if version not in (2, 3):
            raise ValueError(f"it uses GGUF version {version}; only versions 2 and 3 are supported")
        n_tensors, n_kv = self._scalar(_U64), self._scalar(_U64)
        if n_tensors > self.total or n_kv > self.total:
            raise ValueError(f"its header is corrupt (it claims {n_tensors:,} tensors and {n_kv:,} "
                             f"metadata entries in a {self.total:,}-byte file)")
        metadata: dict[str, Any] = {}
        for i in range(n_kv):
            self.where = f"metadata entry {i + 1} of {n_kv}"
            key = self._name(_MAX_KEY, "a metadata key")
            self.where = f"metadata key {key!r}"
            metadata[key] = self._value(key, self._scalar(_U32))
        raw: list[tuple[str, list[int], int, int]] = []
        for i in range(n_tensors):
            self.where = f"tensor description {i + 1} of {n_tensors}"
            name = self._name(_MAX_TENSOR_NAME, "a tensor name")
            n_dims = self._scalar(_U32)
            if n_dims > 4:  # GGML_MAX_DIMS
                raise ValueError(f"its header is corrupt (tensor {name!r} claims {n_dims} dimensions)")
            dims = [self._scalar(_U64) for _ in range(n_dims)]
            raw.append((name, dims, self._scalar(_U32), self._scalar(_U64)))
        alignment = int(metadata.get("general.alignment", gguf.GGUF_DEFAULT_ALIGNMENT)) or 1
        data_offset = -(-self.pos // alignment) * alignment
        return GGUFHeader(path, self.total, metadata, tuple(_tensor(*r) for r in raw), data_offset)


def _layout_fault(header: GGUFHeader) -> str:
    """Why the tensor table cannot be one a GGUF writer made ("" when it can): writers lay the tensors
    out back to back from offset 0, each padded to the alignment. Told apart from a truncated file,
    whose table is sound but whose data stops early."""
    alignment = int(header.metadata.get("general.alignment", gguf.GGUF_DEFAULT_ALIGNMENT)) or 1
    end = 0
    for t in sorted(header.tensors, key=lambda t: t.offset):
        if t.offset % alignment:
            return f"tensor {t.name!r} starts at offset {t.offset:,}, not a multiple of the alignment {alignment}"
        if not end <= t.offset < end + alignment:
            return f"tensor {t.name!r} starts at offset {t.offset:,} where the tensor before it ends at {end:,}"
        end = t.offset + t.n_bytes
    return ""


_MAX_KEY = 256  # no GGUF key comes near it (llama.cpp's longest are under 64 bytes)
_MAX_TENSOR_NAME = 64  # GGML_MAX_NAME, counting its terminating NUL: names are shorter still


def _tensor(name: str, dims: list[int], ggml_type: int, offset: int) -> TensorEntry:
    n_elements = int(np.prod(dims, dtype=np.int64)) if dims else 1
    try:
        block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(ggml_type)]
    except (ValueError, KeyError):
        raise ValueError(f"tensor {name!r} has ggml type {ggml_type}, which the installed gguf package "
                         "does not know (upgrade it with `pip install -U gguf`)") from None
    return TensorEntry(name, n_elements, n_elements // block * type_size, offset, ggml_type)


def _describe_non_gguf(head: bytes) -> tuple[str, str]:
    """What a file that lacks the GGUF magic looks like, and what to do about it."""
    again = "download the .gguf file again"
    convert = "convert it with llama.cpp's convert_hf_to_gguf.py or download a .gguf build"
    if head.startswith(b"version https://git-lfs"):
        return "it is a Git LFS pointer, not the model itself", "fetch the real file with `git lfs pull`"
    if head.lstrip().lower().startswith((b"<!doctype html", b"<html")):
        return "it is an HTML page (an error or login page saved in place of the model)", again
    if head.startswith(b"PK\x03\x04"):
        return "it is a ZIP archive (a PyTorch checkpoint?)", convert
    if len(head) > 8 and head[4:8] == b"\0\0\0\0" and head[8:9] == b"{":
        return "it looks like a safetensors file", convert
    text = head[:40].decode("utf-8", errors="replace")
    if all(c.isprintable() or c in "\r\n\t" for c in text):
        first_line = text.strip().splitlines()[0] if text.strip() else text
        return f"it is a text file starting with {first_line!r}", f"pass a .gguf model file or {again}"
    return f"it starts with bytes {head[:4].hex(' ')} instead of the magic 'GGUF'", again


_AGAIN = "the download or copy was cut short — delete it and fetch it again"


def read_header(source: HeaderSource, keep: frozenset[str] = frozenset()) -> GGUFHeader:
    """Validate ``source`` as a complete GGUF file and parse its header; ModelFileError otherwise.

    ``keep`` names metadata arrays to return in full whatever their length: string arrays
    as a list of ``bytes``, numeric ones as a numpy array. Other arrays up to 1024 elements
    come back as lists, longer ones as ``SkippedArray``. The error is one line naming the
    file, what is wrong with it (missing, a directory, not GGUF — and what it is instead —,
    truncated, corrupt) and what to do.
    """
    if isinstance(source, (str, os.PathLike)):
        return _read_file_header(Path(source).expanduser(), keep)
    return _read_stream_header(source, keep)


def _read_file_header(path: Path, keep: frozenset[str]) -> GGUFHeader:
    """A header from a file on disk, parsed over an mmap."""
    if not path.exists():
        raise ModelFileError(f"model file not found: {path}; check the path, "
                             "or download a registered model with `localspec pull NAME`")
    if path.is_dir():
        inside = sorted(p.name for p in path.glob("*.gguf"))[:3]
        hint = f" such as {', '.join(inside)}" if inside else ""
        raise ModelFileError(f"model path {path} is a directory; pass a .gguf file inside it{hint}")
    try:
        with path.open("rb") as f:
            size = path.stat().st_size
            _check_magic(str(path), size, f.read(64))
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                header = _parse_checked(path, _Parser(buf, keep))
    except OSError as err:
        raise ModelFileError(f"cannot read model file {path}: {err.strerror or err}; "
                             "check that it is a readable file") from None
    return header


def _read_stream_header(f: BinaryIO, keep: frozenset[str]) -> GGUFHeader:
    """A header from a seekable file object, read only as far as the header goes."""
    name = str(getattr(f, "name", "<stream>"))
    size = f.seek(0, os.SEEK_END)
    more = _prefix_reader(f, size)
    buf = more(min(size, 64))
    _check_magic(name, size, buf[:64])
    return _parse_checked(Path(name), _Parser(buf, keep, total=size, more=more))


def _prefix_reader(f: BinaryIO, total: int) -> Callable[[int], bytes]:
    """``more`` for _Parser over ``f``: the first ``end`` or more bytes, read once each.

    The prefix grows to at least twice its length in whole MiB, so a header of n bytes costs
    about log2(n / 1 MiB) reads and copies O(n) bytes in all.
    """
    chunks: list[bytes] = []
    have = 0

    def more(end: int) -> bytes:
        nonlocal have
        want = min(total, -(-max(end, 2 * have, _STREAM_BLOCK) // _STREAM_BLOCK) * _STREAM_BLOCK)
        f.seek(have)
        while have < want:
            chunk = f.read(want - have)
            if not chunk:
                break  # the file is shorter than it said: the parser reports it truncated
            chunks.append(chunk)
            have += len(chunk)
        return b"".join(chunks)

    return more


def _check_magic(name: str, size: int, head: bytes) -> None:
    if size == 0:
        raise ModelFileError(f"model file {name} is empty (0 bytes); {_AGAIN}")
    if head[:4] != b"GGUF":
        what, fix = _describe_non_gguf(head)
        raise ModelFileError(f"{name} is not a GGUF model file: {what}; {fix}")


def _parse_checked(path: Path, parser: _Parser) -> GGUFHeader:
    """Parse the header and check the file holds every tensor it describes."""
    name = str(path)
    try:
        header = parser.parse(path)
    except _Truncated as cut:
        raise ModelFileError(f"model file {name} is truncated: its GGUF header stops at byte {parser.total} "
                             f"inside {cut}; {_AGAIN}") from None
    except ValueError as err:
        raise ModelFileError(f"cannot read model file {name}: {err}; download it again or "
                             "use another build of the model") from None
    size = parser.total
    needed = header.data_offset + max((t.offset + t.n_bytes for t in header.tensors), default=0)
    if needed > size and (damaged := _layout_fault(header)):
        raise ModelFileError(f"cannot read model file {name}: its tensor table is corrupt ({damaged}); the file is "
                             "damaged — delete it and fetch it again")
    if needed > size:
        raise ModelFileError(f"model file {name} is truncated: it has {size:,} bytes but its "
                             f"{len(header.tensors)} tensors need {needed:,} ({100 * size / needed:.0f}% "
                             f"present); {_AGAIN}")
    return header


def array_length(value: Any) -> int:
    """The number of elements of a metadata array, decoded or skipped."""
    return value.count if isinstance(value, SkippedArray) else len(value)
