"""``localspec plan``: how a target and draft would sit on one GPU or several, from GGUF metadata alone."""

from __future__ import annotations

import argparse
import json
import sys

from localspec.commands.flags import MODEL_REF_HELP, parse_ctx, parse_size, parse_sizes
from localspec.commands.refs import NO_MODEL_DRAFTERS, model_header, resolve_draft_refs, resolve_name
from localspec.drafting.by_text import TEXT_PAIR, TEXT_PAIR_COST
from localspec.errors import InvalidOptionError
from localspec.models.gguf_info import read_info
from localspec.models.memory import CONTEXT_FLOOR, DEFAULT_RESERVE, gib
from localspec.models.planner import Plan, plan, split_plan
from localspec.models.split import Device


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan",
        help="plan GPU memory for a target and draft (reads metadata only)",
        description="Show how much GPU memory the target and draft need, which context fits, and how "
                    "many layers llama.cpp should offload (what `run` and `generate` apply on a GPU build). "
                    "Reads GGUF headers only and loads no weights: a model that is not downloaded has only "
                    "its header read from the Hub, by HTTP range requests.",
    )
    p.add_argument("target", metavar="TARGET", help="target model: " + MODEL_REF_HELP)
    p.add_argument("--draft", metavar="DRAFT", default=None,
                   help="draft model sharing the target's vocabulary: " + MODEL_REF_HELP + "; drafters "
                        f"that need no model ({NO_MODEL_DRAFTERS}) are accepted as --draft takes them "
                        "and add nothing to the plan")
    p.add_argument("--vram", metavar="SIZE[,SIZE]", default="24GiB",
                   help="GPU memory, e.g. 24GiB, 24G, 24000MB or 24 (GiB), or one size per GPU, e.g. "
                        "24GiB,24GiB (the target is then spread over them); default 24GiB")
    p.add_argument("--draft-gpu", type=int, default=None, metavar="N",
                   help="with several GPUs: the one the draft goes to (default: the one with the most room)")
    p.add_argument("--rpc", metavar="HOST:PORT[,HOST:PORT]", default=None,
                   help="remote ggml rpc-server machines the target may spread over too (asked for their "
                        "memory, as llama.cpp reports it)")
    p.add_argument("--reserve", metavar="SIZE", default=None,
                   help=f"GPU memory kept free for CUDA and the desktop (default {gib(DEFAULT_RESERVE)})")
    p.add_argument("--ctx", metavar="N", default=None,
                   help="context to plan for, e.g. 32768 or 32k (default: the target's training context); "
                        f"reduced down to {CONTEXT_FLOOR} if it does not fit")
    p.add_argument("--kv-type", metavar="TYPE", default="f16", help="KV cache type (default f16; q8_0 halves it)")
    p.add_argument("--json", action="store_true", help="print the plan as one JSON object")
    p.add_argument("--offline", action="store_true",
                   help="use no network: plan only models that are on disk (also HF_HUB_OFFLINE=1)")
    p.set_defaults(func=run)


def _gpu_offload_supported() -> bool | None:
    """Whether the installed llama.cpp can offload to a GPU; None when llama.cpp cannot be loaded.

    Imported here, not at the top: the command stays importable (and --help fast) without llama.cpp.
    """
    try:
        from localspec.backend import gpu_offload_supported
    except ImportError:
        return None
    return gpu_offload_supported()


def _devices(args: argparse.Namespace) -> list[Device] | None:
    """The devices to plan over: the RPC servers' (asked through llama.cpp) and one GPU per --vram size;
    None for one GPU and no server (the one-card plan)."""
    sizes = parse_sizes(args.vram, "--vram")
    if len(sizes) == 1 and args.rpc is None and args.draft_gpu is None:
        return None
    remote: list[Device] = []
    if args.rpc is not None:
        from localspec.backend import parse_endpoints, rpc_devices

        remote = rpc_devices(parse_endpoints(args.rpc))
    return remote + [Device(f"GPU{i}", f"--vram {gib(size)}", size, size) for i, size in enumerate(sizes)]


def run(args: argparse.Namespace) -> int:
    devices = _devices(args)
    vram = parse_sizes(args.vram, "--vram")[0]
    reserve = parse_size(args.reserve, "--reserve") if args.reserve is not None else DEFAULT_RESERVE
    n_ctx = parse_ctx(args.ctx)
    # Both names are checked before either header is fetched.
    target_ref = resolve_name(args.target)
    drafts = resolve_draft_refs(args.draft) if args.draft is not None else None
    draft_ref = drafts.model if drafts is not None else None
    if drafts is not None and drafts.specs:
        names = ", ".join(spec.kind for spec in drafts.specs)
        whose = "the target's and the draft model's" if draft_ref is not None else "the target's alone"
        print(f"localspec: --draft {names}: no draft model to place; the plan is {whose}",
              file=sys.stderr)
    target = read_info(model_header(target_ref, offline=args.offline))
    draft = read_info(model_header(draft_ref, offline=args.offline)) if draft_ref is not None else None
    # The draft shares the target's vocabulary or drafts by text (another tokenizer); else one line refuses it.
    pair = None
    if draft is not None:
        from localspec.pairing import pair_kind  # here: the command stays importable without llama.cpp

        pair = pair_kind(target, draft)
    if devices is None:
        result = plan(target, draft, vram, n_ctx, args.kv_type, reserve,
                      gpu_offload_supported=_gpu_offload_supported())
    else:
        remote = sum(d.remote for d in devices)
        if args.draft_gpu is not None and not 0 <= args.draft_gpu < len(devices) - remote:
            raise InvalidOptionError(f"--draft-gpu {args.draft_gpu} is none of the {len(devices) - remote} GPUs "
                                     "--vram names")
        result = split_plan(target, draft, devices, n_ctx, args.kv_type, reserve,
                            draft_at=None if args.draft_gpu is None else remote + args.draft_gpu,
                            gpu_offload_supported=_gpu_offload_supported())
    if args.json:
        print(json.dumps({**result.to_dict(), "pair": pair}, indent=2, default=str))
    else:
        print(format_plan(result))
        if pair is not None:
            print(f"pair: {pair}" + (f" ({TEXT_PAIR_COST})" if pair == TEXT_PAIR else ""))
    return 0


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
    if p.cards:
        lines.append(f"devices: the target's offloaded layers split by share (layer split), the draft on one; "
                     f"{gib(p.reserve_bytes)} reserve on each")
        for i, c in enumerate(p.cards):
            draft = f" + draft {gib(c.draft_bytes)}" if i == p.draft_card and p.draft is not None else ""
            lines.append(f"  {c.device.name:<6} {c.device.description:<24.24} {c.share:>5.0%}  target "
                         f"{gib(c.target_bytes)}{draft} of {gib(c.usable_bytes)} usable")
        if p.draft is not None and p.draft_card is None:
            lines.append("  draft on this machine's CPU")
        lines.append(f"devices total {gib(p.gpu_bytes)} of {gib(p.budget_bytes)} usable")
    else:
        lines.append(f"GPU total {gib(p.gpu_bytes)} of {gib(p.budget_bytes)} usable "
                     f"({gib(p.vram_bytes)} card, {gib(p.reserve_bytes)} reserve)")
    ctx = f"context {p.n_ctx} tokens" + (f" (requested {p.requested_ctx})" if p.n_ctx != p.requested_ctx else "")
    lines.append(f"{ctx}, KV cache {p.kv_type}, flash attention {'on' if p.flash_attn else 'off'}")
    ram = sum(m.weights_cpu_bytes + m.kv_cpu_bytes + m.state_cpu_bytes for m in (p.target, p.draft) if m)
    rows = f", and the target's rows the drafter keeps ({gib(p.draft_rows_bytes)})" if p.draft_rows_bytes else ""
    lines.append(f"system RAM: {gib(ram + p.draft_rows_bytes)} (weights left on the CPU, including token embeddings, "
                 f"and their KV cache{rows})")
    if p.gpu_offload_supported is not None:
        lines.append("GPU offload: supported by the installed llama.cpp" if p.gpu_offload_supported else
                     "GPU offload: NOT supported by the installed llama.cpp (a CPU-only build): everything "
                     "runs on the CPU; reinstall llama-cpp-python with CUDA to use this plan")
    for title, items in (("notes", p.notes), ("advice", p.advice)):
        if items:
            lines.append(f"{title}:")
            lines.extend(f"  - {item}" for item in items)
    return "\n".join(lines)
