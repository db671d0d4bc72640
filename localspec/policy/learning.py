"""Learning from a step: what the controller keeps about each drafter, and how a step teaches it.

A verified step teaches the cost model (the verification batch's time, the step's Python work), the
drafter it used (its drafting time when asked for k, its acceptance by position, the class of the
evidence its proposal rested on, and how many tokens it verifies per planned draft token); a lookup's
proposal that was not verified is scored against the text that follows, position by position as it
comes, for free. The estimates themselves and how they forget live in ``localspec.policy.estimates``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from localspec.drafting.base import Evidence, Proposal
from localspec.events import StepEvent
from localspec.policy.costs import CostModel
from localspec.policy.decision import Decision
from localspec.policy.estimates import DrafterEstimates
from localspec.policy.pricing import line_starts
from localspec.policy.probing import ProbeState
from localspec.token_ids import common_prefix


@dataclass
class DrafterState(DrafterEstimates):
    """What the controller keeps about one drafter (by name: it outlives a generation): what it
    learned (``DrafterEstimates``), its probing (``ProbeState``) and the planning's own bookkeeping."""

    width: float = 1.0      # verified tokens per planned draft token (drafters not asked beforehand)
    last_seen: int = 0      # step of the last acceptance observation
    lookups: int = 0        # lookups since the drafter was reset (the first one indexes the prompt)
    retime_at: int = 0      # the step from which a lookup past lookup_share is asked again (to time it)
    retime_backoff: int = 0  # timings in a row that found nothing (each doubles the wait for the next)
    probe: ProbeState = field(default_factory=ProbeState)


def learn_costs(costs: CostModel, step: StepEvent, decision: Decision) -> None:
    """The verification batch's time and the step's Python work teach the cost model."""
    if step.verify_ms > 0:
        costs.observe_verify(step.batch_tokens, step.verify_ms)
    costs.observe_overhead(max(decision.draft_len, decision.tree_nodes), step.python_ms)


def learn_drafter(costs: CostModel, name: str, state: DrafterState, step: StepEvent, decision: Decision, *,
                  step_no: int, asked: bool, extra: int, ends_line: Callable[[int], bool] | None,
                  costs_too: bool = True) -> bool:
    """The drafter the step used (``name``, ``state``; ``asked``: its proposal was made while planning, ``extra``:
    its ``batch_extra_tokens``): its cost when asked for k (unless not ``costs_too``), and its acceptance over the k planned
    positions (a proposal shorter than planned counts its missing positions as rejected, so expected
    tokens match what such steps really emit). Returns whether its evidence calibration learned (the
    other drafters' calibrations age)."""
    grown = decision.tree_nodes > decision.draft_len  # a tree the drafter grew (asked by propose_tree)
    if costs_too and not asked and decision.behind <= 8:
        own_ms = max(0.0, step.draft_ms - decision.proposal_ms - costs.catch_up_ms(name, decision.behind))
        if grown:
            costs.observe_tree_draft(name, decision.draft_len, decision.tree_nodes, own_ms)
        else:
            costs.observe_draft(name, decision.draft_len, own_ms)
    idle = max(0, step_no - state.last_seen - 1)
    if grown and step.walk:
        # The chain within the tree (each first child) teaches the chain's rates; the further
        # children where a first one was rejected teach the siblings' (see learn_walk).
        drafted, kept = state.learn_walk(step.walk)
        state.acceptance.update(drafted, kept, idle_steps=idle)
    else:
        state.acceptance.update(decision.draft_len, step.accepted, idle_steps=idle)
    calibrated = False
    evidence = decision.proposal.evidence if decision.proposal is not None else None
    if evidence is not None:
        estimate = state.evidence_acceptance(evidence)
        state.calibrate(step.accepted, decision.expected_tokens - 1.0, state.calibrated(estimate))
        chain = decision.proposal.tokens if isinstance(decision.proposal, Proposal) else ()
        state.learn_evidence(evidence, line_starts(chain, decision.draft_len, evidence, ends_line),
                             decision.draft_len, step.accepted)
        calibrated = True
    if not asked and not grown:
        candidates = max(0.0, step.batch_tokens - 1 - extra)
        state.width += 0.1 * (candidates / decision.draft_len - state.width)
    state.last_seen = step_no
    return calibrated


def score_unused(state: DrafterState, branches: Sequence[Sequence[int]], emitted: Sequence[int], *,
                 step_no: int, evidence: Evidence | None, known: int,
                 ends_line: Callable[[int], bool] | None) -> None:
    """Score a deterministic drafter's proposal that was not verified (``branches``: its candidate
    continuations) against the tokens that followed (``emitted``); see ``Controller.observe_unused``."""
    longest = max((len(b) for b in branches), default=0)
    if longest == 0:
        return
    matched = max(common_prefix(b, emitted) for b in branches)
    idle = max(0, step_no - state.last_seen - 1)
    reached = matched if matched >= len(emitted) else longest  # past the text's end: unknown
    state.acceptance.update(reached, matched, idle_steps=idle, known=known)
    if evidence is not None:
        chain = branches[0] if len(branches) == 1 else ()
        state.learn_evidence(evidence, line_starts(chain, reached, evidence, ends_line), reached, matched,
                             known=known)
    state.last_seen = step_no
