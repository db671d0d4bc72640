"""A tiny LFM2 GGUF with random weights and SmolLM2's tokenizer: a hybrid model real llama.cpp can roll back.

LFM2 interleaves short-convolution layers (a recurrent state: the last
``l_cache - 1`` inputs of each channel) with attention layers (a KV cache). It
is on llama.cpp's list of architectures whose recurrent state keeps per-token
snapshots (``llm_arch_supports_rs_rollback``), so with ``n_rs_seq`` snapshots a
context can take back up to that many tokens of its last batch. The tokenizer
is SmolLM2's (``benchmarks/gpu/tokenizer.json.gz``), as in ``mamba_model.py``,
so it pairs with SmolLM2 and with another random LFM2 as a draft.

Tensor names, shapes and keys follow llama.cpp's LFM2 loader
(``src/models/lfm2.cpp``: ``load_arch_hparams``, ``load_arch_tensors``); a layer
is a convolution layer where ``head_count_kv`` is 0. numpy shapes are ggml's
reversed. The scales keep every residual branch near unit size and put the
logits' spread at about 3, so greedy output varies from token to token and a
temperature-1 distribution has a few dozen likely tokens (what a chi-square
test needs).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tiny_gguf import RandomWeights, add_nextn_inputs, gguf_writer

N_EMBD, N_FF, N_HEAD, N_HEAD_KV, L_CACHE = 64, 128, 4, 2, 3
# conv, conv, attention, conv, attention, conv: LFM2's own pattern in miniature.
LAYERS = ("conv", "conv", "attn", "conv", "attn", "conv")
HEAD_DIM = N_EMBD // N_HEAD


def write_lfm2(path: Path, *, seed: int = 0, logit_scale: float = 0.4, perturb: float = 0.0) -> Path:
    """Write the model to ``path`` (via ``path.partial``, then renamed) and return ``path``.

    ``logit_scale`` is the standard deviation of the output matrix's entries; the
    logits' spread is about ``logit_scale * sqrt(N_EMBD)``. ``perturb`` > 0 adds
    independent noise of that relative size to the output matrix: with ``perturb``
    0.1 the model agrees with the unperturbed one on about half of its greedy
    choices, a draft that is sometimes accepted and sometimes not.
    """
    import gguf

    weights = RandomWeights(seed)
    normal, ones = weights.normal, weights.ones
    with gguf_writer(path, "lfm2", f"random-lfm2-tiny-{seed}") as (writer, n_vocab):
        writer.add_embedding_length(N_EMBD)
        writer.add_block_count(len(LAYERS))
        writer.add_feed_forward_length(N_FF)
        writer.add_head_count(N_HEAD)
        writer.add_head_count_kv([N_HEAD_KV if kind == "attn" else 0 for kind in LAYERS])
        writer.add_rope_freq_base(10000.0)
        writer.add_layer_norm_rms_eps(1e-5)
        writer.add_shortconv_l_cache(L_CACHE)
        writer.add_file_type(gguf.LlamaFileType.ALL_F32)

        writer.add_tensor("token_embd.weight", normal(n_vocab, N_EMBD, std=1.0))
        writer.add_tensor("token_embd_norm.weight", ones(N_EMBD))  # LFM2's final norm keeps this name
        # Its own output matrix: tied to the embedding, each token would predict itself.
        output = normal(n_vocab, N_EMBD, std=logit_scale)
        if perturb:
            noise = np.random.default_rng(seed + 1_000_003).normal(0.0, perturb * logit_scale, size=output.shape)
            output += noise.astype(np.float32)
        writer.add_tensor("output.weight", output)
        for i, kind in enumerate(LAYERS):
            p = f"blk.{i}."
            writer.add_tensor(p + "attn_norm.weight", ones(N_EMBD))
            writer.add_tensor(p + "ffn_norm.weight", ones(N_EMBD))
            writer.add_tensor(p + "ffn_gate.weight", normal(N_FF, N_EMBD, std=N_EMBD ** -0.5))
            writer.add_tensor(p + "ffn_up.weight", normal(N_FF, N_EMBD, std=N_EMBD ** -0.5))
            writer.add_tensor(p + "ffn_down.weight", normal(N_EMBD, N_FF, std=N_FF ** -0.5))
            if kind == "attn":
                writer.add_tensor(p + "attn_q.weight", normal(N_EMBD, N_EMBD, std=N_EMBD ** -0.5))
                writer.add_tensor(p + "attn_k.weight", normal(N_HEAD_KV * HEAD_DIM, N_EMBD, std=N_EMBD ** -0.5))
                writer.add_tensor(p + "attn_v.weight", normal(N_HEAD_KV * HEAD_DIM, N_EMBD, std=N_EMBD ** -0.5))
                writer.add_tensor(p + "attn_q_norm.weight", ones(HEAD_DIM))
                writer.add_tensor(p + "attn_k_norm.weight", ones(HEAD_DIM))
                writer.add_tensor(p + "attn_output.weight", normal(N_EMBD, N_EMBD, std=N_EMBD ** -0.5))
            else:
                # in_proj gives B, C and x; the gated input B*x is convolved over the last L_CACHE tokens.
                writer.add_tensor(p + "shortconv.in_proj.weight", normal(3 * N_EMBD, N_EMBD, std=N_EMBD ** -0.5))
                writer.add_tensor(p + "shortconv.conv.weight", normal(N_EMBD, L_CACHE, std=L_CACHE ** -0.5))
                writer.add_tensor(p + "shortconv.out_proj.weight", normal(N_EMBD, N_EMBD, std=N_EMBD ** -0.5))
    return path


# --- Qwen3.5: Gated DeltaNet layers, attention every 4th layer, one MTP layer ---------------
# ``src/models/qwen35.cpp``: a recurrent layer holds attn_qkv (q, k of ssm_group_count heads of
# ssm_state_size, v of ssm_time_step_rank heads), attn_gate (z), a short convolution over the
# qkv channels (ssm_conv1d), ssm_a/ssm_dt/ssm_alpha/ssm_beta (the delta rule's decay and step),
# ssm_norm (gated RMS norm) and ssm_out; an attention layer a gated query (q and its gate: twice
# the heads' width), q/k norms; every layer a post-attention norm and a dense FFN. The NextN
# block is an attention block with nextn.eh_proj/enorm/hnorm. Rope is M-RoPE (dimension_sections);
# text tokens use one position, which llama.cpp spreads over the sections.
QWEN35_TRUNK = 4  # layers 0-2 recurrent, layer 3 attention (full_attention_interval 4)
D_STATE, N_GROUP, DT_RANK, D_CONV = 16, 2, 4, 4


def write_qwen35(path: Path, *, seed: int = 0, logit_scale: float = 1.0, mix: float = 1.0) -> Path:
    """A tiny ``qwen35`` with one MTP layer; ``mix`` < 1 makes head and trunk agree (see mtp_model)."""
    import gguf

    weights = RandomWeights(seed)
    normal, ones = weights.normal, weights.ones
    key_dim, value_dim = D_STATE * N_GROUP, D_STATE * DT_RANK
    conv_dim = 2 * key_dim + value_dim
    with gguf_writer(path, "qwen35", f"random-qwen35-mtp-tiny-{seed}") as (writer, n_vocab):
        writer.add_embedding_length(N_EMBD)
        writer.add_block_count(QWEN35_TRUNK + 1)
        writer.add_uint32("qwen35.nextn_predict_layers", 1)
        writer.add_feed_forward_length(N_FF)
        writer.add_head_count(N_HEAD)
        writer.add_head_count_kv(N_HEAD_KV)
        writer.add_key_length(HEAD_DIM)
        writer.add_value_length(HEAD_DIM)
        writer.add_rope_dimension_count(HEAD_DIM)
        writer.add_rope_dimension_sections([3, 3, 2, 0])
        writer.add_rope_freq_base(10000.0)
        writer.add_layer_norm_rms_eps(1e-6)
        writer.add_ssm_conv_kernel(D_CONV)
        writer.add_ssm_inner_size(value_dim)
        writer.add_ssm_state_size(D_STATE)
        writer.add_ssm_time_step_rank(DT_RANK)
        writer.add_ssm_group_count(N_GROUP)
        writer.add_uint32("qwen35.full_attention_interval", 4)
        writer.add_file_type(gguf.LlamaFileType.ALL_F32)

        writer.add_tensor("token_embd.weight", normal(n_vocab, N_EMBD, std=1.0))
        writer.add_tensor("output_norm.weight", ones(N_EMBD))
        writer.add_tensor("output.weight", normal(n_vocab, N_EMBD, std=logit_scale))
        for i in range(QWEN35_TRUNK + 1):
            p = f"blk.{i}."
            writer.add_tensor(p + "attn_norm.weight", ones(N_EMBD))
            writer.add_tensor(p + "post_attention_norm.weight", ones(N_EMBD))
            writer.add_tensor(p + "ffn_gate.weight", normal(N_FF, N_EMBD, std=N_EMBD ** -0.5))
            writer.add_tensor(p + "ffn_up.weight", normal(N_FF, N_EMBD, std=N_EMBD ** -0.5))
            writer.add_tensor(p + "ffn_down.weight", normal(N_EMBD, N_FF, std=mix * N_FF ** -0.5))
            if i < QWEN35_TRUNK - 1:
                writer.add_tensor(p + "attn_qkv.weight", normal(conv_dim, N_EMBD, std=N_EMBD ** -0.5))
                writer.add_tensor(p + "attn_gate.weight", normal(value_dim, N_EMBD, std=N_EMBD ** -0.5))
                writer.add_tensor(p + "ssm_conv1d.weight", normal(conv_dim, D_CONV, std=D_CONV ** -0.5))
                writer.add_tensor(p + "ssm_dt.bias", np.zeros(DT_RANK, dtype=np.float32))
                writer.add_tensor(p + "ssm_a", -np.ones(DT_RANK, dtype=np.float32))
                writer.add_tensor(p + "ssm_beta.weight", normal(DT_RANK, N_EMBD, std=N_EMBD ** -0.5))
                writer.add_tensor(p + "ssm_alpha.weight", normal(DT_RANK, N_EMBD, std=N_EMBD ** -0.5))
                writer.add_tensor(p + "ssm_norm.weight", ones(D_STATE))
                writer.add_tensor(p + "ssm_out.weight", normal(N_EMBD, value_dim, std=mix * value_dim ** -0.5))
                continue
            writer.add_tensor(p + "attn_q.weight", normal(2 * N_HEAD * HEAD_DIM, N_EMBD, std=N_EMBD ** -0.5))
            writer.add_tensor(p + "attn_k.weight", normal(N_HEAD_KV * HEAD_DIM, N_EMBD, std=N_EMBD ** -0.5))
            writer.add_tensor(p + "attn_v.weight", normal(N_HEAD_KV * HEAD_DIM, N_EMBD, std=N_EMBD ** -0.5))
            writer.add_tensor(p + "attn_q_norm.weight", ones(HEAD_DIM))
            writer.add_tensor(p + "attn_k_norm.weight", ones(HEAD_DIM))
            writer.add_tensor(p + "attn_output.weight",
                              normal(N_EMBD, N_HEAD * HEAD_DIM, std=mix * (N_HEAD * HEAD_DIM) ** -0.5))
            if i == QWEN35_TRUNK:
                add_nextn_inputs(writer, weights, p, N_EMBD, mix)
    return path
