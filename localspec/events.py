"""Events: the engine's only output.

The CLI, the TUI and the Python API all consume the same stream:
``TokenEvent`` for each generated token (with its provenance), ``StepEvent``
after each speculative step, and one ``DoneEvent`` at the end.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, field
from typing import Any, Union

TARGET = None
"""Provenance of a token produced by the target itself (not accepted from a draft)."""


def per_step(cls: type) -> type:
    """A frozen dataclass made every token or step (events, a controller's decision): its ``__init__`` rewritten to fill ``__dict__`` in one
    call. The generated one sets each field through ``object.__setattr__`` (frozen), ~4 us for a
    StepEvent: on a fast GPU as much as a tenth of a step's whole Python budget. Same signature, same
    defaults (none here is a factory), still frozen afterwards."""
    fields = dataclasses.fields(cls)
    params = ", ".join(f.name if f.default is dataclasses.MISSING else f"{f.name}=_d_{f.name}" for f in fields)
    source = (f"def __init__(self, {params}):\n"
              f"    self.__dict__.update({', '.join(f'{f.name}={f.name}' for f in fields)})\n")
    scope = {f"_d_{f.name}": f.default for f in fields if f.default is not dataclasses.MISSING}
    exec(source, scope)  # noqa: S102 - our own field names, known at import
    init = scope["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    cls.__init__ = init  # type: ignore[misc]
    return cls


@dataclass(frozen=True)
class TokenLogprob:
    """The target's log-probability of one emitted token, and of the ``top`` most probable tokens at
    its position (``(token, logprob)`` pairs, most probable first, ties by lower id).

    Read from the target row that produced the token (a verified row with speculation, the one row
    without: the same bits), as the log-softmax of that row after any penalties, bias or constraint
    shaped it, before temperature and the truncation filters. ``-inf`` where the shaping forbids a token.
    """

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@per_step
@dataclass(frozen=True)
class TokenEvent:
    """One generated token.

    ``text`` is the text this token releases: empty while a UTF-8 character is
    incomplete or while the text may still turn out to be a stop string.
    ``drafter`` names the drafter that proposed it and had it accepted, or is
    None when the target produced it (a correction, a bonus, or plain decoding).
    ``logprob``: its log-probability when ``GenerateOptions.logprobs`` asked for it, else None.
    """

    token: int
    text: str
    drafter: str | None = TARGET
    logprob: TokenLogprob | None = None


@per_step
@dataclass(frozen=True)
class StepEvent:
    """What one speculative step did: the one step record.

    ``localspec.speculative.speculative_step`` makes it, the controller learns
    from it, the engine numbers it (``index``), adds the controller's reason
    (``decision``) and yields it. ``tokens`` are the emitted tokens (the
    accepted draft tokens, then the target's own token; ``emitted`` counts
    them). ``drafted`` is the proposal's depth, ``verified`` every candidate
    token the target computed (a tree counts each node), ``batch_tokens`` the
    whole verification decode (the last token, the candidates and any extra
    tokens such as lookahead's window). ``draft_ms`` holds every drafting cost
    of the step: lookups made while planning (with the pricing of what they
    offered), a draft model's catch-up and its draft. ``python_ms``: the
    rest of the step's work outside the target's decode, the controller's
    planning and its observing of the step before included. ``walk``: a tree's
    verification from the root down the kept path (``CandidateTree.walk``: the
    children of each node and the rank of the one kept, -1 where none was);
    empty for a chain.
    """

    index: int
    drafter: str | None
    drafted: int
    accepted: int
    emitted: int
    draft_ms: float
    verify_ms: float
    python_ms: float
    verified: int = 0
    decision: str = ""  # why the controller drafted this many tokens (or none)
    tokens: tuple[int, ...] = ()
    batch_tokens: int = 1
    walk: tuple[tuple[int, int], ...] = ()
    logprobs: tuple[TokenLogprob, ...] = ()  # one per emitted token, when the generation asks for them

    @property
    def step_ms(self) -> float:
        return self.draft_ms + self.verify_ms + self.python_ms


@dataclass(frozen=True)
class DrafterStats:
    """Acceptance of one drafter over a generation."""

    name: str
    steps: int = 0
    drafted: int = 0
    accepted: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


@dataclass(frozen=True)
class ControlSummary:
    """What the adaptive controller decided during one generation, and how it turned out.

    ``expected_gain``: the speedup over plain decoding its estimates promised
    for the drafting steps; ``measured_gain``: what those steps really gave
    (both 1.0 when it never drafted outside probes). ``last_reason`` is the
    reason for its most recent decision, in words.
    """

    draft_steps: int = 0
    plain_steps: int = 0
    probes: int = 0
    mean_draft_len: float = 0.0
    expected_gain: float = 1.0
    measured_gain: float = 1.0
    last_reason: str = ""


@dataclass(frozen=True)
class GenerationStats:
    """Totals for one generation.

    Acceptance by position: ``position_drafted[i]`` counts steps whose draft
    had a token at position i and reached it (every earlier token accepted);
    ``position_accepted[i]`` counts those where it was accepted. Their ratio is
    the conditional acceptance at position i, the quantity the expected
    tokens-per-step formula (1 - a^(g+1)) / (1 - a) assumes constant.
    """

    prompt_tokens: int = 0
    tokens: int = 0
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    verified: int = 0
    elapsed_s: float = 0.0
    prefill_ms: float = 0.0
    draft_ms: float = 0.0
    verify_ms: float = 0.0
    python_ms: float = 0.0
    position_drafted: tuple[int, ...] = ()
    position_accepted: tuple[int, ...] = ()
    drafters: tuple[DrafterStats, ...] = field(default=())
    control: ControlSummary | None = None  # None: no controller (plain decoding)
    n_ctx: int = 0  # the context window it ran in, as llama.cpp sized it (it may round up what was asked)
    measuring_costs: bool = False  # decoding plain while this machine's costs are measured (Engine.costs_pending)
    plain_estimate_ms: float = 0.0
    """What plain decoding of the same tokens would have taken: each step's tokens at the controller's
    plain-step estimate at the time (learned from this machine's plain steps); 0 without a controller."""

    @property
    def acceptance_rate(self) -> float:
        """The share of drafted tokens kept: accepted / drafted. Not α: it also counts draft tokens after
        a rejection, which were never in play (``conditional_acceptance`` is α)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def conditional_acceptance(self) -> float:
        """α: acceptance of a draft token given every earlier one was accepted.

        This is the α of τ = (1 - a^(g+1)) / (1 - a) and of the ceiling
        1 / (1 - a); ``acceptance_rate`` also counts tokens after a rejection,
        which were never in play, so it reads lower.
        """
        reached = sum(self.position_drafted)
        return sum(self.position_accepted) / reached if reached else 0.0

    @property
    def tokens_per_step(self) -> float:
        """tau: generated tokens per target forward pass."""
        return self.tokens / self.steps if self.steps else 0.0

    @property
    def speedup(self) -> float | None:
        """The reply's speedup over plain decoding: ``plain_estimate_ms`` over the time its steps took
        (drafting, verifying, Python). None without a controller. One definition for every front end;
        the controller's ``measured_gain`` is the same ratio over its drafting steps only."""
        spent = self.draft_ms + self.verify_ms + self.python_ms
        return self.plain_estimate_ms / spent if self.plain_estimate_ms > 0 and spent > 0 else None

    @property
    def tokens_per_second(self) -> float:
        """Generation speed after the prompt was processed."""
        return self.tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def drafted_by(self, name: str) -> int:
        """Draft tokens the drafter ``name`` proposed (``forced``: the text the grammar forced)."""
        return sum(d.drafted for d in self.drafters if d.name == name)

    @property
    def position_acceptance(self) -> tuple[float, ...]:
        return tuple(a / d if d else 0.0 for a, d in zip(self.position_accepted, self.position_drafted))

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able numbers; the keys scripts rely on are stable."""
        out = asdict(self)
        out.pop("drafters")
        out["control"] = asdict(self.control) if self.control is not None else None
        out.update(
            acceptance_rate=self.acceptance_rate,
            conditional_acceptance=self.conditional_acceptance,
            tokens_per_step=self.tokens_per_step,
            tokens_per_second=self.tokens_per_second,
            position_acceptance=list(self.position_acceptance),
            position_drafted=list(self.position_drafted),
            position_accepted=list(self.position_accepted),
            drafters={d.name: {"steps": d.steps, "drafted": d.drafted, "accepted": d.accepted,
                               "acceptance_rate": d.acceptance_rate} for d in self.drafters},
        )
        return out


@dataclass(frozen=True)
class DoneEvent:
    """The end of a generation.

    ``finish_reason``: ``stop`` (an end-of-generation token or a stop string),
    ``length`` (max tokens), ``context`` (the context window is full),
    ``cancelled`` (asked to stop) or ``interrupted`` (Ctrl-C).
    """

    finish_reason: str
    text: str
    tokens: tuple[int, ...]
    stats: GenerationStats


@dataclass(frozen=True)
class PrefillEvent:
    """Prompt processing in progress: ``done`` of ``total`` prompt tokens are in the cache. Emitted after
    each batch of a prompt longer than one batch (a 5,000-word prompt took over a minute in silence)."""

    done: int
    total: int


Event = Union[TokenEvent, StepEvent, DoneEvent, PrefillEvent]
