"""The Python API: load models, generate as events or as one call."""

from __future__ import annotations

import difflib
import inspect
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from localspec.drafting.specs import NO_DRAFTER, DrafterSpec, parse_draft
from localspec.engine import Engine, GenerateOptions
from localspec.errors import InvalidOptionError
from localspec.events import DoneEvent, GenerationStats, TokenEvent, TokenLogprob
from localspec.penalties import Penalties
from localspec.sampling import SamplingParams
from localspec.validation import check_load_options


def load(target: str | Path, draft: str | Path | None = None, *, n_ctx: int | None = 4096,
         n_threads: int | None = None, n_gpu_layers: int | None = -1, offline: bool = False) -> Engine:
    """Load a target (and its drafters), checked from GGUF metadata first.

    ``target``: a GGUF path, or a name or alias from ``localspec models``, resolved through the
    registry as the command line does (a copy on disk is used; one that is not is downloaded, unless
    ``offline``). ``draft`` takes what ``--draft`` takes: a draft model sharing the target's vocabulary
    (a path, name or alias), the model-free ``ngram``, ``lookahead``, ``rest:STORE``, the target's own
    ``mtp`` layers, or several of them comma-separated ("ngram,qwen3-0.6b"); a ``Path`` is always a
    model file. ``n_ctx``: tokens (at least 16); ``n_threads``: at least 1 (None: one per physical core);
    ``n_gpu_layers``: -1 offloads every layer, 0 none. None is the default for each. Wrong types and values raise
    ``InvalidOptionError`` naming the parameter, as the command line refuses them.
    """
    check_load_options(n_ctx=n_ctx, n_threads=n_threads, n_gpu_layers=n_gpu_layers)
    n_ctx = 4096 if n_ctx is None else n_ctx
    n_gpu_layers = -1 if n_gpu_layers is None else n_gpu_layers
    if not isinstance(offline, bool):
        raise InvalidOptionError(f"offline must be True or False, not {offline!r}", param="offline")
    target_path = model_file(target, "target", offline=offline)
    draft_path, specs = drafters(draft, offline=offline)
    return Engine.load(target_path, draft_path, specs=specs, n_ctx=n_ctx, n_threads=n_threads,
                       n_gpu_layers=n_gpu_layers, draft_n_gpu_layers=n_gpu_layers)


def drafters(draft: object, *, offline: bool = False) -> tuple[Path | None, list[DrafterSpec]]:
    """``load``'s ``draft`` as the draft model's file (None: none) and the model-free drafters."""
    if draft is None or isinstance(draft, Path):
        return draft, []
    if not isinstance(draft, (str, os.PathLike)):
        raise InvalidOptionError(f"draft must be a draft model's GGUF path or name, or a drafter such as "
                                 f"\"ngram\" (str or Path), not {type(draft).__name__}", param="draft")
    text = os.fspath(draft)
    if not isinstance(text, str) or not text.strip():
        raise InvalidOptionError("draft is empty; pass None for no drafter, or a draft model or a drafter such "
                                 "as \"ngram\"", param="draft")
    if text.strip().lower() in NO_DRAFTER:
        return None, []
    specs = parse_draft(text)
    model = next((s for s in specs if s.kind == "model"), None)
    path = model_file(model.arg, "draft", offline=offline) if model is not None else None
    return path, [s for s in specs if s.kind != "model"]


def model_file(model: object, param: str, *, offline: bool = False) -> Path:
    """``model`` (a path, or a registered name or alias) as a local GGUF file; ``param`` names it in errors."""
    if isinstance(model, Path):
        return model
    if not isinstance(model, (str, os.PathLike)):
        raise InvalidOptionError(f"{param} must be a GGUF path or a model name from `localspec models` (str or "
                                 f"Path), not {type(model).__name__}", param=param)
    from localspec.models import hub
    from localspec.models.registry_file import load_registry

    resolved = load_registry().resolve(os.fspath(model))
    if resolved.spec is None:
        assert resolved.path is not None
        return resolved.path
    return hub.pull(resolved.spec, offline=offline)


@dataclass(frozen=True)
class Completion:
    """``logprobs``: one per emitted token when ``logprobs`` was asked for, else empty."""

    text: str
    finish_reason: str
    tokens: tuple[int, ...]
    stats: GenerationStats
    logprobs: tuple[TokenLogprob, ...] = ()


def options(*, max_tokens: int = 256, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
            min_p: float = 0.0, seed: int | None = None, stop: str | Sequence[str] = (), draft_len: int | None = None,
            p_min: float = 0.0, speculative: bool = True, logprobs: int | None = None,
            penalties: Penalties | None = None) -> GenerateOptions:
    """GenerateOptions from flat keyword arguments.

    ``stop``: one stop string, a sequence of them, or None (none). Raises ``InvalidOptionError``
    naming the first option of a wrong type or out of range. ``draft_len=None`` (the default, as in
    ``GenerateOptions``) lets the controller choose the draft length each step; an int fixes it (0: plain).
    ``logprobs``: each token's log-probability with this many alternatives (0..20); None: none.
    ``penalties``: repetition penalties and logit bias on every target row (``localspec.Penalties``).
    """
    sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed)
    # One string is one stop string and None is none; GenerateOptions.validate refuses the rest by name.
    opts = GenerateOptions(max_tokens=max_tokens, sampling=sampling, stop=stop,  # type: ignore[arg-type]
                           draft_len=draft_len, p_min=p_min, speculative=speculative,
                           logprobs=logprobs, penalties=penalties)
    opts.validate()
    return opts


OPTIONS = tuple(inspect.signature(options).parameters)
"""The keywords ``complete`` takes beside the engine and the prompt."""


def complete(engine: Engine, prompt: str | Sequence[int], **kw: Any) -> Completion:
    """Generate to the end and return the text with its statistics.

    ``prompt``: text, or token ids of the engine's vocabulary. Safe from several threads: calls on one
    engine take turns (each waits for the other thread's generation to end); called while this thread
    iterates an unfinished generation of the same engine, it raises ``EngineStateError``.
    """
    unknown = next((k for k in kw if k not in OPTIONS), None)
    if unknown is not None:
        close = difflib.get_close_matches(unknown, OPTIONS, n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        raise InvalidOptionError(f"{unknown} is not an option of complete(); {hint}it takes {', '.join(OPTIONS)}",
                                 param=unknown)
    if not isinstance(engine, Engine):
        raise InvalidOptionError(f"engine must be an Engine from localspec.load(), not {type(engine).__name__}",
                                 param="engine")
    done: DoneEvent | None = None
    logprobs: list[TokenLogprob] = []
    for event in engine.generate(prompt, options(**kw), wait=True):
        if isinstance(event, TokenEvent) and event.logprob is not None:
            logprobs.append(event.logprob)
        elif isinstance(event, DoneEvent):
            done = event
    if done is None:  # a Generation always ends with a DoneEvent
        raise RuntimeError("the generation ended without a DoneEvent")
    return Completion(done.text, done.finish_reason, done.tokens, done.stats, tuple(logprobs))
