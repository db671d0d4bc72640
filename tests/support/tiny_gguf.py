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
