"""Walking a user's corpus and building a store from it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from localspec.drafting.corpus import CorpusReport, build_store_from_corpus, iter_corpus
from localspec.drafting.suffix_array import open_store
from localspec.errors import InvalidOptionError, StoreError


def byte_tokens(text: str) -> list[int]:
    """A stand-in tokenizer: one token per UTF-8 byte."""
    return list(text.encode("utf-8"))


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    root = tmp_path / "notes"
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / ".git").mkdir()
    (root / "a.md").write_text("# Title\nsome text\n")
    (root / "sub" / "b.py").write_text("def f():\n    return 1\n")
    (root / "sub" / "deeper" / "c.txt").write_text("héllo wörld\n")
    (root / "sub" / "empty.txt").write_text("")
    (root / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    (root / "latin1.txt").write_bytes("caf\xe9 cr\xe8me\n".encode("latin-1"))
    (root / ".hidden.txt").write_text("skip me\n")
    (root / ".git" / "config").write_text("[core]\n")
    return root


def test_walk_skips_and_counts_binaries_and_undecodable(corpus: Path) -> None:
    report = CorpusReport()
    docs = list(iter_corpus([str(corpus)], report))
    names = [Path(d.path).name for d in docs]
    assert names == ["a.md", "b.py", "empty.txt", "c.txt"]  # files before subfolders, hidden skipped
    assert report.files == 4
    assert [Path(p).name for p in report.binary] == ["image.png"]
    assert [Path(p).name for p in report.undecodable] == ["latin1.txt"]
    assert report.skipped == 2
    assert "".join(docs[3].chunks()) == "héllo wörld\n"


def test_files_globs_and_duplicates(corpus: Path) -> None:
    paths = [str(corpus / "a.md"), str(corpus / "**" / "*.py"), str(corpus / "sub")]
    names = [Path(d.path).name for d in iter_corpus(paths)]
    assert names == ["a.md", "b.py", "empty.txt", "c.txt"]  # b.py reached twice, listed once


def test_a_path_that_names_nothing_fails_first(corpus: Path) -> None:
    with pytest.raises(InvalidOptionError, match="no such file or folder"):
        list(iter_corpus([str(corpus), str(corpus / "typo")]))
    with pytest.raises(InvalidOptionError):
        list(iter_corpus([str(corpus / "*.nothing")]))


def test_large_files_stream_in_line_chunks(tmp_path: Path) -> None:
    text = "".join(f"line {i} ünïcode\n" for i in range(500))
    path = tmp_path / "big.txt"
    path.write_text(text)
    (doc,) = iter_corpus([str(path)], chunk_bytes=256)
    chunks = list(doc.chunks())
    assert len(chunks) > 10
    assert all(c.endswith("\n") for c in chunks)
    assert "".join(chunks) == text


def test_a_line_longer_than_a_chunk_is_cut_without_breaking_characters(tmp_path: Path) -> None:
    text = "ö€" * 500 + "\nend"
    path = tmp_path / "long.txt"
    path.write_text(text)
    (doc,) = iter_corpus([str(path)], chunk_bytes=101)
    assert "".join(doc.chunks()) == text


def test_bad_bytes_after_the_first_block_are_replaced_and_reported(tmp_path: Path) -> None:
    path = tmp_path / "mostly.txt"
    path.write_bytes(b"fine line\n" * 50 + b"bad \xff byte\n" + "genuine \ufffd\n".encode())
    report = CorpusReport()
    (doc,) = iter_corpus([str(path)], report, chunk_bytes=64)
    text = "".join(doc.chunks())
    assert "bad \ufffd byte" in text
    assert report.lossy == [str(path)]
    clean = tmp_path / "clean.txt"
    clean.write_text("genuine \ufffd\n")
    report = CorpusReport()
    (doc,) = iter_corpus([str(clean)], report)
    list(doc.chunks())
    assert report.lossy == []


def test_build_store_from_corpus(corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "notes.lsp"
    report = build_store_from_corpus([str(corpus)], byte_tokens, "bytes-v1", out, chunk_bytes=8)
    assert report.documents == 3  # empty.txt has no tokens
    assert report.corpus.skipped == 2
    texts = ["# Title\nsome text\n", "def f():\n    return 1\n", "héllo wörld\n"]
    assert report.tokens == sum(len(t.encode()) for t in texts)
    with open_store(out, "bytes-v1") as store:
        assert store.doc_starts.tolist() == [0, 19, 42]
        first = store.tokens[: store.doc_starts[1] - 1]
        assert bytes(first.astype(np.uint8)).decode() == texts[0]
        found = store.lookup(byte_tokens("def "), 4)
        assert found is not None and found.candidates[0].tokens == tuple(b"f():")


def test_building_from_nothing_is_refused(tmp_path: Path) -> None:
    (tmp_path / "bin.dat").write_bytes(b"\x00\x01")
    with pytest.raises(StoreError, match="no text files"):
        build_store_from_corpus([str(tmp_path)], byte_tokens, "fp", tmp_path / "out.lsp")
    assert not (tmp_path / "out.lsp").exists()


def test_progress_counts_every_byte_then_the_sort(corpus: Path, tmp_path: Path) -> None:
    """Issue 41: `index` of one 50 MB line ran 94 s with no sign of life; it now reports as it reads."""
    seen: list[tuple[str, int, int]] = []
    report = build_store_from_corpus([str(corpus)], byte_tokens, "bytes-v1", tmp_path / "n.lsp", chunk_bytes=8,
                                     progress=lambda stage, done, total: seen.append((stage, done, total)))
    reading = [s for s in seen if s[0] == "tokenizing"]
    total = report.corpus.bytes
    assert len(reading) > 3 and all(t == total for _, _, t in reading)
    assert [d for _, d, _ in reading] == sorted(d for _, d, _ in reading) and reading[-1][1] == total
    assert seen[-1] == ("sorting", report.tokens, report.tokens)


def test_the_progress_line_is_for_terminals_only() -> None:
    import io

    from localspec.commands.index import progress_line

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert progress_line(io.StringIO()) is None
    term = Terminal()
    show = progress_line(term, every_s=3600)
    assert show is not None
    show("tokenizing", 5_000_000, 50_000_000)
    show("tokenizing", 6_000_000, 50_000_000)  # within every_s: not drawn again
    show("tokenizing", 50_000_000, 50_000_000)  # the end always is
    show("sorting", 1_234_567, 1_234_567)
    lines = [line for line in term.getvalue().split("\r") if line.strip()]
    assert lines == ["\x1b[Klocalspec: indexing: tokenizing 5.0 of 50.0 MB (10%)",
                     "\x1b[Klocalspec: indexing: tokenizing 50.0 of 50.0 MB (100%)",
                     "\x1b[Klocalspec: indexing: sorting the suffixes of 1,234,567 tokens"]
