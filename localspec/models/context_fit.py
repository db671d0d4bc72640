"""Whether a context of the size asked for fits the memory it will live in, checked before llama.cpp allocates it.

An absurd context (``--ctx 999999999999``) once took the machine's memory for most of a minute before
llama.cpp's ``std::bad_alloc`` came back. Its size is known from the GGUF header before anything is
allocated: the KV cache, the recurrent state and the compute buffers (``models.memory``, which mirrors
how llama.cpp places them), on the CPU side against the system RAM available, on the GPU side (offloaded
layers) against the GPUs' free memory. A context that does not fit is refused in one line naming the
largest one that does. Weights are left out: llama.cpp maps them from the file, and the plan
(``models.planner``) sizes what goes to a GPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

from localspec.errors import InvalidOptionError
from localspec.llama_facts import DRAFT_N_UBATCH, N_UBATCH
from localspec.models.gguf_info import GGUFInfo
from localspec.models.memory import CTX_PAD, compute_buffer_bytes, gib, place


@dataclass(frozen=True)
class ContextBytes:
    """What one context size costs beyond the weights: in system RAM and in GPU memory."""

    cpu: int
    gpu: int


def _placement_args(n_gpu_layers: int, n_layers: int, offload: bool) -> tuple[int, bool]:
    """llama.cpp's ``n_gpu_layers`` as (repeating layers on the GPU, output layer on the GPU)."""
    if not offload or n_gpu_layers == 0:
        return 0, False
    if n_gpu_layers < 0 or n_gpu_layers > n_layers:
        return n_layers, True
    return n_gpu_layers - 1, True


def context_bytes(info: GGUFInfo, n_ctx: int, *, n_gpu_layers: int, offload: bool, draft: bool = False,
                  mtp: bool = False) -> ContextBytes:
    """The KV cache, recurrent state and compute buffer of one model's context at ``n_ctx``, split between
    system RAM and GPU memory as ``n_gpu_layers`` places the layers (a draft decodes with a small ubatch)."""
    n_ubatch = DRAFT_N_UBATCH if draft else N_UBATCH
    layers, output = _placement_args(n_gpu_layers, info.n_layers, offload)
    p = place(info, n_ctx, layers, output, n_ubatch=n_ubatch, mtp=mtp)
    # With nothing on a GPU the compute buffer is in system RAM (``place`` counts it only on the GPU).
    cpu_compute = 0 if layers or output else compute_buffer_bytes(info, n_ctx, n_ubatch=n_ubatch)
    return ContextBytes(cpu=p.kv_cpu_bytes + p.state_cpu_bytes + cpu_compute,
                        gpu=p.kv_gpu_bytes + p.state_gpu_bytes + p.compute_bytes)


def available_ram() -> int | None:
    """System RAM that can be allocated without swapping (Linux's MemAvailable), else the physical RAM;
    None when neither can be read."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def check_context_fits(target: GGUFInfo, draft: GGUFInfo | None, n_ctx: int, *, n_gpu_layers: int,
                       draft_n_gpu_layers: int, offload: bool, mtp: bool = False, ram: int | None,
                       vram: int | None) -> None:
    """Raise ``InvalidOptionError`` (param ``n_ctx``) when the contexts of ``target`` (and ``draft``) at
    ``n_ctx`` need more system RAM than ``ram`` or more GPU memory than ``vram`` (None: not checked),
    naming the largest context that fits. Weights are not counted (see the module's docstring)."""

    def need(ctx: int) -> ContextBytes:
        t = context_bytes(target, ctx, n_gpu_layers=n_gpu_layers, offload=offload, mtp=mtp)
        if draft is None:
            return t
        d = context_bytes(draft, ctx, n_gpu_layers=draft_n_gpu_layers, offload=offload, draft=True)
        return ContextBytes(t.cpu + d.cpu, t.gpu + d.gpu)

    def fits(ctx: int) -> bool:
        b = need(ctx)
        return (ram is None or b.cpu <= ram) and (vram is None or b.gpu <= vram)

    if fits(n_ctx):
        return
    wanted = need(n_ctx)
    if ram is not None and wanted.cpu > ram:
        over = f"{gib(wanted.cpu)} of system RAM, and {gib(ram)} is available"
    else:
        assert vram is not None
        over = f"{gib(wanted.gpu)} of GPU memory, and {gib(vram)} is free"
    models = target.label + (f" and {draft.label}" if draft is not None else "")
    best = largest(fits, n_ctx)
    advice = (f"the largest context that fits is {best} tokens" if best
              else "not even the smallest context fits: free some memory or offload fewer layers")
    raise InvalidOptionError(f"n_ctx {n_ctx} is too large: the KV cache and compute buffers of {models} "
                             f"would need {over}; {advice}", param="n_ctx")


def largest(fits: Callable[[int], bool], upper: int) -> int:
    """The largest multiple of ``CTX_PAD`` below ``upper`` for which ``fits`` holds (memory grows with
    the context), or 0 when not even ``CTX_PAD`` fits."""
    lo, hi = 0, max(0, (upper - 1) // CTX_PAD)  # in units of CTX_PAD: lo fits (0 trivially), hi + 1 does not
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid * CTX_PAD):
            lo = mid
        else:
            hi = mid - 1
    return lo * CTX_PAD


def check_machine_fits(target: GGUFInfo, draft: GGUFInfo | None, n_ctx: int, *, n_gpu_layers: int,
                       draft_n_gpu_layers: int, mtp: bool = False, devices_named: bool = False) -> None:
    """``check_context_fits`` against this machine: the RAM available now and, on a build that offloads,
    the local GPUs' free memory together (not checked when the layers go to named devices, RPC
    servers among them: ``devices_named``; the split plan sizes those)."""
    from localspec.backend import gpu_devices, gpu_offload_supported

    offload = gpu_offload_supported()
    vram = None
    if offload and not devices_named:
        free = [f for _, f, _ in gpu_devices()]
        vram = sum(free) if free else None
    check_context_fits(target, draft, n_ctx, n_gpu_layers=n_gpu_layers, draft_n_gpu_layers=draft_n_gpu_layers,
                       offload=offload, mtp=mtp, ram=available_ram(), vram=vram)
