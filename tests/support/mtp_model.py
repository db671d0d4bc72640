"""A tiny GLM-4.5-style GGUF (``glm4moe``) with one MTP (NextN) layer, random weights, SmolLM2's tokenizer.

Real llama.cpp loads it, runs its trunk as an ordinary target and, in a
second context of type MTP, its NextN block: the smallest model on which
``--draft mtp`` runs end to end. Dense GLM-4 (``glm4``) has no MTP graph in
this llama.cpp; ``glm4moe`` does (``src/models/glm4-moe.cpp``, ``graph_mtp``).
The trunk is dense (``leading_dense_block_count`` = every trunk layer); the
NextN block is a mixture of experts, as llama.cpp's MTP graph requires.

Layout (``load_arch_hparams``/``load_arch_tensors``): ``block_count`` counts
the trunk AND the NextN layers, ``nextn_predict_layers`` says how many of the
last ones are NextN; NextN block ``i`` holds an attention block, an MoE FFN,
and ``nextn.eh_proj`` (2 n_embd -> n_embd over [norm(embedding), norm(hidden)]),
``nextn.enorm``, ``nextn.hnorm``; it shares the token embedding, the final
norm and the output matrix. Numpy shapes are ggml's reversed.

With plain random weights the head's drafts are mostly wrong at temperature 0.
``mix`` < 1 makes a model whose head agrees with its trunk: every context-
dependent part (attention and FFN outputs, trunk and head alike) is scaled by
``mix`` and the head's ``eh_proj`` passes the token's embedding through, so
both compute roughly ``output(norm(embedding(token)))``: mostly a bigram
model, drafted well by its own head, with enough context to reject some drafts.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from tiny_gguf import RandomWeights, add_nextn_inputs, gguf_writer

N_EMBD, N_HEAD, N_HEAD_KV, N_TRUNK, N_NEXTN = 64, 4, 2, 2, 1
N_FF, N_EXPERT, N_EXPERT_USED, N_FF_EXP = 128, 4, 2, 32
HEAD_DIM = N_EMBD // N_HEAD


def write_mtp_model(path: Path, *, seed: int = 0, n_embd: int = N_EMBD, n_trunk: int = N_TRUNK,
                    logit_scale: float = 1.0, mix: float = 1.0, with_head: bool = True) -> Path:
    """Write the model to ``path`` (via ``path.partial``, then renamed) and return ``path``.

    ``logit_scale`` scales the output matrix: larger gives sharper distributions. ``mix``
    scales every block's output (1: plain random weights; see the module notes).
    ``with_head=False`` declares the NextN layer but leaves its weights out, as a
    conversion that strips them does.
    """
    import gguf

    weights = RandomWeights(seed)
    n_head = max(1, n_embd // HEAD_DIM)
    n_head_kv = max(1, n_head // 2)
    normal, ones = weights.normal, weights.ones
    with gguf_writer(path, "glm4moe", "random-glm4moe-mtp-tiny") as (writer, n_vocab):
        writer.add_embedding_length(n_embd)
        writer.add_block_count(n_trunk + N_NEXTN)
        writer.add_uint32("glm4moe.nextn_predict_layers", N_NEXTN)
        writer.add_feed_forward_length(N_FF)
        writer.add_head_count(n_head)
        writer.add_head_count_kv(n_head_kv)
        writer.add_rope_dimension_count(HEAD_DIM)
        writer.add_rope_freq_base(10000.0)
        writer.add_layer_norm_rms_eps(1e-5)
        writer.add_uint32("glm4moe.leading_dense_block_count", n_trunk)
        writer.add_expert_count(N_EXPERT)
        writer.add_expert_used_count(N_EXPERT_USED)
        writer.add_expert_shared_count(1)
        writer.add_expert_feed_forward_length(N_FF_EXP)
        writer.add_expert_weights_scale(1.0)
        writer.add_expert_weights_norm(True)
        writer.add_file_type(gguf.LlamaFileType.ALL_F32)

        writer.add_tensor("token_embd.weight", normal(n_vocab, n_embd, std=1.0))
        writer.add_tensor("output_norm.weight", ones(n_embd))
        # Its own output matrix: tied to the embedding, each token would predict itself forever.
        writer.add_tensor("output.weight", normal(n_vocab, n_embd, std=logit_scale))
        for i in range(n_trunk + (N_NEXTN if with_head else 0)):
            p = f"blk.{i}."
            _add_attention(writer, weights, p, n_embd, n_head, n_head_kv, mix)
            writer.add_tensor(p + "post_attention_norm.weight", ones(n_embd))
            if i < n_trunk:
                writer.add_tensor(p + "ffn_gate.weight", normal(N_FF, n_embd, std=n_embd ** -0.5))
                writer.add_tensor(p + "ffn_up.weight", normal(N_FF, n_embd, std=n_embd ** -0.5))
                writer.add_tensor(p + "ffn_down.weight", normal(n_embd, N_FF, std=mix * N_FF ** -0.5))
                continue
            # The NextN block: an MoE FFN with one shared expert, and the projection that joins the
            # token's embedding with the target's hidden state.
            writer.add_tensor(p + "ffn_gate_inp.weight", normal(N_EXPERT, n_embd, std=n_embd ** -0.5))
            writer.add_tensor(p + "exp_probs_b.bias", np.zeros(N_EXPERT, dtype=np.float32))
            writer.add_tensor(p + "ffn_gate_exps.weight", normal(N_EXPERT, N_FF_EXP, n_embd, std=n_embd ** -0.5))
            writer.add_tensor(p + "ffn_up_exps.weight", normal(N_EXPERT, N_FF_EXP, n_embd, std=n_embd ** -0.5))
            writer.add_tensor(p + "ffn_down_exps.weight", normal(N_EXPERT, n_embd, N_FF_EXP, std=mix * N_FF_EXP ** -0.5))
            writer.add_tensor(p + "ffn_gate_shexp.weight", normal(N_FF_EXP, n_embd, std=n_embd ** -0.5))
            writer.add_tensor(p + "ffn_up_shexp.weight", normal(N_FF_EXP, n_embd, std=n_embd ** -0.5))
            writer.add_tensor(p + "ffn_down_shexp.weight", normal(n_embd, N_FF_EXP, std=mix * N_FF_EXP ** -0.5))
            add_nextn_inputs(writer, weights, p, n_embd, mix)
    return path


if __name__ == "__main__":
    print(write_mtp_model(Path(sys.argv[1] if len(sys.argv) > 1 else "glm4moe-mtp-tiny.gguf")))


# --- several chained heads: Step 3.5 (``step35``) -------------------------------
# Step 3.5 trains one NextN block per draft depth; llama.cpp runs block i when
# ``llama_set_nextn_layer_offset(ctx, i)`` (``src/models/step35.cpp``, ``graph_mtp``).
# Its loader (``load_arch_hparams``) requires a sliding window and a per-layer pattern:
# every layer here is a sliding-window layer whose window is wider than any test's
# context, i.e. plain attention. FFNs are dense (Step 3.5 allows both, trunk and head).
# ``rope.dimension_count`` is halved on full-attention layers; with every layer
# sliding it applies as written.
STEP35_WINDOW = 8192


def write_step35_model(path: Path, *, seed: int = 0, n_heads: int = 2, n_trunk: int = N_TRUNK,
                       logit_scale: float = 1.0, mix: float = 1.0, marked: tuple[int, int] | None = None) -> Path:
    """A tiny ``step35`` GGUF with ``n_heads`` NextN blocks; written to ``path`` (via ``.partial``).

    ``mix`` as in ``write_mtp_model`` (every block agrees with the trunk when small).
    ``marked=(a, b)``: every head after the first gets its own LM head
    (``nextn.shared_head_head``/``shared_head_norm``) that can only rank token ``a``
    or token ``b`` first (the sign of one hidden coordinate decides which), so a draft
    token from a deeper head is recognisable: the first head's drafts are ordinary.
    """
    import gguf

    weights = RandomWeights(seed)
    normal, ones = weights.normal, weights.ones
    n_embd, n_head, n_head_kv = N_EMBD, N_HEAD, N_HEAD_KV
    n_layers = n_trunk + n_heads
    with gguf_writer(path, "step35", "random-step35-mtp-tiny") as (writer, n_vocab):
        writer.add_embedding_length(n_embd)
        writer.add_block_count(n_layers)
        writer.add_uint32("step35.nextn_predict_layers", n_heads)
        writer.add_feed_forward_length(N_FF)
        writer.add_uint32("step35.expert_feed_forward_length", N_FF_EXP)  # required; no layer is MoE
        writer.add_head_count(n_head)
        writer.add_head_count_kv(n_head_kv)
        writer.add_rope_dimension_count(HEAD_DIM)
        writer.add_rope_freq_base(10000.0)
        writer.add_layer_norm_rms_eps(1e-5)
        writer.add_sliding_window(STEP35_WINDOW)
        writer.add_array("step35.attention.sliding_window_pattern", [True] * n_layers)
        writer.add_file_type(gguf.LlamaFileType.ALL_F32)

        writer.add_tensor("token_embd.weight", normal(n_vocab, n_embd, std=1.0))
        writer.add_tensor("output_norm.weight", ones(n_embd))
        writer.add_tensor("output.weight", normal(n_vocab, n_embd, std=logit_scale))
        for i in range(n_layers):
            p = f"blk.{i}."
            _add_attention(writer, weights, p, n_embd, n_head, n_head_kv, mix)
            writer.add_tensor(p + "ffn_norm.weight", ones(n_embd))
            writer.add_tensor(p + "ffn_gate.weight", normal(N_FF, n_embd, std=n_embd ** -0.5))
            writer.add_tensor(p + "ffn_up.weight", normal(N_FF, n_embd, std=n_embd ** -0.5))
            writer.add_tensor(p + "ffn_down.weight", normal(n_embd, N_FF, std=mix * N_FF ** -0.5))
            if i < n_trunk:
                continue
            add_nextn_inputs(writer, weights, p, n_embd, mix)
            if marked is not None and i > n_trunk:
                # Only hidden coordinate 0 survives the norm; its sign picks a (positive) or b.
                norm = np.zeros(n_embd, dtype=np.float32)
                norm[0] = 1.0
                head = np.zeros((n_vocab, n_embd), dtype=np.float32)
                head[marked[0], 0], head[marked[1], 0] = 50.0, -50.0
                writer.add_tensor(p + "nextn.shared_head_norm.weight", norm)
                writer.add_tensor(p + "nextn.shared_head_head.weight", head)
    return path


def _add_attention(writer, weights: RandomWeights, p: str, n_embd: int, n_head: int, n_head_kv: int,  # noqa: ANN001
                   mix: float) -> None:
    """A block's attention: its norm and the q, k, v and output matrices (output scaled by ``mix``)."""
    normal = weights.normal
    writer.add_tensor(p + "attn_norm.weight", weights.ones(n_embd))
    writer.add_tensor(p + "attn_q.weight", normal(n_head * HEAD_DIM, n_embd, std=n_embd ** -0.5))
    writer.add_tensor(p + "attn_k.weight", normal(n_head_kv * HEAD_DIM, n_embd, std=n_embd ** -0.5))
    writer.add_tensor(p + "attn_v.weight", normal(n_head_kv * HEAD_DIM, n_embd, std=n_embd ** -0.5))
    writer.add_tensor(p + "attn_output.weight",
                      normal(n_embd, n_head * HEAD_DIM, std=mix * (n_head * HEAD_DIM) ** -0.5))
