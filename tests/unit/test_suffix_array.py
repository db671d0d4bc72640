"""The suffix array, the store file format, and REST lookups against brute force."""

from __future__ import annotations

import os
import struct
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localspec.drafting.suffix_array import (
    FORMAT_VERSION,
    build_suffix_array,
    fingerprint_difference,
    open_store,
    write_store,
)
from localspec.errors import StoreError

FP = "tok:3f9a77c1e0d2"
small_docs = st.lists(st.lists(st.integers(0, 3), max_size=25), max_size=5)
tmp_ok = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(-2, 3), max_size=60))
def test_suffix_array_is_the_sorted_suffixes(tokens: list[int]) -> None:
    sa = build_suffix_array(np.array(tokens, dtype=np.int32))
    assert sa.dtype == np.int32
    assert sa.tolist() == sorted(range(len(tokens)), key=lambda i: tokens[i:])


def test_suffix_array_of_long_repeats() -> None:
    # Many doubling rounds: the longest repeat is 3000 tokens.
    tokens = np.tile(np.array([1, 2, 3], dtype=np.int32), 1000)
    tokens = np.r_[tokens, 0, tokens[:-1]]
    sa = build_suffix_array(tokens)
    assert sa.tolist() == sorted(range(len(tokens)), key=lambda i: tokens[i:].tolist())


def _flat(docs: list[list[int]]) -> list[int]:
    """The token array write_store lays out: each non-empty doc, then -(index + 1)."""
    out: list[int] = []
    for doc in (d for d in docs if d):
        out += doc
        out.append(-(len([1 for x in out if x < 0]) + 1))
    return out


def _brute_match(flat: list[int], context: list[int], max_len: int) -> tuple[int, list[int]]:
    for m in range(min(max_len, len(context)), 0, -1):
        pattern = context[len(context) - m :]
        hits = [i for i in range(len(flat)) if flat[i : i + m] == pattern]
        if hits:
            return m, hits
    return 0, []


@tmp_ok
@given(docs=small_docs, context=st.lists(st.integers(0, 3), max_size=8), max_len=st.integers(1, 8))
def test_longest_suffix_match_matches_brute_force(tmp_path: Path, docs: list, context: list, max_len: int) -> None:
    write_store(tmp_path / "s.lsp", [np.array(d) for d in docs], FP)
    with open_store(tmp_path / "s.lsp", FP) as store:
        flat = _flat(docs)
        assert store.tokens.tolist() == flat
        m, lo, hi = store.longest_suffix_match(context, max_len=max_len)
        want_m, hits = _brute_match(flat, context, max_len)
        assert m == want_m
        assert sorted(store.suffixes[lo:hi].tolist()) == hits


@tmp_ok
@given(
    docs=small_docs,
    context=st.lists(st.integers(0, 3), min_size=1, max_size=6),
    draft_len=st.integers(1, 5),
    python_rows=st.sampled_from([0, 1000]),  # the vectorized ranking, or the plain one
)
def test_continuations_match_brute_force(
    tmp_path: Path, docs: list, context: list, draft_len: int, python_rows: int
) -> None:
    write_store(tmp_path / "s.lsp", [np.array(d) for d in docs], FP)
    with open_store(tmp_path / "s.lsp", FP) as store:
        store.python_rows = python_rows
        found = store.lookup(context, draft_len, max_candidates=1000)
        flat = _flat(docs)
        m, hits = _brute_match(flat, context, store.max_len)
        conts = []
        for i in hits:
            cont = flat[i + m : i + m + draft_len]
            cut = next((j for j, t in enumerate(cont) if t < 0), len(cont))
            conts.append(tuple(cont[:cut]))
        expected = Counter(c for c in conts if c)
        if not expected:
            assert found is None
            return
        assert found is not None
        assert (found.match_len, found.occurrences, found.considered) == (m, len(hits), len(hits))
        assert {c.tokens: c.count for c in found.candidates} == expected
        for cand in found.candidates:
            agree = [sum(c[: d + 1] == cand.tokens[: d + 1] for c in conts) / len(conts)
                     for d in range(len(cand.tokens))]  # fmt: skip
            assert cand.support == pytest.approx(agree)
            assert cand.last_seen == max(i + m for i, c in zip(hits, conts) if c == cand.tokens)
        ranks = [(-round(c.score, 9), -c.last_seen) for c in found.candidates]
        assert ranks == sorted(ranks)
        assert store.continuations(context, draft_len, 1000) == list(found.candidates)


def test_lookup_samples_frequent_matches(tmp_path: Path) -> None:
    # "7" occurs 5000 times, followed by 1 four times in five.
    doc = np.tile(np.array([7, 1, 7, 1, 7, 1, 7, 1, 7, 2]), 1000)
    write_store(tmp_path / "s.lsp", [doc], FP)
    with open_store(tmp_path / "s.lsp", FP) as store:
        found = store.lookup([3, 7], 1)
        assert found is not None and found.occurrences == 5000 and found.considered <= store.max_occurrences
        assert found.candidates[0].tokens == (1,)
        assert found.candidates[0].support[0] == pytest.approx(0.8, abs=0.01)


def test_round_trip_keeps_documents_apart(tmp_path: Path) -> None:
    docs = [np.array([5, 6, 7]), np.array([], dtype=np.int32), np.array([6, 7, 8, 9])]
    assert write_store(tmp_path / "s.lsp", docs, FP) == 7
    with open_store(tmp_path / "s.lsp", FP) as store:
        assert store.doc_starts.tolist() == [0, 4]
        assert store.tokens.tolist() == [5, 6, 7, -1, 6, 7, 8, 9, -2]
        assert len(store.suffixes) == 7
        # "7" ends document 0 and continues with 8 in document 1 only.
        found = store.lookup([6, 7], 3)
        assert found is not None and [c.tokens for c in found.candidates] == [(8, 9)]
    assert sorted(os.listdir(tmp_path)) == ["s.lsp"]  # no temp file left behind


def test_empty_store(tmp_path: Path) -> None:
    write_store(tmp_path / "s.lsp", [], FP)
    with open_store(tmp_path / "s.lsp", FP) as store:
        assert len(store) == 0
        assert store.longest_suffix_match([1, 2]) == (0, 0, 0)
        assert store.lookup([1, 2], 4) is None


def test_failed_write_leaves_nothing(tmp_path: Path) -> None:
    def docs():
        yield np.array([1, 2])
        raise RuntimeError("tokenizer died")

    with pytest.raises(RuntimeError):
        write_store(tmp_path / "s.lsp", docs(), FP)
    assert os.listdir(tmp_path) == []


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    path = tmp_path / "notes.lsp"
    rng = np.random.default_rng(0)
    write_store(path, [rng.integers(0, 50, 200) for _ in range(3)], FP)
    return path


def test_wrong_tokenizer_is_refused(store_path: Path) -> None:
    with pytest.raises(StoreError) as err:
        open_store(store_path, "tok:0000aaaa9999")
    msg = str(err.value)
    # The shared "tok:" is skipped: the message shows where they differ.
    assert "another tokenizer" in msg
    assert "from character 5: …3f9a77c1… vs …0000aaaa…, the store's vs the model's" in msg
    assert "localspec index" in msg and "\n" not in msg


def test_fingerprint_difference_shows_what_differs() -> None:
    assert fingerprint_difference("abcdef0123456789", "9bcdef0123456789") == "abcdef01… vs 9bcdef01…"
    a, b = "0123456789abcdef" * 4, "0123456789abcdef" * 3 + "0123456789abcdeF"
    assert fingerprint_difference(a, b) == "from character 64: …f vs …F"
    assert fingerprint_difference("abc", "abcd") == "from character 4: …(end) vs …d"


def _header_size(path: Path) -> int:
    _, _, header_len, _ = struct.unpack("<8sIII", path.read_bytes()[:20])
    return 20 + header_len


def test_every_flipped_header_byte_is_refused(store_path: Path) -> None:
    original = store_path.read_bytes()
    for i in range(_header_size(store_path)):
        corrupt = bytearray(original)
        corrupt[i] ^= 0x01
        store_path.write_bytes(bytes(corrupt))
        with pytest.raises(StoreError):
            open_store(store_path, FP)


@pytest.mark.parametrize("keep", [0, 5, 19, 100, -1, -64])
def test_truncated_store_is_refused(store_path: Path, keep: int) -> None:
    data = store_path.read_bytes()
    store_path.write_bytes(data[:keep] if keep >= 0 else data[:keep])
    with pytest.raises(StoreError):
        open_store(store_path, FP)


def test_bad_magic_and_unknown_version(store_path: Path, tmp_path: Path) -> None:
    data = bytearray(store_path.read_bytes())
    other = tmp_path / "other.bin"
    other.write_bytes(b"GGUF" + bytes(data[4:]))
    with pytest.raises(StoreError, match="bad magic"):
        open_store(other, FP)
    data[8:12] = struct.pack("<I", FORMAT_VERSION + 1)
    store_path.write_bytes(bytes(data))
    with pytest.raises(StoreError, match=f"format version {FORMAT_VERSION + 1}"):
        open_store(store_path, FP)


def test_missing_store(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="cannot open store"):
        open_store(tmp_path / "nope.lsp", FP)


def test_grown_file_is_refused(store_path: Path) -> None:
    with open(store_path, "ab") as f:
        f.write(b"\0" * 64)
    with pytest.raises(StoreError, match="is corrupt"):
        open_store(store_path, FP)


def test_matches_in_a_store_larger_than_the_key_sample(tmp_path: Path) -> None:
    """Many sampled keys: the windows they give must still hold every match."""
    rng = np.random.default_rng(7)
    docs = [rng.integers(0, 5, rng.integers(1, 400)) for _ in range(40)]
    write_store(tmp_path / "s.lsp", docs, FP)
    with open_store(tmp_path / "s.lsp", FP) as store:
        flat = np.array(_flat([d.tolist() for d in docs]))
        for _ in range(200):
            context = rng.integers(0, 5, 12).tolist()
            m, lo, hi = store.longest_suffix_match(context, max_len=12)
            pattern = np.array(context[len(context) - m :])
            windows = np.lib.stride_tricks.sliding_window_view(flat, m)
            occurs = np.flatnonzero((windows == pattern).all(axis=1))
            assert sorted(store.suffixes[lo:hi].tolist()) == occurs.tolist()
            if m < 12:  # one token longer does not occur
                longer = np.array(context[len(context) - m - 1 :])
                assert not (np.lib.stride_tricks.sliding_window_view(flat, m + 1) == longer).all(axis=1).any()


def test_verify_finds_a_flipped_data_byte(store_path: Path) -> None:
    with open_store(store_path, FP) as store:
        store.verify()
    data = bytearray(store_path.read_bytes())
    data[-200] ^= 0x40  # inside the arrays, past the header
    store_path.write_bytes(bytes(data))
    with open_store(store_path, FP) as store:  # opening does not read the arrays
        with pytest.raises(StoreError, match="checksum"):
            store.verify()


def _array_span(path: Path, name: str) -> tuple[int, int]:
    """Where array ``name`` lies in the file (from the header, as written)."""
    import json

    data = path.read_bytes()
    header = json.loads(data[20:_header_size(path)])
    itemsize = {"tokens": 4, "suffixes": np.dtype(header["suffix_dtype"]).itemsize, "doc_starts": 8}[name]
    count = header[{"tokens": "n_tokens", "suffixes": "n_suffixes", "doc_starts": "n_docs"}[name]]
    return header["offsets"][name], header["offsets"][name] + count * itemsize


def _overwrite(path: Path, start: int, new: bytes) -> None:
    data = bytearray(path.read_bytes())
    data[start : start + len(new)] = new
    path.write_bytes(bytes(data))


def _refusal(path: Path, n_vocab: int | None = None) -> str:
    with pytest.raises(StoreError) as err:
        open_store(path, FP, n_vocab=n_vocab)
    message = str(err.value)
    assert "\n" not in message and "is corrupt (" in message and f"-o {path}`" in message
    return message


def test_random_bytes_over_the_suffix_array_are_refused_on_open(store_path: Path) -> None:
    start, end = _array_span(store_path, "suffixes")
    _overwrite(store_path, start + 40, np.random.default_rng(1).bytes(64))
    assert "suffix array points outside the tokens" in _refusal(store_path)


def test_ids_beyond_the_vocabulary_are_refused_on_open(store_path: Path) -> None:
    with open_store(store_path, FP, n_vocab=50) as store:  # built from ids 0..49
        store.verify(n_vocab=50)
    start, _ = _array_span(store_path, "tokens")
    _overwrite(store_path, start + 4 * 10, struct.pack("<i", 70_000))
    assert "token id 70000 is beyond the model's vocabulary of 50" in _refusal(store_path, n_vocab=50)
    with open_store(store_path, FP) as store:  # no vocabulary given: ids are not bounded
        with pytest.raises(StoreError, match="checksum"):
            store.verify()


def test_a_lost_separator_is_refused_on_open(store_path: Path) -> None:
    start, _ = _array_span(store_path, "tokens")
    _overwrite(store_path, start + 4 * 200, struct.pack("<i", 7))  # the separator after document 0
    assert "separators are missing" in _refusal(store_path)


def test_document_starts_out_of_order_are_refused_on_open(store_path: Path) -> None:
    start, _ = _array_span(store_path, "doc_starts")
    _overwrite(store_path, start + 8, struct.pack("<q", 10**12))
    assert "document starts" in _refusal(store_path)


def test_a_bad_header_is_refused_on_open(store_path: Path) -> None:
    _overwrite(store_path, 30, b"#")  # inside the JSON header
    assert "header fails its checksum" in _refusal(store_path)


def test_verify_checks_the_arrays_too(store_path: Path) -> None:
    """verify() on a store whose arrays were damaged after opening (the
    mapping shows the file): the structure check runs before the checksums."""
    with open_store(store_path, FP) as store:
        start, _ = _array_span(store_path, "suffixes")
        with open(store_path, "r+b") as f:
            f.seek(start)
            f.write(struct.pack("<i", -5))
        with pytest.raises(StoreError, match="suffix array points outside"):
            store.verify()
