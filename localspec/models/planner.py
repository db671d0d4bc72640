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

import dataclasses
import re
from dataclasses import dataclass
from typing import Any, Callable

import gguf

from localspec.errors import InvalidOptionError
from localspec.llama_facts import ALL_RECURRENT, DRAFT_N_UBATCH, N_UBATCH, ROLLBACK_SNAPSHOTS, SNAPSHOT_ARCHITECTURES
from localspec.models.gguf_info import GGUFInfo

GIB = 1 << 30
DEFAULT_VRAM = 24 * GIB
# CUDA context and cuBLAS workspace (~0.3-0.5 GiB), a desktop on the same card, and allocator
# fragmentation: a plan that fills the card to the last byte fails to load.
DEFAULT_RESERVE = GIB
CONTEXT_FLOOR = 4096  # below this, chat turns stop fitting; offload fewer layers instead
_CTX_PAD = 256
_KV_TYPES = ("f32", "f16", "bf16", "q8_0", "q5_1", "q5_0", "q4_1", "q4_0", "iq4_nl")
_Q8_0_BITS = 8.5      # Q8_0 stores 34 bytes per 32 weights
_COMPUTE_SLACK = 4 << 20  # graph inputs, positions, norms: what the stage estimate leaves out


def _pad(n: int, to: int = _CTX_PAD) -> int:
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
    cells = _pad(n_ctx)
    swa_cells = cells if swa_full or not info.sliding_window else \
        _pad(min(cells, info.sliding_window + n_ubatch))
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
    cells = _pad(n_ctx)
    attention = cells + 4 * info.n_embd + (0 if flash_attn else cells * info.n_head)
    per_token = max(info.n_vocab + info.n_embd, 2 * info.n_ff + 2 * info.n_embd, attention)
    return 4 * n_ubatch * per_token + _COMPUTE_SLACK


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


@dataclass(frozen=True)
class Plan:
    """A chosen context and placement for a target (and draft) on one GPU, with the reasons.

    ``notes`` say what was reduced and why; ``advice`` says what would speculate better.
    ``gpu_offload_supported`` is filled in by the caller that may ask llama.cpp (None: not asked).
    """

    target: Placement
    draft: Placement | None
    n_ctx: int
    requested_ctx: int
    vram_bytes: int
    reserve_bytes: int
    kv_type: str
    flash_attn: bool
    swa_full: bool
    notes: tuple[str, ...]
    advice: tuple[str, ...]
    gpu_offload_supported: bool | None = None

    @property
    def gpu_bytes(self) -> int:
        return self.target.gpu_bytes + (self.draft.gpu_bytes if self.draft else 0)

    @property
    def budget_bytes(self) -> int:
        return self.vram_bytes - self.reserve_bytes

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data, with llama.cpp's n_gpu_layers for each model."""
        out = dataclasses.asdict(self)
        for key in ("target", "draft"):
            placement = getattr(self, key)
            if placement is not None:
                out[key]["n_gpu_layers"] = placement.n_gpu_layers
                out[key]["gpu_bytes"] = placement.gpu_bytes
        out["gpu_bytes"] = self.gpu_bytes
        return out


def gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB"


def _largest_fitting_ctx(fits: Callable[[int], bool], floor: int, requested: int) -> int:
    """The largest context in [floor, requested) that fits, on llama.cpp's 256-token grid.

    ``fits(floor)`` must hold and ``fits(requested)`` must not; memory grows with context.
    """
    lo, hi = _pad(floor) // _CTX_PAD, requested // _CTX_PAD  # fits(lo * 256) == fits(floor)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid * _CTX_PAD) else (lo, mid - 1)
    return max(floor, lo * _CTX_PAD)


def _most_layers(info: GGUFInfo, n_ctx: int, available: int, opts: dict[str, Any]) -> int | None:
    """The most repeating layers that fit in ``available`` with the output layer; None if not even it."""
    for k in range(info.n_layers, -1, -1):
        if place(info, n_ctx, k, True, **opts).gpu_bytes <= available:
            return k
    return None


def _partial(target: GGUFInfo, draft: GGUFInfo | None, n_ctx: int, budget: int, opts: dict[str, Any],
             draft_opts: dict[str, Any], notes: list[str]) -> tuple[Placement, Placement | None]:
    """Draft fully on the GPU first, then as many target layers as fit; the CPU takes the rest."""
    d = place(draft, n_ctx, **draft_opts) if draft else None
    k = _most_layers(target, n_ctx, budget - (d.gpu_bytes if d else 0), opts)
    if k is not None:
        t = place(target, n_ctx, k, True, **opts)
        if d:
            notes.append("draft kept fully on the GPU first: it runs γ times per step, so a draft on the "
                         "CPU would cost more than speculation saves")
    else:
        t = place(target, n_ctx, 0, False, **opts)
        notes.append(f"no target layer fits on the GPU: {t.label} runs entirely on the CPU")
        if draft:
            kd = _most_layers(draft, n_ctx, budget, draft_opts)
            d = place(draft, n_ctx, kd, True, **draft_opts) if kd is not None else \
                place(draft, n_ctx, 0, False, **draft_opts)
            if not d.full_offload:
                notes.append(f"the draft does not fit either: {d.gpu_layers}/{d.n_layers} draft layers on the GPU")
    if t.gpu_layers or t.output_on_gpu:
        notes.append(f"partial offload of the target: {t.gpu_layers}/{t.n_layers} layers and the output "
                     f"layer on the GPU (n_gpu_layers={t.n_gpu_layers}); the other {t.n_layers - t.gpu_layers} "
                     f"layers ({gib(t.weights_cpu_bytes - target.token_embd_bytes)} of weights, "
                     f"{gib(t.kv_cpu_bytes)} of KV cache) run on the CPU, which bounds the speed")
    return t, d


def _advice(target: GGUFInfo, draft: GGUFInfo, n_ctx: int, spare: int | None) -> list[str]:
    """What would speculate better; ``spare`` is free GPU memory, None when the draft is not all on it."""
    advice = []
    if draft.bits_per_weight < 8:
        kind = f"{draft.file_type}, " if draft.file_type else ""
        extra = int(draft.n_params * _Q8_0_BITS / 8) - draft.tensor_bytes
        room = f"it needs about {gib(extra)} more and fits" if spare is not None and extra <= spare else \
            f"it needs about {gib(extra)} more than is free"
        advice.append(f"draft {draft.label} is quantized to {draft.bits_per_weight:.1f} bits per weight "
                      f"({kind}below 8): low-bit drafts agree with the target less often; a Q8_0 or F16 "
                      f"draft accepts more ({room})")
    if target.n_params and draft.n_params > target.n_params / 10:
        advice.append(f"draft has {draft.n_params / 1e9:.2f}B parameters, {draft.n_params / target.n_params:.0%} "
                      f"of the target's {target.n_params / 1e9:.2f}B: drafts above about a tenth of the target "
                      "rarely pay off, because each drafted token costs too much")
    if 0 < draft.context_length < n_ctx:
        advice.append(f"draft was trained on contexts up to {draft.context_length} tokens, shorter than the "
                      f"chosen {n_ctx}: its proposals, and acceptance, degrade on longer prompts")
    return advice


def _swa_note(info: GGUFInfo, n_ctx: int, swa_full: bool, n_ubatch: int, kv_type: str) -> str:
    n_swa, cells = sum(info.swa_layers), min(_pad(n_ctx), _pad((info.sliding_window or 0) + n_ubatch))
    head = f"{info.label}: {n_swa} of {info.n_layers} layers use a {info.sliding_window}-token sliding window"
    if not swa_full:
        return f"{head}; llama.cpp caches only {cells} cells for them (swa_full off)"
    saved = kv_cache_bytes(info, n_ctx, kv_type) - kv_cache_bytes(info, n_ctx, kv_type, swa_full=False,
                                                                   n_ubatch=n_ubatch)
    # llama-server checkpoints a windowed SWA cache instead of trimming it, so keep it full
    # for speculation, which trims the cache after every rejected draft.
    return (f"{head}; llama.cpp's default swa_full caches the whole context for them too, which keeps "
            f"rolling back rejected drafts safe (swa_full off would save {gib(saved)})")


def _state_note(role: str, info: GGUFInfo, m: Placement) -> str:
    one = recurrent_state_bytes(info)
    head = (f"{role} {info.label} keeps a recurrent state in {sum(recurrent_layers(info))} of {info.n_layers} "
            f"layers ({one / (1 << 20):.2f} MiB per copy)")
    if role == "target" and info.architecture in SNAPSHOT_ARCHITECTURES:
        return (f"{head}; llama.cpp keeps {m.state_copies - 1} snapshots of it so speculation can take back up "
                f"to {m.state_copies - 1} rejected tokens: {gib(m.state_gpu_bytes + m.state_cpu_bytes)} in all, "
                "which also caps the draft length")
    if role == "target":
        return (f"{head}: {gib(m.state_gpu_bytes + m.state_cpu_bytes)}; this llama.cpp keeps no snapshots of "
                f"{info.architecture}, so it cannot roll back and speculative decoding is refused for it")
    return (f"{head}; as a draft it drafts on a copy of its sequence: {m.state_copies} copies, "
            f"{gib(m.state_gpu_bytes + m.state_cpu_bytes)}")


def plan(target: GGUFInfo, draft: GGUFInfo | None = None, vram_bytes: int = DEFAULT_VRAM,
         n_ctx: int | None = None, kv_type: str = "f16", reserve_bytes: int = DEFAULT_RESERVE, *,
         ctx_floor: int = CONTEXT_FLOOR, flash_attn: bool = True, swa_full: bool = True,
         n_ubatch: int = N_UBATCH, gpu_offload_supported: bool | None = None, mtp: bool | None = None) -> Plan:
    """Choose a context and GPU placement for ``target`` and ``draft`` on a ``vram_bytes`` card.

    Strategy: both fully offloaded at the requested context (default: the target's training
    context) if that fits in ``vram_bytes - reserve_bytes``; else the largest context down to
    ``ctx_floor`` at which both still fit; else the floor context with the draft fully on the
    GPU and as many target layers as fit. Raises InvalidOptionError for impossible options.
    ``mtp``: whether the target runs its MTP layers (None: when it has them, as ``generate`` and
    ``run`` do by default).
    """
    if kv_type.lower() not in _KV_TYPES:
        raise InvalidOptionError(f"unknown KV cache type {kv_type!r}; use one of {', '.join(_KV_TYPES)}")
    if kv_type.lower() not in ("f32", "f16", "bf16") and not flash_attn:
        # src/llama-context.cpp refuses a quantized V cache with flash attention disabled.
        raise InvalidOptionError(f"a {kv_type} KV cache needs flash attention; use an f16 cache or enable it")
    if n_ctx is not None and n_ctx < 16:
        raise InvalidOptionError(f"context of {n_ctx} tokens is too small; use at least 16")
    if reserve_bytes < 0 or vram_bytes <= reserve_bytes:
        raise InvalidOptionError(f"{gib(vram_bytes)} of VRAM leaves nothing after the {gib(reserve_bytes)} "
                                 "reserve; give the card's full memory size, e.g. --vram 24GiB")
    opts: dict[str, Any] = {"kv_type": kv_type.lower(), "flash_attn": flash_attn, "swa_full": swa_full,
                            "n_ubatch": n_ubatch, "mtp": target.has_mtp if mtp is None else mtp}
    # A target with a recurrent state verifies chains (one sequence) and keeps its snapshots; a draft with
    # one drafts on a second sequence and keeps none (localspec.engine, drafting/model.py).
    draft_opts = {**opts, "n_ubatch": min(n_ubatch, DRAFT_N_UBATCH), "mtp": False,
                  "state_copies": 2 if draft is not None and recurrent_state_bytes(draft) else 1}
    opts["state_copies"] = 1 + state_snapshots(target)
    budget = vram_bytes - reserve_bytes
    requested = n_ctx or target.context_length or ctx_floor
    notes: list[str] = []

    def full(ctx: int) -> tuple[Placement, Placement | None]:
        return place(target, ctx, **opts), place(draft, ctx, **draft_opts) if draft else None

    def need(ctx: int) -> int:
        t, d = full(ctx)
        return t.gpu_bytes + (d.gpu_bytes if d else 0)

    if target.context_length and requested > target.context_length:
        notes.append(f"requested context {requested} is longer than the target's training context "
                     f"{target.context_length}; llama.cpp allows it but quality degrades past it")
    ctx = requested
    both = "both models fit" if draft else "the model fits"
    if need(requested) <= budget:
        t, d = full(requested)
    elif need(floor := min(ctx_floor, requested)) <= budget:
        ctx = _largest_fitting_ctx(lambda c: need(c) <= budget, floor, requested)
        t, d = full(ctx)
        notes.append(f"context reduced from {requested} to {ctx} so {both} on the GPU "
                     f"(at {requested}: {gib(need(requested))} needed, {gib(budget)} usable)")
    else:
        ctx = floor
        if floor < requested:
            notes.append(f"context reduced from {requested} to the {floor}-token floor, and still not "
                         f"everything fits ({gib(need(floor))} needed, {gib(budget)} usable)")
        t, d = _partial(target, draft, ctx, budget, opts, draft_opts, notes)
    for info, o in ((target, opts),) if draft is None or draft.path == target.path else \
            ((target, opts), (draft, draft_opts)):
        if any(info.swa_layers):
            notes.append(_swa_note(info, ctx, swa_full, o["n_ubatch"], o["kv_type"]))
    for role, info, m in (("target", target, t), ("draft", draft, d)):
        if info is not None and m is not None and m.state_copies:
            notes.append(_state_note(role, info, m))
    spare = budget - t.gpu_bytes - d.gpu_bytes if d and d.full_offload else None
    advice = _advice(target, draft, ctx, spare) if draft else []
    return Plan(t, d, ctx, requested, vram_bytes, reserve_bytes, opts["kv_type"], flash_attn, swa_full,
                tuple(notes), tuple(advice), gpu_offload_supported)


_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-z]*)\s*", re.IGNORECASE)
_UNITS = {"": GIB, "b": 1, "k": 1 << 10, "kib": 1 << 10, "kb": 10**3, "m": 1 << 20, "mib": 1 << 20,
          "mb": 10**6, "g": GIB, "gib": GIB, "gb": 10**9, "t": 1 << 40, "tib": 1 << 40, "tb": 10**12}


def parse_size(text: str, option: str = "--vram") -> int:
    """Bytes from a size such as ``24GiB``, ``24G``, ``24000MB`` or ``24``.

    A bare number is GiB; K/M/G/T and KiB/MiB/GiB/TiB are binary; KB/MB/GB/TB are decimal.
    Raises InvalidOptionError (naming ``option``) for anything else or for zero.
    """
    m = _SIZE.fullmatch(text)
    unit = m.group(2).lower() if m else ""
    if not m or unit not in _UNITS:
        raise InvalidOptionError(f"{option} {text!r} is not a size; use a number with an optional unit, "
                                 "e.g. 24GiB, 24G, 24000MB or 24 (GiB)")
    size = int(float(m.group(1)) * _UNITS[unit])
    if size <= 0:
        raise InvalidOptionError(f"{option} {text!r} must be more than zero")
    return size


def format_plan(p: Plan) -> str:
    """The plan for a terminal: one row per model, totals, then notes and advice."""
    head = f"{'model':<34} {'GPU layers':>14} {'-ngl':>5} {'weights':>10} {'KV cache':>10} {'compute':>10} {'on GPU':>10}"
    lines = [head]
    for role, m in (("target", p.target), ("draft", p.draft)):
        if m is None:
            continue
        layers = f"{m.gpu_layers}/{m.n_layers}" + (" +out" if m.output_on_gpu else "")
        lines.append(f"{role + ' ' + m.label:<34.34} {layers:>14} {m.n_gpu_layers:>5} {gib(m.weights_gpu_bytes):>10} "
                     f"{gib(m.kv_gpu_bytes):>10} {gib(m.compute_bytes):>10} {gib(m.gpu_bytes):>10}")
    lines.append(f"GPU total {gib(p.gpu_bytes)} of {gib(p.budget_bytes)} usable "
                 f"({gib(p.vram_bytes)} card, {gib(p.reserve_bytes)} reserve)")
    ctx = f"context {p.n_ctx} tokens" + (f" (requested {p.requested_ctx})" if p.n_ctx != p.requested_ctx else "")
    lines.append(f"{ctx}, KV cache {p.kv_type}, flash attention {'on' if p.flash_attn else 'off'}")
    ram = sum(m.weights_cpu_bytes + m.kv_cpu_bytes + m.state_cpu_bytes for m in (p.target, p.draft) if m)
    lines.append(f"system RAM: {gib(ram)} (weights left on the CPU, including token embeddings, and their KV cache)")
    if p.gpu_offload_supported is not None:
        lines.append("GPU offload: supported by the installed llama.cpp" if p.gpu_offload_supported else
                     "GPU offload: NOT supported by the installed llama.cpp (a CPU-only build): everything "
                     "runs on the CPU; reinstall llama-cpp-python with CUDA to use this plan")
    for title, items in (("notes", p.notes), ("advice", p.advice)):
        if items:
            lines.append(f"{title}:")
            lines.extend(f"  - {item}" for item in items)
    return "\n".join(lines)
