"""A personal store of past outputs: what the model wrote before, drafted again.

Each reply (with the last few tokens of the context it answered) is kept as one
document in a per-tokenizer file in the user data dir, so the phrasings a
user's work repeats are drafted from the first step of a new chat. The store
is one more ``NgramSource`` of the context n-gram drafter; every draft is
verified by the target, so a stale or odd history costs a little compute and
never changes the output. ``LOCALSPEC_NO_HISTORY=1`` turns it off.

The file (a crash-safe append-only log of records, repaired where damaged) is
``personal_log``'s: its format, why it is a log, and what damage costs.

In memory only the most recent ``index_tokens`` are searched, through a suffix
array (opening a store this way takes about 0.1 s at 200k tokens; building
an ``NgramIndex`` over them takes 1.3-1.7 s of Python). Lookups rank like
``NgramIndex.lookup``: the longest matched suffix of the context (up to
``max_len`` tokens), its ``max_occurrences`` most recent occurrences,
recency-weighted. Documents are separated by negative tokens, so no match and
no continuation crosses from one reply into another.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from localspec.drafting.lookup import Lookup, cut_at_separator, rank_continuations
from localspec.drafting.ngram import NgramDrafter
from localspec.drafting.suffix_array import Store, build_suffix_array
from localspec.errors import StoreError
from localspec.drafting.personal_log import (RECORD_HEAD, Scan, Unusable, aside_path,
                                             header_bytes, locked, parse_header, record, scan_records,
                                             write_atomically)

DEFAULT_CAPACITY = 1_000_000
DEFAULT_INDEX_TOKENS = 200_000
CONTEXT_TOKENS = 8  # context kept before each reply, so a new chat's first step can match it
_SLACK = 4  # compact when the file passes capacity by 1/_SLACK
_OPT_OUT = "set LOCALSPEC_NO_HISTORY=1 to stop keeping it"
_FINGERPRINT_RE = re.compile(r"^[0-9A-Za-z_-]+$")


def history_disabled() -> bool:
    """Whether the user opted out (``LOCALSPEC_NO_HISTORY`` set to anything but 0/false/no/off)."""
    value = os.environ.get("LOCALSPEC_NO_HISTORY", "").strip().lower()
    return value not in ("", "0", "false", "no", "off")


def personal_dir(data_dir: str | os.PathLike[str] | None = None) -> Path:
    from localspec.paths import data_dir as default_data_dir

    return Path(data_dir if data_dir is not None else default_data_dir()) / "personal"


@dataclass(frozen=True)
class LoadReport:
    """What opening found: ``documents``/``tokens`` on disk, ``indexed`` tokens
    searched in memory, ``dropped_bytes`` of torn tail (a write cut short)
    ignored, ``damaged_bytes`` of damaged records skipped."""

    documents: int = 0
    tokens: int = 0
    indexed: int = 0
    dropped_bytes: int = 0
    seconds: float = 0.0
    damaged_bytes: int = 0


class PersonalStore:
    """Past outputs for one tokenizer: an ``NgramSource`` plus an append-only file.

    ``add`` puts a document in memory (searched at once); ``save`` appends what
    was added since the last save to the file. Not thread-safe; safe across
    processes.
    """

    def __init__(self, path: Path, fingerprint: str, *, capacity: int = DEFAULT_CAPACITY,
                 index_tokens: int = DEFAULT_INDEX_TOKENS, max_len: int = 16, max_occurrences: int = 32,
                 recency_decay: float = 0.95) -> None:
        if capacity < 1 or index_tokens < 1:
            raise ValueError("capacity and index_tokens must be at least 1")
        if not _FINGERPRINT_RE.match(fingerprint):
            raise ValueError("a fingerprint is letters, digits, - and _")
        self.path, self.fingerprint = path, fingerprint
        self.capacity = capacity
        self.index_tokens = min(index_tokens, capacity)
        self.max_len, self.max_occurrences = max_len, max_occurrences
        self._weights = [recency_decay**r for r in range(max_occurrences)]  # most recent first
        self._docs: list[np.ndarray] = []  # the most recent index_tokens, oldest first
        self._indexed = 0  # tokens in _docs
        self._pending: list[np.ndarray] = []  # added, not yet saved
        self._index: Store | None = None
        self._dirty = False
        self.report = LoadReport()
        self.notices: list[str] = []  # the warnings printed about the file (damage, moves)
        self.saving = True  # False once the file must be left alone this run (see _stop_saving)

    @classmethod
    def open(cls, fingerprint: str, *, capacity: int = DEFAULT_CAPACITY,
             index_tokens: int = DEFAULT_INDEX_TOKENS, data_dir: str | os.PathLike[str] | None = None
             ) -> "PersonalStore":
        """Load the store for ``fingerprint`` (empty when there is none yet).

        Never raises for a bad file: damaged records are skipped and the file
        repaired, a file that is not a usable history is moved aside, one
        that cannot be read or was written by a newer localspec is left alone
        with saving off; each says so in one line on stderr (also kept in
        ``notices``). A torn tail is skipped (``report.dropped_bytes``) and
        cut off by the next save.
        """
        path = personal_dir(data_dir) / f"{fingerprint[:16]}.tokens"
        store = cls(path, fingerprint, capacity=capacity, index_tokens=index_tokens)
        store._load()
        return store

    # --- reading -----------------------------------------------------------
    def _load(self) -> None:
        started = time.perf_counter()
        buf, start, scan, damaged = b"", 0, Scan([], [], 0), 0
        try:
            buf = self.path.read_bytes()
        except FileNotFoundError:
            pass
        except OSError as err:
            self._stop_saving(f"cannot read personal history {self.path} ({err.strerror or err}); "
                              "drafting without it this run")
        if buf:  # a 0-byte file is an empty history: the next save writes its header
            try:
                start = self._header_end(buf)
                scan = scan_records(buf, start)
                healthy = not scan.damaged
            except Unusable as bad:
                if bad.newer:
                    self._stop_saving(f"personal history {self.path} was written by a newer localspec "
                                      f"({bad.why}); left it as it is and kept no history this run "
                                      f"(upgrade localspec, or {_OPT_OUT})")
                    buf = b""
                else:
                    scan = Scan([], [(0, len(buf))], len(buf))  # nothing in it can be trusted
                healthy = bad.newer
            damaged = scan.damaged_bytes
            if not healthy:
                buf, start, scan = self._repair(buf, start, scan)
        records = scan.records
        docs: list[np.ndarray] = []
        kept = 0
        for offset, n in reversed(records):
            if kept >= self.index_tokens:
                break
            take = min(n, self.index_tokens - kept)
            # Copied out of the file's bytes so the buffer can go.
            docs.append(np.frombuffer(buf, dtype="<i4", count=take, offset=offset + 4 * (n - take)).astype(np.int32))
            kept += take
        self._docs, self._indexed = docs[::-1], kept
        self._dirty = True
        self.build_index()
        self.report = LoadReport(len(records), sum(n for _, n in records), kept, len(buf) - scan.end,
                                 time.perf_counter() - started, damaged)

    def _repair(self, buf: bytes, start: int, scan: Scan) -> tuple[bytes, int, Scan]:
        """Set a damaged or foreign file right under the lock (``_read_locked``);
        when that cannot be done, keep what the unlocked read found good
        (nothing, if the header was bad) and save nothing this run."""
        try:
            with locked(self._lock_path()):
                return self._read_locked()
        except Unusable as bad:  # replaced by a newer localspec's file meanwhile
            self._stop_saving(f"personal history {self.path} was written by a newer localspec ({bad.why}); "
                              f"left it as it is and kept no history this run")
        except OSError as err:
            self._stop_saving(f"personal history {self.path} is damaged and could not be repaired "
                              f"({err.strerror or err}); using its {len(scan.records)} good records, "
                              "saving nothing this run")
        return buf, start, scan

    def _header_end(self, buf: bytes) -> int:
        """The offset of the first record; Unusable when the header is not ours."""
        return parse_header(buf, self.fingerprint)

    def _read_locked(self) -> tuple[bytes, int, Scan]:
        """The file's bytes, where its records start and their scan, after
        setting it right (the lock held): a missing or empty file gets its
        header, one whose header is not ours is moved aside and restarted,
        one with damaged records is kept aside and rewritten with its good
        records. Each change is one warning line. What remains may end in a
        torn tail (``scan.end``). Raises Unusable only for a newer format."""
        try:
            buf = self.path.read_bytes()
        except FileNotFoundError:
            buf = b""
        if buf:
            try:
                start = self._header_end(buf)
            except Unusable as bad:
                if bad.newer:
                    raise
                aside = aside_path(self.path)
                os.replace(self.path, aside)
                self._warn(f"personal history {self.path} is not usable ({bad.why}); moved it to {aside.name} "
                           "and started a new one")
                buf = b""
        if not buf:
            buf = self._header_bytes()
            write_atomically(self.path, [buf])
            return buf, len(buf), Scan([], [], len(buf))
        scan = scan_records(buf, start)
        if not scan.damaged:
            return buf, start, scan
        aside = aside_path(self.path)
        try:
            os.link(self.path, aside)  # the original stays whole under the new name
        except OSError:
            shutil.copyfile(self.path, aside)
        good = [buf[off - RECORD_HEAD : off + 4 * n] for off, n in scan.records]
        try:
            write_atomically(self.path, [self._header_bytes(), *good])
        except OSError:
            # Not repaired: the original is still whole under its own name, so the copy kept aside would
            # be a leftover no message names. It goes; the next run tries the repair again.
            aside.unlink(missing_ok=True)
            raise
        self._warn(f"personal history {self.path} was damaged: skipped {scan.damaged_bytes:,} bytes, kept its "
                   f"{len(good)} good records; the damaged file is kept as {aside.name}")
        return self._read_locked()

    def _warn(self, message: str) -> None:
        """One line on stderr (this cache's damage is news, never an error)."""
        self.notices.append(message)
        print(f"localspec: warning: {message}", file=sys.stderr)

    def _stop_saving(self, message: str) -> None:
        """Leave the file alone for the rest of this run, saying why once."""
        self.saving = False
        self._warn(message)

    def _lock_path(self) -> Path:
        return self.path.with_name(self.path.name + ".lock")

    def build_index(self) -> None:
        """(Re)build the in-memory suffix array if documents were added since."""
        if not self._dirty:
            return
        self._dirty = False
        if not self._docs:
            self._index = None
            return
        parts: list[np.ndarray] = []
        starts: list[int] = []
        n = 0
        for i, doc in enumerate(self._docs):
            starts.append(n)
            parts += [doc, np.array([-(i + 1)], dtype=np.int32)]  # distinct separators end ties early
            n += len(doc) + 1
        tokens = np.concatenate(parts)
        sa = build_suffix_array(tokens)
        sa = sa[tokens[sa] >= 0]
        self._index = Store(self.path, self.fingerprint, tokens, sa, np.asarray(starts, dtype=np.int64),
                            max_len=self.max_len)

    def __len__(self) -> int:
        """Tokens searched in memory (separators not counted)."""
        return self._indexed

    @property
    def documents(self) -> int:
        """Documents searched in memory."""
        return len(self._docs)

    def lookup(self, context: Sequence[int], draft_len: int, max_candidates: int = 8) -> Lookup | None:
        """Continuations of the longest suffix of ``context`` found in past outputs,
        from its most recent occurrences, recency-weighted (as ``NgramIndex.lookup``)."""
        self.build_index()
        index = self._index
        if index is None or draft_len < 1:
            return None
        m, lo, hi = index.longest_suffix_match(context)
        if m == 0:
            return None
        positions = index.suffixes[lo:hi]
        k = min(self.max_occurrences, len(positions))
        if len(positions) > k:
            positions = np.partition(positions, len(positions) - k)[-k:]
        # Documents are stored oldest first, so a later position is a more recent occurrence.
        starts = (np.sort(positions)[::-1].astype(np.int64) + m).tolist()
        toks = index.tokens
        conts = [cut_at_separator(toks[p : p + draft_len].tolist()) for p in starts]
        found = rank_continuations(m, hi - lo, conts, starts, self._weights[:k], max_candidates)
        return found if found.candidates else None

    # --- writing -----------------------------------------------------------
    def remember(self, reply: Sequence[int] | np.ndarray, context: Sequence[int] | np.ndarray = ()) -> bool:
        """After a reply: keep ``reply`` (without its end-of-generation token) with the tail of
        ``context`` (the prompt it answered) and append it to the file (``add``, then ``save``).
        The in-memory index is rebuilt at the next lookup (or call ``build_index`` when idle),
        so a one-shot run does not pay for it. Returns False (and does nothing) when history
        is off or ``reply`` is empty. Raises StoreError when the file cannot be written."""
        if history_disabled() or not len(reply):
            return False
        self.add(reply, context=context)
        self.save()
        return True

    def add(self, tokens: Sequence[int] | np.ndarray, *, context: Sequence[int] | np.ndarray = ()) -> None:
        """Keep ``tokens`` (one reply) as a document, preceded by the last
        ``CONTEXT_TOKENS`` of ``context`` (what it answered), so the next time
        that context ends a prompt the reply can be drafted from the first step.
        Searched at once; written by ``save``."""
        reply = _token_array(tokens)
        if not len(reply):
            return
        head = _token_array(context)[-CONTEXT_TOKENS:]
        doc = np.concatenate([head, reply]) if len(head) else reply
        doc = doc[-self.capacity :]
        self._pending.append(doc)
        self._docs.append(doc)
        self._indexed += len(doc)
        if self._indexed > self.index_tokens:
            self._docs = _most_recent(self._docs, self.index_tokens)
            self._indexed = self.index_tokens
        self._dirty = True

    @property
    def pending(self) -> int:
        """Documents added and not yet saved."""
        return len(self._pending)

    def save(self) -> None:
        """Append the documents added since the last save, then compact the file
        if it outgrew ``capacity``. Raises StoreError when the file cannot be
        written (nothing is lost from memory; a later save retries). Does
        nothing once saving is off (``saving``: the file is left alone)."""
        if not self._pending:
            return
        if not self.saving:
            self._pending = []
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with locked(self._lock_path()):
                total = self._append_locked(self._pending)
                if total > self.capacity + self.capacity // _SLACK:
                    self._compact_locked()
        except Unusable as bad:  # a newer localspec's file appeared since this one was opened
            self._stop_saving(f"personal history {self.path} was written by a newer localspec ({bad.why}); "
                              "left it as it is and kept no history this run")
            self._pending = []
            return
        except OSError as err:
            why = err.strerror or err
            raise StoreError(f"cannot save personal history to {self.path}: {why}; {_OPT_OUT}") from None
        self._pending = []

    def _header_bytes(self) -> bytes:
        return header_bytes(self.fingerprint)

    def _append_locked(self, docs: list[np.ndarray]) -> int:
        """Append ``docs`` (the lock held); returns the tokens now in the file.

        The whole file is read and checked each time (about 20 ms with the
        fsync at the size bound): remembering how far it was valid would need
        the file's identity, and inode numbers are reused after a compaction.
        A damaged file is repaired first (``_read_locked``), so an append
        never cuts a good record.
        """
        buf, _, scan = self._read_locked()
        with open(self.path, "r+b") as f:
            if scan.end < len(buf):
                f.truncate(scan.end)  # a torn tail left by a crashed writer: no live writer holds the lock
            f.seek(scan.end)
            f.write(b"".join(record(d) for d in docs))
            f.flush()
            os.fsync(f.fileno())
        return sum(n for _, n in scan.records) + sum(len(d) for d in docs)

    def _compact_locked(self) -> None:
        """Rewrite the file with its most recent ``capacity`` (the lock held)."""
        buf, _, scan = self._read_locked()
        docs = _most_recent([np.frombuffer(buf, dtype="<i4", count=n, offset=off) for off, n in scan.records],
                            self.capacity)
        body = [self._header_bytes()] + [record(d) for d in docs]
        write_atomically(self.path, body)


def _token_array(tokens: Sequence[int] | np.ndarray) -> np.ndarray:
    arr = np.asarray(tokens, dtype=np.int64).reshape(-1)
    if len(arr) and (arr.min() < 0 or arr.max() >= 2**31):
        raise ValueError("token ids must be in [0, 2**31)")
    return arr.astype(np.int32)


def _most_recent(docs: list[np.ndarray], limit: int) -> list[np.ndarray]:
    """The last ``limit`` tokens of ``docs``, as whole documents but the oldest,
    which keeps its end."""
    out: list[np.ndarray] = []
    kept = 0
    for doc in reversed(docs):
        if kept >= limit:
            break
        take = min(len(doc), limit - kept)
        out.append(doc[len(doc) - take :])
        kept += take
    return out[::-1]


def personal_ngram_drafter(model_path: str | os.PathLike[str], *, max_branches: int = 4,
                           personal: bool = True) -> NgramDrafter:
    """The context n-gram drafter with ``model_path``'s personal store as a source
    (none with ``personal=False`` or ``LOCALSPEC_NO_HISTORY=1``). A bad store
    file never raises (see ``PersonalStore.open``)."""
    drafter = NgramDrafter(max_branches=max_branches)
    if personal and not history_disabled():
        from localspec.models.gguf_info import tokenizer_fingerprint

        store = PersonalStore.open(tokenizer_fingerprint(model_path))
        drafter.sources.append(store)
        drafter.reply_store = store
    return drafter
