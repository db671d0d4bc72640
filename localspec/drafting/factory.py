"""Building the engine's drafters from their specs: one place that knows every kind.

The engine owns the contexts (the target's, a draft model's, the MTP head's,
the assistant's); this module turns them and the model-free specs into the
callables that make a ``Drafter`` for a generation (``DrafterFactory``).
Model-free drafters live as long as the engine (their indexes outlast one
reply); drafters that listen to the target's decodes (MTP, the assistant)
exist one at a time: a new generation's replaces the last one's.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable

from localspec.drafting.base import Drafter
from localspec.drafting.specs import DrafterSpec
from localspec.errors import InvalidOptionError
from localspec.sampling import Sampler

if TYPE_CHECKING:
    from localspec.engine import GenerateOptions

DrafterFactory = Callable[[Sampler, "GenerateOptions"], Drafter]


class Listener:
    """A factory for a drafter that listens to the target's decodes: one lives at a time, and a new
    generation's closes the last one's (``make(sampler, opts)`` builds it)."""

    def __init__(self, make: DrafterFactory) -> None:
        self._make = make
        self.current: Drafter | None = None

    def __call__(self, sampler: Sampler, opts: "GenerateOptions") -> Drafter:
        self.close()
        self.current = self._make(sampler, opts)
        return self.current

    def close(self) -> None:
        if self.current is not None:
            self.current.close()
            self.current = None


def model_free_drafter(spec: DrafterSpec, target_path: Path, *, can_branch: bool, tree_sequences: int,
                       personal_history: bool) -> Drafter:
    """A model-free drafter for ``spec`` (``ngram``, ``rest:STORE``, ``lookahead``).

    ``can_branch``: the target verifies trees (extra sequences); without it the
    lookups propose chains only. ``personal_history``: the n-gram drafter also
    looks up the user's past replies for this tokenizer (``LOCALSPEC_NO_HISTORY=1``
    turns that off too).
    """
    if spec.kind == "ngram":
        from localspec.drafting.personal import personal_ngram_drafter

        return personal_ngram_drafter(target_path, max_branches=4 if can_branch else 1, personal=personal_history)
    if spec.kind == "rest":
        from localspec.drafting.rest import RestDrafter

        rest = RestDrafter.open(spec.arg or "", target_path, name=spec.name)
        if not can_branch:
            rest.max_branches = 1
        return rest
    if spec.kind == "lookahead":
        from localspec.drafting.lookahead import LookaheadDrafter

        return LookaheadDrafter(max_seqs=tree_sequences)
    raise InvalidOptionError(f"unknown drafter kind {spec.kind!r}")


def lasting(drafter: Drafter) -> DrafterFactory:
    """A factory that hands every generation the same drafter (model-free ones keep their index)."""
    return lambda sampler, opts: drafter
