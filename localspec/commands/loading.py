"""Opening the engine a command runs: the models' placement over the devices, the load, and a remote
device's loss turned into one error line."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable, NoReturn

from localspec.commands.flags import flag_message, parse_ctx, parse_sizes
from localspec.commands.refs import DraftRefs, drafts_for_itself, fetch_models, pair_notice, with_mtp
from localspec.errors import InvalidOptionError, LocalspecError
from localspec.models.split import parse_gpus

if TYPE_CHECKING:
    from localspec.engine import Engine
    from localspec.models.placement import LoadSettings
    from localspec.models.registry import Resolved

def load_settings(args: argparse.Namespace, target: Path, draft: Path | None) -> LoadSettings:
    """The context, offload and devices to load ``target`` and ``draft`` with (``localspec.models.placement``).

    ``--ctx``/``--gpu-layers`` win; otherwise, on a build that can offload, the plan for the
    GPU's memory (``--vram``, else what the GPU reports free) decides from both models' metadata.
    With several GPUs, ``--gpus``, ``--split-mode``, ``--draft-gpu`` or ``--rpc`` the target is
    spread over the devices (``split_settings``); RPC servers are probed before anything loads.
    """
    from localspec import backend
    from localspec.models.gguf_info import read_info
    from localspec.models.placement import Vram, detect_vram, manual_settings, planned_settings, split_settings

    ctx = parse_ctx(args.ctx)
    sizes = parse_sizes(args.vram, "--vram") if args.vram else None
    endpoints = backend.parse_endpoints(args.rpc) if args.rpc else ()
    gpus = backend.local_gpus() if backend.gpu_offload_supported() else []
    if endpoints or len(gpus) > 1 or (sizes and len(sizes) > 1) or any(
            getattr(args, name) is not None for name in ("gpus", "split_mode", "draft_gpu")):
        if args.gpus is not None:
            picked = parse_gpus(args.gpus, len(gpus))
            gpus = [gpus[i] for i in picked]
        else:
            picked = tuple(range(len(gpus)))
        if sizes is not None:
            if len(sizes) != len(gpus):
                raise InvalidOptionError(f"--vram gives {len(sizes)} sizes for {len(gpus)} GPUs in use: one size "
                                         "per GPU, in --gpus order")
            gpus = [dataclasses.replace(g, free=size) for g, size in zip(gpus, sizes)]
        remote = backend.rpc_devices(endpoints) if endpoints else []
        devices = remote + gpus
        if not devices:
            raise InvalidOptionError("--gpus, --split-mode and --draft-gpu need a GPU, and this machine has none "
                                     "llama.cpp can use (see `localspec doctor`); --rpc adds remote devices")
        draft_at = None
        if args.draft_gpu is not None:
            if args.draft_gpu not in picked:
                raise InvalidOptionError(f"--draft-gpu {args.draft_gpu} is not among the GPUs in use "
                                         f"({', '.join(map(str, picked)) or 'none'})")
            draft_at = len(remote) + picked.index(args.draft_gpu)
        return split_settings(read_info(target), read_info(draft) if draft is not None else None, devices,
                              ctx=ctx, gpu_layers=args.gpu_layers, mode=args.split_mode or "layer", draft_at=draft_at)
    settings = manual_settings(ctx, args.gpu_layers, offload=backend.gpu_offload_supported())
    if settings is not None:
        return settings
    vram = Vram(sizes[0], f"--vram {args.vram}") if sizes else detect_vram()
    return planned_settings(read_info(target), read_info(draft) if draft is not None else None,
                            ctx=ctx, vram=vram)


def load_engine(args: argparse.Namespace, target_ref: Resolved, drafts: DraftRefs) -> tuple["Engine", Path]:
    """What ``generate`` and ``serve`` do once every name is checked: fetch the files, let a model with MTP
    layers draft for itself when no --draft was given, settle the placement (its remark on stderr), load.
    Returns the engine and the target's file."""
    target, draft = fetch_models(target_ref, drafts.model, offline=args.offline)
    if args.draft is None and drafts_for_itself(target):
        drafts = with_mtp(drafts)  # a model with MTP layers drafts for itself unless told otherwise
    settings = load_settings(args, target, draft)
    guard_remote_devices(args)
    if settings.message:
        print(f"localspec: {settings.message}", file=sys.stderr)
    from localspec.engine import Engine

    engine = Engine.load(target, draft, specs=drafts.specs, n_ctx=settings.n_ctx, n_threads=args.threads,
                         n_gpu_layers=settings.n_gpu_layers, draft_n_gpu_layers=settings.draft_n_gpu_layers,
                         split=settings.split, draft_split=settings.draft_split)
    if notice := pair_notice(engine, target_ref, drafts.model):
        print(f"localspec: {notice}", file=sys.stderr)
    return engine, target


def guard_remote_devices(args: argparse.Namespace, last_words: Callable[[str], str] | None = None) -> None:
    """With ``--rpc``: when a server goes away mid-reply, end the process with the one error line
    instead of ggml's abort and backtrace; ``last_words(line)`` runs first (the app saves the chat and
    gives the terminal back) and returns the line to print.

    ggml's RPC client cannot report the failure back to the decode that waits for it; it aborts, and
    calls this first on its own thread. Whatever stdout got so far is flushed; the exit code is the
    error's.
    """
    if not getattr(args, "rpc", None):
        return
    from localspec import backend

    def fatal(err: LocalspecError) -> NoReturn:
        line = f"localspec: error: {flag_message(err)}"
        with contextlib.suppress(Exception):
            if last_words is not None:
                line = last_words(line)
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        with contextlib.suppress(Exception):
            # The real stderr: a running app (Textual) has sys.stderr captured.
            print(line, file=sys.__stderr__ or sys.stderr, flush=True)
        os._exit(err.exit_code)

    backend.on_fatal(fatal, backend.parse_endpoints(args.rpc))
