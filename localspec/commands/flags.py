"""The flags every subcommand shares (the model, its drafts, devices and sampling), and what they become:
``GenerateOptions``, sizes and context lengths, and an error's one line with the core's parameter names
spelt as flags."""

from __future__ import annotations

import argparse
import math
import re
import sys

from localspec.errors import InvalidOptionError
from localspec.models.split import SPLIT_MODES

MODEL_REF_HELP = "a name or alias from `localspec models` or a path to a GGUF file"
"""How a model is named, for a command that reads no weights (``plan``)."""
MODEL_HELP = "a name or alias from `localspec models` (downloaded on first use) or a path to a GGUF file"


DRAFT_HELP = ("drafters, comma-separated: a draft model (name or GGUF path sharing the target's "
              "vocabulary), mtp (the target's own multi-token-prediction layers; the default for a "
              "model that has them), ngram (lookup in the context), lookahead (Jacobi decoding), "
              "forced (the text a --grammar or --json-schema forces), "
              "rest:STORE (a datastore from `localspec index`); several are combined per step")


def add_model_options(p: argparse.ArgumentParser, *, model_required: bool = True,
                      draft_configs: bool = False) -> None:
    """MODEL, --draft and the engine options. ``draft_configs``: --draft repeats, one configuration each."""
    p.add_argument("model", metavar="MODEL", nargs=None if model_required else "?",
                   help="target model: " + MODEL_HELP
                        + ("" if model_required else "; default: the embedded SmolLM2-135M"))
    if draft_configs:
        p.add_argument("--draft", metavar="DRAFT[@K]", action="append", default=[],
                       help="a configuration to compare with plain decoding (repeatable): " + DRAFT_HELP
                            + "; @K fixes the draft length at K, otherwise the adaptive controller decides")
    else:
        p.add_argument("--draft", metavar="DRAFT", default=None, help=DRAFT_HELP)
    p.add_argument("--offline", action="store_true",
                   help="never download: use only models already on disk")
    p.add_argument("--ctx", default=None, metavar="N",
                   help="context window in tokens, e.g. 8192 or 32k (default: on a GPU build, what the GPU "
                        "plan fits, up to the target's training context; otherwise 4096)")
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="CPU threads for llama.cpp (default: all cores)")
    p.add_argument("--gpu-layers", type=int, default=None, metavar="N",
                   help="layers to offload to the GPU, target and draft alike (-1: all, 0: none; default: "
                        "what the GPU plan fits, as `localspec plan` shows; a CPU-only build offloads none)")
    p.add_argument("--vram", metavar="SIZE[,SIZE]", default=None,
                   help="GPU memory to plan for, e.g. 24GiB, or one size per GPU, e.g. 24GiB,24GiB (default: "
                        "each GPU's free memory, from llama.cpp or nvidia-smi)")
    add_device_options(p)


def add_device_options(p: argparse.ArgumentParser) -> None:
    """The devices the target is spread over: several GPUs, remote ggml RPC servers (docs/gpu.md, docs/rpc.md)."""
    g = p.add_argument_group("devices (a target bigger than one card)")
    g.add_argument("--gpus", metavar="N[,N]", default=None,
                   help="the local GPUs to use, by llama.cpp's numbers, e.g. 0,1 (default: every GPU)")
    g.add_argument("--split-mode", choices=SPLIT_MODES, default=None,
                   help="how the target spreads over several devices: layer (whole layers per device; the "
                        "default), row (each matrix's rows, GPUs only) or none (one device)")
    g.add_argument("--draft-gpu", type=int, default=None, metavar="N",
                   help="the local GPU the draft runs on (default: the one with the most memory left)")
    g.add_argument("--rpc", metavar="HOST:PORT[,HOST:PORT]", default=None,
                   help="remote ggml rpc-server machines to place target layers on, as llama.cpp's --rpc "
                        "(unauthenticated: private networks only; docs/rpc.md)")


def parse_ctx(text: str | None) -> int | None:
    """``--ctx`` as given (None: not given) as a token count: ``8192``, or ``8k``/``32K`` (x1024).

    One parser for every command that takes --ctx; raises InvalidOptionError for anything else.
    """
    if text is None:
        return None
    m = re.fullmatch(r"\s*(\d+)\s*([kK]?)\s*", text)
    if not m:
        raise InvalidOptionError(f"--ctx {text!r} is not a token count; use e.g. 8192 or 8k")
    return int(m.group(1)) * (1024 if m.group(2) else 1)


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
    g.add_argument("--presence-penalty", type=float, default=0.0, metavar="P",
                   help="subtract P from the logit of every token among the last --repeat-last-n (default 0: off)")
    g.add_argument("--frequency-penalty", type=float, default=0.0, metavar="P",
                   help="subtract P per occurrence among the last --repeat-last-n tokens (default 0: off)")
    g.add_argument("--repeat-penalty", type=float, default=1.0, metavar="R",
                   help="llama.cpp's repeat penalty on the last --repeat-last-n tokens (default 1: off)")
    g.add_argument("--repeat-last-n", type=int, default=64, metavar="N",
                   help="how many of the latest tokens the penalties count (default 64; -1: all)")
    g.add_argument("--logit-bias", action="append", default=[], metavar="ID=BIAS",
                   help="add BIAS (-100..100) to token ID's logit (repeatable)")
    s = p.add_argument_group("speculation")
    s.add_argument("--draft-max", dest="draft_len", type=int, default=None, metavar="G",
                   help="draft exactly up to G tokens per step (0 turns speculation off); by default an "
                        "adaptive controller picks the length each step from measured costs and acceptance, "
                        "and drafts nothing where speculation would be slower than plain decoding")
    s.add_argument("--draft-p-min", dest="p_min", type=float, default=0.0, metavar="P",
                   help="a draft model stops drafting when its own top probability (a DSpark draft's "
                        "confidence head, where it has one) falls below P (default 0; not --min-p, which filters "
                        "sampling)")
    # The flag's first name, kept working for scripts but no longer offered beside --min-p.
    s.add_argument("--p-min", dest="p_min", type=float, default=argparse.SUPPRESS, help=argparse.SUPPRESS)


def sampling_params(args: argparse.Namespace):
    from localspec.sampling import SamplingParams

    return SamplingParams(temperature=args.temp, top_k=args.top_k, top_p=args.top_p,
                          min_p=args.min_p, seed=args.seed)


def penalties(args: argparse.Namespace):
    """The penalty and bias flags as ``Penalties`` (None when they change nothing)."""
    from localspec.penalties import Penalties

    bias: list[tuple[int, float]] = []
    for item in args.logit_bias:
        token, sep, value = item.partition("=")
        try:
            bias.append((int(token), float(value)))
        except ValueError:
            raise InvalidOptionError(f"--logit-bias {item!r} is not ID=BIAS (e.g. 1234=-100)") from None
        if not sep:
            raise InvalidOptionError(f"--logit-bias {item!r} is not ID=BIAS (e.g. 1234=-100)")
    found = Penalties(presence=args.presence_penalty, frequency=args.frequency_penalty, repeat=args.repeat_penalty,
                      last_n=args.repeat_last_n, logit_bias=tuple(bias))
    if found == Penalties(last_n=found.last_n):  # the defaults: no shaper at all, but a bad flag is still refused
        found.validate()
        return None
    return found


def generate_options(args: argparse.Namespace):
    from localspec.engine import GenerateOptions

    try:
        opts = GenerateOptions(max_tokens=args.max_tokens, sampling=sampling_params(args), stop=tuple(args.stop),
                               draft_len=args.draft_len, p_min=args.p_min, penalties=penalties(args),
                               logprobs=getattr(args, "logprobs", None))
        opts.validate()
    except InvalidOptionError as err:  # the core names its parameters; the flags are spelt with dashes
        if err.param in ("presence_penalty", "frequency_penalty", "repeat_penalty", "repeat_last_n", "logit_bias",
                         "logprobs"):
            raise InvalidOptionError(err.named("--" + err.param.replace("_", "-"))) from None
        raise
    return opts


def check_engine_options(args: argparse.Namespace) -> None:
    """Options a user can get wrong, each refused in one line before any model is touched."""
    from localspec.validation import check_load_options

    check_load_options(n_ctx=parse_ctx(args.ctx), n_threads=args.threads, n_gpu_layers=args.gpu_layers)
    p_min = getattr(args, "p_min", 0.0)
    if not 0.0 <= p_min < 1.0:  # NaN fails too
        raise InvalidOptionError(f"--draft-p-min {p_min} is out of range: it must be in [0, 1)")
    if args.threads is not None:
        from localspec.backend import default_threads, usable_cpus

        cpus = usable_cpus()
        if args.threads > cpus:
            print(f"localspec: warning: --threads {args.threads} is more than the {cpus} CPUs this process may "
                  f"use; the extra threads only wait for each other (leave --threads out to use "
                  f"{default_threads()}, one per physical core)", file=sys.stderr)
    for name in ("temp", "top_p", "min_p"):
        value = getattr(args, name, 0.0)
        if isinstance(value, float) and math.isnan(value):
            raise InvalidOptionError(f"--{name.replace('_', '-')} must be a number, not NaN")
    if args.vram is not None and len(parse_sizes(args.vram, "--vram")) > 1:
        from localspec import backend

        if not backend.gpu_offload_supported():  # one line, not a warning and then an error about 0 GPUs
            raise InvalidOptionError(f"--vram {args.vram} gives one size per GPU, but this llama.cpp build runs on "
                                     "the CPU only and sees no GPU (see `localspec doctor`); leave --vram out")
    if getattr(args, "rpc", None) is not None:  # "" too: an empty --rpc is refused, not ignored
        from localspec.backend import parse_endpoints

        parse_endpoints(args.rpc)
    remote = bool(getattr(args, "rpc", None))  # RPC servers take offloaded layers on any build
    ignored = [f for f, given in (("--gpu-layers", args.gpu_layers not in (None, 0) and not remote),
                                  ("--vram", args.vram is not None)) if given]
    if ignored:
        from localspec import backend

        if not backend.gpu_offload_supported():
            print(f"localspec: warning: {' and '.join(ignored)} {'do' if len(ignored) > 1 else 'does'} nothing "
                  "here: this llama.cpp build runs on the CPU only (see `localspec doctor`)", file=sys.stderr)


# The flag that sets each parameter the core names in its errors (``InvalidOptionError.param``).
FLAGS = {"temperature": "--temp", "top_k": "--top-k", "top_p": "--top-p", "min_p": "--min-p", "seed": "--seed",
         "max_tokens": "--max-tokens", "draft_len": "--draft-max", "p_min": "--draft-p-min", "n_ctx": "--ctx",
         "rounds": "--rounds", "stop": "--stop", "rpc": "--rpc", "gpus": "--gpus", "draft_gpu": "--draft-gpu",
         "split_mode": "--split-mode", "n_threads": "--threads", "n_gpu_layers": "--gpu-layers",
         "grammar": "--grammar", "json_schema": "--json-schema"}


def flag_message(err: Exception) -> str:
    """An error's one line as the command line says it: the core's parameter names become flags."""
    if isinstance(err, InvalidOptionError) and err.param in FLAGS:
        return err.named(FLAGS[err.param])
    return str(err)


def parse_sizes(text: str, option: str = "--vram") -> list[int]:
    """``24GiB`` or ``24GiB,24GiB``: one size per GPU (``parse_size`` each)."""
    return [parse_size(part, option) for part in text.split(",")]


_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-z]*)\s*", re.IGNORECASE)
_GIB = 1 << 30
_UNITS = {"": _GIB, "b": 1, "k": 1 << 10, "kib": 1 << 10, "kb": 10**3, "m": 1 << 20, "mib": 1 << 20,
          "mb": 10**6, "g": _GIB, "gib": _GIB, "gb": 10**9, "t": 1 << 40, "tib": 1 << 40, "tb": 10**12}


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
