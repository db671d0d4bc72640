"""`localspec index`: a real tokenizer, a real corpus, a store REST can draft from."""

from __future__ import annotations

import json
import os
import stat
import shutil
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest

from localspec import cli
from localspec.backend import Model
from localspec.drafting.rest import RestDrafter
from localspec.drafting.suffix_array import open_store
from localspec.errors import StoreError
from localspec.models.gguf_info import read_info, tokenizer_fingerprint
from cli import localspec, one_error_line

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


# --- corrupt stores: one line, exit 2, no traceback (issue 9) ---------------------------------


def _header(path: Path) -> tuple[int, dict]:
    """The JSON header's end and contents."""
    data = path.read_bytes()
    _, _, header_len, _ = struct.unpack_from("<8sIII", data)
    return 20 + header_len, json.loads(data[20 : 20 + header_len])


def _array_span(path: Path, name: str) -> tuple[int, int]:
    _, header = _header(path)
    itemsize = {"tokens": 4, "suffixes": np.dtype(header["suffix_dtype"]).itemsize, "doc_starts": 8}[name]
    count = header[{"tokens": "n_tokens", "suffixes": "n_suffixes", "doc_starts": "n_docs"}[name]]
    return header["offsets"][name], header["offsets"][name] + count * itemsize


def _random_bytes_over_the_suffix_array(path: Path, n_vocab: int) -> str:
    start, end = _array_span(path, "suffixes")
    data = bytearray(path.read_bytes())
    data[start:end] = np.random.default_rng(3).bytes(end - start)
    path.write_bytes(bytes(data))
    return "suffix array points outside the tokens"


def _ids_beyond_the_vocabulary(path: Path, n_vocab: int) -> str:
    """Ids past the vocabulary, with the checksums rewritten to match: what a
    broken writer would leave. Only the vocabulary check can catch it."""
    start, end = _array_span(path, "tokens")
    data = bytearray(path.read_bytes())
    tokens = np.frombuffer(bytes(data[start:end]), dtype="<i4").copy()
    tokens[3:6] = n_vocab + 7
    data[start:end] = tokens.tobytes()
    header_end, header = _header(path)
    header["crc32"]["tokens"] = zlib.crc32(tokens.tobytes())
    blob = json.dumps(header).encode()
    blob += b" " * (header_end - 20 - len(blob))
    assert len(blob) == header_end - 20
    data[8:20] = struct.pack("<III", 1, len(blob), zlib.crc32(blob))
    data[20:header_end] = blob
    path.write_bytes(bytes(data))
    return f"token id {n_vocab + 7} is beyond the model's vocabulary of {n_vocab:,}"


def _truncated(path: Path, n_vocab: int) -> str:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 2 // 3])
    return "the header says"


def _bad_header(path: Path, n_vocab: int) -> str:
    data = bytearray(path.read_bytes())
    data[40] ^= 0x20  # inside the JSON header
    path.write_bytes(bytes(data))
    return "header fails its checksum"


CORRUPTIONS = [_random_bytes_over_the_suffix_array, _ids_beyond_the_vocabulary, _truncated, _bad_header]


def _assert_one_line(code: int, out: str, err: str, *needles: str) -> None:
    assert code == 2, err
    assert out == "" and "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("localspec: error: "), err
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.mark.parametrize("corrupt", CORRUPTIONS, ids=lambda f: f.__name__.strip("_"))
def test_index_verify_finds_each_corruption(index_cli, capsys, corpus, smollm2_path, corrupt):
    store, _, _ = build(index_cli, capsys, corpus, smollm2_path)
    n_vocab = read_info(smollm2_path).n_vocab
    why = corrupt(store, n_vocab)
    code = index_cli("index", "--verify", str(store), "--model", str(smollm2_path))
    out, err = capsys.readouterr()
    _assert_one_line(code, out, err, f"store {store} is corrupt (", why,
                     f"rebuild it with `localspec index PATH... --model MODEL -o {store}`")
    # Without a model the checksums still catch it (ids past the vocabulary fail the checksum
    # only when the writer did not rewrite it, so that case needs --model).
    if corrupt is not _ids_beyond_the_vocabulary:
        code = index_cli("index", "--verify", str(store))
        out, err = capsys.readouterr()
        _assert_one_line(code, out, err, "is corrupt (")
    with pytest.raises(StoreError, match="is corrupt"):
        RestDrafter.open(store, smollm2_path)


def test_index_verify_passes_a_sound_store(index_cli, capsys, corpus, smollm2_path, gemma_path):
    store, summary, _ = build(index_cli, capsys, corpus, smollm2_path)
    code = index_cli("index", "--verify", str(store), "--model", str(smollm2_path))
    out, err = capsys.readouterr()
    assert code == 0, err
    assert out == (f"store {store} is sound: {summary['tokens']:,} tokens in 4 documents, every checksum matches "
                   f"(built for {smollm2_path.name}'s tokenizer)\n")
    code = index_cli("index", "--verify", str(store), "--json")
    out, err = capsys.readouterr()
    assert code == 0, err
    assert json.loads(out) == {"store": str(store), "sound": True, "tokens": summary["tokens"], "documents": 4,
                               "fingerprint": summary["fingerprint"], "model": None}
    # Another model's tokenizer: refused in one line, naming where the fingerprints differ.
    code = index_cli("index", "--verify", str(store), "--model", str(gemma_path))
    out, err = capsys.readouterr()
    _assert_one_line(code, out, err, "another tokenizer (fingerprint ", " vs ")


def test_index_verify_and_build_options_do_not_mix(index_cli, capsys, corpus, smollm2_path):
    cases = [
        (["index", "--verify", "s.lsstore", str(corpus / "notes")], "takes no PATH or -o"),
        (["index", "--verify", "s.lsstore", "-o", "t.lsstore"], "takes no PATH or -o"),
        (["index", "--model", str(smollm2_path), "-o", "t.lsstore"], "name what to index"),
        (["index", str(corpus / "notes"), "-o", "t.lsstore"], "--model MODEL is required"),
        (["index", str(corpus / "notes"), "--model", str(smollm2_path)], "-o STORE is required"),
        (["index", "--verify", str(corpus / "missing.lsstore")], "cannot open store"),
        (["index", "--verify", str(corpus / "notes" / "a.md")], "is not a localspec store"),
    ]
    for argv, needle in cases:
        code = index_cli(*argv)
        out, err = capsys.readouterr()
        _assert_one_line(code, out, err, needle)


def test_generate_refuses_each_corrupt_store_in_one_line(index_cli, capsys, corpus, smollm2_path, tmp_path):
    """`generate --draft rest:STORE` on each damaged copy: one line and exit 2 before any text
    (random suffixes used to raise IndexError, ids past the vocabulary to fail llama_decode
    mid-reply); the sound store still drafts."""
    store, _, _ = build(index_cli, capsys, corpus, smollm2_path)
    n_vocab = read_info(smollm2_path).n_vocab
    # The sentence twice, then its start: the model repeats it, and the store holds what follows.
    prompt = f"{SENTENCE}\n{SENTENCE}\n{SENTENCE[:40]}"
    for corrupt in CORRUPTIONS:
        damaged = tmp_path / f"{corrupt.__name__.strip('_')}.lsstore"
        shutil.copyfile(store, damaged)
        why = corrupt(damaged, n_vocab)
        proc = localspec("generate", str(smollm2_path), "--draft", f"rest:{damaged}", "-p", prompt,
                          "--max-tokens", "8")
        _assert_one_line(proc.returncode, proc.stdout, proc.stderr, f"store {damaged} is corrupt (", why,
                         "localspec index")
    proc = localspec("generate", str(smollm2_path), "--draft", f"rest:{store}", "-p", prompt,
                      "--max-tokens", "24", "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["tokens"] == 24
    # The sentence is in the store: REST drafted some of it and the target kept it.
    assert result["stats"]["accepted"] > 0, result["stats"]


def test_a_symlink_to_a_store_is_written_through(index_cli, capsys, corpus, smollm2_path):
    """Issue 33: -o link.lsstore replaced the link with a file and left the real store stale."""
    real = corpus / "stores" / "notes.lsstore"
    real.parent.mkdir()
    link = corpus / "link.lsstore"
    store, first, _ = build(index_cli, capsys, corpus, smollm2_path)
    store.rename(real)
    link.symlink_to(real)
    before = real.stat().st_mtime_ns
    code = index_cli("index", str(corpus / "code" / "*.py"), "--model", str(smollm2_path), "-o", str(link))
    _, err = capsys.readouterr()
    assert code == 0, err
    assert link.is_symlink() and link.resolve() == real
    assert real.stat().st_mtime_ns != before
    with open_store(real, tokenizer_fingerprint(smollm2_path)) as opened:
        assert len(opened.doc_starts) == 1  # the new corpus (tool.py alone), not the four documents before
    assert first["documents"] == 4


def test_a_fifo_or_a_device_as_output_is_refused_in_one_line(corpus, smollm2_path, tmp_path):
    """Issue 33: -o fifo.lsstore hung silently (reading the FIFO's head to see whether it was a store)."""
    fifo = tmp_path / "fifo.lsstore"
    os.mkfifo(fifo)
    for out, needle in ((fifo, "is a FIFO (named pipe), not a regular file"),
                        (Path("/dev/null"), "is a device, not a regular file")):
        proc = localspec("index", str(corpus / "notes"), "--model", str(smollm2_path), "-o", str(out), timeout=60)
        line = one_error_line(proc)
        assert f"-o {out} " in line and needle in line, line
    assert stat.S_ISFIFO(fifo.stat().st_mode)


def test_a_store_that_cannot_be_written_after_all_is_one_line(index_cli, capsys, corpus, smollm2_path, monkeypatch):
    import contextlib

    from localspec.drafting import suffix_array

    @contextlib.contextmanager
    def full_disk(path, **kw):
        raise OSError(28, "No space left on device")
        yield  # pragma: no cover

    monkeypatch.setattr(suffix_array, "atomic_write", full_disk)
    store = corpus / "full.lsstore"
    code = index_cli("index", str(corpus / "notes"), "--model", str(smollm2_path), "-o", str(store))
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.splitlines() == [(f"localspec: error: -o {store}: the store could not be written (No space left on "
                                    "device); the previous file, if any, is untouched")]
    assert not store.exists()
