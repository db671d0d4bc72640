"""The REST datastore (He et al. 2024): a token corpus with its suffix array.

Drafting retrieves: find the longest suffix of the context that occurs in the
corpus (binary search over the suffix array), then propose what followed its
occurrences. The store is one file, memory-mapped, so opening a 10M-token
store costs no reading.

File layout (all integers little-endian)::

    magic      8 bytes   b"LSPSTORE"
    version    uint32    FORMAT_VERSION
    header_len uint32    bytes of the JSON header that follows (space padded
                         so the arrays start 64-byte aligned)
    crc32      uint32    of the header bytes, padding included
    header     JSON      fingerprint, counts, array offsets and crc32s, file size
    arrays     tokens int32[n_tokens], suffixes int32|int64[n_suffixes],
               doc_starts int64[n_docs]

Each document is followed by a separator ``-(doc_index + 1)`` in the token
array. No context contains a negative token, so no match spans a separator,
and continuations stop at one. Separators are left out of the suffix array.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
import zlib
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from localspec.drafting.lookup import Candidate, Lookup, cut_at_separator, rank_continuations
from localspec.errors import StoreError
from localspec.paths import atomic_write

MAGIC = b"LSPSTORE"
FORMAT_VERSION = 1
_PRELUDE = struct.Struct("<8sIII")  # magic, version, header_len, crc32
_ALIGN = 64
_SAMPLE = 32  # stride of the sampled pair keys that narrow each binary search


def build_suffix_array(tokens: np.ndarray) -> np.ndarray:
    """Positions of all suffixes of ``tokens`` in lexicographic order.

    A suffix that is a prefix of another sorts first. Prefix doubling: after
    the round with step h, suffixes are sorted by their first 2h tokens; each
    round re-sorts only the groups still tied, by (group, rank of the suffix
    h further on), so data with few long repeats finishes in a few cheap
    rounds. Returns int32 positions when they fit, else int64.
    """
    tokens = np.asarray(tokens)
    n = len(tokens)
    # Positions and ranks in int32 while they fit (half the memory of int64 on a big corpus: 10 MB of
    # text is ~5M tokens); only the sort key of the suffixes still tied needs int64.
    out_dtype = np.int32 if n < 2**31 - 1 else np.int64
    if n == 0:
        return np.zeros(0, dtype=out_dtype)
    sa = np.argsort(tokens).astype(out_dtype)  # ties are re-sorted later; no need for stability
    # rank[i]: the slot in sa where the group of suffix i starts, so ranks
    # compare like the prefixes sorted so far.
    sorted_tokens = tokens[sa]
    starts = np.flatnonzero(np.r_[True, sorted_tokens[1:] != sorted_tokens[:-1]]).astype(out_dtype)
    del sorted_tokens
    rank = np.empty(n + 1, dtype=out_dtype)
    rank[n] = -1  # past the end: shorter suffixes sort first
    rank[sa] = np.repeat(starts, np.diff(np.r_[starts, n]))
    todo = _tied_slots(starts, n)
    del starts
    h = 1
    while len(todo):
        at = sa[todo]
        # One int64 key sorts by (group, rank h further on): group < n and -1 <= after < n, so
        # equal keys are equal pairs and the sorted keys alone show where the new groups start.
        key = rank[at].astype(np.int64) * (n + 1)
        key += rank[np.minimum(at + h, n)]
        order = np.argsort(key)
        moved = at[order]
        del at
        sa[todo] = moved
        key = key[order]
        del order
        first = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
        del key
        new_rank = todo[first]  # slot where each new group starts
        sizes = np.diff(np.r_[first, len(todo)])
        rank[moved] = np.repeat(new_rank, sizes)
        todo = todo[np.repeat(sizes > 1, sizes)]
        h *= 2
    return sa


def _tied_slots(starts: np.ndarray, n: int) -> np.ndarray:
    """Slots of sa that belong to groups of more than one suffix."""
    sizes = np.diff(np.r_[starts, n])
    return np.flatnonzero(np.repeat(sizes > 1, sizes)).astype(starts.dtype)


def write_store(path: str | os.PathLike[str], docs: Iterable[np.ndarray], fingerprint: str) -> int:
    """Write the store for ``docs`` (token arrays) to ``path`` atomically.

    The file appears complete or not at all (temp file in the same folder,
    fsync, rename). Empty documents are dropped. Returns the number of
    document tokens written (separators not included).
    """
    chunks: list[np.ndarray] = []
    doc_starts: list[int] = []
    n = 0
    for doc in docs:
        arr = np.asarray(doc)
        if not len(arr):
            continue
        if arr.dtype.kind not in "iu" or arr.min() < 0 or arr.max() >= 2**31:
            raise ValueError("token ids must be integers in [0, 2**31)")
        doc_starts.append(n)
        chunks.append(arr.astype(np.int32, copy=False))
        chunks.append(np.array([-len(doc_starts)], dtype=np.int32))
        n += len(arr) + 1
    tokens = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int32)
    sa = build_suffix_array(tokens)
    sa = sa[tokens[sa] >= 0]  # separators never start a match
    starts = np.asarray(doc_starts, dtype=np.int64)

    arrays = {"tokens": tokens, "suffixes": sa, "doc_starts": starts}
    header = {
        "fingerprint": fingerprint,
        "n_tokens": int(len(tokens)),
        "n_suffixes": int(len(sa)),
        "n_docs": int(len(starts)),
        "suffix_dtype": sa.dtype.str,
        # Checked by Store.verify(), not on open: reading 10M tokens is not free.
        "crc32": {name: zlib.crc32(np.ascontiguousarray(arr).data) for name, arr in arrays.items()},
    }
    # The header holds the offsets, and its length decides where the arrays
    # start: grow the reserved space until the header fits in it.
    data_start = _ALIGN
    while True:
        offsets, pos = {}, data_start
        for name, arr in arrays.items():
            offsets[name] = pos
            pos = _round_up(pos + arr.nbytes, _ALIGN)
        blob = json.dumps({**header, "offsets": offsets, "file_size": pos}).encode()
        if _PRELUDE.size + len(blob) <= data_start:
            break
        data_start = _round_up(_PRELUDE.size + len(blob), _ALIGN)
    size = pos
    blob += b" " * (data_start - _PRELUDE.size - len(blob))
    prelude = _PRELUDE.pack(MAGIC, FORMAT_VERSION, len(blob), zlib.crc32(blob))

    with atomic_write(path) as f:
        f.write(prelude + blob)
        for name, arr in arrays.items():
            f.seek(offsets[name])
            f.write(np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).data)
        f.truncate(size)
    return int(len(tokens) - len(starts))


def _round_up(x: int, align: int) -> int:
    return -(-x // align) * align


def fingerprint_difference(found: str, expected: str) -> str:
    """Two fingerprints as a reader can tell them apart: from the first
    character where they differ (``"abc1234… vs 9f0e1d2…"``, prefixed by
    ``"from character N: "`` when they share a start)."""
    i = next((i for i, (a, b) in enumerate(zip(found, expected)) if a != b), min(len(found), len(expected)))

    def part(fp: str) -> str:
        piece = fp[i : i + 8]
        return ("…" if i else "") + (piece or "(end)") + ("…" if len(fp) > i + 8 else "")

    return (f"from character {i + 1}: " if i else "") + f"{part(found)} vs {part(expected)}"


def _rebuild(path: Path) -> str:
    """The fix for a store of ours that cannot be used: build it again onto its own path."""
    return f"rebuild it with `localspec index PATH... --model MODEL -o {path}`"


BUILD = "build one from text files with `localspec index PATH... --model MODEL -o NOTES.lsstore`"
"""The fix for a path that holds no store at all (a model, a folder): a new file, never this path."""


def not_a_store(path: Path, head: bytes = b"") -> StoreError:
    """A path that is not a store, said for what it is (a folder, a GGUF model): the fix writes a new
    store elsewhere, never over it."""
    if path.is_dir():
        return StoreError(f"{path} is a folder, not a store; build a store from its text files with "
                          f"`localspec index {path} --model MODEL -o NOTES.lsstore`")
    what = "a GGUF model, not a localspec store" if head[:4] == b"GGUF" else "not a localspec store"
    return StoreError(f"{path} is {what} (bad magic); {BUILD}")


def open_store(path: str | os.PathLike[str], expected_fingerprint: str | None, *,
               n_vocab: int | None = None) -> Store:
    """Memory-map the store at ``path`` after checking it is whole and ours.

    Raises StoreError (one line saying what to do) for a missing file, a bad
    magic, an unknown version, a header that fails its checksum, sizes that do
    not match the file, arrays that point outside each other or hold token ids
    of ``n_vocab`` or more (see ``check_arrays``), or a store built for
    another tokenizer than ``expected_fingerprint`` (None: any tokenizer).
    Array contents are checked against their checksums only by
    ``Store.verify``.
    """
    path = Path(path)
    if path.is_dir():
        raise not_a_store(path)
    try:
        f = open(path, "rb")
    except OSError as err:
        raise StoreError(f"cannot open store {path}: {err.strerror or err}") from None
    with f:
        file_size = os.fstat(f.fileno()).st_size
        raw = f.read(_PRELUDE.size)
        if len(raw) < _PRELUDE.size or raw[:8] != MAGIC:
            raise not_a_store(path, raw)
        _, version, header_len, crc = _PRELUDE.unpack(raw)
        if version != FORMAT_VERSION:
            raise StoreError(
                f"store {path} has format version {version}, this localspec reads {FORMAT_VERSION}; {_rebuild(path)}"
            )
        blob = f.read(header_len) if header_len <= file_size else b""
        if len(blob) != header_len or zlib.crc32(blob) != crc:
            raise _corrupt(path, "its header fails its checksum or is cut short")
        try:
            header = json.loads(blob)
            fp, offsets, checksums = header["fingerprint"], header["offsets"], header["crc32"]
            suffix_dtype = np.dtype(header["suffix_dtype"])
            layout = {
                "tokens": (np.dtype("<i4"), int(header["n_tokens"])),
                "suffixes": (suffix_dtype, int(header["n_suffixes"])),
                "doc_starts": (np.dtype("<i8"), int(header["n_docs"])),
            }
            if suffix_dtype.str not in ("<i4", "<i8") or not isinstance(offsets, dict):
                raise ValueError("unknown suffix dtype or offsets")
        except (ValueError, KeyError, TypeError) as err:
            raise _corrupt(path, f"unreadable header: {err}") from None
        if header.get("file_size") != file_size:
            raise _corrupt(path, f"{file_size} bytes, the header says {header.get('file_size')}")
        if expected_fingerprint is not None and fp != expected_fingerprint:
            raise StoreError(
                f"store {path} was built for another tokenizer (fingerprint "
                f"{fingerprint_difference(str(fp), expected_fingerprint)}, the store's vs the model's); "
                f"{_rebuild(path)}"
            )
        for name, (dtype, count) in layout.items():
            off = offsets.get(name, -1)
            if not (isinstance(off, int) and 0 <= off and off % dtype.itemsize == 0 and count >= 0
                    and off + count * dtype.itemsize <= file_size):  # fmt: skip
                raise _corrupt(path, f"array {name} lies outside the file")
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)  # never empty: the header is in it
    arrays = {
        name: np.frombuffer(mm, dtype=dtype, count=count, offset=offsets[name]) if count else np.zeros(0, dtype)
        for name, (dtype, count) in layout.items()
    }
    store = Store(path, fp, arrays["tokens"], arrays["suffixes"], arrays["doc_starts"], mm)
    store.checksums = dict(checksums) if isinstance(checksums, dict) else {}
    try:
        check_arrays(store.tokens, store.suffixes, store.doc_starts, n_vocab)
    except ValueError as err:
        store.close()
        raise _corrupt(path, str(err)) from None
    return store


def check_arrays(tokens: np.ndarray, suffixes: np.ndarray, doc_starts: np.ndarray, n_vocab: int | None = None
                 ) -> None:
    """Check what lookups rely on, in a few vectorised passes (no checksums):
    counts that agree, document starts in order with a separator before each
    next one, every suffix position inside the tokens (and not on the final
    separator, so a position's next token exists), and every token a
    separator or an id below ``n_vocab``. Raises ValueError saying what is
    wrong. A few milliseconds for two million tokens once the file is in the
    page cache."""
    n, n_docs = len(tokens), len(doc_starts)
    if len(suffixes) != n - n_docs:
        raise ValueError(f"{len(suffixes):,} suffixes for {n:,} tokens in {n_docs:,} documents")
    if n == 0:
        return
    if n_docs == 0 or doc_starts[0] != 0 or (n_docs > 1 and np.diff(doc_starts).min() < 2) or doc_starts[-1] >= n:
        raise ValueError("its document starts are out of order or outside the tokens")
    # Document i (from 0) ends with the separator -(i + 1) just before document i + 1 starts.
    ends = np.append(doc_starts[1:] - 1, n - 1)
    if not np.array_equal(tokens[ends], -np.arange(1, n_docs + 1, dtype=np.int64)):
        raise ValueError("its document separators are missing or out of place")
    lowest, highest = int(tokens.min()), int(tokens.max())
    if lowest < -n_docs:
        raise ValueError(f"token {lowest} is neither an id nor a separator")
    if n_vocab is not None and highest >= n_vocab:
        raise ValueError(f"token id {highest} is beyond the model's vocabulary of {n_vocab:,}")
    if int(suffixes.min()) < 0 or int(suffixes.max()) > n - 2:
        raise ValueError("its suffix array points outside the tokens")


def _corrupt(path: Path, why: str) -> StoreError:
    return StoreError(f"store {path} is corrupt ({why}); {_rebuild(path)}")


class Store:
    """An open datastore: read-only token, suffix and document arrays.

    Queries look at the last ``max_len`` tokens of the context only.
    Up to ``python_rows`` occurrences are ranked in plain Python, more with
    numpy (the same ranking: score, then the latest position).
    ``max_occurrences`` bounds the work per query: when a match occurs more
    often, continuations are gathered from an evenly spaced sample of its
    occurrences (the suffix-array range is sorted by continuation, so the
    sample keeps the proportions).
    """

    def __init__(
        self,
        path: Path,
        fingerprint: str,
        tokens: np.ndarray,
        suffixes: np.ndarray,
        doc_starts: np.ndarray,
        mm: mmap.mmap | None = None,
        *,
        max_len: int = 16,
        max_occurrences: int = 1024,
        python_rows: int = 48,
    ) -> None:
        self.path, self.fingerprint = path, fingerprint
        self.tokens, self.suffixes, self.doc_starts = tokens, suffixes, doc_starts
        self.max_len, self.max_occurrences, self.python_rows = max_len, max_occurrences, python_rows
        self._mm = mm
        self._keys: np.ndarray | None = None
        self.checksums: dict[str, int] = {}  # crc32 per array, from the header

    def verify(self, n_vocab: int | None = None) -> None:
        """The full check: ``check_arrays`` (ids below ``n_vocab`` when given),
        then every array against its checksum (reads the whole file). Raises
        StoreError naming what is damaged."""
        try:
            check_arrays(self.tokens, self.suffixes, self.doc_starts, n_vocab)
        except ValueError as err:
            raise _corrupt(self.path, str(err)) from None
        arrays = {"tokens": self.tokens, "suffixes": self.suffixes, "doc_starts": self.doc_starts}
        for name in arrays:
            if name not in self.checksums:
                raise _corrupt(self.path, f"its header has no checksum for {name}")
        for name, arr in arrays.items():
            if zlib.crc32(arr.data) != self.checksums[name]:
                raise _corrupt(self.path, f"its {name} fail their checksum")

    def __len__(self) -> int:
        return len(self.tokens)

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Drop the arrays and unmap the file (left to the GC if views survive)."""
        self.tokens = self.suffixes = self.doc_starts = np.zeros(0, np.int32)
        if self._mm is not None:
            try:
                self._mm.close()
            except BufferError:
                pass  # someone still holds a view; unmapped when it goes
            self._mm = None

    def _sample_keys(self) -> np.ndarray:
        """Every ``_SAMPLE``-th suffix's first two tokens as one sortable int64,
        built on first use (a strided read of the arrays, not a scan)."""
        if self._keys is None:
            pos = self.suffixes[::_SAMPLE].astype(np.int64)
            # pos + 1 exists: the array ends with a separator, which starts no suffix.
            self._keys = _pair_key(self.tokens[pos], self.tokens[pos + 1])
        return self._keys

    def _bound(self, pattern: list[int], lo: int, hi: int, upper: bool) -> int:
        """First SA slot in [lo, hi) whose suffix, cut to len(pattern), is >=
        (or, with ``upper``, >) ``pattern``. Python list comparison orders
        like the suffix array: lexicographic, a proper prefix first, and
        separators (negative) before every token."""
        toks, sa, m = self.tokens, self.suffixes, len(pattern)
        while lo < hi:
            mid = (lo + hi) // 2
            p = int(sa[mid])
            probe = toks[p : p + m].tolist()
            if probe < pattern or (upper and probe == pattern):
                lo = mid + 1
            else:
                hi = mid
        return lo

    def _range(self, pattern: list[int]) -> tuple[int, int]:
        """The SA slots ``[lo, hi)`` of the suffixes that start with ``pattern``."""
        n = len(self.suffixes)
        if n == 0:
            return 0, 0
        # The sampled pair keys bracket the pair's range to within _SAMPLE
        # slots at each end; the Python binary search runs inside that window.
        key_lo = pattern[0] << 32  # _pair_key in Python ints: numpy scalars cost more here
        key_hi = key_lo + (1 << 32)
        if len(pattern) > 1:
            key_lo += pattern[1] + (1 << 31)
            key_hi = key_lo + 1
        i_lo, i_hi = np.searchsorted(self._sample_keys(), (key_lo, key_hi)).tolist()
        window_lo, window_hi = max(0, (i_lo - 1) * _SAMPLE + 1), min(n, i_hi * _SAMPLE)
        lo = self._bound(pattern, window_lo, window_hi, upper=False)
        if lo == window_hi:
            return lo, lo
        p = int(self.suffixes[lo])
        if self.tokens[p : p + len(pattern)].tolist() != pattern:
            return lo, lo
        return lo, self._bound(pattern, lo + 1, window_hi, upper=True)

    def longest_suffix_match(self, context: Sequence[int], max_len: int | None = None) -> tuple[int, int, int]:
        """``(m, lo, hi)``: the longest suffix of ``context`` (at most ``max_len``
        tokens) that occurs in the store has ``m`` tokens, and ``suffixes[lo:hi]``
        are its occurrences. ``m == 0`` (and lo == hi) when not even the last
        token occurs. A match that ends a document counts, though nothing
        follows it there."""
        max_len = self.max_len if max_len is None else max_len
        tail = [int(t) for t in context[len(context) - min(max_len, len(context)) :]]
        if not tail:
            return (0, 0, 0)
        # Long matches are what REST lives on, so try the longest first.
        lo, hi = self._range(tail)
        if hi > lo:
            return (len(tail), lo, hi)
        best = (0, 0, 0)
        # Occurrence is monotone in m (a suffix of a match matches), so
        # binary-search the length: O(log max_len) range searches.
        lo_m, hi_m = 1, len(tail) - 1
        while lo_m <= hi_m:
            m = (lo_m + hi_m) // 2
            lo, hi = self._range(tail[len(tail) - m :])
            if hi > lo:
                best, lo_m = (m, lo, hi), m + 1
            else:
                hi_m = m - 1
        return best

    def lookup(self, context: Sequence[int], draft_len: int, max_candidates: int = 8) -> Lookup | None:
        """Continuations of the longest match of ``context``, ranked like the
        n-gram index's (score, i.e. expected shared prefix; then the latest
        position in the store). None when nothing matches or nothing follows."""
        m, lo, hi = self.longest_suffix_match(context)
        if m == 0 or draft_len < 1:
            return None
        step = -(-(hi - lo) // self.max_occurrences)
        starts = self.suffixes[lo:hi:step].astype(np.int64) + m
        if len(starts) <= self.python_rows:
            # Few occurrences: plain Python beats two dozen tiny numpy calls.
            toks, where = self.tokens, starts.tolist()
            conts = [cut_at_separator(toks[p : p + draft_len].tolist()) for p in where]
            found = rank_continuations(m, hi - lo, conts, where, [1.0] * len(where), max_candidates)
            return found if found.candidates else None
        return self._rank_many(m, hi - lo, starts, draft_len, max_candidates)

    def _rank_many(
        self, m: int, occurrences: int, starts: np.ndarray, draft_len: int, max_candidates: int
    ) -> Lookup | None:
        """rank_continuations, vectorized for many occurrences."""
        rows = len(starts)
        # The array ends with a separator, so clipped reads land on one: dead.
        conts = self.tokens[np.minimum(starts[:, None] + np.arange(draft_len), len(self.tokens) - 1)]
        dead = np.logical_or.accumulate(conts < 0, axis=1)  # from the first separator on
        conts[dead] = -1
        # Rows are in suffix-array order, so rows sharing a prefix of length d
        # are contiguous: a new group starts at depth d where a row departs
        # from the previous one at or before d.
        departs = np.zeros(rows, dtype=np.int64)
        ne = conts[1:] != conts[:-1]
        departs[1:] = np.where(ne.any(axis=1), ne.argmax(axis=1), draft_len)
        starts_group = departs[:, None] <= np.arange(draft_len)
        gid = np.cumsum(starts_group, axis=0) + np.arange(draft_len) * (rows + 1)  # distinct per depth
        support = np.where(dead, 0.0, np.bincount(gid.ravel())[gid] / rows)
        first = np.flatnonzero(departs < draft_len)  # first row of each distinct continuation
        counts = np.diff(first, append=rows)
        last_seen = np.maximum.reduceat(starts, first)
        lengths = draft_len - dead[first].sum(axis=1)
        scores = support[first].sum(axis=1)
        order = np.lexsort((-last_seen, -np.round(scores, 9)))
        order = order[lengths[order] > 0][:max_candidates]
        if not len(order):
            return None
        candidates = tuple(
            Candidate(tuple(conts[r, :k].tolist()), c, tuple(support[r, :k].tolist()), s)
            for r, k, c, s in zip(
                first[order].tolist(), lengths[order].tolist(), counts[order].tolist(), last_seen[order].tolist()
            )
        )
        return Lookup(m, occurrences, rows, candidates)

    def continuations(self, context: Sequence[int], draft_len: int, max_candidates: int = 8) -> list[Candidate]:
        """The candidates of ``lookup`` (tokens with counts), best first."""
        found = self.lookup(context, draft_len, max_candidates)
        return list(found.candidates) if found else []


def _pair_key(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """Two tokens as one int64 ordered like the pair: the first token is >= 0
    (no suffix starts with a separator) and the second fits in 32 bits."""
    return (first.astype(np.int64) << 32) + (second.astype(np.int64) + (1 << 31))
