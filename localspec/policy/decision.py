"""What the controller decided for a step (``Decision``), and the counters behind its decisions."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from localspec.drafting.base import Drafter, Proposal, TreeProposal
from localspec.events import StepEvent, per_step


@per_step
@dataclass(frozen=True)
class Decision:
    """What to do this step: draft ``draft_len`` tokens with the ``chosen`` drafter, or decode plainly.

    ``chosen`` is the drafter object (the step asks it, or verifies what it proposed); ``name`` is its
    name, the word events, stats and the dashboard use for a drafter.

    ``expected_tokens``/``expected_ms`` per step under the current estimates
    (``expected_ms`` with the whole catch-up); ``speedup``: expected tokens
    per ms over plain decoding's (the catch-up spread as when ranking).
    ``probe``: a step taken to re-test a drafter, not because it is expected
    to win. ``proposal``: the proposal to verify when it was made while
    planning (the chosen width: a tree or its most probable path; the step cuts
    it to ``draft_len``); None: the step asks ``chosen``. ``proposal_ms``: the lookups made while planning.
    ``behind``: the tokens ``chosen`` must catch up on first. ``tree_nodes`` > ``draft_len``: the step asks
    ``chosen`` for a tree of that many nodes, ``draft_len`` deep (``Drafter.propose_tree``); else a chain.
    ``planning_ms``: the rest of the controller's own time for this step:
    pricing the options and observing the step before (the engine counts it
    in the step's ``python_ms``, so the overhead estimate learns it).
    """

    chosen: Drafter | None
    draft_len: int
    expected_tokens: float
    expected_ms: float
    speedup: float
    reason: str
    probe: bool = False
    proposal: Proposal | TreeProposal | None = None
    proposal_ms: float = 0.0
    behind: int = 0
    planning_ms: float = 0.0
    tree_nodes: int = 0

    def with_planning(self, planning_ms: float) -> "Decision":
        """This decision with ``planning_ms`` set (written out: ``dataclasses.replace`` costs as much as a
        held plan, every step)."""
        return Decision(self.chosen, self.draft_len, self.expected_tokens, self.expected_ms, self.speedup,
                        self.reason, self.probe, self.proposal, self.proposal_ms, self.behind, planning_ms,
                        self.tree_nodes)

    @property
    def plain(self) -> bool:
        return self.chosen is None or self.draft_len == 0

    @property
    def name(self) -> str | None:
        """The chosen drafter's name (None: plain)."""
        return self.chosen.name if self.chosen is not None and self.draft_len else None


@dataclass
class ControllerStats:
    """Counters behind the controller's decisions, for the dashboard and the CLI's statistics.

    ``choices[name][k]`` counts steps planned with that drafter and k (plain
    steps under ``"plain"``, k = 0). Gains compare planned and measured
    drafting steps (probes excluded) with plain decoding of the same tokens
    at the plain cost estimated at the time. ``last_reason``: the reason of the
    last decision that weighed drafting (a step that could only decode
    plainly, such as a reply's last token, leaves it).
    """

    steps: int = 0
    plain_steps: int = 0
    draft_steps: int = 0
    probes: int = 0
    probe_successes: int = 0
    choices: dict[str, dict[int, int]] = field(default_factory=dict)
    expected_tokens: float = 0.0
    expected_ms: float = 0.0
    expected_plain_ms: float = 0.0
    measured_tokens: int = 0
    measured_ms: float = 0.0
    measured_plain_ms: float = 0.0
    probe_budget_ms: float = 0.0
    last_reason: str = ""

    @property
    def expected_gain(self) -> float:
        """Planned speedup of the drafting steps over plain (1.0 before any)."""
        return self.expected_plain_ms / self.expected_ms if self.expected_ms > 0 else 1.0

    @property
    def measured_gain(self) -> float:
        """Measured speedup of the drafting steps over plain (1.0 before any)."""
        return self.measured_plain_ms / self.measured_ms if self.measured_ms > 0 else 1.0

    def count(self, step: StepEvent, decision: Decision, t0: float) -> None:
        """Tally a step taken as ``decision`` planned it (``t0``: the plain step's time then). A probe
        counts as a probe only: the gains compare the steps that drafted to win."""
        self.steps += 1
        name = decision.name
        row = self.choices.setdefault(name or "plain", {})
        row[decision.draft_len] = row.get(decision.draft_len, 0) + 1
        if decision.probe and name is not None:
            self.probes += 1
        elif name is None:
            self.plain_steps += 1
        else:
            self.draft_steps += 1
            self.expected_tokens += decision.expected_tokens
            self.expected_ms += decision.expected_ms
            self.expected_plain_ms += decision.expected_tokens * t0
            self.measured_tokens += step.emitted
            self.measured_ms += step.step_ms
            self.measured_plain_ms += step.emitted * t0

    def since(self, before: "ControllerStats") -> "ControllerStats":
        """The counts added after ``before`` (a copy taken earlier), e.g. one generation's."""
        choices: dict[str, dict[int, int]] = {}
        for name, ks in self.choices.items():
            old = before.choices.get(name, {})
            row = {k: n - old.get(k, 0) for k, n in ks.items() if n - old.get(k, 0)}
            if row:
                choices[name] = row
        return ControllerStats(
            steps=self.steps - before.steps, plain_steps=self.plain_steps - before.plain_steps,
            draft_steps=self.draft_steps - before.draft_steps, probes=self.probes - before.probes,
            probe_successes=self.probe_successes - before.probe_successes, choices=choices,
            expected_tokens=self.expected_tokens - before.expected_tokens,
            expected_ms=self.expected_ms - before.expected_ms,
            expected_plain_ms=self.expected_plain_ms - before.expected_plain_ms,
            measured_tokens=self.measured_tokens - before.measured_tokens,
            measured_ms=self.measured_ms - before.measured_ms,
            measured_plain_ms=self.measured_plain_ms - before.measured_plain_ms,
            probe_budget_ms=self.probe_budget_ms, last_reason=self.last_reason,
        )

    def copy(self) -> "ControllerStats":
        return dataclasses.replace(self, choices={n: dict(ks) for n, ks in self.choices.items()})

    @property
    def mean_draft_len(self) -> float:
        """Mean draft length over the steps that drafted (probes included)."""
        n = sum(c for name, ks in self.choices.items() if name != "plain" for c in ks.values())
        total = sum(k * c for name, ks in self.choices.items() if name != "plain" for k, c in ks.items())
        return total / n if n else 0.0

    def to_dict(self) -> dict[str, object]:
        return {
            "steps": self.steps, "plain_steps": self.plain_steps, "draft_steps": self.draft_steps,
            "probes": self.probes, "probe_successes": self.probe_successes,
            "choices": {n: dict(sorted(ks.items())) for n, ks in self.choices.items()},
            "expected_gain": self.expected_gain, "measured_gain": self.measured_gain,
            "probe_budget_ms": self.probe_budget_ms, "last_reason": self.last_reason,
        }
