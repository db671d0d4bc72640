"""GPU memory planning for a target and a draft on one card, from GGUF metadata alone.

The plan mirrors how llama.cpp places things (vendored sources, llama-cpp-python 0.3.36):

- ``n_gpu_layers`` counts the repeating layers plus one "output" layer, offloaded from the
  end: with N, layers ``n_layer + 1 - N ..`` go to the GPU, so N = 1 offloads only the
  output layer and N = n_layer + 1 (or -1) offloads everything (src/llama-model.cpp,
  ``i_gpu_start``; ``llama_model::n_gpu_layers``). The token embedding ("input layer") always
  stays on the CPU; a tied output projection is therefore a second, GPU-side copy of it.
- The KV cache of a layer lives on that layer's device (src/llama-kv-cache.cpp, ``offload``),
  one K and one V row per cell: ``cells x (head_dim_k + head_dim_v) x n_head_kv`` elements.
- ``n_ctx`` is padded up to a multiple of 256 (src/llama-context.cpp). Sliding-window layers
  (Gemma 2/3, ...) get their own cache of ``pad256(min(n_ctx, n_swa + n_ubatch))`` cells, or the
  full ``n_ctx`` when ``swa_full`` is set (src/llama-kv-cache-iswa.cpp) -- and ``swa_full`` is
  on by default in ``llama_context_default_params`` (src/llama-context.cpp), so the planner
  defaults to it too.
- Multi-token-prediction (NextN) layers are the last ``nextn_predict_layers`` blocks of
  ``block_count``. Their weights load only with ``load_mtp`` (``--draft mtp``), and their KV
  cache lives in the MTP context, not the target's (``llama_model::create_memory``'s layer
  filter), which also reserves its own compute buffer. ``n_gpu_layers`` counts them as layers
  all the same: offloading from the end, they are the first to go to the GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gguf

from localspec.llama_facts import (
    ALL_RECURRENT,
    DRAFT_N_UBATCH,
    FEATURE_DRAFT_ARCHITECTURES,
    N_UBATCH,
    ROLLBACK_SNAPSHOTS,
    SNAPSHOT_ARCHITECTURES,
)
from localspec.models.gguf_info import GGUFInfo

GIB = 1 << 30
# CUDA context and cuBLAS workspace (~0.3-0.5 GiB), a desktop on the same card, and allocator
# fragmentation: a plan that fills the card to the last byte fails to load.
DEFAULT_RESERVE = GIB
CONTEXT_FLOOR = 4096  # below this, chat turns stop fitting; offload fewer layers instead
CTX_PAD = 256
KV_TYPES = ("f32", "f16", "bf16", "q8_0", "q5_1", "q5_0", "q4_1", "q4_0", "iq4_nl")
Q8_0_BITS = 8.5      # Q8_0 stores 34 bytes per 32 weights
_COMPUTE_SLACK = 4 << 20  # graph inputs, positions, norms: what the stage estimate leaves out


def pad(n: int, to: int = CTX_PAD) -> int:
    return -(-n // to) * to


def _row_bytes(kv_type: str, n_elements: int) -> int:
    block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kv_type.upper()]]
    return n_elements // block * type_size


def recurrent_layers(info: GGUFInfo) -> tuple[bool, ...]:
    """Which layers keep a recurrent state instead of a KV cache, as llama.cpp's loaders decide.

    Every layer of Mamba and RWKV; in hybrids, the layers between full-attention
    ones (``full_attention_interval``: Qwen3.5, Qwen3-Next), or those without KV
    heads (LFM2, Jamba, Granite-hybrid; Nemotron-H's have no FFN either, which
    tells them from its FFN-only layers).
    """
    hp, n = info.hparams, info.n_layers
    if info.architecture in ALL_RECURRENT:
        return (True,) * n
    if not any(k.startswith(("ssm.", "shortconv.", "wkv.")) for k in hp):
        return (False,) * n
    interval = hp.get("full_attention_interval")
    if isinstance(interval, int) and interval > 0:
        return tuple((il + 1) % interval != 0 for il in range(n))
    if info.architecture.startswith("nemotron_h"):
        ff = _layer_values(hp.get("feed_forward_length", 0), n)
        return tuple(info.kv_heads_by_layer[il] == 0 and ff[il] == 0 for il in range(n))
    return tuple(kv == 0 for kv in info.kv_heads_by_layer)


def _layer_values(value: Any, n: int) -> tuple[int, ...]:
    if isinstance(value, (list, tuple)):
        return tuple(int(v) for v in value[:n]) + (0,) * (n - len(value))
    return (int(value),) * n


def recurrent_state_bytes(info: GGUFInfo) -> int:
    """F32 bytes of one sequence's recurrent state over all recurrent layers (0 for a transformer).

    Per layer llama.cpp keeps a conv row and a state row (src/llama-hparams.cpp,
    ``n_embd_r``/``n_embd_s``): LFM2's short convolution keeps ``n_embd x
    (l_cache - 1)``; Mamba-style layers (Mamba 1/2, Jamba, Nemotron-H, Qwen3.5's
    gated delta net) keep ``(d_conv - 1) x (d_inner + 2 n_group d_state)`` and
    ``d_state x d_inner``; RWKV keeps its token shifts and ``n_embd x head_size``.
    """
    hp = info.hparams
    layers = sum(recurrent_layers(info))
    if not layers:
        return 0
    if "wkv.head_size" in hp:
        conv = int(hp.get("token_shift_count", 2)) * info.n_embd
        state = info.n_embd * int(hp["wkv.head_size"])
    elif "shortconv.l_cache" in hp:
        conv, state = info.n_embd * (int(hp["shortconv.l_cache"]) - 1), 0
    else:
        d_conv, d_inner = int(hp.get("ssm.conv_kernel", 0)), int(hp.get("ssm.inner_size", 0))
        d_state, n_group = int(hp.get("ssm.state_size", 0)), int(hp.get("ssm.group_count", 0))
        conv = max(d_conv - 1, 0) * (d_inner + 2 * n_group * d_state)
        state = d_state * d_inner
    return 4 * layers * (conv + state)


def state_snapshots(info: GGUFInfo) -> int:
    """Snapshots per sequence a target context keeps of ``info``'s recurrent state (llama.cpp's n_rs_seq)."""
    return ROLLBACK_SNAPSHOTS if info.architecture in SNAPSHOT_ARCHITECTURES else 0


def kv_cache_bytes(info: GGUFInfo, n_ctx: int, kv_type: str = "f16", *, layers: range | None = None,
                   swa_full: bool = True, n_ubatch: int = N_UBATCH) -> int:
    """Bytes of K and V cache llama.cpp allocates for ``layers`` (default: all) at ``n_ctx``.

    Recurrent layers of a hybrid have no KV cache (see ``recurrent_state_bytes``).
    """
    cells = pad(n_ctx)
    swa_cells = cells if swa_full or not info.sliding_window else \
        pad(min(cells, info.sliding_window + n_ubatch))
    recurrent = recurrent_layers(info)
    total = 0
    for il in layers if layers is not None else range(info.n_layers):
        if recurrent[il]:
            continue
        n_kv = info.kv_heads_by_layer[il]
        per_cell = _row_bytes(kv_type, info.head_dim_k * n_kv) + _row_bytes(kv_type, info.head_dim_v * n_kv)
        total += (swa_cells if info.swa_layers[il] else cells) * per_cell
    return total


def compute_buffer_bytes(info: GGUFInfo, n_ctx: int, *, flash_attn: bool = True, n_ubatch: int = N_UBATCH) -> int:
    """An estimate of llama.cpp's compute buffer for one model, sized for one full ubatch.

    llama.cpp reserves the graph for its worst case, ``n_ubatch`` tokens that all want logits,
    and its allocator reuses memory between stages, so the buffer is the largest stage rather
    than the sum: F32 per token, the output stage holds the logits and the last hidden state
    (n_vocab + n_embd), the FFN stage its gate and up projections (2 n_ff + 2 n_embd), and the
    attention stage the KQ mask row (n_ctx), Q/K/V/out (4 n_embd) and, without flash
    attention, the KQ scores (n_ctx x n_head; softmax runs in place). A few MiB cover the
    small graph inputs. This matches llama.cpp's logged compute buffer to within ~2 MiB for
    SmolLM2 (n_vocab 49k) and Gemma 3 (n_vocab 262k) at 4k-16k context, with and without
    flash attention; CUDA's matmul scratch pool comes out of the reserve.
    """
    cells = pad(n_ctx)
    attention = cells + 4 * info.n_embd + (0 if flash_attn else cells * info.n_head)
    per_token = max(info.n_vocab + info.n_embd, 2 * info.n_ff + 2 * info.n_embd, attention)
    return 4 * n_ubatch * per_token + _COMPUTE_SLACK


DRAFT_ROWS_MAX_BYTES = 64 << 20
"""The most system RAM a drafter that reads the target's rows (an MTP head its hidden rows; EAGLE-3
and DFlash its tapped layer inputs) keeps of them for its next catch-up; the oldest go first."""


def draft_rows_bytes(target: GGUFInfo, draft: GGUFInfo | None, n_ctx: int, *, mtp: bool) -> int:
    """The system RAM those rows take at most over ``n_ctx`` positions: one row per position (a prompt
    is kept whole up to the cap), ``len(target_layers)`` times the target's width for a draft that
    reads its layers, the target's width for its MTP head, nothing for other drafts."""
    if draft is not None and draft.architecture in FEATURE_DRAFT_ARCHITECTURES:
        layers = draft.hparams.get("target_layers")
        width = (len(layers) if isinstance(layers, (list, tuple)) else 0) * target.n_embd
    else:
        width = target.n_embd if mtp else 0
    return min(DRAFT_ROWS_MAX_BYTES, n_ctx * width * 4)


@dataclass(frozen=True)
class Placement:
    """Where one model's weights, KV cache and compute buffer go.

    ``gpu_layers`` repeating layers (the last ones) and, when ``output_on_gpu``, the output
    layer are on the GPU; ``n_gpu_layers`` is the value to pass to llama.cpp.
    """

    label: str
    n_layers: int
    gpu_layers: int
    output_on_gpu: bool
    weights_gpu_bytes: int
    weights_cpu_bytes: int
    kv_gpu_bytes: int
    kv_cpu_bytes: int
    compute_bytes: int
    # Recurrent state (hybrid and recurrent models): every sequence's, times 1 + its snapshots.
    state_gpu_bytes: int = 0
    state_cpu_bytes: int = 0
    state_copies: int = 0

    @property
    def full_offload(self) -> bool:
        return self.gpu_layers == self.n_layers and self.output_on_gpu

    @property
    def n_gpu_layers(self) -> int:
        """llama.cpp's ``n_gpu_layers``: -1 for everything, else layers + 1 for the output layer."""
        return -1 if self.full_offload else self.gpu_layers + int(self.output_on_gpu)

    @property
    def gpu_bytes(self) -> int:
        return self.weights_gpu_bytes + self.kv_gpu_bytes + self.compute_bytes + self.state_gpu_bytes


def place(info: GGUFInfo, n_ctx: int, gpu_layers: int | None = None, output_on_gpu: bool = True, *,
          kv_type: str = "f16", flash_attn: bool = True, swa_full: bool = True,
          n_ubatch: int = N_UBATCH, state_copies: int = 1, mtp: bool = False) -> Placement:
    """The Placement of ``info`` with its last ``gpu_layers`` layers (default all) on the GPU.

    ``state_copies``: recurrent states llama.cpp keeps, n_seq x (1 + n_rs_seq); each
    layer's state lives on that layer's device, like its KV cache.
    ``mtp``: the model's MTP (NextN) layers are loaded and run (their weights, their KV cache
    and the MTP context's compute buffer count); otherwise they take no memory.
    A model made only of NextN layers is an assistant (Gemma 4's): its layers always load and
    it has no KV cache of its own (it reads its target's).
    """
    n = info.n_layers
    k = n if gpu_layers is None else max(0, min(gpu_layers, n))
    n_trunk = n - (info.n_nextn_layers if 0 < info.n_nextn_layers <= n else 0)
    assistant = 0 < info.n_nextn_layers == n
    used = [b if il < n_trunk or mtp or assistant else 0 for il, b in enumerate(info.layer_bytes)]
    kv_layers = range(n) if mtp and not assistant else range(n_trunk)

    def kv(layers: range) -> int:
        return kv_cache_bytes(info, n_ctx, kv_type, layers=layers, swa_full=swa_full, n_ubatch=n_ubatch)

    output_part = (info.output_bytes or info.token_embd_bytes) + info.other_bytes
    layers_gpu = sum(used[n - k:n])
    weights_gpu = layers_gpu + (output_part if output_on_gpu else 0)
    # The token embedding stays on the CPU; a CPU-side tied output shares its bytes.
    weights_cpu = info.token_embd_bytes + sum(used) - layers_gpu + \
        (0 if output_on_gpu else info.output_bytes + info.other_bytes)
    kv_total = kv(kv_layers)
    kv_gpu = kv(range(max(n - k, 0), kv_layers.stop))
    compute = compute_buffer_bytes(info, n_ctx, flash_attn=flash_attn, n_ubatch=n_ubatch) \
        if k or output_on_gpu else 0
    if mtp and info.n_nextn_layers and (k or output_on_gpu):
        # The MTP context decodes with a small batch (the draft's), all rows wanting logits.
        compute += compute_buffer_bytes(info, n_ctx, flash_attn=flash_attn, n_ubatch=min(n_ubatch, DRAFT_N_UBATCH))
    recurrent = recurrent_layers(info)
    per_layer = recurrent_state_bytes(info) // max(sum(recurrent), 1) * state_copies
    state_gpu = per_layer * sum(recurrent[n - k:n])
    state_cpu = per_layer * sum(recurrent[:n - k])
    return Placement(info.label, n, k, output_on_gpu, weights_gpu, weights_cpu, kv_gpu, kv_total - kv_gpu, compute,
                     state_gpu, state_cpu, state_copies if any(recurrent) else 0)


def gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB"
