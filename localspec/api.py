"""The Python API: load models, generate as events or as one call."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from localspec.engine import Engine, GenerateOptions
from localspec.errors import InvalidOptionError
from localspec.events import DoneEvent, GenerationStats, TokenEvent, TokenLogprob
from localspec.penalties import Penalties
from localspec.sampling import SamplingParams


def load(target: str | Path, draft: str | Path | None = None, *, n_ctx: int = 4096,
         n_threads: int | None = None, n_gpu_layers: int = -1, offline: bool = False) -> Engine:
    """Load a target (and a draft model sharing its vocabulary), checked from GGUF metadata first.

    ``target`` and ``draft``: a GGUF path, or a name or alias from ``localspec models``, resolved
    through the registry as the command line does (a copy on disk is used; one that is not is
    downloaded, unless ``offline``). ``n_gpu_layers``: -1 offloads every layer, 0 none.
    """
    target_path = model_file(target, "target", offline=offline)
    draft_path = model_file(draft, "draft", offline=offline) if draft is not None else None
    return Engine.load(target_path, draft_path, n_ctx=n_ctx, n_threads=n_threads, n_gpu_layers=n_gpu_layers,
                       draft_n_gpu_layers=n_gpu_layers)


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

    ``stop``: one stop string, or a sequence of them. ``draft_len=None`` (the default, as in
    ``GenerateOptions``) lets the controller choose the draft length each step; an int fixes it (0: plain).
    ``logprobs``: each token's log-probability with this many alternatives (0..20); None: none.
    ``penalties``: repetition penalties and logit bias on every target row (``localspec.Penalties``).
    """
    sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed)
    stops = (stop,) if isinstance(stop, str) else tuple(stop)  # one string is one stop string
    return GenerateOptions(max_tokens=max_tokens, sampling=sampling, stop=stops, draft_len=draft_len,
                           p_min=p_min, speculative=speculative, logprobs=logprobs,
                           penalties=penalties)


def complete(engine: Engine, prompt: str | Sequence[int], **kw: Any) -> Completion:
    """Generate to the end and return the text with its statistics.

    ``prompt``: text, or token ids of the engine's vocabulary. Safe from several threads: calls on one
    engine take turns (each waits for the other thread's generation to end); called while this thread
    iterates an unfinished generation of the same engine, it raises ``EngineStateError``.
    """
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
