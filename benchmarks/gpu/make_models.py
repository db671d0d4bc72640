"""Write llama-architecture GGUF models with random weights, fast, for the GPU check.

The check needs a target and a draft of realistic *shapes* (what a decode
costs depends on the shapes and the quantization, not on what the weights
learned), on a machine without network. Writing 8B random F16 weights and then
quantizing them would take minutes, so the big matrices are written directly
as Q4_0 or Q8_0 blocks: random 4-/8-bit codes with one f16 scale per tensor,
chosen so every matrix roughly preserves the variance of its input (entries of
std 1/sqrt(n_in)). Norms are F32 ones. The tokenizer is SmolLM2's
(``tokenizer.json.gz``, 49152 tokens).

Random weights alone give greedy decoding that is either noise or one token
repeated, and then acceptance rates mean nothing. So the models share a
hidden *successor* permutation ``succ`` of the ordinary tokens: the output
matrix is the token embedding with its rows permuted (row ``succ[t]`` holds
``t``'s embedding), so the residual stream's embedding term votes for
``succ[t]``; the transformer layers add a context-dependent perturbation
(``--residual-scale``) that sometimes overrules it. Greedy decoding therefore
walks a long cycle of ``succ`` (no short repetition) with context-dependent
detours, and a draft built with the same seed agrees with the target most of
the time but not always: the regime where speculative decoding is interesting.

A third model carries a multi-token-prediction (NextN) layer: a GLM-4.5-style
``glm4moe`` with a short dense trunk of the 8B width and one NextN block whose
MoE FFN has GLM-4.5-Air's expert shape (``MTP_SHAPES``). What one MTP draft
token costs depends on that block and the output matrix, not on the trunk's
depth, so the check measures the head's step cost on it next to the 0.5B
draft's. Its random head does not predict the trunk: acceptance means nothing.

    python benchmarks/gpu/make_models.py OUT_DIR            # target-8b (Q4_K_M), draft-0.6b, mtp-8b .gguf
    python benchmarks/gpu/make_models.py OUT_DIR --only curves --curve 27b:Q8_0   # curve-27b-Q8_0.gguf
    python benchmarks/gpu/make_models.py OUT_DIR --tiny     # target-tiny, draft-tiny, mtp-tiny (CPU tests)
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tokenizer as tokenizer_file  # noqa: E402  (the sibling module, not a package)

# Bytes per block of 32 weights: an f16 scale, then 16 bytes of nibbles (Q4_0) or 32 int8 (Q8_0).
_BLOCK = 32
_BLOCK_BYTES = {"Q4_0": 18, "Q8_0": 34}
# The K-quants hold 256 weights a block (ggml-common.h): Q4_K an f16 scale and min, 12 bytes of
# 6-bit sub-block scales and mins, 128 bytes of nibbles; Q6_K 128 bytes of low nibbles, 64 of high
# bit pairs, 16 int8 sub-block scales, then the f16 scale.
_K_BLOCK = 256
_K_BLOCK_BYTES = {"Q4_K": 144, "Q6_K": 210}
# Every Q4_K sub-block gets scale 32 and min 1, packed as get_scale_min_k4 reads them; with
# dmin = 7.5 * 32 * d a code q in 0..15 is worth 32 d (q - 7.5): mean zero, std 32 d * _Q4K_CODE_STD.
_Q4K_SCALES = np.array([0xA0] * 4 + [0x01] * 4 + [0x10] * 4, dtype=np.uint8)
_Q4K_CODE_STD = math.sqrt((16 * 16 - 1) / 12)
# Q6_K: codes q - 32 for q in 0..63 (mean -0.5); each 16-weight sub-block's int8 scale is +-64 with a
# random sign, so the small mean cancels across sub-blocks instead of adding a rank-one component.
_Q6K_SCALE = 64
_Q6K_CODE_STD = math.sqrt((64 * 64 - 1) / 12 + 0.25)
# A "Q4_K_M" file as llama.cpp's quantizer writes one (llama_tensor_get_type): Q4_K, with Q6_K for the
# output matrix and for attn_v and ffn_down in the layers use_more_bits picks. The token embedding is
# Q6_K here too (llama.cpp keeps it Q4_K; it is a row lookup that costs a decode nothing), so the
# output's rows can be its rows, as the successor map needs.
QTYPES = ("Q4_0", "Q8_0", "Q4_K_M")
# Codes must have mean zero: a Q4_0 code is q - 8 for a nibble q, and uniform nibbles would
# give every weight a mean of -0.5 scale, a rank-one component that deep stacks amplify until
# every position predicts the same token. So the code -8 (Q4_0) or -128 (Q8_0) is replaced by
# 0: codes -7..7 (-127..127) uniform, 0 twice as likely. Their std in units of the scale:
_CODE_STD = {"Q4_0": math.sqrt(2 * sum(v * v for v in range(8)) / 16),
             "Q8_0": math.sqrt(2 * sum(v * v for v in range(128)) / 256)}
# llama.cpp's llama_ftype numbers for general.file_type.
_FILE_TYPE = {"Q4_0": 2, "Q8_0": 7, "Q4_K_M": 15}


def use_more_bits(layer: int, n_layer: int) -> bool:
    """llama.cpp's choice of the layers whose attn_v and ffn_down get more bits in a Q4_K_M file."""
    return layer < n_layer // 8 or layer >= 7 * n_layer // 8 or (layer - n_layer // 8) % 3 == 2


def tensor_qtype(file_qtype: str, name: str, n_layer: int) -> str:
    """The block type of tensor ``name`` in a file of ``file_qtype`` (Q4_K_M mixes Q4_K and Q6_K)."""
    if file_qtype != "Q4_K_M":
        return file_qtype
    if name in ("output.weight", "token_embd.weight"):
        return "Q6_K"
    if name.endswith(("attn_v.weight", "ffn_down.weight")) and use_more_bits(int(name.split(".")[1]), n_layer):
        return "Q6_K"
    return "Q4_K"


def row_bytes(qtype: str, cols: int) -> int:
    if qtype in _K_BLOCK_BYTES:
        return cols // _K_BLOCK * _K_BLOCK_BYTES[qtype]
    return cols // _BLOCK * _BLOCK_BYTES[qtype]
# How much of the margin the embedding term holds over the best other token the layers may
# spend: about this share of greedy steps follow `succ` (measured on the shapes below).
DEFAULT_NOISE = 1.2
# Random attention mixes the whole context into every position, so a sequence seen before is
# not continued the same way the second time (a trained model copies it: induction heads).
# Attention's output projection is scaled down by this factor: the perturbation then depends
# mostly on the current token, and a repeated passage is mostly repeated again.
DEFAULT_ATTN_SHARE = 0.2


@dataclass(frozen=True)
class Shape:
    """A llama-architecture model's dimensions."""

    n_layer: int
    d_model: int
    n_head: int
    n_head_kv: int
    d_ffn: int
    rope_base: float = 500000.0

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    def n_params(self, n_vocab: int) -> int:
        kv = self.n_head_kv * self.head_dim
        per_layer = 2 * self.d_model * self.d_model + 2 * self.d_model * kv + 3 * self.d_model * self.d_ffn
        return self.n_layer * per_layer + 2 * n_vocab * self.d_model


SHAPES = {
    # Llama-3-8B's body (its vocabulary is 128k; ours is the tokenizer's 49152).
    "8b": Shape(32, 4096, 32, 8, 14336),
    # Qwen2.5-0.5B's body.
    "0.5b": Shape(24, 896, 14, 2, 4864, rope_base=1000000.0),
    # Qwen3-0.6B's body (28 layers, d 1024, FFN 3072; 16 query heads of 64 here, where Qwen3 has 128).
    "0.6b": Shape(28, 1024, 16, 8, 3072, rope_base=1000000.0),
    # Gemma-3-27B's size as a llama body: 62 layers, d 5376, FFN 21504, 42 heads of 128 (14 KV heads).
    "27b": Shape(62, 5376, 42, 14, 21504),
    # For tests and a CPU dry run: seconds to write and to run.
    "tiny": Shape(2, 128, 4, 2, 256),
    "tiny-draft": Shape(1, 64, 2, 1, 128),
    # The smallest shape K-quants can hold (rows of 256): the dry run's stand-in for 8B and 27B.
    "tiny-k": Shape(2, 256, 4, 2, 512),
}


@dataclass(frozen=True)
class MtpShape:
    """A glm4moe model: a dense trunk, then one NextN block with an MoE FFN."""

    trunk: Shape
    n_expert: int
    n_expert_used: int
    d_ffn_expert: int


MTP_SHAPES = {
    # GLM-4.5-Air's NextN block (d 4096, experts of 1408, 8 routed + 1 shared; 16 of its 128
    # experts: a decoded token reads only the 8 it routes to) after 2 dense layers of the 8B body.
    "8b": MtpShape(Shape(2, 4096, 32, 8, 14336), 16, 8, 1408),
    "tiny": MtpShape(Shape(2, 128, 4, 2, 256), 4, 2, 64),
}


def _start_writer(path: Path, arch: str, name: str | None, shape, d: int, ffn: int, n_layer: int):  # noqa: ANN001
    """A GGUF writer on ``path``.partial with the attention hyperparameters every model here shares."""
    import gguf

    tmp = path.with_name(path.name + ".partial")
    writer = gguf.GGUFWriter(str(tmp), arch)
    writer.add_name(name or path.stem)
    writer.add_context_length(8192)
    writer.add_embedding_length(d)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(shape.n_head)
    writer.add_head_count_kv(shape.n_head_kv)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_rope_freq_base(shape.rope_base)
    writer.add_layer_norm_rms_eps(1e-5)
    return tmp, writer

def successor(token_type: list[int], seed: int) -> np.ndarray:
    """The hidden next-token map: a random permutation of the ordinary tokens (type 1);
    control tokens map to a random ordinary token (and nothing maps to them, so greedy
    decoding never ends on EOS by construction)."""
    rng = np.random.default_rng(seed)
    types = np.asarray(token_type)
    normal = np.flatnonzero(types == 1)
    succ = np.empty(len(types), dtype=np.int64)
    succ[normal] = normal[rng.permutation(len(normal))]
    other = np.flatnonzero(types != 1)
    succ[other] = rng.choice(normal, size=len(other))
    return succ


def default_residual_scale(shape: Shape, n_vocab: int, noise: float = DEFAULT_NOISE) -> float:
    """Scale of the layers' output projections so that their sum perturbs the residual
    stream by ``noise`` times what the embedding's vote can absorb.

    With embedding entries of std 1, token t's own logit is ~d_model against others
    of std ~sqrt(d_model (1 + r^2)) for a perturbation r times the embedding's size;
    the largest of n_vocab such values is ~sqrt(2 ln n_vocab) std, so `succ` wins
    while r < r_max = sqrt(d_model / (2 ln n_vocab) - 1). Each of the 2 n_layer
    branches adds about unit variance per unit scale.
    """
    z = 2.0 * math.log(n_vocab)
    r_max = math.sqrt(max(shape.d_model / z - 1.0, 0.05))
    return noise * r_max / math.sqrt(2 * shape.n_layer)


def random_blocks(rng: np.random.Generator, rows: int, cols: int, qtype: str, std: float) -> np.ndarray:
    """A ``rows x cols`` matrix as quantized blocks of random codes: uint8 ``(rows, row_bytes)``, of
    mean zero and std ``std``."""
    if qtype in _K_BLOCK_BYTES:
        return _random_k_blocks(rng, rows, cols, qtype, std)
    if cols % _BLOCK:
        raise ValueError(f"row length {cols} is not a multiple of {_BLOCK}")
    nb = cols // _BLOCK
    width = _BLOCK_BYTES[qtype]
    out = np.empty((rows, nb, width), dtype=np.uint8)
    codes = out[:, :, 2:]
    codes[...] = rng.integers(0, 256, size=(rows, nb, width - 2), dtype=np.uint8)
    if qtype == "Q4_0":  # a zero nibble (code -8) becomes 8 (code 0), in each half of the byte
        codes |= ((codes & 0x0F) == 0).view(np.uint8) * np.uint8(0x08)
        codes |= ((codes & 0xF0) == 0).view(np.uint8) * np.uint8(0x80)
    else:  # int8 -128 becomes 0
        codes[codes == 0x80] = 0
    scale = np.float16(std / _CODE_STD[qtype])
    out[:, :, :2] = np.frombuffer(scale.tobytes(), dtype=np.uint8)
    return out.reshape(rows, nb * width)


def _random_k_blocks(rng: np.random.Generator, rows: int, cols: int, qtype: str, std: float) -> np.ndarray:
    if cols % _K_BLOCK:
        raise ValueError(f"row length {cols} is not a multiple of {_K_BLOCK} ({qtype} needs it)")
    nb = cols // _K_BLOCK
    out = np.empty((rows, nb, _K_BLOCK_BYTES[qtype]), dtype=np.uint8)
    if qtype == "Q4_K":
        d = np.float16(std / (32 * _Q4K_CODE_STD))
        out[:, :, 0:2] = np.frombuffer(d.tobytes(), dtype=np.uint8)
        out[:, :, 2:4] = np.frombuffer(np.float16(7.5 * 32 * float(d)).tobytes(), dtype=np.uint8)
        out[:, :, 4:16] = _Q4K_SCALES
        out[:, :, 16:] = rng.integers(0, 256, size=(rows, nb, 128), dtype=np.uint8)
    else:  # Q6_K
        out[:, :, :192] = rng.integers(0, 256, size=(rows, nb, 192), dtype=np.uint8)
        signs = rng.integers(0, 2, size=(rows, nb, 16), dtype=np.int8) * 2 - 1
        out[:, :, 192:208] = (signs * _Q6K_SCALE).astype(np.int8).view(np.uint8)
        d = np.float16(std / (_Q6K_SCALE * _Q6K_CODE_STD))
        out[:, :, 208:210] = np.frombuffer(d.tobytes(), dtype=np.uint8)
    return out.reshape(rows, -1)


def write_model(path: Path, shape: Shape, tok: dict, *, qtype: str = "Q4_0", seed: int = 0,
                succ_seed: int = 1234, residual_scale: float | None = None, attn_share: float = DEFAULT_ATTN_SHARE,
                name: str | None = None, reuse: bool = False) -> Path:
    """Write one random-weight llama GGUF to ``path`` (via ``path.partial``, then renamed).

    ``reuse``: every layer gets the same random blocks (each tensor shape drawn once): the file
    costs a decode exactly what a fresh one does (every byte is still read), and a 27B Q8_0 file
    is written at the disk's speed instead of the random generator's. For cost curves only."""
    import gguf

    n_vocab = len(tok["tokens"])
    if residual_scale is None:
        residual_scale = default_residual_scale(shape, n_vocab)
    rng = np.random.default_rng(seed)
    succ = successor(tok["token_type"], succ_seed)
    d, kv, ffn = shape.d_model, shape.n_head_kv * shape.head_dim, shape.d_ffn
    # Tensor list in file order: (name, rows, cols, kind); kind = weight init.
    plan: list[tuple[str, int, int, str]] = [("token_embd.weight", n_vocab, d, "embd")]
    for i in range(shape.n_layer):
        p = f"blk.{i}."
        plan += [(p + "attn_norm.weight", 1, d, "norm"),
                 (p + "attn_q.weight", d, d, "in"), (p + "attn_k.weight", kv, d, "in"),
                 (p + "attn_v.weight", kv, d, "in"), (p + "attn_output.weight", d, d, "out"),
                 (p + "ffn_norm.weight", 1, d, "norm"),
                 (p + "ffn_gate.weight", ffn, d, "in"), (p + "ffn_up.weight", ffn, d, "in"),
                 (p + "ffn_down.weight", d, ffn, "out_ffn")]
    plan += [("output_norm.weight", 1, d, "norm"), ("output.weight", n_vocab, d, "output")]

    tmp, writer = _start_writer(path, "llama", name, shape, d, ffn, shape.n_layer)
    writer.add_vocab_size(n_vocab)
    writer.add_file_type(_FILE_TYPE[qtype])
    writer.add_string("localspec.random_weights", f"seed={seed} succ_seed={succ_seed} "
                      f"residual_scale={residual_scale:.4g} attn_share={attn_share:.3g} qtype={qtype}")
    tokenizer_file.add_to_writer(writer, tok)
    types = {tname: tensor_qtype(qtype, tname, shape.n_layer) for tname, _, _, _ in plan}
    for tname, rows, cols, kind in plan:
        if kind == "norm":
            writer.add_tensor_info(tname, (cols,), np.dtype(np.float32), cols * 4)
        else:
            width = row_bytes(types[tname], cols)
            writer.add_tensor_info(tname, (rows, width), np.dtype(np.uint8), rows * width,
                                   raw_dtype=getattr(gguf.GGMLQuantizationType, types[tname]))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()

    embd: np.ndarray | None = None
    drawn: dict[tuple[int, int, str, str], np.ndarray] = {}

    def layer_blocks(rows: int, cols: int, qt: str, std: float) -> np.ndarray:
        """A layer's matrix: drawn afresh, or with ``reuse`` once per shape, type and scale."""
        if not reuse:
            return random_blocks(rng, rows, cols, qt, std)
        key = (rows, cols, qt, f"{std:.6g}")
        if key not in drawn:
            drawn[key] = random_blocks(rng, rows, cols, qt, std)
        return drawn[key]

    for tname, rows, cols, kind in plan:
        qt = types[tname]
        if kind == "norm":
            data = np.ones(cols, dtype=np.float32)
        elif kind == "embd":
            # Entries of std 1: each token's own logit (~d_model) then stands far above the rest.
            data = embd = random_blocks(rng, rows, cols, qt, 1.0)
        elif kind == "output":
            # Row succ[t] is t's embedding: the embedding term of the residual votes for succ[t].
            # Rows nothing maps to (control tokens) get their own random codes.
            assert embd is not None
            data = random_blocks(rng, rows, cols, qt, 1.0)
            data[succ[tok_normal(tok)]] = embd[tok_normal(tok)]
        elif kind == "in":
            data = layer_blocks(rows, cols, qt, 1.0 / math.sqrt(cols))
        elif kind == "out":
            data = layer_blocks(rows, cols, qt, attn_share * residual_scale / math.sqrt(cols))
        else:  # out_ffn: silu(gate) * up has ~0.6 the rms of its inputs; make up for it
            data = layer_blocks(rows, cols, qt, residual_scale / (0.6 * math.sqrt(cols)))
        writer.write_tensor_data(data)
    writer.close()
    os.replace(tmp, path)
    return path


def write_mtp_model(path: Path, mshape: MtpShape, tok: dict, *, qtype: str = "Q4_0", seed: int = 3,
                    name: str | None = None) -> Path:
    """Write a random-weight glm4moe GGUF with one NextN layer (llama.cpp's ``src/models/glm4-moe.cpp``)."""
    import gguf

    shape = mshape.trunk
    n_vocab = len(tok["tokens"])
    rng = np.random.default_rng(seed)
    d, q, kv, ffn = shape.d_model, shape.n_head * shape.head_dim, shape.n_head_kv * shape.head_dim, shape.d_ffn
    n_exp, f_exp = mshape.n_expert, mshape.d_ffn_expert
    qt = getattr(gguf.GGMLQuantizationType, qtype)
    nextn = shape.n_layer  # the NextN block follows the trunk
    # (name, dims (outer first, the row length last), kind)
    plan: list[tuple[str, tuple[int, ...], str]] = [("token_embd.weight", (n_vocab, d), "embd")]
    for i in range(shape.n_layer + 1):
        p = f"blk.{i}."
        plan += [(p + "attn_norm.weight", (d,), "norm"), (p + "attn_q.weight", (q, d), "in"),
                 (p + "attn_k.weight", (kv, d), "in"), (p + "attn_v.weight", (kv, d), "in"),
                 (p + "attn_output.weight", (d, q), "in"), (p + "post_attention_norm.weight", (d,), "norm")]
        if i < nextn:
            plan += [(p + "ffn_gate.weight", (ffn, d), "in"), (p + "ffn_up.weight", (ffn, d), "in"),
                     (p + "ffn_down.weight", (d, ffn), "in")]
        else:
            plan += [(p + "ffn_gate_inp.weight", (n_exp, d), "f32"), (p + "exp_probs_b.bias", (n_exp,), "zero"),
                     (p + "ffn_gate_exps.weight", (n_exp, f_exp, d), "in"),
                     (p + "ffn_up_exps.weight", (n_exp, f_exp, d), "in"),
                     (p + "ffn_down_exps.weight", (n_exp, d, f_exp), "in"),
                     (p + "ffn_gate_shexp.weight", (f_exp, d), "in"), (p + "ffn_up_shexp.weight", (f_exp, d), "in"),
                     (p + "ffn_down_shexp.weight", (d, f_exp), "in"),
                     (p + "nextn.eh_proj.weight", (d, 2 * d), "in"),
                     (p + "nextn.enorm.weight", (d,), "norm"), (p + "nextn.hnorm.weight", (d,), "norm")]
    plan += [("output_norm.weight", (d,), "norm"), ("output.weight", (n_vocab, d), "in")]

    tmp, writer = _start_writer(path, "glm4moe", name, shape, d, ffn, shape.n_layer + 1)
    writer.add_uint32("glm4moe.nextn_predict_layers", 1)
    writer.add_uint32("glm4moe.leading_dense_block_count", shape.n_layer)
    writer.add_expert_count(n_exp)
    writer.add_expert_used_count(mshape.n_expert_used)
    writer.add_expert_shared_count(1)
    writer.add_expert_feed_forward_length(f_exp)
    writer.add_expert_weights_scale(1.0)
    writer.add_expert_weights_norm(True)
    writer.add_vocab_size(n_vocab)
    writer.add_file_type(_FILE_TYPE[qtype])
    writer.add_string("localspec.random_weights", f"seed={seed} qtype={qtype} (MTP step cost only)")
    tokenizer_file.add_to_writer(writer, tok)
    if qtype not in _BLOCK_BYTES:
        raise ValueError(f"the MTP model is written as Q4_0 or Q8_0, not {qtype}")
    width = _BLOCK_BYTES[qtype]
    for tname, dims, kind in plan:
        if kind in ("norm", "zero", "f32"):
            n = int(np.prod(dims))
            writer.add_tensor_info(tname, dims, np.dtype(np.float32), n * 4)
        else:
            rows = int(np.prod(dims[:-1]))
            writer.add_tensor_info(tname, (*dims[:-1], dims[-1] // _BLOCK * width), np.dtype(np.uint8),
                                   rows * dims[-1] // _BLOCK * width, raw_dtype=qt)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for tname, dims, kind in plan:
        if kind == "norm":
            data = np.ones(dims, dtype=np.float32)
        elif kind == "zero":
            data = np.zeros(dims, dtype=np.float32)
        elif kind == "f32":
            data = rng.normal(0.0, dims[-1] ** -0.5, size=dims).astype(np.float32)
        else:
            rows = int(np.prod(dims[:-1]))
            data = random_blocks(rng, rows, dims[-1], qtype, 1.0 if kind == "embd" else 1.0 / math.sqrt(dims[-1]))
        writer.write_tensor_data(data)
    writer.close()
    os.replace(tmp, path)
    return path


def tok_normal(tok: dict) -> np.ndarray:
    return np.flatnonzero(np.asarray(tok["token_type"]) == 1)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out_dir", type=Path)
    p.add_argument("--tiny", action="store_true", help="tiny shapes (CPU tests), not 8B and 0.5B")
    p.add_argument("--qtype", choices=QTYPES, default=None,
                   help="the target's and draft's quantization (default: Q4_K_M; Q4_0 with --tiny)")
    p.add_argument("--draft-qtype", choices=QTYPES, default=None,
                   help="the draft's quantization (default: --qtype)")
    p.add_argument("--curve", action="append", default=[], metavar="SHAPE:QTYPE",
                   help="also write curve-SHAPE-QTYPE.gguf (every layer the same random blocks: for cost "
                        f"curves only); shapes {', '.join(SHAPES)}; may repeat")
    p.add_argument("--noise", type=float, default=DEFAULT_NOISE,
                   help="how strongly the layers perturb the successor vote (0: pure cycle, ~1: mostly noise)")
    p.add_argument("--attn-share", type=float, default=DEFAULT_ATTN_SHARE,
                   help="attention's share of the perturbation (0: a pure function of the current token)")
    p.add_argument("--only", choices=["target", "draft", "mtp", "curves"], default=None)
    args = p.parse_args(argv)
    curves = []
    for spec in args.curve:
        shape_name, _, qtype = spec.partition(":")
        if shape_name not in SHAPES or qtype not in QTYPES:
            p.error(f"--curve {spec}: name a shape ({', '.join(SHAPES)}) and a type ({', '.join(QTYPES)})")
        curves.append((shape_name, qtype))
    qtype = args.qtype or ("Q4_0" if args.tiny else "Q4_K_M")
    tok = tokenizer_file.load()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    pairs = [("target", "tiny" if args.tiny else "8b", qtype, 1),
             ("draft", "tiny-draft" if args.tiny else "0.6b", args.draft_qtype or qtype, 2)]
    for role, shape_name, qtype, seed in pairs:
        label = "tiny" if args.tiny else shape_name
        if args.only and role != args.only:
            continue
        shape = SHAPES[shape_name]
        path = args.out_dir / f"{role}-{label}.gguf"
        t0 = time.perf_counter()
        scale = default_residual_scale(shape, len(tok["tokens"]), args.noise)
        write_model(path, shape, tok, qtype=qtype, seed=seed, residual_scale=scale,
                    attn_share=args.attn_share, name=f"random-{shape_name}-{qtype}")
        print(f"{path}: {shape.n_params(len(tok['tokens'])) / 1e9:.2f}B params {qtype}, "
              f"{path.stat().st_size / 2**30:.2f} GiB, residual scale {scale:.3f}, "
              f"{time.perf_counter() - t0:.1f} s", flush=True)
    if args.only in (None, "mtp"):
        label = "tiny" if args.tiny else "8b"
        path = args.out_dir / f"mtp-{label}.gguf"
        t0 = time.perf_counter()
        mtp_qtype = qtype if qtype in _BLOCK_BYTES else "Q4_0"
        write_mtp_model(path, MTP_SHAPES[label], tok, qtype=mtp_qtype, name=f"random-glm4moe-mtp-{label}")
        print(f"{path}: glm4moe with one NextN layer, {path.stat().st_size / 2**30:.2f} GiB, "
              f"{time.perf_counter() - t0:.1f} s", flush=True)
    for shape_name, curve_qtype in curves if args.only in (None, "curves") else ():
        write_curve_model(args.out_dir, shape_name, curve_qtype, tok)


def curve_path(out_dir: Path, shape_name: str, qtype: str) -> Path:
    return out_dir / f"curve-{shape_name}-{qtype}.gguf"


def write_curve_model(out_dir: Path, shape_name: str, qtype: str, tok: dict | None = None) -> Path:
    """A model for a cost curve only (``reuse``: its layers share their random blocks)."""
    tok = tok or tokenizer_file.load()
    shape = SHAPES[shape_name]
    path = curve_path(out_dir, shape_name, qtype)
    t0 = time.perf_counter()
    write_model(path, shape, tok, qtype=qtype, seed=5, name=f"random-{shape_name}-{qtype}-curve", reuse=True)
    print(f"{path}: {shape.n_params(len(tok['tokens'])) / 1e9:.2f}B params {qtype} (curve only), "
          f"{path.stat().st_size / 2**30:.2f} GiB, {time.perf_counter() - t0:.1f} s", flush=True)
    return path


if __name__ == "__main__":
    main()
