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
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(path.stem)
    w.add_block_count(1)
    w.add_context_length(256)
    w.add_embedding_length(8)
    w.add_feed_forward_length(16)
    w.add_head_count(2)
    w.add_head_count_kv(1)
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
    w.add_tensor("blk.0.attn_norm.weight", np.ones(8, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
