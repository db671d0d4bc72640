"""A tiny Mamba GGUF with random weights and SmolLM2's tokenizer: a recurrent model real llama.cpp loads.

Its cache is a running state, not an entry per token, so it cannot roll back:
the model the engine must refuse to speculate with (as target or as draft),
while plain decoding works. The tokenizer is SmolLM2's (the GPU check's
``benchmarks/gpu/tokenizer.json.gz``), so it passes the draft-compatibility
check against SmolLM2 and reaches the rollback check.

Tensor names, shapes and keys follow llama.cpp's Mamba loader
(``src/models/mamba.cpp``: ``load_arch_hparams``, ``load_arch_tensors``);
numpy shapes are ggml's reversed. llama.cpp supports only d_inner = 2 n_embd.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tiny_gguf import RandomWeights, gguf_writer

N_EMBD, N_LAYER, D_STATE, D_CONV, DT_RANK = 64, 2, 16, 4, 4
D_INNER = 2 * N_EMBD


def write_mamba(path: Path, *, seed: int = 0) -> Path:
    """Write the model to ``path`` (via ``path.partial``, then renamed) and return ``path``."""
    import gguf

    weights = RandomWeights(seed)
    normal = weights.normal
    with gguf_writer(path, "mamba", "random-mamba-tiny") as (writer, n_vocab):
        writer.add_embedding_length(N_EMBD)
        writer.add_block_count(N_LAYER)
        writer.add_feed_forward_length(0)  # no FFN, no attention: what convert_hf_to_gguf.py writes for Mamba
        writer.add_head_count(0)
        writer.add_ssm_conv_kernel(D_CONV)
        writer.add_ssm_inner_size(D_INNER)
        writer.add_ssm_state_size(D_STATE)
        writer.add_ssm_time_step_rank(DT_RANK)
        writer.add_layer_norm_rms_eps(1e-5)
        writer.add_file_type(gguf.LlamaFileType.ALL_F32)

        writer.add_tensor("token_embd.weight", normal(n_vocab, N_EMBD, std=1.0))
        writer.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        # Its own output matrix: tied to the embedding, each token would predict itself forever.
        writer.add_tensor("output.weight", normal(n_vocab, N_EMBD, std=1.0))
        # A = -[1..d_state] per channel and dt ~ softplus(-4.6) ~ 0.01: Mamba's own initialisation, a stable scan.
        ssm_a = -np.tile(np.arange(1, D_STATE + 1, dtype=np.float32), (D_INNER, 1))
        for i in range(N_LAYER):
            p = f"blk.{i}."
            writer.add_tensor(p + "attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
            writer.add_tensor(p + "ssm_in.weight", normal(2 * D_INNER, N_EMBD, std=N_EMBD ** -0.5))
            writer.add_tensor(p + "ssm_conv1d.weight", normal(D_INNER, D_CONV, std=D_CONV ** -0.5))
            writer.add_tensor(p + "ssm_conv1d.bias", np.zeros(D_INNER, dtype=np.float32))
            writer.add_tensor(p + "ssm_x.weight", normal(DT_RANK + 2 * D_STATE, D_INNER, std=D_INNER ** -0.5))
            writer.add_tensor(p + "ssm_dt.weight", normal(D_INNER, DT_RANK, std=DT_RANK ** -0.5))
            writer.add_tensor(p + "ssm_dt.bias", np.full(D_INNER, -4.6, dtype=np.float32))
            writer.add_tensor(p + "ssm_a", ssm_a)  # no ".weight" suffix for A and D
            writer.add_tensor(p + "ssm_d", np.ones(D_INNER, dtype=np.float32))
            writer.add_tensor(p + "ssm_out.weight", normal(N_EMBD, D_INNER, std=D_INNER ** -0.5))
    return path
