"""The Python API: load models, generate as events or as one call."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from localspec.engine import Engine, GenerateOptions
from localspec.events import DoneEvent, GenerationStats
from localspec.sampling import SamplingParams


def load(target: str | Path, draft: str | Path | None = None, *, n_ctx: int = 4096,
         n_threads: int | None = None, n_gpu_layers: int = -1) -> Engine:
    """Load a target GGUF (and a draft sharing its vocabulary), checked from metadata first."""
    return Engine.load(target, draft, n_ctx=n_ctx, n_threads=n_threads, n_gpu_layers=n_gpu_layers,
                       draft_n_gpu_layers=n_gpu_layers)


@dataclass(frozen=True)
class Completion:
    text: str
    finish_reason: str
    tokens: tuple[int, ...]
    stats: GenerationStats


def options(*, max_tokens: int = 256, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
            min_p: float = 0.0, seed: int | None = None, stop: Sequence[str] = (), draft_len: int | None = None,
            p_min: float = 0.0, speculative: bool = True) -> GenerateOptions:
    """GenerateOptions from flat keyword arguments.

    ``draft_len=None`` (the default, as in ``GenerateOptions``) lets the
    controller choose the draft length each step; an int fixes it (0: plain).
    """
    sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed)
    return GenerateOptions(max_tokens=max_tokens, sampling=sampling, stop=tuple(stop), draft_len=draft_len,
                           p_min=p_min, speculative=speculative)


def complete(engine: Engine, prompt: str | Sequence[int], **kw: Any) -> Completion:
    """Generate to the end and return the text with its statistics."""
    done: DoneEvent | None = None
    for event in engine.generate(prompt, options(**kw)):
        if isinstance(event, DoneEvent):
            done = event
    if done is None:  # a Generation always ends with a DoneEvent
        raise RuntimeError("the generation ended without a DoneEvent")
    return Completion(done.text, done.finish_reason, done.tokens, done.stats)
