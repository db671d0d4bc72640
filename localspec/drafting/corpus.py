"""Reading a user's corpus for ``localspec index PATH...``.

Paths may be files, folders (walked recursively, hidden entries and symlinked
folders skipped), or glob patterns (``**`` allowed). Only UTF-8 text is kept:
a file with a NUL byte in its first block is binary, a file whose first block
does not decode is undecodable; both are skipped and counted. Large files are
streamed in chunks cut at line ends, so no file is ever read whole.
"""

from __future__ import annotations

import codecs
import glob
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np

from localspec.drafting.suffix_array import write_store
from localspec.errors import InvalidOptionError, StoreError, shown

CHUNK_BYTES = 1 << 20  # what is decoded (and tokenized) at once


@dataclass
class CorpusReport:
    """What the walk found. ``lossy``: text files whose later chunks held
    invalid UTF-8 (decoded with U+FFFD, since only the first block is checked
    before streaming)."""

    files: int = 0
    bytes: int = 0
    binary: list[str] = field(default_factory=list)
    undecodable: list[str] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)
    lossy: list[str] = field(default_factory=list)

    @property
    def skipped(self) -> int:
        return len(self.binary) + len(self.undecodable) + len(self.unreadable)


@dataclass(frozen=True)
class Document:
    """One text file. ``chunks()`` re-opens it and yields its text in pieces
    that end at line ends (or at ``chunk_bytes`` when a line is longer)."""

    path: str
    size: int
    chunk_bytes: int = CHUNK_BYTES
    report: CorpusReport | None = field(default=None, repr=False, compare=False)

    def chunks(self) -> Iterator[str]:
        decoder = codecs.getincrementaldecoder("utf-8-sig")(errors="replace")
        carry = b""
        lossy = False
        with open(self.path, "rb") as f:
            while True:
                block = f.read(self.chunk_bytes)
                final = not block
                data = carry + block
                cut = len(data) if final else data.rfind(b"\n") + 1
                if cut == 0 and len(data) >= self.chunk_bytes:
                    cut = len(data)  # one huge line: cut anywhere, the decoder keeps split characters
                piece, carry = data[:cut], data[cut:]
                text = decoder.decode(piece, final=final)
                # U+FFFD that the file did not spell out itself is a replacement.
                lossy = lossy or text.count("\ufffd") > piece.count(b"\xef\xbf\xbd")
                if text:
                    yield text
                if final:
                    break
        if lossy and self.report is not None and self.path not in self.report.lossy:
            self.report.lossy.append(self.path)


def _expand(paths: Sequence[str]) -> Iterator[str]:
    """Every file named by ``paths``, in a stable order; a path that names
    nothing raises InvalidOptionError before any work is done."""
    resolved: list[list[str]] = []
    for p in paths:
        if os.path.exists(p):
            resolved.append([p])
        elif any(c in p for c in "*?[") and (hits := sorted(glob.glob(p, recursive=True))):
            resolved.append(hits)
        else:
            raise InvalidOptionError(f"no such file or folder: {shown(p, quote='')}")
    for hits in resolved:
        for hit in hits:
            if os.path.isdir(hit):
                for root, dirs, files in os.walk(hit):
                    dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                    yield from (os.path.join(root, f) for f in sorted(files) if not f.startswith("."))
            else:
                yield hit


def iter_corpus(
    paths: Sequence[str], report: CorpusReport | None = None, *, chunk_bytes: int = CHUNK_BYTES
) -> Iterator[Document]:
    """Yield each text file under ``paths`` once, counting what is skipped in
    ``report``. Only the first block of a file is read here."""
    report = report if report is not None else CorpusReport()
    seen: set[str] = set()
    for path in _expand(paths):
        real = os.path.realpath(path)
        if real in seen or not os.path.isfile(real):
            continue
        seen.add(real)
        try:
            with open(path, "rb") as f:
                head = f.read(chunk_bytes)
            size = os.path.getsize(path)
        except OSError:
            report.unreadable.append(path)
            continue
        if b"\0" in head:
            report.binary.append(path)
            continue
        try:
            # A block may end inside a character; only a full-file read must be final.
            codecs.getincrementaldecoder("utf-8-sig")().decode(head, final=len(head) == size)
        except UnicodeDecodeError:
            report.undecodable.append(path)
            continue
        report.files += 1
        report.bytes += size
        yield Document(path, size, chunk_bytes, report)


@dataclass
class BuildReport:
    corpus: CorpusReport
    documents: int
    tokens: int
    seconds: float
    path: str


Progress = Callable[[str, int, int], None]
"""``progress(stage, done, total)``: ``("tokenizing", bytes read, bytes of all files)`` after each chunk,
then ``("sorting", tokens, tokens)`` once, when every file is read and the suffix array is being built."""


def build_store_from_corpus(
    paths: Sequence[str],
    tokenize: Callable[[str], Sequence[int]],
    fingerprint: str,
    out_path: str | os.PathLike[str],
    *,
    chunk_bytes: int = CHUNK_BYTES,
    progress: Progress | None = None,
) -> BuildReport:
    """Tokenize every text file under ``paths`` and write a store to ``out_path``.

    ``tokenize`` must not add special tokens (it is called once per chunk).
    Tokens are kept as numpy int32 chunks, never as one Python list. Raises
    StoreError when no text was found (nothing would be written). With ``progress``,
    the files are walked once more first, to know their total size.
    """
    started = time.perf_counter()
    report = CorpusReport()
    counts = {"documents": 0, "bytes": 0, "tokens": 0}
    total = sum(doc.size for doc in iter_corpus(paths, chunk_bytes=chunk_bytes)) if progress else 0

    def docs() -> Iterator[np.ndarray]:
        for doc in iter_corpus(paths, report, chunk_bytes=chunk_bytes):
            parts = []
            for text in doc.chunks():
                parts.append(np.asarray(tokenize(text), dtype=np.int32))
                if progress is not None:
                    counts["bytes"] += len(text.encode("utf-8", "surrogatepass"))
                    progress("tokenizing", min(counts["bytes"], total), total)
            tokens = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)
            if len(tokens):  # write_store drops empty documents too
                counts["documents"] += 1
                counts["tokens"] += len(tokens)
                yield tokens
        if progress is not None:  # every file is read: write_store sorts the suffixes next
            progress("sorting", counts["tokens"], counts["tokens"])

    # Peek first so an empty corpus fails before a temp file is made.
    it = docs()
    first = next(it, None)
    if first is None:
        raise StoreError(f"no text files to index under {', '.join(paths)} ({report.skipped} skipped)")

    def chained() -> Iterator[np.ndarray]:
        yield first
        yield from it

    n = write_store(Path(out_path), chained(), fingerprint)
    return BuildReport(report, counts["documents"], n, time.perf_counter() - started, str(out_path))
