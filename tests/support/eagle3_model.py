"""A tiny dense ``llama`` target and an ``eagle3`` draft for it: random weights, SmolLM2's tokenizer.

The target is a plain llama (``src/models/llama.cpp`` sets ``t_layer_inp`` for every
layer, so its layer inputs can be tapped). The draft follows llama.cpp's
``src/models/eagle3.cpp``: an encoder ``fc`` (3 n_embd_tgt -> n_embd) over the
three tapped layers' inputs, and one decoder block whose attention reads
``[norm(embedding(token)), norm(g)]`` (2 n_embd wide), with the residual on ``g``.
It has neither ``token_embd`` nor ``output``: it borrows the target's (the
context is created with ``ctx_other``), as the EAGLE-3 drafts for Llama 3.1 8B do.

With plain random weights its drafts are mostly wrong. ``agree=True`` builds a
draft that agrees with its target often, as ``mtp_model`` does for a NextN head:
the target's blocks are scaled by ``mix`` (so it computes roughly
``output(norm(embedding(token)))``, mostly a bigram model), and the draft's
attention attends to its own position (q = k = the token embedding half, scaled
up: a token's embedding is far more similar to itself than to any other's) and
passes that embedding on through V and the output, while ``g`` and the FFN add a
little. At decoder row P the token is ``x_{P+1}``, so the draft predicts
roughly ``output(norm(embedding(x_{P+1})))``: what the target predicts there.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from tiny_gguf import RandomWeights, gguf_writer

N_EMBD, N_HEAD, N_HEAD_KV, N_LAYER, N_FF = 64, 4, 2, 4, 128
HEAD_DIM = N_EMBD // N_HEAD
TARGET_LAYERS = (0, 1, 3)


def _common_hparams(writer, n_embd: int, n_head: int, n_head_kv: int, n_layer: int, n_ff: int) -> None:
    import gguf

    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_rope_dimension_count(n_embd // n_head)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)


def write_llama_target(path: Path, *, seed: int = 0, mix: float = 1.0, logit_scale: float = 1.0,
                       n_embd: int = N_EMBD, n_layer: int = N_LAYER) -> Path:
    """A dense llama of ``n_layer`` layers; ``mix`` scales every block's output (see the module notes)."""
    weights = RandomWeights(seed)
    normal, ones = weights.normal, weights.ones
    n_head = n_embd // HEAD_DIM
    n_head_kv = max(1, n_head // 2)
    with gguf_writer(path, "llama", "random-llama-tiny") as (writer, n_vocab):
        _common_hparams(writer, n_embd, n_head, n_head_kv, n_layer, N_FF)
        writer.add_tensor("token_embd.weight", normal(n_vocab, n_embd, std=1.0))
        writer.add_tensor("output_norm.weight", ones(n_embd))
        writer.add_tensor("output.weight", normal(n_vocab, n_embd, std=logit_scale))
        for i in range(n_layer):
            p = f"blk.{i}."
            writer.add_tensor(p + "attn_norm.weight", ones(n_embd))
            writer.add_tensor(p + "attn_q.weight", normal(n_head * HEAD_DIM, n_embd, std=n_embd ** -0.5))
            writer.add_tensor(p + "attn_k.weight", normal(n_head_kv * HEAD_DIM, n_embd, std=n_embd ** -0.5))
            writer.add_tensor(p + "attn_v.weight", normal(n_head_kv * HEAD_DIM, n_embd, std=n_embd ** -0.5))
            writer.add_tensor(p + "attn_output.weight", normal(n_embd, n_head * HEAD_DIM, std=mix * n_embd ** -0.5))
            writer.add_tensor(p + "ffn_norm.weight", ones(n_embd))
            writer.add_tensor(p + "ffn_gate.weight", normal(N_FF, n_embd, std=n_embd ** -0.5))
            writer.add_tensor(p + "ffn_up.weight", normal(N_FF, n_embd, std=n_embd ** -0.5))
            writer.add_tensor(p + "ffn_down.weight", normal(n_embd, N_FF, std=mix * N_FF ** -0.5))
    return path


def write_eagle3_draft(path: Path, *, seed: int = 1, agree: bool = False, target_n_embd: int = N_EMBD,
                       target_layers: Sequence[int] = TARGET_LAYERS, n_embd: int = N_EMBD) -> Path:
    """An ``eagle3`` draft reading ``target_layers`` of a target ``target_n_embd`` wide.

    ``n_embd`` must equal the target's width for the borrowed token embedding and
    output matrix to fit (tests of the refusals write others).
    """
    weights = RandomWeights(seed)
    normal, ones = weights.normal, weights.ones
    n_head = n_embd // HEAD_DIM
    n_head_kv = n_head  # q and k are built alike (self-attention by content)
    n_enc = len(target_layers) * target_n_embd
    with gguf_writer(path, "eagle3", "random-eagle3-tiny") as (writer, _n_vocab):
        _common_hparams(writer, n_embd, n_head, n_head_kv, 1, N_FF)
        writer.add_array("eagle3.target_layers", [int(i) for i in target_layers])
        writer.add_uint32("eagle3.target_hidden_size", target_n_embd)
        small = 0.1 if agree else 1.0
        writer.add_tensor("fc.weight", normal(n_embd, n_enc, std=small * n_enc ** -0.5))
        writer.add_tensor("output_norm.weight", ones(n_embd))
        p = "blk.0."
        writer.add_tensor(p + "attn_norm.weight", ones(n_embd))
        writer.add_tensor(p + "attn_norm_2.weight", ones(n_embd))
        if agree:
            # Attention on the embedding half only; q = k, so each row attends to itself (or to an
            # earlier copy of its own token, whose V is the same).
            select = np.zeros((n_embd, 2 * n_embd), dtype=np.float32)
            select[:, :n_embd] = np.eye(n_embd, dtype=np.float32)
            writer.add_tensor(p + "attn_q.weight", 3.0 * select)
            writer.add_tensor(p + "attn_k.weight", 3.0 * select)
            writer.add_tensor(p + "attn_v.weight", select)
            writer.add_tensor(p + "attn_output.weight", np.eye(n_embd, dtype=np.float32))
            ffn_down_std = 0.1 * N_FF ** -0.5
        else:
            writer.add_tensor(p + "attn_q.weight", normal(n_embd, 2 * n_embd, std=(2 * n_embd) ** -0.5))
            writer.add_tensor(p + "attn_k.weight", normal(n_embd, 2 * n_embd, std=(2 * n_embd) ** -0.5))
            writer.add_tensor(p + "attn_v.weight", normal(n_embd, 2 * n_embd, std=(2 * n_embd) ** -0.5))
            writer.add_tensor(p + "attn_output.weight", normal(n_embd, n_embd, std=n_embd ** -0.5))
            ffn_down_std = N_FF ** -0.5
        writer.add_tensor(p + "ffn_norm.weight", ones(n_embd))
        writer.add_tensor(p + "ffn_gate.weight", normal(N_FF, n_embd, std=n_embd ** -0.5))
        writer.add_tensor(p + "ffn_up.weight", normal(N_FF, n_embd, std=n_embd ** -0.5))
        writer.add_tensor(p + "ffn_down.weight", normal(n_embd, N_FF, std=ffn_down_std))
    return path


# --- DFlash ---------------------------------------------------------------------------
# A DFlash draft (src/models/dflash.cpp, the plain DFlash-1 graph) for the same target. Its
# decoder takes two kinds of batch: embedding rows (the target's tapped layer inputs at a
# position), which it projects (``fc``, then ``enc.output_norm``) and writes into its K/V cache
# at that position; and a token block ``[x_last, MASK, MASK, ...]``, attended non-causally
# over the cache, whose row i predicts the token i places after ``x_last``. Its features are
# ``len(target_layers) x n_embd`` wide, the draft's own width: it must be the target's.
#
# ``agree=True``: the draft carries its own copy of the target's token embedding with the mask
# token's row zeroed (and a copy of its output matrix), so a mask row has no query (it attends uniformly) and adds nothing to its
# residual; the injected rows are scaled almost to nothing (``enc.output_norm``) and the FFN is
# tiny. A mask row then holds, after the final norm, mostly ``norm(embedding(x_last))``: each
# row drafts what the target (a bigram model, see above) predicts after ``x_last``. The first
# draft agrees often, deeper ones rarely: both branches of the acceptance rule run.
DFLASH_BLOCK = 4


def target_embedding_and_output(seed: int = 0, logit_scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """The token embedding and output matrix ``write_llama_target(seed=seed)`` writes (its first two draws)."""
    import tokenizer as tokenizer_file  # benchmarks/gpu/tokenizer.py, on the path by tiny_gguf

    n_vocab = len(tokenizer_file.load()["tokens"])
    weights = RandomWeights(seed)
    return weights.normal(n_vocab, N_EMBD, std=1.0), weights.normal(n_vocab, N_EMBD, std=logit_scale)


def write_dflash_draft(path: Path, *, seed: int = 2, agree: bool = False, target_seed: int = 0,
                       target_layers: Sequence[int] = TARGET_LAYERS, n_embd: int = N_EMBD,
                       n_layer: int = 1, block_size: int | None = DFLASH_BLOCK, mask_token: int | None = None,
                       markov_rank: int = 0, anchor_first: bool | None = None, confidence: bool = False) -> Path:
    """A ``dflash`` draft reading ``target_layers`` of ``write_llama_target(seed=target_seed)``.

    ``markov_rank`` > 0 makes it a DSpark draft: a Markov head of that rank (``markov_w1``,
    ``markov_w2``, small enough that an ``agree`` draft still agrees), trained anchor first unless
    ``anchor_first`` is False (None: the key is left out, which means anchor first), with a
    confidence head when ``confidence``. ``block_size`` None leaves ``dflash.block_size`` out."""
    weights = RandomWeights(seed)
    normal, ones = weights.normal, weights.ones
    n_head = n_embd // HEAD_DIM
    n_head_kv = n_head if agree else max(1, n_head // 2)
    n_enc = len(target_layers) * n_embd
    with gguf_writer(path, "dflash", "random-dflash-tiny") as (writer, n_vocab):
        _common_hparams(writer, n_embd, n_head, n_head_kv, n_layer, N_FF)
        writer.add_array("dflash.target_layers", [int(i) for i in target_layers])
        if block_size is not None:
            writer.add_uint32("dflash.block_size", block_size)
        mask = n_vocab - 1 if mask_token is None else mask_token
        writer.add_mask_token_id(mask)
        writer.add_tensor("fc.weight", normal(n_embd, n_enc, std=n_enc ** -0.5))
        writer.add_tensor("enc.output_norm.weight", np.full(n_embd, 1e-3 if agree else 1.0, dtype=np.float32))
        writer.add_tensor("output_norm.weight", ones(n_embd))
        if agree:
            embd, output = target_embedding_and_output(target_seed)
            embd[mask] = 0.0
            writer.add_tensor("token_embd.weight", embd)
            # With its own embedding and no output matrix llama.cpp would tie the two: copy the target's.
            writer.add_tensor("output.weight", output)
        for i in range(n_layer):
            p = f"blk.{i}."
            writer.add_tensor(p + "attn_norm.weight", ones(n_embd))
            writer.add_tensor(p + "attn_q.weight", normal(n_head * HEAD_DIM, n_embd, std=n_embd ** -0.5))
            writer.add_tensor(p + "attn_k.weight", normal(n_head_kv * HEAD_DIM, n_embd, std=n_embd ** -0.5))
            if agree:  # V and the output pass the (averaged) embedding on
                writer.add_tensor(p + "attn_v.weight", np.eye(n_embd, dtype=np.float32))
                writer.add_tensor(p + "attn_output.weight", np.eye(n_embd, dtype=np.float32))
            else:
                writer.add_tensor(p + "attn_v.weight", normal(n_head_kv * HEAD_DIM, n_embd, std=n_embd ** -0.5))
                writer.add_tensor(p + "attn_output.weight", normal(n_embd, n_head * HEAD_DIM, std=n_embd ** -0.5))
            writer.add_tensor(p + "attn_q_norm.weight", ones(HEAD_DIM))
            writer.add_tensor(p + "attn_k_norm.weight", ones(HEAD_DIM))
            writer.add_tensor(p + "ffn_norm.weight", ones(n_embd))
            writer.add_tensor(p + "ffn_gate.weight", normal(N_FF, n_embd, std=n_embd ** -0.5))
            writer.add_tensor(p + "ffn_up.weight", normal(N_FF, n_embd, std=n_embd ** -0.5))
            writer.add_tensor(p + "ffn_down.weight", normal(n_embd, N_FF, std=(1e-3 if agree else 1.0) * N_FF ** -0.5))
        if markov_rank:
            _add_markov_head(writer, weights, n_vocab, n_embd, markov_rank, anchor_first, confidence)
    return path


def _add_markov_head(writer, weights: RandomWeights, n_vocab: int, n_embd: int, rank: int,
                     anchor_first: bool | None, confidence: bool) -> None:
    """DSpark's heads (src/models/dflash.cpp): the bias ``markov_w2 @ markov_w1[prev]`` on each row's logits,
    and ``sigmoid(conf_proj . [row; markov_w1[prev]] + b)``, a row's confidence."""
    if anchor_first is not None:
        writer.add_bool("dflash.sample_from_anchor", anchor_first)
    writer.add_bool("dflash.has_confidence_head", confidence)
    writer.add_tensor("markov_w1.weight", weights.normal(n_vocab, rank, std=1.0))
    writer.add_tensor("markov_w2.weight", weights.normal(n_vocab, rank, std=0.3 / rank ** 0.5))
    if confidence:
        writer.add_tensor("conf_proj.weight", weights.normal(1, n_embd + rank, std=(n_embd + rank) ** -0.5))
        writer.add_tensor("conf_proj.bias", np.full(1, -4.0, dtype=np.float32))  # scores below its top probabilities
