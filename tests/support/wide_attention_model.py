"""A tiny Llama-architecture GGUF whose attention is wide: 64 query heads of 256 dimensions over a
64-wide residual stream, random weights, SmolLM2's tokenizer.

Its point is the size of flash attention's work, not the text it writes. With localspec's
batch-invariant switch, ggml's CPU kernel (scripts/llama.cpp-patches/10-fa-batch-invariant.patch)
cuts every query row's cells into 128-cell chunks and merges their partial softmaxes in order. It
keeps every (row, chunk) partial, so any thread can take any chunk, while they fit in 16 MiB;
past that each thread takes whole rows and merges as it goes. Here a one-token decode after the
self-test's 512-token prompt fits (64 rows), and a 65-token verification batch does not
(4,160 rows): the two sides of the bit-for-bit comparison take the two paths.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tiny_gguf import RandomWeights, add_llama, gguf_writer

N_EMBD, N_HEAD, N_HEAD_KV, HEAD_DIM, N_LAYER, N_FF = 64, 64, 1, 256, 2, 128


def write_wide_attention_model(path: Path, *, seed: int = 0, n_head: int = N_HEAD, n_head_kv: int = N_HEAD_KV,
                               head_dim: int = HEAD_DIM) -> Path:
    """Write the model to ``path`` (via ``path.partial``, then renamed) and return ``path``. Other head
    counts and sizes make other attention shapes for ``benchmarks/bench_cpu_switch.py`` (e.g. fewer
    query heads than threads, where a decode's attention has fewer rows than threads)."""
    with gguf_writer(path, "llama", "random-llama-wide-attention") as (writer, n_vocab):
        add_llama(writer, RandomWeights(seed), n_vocab, n_embd=N_EMBD, n_layer=N_LAYER, n_ff=N_FF, n_head=n_head,
                  n_head_kv=n_head_kv, head_dim=head_dim)
    return path


if __name__ == "__main__":  # python tests/support/wide_attention_model.py [PATH [N_HEAD [N_HEAD_KV [HEAD_DIM]]]]
    shape = dict(zip(("n_head", "n_head_kv", "head_dim"), map(int, sys.argv[2:5])))
    print(write_wide_attention_model(Path(sys.argv[1] if len(sys.argv) > 1 else "llama-wide-attention.gguf"),
                                     **shape))
