"""``localspec plan``: how a target and draft would sit on one GPU, from GGUF metadata alone."""

from __future__ import annotations

import argparse
import json

from localspec.commands.common import MODEL_REF_HELP, model_header, parse_ctx, resolve_name
from localspec.models.gguf_info import check_draft_compatible, read_info
from localspec.models.planner import CONTEXT_FLOOR, DEFAULT_RESERVE, format_plan, gib, parse_size, plan


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
                   help="draft model sharing the target's vocabulary: "
                        + MODEL_REF_HELP)
    p.add_argument("--vram", metavar="SIZE", default="24GiB",
                   help="GPU memory, e.g. 24GiB, 24G, 24000MB or 24 (GiB); default 24GiB")
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


def run(args: argparse.Namespace) -> int:
    vram = parse_size(args.vram, "--vram")
    reserve = parse_size(args.reserve, "--reserve") if args.reserve is not None else DEFAULT_RESERVE
    n_ctx = parse_ctx(args.ctx)
    # Both names are checked before either header is fetched.
    target_ref = resolve_name(args.target)
    draft_ref = resolve_name(args.draft) if args.draft else None
    target = read_info(model_header(target_ref, offline=args.offline))
    draft = read_info(model_header(draft_ref, offline=args.offline)) if draft_ref is not None else None
    if draft is not None:
        check_draft_compatible(target, draft)
    result = plan(target, draft, vram, n_ctx, args.kv_type, reserve,
                  gpu_offload_supported=_gpu_offload_supported())
    if args.json:
        print(json.dumps(result.to_dict(), indent=2, default=str))
    else:
        print(format_plan(result))
    return 0
