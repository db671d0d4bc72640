"""Options shared by every subcommand, so models, drafts and sampling are named alike everywhere."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from localspec.errors import InvalidOptionError, ModelFileError


DRAFT_HELP = ("drafters, comma-separated: a draft model (name or GGUF path sharing the target's "
              "vocabulary), ngram (lookup in the context), lookahead (Jacobi decoding), "
              "rest:STORE (a datastore from `localspec index`); several are combined per step")


def add_model_options(p: argparse.ArgumentParser, *, model_required: bool = True,
                      draft_configs: bool = False) -> None:
    """MODEL, --draft and the engine options. ``draft_configs``: --draft repeats, one configuration each."""
    p.add_argument("model", metavar="MODEL", nargs=None if model_required else "?",
                   help="target model: a name from `localspec models` (downloaded on first use) or a "
                        "GGUF path" + ("" if model_required else "; default: the embedded SmolLM2-135M"))
    if draft_configs:
        p.add_argument("--draft", metavar="DRAFT[@K]", action="append", default=[],
                       help="a configuration to compare with plain decoding (repeatable): " + DRAFT_HELP
                            + "; @K fixes the draft length at K, otherwise the adaptive controller decides")
    else:
        p.add_argument("--draft", metavar="DRAFT", default=None, help=DRAFT_HELP)
    p.add_argument("--offline", action="store_true",
                   help="never download: use only models already on disk")
    p.add_argument("--ctx", type=int, default=4096, metavar="N", help="context window in tokens (default 4096)")
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="CPU threads for llama.cpp (default: all cores)")
    p.add_argument("--gpu-layers", type=int, default=-1, metavar="N",
                   help="layers to offload to the GPU in a CUDA build (-1: all, 0: none; default -1)")


def add_sampling_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling (the target's distribution; speculation never changes it)")
    g.add_argument("--max-tokens", type=int, default=256, metavar="N", help="most tokens to generate (default 256)")
    g.add_argument("--temp", type=float, default=0.0, metavar="T",
                   help="temperature; 0 is greedy and deterministic (default 0)")
    g.add_argument("--top-k", type=int, default=0, metavar="K", help="keep the K most likely tokens (0: off)")
    g.add_argument("--top-p", type=float, default=1.0, metavar="P", help="nucleus sampling mass (1: off)")
    g.add_argument("--min-p", type=float, default=0.0, metavar="P",
                   help="drop tokens below P times the top probability (0: off)")
    g.add_argument("--seed", type=int, default=None, metavar="S", help="random seed for reproducible sampling")
    g.add_argument("--stop", action="append", default=[], metavar="TEXT",
                   help="stop when this text appears (repeatable)")
    s = p.add_argument_group("speculation")
    s.add_argument("--draft-max", type=int, default=None, metavar="G",
                   help="draft exactly up to G tokens per step (0 turns speculation off); by default an "
                        "adaptive controller picks the length each step from measured costs and acceptance, "
                        "and drafts nothing where speculation would be slower than plain decoding")
    s.add_argument("--p-min", type=float, default=0.0, metavar="P",
                   help="stop drafting when the draft's top probability falls below P (default 0)")


def sampling_params(args: argparse.Namespace):
    from localspec.sampling import SamplingParams

    return SamplingParams(temperature=args.temp, top_k=args.top_k, top_p=args.top_p,
                          min_p=args.min_p, seed=args.seed)


def generate_options(args: argparse.Namespace):
    from localspec.engine import GenerateOptions

    opts = GenerateOptions(max_tokens=args.max_tokens, sampling=sampling_params(args), stop=tuple(args.stop),
                           draft_max=args.draft_max, p_min=args.p_min)
    opts.validate()
    return opts


def check_engine_options(args: argparse.Namespace) -> None:
    if args.ctx < 16:
        raise InvalidOptionError(f"--ctx {args.ctx} is too small: use at least 16 tokens")
    if args.threads is not None and args.threads < 1:
        raise InvalidOptionError(f"--threads {args.threads} is out of range: use at least 1")
    for name in ("temp", "top_p", "min_p"):
        value = getattr(args, name, 0.0)
        if isinstance(value, float) and math.isnan(value):
            raise InvalidOptionError(f"--{name.replace('_', '-')} must be a number, not NaN")


def resolve_name(text: str, registry=None):
    """``text`` resolved through the registry, its notice on stderr; a bare path must exist."""
    from localspec.registry import load_registry

    resolved = (registry or load_registry()).resolve(text)
    if resolved.notice:
        print(f"localspec: {resolved.notice}", file=sys.stderr)
    if resolved.spec is None:
        assert resolved.path is not None
        if not resolved.path.exists():  # a directory or a non-GGUF file gets gguf_info's own message
            raise ModelFileError(f"model file not found: {text}; check the path or use a name from `localspec models`")
    return resolved


def resolve_model(text: str | None, *, offline: bool = False) -> Path:
    """A model argument (registry name, alias or path; None: the default) as a local GGUF path.

    Names are downloaded on first use (progress on stderr); a notice about how a
    name was resolved (``qwen3-0.5b`` -> ``qwen3-0.6b``) goes to stderr.
    """
    from localspec import hub
    from localspec.registry import load_registry

    registry = load_registry()
    if text is None:
        spec = registry.default
        if spec is None:
            raise InvalidOptionError("no model given and models.toml names no default; pass MODEL")
        return hub.pull(spec, offline=offline)
    resolved = resolve_name(text, registry)
    if resolved.spec is None:
        assert resolved.path is not None
        return resolved.path
    return hub.pull(resolved.spec, offline=offline)


def read_prompt(args: argparse.Namespace) -> str:
    if args.prompt is not None:
        return args.prompt
    if sys.stdin is None or sys.stdin.isatty():
        raise InvalidOptionError("no prompt: pass --prompt TEXT or pipe the prompt on stdin")
    return sys.stdin.read()


def resolve_drafters(text: str | None, *, offline: bool = False):
    """``--draft`` as (draft model path or None, model-free drafter specs)."""
    from localspec.drafting.specs import parse_draft

    specs = parse_draft(text)
    model = next((s for s in specs if s.kind == "model"), None)
    draft_path = resolve_model(model.arg, offline=offline) if model is not None else None
    return draft_path, [s for s in specs if s.kind != "model"]
