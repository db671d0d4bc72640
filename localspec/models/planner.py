"""GPU memory planning for a target and a draft on one card: the search over context and offload.

What each part costs in memory (weights per layer, KV cache, recurrent state,
compute buffers) is ``models.memory``, which mirrors how llama.cpp places
things; this module searches the largest context and the most offloaded layers
that fit a card, and says why in notes and advice. ``localspec plan`` prints
the result (``commands.plan``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from localspec.errors import InvalidOptionError
from localspec.llama_facts import DRAFT_N_UBATCH, N_UBATCH, SNAPSHOT_ARCHITECTURES
from localspec.models.gguf_info import GGUFInfo
from localspec.models.memory import (
    CONTEXT_FLOOR,
    CTX_PAD,
    DEFAULT_RESERVE,
    GIB,
    KV_TYPES,
    Q8_0_BITS,
    Placement,
    draft_rows_bytes,
    gib,
    kv_cache_bytes,
    pad,
    place,
    recurrent_layers,
    recurrent_state_bytes,
    state_snapshots,
)
from localspec.models.split import Device, draft_device, target_shares
from localspec.validation import MIN_CTX

DEFAULT_VRAM = 24 * GIB


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
    cards: tuple[CardShare, ...] = ()
    """With several devices: each one's part (``split_plan``); empty for one card."""
    draft_card: int | None = None
    """The index in ``cards`` of the device the draft is on; None: one card, or the CPU."""
    draft_rows_bytes: int = 0
    """System RAM the drafter keeps of the target's rows for its next catch-up, at most (``memory.draft_rows_bytes``)."""

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


@dataclass(frozen=True)
class CardShare:
    """One device's part in a plan over several: the device, the memory it offers after the reserve,
    its share of the target's offloaded layers, and what the target's and the draft's parts take there."""

    device: Device
    usable_bytes: int
    share: float
    target_bytes: int
    draft_bytes: int


def _largest_fitting_ctx(fits: Callable[[int], bool], floor: int, requested: int) -> int:
    """The largest context in [floor, requested) that fits, on llama.cpp's 256-token grid.

    ``fits(floor)`` must hold and ``fits(requested)`` must not; memory grows with context.
    """
    lo, hi = pad(floor) // CTX_PAD, requested // CTX_PAD  # fits(lo * 256) == fits(floor)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid * CTX_PAD) else (lo, mid - 1)
    return max(floor, lo * CTX_PAD)


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
        extra = int(draft.n_params * Q8_0_BITS / 8) - draft.tensor_bytes
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
    n_swa, cells = sum(info.swa_layers), min(pad(n_ctx), pad((info.sliding_window or 0) + n_ubatch))
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
    if kv_type.lower() not in KV_TYPES:
        raise InvalidOptionError(f"unknown KV cache type {kv_type!r}; use one of {', '.join(KV_TYPES)}")
    if kv_type.lower() not in ("f32", "f16", "bf16") and not flash_attn:
        # src/llama-context.cpp refuses a quantized V cache with flash attention disabled.
        raise InvalidOptionError(f"a {kv_type} KV cache needs flash attention; use an f16 cache or enable it")
    if n_ctx is not None and n_ctx < MIN_CTX:
        raise InvalidOptionError(f"context of {n_ctx} tokens is too small; use at least {MIN_CTX}")
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
    rows = draft_rows_bytes(target, draft, ctx, mtp=bool(opts["mtp"]))
    if rows:
        notes.append(f"the drafter keeps up to {gib(rows)} of the target's rows in system RAM for its next "
                     "catch-up (one a position, the oldest dropped first)")
    spare = budget - t.gpu_bytes - d.gpu_bytes if d and d.full_offload else None
    advice = _advice(target, draft, ctx, spare) if draft else []
    return Plan(t, d, ctx, requested, vram_bytes, reserve_bytes, opts["kv_type"], flash_attn, swa_full,
                tuple(notes), tuple(advice), gpu_offload_supported, draft_rows_bytes=rows)


def split_plan(target: GGUFInfo, draft: GGUFInfo | None, devices: Sequence[Device], n_ctx: int | None = None,
               kv_type: str = "f16", reserve_bytes: int = DEFAULT_RESERVE, *, draft_at: int | None = None,
               **options: Any) -> Plan:
    """A plan for ``target`` over ``devices`` (their ``free`` memory, each less ``reserve_bytes``) and
    ``draft`` on one local device (``draft_at``, else the one with the most room; the CPU when all
    are remote).

    The devices are planned as one pool (``plan``), less a compute buffer for each device after the
    first (llama.cpp keeps one on each); the target's offloaded layers are then shared out in
    proportion to the room each device has left once the draft is on its device (``target_shares``).
    Layers are whole, so a device's part is its share of the target's bytes give or take a layer.
    """
    if not devices:
        raise ValueError("split_plan needs at least one device")
    room = [max(0, d.free - reserve_bytes) for d in devices]
    if not any(room):
        raise InvalidOptionError(f"the {len(devices)} devices leave nothing after the {gib(reserve_bytes)} reserve "
                                 "each; give their full memory, e.g. --vram 24GiB,24GiB")
    at = draft_device(devices, room, draft_at)
    notes: list[str] = []
    local_draft = draft if at is not None else None
    pooled = plan(target, local_draft, sum(room) + reserve_bytes, n_ctx, kv_type, reserve_bytes, **options)
    used = sum(1 for r in room if r) - 1
    if used > 0:  # each further device keeps a compute buffer of its own
        pool = max(1, sum(room) - used * pooled.target.compute_bytes)
        pooled = plan(target, local_draft, pool + reserve_bytes, n_ctx, kv_type, reserve_bytes, **options)
        notes.append(f"each of the {used} further devices keeps a compute buffer of its own (about "
                     f"{gib(pooled.target.compute_bytes)} each), set aside from the room before the layers are shared")
    d = pooled.draft
    if draft is not None and at is None:
        d = place(draft, pooled.n_ctx, 0, False, kv_type=pooled.kv_type, flash_attn=pooled.flash_attn,
                  swa_full=pooled.swa_full, n_ubatch=DRAFT_N_UBATCH)
        notes.append("every device is remote: the draft runs on this machine's CPU, where its γ tokens per step "
                     "cost no network hop")
    d_bytes = d.gpu_bytes if d is not None and at is not None else 0
    if at is not None and d_bytes > room[at]:
        notes.append(f"the draft needs {gib(d_bytes)} and {devices[at].name} has {gib(room[at])} usable: llama.cpp "
                     "may fail to load it there; choose another draft GPU or a smaller draft")
    shares = target_shares(room, d_bytes, at)
    t_bytes = pooled.target.gpu_bytes
    cards = tuple(CardShare(dev, r, s, round(t_bytes * s), d_bytes if i == at else 0)
                  for i, (dev, r, s) in enumerate(zip(devices, room, shares)))
    return dataclasses.replace(pooled, draft=d, vram_bytes=sum(room) + reserve_bytes, cards=cards, draft_card=at,
                               notes=tuple(notes) + pooled.notes)
