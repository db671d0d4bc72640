"""GGUF metadata, validation and draft compatibility, on the real small models and crafted files."""

from __future__ import annotations

import dataclasses
import os
import shutil
import struct
from pathlib import Path

import gguf
import numpy as np
import pytest

from localspec.errors import IncompatibleDraftError, ModelFileError
from localspec.models.gguf_header import SkippedArray, array_length, read_header
from localspec.models.gguf_info import (
    GGUFInfo,
    check_draft_compatible,
    read_info,
    read_tokens,
    tokenizer_fingerprint,
)

from vocab_gguf import VOCAB, write_vocab_gguf  # noqa: E402  (tests/support)


def test_the_header_reader_skips_long_arrays_unless_asked(tmp_path: Path) -> None:
    """``read_header`` is the bytes layer: long arrays are stepped over, kept ones come back raw."""
    tokens = [f"tok{i}" for i in range(2000)]  # longer than the 1024 elements kept unasked
    path = write_vocab_gguf(tmp_path / "long.gguf", tokens)
    header = read_header(path)
    assert header.path == path and header.file_size == path.stat().st_size
    assert header.metadata["tokenizer.ggml.tokens"] == SkippedArray(2000)
    assert array_length(header.metadata["tokenizer.ggml.tokens"]) == 2000
    assert header.metadata["llama.context_length"] == 256
    assert [(t.name, t.n_elements, t.n_bytes) for t in header.tensors] == [("blk.0.attn_norm.weight", 8, 32)]
    assert header.data_offset % gguf.GGUF_DEFAULT_ALIGNMENT == 0
    kept = read_header(path, keep=frozenset({"tokenizer.ggml.tokens"}))
    assert kept.metadata["tokenizer.ggml.tokens"][:2] == [b"tok0", b"tok1"]
    assert len(kept.metadata["tokenizer.ggml.tokens"]) == 2000
    # A stream is read only as far as the header, into the same result.
    with path.open("rb") as stream:
        assert read_header(stream) == header


@pytest.fixture(scope="module")
def smollm2(smollm2_path: Path) -> GGUFInfo:
    return read_info(smollm2_path)


@pytest.fixture(scope="module")
def gemma(gemma_path: Path) -> GGUFInfo:
    return read_info(gemma_path)


# --- metadata of the real models ----------------------------------------------------------------


def test_smollm2_metadata(smollm2: GGUFInfo) -> None:
    i = smollm2
    assert (i.architecture, i.n_layers, i.n_embd, i.n_ff) == ("llama", 30, 576, 1536)
    assert (i.n_head, i.n_head_kv, i.head_dim_k, i.head_dim_v) == (9, 3, 64, 64)  # 576 / 9 = 64
    assert (i.context_length, i.n_vocab, i.vocab_type, i.tokenizer_pre) == (8192, 49152, "gpt2", "smollm")
    assert (i.bos_id, i.eos_id, i.add_bos, i.add_eos) == (1, 2, False, None)
    assert i.chat_template is not None and "<|im_start|>" in i.chat_template
    assert i.file_type == "Q4_1"
    assert i.sliding_window is None and i.global_layer_share == 1.0
    assert i.n_params == 134_515_008
    assert i.sliding_window is None and not any(i.swa_layers)
    assert i.kv_heads_by_layer == (3,) * 30
    assert i.tied_embeddings and i.output_bytes == 0
    assert len(i.layer_bytes) == 30 and len(set(i.layer_bytes)) == 1
    # Tensor data runs to the end of the file: the header is all that is left.
    assert 0 < i.file_size - i.tensor_bytes < 2_000_000
    assert i.bits_per_weight == pytest.approx(8 * i.tensor_bytes / i.n_params)
    assert 5 < i.bits_per_weight < 6  # Q4_1 is 5 bits per weight; the Q8_0 embedding adds some


def test_gemma_metadata_with_sliding_window(gemma: GGUFInfo) -> None:
    i = gemma
    assert (i.architecture, i.n_layers, i.n_embd, i.n_head, i.n_head_kv) == ("gemma3", 18, 640, 4, 1)
    assert (i.head_dim_k, i.head_dim_v) == (256, 256)  # key_length/value_length, not 640 / 4
    assert (i.context_length, i.n_vocab, i.vocab_type) == (32768, 262144, "llama")
    assert (i.bos_id, i.eos_id, i.add_bos, i.add_eos) == (2, 1, True, False)
    assert i.chat_template is None
    assert i.file_type == "Q4_K_M"
    assert i.sliding_window == 512
    # Gemma 3's default pattern period is 6: every sixth layer (5, 11, 17) attends globally.
    assert [il for il, swa in enumerate(i.swa_layers) if not swa] == [5, 11, 17]
    assert i.global_layer_share == pytest.approx(3 / 18)
    assert i.tied_embeddings
    assert i.label == "gemma-3-270m-q4_k_m"


def test_read_tokens_and_fingerprint(smollm2_path: Path, gemma_path: Path, tmp_path: Path) -> None:
    tokens = read_tokens(smollm2_path)
    assert len(tokens) == 49152 and tokens[:3] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    gemma_tokens = read_tokens(gemma_path)
    assert len(gemma_tokens) == 262144 and gemma_tokens[:3] == ["<pad>", "<eos>", "<bos>"]

    fp = tokenizer_fingerprint(smollm2_path)
    assert len(fp) == 64 and fp == tokenizer_fingerprint(smollm2_path)
    assert fp != tokenizer_fingerprint(gemma_path)
    # The fingerprint covers the tokenizer only: other metadata may differ, any token may not.
    a = write_vocab_gguf(tmp_path / "a.gguf", bos=1)
    b = write_vocab_gguf(tmp_path / "b.gguf", bos=3)
    c = write_vocab_gguf(tmp_path / "c.gguf", VOCAB[:100] + ["changed"] + VOCAB[101:])
    assert tokenizer_fingerprint(a) == tokenizer_fingerprint(b) != tokenizer_fingerprint(c)


def test_agrees_with_gguf_reader(tmp_path: Path) -> None:
    path = write_vocab_gguf(tmp_path / "v.gguf", add_bos=True)
    info = read_info(path)
    reader = gguf.GGUFReader(path)
    assert info.tensor_bytes == sum(int(t.n_bytes) for t in reader.tensors)
    assert info.n_params == sum(int(t.n_elements) for t in reader.tensors)
    assert info.n_vocab == len(reader.fields["tokenizer.ggml.tokens"].data)
    assert info.add_bos is True and info.bos_id == reader.fields["tokenizer.ggml.bos_token_id"].contents()
    assert read_tokens(path) == VOCAB


# --- files that are not whole GGUF models -------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match=r"model file not found: .*nope\.gguf; check the path.*localspec pull"):
        read_info(tmp_path / "nope.gguf")


def test_directory(tmp_path: Path) -> None:
    write_vocab_gguf(tmp_path / "inside.gguf")
    with pytest.raises(ModelFileError, match=r"is a directory; pass a \.gguf file inside it such as inside\.gguf"):
        read_info(tmp_path)


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.gguf"
    path.touch()
    with pytest.raises(ModelFileError, match=r"empty\.gguf is empty \(0 bytes\); .*fetch it again"):
        read_info(path)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"just some notes about a model\n", r"not a GGUF model file: it is a text file starting with "
                                             r"'just some notes about a model'"),
        (b"<!DOCTYPE html><html><body>404</body></html>", r"it is an HTML page"),
        (b"version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 42\n", r"Git LFS pointer.*git lfs pull"),
        (b"\x00\x01\x02\x03\xff\xfe\xfd\xfc", r"starts with bytes 00 01 02 03 instead of the magic 'GGUF'"),
    ],
)
def test_not_gguf(tmp_path: Path, content: bytes, expected: str) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(content)
    with pytest.raises(ModelFileError, match=expected) as err:
        read_info(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (struct.pack("<IQQ", 1, 0, 0), r"it uses GGUF version 1; only versions 2 and 3 are supported"),
        (struct.pack(">IQQ", 3, 0, 0), r"it is a big-endian GGUF"),
        (struct.pack("<IQQ", 3, 1 << 40, 0), r"its header is corrupt \(it claims 1,099,511,627,776 tensors"),
    ],
)
def test_unsupported_or_corrupt_header(tmp_path: Path, header: bytes, expected: str) -> None:
    path = tmp_path / "odd.gguf"
    path.write_bytes(b"GGUF" + header)
    with pytest.raises(ModelFileError, match=rf"cannot read model file .*odd\.gguf: {expected}"):
        read_info(path)


def test_per_layer_heads_and_explicit_swa_pattern(tmp_path: Path) -> None:
    w = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "gemma3")
    w.add_block_count(3)
    w.add_embedding_length(64)
    w.add_head_count(4)
    w.add_head_count_kv([2, 0, 1])  # a layer without attention has no KV heads
    w.add_sliding_window(128)
    w.add_sliding_window_pattern([True, False, True])
    w.add_tensor("blk.2.attn_norm.weight", np.ones(64, dtype=np.float32))
    w.add_tensor("output.weight", np.ones((4, 64), dtype=np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    info = read_info(tmp_path / "m.gguf")
    assert info.kv_heads_by_layer == (2, 0, 1) and info.n_head_kv == 2
    assert (info.head_dim_k, info.sliding_window, info.swa_layers) == (16, 128, (True, False, True))
    assert info.global_layer_share == pytest.approx(1 / 3)
    assert info.layer_bytes == (0, 0, 256) and info.output_bytes == 512 and not info.tied_embeddings
    assert (info.n_vocab, info.vocab_type, info.bos_id, info.chat_template) == (0, "none", None, None)


def test_truncated_to_half(smollm2_path: Path, tmp_path: Path) -> None:
    size = smollm2_path.stat().st_size
    path = tmp_path / "half.gguf"
    with smollm2_path.open("rb") as src, path.open("wb") as dst:
        dst.write(src.read(size // 2))
    with pytest.raises(ModelFileError, match=rf"half\.gguf is truncated: it has {size // 2:,} bytes but its 272 "
                                             rf"tensors need {size:,} \(50% present\); .*fetch it again"):
        read_info(path)


def test_truncated_header(smollm2_path: Path, tmp_path: Path) -> None:
    path = tmp_path / "cut.gguf"
    with smollm2_path.open("rb") as src, path.open("wb") as dst:
        dst.write(src.read(1024))
    with pytest.raises(ModelFileError, match=r"cut\.gguf is truncated: its GGUF header stops at byte 1024 inside "
                                             r"metadata entry 24 of 33; .*fetch it again"):
        read_info(path)
    with pytest.raises(ModelFileError, match="truncated"):
        read_tokens(path)
    with smollm2_path.open("rb") as src, path.open("wb") as dst:
        dst.write(src.read(100_000))  # inside the 49k-token list, which read_info steps over
    with pytest.raises(ModelFileError, match=r"stops at byte 100000 inside metadata key 'tokenizer\.ggml\.tokens'"):
        read_info(path)


def test_unreadable_file(tmp_path: Path) -> None:
    path = write_vocab_gguf(tmp_path / "locked.gguf")
    path.chmod(0)
    try:
        try:
            path.open("rb").close()
        except PermissionError:
            with pytest.raises(ModelFileError, match=r"cannot read model file .*locked\.gguf: Permission denied"):
                read_info(path)
        else:
            pytest.skip("file permissions are not enforced for this user (root)")
    finally:
        path.chmod(0o644)


# --- draft compatibility (llama.cpp's rules) ----------------------------------------------------


def test_real_pair_is_incompatible(smollm2_path: Path, gemma_path: Path) -> None:
    with pytest.raises(IncompatibleDraftError) as err:
        check_draft_compatible(smollm2_path, gemma_path)
    assert str(err.value) == (
        "draft gemma-3-270m-q4_k_m is incompatible with target SmolLM2-135M-Instruct.Q4_1: vocabulary type "
        "differs (target 'gpt2', draft 'llama'); pick a draft from the same model family"
    )


def test_model_is_compatible_with_itself(smollm2: GGUFInfo, smollm2_path: Path, tmp_path: Path) -> None:
    check_draft_compatible(smollm2, smollm2_path)
    copy = tmp_path / "copy.gguf"
    shutil.copyfile(smollm2_path, copy)
    check_draft_compatible(smollm2, copy)  # a second file: the token texts are really compared


def test_vocabulary_type_differs(tmp_path: Path) -> None:
    t = write_vocab_gguf(tmp_path / "t.gguf", model="gpt2")
    d = write_vocab_gguf(tmp_path / "d.gguf", model="llama")
    with pytest.raises(IncompatibleDraftError, match=r"draft d is incompatible with target t: vocabulary type "
                                                     r"differs \(target 'gpt2', draft 'llama'\)"):
        check_draft_compatible(t, d)


def test_bos_rules(tmp_path: Path) -> None:
    t = write_vocab_gguf(tmp_path / "t.gguf", add_bos=True, bos=1)
    with pytest.raises(IncompatibleDraftError, match=r"one adds BOS .*\(target add_bos=True, draft add_bos=False\)"):
        check_draft_compatible(t, write_vocab_gguf(tmp_path / "d1.gguf", add_bos=False, bos=1))
    with pytest.raises(IncompatibleDraftError, match=r"BOS token id differs \(target 1, draft 3\)"):
        check_draft_compatible(t, write_vocab_gguf(tmp_path / "d2.gguf", add_bos=True, bos=3))
    # llama.cpp compares BOS ids only when BOS is added.
    check_draft_compatible(write_vocab_gguf(tmp_path / "t3.gguf", add_bos=False, bos=1),
                           write_vocab_gguf(tmp_path / "d3.gguf", add_bos=False, bos=3))


def test_bos_default_follows_llama_cpp(tmp_path: Path) -> None:
    # With no add_bos_token key, llama.cpp adds BOS for Llama-3-style BPE ("llama-bpe"), not for plain gpt2.
    t = write_vocab_gguf(tmp_path / "t.gguf", pre="llama-bpe")
    d = write_vocab_gguf(tmp_path / "d.gguf", pre="llama-bpe", add_bos=False)
    with pytest.raises(IncompatibleDraftError, match=r"target add_bos=True, draft add_bos=False"):
        check_draft_compatible(t, d)
    check_draft_compatible(t, write_vocab_gguf(tmp_path / "d2.gguf", pre="llama-bpe", add_bos=True))


def test_eos_rules(tmp_path: Path) -> None:
    t = write_vocab_gguf(tmp_path / "t.gguf", add_eos=True, eos=2)
    with pytest.raises(IncompatibleDraftError, match=r"EOS token id differs \(target 2, draft 4\)"):
        check_draft_compatible(t, write_vocab_gguf(tmp_path / "d.gguf", add_eos=True, eos=4))
    check_draft_compatible(write_vocab_gguf(tmp_path / "t2.gguf", eos=2),
                           write_vocab_gguf(tmp_path / "d2.gguf", eos=4))


def test_vocabulary_size_within_128(tmp_path: Path) -> None:
    t = write_vocab_gguf(tmp_path / "t.gguf", VOCAB)
    check_draft_compatible(t, write_vocab_gguf(tmp_path / "d128.gguf", VOCAB[:-128]))
    with pytest.raises(IncompatibleDraftError, match=r"vocabulary size differs by more than 128 "
                                                     r"\(target 300, draft 171\)"):
        check_draft_compatible(t, write_vocab_gguf(tmp_path / "d129.gguf", VOCAB[:-129]))


def test_token_text_from_id_5(tmp_path: Path) -> None:
    t = write_vocab_gguf(tmp_path / "t.gguf")
    renamed_special = ["<other>"] + VOCAB[1:]  # id 0 may differ: llama.cpp starts at id 5
    check_draft_compatible(t, write_vocab_gguf(tmp_path / "d0.gguf", renamed_special))
    changed = VOCAB[:7] + ["Ω"] + VOCAB[8:]
    with pytest.raises(IncompatibleDraftError, match=r"token 7 differs \(target 'tok7', draft 'Ω'\)"):
        check_draft_compatible(t, write_vocab_gguf(tmp_path / "d7.gguf", changed))


# --- headers from file objects (the Hub, read by range requests) ---------------------------------


class CountingFile:
    """A seekable file over ``data`` that records every read, named like a file on the Hub."""

    def __init__(self, data: bytes, name: str = "org/repo-GGUF/model.gguf") -> None:
        self.data, self.name, self.pos, self.reads = data, name, 0, []

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = (0, self.pos, len(self.data))[whence] + offset
        return self.pos

    def read(self, n: int = -1) -> bytes:
        end = len(self.data) if n < 0 else min(len(self.data), self.pos + n)
        self.reads.append((self.pos, end))
        out, self.pos = self.data[self.pos:end], end
        return out


@pytest.mark.parametrize("fixture", ["smollm2_path", "gemma_path"])
def test_a_header_from_a_file_object_reads_only_the_header(fixture: str, request: pytest.FixtureRequest) -> None:
    path: Path = request.getfixturevalue(fixture)
    from_path = read_info(path)
    stream = CountingFile(path.read_bytes())
    from_stream = read_info(stream)  # type: ignore[arg-type]
    assert from_stream.path == Path("org/repo-GGUF/model.gguf") and from_stream.source is stream
    assert from_stream == dataclasses.replace(from_path, path=from_stream.path)
    header_end = read_info(path).file_size - read_info(path).tensor_bytes  # the header and padding
    # Read in order, each byte once, in whole MiB, and no further than about twice the header.
    reads = stream.reads
    assert all(a == b_end for (_, b_end), (a, _) in zip(reads, reads[1:]))
    top = reads[-1][1]
    assert top % (1 << 20) == 0 and top < 2 * header_end + (1 << 20) and top < len(stream.data) // 10
    assert tokenizer_fingerprint(stream) == tokenizer_fingerprint(path)  # type: ignore[arg-type]


def test_draft_check_reads_vocabularies_through_file_objects(smollm2_path: Path, gemma_path: Path) -> None:
    target = read_info(CountingFile(smollm2_path.read_bytes(), "a/b/smol.gguf"))  # type: ignore[arg-type]
    check_draft_compatible(target, read_info(CountingFile(smollm2_path.read_bytes())))  # type: ignore[arg-type]
    check_draft_compatible(target, smollm2_path)  # a file object and a path: tokens compared
    with pytest.raises(IncompatibleDraftError, match="vocabulary type differs"):
        check_draft_compatible(target, read_info(CountingFile(gemma_path.read_bytes())))  # type: ignore[arg-type]


def test_a_truncated_file_object_is_reported_like_a_file(smollm2_path: Path) -> None:
    data = smollm2_path.read_bytes()
    with pytest.raises(ModelFileError, match=r"model file org/repo-GGUF/model\.gguf is truncated: its GGUF header "
                                             r"stops at byte 100000 inside metadata key 'tokenizer\.ggml\.tokens'"):
        read_info(CountingFile(data[:100_000]))  # type: ignore[arg-type]
    with pytest.raises(ModelFileError, match=r"is truncated: it has 49,181,216 bytes"):
        read_info(CountingFile(data[:len(data) // 2]))  # type: ignore[arg-type]
    with pytest.raises(ModelFileError, match=r"org/repo-GGUF/model\.gguf is not a GGUF model file: it is an HTML"):
        read_info(CountingFile(b"<!DOCTYPE html><html>login</html>"))  # type: ignore[arg-type]


def test_a_full_size_file_with_flipped_header_bytes_is_corrupt(smollm2_path: Path, tmp_path: Path) -> None:
    """Issue 33: a full-size GGUF with flipped header bytes was called "truncated … cut short"."""
    data = smollm2_path.read_bytes()
    header_end = read_header(smollm2_path).data_offset
    path = tmp_path / "flipped.gguf"
    verdicts = []
    for pos in [8, 24, 25, 31, 52, 60, 300, 5_000, 50_000, 400_000, 900_000, 1_500_000, header_end - 100]:
        damaged = bytearray(data[:header_end])
        damaged[pos] ^= 0xFF
        path.write_bytes(bytes(damaged) + data[header_end:])
        try:
            read_info(path)
            verdicts.append("read")  # a flip inside a value that still parses: llama.cpp would read it too
        except ModelFileError as err:
            message = str(err)
            assert "truncated" not in message and "cut short" not in message, (pos, message)
            assert "corrupt" in message and len(message) < 400, (pos, message)
            verdicts.append("corrupt")
    assert verdicts.count("corrupt") >= 8, verdicts
    # A tensor table whose offsets cannot be a writer's, in a file that is short of what it claims.
    info = read_header(smollm2_path)
    t = max(info.tensors, key=lambda t: t.offset)  # the last: moved, it claims more than the file holds
    named = struct.pack("<Q", len(t.name)) + t.name.encode("ascii")
    table_at = data.index(named, 0, header_end) + len(named)
    n_dims = struct.unpack_from("<I", data, table_at)[0]
    offset_at = table_at + 4 + 8 * n_dims + 4
    assert struct.unpack_from("<Q", data, offset_at)[0] == t.offset
    moved = bytearray(data)
    struct.pack_into("<Q", moved, offset_at, t.offset + 8 * 2**20)  # 8 MiB further: a hole, then the end
    path.write_bytes(bytes(moved))
    with pytest.raises(ModelFileError, match=r"its tensor table is corrupt \(tensor .* starts at offset"):
        read_info(path)


# --- drafting by text: which tokenizers can encode any text (issue 43) -----------------------------------
BYTES = [f"<0x{b:02X}>" for b in range(256)]


def test_a_tokenizer_without_byte_fallback_cannot_draft_by_text(tmp_path, gemma_path, smollm2_path):
    from localspec.models.gguf_info import text_encoding_problem

    assert text_encoding_problem(gemma_path) is None  # SentencePiece with <0x00>..<0xFF>
    assert text_encoding_problem(smollm2_path) is None  # byte-level BPE
    assert text_encoding_problem(write_vocab_gguf(tmp_path / "spm.gguf", VOCAB + BYTES, model="llama")) is None
    problem = text_encoding_problem(write_vocab_gguf(tmp_path / "nobytes.gguf", VOCAB, model="llama"))
    assert problem is not None and "no byte-level fallback" in problem
    assert "no byte-level fallback" in (text_encoding_problem(write_vocab_gguf(tmp_path / "w.gguf", model="bert"))
                                        or "")
    problem = text_encoding_problem(write_vocab_gguf(tmp_path / "none.gguf", model="none"))
    assert problem is not None and "tokenizer cannot be loaded" in problem


def test_the_pair_kind_names_drafting_by_text_or_refuses_in_one_line(tmp_path, gemma_path, smollm2_path):
    from localspec.drafting.by_text import SAME_VOCAB, TEXT_PAIR
    from localspec.pairing import check_files, pair_kind

    gemma, smollm2 = read_info(gemma_path), read_info(smollm2_path)
    assert pair_kind(smollm2, smollm2) == SAME_VOCAB
    assert pair_kind(gemma, smollm2) == TEXT_PAIR and pair_kind(smollm2, gemma) == TEXT_PAIR
    assert check_files(gemma, smollm2, ()) == TEXT_PAIR and check_files(gemma, None, ()) is None
    no_bytes = read_info(write_vocab_gguf(tmp_path / "nobytes.gguf", VOCAB, model="llama"))
    with pytest.raises(IncompatibleDraftError) as err:
        pair_kind(smollm2, no_bytes)
    assert str(err.value) == (
        "draft nobytes has another vocabulary than target SmolLM2-135M-Instruct.Q4_1, and it cannot draft by text: "
        "the draft nobytes: its SPM tokenizer has no byte-level fallback (no <0x00>..<0xFF> tokens), so it "
        "cannot encode every text; pick a draft from the target's own family")
    no_tokenizer = read_info(write_vocab_gguf(tmp_path / "none.gguf", model="none"))
    with pytest.raises(IncompatibleDraftError, match="the target none: its GGUF carries no tokenizer, so its "
                                                      "tokenizer cannot be loaded"):
        pair_kind(no_tokenizer, smollm2)


@pytest.fixture
def header_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every header gguf_info parses from here on, by source."""
    from localspec.models import gguf_info

    reads: list[str] = []
    real = gguf_info.read_header
    monkeypatch.setattr(gguf_info, "read_header", lambda source, keep=frozenset(): reads.append(str(source))
                        or real(source, keep))
    return reads


def test_a_files_vocabulary_is_read_once_per_version_of_the_file(tmp_path: Path, header_reads: list[str]) -> None:
    """A launch with a draft of another tokenizer asks for both vocabularies twice (pairing, then the
    drafter): each file's is parsed once, and again once the file changes."""
    reads = header_reads
    path = write_vocab_gguf(tmp_path / "v.gguf")
    first = tokenizer_fingerprint(path)
    assert tokenizer_fingerprint(str(path)) == first and read_tokens(path) == VOCAB
    assert len(reads) == 1
    write_vocab_gguf(path, VOCAB[:100] + ["changed"] + VOCAB[101:])  # rewritten in place
    os.utime(path, ns=(1, 1))  # a different version even where the clock is coarse
    assert tokenizer_fingerprint(path) != first and len(reads) == 2
    # a file object is read every time (nothing says which version of what it is)
    with path.open("rb") as fh:
        tokenizer_fingerprint(fh)
        tokenizer_fingerprint(fh)
    assert len(reads) == 4


def test_a_files_header_is_read_once_per_version_of_the_file(tmp_path: Path, header_reads: list[str]) -> None:
    """``read_info`` is asked three to five times a launch: each file's header is parsed once, again once
    the file changes; a name of the same file elsewhere keeps its own ``path``."""
    reads = header_reads
    path = write_vocab_gguf(tmp_path / "v.gguf")
    first = read_info(path)
    assert read_info(str(path)) == first and len(reads) == 1
    link = tmp_path / "link.gguf"
    link.symlink_to(path)
    assert read_info(link).path == link and len(reads) == 2
    write_vocab_gguf(path, VOCAB + ["one more"])
    os.utime(path, ns=(1, 1))
    assert read_info(path).n_vocab == first.n_vocab + 1 and len(reads) == 3
    with path.open("rb") as fh:
        read_info(fh)
    assert len(reads) == 4
    with pytest.raises(ModelFileError):
        read_info(tmp_path / "missing.gguf")
