"""What the tests' tiny random-weight GGUFs share: SmolLM2's tokenizer, seeded weights, an all-or-nothing write.

The tokenizer is the GPU check's copy of SmolLM2's (``benchmarks/gpu/tokenizer.json.gz``), so each
tiny model shares SmolLM2's vocabulary and passes the draft-compatibility check against it.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Any, Iterator

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "gpu"))
import tokenizer as tokenizer_file  # noqa: E402  (benchmarks/gpu/tokenizer.py)


class RandomWeights:
    """Seeded float32 tensors."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def normal(self, *shape: int, std: float) -> np.ndarray:
        return self.rng.normal(0.0, std, size=shape).astype(np.float32)

    @staticmethod
    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)


@contextlib.contextmanager
def gguf_writer(path: Path, arch: str, name: str, *, chat_template: str | None = None) -> Iterator[tuple[Any, int]]:
    """A ``gguf.GGUFWriter`` for ``arch`` with its name, a 4096-token context and SmolLM2's tokenizer set,
    and the vocabulary size. The block adds the rest; the file is written to ``path.partial`` and renamed
    to ``path`` only when the block ends without an error. ``chat_template``: another family's template
    in place of SmolLM2's."""
    import gguf

    tok = tokenizer_file.load()
    if chat_template is not None:
        tok = {**tok, "chat_template": chat_template}
    tmp = path.with_name(path.name + ".partial")
    writer = gguf.GGUFWriter(str(tmp), arch)
    writer.add_name(name)
    writer.add_context_length(4096)
    tokenizer_file.add_to_writer(writer, tok)
    yield writer, len(tok["tokens"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(tmp, path)


def add_llama(writer: Any, weights: RandomWeights, n_vocab: int, *, n_embd: int, n_layer: int, n_ff: int,
              n_head: int, n_head_kv: int, head_dim: int) -> None:
    """A Llama-architecture model's hyperparameters and seeded f32 tensors (embedding and output at
    std 1, projections scaled by their fan-in), in one fixed order: the same seed, the same model."""
    import gguf

    normal, ones = weights.normal, weights.ones
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tensor("token_embd.weight", normal(n_vocab, n_embd, std=1.0))
    writer.add_tensor("output_norm.weight", ones(n_embd))
    writer.add_tensor("output.weight", normal(n_vocab, n_embd, std=1.0))
    q_width = n_head * head_dim
    for i in range(n_layer):
        p = f"blk.{i}."
        writer.add_tensor(p + "attn_norm.weight", ones(n_embd))
        writer.add_tensor(p + "attn_q.weight", normal(q_width, n_embd, std=n_embd ** -0.5))
        writer.add_tensor(p + "attn_k.weight", normal(n_head_kv * head_dim, n_embd, std=n_embd ** -0.5))
        writer.add_tensor(p + "attn_v.weight", normal(n_head_kv * head_dim, n_embd, std=n_embd ** -0.5))
        writer.add_tensor(p + "attn_output.weight", normal(n_embd, q_width, std=q_width ** -0.5))
        writer.add_tensor(p + "ffn_norm.weight", ones(n_embd))
        writer.add_tensor(p + "ffn_gate.weight", normal(n_ff, n_embd, std=n_embd ** -0.5))
        writer.add_tensor(p + "ffn_up.weight", normal(n_ff, n_embd, std=n_embd ** -0.5))
        writer.add_tensor(p + "ffn_down.weight", normal(n_embd, n_ff, std=n_ff ** -0.5))


def add_nextn_inputs(writer: Any, weights: RandomWeights, prefix: str, n_embd: int, mix: float) -> None:
    """A NextN block's input side: ``eh_proj`` (2 n_embd -> n_embd over [norm(embedding), norm(hidden)])
    and the two norms. ``mix`` < 1 adds the identity on the embedding half, so the block mostly
    passes the embedding on (a head that agrees with its trunk; see mtp_model)."""
    eh_proj = weights.normal(n_embd, 2 * n_embd, std=mix * (2 * n_embd) ** -0.5)
    if mix < 1.0:
        eh_proj[:, :n_embd] += np.eye(n_embd, dtype=np.float32)
    writer.add_tensor(prefix + "nextn.eh_proj.weight", eh_proj)
    writer.add_tensor(prefix + "nextn.enorm.weight", weights.ones(n_embd))
    writer.add_tensor(prefix + "nextn.hnorm.weight", weights.ones(n_embd))
