"""What ``run``, ``generate`` and ``bench`` load models with: the user's choice, else a GPU plan (one card,
or the target spread over several devices and the draft on one: ``split_settings``).

On a llama.cpp build that can offload to a GPU, the planner (``localspec.models.planner``) sizes the
target and the draft from their GGUF metadata for the GPU's memory and picks ``n_gpu_layers``
for each and a context; ``--ctx`` and ``--gpu-layers`` override what they name. On a CPU-only
build nothing is offloaded and the context is ``DEFAULT_CTX``. The decisions are pure functions
of metadata and memory; ``detect_vram`` asks llama.cpp for the GPU's free memory, then nvidia-smi.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from typing import Sequence

from localspec.errors import InvalidOptionError
from localspec.models.gguf_info import GGUFInfo
from localspec.llama_facts import DRAFT_N_UBATCH
from localspec.models.memory import CONTEXT_FLOOR, DEFAULT_RESERVE, gib, place
from localspec.models.planner import Plan, plan, split_plan
from localspec.models.split import Device, DeviceSplit, draft_device, target_shares

DEFAULT_CTX = 4096
"""The context when no plan chooses one (a CPU-only build, or ``--gpu-layers`` given)."""

_MIB = 1 << 20


@dataclass(frozen=True)
class Vram:
    """GPU memory to plan for, in bytes, and where the number came from (named in messages)."""

    bytes: int
    source: str


@dataclass(frozen=True)
class LoadSettings:
    """The context and offload the engine is loaded with.

    ``message`` is one line saying what a GPU plan chose and what it reduced, and why; ``brief``
    is a few words of it for the app's title. Both are None when no plan was made.
    """

    n_ctx: int
    n_gpu_layers: int
    draft_n_gpu_layers: int
    message: str | None = None
    brief: str | None = None
    split: DeviceSplit | None = None
    """The devices the target's offloaded layers go to, and their shares (None: llama.cpp's choice)."""
    draft_split: DeviceSplit | None = None
    """The draft's one device (no devices: the CPU; None: llama.cpp's choice)."""


def manual_settings(ctx: int | None, gpu_layers: int | None, *, offload: bool) -> LoadSettings | None:
    """Settings that need no plan, or None when a plan must decide.

    A CPU-only build (``offload`` False) offloads nothing (or what ``--gpu-layers`` says, which it
    ignores); ``--gpu-layers`` given means the user places the layers, for target and draft alike.
    Either way the context is ``--ctx`` or ``DEFAULT_CTX``.
    """
    if offload and gpu_layers is None:
        return None
    layers = 0 if gpu_layers is None else gpu_layers
    return LoadSettings(ctx or DEFAULT_CTX, layers, layers)


def planned_settings(target: GGUFInfo, draft: GGUFInfo | None, *, ctx: int | None, vram: Vram | None,
                     reserve: int = DEFAULT_RESERVE) -> LoadSettings:
    """Settings from the plan for ``vram``: its n_gpu_layers for both models and its context.

    ``ctx`` (``--ctx``) is kept as given: the plan then offloads fewer layers rather than shorten
    it. Without ``ctx`` the plan starts from the target's training context and may shorten it
    down to ``CONTEXT_FLOOR`` before it offloads fewer layers. Unknown memory (``vram`` None)
    offloads every layer, as llama.cpp would; memory that leaves nothing after ``reserve``
    offloads nothing.
    """
    if vram is None:
        n_ctx = ctx or DEFAULT_CTX
        return LoadSettings(n_ctx, -1, -1,
                            message=f"GPU plan: the GPU's free memory could not be read, so every layer is "
                                    f"offloaded at context {n_ctx}; pass --vram SIZE to plan for the card",
                            brief="plan: all layers (memory unknown)")
    if vram.bytes <= reserve:
        n_ctx = ctx or DEFAULT_CTX
        return LoadSettings(n_ctx, 0, 0,
                            message=f"GPU plan for {vram.source}: nothing is left after the {gib(reserve)} "
                                    f"reserve, so everything runs on the CPU at context {n_ctx}",
                            brief="plan: CPU only (GPU memory full)")
    p = plan(target, draft, vram.bytes, ctx, reserve_bytes=reserve, ctx_floor=ctx or CONTEXT_FLOOR,
             gpu_offload_supported=True)
    t_layers = "all layers" if p.target.full_offload else f"{p.target.gpu_layers}/{p.target.n_layers} layers"
    return LoadSettings(p.n_ctx, p.target.n_gpu_layers, p.draft.n_gpu_layers if p.draft else 0,
                        message=plan_message(p, target, draft, vram.source), brief=f"plan: {t_layers}, ctx {p.n_ctx}")


def split_settings(target: GGUFInfo, draft: GGUFInfo | None, devices: Sequence[Device], *, ctx: int | None,
                   gpu_layers: int | None, mode: str = "layer", draft_at: int | None = None,
                   reserve: int = DEFAULT_RESERVE) -> LoadSettings:
    """Settings for the target over ``devices`` (local GPUs and RPC servers, the draft on a local one).

    ``gpu_layers`` (``--gpu-layers``) places that many layers, shared by free memory, for target and
    draft alike; otherwise ``split_plan`` decides from both models' metadata. Split mode ``none`` puts
    everything offloaded on one device: the draft's (``draft_at``), else the one with the most room.
    """
    if mode == "row" and any(d.remote for d in devices):
        # llama.cpp's row split needs the device backend's split buffer type (CUDA has one, RPC not):
        # the load would fail with "device RPC0 does not support split buffers" (src/llama-model.cpp).
        raise InvalidOptionError("split_mode row spreads each matrix over local GPUs of one backend; RPC "
                                 "servers take whole layers: use layer", param="split_mode")
    room = [max(0, d.free - reserve) for d in devices]
    if mode == "none":
        main = draft_device(devices, room, draft_at)
        main = main if main is not None else max(range(len(devices)), key=room.__getitem__)
        devices, room, draft_at = (devices[main],), [room[main]], 0 if not devices[main].remote else None
    if gpu_layers is not None:
        at = draft_device(devices, room, draft_at)
        split = DeviceSplit(tuple(devices), target_shares(room, 0, None), mode)
        draft_split = DeviceSplit((devices[at],) if at is not None else ())
        return LoadSettings(ctx or DEFAULT_CTX, gpu_layers, gpu_layers if at is not None else 0,
                            message=f"placement: {gpu_layers} layers over {split.describe()}",
                            brief=f"{len(devices)} devices", split=split, draft_split=draft_split)
    p = split_plan(target, draft, devices, ctx, reserve_bytes=reserve, draft_at=draft_at,
                   ctx_floor=ctx or CONTEXT_FLOOR, gpu_offload_supported=True)
    split = DeviceSplit(tuple(devices), tuple(c.share for c in p.cards), mode)
    draft_split = DeviceSplit((devices[p.draft_card],) if p.draft_card is not None else ())
    source = " + ".join(f"{d.name} {gib(d.free)}" for d in devices)
    message = f"{plan_message(p, target, draft, source)}; target over {split.describe()}"
    t_layers = "all layers" if p.target.full_offload else f"{p.target.gpu_layers}/{p.target.n_layers} layers"
    return LoadSettings(p.n_ctx, p.target.n_gpu_layers, p.draft.n_gpu_layers if p.draft and p.draft_card is not None
                        else 0, message=message, brief=f"plan: {t_layers} on {len(devices)} devices, ctx {p.n_ctx}",
                        split=split, draft_split=draft_split)


def plan_message(p: Plan, target: GGUFInfo, draft: GGUFInfo | None, source: str) -> str:
    """One line on plan ``p`` (of ``target`` and ``draft``): where the layers go, the context, and
    what was reduced and why."""
    line = f"GPU plan for {source}: {_where(p)}, context {p.n_ctx}"
    reduced = p.n_ctx < p.requested_ctx or not p.target.full_offload or (p.draft and not p.draft.full_offload)
    if not reduced:
        return f"{line} ({gib(p.gpu_bytes)} of {gib(p.budget_bytes)} usable)"
    if p.n_ctx < p.requested_ctx:
        line += f" (reduced from {p.requested_ctx})"
    opts = {"kv_type": p.kv_type, "flash_attn": p.flash_attn, "swa_full": p.swa_full}
    everything = place(target, p.requested_ctx, **opts).gpu_bytes
    if draft is not None:
        everything += place(draft, p.requested_ctx, **opts, n_ubatch=DRAFT_N_UBATCH).gpu_bytes
    return (f"{line}: everything on the GPU at context {p.requested_ctx} needs {gib(everything)} and "
            f"{gib(p.budget_bytes)} is usable")


def _where(p: Plan) -> str:
    t, d = p.target, p.draft
    if t.full_offload and (d is None or d.full_offload):
        return "target and draft fully on the GPU" if d else "the model fully on the GPU"
    out = "" if t.output_on_gpu else ", output layer"
    where = (f"{t.gpu_layers}/{t.n_layers} target layers on the GPU (n_gpu_layers {t.n_gpu_layers}; "
             f"{t.n_layers - t.gpu_layers} layers{out} on the CPU)")
    if d is not None:
        where += ", draft fully on the GPU" if d.full_offload else f", draft {d.gpu_layers}/{d.n_layers} layers on the GPU"
    return where


def parse_nvidia_smi(text: str) -> Vram | None:
    """The first GPU's free memory from ``nvidia-smi --query-gpu=name,memory.total,memory.used
    --format=csv,noheader,nounits`` output (MiB); None when it says nothing usable."""
    for row in text.strip().splitlines():
        parts = [p.strip() for p in row.rsplit(",", 2)]
        if len(parts) != 3:
            continue
        try:
            total, used = int(parts[1]) * _MIB, int(parts[2]) * _MIB
        except ValueError:
            continue
        free = max(0, total - used)
        return Vram(free, f"{parts[0]} ({gib(free)} free of {gib(total)}, nvidia-smi)")
    return None


def nvidia_smi_vram() -> Vram | None:
    """The first GPU's free memory as nvidia-smi reports it; None without nvidia-smi."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        done = subprocess.run([exe, "--query-gpu=name,memory.total,memory.used", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_nvidia_smi(done.stdout) if done.returncode == 0 else None


def detect_vram() -> Vram | None:
    """The free memory of the first GPU llama.cpp can use, else nvidia-smi's first GPU; None if unknown.

    The one-card plan's memory; with several GPUs ``commands.loading.load_settings`` plans over each
    one's free memory instead (``split_settings``).
    """
    from localspec.backend import gpu_devices

    devices = gpu_devices()
    if devices:
        name, free, total = devices[0]
        return Vram(free, f"{name} ({gib(free)} free of {gib(total)})")
    return nvidia_smi_vram()
