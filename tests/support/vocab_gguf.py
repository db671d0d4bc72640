"""Vocabulary-only GGUFs: a tokenizer's metadata with one tiny tensor, for the pairing rules' tests."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

# A small vocabulary whose ids 0-4 are "specials" (llama.cpp skips them when comparing texts).
VOCAB = ["<unk>", "<s>", "</s>", "<pad>", "<mask>"] + [f"tok{i}" for i in range(5, 300)]


def write_vocab_gguf(path: Path, tokens: list[str] = VOCAB, *, model: str = "gpt2", pre: str | None = None,
                     bos: int | None = 1, eos: int | None = 2, add_bos: bool | None = None,
                     add_eos: bool | None = None) -> Path:
    """A vocabulary-only GGUF: tokenizer metadata, a few hyperparameters and one tiny tensor."""
    w = _vocab_writer(path, path.stem)
    w.add_tokenizer_model(model)
    if pre is not None:
        w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types([1] * len(tokens))
    if bos is not None:
        w.add_bos_token_id(bos)
    if eos is not None:
        w.add_eos_token_id(eos)
    if add_bos is not None:
        w.add_add_bos_token(add_bos)
    if add_eos is not None:
        w.add_add_eos_token(add_eos)
    return _finish(w, path)


def _vocab_writer(path: Path, name: str) -> gguf.GGUFWriter:
    """A GGUF writer with the few hyperparameters llama.cpp reads before the vocabulary."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(name)
    w.add_block_count(1)
    w.add_context_length(256)
    w.add_embedding_length(8)
    w.add_feed_forward_length(16)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    return w


def _finish(w: gguf.GGUFWriter, path: Path) -> Path:
    """One tiny tensor, and the file written."""
    w.add_tensor("blk.0.attn_norm.weight", np.ones(8, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def copy_vocab_gguf(source: Path, path: Path, *, added: dict[str, int] | None = None, name: str | None = None) -> Path:
    """A vocabulary-only GGUF with ``source``'s tokenizer (its tokens, types, merges, special ids, flags and
    chat template), ``added`` tokens appended (text -> GGUF token type: 3 control, 4 user-defined), and
    ``general.name`` set to ``name`` (llama.cpp sets some tokens' attributes by the model's name)."""
    fields = gguf.GGUFReader(str(source)).fields
    tokens = list(fields["tokenizer.ggml.tokens"].contents())
    types = list(fields["tokenizer.ggml.token_type"].contents())
    for text, kind in (added or {}).items():
        tokens.append(text)
        types.append(kind)
    w = _vocab_writer(path, name or path.stem)
    w.add_tokenizer_model(fields["tokenizer.ggml.model"].contents())
    if "tokenizer.ggml.pre" in fields:
        w.add_tokenizer_pre(fields["tokenizer.ggml.pre"].contents())
    w.add_token_list(tokens)
    w.add_token_types(types)
    if "tokenizer.ggml.merges" in fields:
        w.add_token_merges(list(fields["tokenizer.ggml.merges"].contents()))
    if "tokenizer.ggml.scores" in fields:
        w.add_token_scores(list(fields["tokenizer.ggml.scores"].contents()) + [0.0] * len(added or {}))
    for key, add in (("bos_token_id", w.add_bos_token_id), ("eos_token_id", w.add_eos_token_id),
                     ("unknown_token_id", w.add_unk_token_id), ("padding_token_id", w.add_pad_token_id),
                     ("add_bos_token", w.add_add_bos_token), ("add_eos_token", w.add_add_eos_token),
                     ("add_space_prefix", w.add_add_space_prefix)):
        if f"tokenizer.ggml.{key}" in fields:
            add(fields[f"tokenizer.ggml.{key}"].contents())
    if "tokenizer.chat_template" in fields:
        w.add_chat_template(fields["tokenizer.chat_template"].contents())
    return _finish(w, path)
