"""`localspec index`: a real tokenizer, a real corpus, a store REST can draft from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from localspec import cli
from localspec.backend import Model
from localspec.drafting.rest import RestDrafter
from localspec.drafting.suffix_array import open_store
from localspec.errors import StoreError
from localspec.models.gguf_info import tokenizer_fingerprint

SENTENCE = ("The lighthouse keeper polished the great brass lens every evening, "
            "long before the fishing boats came home across the grey water.")


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    root = tmp_path / "notes"
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / "a.md").write_text("# Diary\n\n" + SENTENCE + "\nThen he slept.\n")
    (root / "sub" / "b.txt").write_text("A short note about tides and wind.\n")
    (root / "sub" / "deeper" / "c.txt").write_text("héllo wörld, nested two folders down\n")
    (root / "image.bin").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" * 4)
    (root / "latin1.txt").write_bytes("caf\xe9 cr\xe8me br\xfbl\xe9e\n".encode("latin-1"))
    code = tmp_path / "code"
    code.mkdir()
    (code / "tool.py").write_text("def tide(hour):\n    return hour % 12\n")
    (code / "README").write_text("not matched by the glob\n")
    return tmp_path


@pytest.fixture
def index_cli():
    """`localspec ...` in process."""
    def main(*argv: str) -> int:
        return cli.main(list(argv))

    return main


def build(index_cli, capsys, corpus: Path, model: Path, *extra: str) -> tuple[Path, dict, str]:
    store = corpus / "notes.lsstore"
    code = index_cli("index", str(corpus / "notes"), str(corpus / "code" / "*.py"), "--model", str(model),
                     "-o", str(store), "--json", *extra)
    out, err = capsys.readouterr()
    assert code == 0, err
    return store, json.loads(out), err


def test_index_builds_a_store_with_the_right_counts(index_cli, capsys, corpus, smollm2_path):
    store, summary, err = build(index_cli, capsys, corpus, smollm2_path)
    assert store.is_file() and summary["store"] == str(store)
    assert summary["files"] == 4  # a.md, b.txt, c.txt (nested), tool.py (glob); README not matched
    assert summary["documents"] == 4
    assert [Path(p).name for p in summary["skipped"]["binary"]] == ["image.bin"]
    assert [Path(p).name for p in summary["skipped"]["undecodable"]] == ["latin1.txt"]
    assert summary["store_bytes"] == store.stat().st_size
    expected = sum(len(path.read_bytes()) for path in
                   [corpus / "notes" / "a.md", corpus / "notes" / "sub" / "b.txt",
                    corpus / "notes" / "sub" / "deeper" / "c.txt", corpus / "code" / "tool.py"])
    assert summary["bytes"] == expected
    # The summary on stderr names what was indexed, skipped and written.
    assert "indexed 4 files" in err and "skipped 2" in err and "1 binary" in err and "1 not UTF-8" in err
    assert str(store) in err

    fingerprint = tokenizer_fingerprint(smollm2_path)
    assert summary["fingerprint"] == fingerprint
    with open_store(store, fingerprint) as opened:
        assert len(opened.doc_starts) == 4
        assert len(opened) - 4 == summary["tokens"]  # one separator per document


def test_store_is_refused_for_another_tokenizer(index_cli, capsys, corpus, smollm2_path, gemma_path):
    store, _, _ = build(index_cli, capsys, corpus, smollm2_path)
    with pytest.raises(StoreError) as err:
        RestDrafter.open(store, gemma_path)
    message = str(err.value)
    assert "another tokenizer" in message and "localspec index" in message
    assert "\n" not in message


def test_rest_drafts_the_continuation_of_a_sentence_in_the_corpus(index_cli, capsys, corpus, smollm2_path):
    store, _, _ = build(index_cli, capsys, corpus, smollm2_path)
    tok = Model(smollm2_path, vocab_only=True)
    sentence = tok.tokenize(SENTENCE, add_special=False)
    lead_in = tok.tokenize("My grandfather told me this: ", add_special=False)
    tok.close()
    drafter = RestDrafter.open(store, smollm2_path)
    # The sentence starts a line, so it tokenizes alike inside the file and alone.
    stored = drafter.store.tokens.tolist()
    assert any(stored[i : i + len(sentence)] == sentence for i in range(len(stored)))
    k = 10  # the history ends ten tokens into the sentence
    proposal = drafter.propose(lead_in + sentence[:k], 8)
    assert proposal.drafter == "rest"
    assert len(proposal.tokens) >= 4
    assert proposal.tokens == tuple(sentence[k : k + len(proposal.tokens)])
    drafter.store.close()


def test_cli_errors_are_one_line(index_cli, capsys, corpus, smollm2_path, tmp_path):
    cases = [
        (["index", str(corpus / "typo"), "--model", str(smollm2_path), "-o", str(tmp_path / "s.lsstore")],
         "no such file or folder"),
        (["index", str(corpus / "notes"), "--model", str(tmp_path / "nope.gguf"), "-o", str(tmp_path / "s.lsstore")],
         "model file not found"),
        (["index", str(corpus / "notes"), "--model", str(smollm2_path), "-o", str(corpus / "notes" / "a.md")],
         "is not a localspec store"),
        (["index", str(corpus / "notes"), "--model", str(smollm2_path), "-o", str(tmp_path / "missing" / "s")],
         "does not exist"),
        (["index", str(corpus / "notes" / "image.bin"), "--model", str(smollm2_path), "-o", str(tmp_path / "s")],
         "no text files"),
    ]
    for argv, needle in cases:
        code = index_cli(*argv)
        out, err = capsys.readouterr()
        assert code == 2, (argv, err)
        assert out == ""
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("localspec: error: "), err
        assert needle in lines[0], lines[0]
    # Nothing was written by the failures, and the file that was not a store is intact.
    assert not (tmp_path / "s.lsstore").exists() and not (tmp_path / "s").exists()
    assert (corpus / "notes" / "a.md").read_text().startswith("# Diary")


def test_plain_output_is_the_store_path_and_reindexing_replaces_the_store(index_cli, capsys, corpus, smollm2_path):
    store = corpus / "out.lsstore"
    for _ in range(2):  # the second run replaces the store the first one wrote
        code = index_cli("index", str(corpus / "notes"), "--model", str(smollm2_path), "-o", str(store))
        out, err = capsys.readouterr()
        assert code == 0, err
        assert out == f"{store}\n"
        assert "tokens in" in err
    with open_store(store, tokenizer_fingerprint(smollm2_path)) as opened:
        assert len(opened.doc_starts) == 3
