"""localspec: exact speculative decoding for local GGUF models on llama.cpp.

The Python API::

    import localspec
    engine = localspec.load("target.gguf", draft="draft.gguf")
    for event in engine.generate("Once upon a time"):
        ...
    result = localspec.complete(engine, "Once upon a time", max_tokens=64)
    print(result.text, result.stats.acceptance_rate)

Importing this package does not load llama.cpp; the names below do, on first use.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "load": "localspec.api",
    "complete": "localspec.api",
    "Completion": "localspec.api",
    "Engine": "localspec.engine",
    "GenerateOptions": "localspec.engine",
    "SamplingParams": "localspec.sampling",
    "Penalties": "localspec.penalties",
    "TokenLogprob": "localspec.events",
    "TokenEvent": "localspec.events",
    "StepEvent": "localspec.events",
    "DoneEvent": "localspec.events",
    "GenerationStats": "localspec.events",
    "LocalspecError": "localspec.errors",
    "EngineStateError": "localspec.errors",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'localspec' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
