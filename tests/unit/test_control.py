"""The controller, on simulated costs and acceptance traces.

A simulation runs the controller against simulated drafters over a text
whose token at position i is i: a drafter's proposal matches the text for a
run of positions drawn from its acceptance rate (which may change mid-way),
time is charged from a "true" cost model on a simulated clock, and the
controller is fed each step exactly as the engine would. All times are
simulated: nothing here measures the machine.
"""

from __future__ import annotations

import dataclasses

import math
import random
import subprocess
import sys
from typing import Callable, Mapping, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localspec.policy.controller import LOOKUP_RETIME, Controller
from localspec.policy.decision import ControllerStats, Decision
from localspec.policy.estimates import (
    AGREEMENT_CLASSES,
    MATCH_CLASSES,
    DecayingAcceptance,
    UnusedProposals,
    best_path,
    evidence_class,
    evidence_prior,
    proposal_branches,
    tree_confidence,
)
from localspec.policy.costs import CostModel
from localspec.drafting.base import DrafterBase, Evidence, Proposal, TreeProposal
from localspec.drafting.tree import build_tree
from localspec.events import StepEvent

# ms for one decode of k tokens: SmolLM2-135M on 2 CPU threads, and a GPU that verifies 8 for the price of 1.
CPU = {1: 5.4, 2: 11.3, 4: 16.2, 8: 24.9, 16: 41.1}
GPU = {1: 10.0, 2: 10.1, 4: 10.2, 8: 10.5, 16: 12.0}
LOOKUP = (0.3, 0.0)      # ms: fixed, per token
CHEAP_LOOKUP = (0.02, 0.0)  # an n-gram lookup: asked before planning every step
DRAFT_MODEL = (1.0, 5.0)  # a draft model as slow as the CPU target: never worth it there
ROOM = 10**6


class Clock:
    """Simulated seconds."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def spend(self, ms: float) -> None:
        self.now += ms / 1e3


class SimDrafter(DrafterBase):
    """A drafter whose proposal for ``history`` matches the text (token i at position i) for a run
    of positions drawn at ``rate(step)``, and which spends simulated time proposing.

    ``cost``: (fixed, per token) ms; ``upkeep``: the decode costs of a draft model, which must
    also catch up on every token since it last drafted (its prefill, the first time).
    """

    def __init__(self, sim: "Sim", name: str, rate: Callable[[int], float], *, cost: tuple[float, float] = LOOKUP,
                 cheap: bool = False, depth: int = 8, extra: int = 0, upkeep: CostModel | None = None) -> None:
        self.sim, self.name, self.rate, self.cost = sim, name, rate, cost
        self.cheap = cheap  # type: ignore[misc]
        self.batch_extra_tokens = extra  # type: ignore[misc]
        self.depth, self.upkeep = depth, upkeep
        self.synced = 0  # a draft model's cache holds history[:synced]
        self.proposals = 0
        self.decoded = 0  # tokens a draft model decoded (catch-up and drafts)

    def behind(self, history: Sequence[int]) -> int:
        return len(history) - min(self.synced, len(history) - 1) if self.upkeep is not None else 0

    def propose(self, history: Sequence[int], draft_len: int) -> Proposal:
        self.proposals += 1
        n = min(draft_len, self.depth) if self.cheap else draft_len
        if self.upkeep is not None:
            behind = self.behind(history)
            self.sim.clock.spend(self.upkeep.verify_ms(behind) + (n - 1) * self.upkeep.verify_ms(1))
            self.decoded += behind + n - 1
            self.synced = len(history) + n - 1
        else:
            self.sim.clock.spend(self.cost[0] + self.cost[1] * n)
        matched = self.sim.chain(self.rate(self.sim.step), n)
        start = len(history)
        return Proposal(tuple(range(start, start + matched)) + (-1,) * (n - matched), None, self.name)

    def accepted(self, history: Sequence[int], n_accepted: int) -> None:
        self.synced = min(self.synced, len(history) - 1)


class Sim:
    """A controller run against simulated drafters (``rates[name](step)``: true per-position acceptance).

    Drafters in ``shadow`` are cheap lookups (proposals 8 deep) the controller asks before planning;
    ``upkeep`` names draft models whose decode costs are ``points`` (as costly as the target).
    """

    def __init__(self, points: Mapping[int, float], rates: Mapping[str, Callable[[int], float]], *,
                 draft_costs: Mapping[str, tuple[float, float]] | None = None, shadow: tuple[str, ...] = (),
                 upkeep: tuple[str, ...] = (), extra: Mapping[str, int] | None = None, seed: int = 0,
                 prompt: int = 10, **controller_kw) -> None:
        self.truth = CostModel(points)
        self.clock = Clock()
        self.rng = random.Random(seed)
        self.step = 0
        self.history = list(range(prompt))
        default = {name: CHEAP_LOOKUP if name in shadow else LOOKUP for name in rates}
        self.drafters = {name: SimDrafter(self, name, rate, cost=(draft_costs or {}).get(name, default[name]),
                                          cheap=name in shadow, extra=(extra or {}).get(name, 0),
                                          upkeep=CostModel(points) if name in upkeep else None)
                         for name, rate in rates.items()}
        self.ctl = Controller(CostModel(points), list(self.drafters.values()), clock=self.clock, **controller_kw)
        for name, d in self.drafters.items():
            if d.upkeep is not None:
                self.ctl.costs.set_model_drafter(name, CostModel(points))
            else:
                self.ctl.costs.set_draft_cost(name, *d.cost)
        self.total_ms = 0.0
        self.tokens = 0
        self.decisions: list[Decision] = []

    @property
    def plain_ms(self) -> float:
        return self.truth.verify_ms(1) + self.truth.overhead_ms(0)

    @property
    def speed_vs_plain(self) -> float:
        return self.tokens * self.plain_ms / self.total_ms

    def chain(self, rate: float, depth: int) -> int:
        n = 0
        while n < depth and self.rng.random() < rate:
            n += 1
        return n

    def run(self, n_steps: int, max_k: int = 64) -> list[Decision]:
        return [self.one(max_k) for _ in range(n_steps)]

    def one(self, max_k: int = 64, remaining: int = ROOM) -> Decision:
        history = self.history
        decision = self.ctl.plan(history, room=max_k, remaining=remaining)
        k, drafter, proposal = decision.draft_len, decision.drafter, decision.proposal
        t = self.clock()
        if not decision.plain and proposal is None:
            proposal = drafter.propose(history, k)
        own_ms = (self.clock() - t) * 1e3
        draft = tuple(proposal.tokens[:k]) if proposal is not None and not decision.plain else ()
        accepted = 0
        while accepted < len(draft) and draft[accepted] == len(history) + accepted:
            accepted += 1
        extra = drafter.batch_extra_tokens if drafter is not None and not decision.plain else 0
        batch = 1 + len(draft) + extra
        tokens = tuple(range(len(history), len(history) + accepted + 1))
        step = StepEvent(index=self.step + 1, drafter=drafter.name if draft else None, drafted=len(draft),
                         accepted=accepted, emitted=len(tokens), draft_ms=decision.proposal_ms + own_ms,
                         verify_ms=self.truth.verify_ms(batch), python_ms=self.truth.overhead_ms(len(draft)),
                         verified=len(draft), tokens=tokens, batch_tokens=batch)
        history.extend(tokens)
        if not decision.plain:
            drafter.verified(len(draft))
            drafter.accepted(history, accepted)
        self.ctl.observe(step, history)
        self.total_ms += step.step_ms
        self.tokens += len(tokens)
        self.step += 1
        self.decisions.append(decision)
        return decision


class Named(DrafterBase):
    """A drafter that only has a name (for planning without proposing)."""

    def __init__(self, name: str, *, cheap: bool = False, extra: int = 0, tokens: tuple[int, ...] = ()) -> None:
        self.name, self.tokens = name, tokens
        self.cheap = cheap  # type: ignore[misc]
        self.batch_extra_tokens = extra  # type: ignore[misc]
        self.kept: list[int] = []

    def propose(self, history: Sequence[int], draft_len: int) -> Proposal:
        return Proposal(self.tokens[:draft_len], None, self.name)

    def accepted(self, history: Sequence[int], n_accepted: int) -> None:
        self.kept.append(n_accepted)


def controller(points: Mapping[int, float], *names: str, **kw) -> Controller:
    return Controller(CostModel(points), [Named(n) for n in names], **kw)


def plan(ctl: Controller, max_k: int = 64, history: Sequence[int] = (0,)) -> Decision:
    return ctl.plan(list(history), room=max_k, remaining=ROOM)


def step_event(tokens: tuple[int, ...], drafter: str | None, drafted: int, accepted: int, *, draft_ms: float = 0.0,
               verify_ms: float = 0.0, verified: int | None = None, batch: int | None = None) -> StepEvent:
    verified = drafted if verified is None else verified
    return StepEvent(index=0, drafter=drafter, drafted=drafted, accepted=accepted, emitted=len(tokens),
                     draft_ms=draft_ms, verify_ms=verify_ms, python_ms=0.0, verified=verified, tokens=tokens,
                     batch_tokens=1 + verified if batch is None else batch)


def teach(ctl: Controller, name: str, rates: list[float], evidence: float = 1000.0) -> None:
    """Give a drafter a well-established acceptance profile."""
    est = ctl.acceptance(name)
    est.reached = [evidence] * len(rates)
    est.kept = [evidence * a for a in rates]


def brute_force(ctl: Controller, name: str, max_k: int) -> tuple[int, float, float]:
    """(k, tokens, ms) maximising tokens/ms, from the objective written out independently."""
    rates = ctl.acceptance(name).rates(max_k)
    best = (0, 1.0, ctl.costs.verify_ms(1) + ctl.costs.overhead_ms(0))
    for k in range(1, max_k + 1):
        tokens = 1.0 + sum(math.prod(rates[: i + 1]) for i in range(k))
        ms = ctl.costs.draft_ms(name, k) + ctl.costs.verify_ms(k + 1) + ctl.costs.overhead_ms(k)
        if tokens / ms > best[1] / best[2]:
            best = (k, tokens, ms)
    return best


# --- the objective -------------------------------------------------------------------
def test_plain_where_drafting_loses() -> None:
    """On a small CPU, verifying k+1 tokens costs ~k/2 plain steps: 60% acceptance cannot pay."""
    ctl = controller(CPU, "ngram")
    teach(ctl, "ngram", [0.6] * 16)
    decision = plan(ctl)
    assert decision.plain and decision.draft_len == 0 and decision.drafter is None and decision.name is None
    assert decision.speedup == 1.0
    assert decision.reason.startswith("speculation off: best expected 0.")
    k, tokens, ms = brute_force(ctl, "ngram", 15)
    assert tokens / ms * ctl.costs.plain_ms() < 1.05  # the brute force agrees: nothing beats plain by 5%


@pytest.mark.parametrize("points, rates", [
    (GPU, [0.8] * 16),
    (GPU, [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1] + [0.05] * 7),
    (GPU, [0.3] * 16),
    (CPU, [0.97] * 16),
    (CPU, [0.95, 0.95, 0.9, 0.9, 0.5, 0.5, 0.5, 0.5] + [0.2] * 8),
], ids=["gpu-flat", "gpu-falling", "gpu-weak", "cpu-strong", "cpu-shallow"])
def test_picks_the_optimal_length(points: Mapping[int, float], rates: list[float]) -> None:
    ctl = controller(points, "d")
    teach(ctl, "d", rates)
    decision = plan(ctl)
    k, tokens, ms = brute_force(ctl, "d", ctl.draft_len_cap)
    assert k > 0
    assert (decision.name, decision.draft_len) == ("d", k)
    assert decision.expected_tokens == pytest.approx(tokens)
    assert decision.expected_ms == pytest.approx(ms)
    assert decision.speedup == pytest.approx(tokens / ms * ctl.costs.plain_ms())
    assert decision.reason.startswith(f"d k={k}: expected {tokens:.1f} tok/step at ")


@settings(max_examples=150, deadline=None)
@given(
    steps=st.lists(st.floats(0.0, 5.0), min_size=4, max_size=4),
    base=st.floats(1.0, 50.0),
    rates=st.lists(st.floats(0.0, 0.99), min_size=16, max_size=16),
    max_k=st.integers(0, 20),
)
def test_decision_matches_brute_force(steps: list[float], base: float, rates: list[float], max_k: int) -> None:
    points, ms = {}, base
    for k, step in zip((1, 2, 4, 8, 16), [0.0, *steps]):
        ms += step * k
        points[k] = ms
    ctl = controller(points, "d")
    teach(ctl, "d", rates)
    decision = plan(ctl, max_k)
    k, tokens, ms = brute_force(ctl, "d", min(max_k, ctl.draft_len_cap))
    best = tokens / ms * ctl.costs.plain_ms()
    # (near-ties, within rounding, may go either way)
    if k and best >= 1.05 + 1e-9:
        assert decision.name == "d" and 1 <= decision.draft_len <= max_k
        assert decision.speedup == pytest.approx(best, rel=1e-9)
    elif not k or best < 1.05 - 1e-9:
        assert decision.plain


def test_room_and_tokens_left_limit_the_draft_and_the_reason_says_which() -> None:
    ctl = controller(GPU, "d")
    teach(ctl, "d", [0.95] * 16)
    assert plan(ctl, 3).draft_len == 3
    assert ctl.plan([0], room=64, remaining=3).draft_len == 2  # a draft of 2 and the target's token
    assert plan(ctl, 0).reason == "plain: the context has no room for a draft"
    assert ctl.plan([0], room=64, remaining=1).reason == "plain: one token left to generate"
    ctl.draft_len_limit = 0  # the engine's bound from the backend
    assert plan(ctl).reason == "plain: the model cannot roll back a draft"
    ctl.draft_len_limit = 4
    assert plan(ctl).draft_len == 4


def test_a_forced_plain_step_leaves_the_last_reason() -> None:
    """A reply's last token can only be plain; the summary keeps the reason that weighed drafting."""
    ctl = controller(CPU, "draft")
    ctl.costs.set_draft_cost("draft", *DRAFT_MODEL)
    first = plan(ctl)
    ctl.observe(step_event((1,), None, 0, 0), [0, 1])
    last = ctl.plan([0, 1], room=64, remaining=1)
    assert last.reason == "plain: one token left to generate"
    assert ctl.stats.last_reason == first.reason and first.reason.startswith("speculation off")


def test_lookups_cap_the_depth_and_a_tree_its_confidence() -> None:
    ctl = Controller(CostModel(GPU), [Named("ngram", cheap=True, tokens=(1, 2, 3, 4))])
    teach(ctl, "ngram", [0.9] * 16)
    decision = plan(ctl)
    assert (decision.name, decision.draft_len) == ("ngram", 4)
    assert decision.proposal is not None and decision.proposal.tokens == (1, 2, 3, 4)
    ctl.observe(step_event((1, 2, 3, 4, 5), "ngram", 4, 4), [0, 1, 2, 3, 4, 5])
    empty = Controller(CostModel(GPU), [Named("ngram", cheap=True)])
    assert plan(empty).reason == "plain: no drafter has a proposal"
    sure = ctl.expected_tokens("ngram", 4)
    unsure = ctl.expected_tokens("ngram", 4, (0.9, 0.2, 0.2, 0.2))
    assert unsure < sure


def test_tree_confidence_and_best_path() -> None:
    """A tree's own confidence at depth d+1: the mass of its nodes there over the mass at depth d."""
    tree = build_tree([((1, 2, 3), 3.0), ((1, 2, 4), 1.0), ((5,), 1.0)])
    assert tree_confidence(tree) == pytest.approx((1.0, 0.8, 1.0))  # 1 -> 1,5 (all); 1 -> 1,2 (4/5); 1,2 -> 3 or 4
    path, confidence = best_path(tree)
    assert path == (1, 2, 3) and confidence == pytest.approx((0.8, 1.0, 0.75))
    assert sorted(proposal_branches(TreeProposal(tree, "ngram"))) == [(1, 2, 3), (1, 2, 4), (5,)]
    assert proposal_branches(Proposal((7, 8))) == ((7, 8),) and proposal_branches(Proposal()) == ()


class TreeLookup(Named):
    def __init__(self, tree) -> None:
        super().__init__("ngram", cheap=True)
        self.tree = tree

    def propose(self, history: Sequence[int], draft_len: int) -> TreeProposal:
        return TreeProposal(self.tree, self.name)


def test_the_width_of_a_tree_is_chosen_by_its_cost() -> None:
    """Two continuations, one seen 9 times in 10: on a GPU both are verified (a wider batch costs
    nothing), on a CPU, where every verified token costs, only the most probable path is."""
    tree = build_tree([((1, 2, 3, 4), 9.0), ((5, 6, 7, 8), 1.0)])
    for points, want_tree in ((GPU, True), (CPU, False)):
        ctl = Controller(CostModel(points), [TreeLookup(tree)])
        teach(ctl, "ngram", [0.99] * 16)
        decision = plan(ctl)
        assert decision.name == "ngram" and decision.draft_len == 4
        assert isinstance(decision.proposal, TreeProposal) is want_tree, points
        if want_tree:
            assert "as a 8-node tree" in decision.reason
            assert decision.expected_ms == pytest.approx(ctl.costs.verify_ms(1 + 8) + ctl.costs.overhead_ms(4))


def test_a_drafter_proposing_after_planning_costs_its_learned_width() -> None:
    """A drafter verifying 3 candidate tokens per planned token is planned at 1 + 3k verified tokens."""
    ctl = controller(CPU, "lookahead", draft_len=4)
    for i in range(60):
        plan(ctl)
        ctl.observe(step_event((i,), None, 4, 0, draft_ms=0.3, verified=12), [i])
    _, ms = ctl.evaluate("lookahead", 4)
    expected = ctl.costs.draft_ms("lookahead", 4) + ctl.costs.verify_ms(1 + 3 * 4) + ctl.costs.overhead_ms(4)
    assert ms == pytest.approx(expected, rel=0.02)


# --- a lookup's evidence -------------------------------------------------------------
class EvidenceLookup(Named):
    """A cheap lookup offering ``tokens`` resting on ``evidence`` (cut to the depth asked, like a real one)."""

    def __init__(self, tokens: tuple[int, ...], evidence: Evidence) -> None:
        super().__init__("ngram", cheap=True, tokens=tokens)
        self.evidence = evidence

    def propose(self, history: Sequence[int], draft_len: int) -> Proposal:
        return Proposal(self.tokens[:draft_len], None, self.name,
                        dataclasses.replace(self.evidence, support=self.evidence.support[:draft_len]))


LONG_COPY = Evidence(20, 1, (1.0,) * 15)   # a 20-token match: a copy in progress
ONE_TOKEN = Evidence(1, 6, (0.4,) * 15)    # one shared token, its six continuations split


def test_evidence_classes_and_priors() -> None:
    GAPPED, LOOP = AGREEMENT_CLASSES.index("gapped"), AGREEMENT_CLASSES.index("loop")
    assert evidence_class(LONG_COPY) == (MATCH_CLASSES.index(16), 0)
    assert evidence_class(ONE_TOKEN) == (0, 3)
    assert evidence_class(Evidence(4, 3, (1.0, 0.5))) == (3, 1)
    assert evidence_class(Evidence(9, 3, (0.6,))) == (MATCH_CLASSES.index(8), 2)
    # a match but for one token, however its occurrences agree: a class apart for each match length
    assert evidence_class(Evidence(9, 3, (0.6,), gapped=True)) == (MATCH_CLASSES.index(8), GAPPED)
    assert evidence_class(Evidence(20, 1, (1.0,), gapped=True)) == (MATCH_CLASSES.index(16), GAPPED)
    # a loop carried on: a class apart, by how long the loop has run
    assert evidence_class(Evidence(6, 1, (1.0,), loop=9)) == (MATCH_CLASSES.index(8), LOOP)
    assert evidence_class(Evidence(32, 4, (1.0,), loop=32)) == (MATCH_CLASSES.index(32), LOOP)
    priors = [evidence_prior(c) for c in range(len(MATCH_CLASSES))]
    assert priors == sorted(priors) and priors[0] == 0.5 and priors[-1] > 0.95


def test_a_long_copy_drafts_long_and_a_weak_guess_not_at_all() -> None:
    """The same 15 tokens offered on a CPU: resting on a 20-token match, nearly all of them are
    verified; resting on one shared token whose continuations split, none (verifying even one
    more token costs twice a plain step there)."""
    tokens = tuple(range(1, 16))
    long_copy = plan(Controller(CostModel(CPU), [EvidenceLookup(tokens, LONG_COPY)]))
    weak = plan(Controller(CostModel(CPU), [EvidenceLookup(tokens, ONE_TOKEN)]))
    assert long_copy.name == "ngram" and long_copy.draft_len >= 8
    assert weak.plain and weak.reason.startswith("speculation off")


def test_each_class_of_evidence_learns_its_acceptance_from_the_text() -> None:
    """4-gram matches seen once that the text never follows, 20-token matches it always follows:
    scored against the text on plain steps, each class learns its own rate, and the 4-gram's
    offers stop being drafted while the long copy drafts its whole depth."""
    four = Evidence(4, 1, (1.0,) * 8)
    long_copy = Evidence(20, 1, (1.0,) * 8)
    ctl = Controller(CostModel(CPU), [Named("ngram", cheap=True)])
    before = ctl.expected_tokens("ngram", 8, evidence=four)
    for _ in range(30):
        ctl.observe_shadow("ngram", [(1, 2, 3, 4, 5, 6, 7, 8)], [9] * 8, deferred=True, evidence=four)
        ctl.observe_shadow("ngram", [(1, 2, 3, 4, 5, 6, 7, 8)], [1, 2, 3, 4, 5, 6, 7, 8], deferred=True,
                           evidence=long_copy)
    assert ctl.expected_tokens("ngram", 8, evidence=four) < 1.25 < 3.0 < before
    assert ctl.expected_tokens("ngram", 8, evidence=long_copy) > 8.0
    tokens = tuple(range(1, 9))
    four_offer = Controller(ctl.costs, [EvidenceLookup(tokens, four)])
    four_offer._states = ctl._states
    assert plan(four_offer).plain
    long_offer = Controller(ctl.costs, [EvidenceLookup(tokens, long_copy)])
    long_offer._states = ctl._states
    assert plan(long_offer).draft_len == 8


def test_a_loop_is_learned_apart_from_matches_of_its_length() -> None:
    """A greedy reply breaks its short repeats (an import line twice, then another) and then loops
    for good. Offers resting on 10-token matches that the text left are learned as failures; an offer
    of the same match length that carries on a loop is judged by how loops fare, and is drafted."""
    tokens = tuple(range(1, 9))
    left = Evidence(10, 1, (1.0,) * 8)
    loop = Evidence(10, 1, (1.0,) * 8, loop=12)
    ctl = Controller(CostModel(CPU), [Named("ngram", cheap=True)])
    for _ in range(30):
        ctl.observe_shadow("ngram", [tokens], [9] * 8, deferred=True, evidence=left)
    assert ctl.expected_tokens("ngram", 8, evidence=left) < 1.25 < 3.0 < ctl.expected_tokens("ngram", 8, evidence=loop)
    for evidence, drafts in ((left, False), (loop, True)):
        offer = Controller(ctl.costs, [EvidenceLookup(tokens, evidence)])
        offer._states = ctl._states
        assert plan(offer).plain is not drafts


def test_verified_steps_teach_the_class_of_their_evidence() -> None:
    """A long match whose drafts are all rejected: within a few dozen steps it is no longer drafted."""
    ctl = Controller(CostModel(CPU), [EvidenceLookup(tuple(range(100, 115)), LONG_COPY)])
    history = [0]
    drafted = []
    for _ in range(40):
        decision = plan(ctl, history=history)
        drafted.append(decision.draft_len)
        history.append(len(history))
        ctl.observe(step_event((history[-1],), "ngram" if decision.draft_len else None, decision.draft_len, 0),
                    history)
    assert drafted[0] >= 8 and drafted[-1] == 0


NL = 99  # a token that ends a line


def copies_that_part_where_lines_start(ctl: Controller, evidence: Evidence, rounds: int = 20) -> None:
    """A rewrite's copies, scored against the text: each follows its source to the end of a line
    (wherever in the draft that falls) and parts at the next line's first token; copies that cross
    no line end are kept whole."""
    for _ in range(rounds):
        for cut in (2, 3, 4, 5):
            draft = tuple(range(1, cut)) + (NL,) + tuple(range(10, 18 - cut))
            text = list(draft[:cut]) + [7] * (8 - cut)
            ctl.observe_shadow("ngram", [draft], text, deferred=True, evidence=evidence)
        ctl.observe_shadow("ngram", [tuple(range(20, 28))], list(range(20, 28)), deferred=True, evidence=evidence)


def test_a_draft_token_that_starts_a_line_is_judged_by_how_line_starts_fare() -> None:
    """Copies part at line starts, at whatever draft position those fall: the class keeps its
    rates by position (its drafts are right up to the line's end), line-starting tokens learn their
    own, and a proposal is expected to keep less where it crosses a line end, and as much as ever
    where it crosses none."""
    copy = Evidence(6, 1, (1.0,) * 8)
    ctl = Controller(CostModel(CPU), [Named("ngram", cheap=True)], ends_line=lambda t: t == NL)
    copies_that_part_where_lines_start(ctl, copy)
    state = ctl._states["ngram"]
    assert state.line_start_rate < 0.15
    assert min(state.evidence_acceptance(copy).rates(8)) > 0.9  # no dip by position
    crossing = ctl._expected_by_length("ngram", 8, evidence=copy, tokens=(1, 2, NL, 4, 5, 6, 7, 8))
    straight = ctl._expected_by_length("ngram", 8, evidence=copy, tokens=tuple(range(1, 9)))
    assert crossing[8] < 4.5 < 7.0 < straight[8]  # 1 + the three tokens up to the line end, and little more
    # planning: the offer that crosses a line end is drafted up to it, the straight one whole
    for tokens, most in ((1, 2, NL, 4, 5, 6, 7, 8), 3), (tuple(range(1, 9)), 8):
        offer = Controller(ctl.costs, [EvidenceLookup(tokens, copy)], ends_line=lambda t: t == NL)
        offer._states = ctl._states
        assert plan(offer).draft_len == most

    # without line structure the same copies leave a dip by position over every draft of the class
    blind = Controller(CostModel(CPU), [Named("ngram", cheap=True)])
    copies_that_part_where_lines_start(blind, copy)
    assert min(blind._states["ngram"].evidence_acceptance(copy).rates(8)) < 0.7
    assert blind._expected_by_length("ngram", 8, evidence=copy, tokens=tuple(range(1, 9)))[8] < straight[8] - 2.0


def test_a_loops_line_starts_are_judged_by_its_class() -> None:
    """Copies that part where lines start teach line starts a low rate; a loop repeats its lines whole,
    so an offer that carries one on is judged by its class alone, line starts included, and is drafted
    across them; its break at a line start teaches the class, not the line-start rate."""
    ctl = Controller(CostModel(CPU), [Named("ngram", cheap=True)], ends_line=lambda t: t == NL)
    copies_that_part_where_lines_start(ctl, Evidence(6, 1, (1.0,) * 8))
    state = ctl._states["ngram"]
    assert state.line_start_rate < 0.15
    lines = (1, 2, NL) * 3
    loop = Evidence(6, 1, (1.0,) * 8, loop=9)
    for _ in range(10):  # the loop holds
        ctl.observe_shadow("ngram", [lines[:8]], list(lines[:8]), deferred=True, evidence=loop)
    crossing = ctl._expected_by_length("ngram", 8, evidence=loop, tokens=lines[:8])
    assert crossing == ctl._expected_by_length("ngram", 8, evidence=loop, tokens=tuple(range(1, 9)))
    assert crossing[8] > 7.0
    offer = Controller(ctl.costs, [EvidenceLookup(lines[:8], loop)], ends_line=lambda t: t == NL)
    offer._states = ctl._states
    assert plan(offer).draft_len == 8
    rate = state.line_start_rate
    ctl.observe_shadow("ngram", [lines[:8]], [1, 2, NL, 5, 5, 5, 5, 5], deferred=True, evidence=loop)
    assert state.line_start_rate == rate  # the loop's break taught its class
    assert state.evidence_acceptance(loop).reached[3] > state.evidence_acceptance(loop).kept[3]


def test_a_verified_draft_that_breaks_where_a_line_starts_teaches_the_line_start() -> None:
    copy = Evidence(6, 1, (1.0,) * 8)
    tokens = (1, 2, NL, 4, 5, 6, 7, 8)
    ctl = Controller(CostModel(GPU), [EvidenceLookup(tokens, copy)], ends_line=lambda t: t == NL)
    state = ctl._states["ngram"]
    before = state.line_start_rate
    decision = plan(ctl)
    assert decision.draft_len == 8
    ctl.observe(step_event((1, 2, NL, 7), "ngram", 8, 3), [0, 1, 2, NL, 7])
    assert state.line_start_rate < before
    # the class learned the three positions it got right, not the break
    est = state.evidence_acceptance(copy)
    assert est.reached[:3] == est.kept[:3] and len(est.reached) == 3


# --- following the text --------------------------------------------------------------
def test_estimator_forgets_within_a_few_dozen_steps() -> None:
    est = DecayingAcceptance()
    for _ in range(200):
        est.update(4, 4)
    assert est.rate(0) > 0.9 and est.expected_accepted(4) > 3
    steps = 0
    while est.expected_accepted(4) > 1.0:
        est.update(4, 0)
        steps += 1
    assert steps <= 30
    # deep positions, no longer reached, lose their old evidence too and follow the shallow ones
    for _ in range(60):
        est.update(4, 0)
    assert est.rate(3) < 0.5


def test_estimator_prior_and_idle_forgetting() -> None:
    est = DecayingAcceptance(prior=0.6)
    assert est.rates(3) == pytest.approx([0.6, 0.6, 0.6])
    for _ in range(100):
        est.update(2, 0)
    low = est.rate(0)
    est.update(1, 1, idle_steps=500)  # long unobserved: old evidence hardly counts against a fresh success
    assert est.rate(0) > low + 0.2


def test_a_window_every_batch_carries_is_charged_from_the_first_step() -> None:
    """Lookahead's 14-token window: on the CPU even a good prior cannot pay for it, on a GPU it can."""
    cpu = Controller(CostModel(CPU), [Named("lookahead", extra=14)])
    assert plan(cpu, 8).plain
    tokens, ms = cpu.evaluate("lookahead", 4)
    assert ms == pytest.approx(cpu.costs.draft_ms("lookahead", 4) + cpu.costs.verify_ms(1 + 4 + 14)
                               + cpu.costs.overhead_ms(4))
    unknown = controller(CPU, "lookahead")  # without it a probe would look 4x cheaper than it is
    assert unknown.evaluate("lookahead", 3)[1] < cpu.evaluate("lookahead", 3)[1] / 2
    gpu = Controller(CostModel(GPU), [Named("lookahead", extra=14)])
    assert not plan(gpu, 8).plain
    # Learning the width leaves the window out: a batch of 1 + 4 candidates + 14 window tokens for k = 4.
    decision = plan(gpu, 4)
    gpu.observe(step_event((1, 2), "lookahead", 4, 1, verify_ms=10.0, batch=1 + 4 + 14), [0, 1, 2])
    assert decision.draft_len == 4 and gpu._states["lookahead"].width == pytest.approx(1.0)


def test_combined_drafters_are_each_planned_with_their_own_costs() -> None:
    """ngram and lookahead together: the lookup is planned without a window, lookahead with its own."""
    ctl = Controller(CostModel(CPU), [Named("ngram", cheap=True, tokens=(1, 2, 3)), Named("lookahead", extra=14)])
    teach(ctl, "ngram", [0.97] * 16)
    teach(ctl, "lookahead", [0.97] * 16)
    decision = plan(ctl)
    assert decision.name == "ngram"
    assert decision.expected_ms == pytest.approx(ctl.costs.verify_ms(1 + 3) + ctl.costs.overhead_ms(3))


def test_switches_drafters_when_one_degrades() -> None:
    """Two drafters trade places at step 400; neither is scored for free, so the new best is found by probes."""
    sim = Sim(GPU, {"a": lambda t: 0.9 if t < 400 else 0.1, "b": lambda t: 0.1 if t < 400 else 0.9})
    sim.run(1200)
    used = [d.name for d in sim.decisions if not d.probe]
    assert used[100:400].count("a") > 0.9 * 300
    assert used[900:].count("b") > 0.9 * 300


def test_cheap_drafters_scored_every_step_switch_within_dozens_of_steps() -> None:
    sim = Sim(CPU, {"a": lambda t: 0.97 if t < 300 else 0.1, "b": lambda t: 0.1 if t < 300 else 0.97},
              shadow=("a", "b"))
    sim.run(600)
    assert all(not d.probe for d in sim.decisions)  # shadow scoring needs no probes
    used = [d.name for d in sim.decisions]
    assert used[100:300].count("a") > 0.9 * 200
    switched = next(t for t in range(300, 600) if used[t] == "b")
    assert switched - 300 <= 60
    assert used[400:].count("b") > 0.9 * 200
    # Every drafter follows the text: each was told the outcome of every step (with 0 when unused).
    assert all(d.proposals == 600 for d in sim.drafters.values())


def test_a_lookup_that_turns_out_costly_is_no_longer_asked_before_planning() -> None:
    """Asking first is paid on every step; a 'cheap' drafter that takes longer than a plain step's 2%
    is asked only when the controller plans to draft with it."""
    sim = Sim(CPU, {"ngram": lambda t: 0.0}, shadow=("ngram",), draft_costs={"ngram": (2.0, 0.0)})
    sim.ctl.costs.set_draft_cost("ngram", 0.01, 0.0)  # the controller first believes it cheap
    sim.run(100)
    asked = sim.drafters["ngram"].proposals
    # the first lookup (indexing the prompt) is not judged; a few more are, then one every LOOKUP_RETIME steps
    assert 2 <= asked <= 12 + 100 // LOOKUP_RETIME
    assert sum(1 for d in sim.decisions if d.proposal is not None) == 0  # none was worth verifying


class SpikyLookup(Named):
    """A cheap lookup taking 0.03 ms of the simulated clock, except the ``spikes``-th calls, caught by a
    garbage collection (4 ms)."""

    def __init__(self, clock: Clock, spikes: set[int]) -> None:
        super().__init__("ngram", cheap=True, tokens=(-1,) * 8)
        self.clock, self.spikes, self.calls = clock, spikes, 0

    def propose(self, history: Sequence[int], draft_len: int) -> Proposal:
        self.calls += 1
        self.clock.spend(4.0 if self.calls in self.spikes else 0.03)
        return super().propose(history, draft_len)


def test_a_lookup_caught_by_a_pause_is_still_asked_before_planning() -> None:
    """A few lookups caught by a pause (milliseconds, where a lookup takes microseconds) must not lift
    its estimate past a plain step's 2%: a lookup no longer asked is not timed again, and the copy it
    would have offered goes undrafted (SmolLM2's rename reply, replayed with two such pauses: 85 -> 141
    steps)."""
    clock = Clock()
    lookup = SpikyLookup(clock, {10, 11, 12, 30, 31})
    ctl = Controller(CostModel(CPU), [lookup], clock=clock)
    history = [0]
    for _ in range(60):
        plan(ctl, history=history)
        history.append(len(history))
        ctl.observe(step_event((history[-1],), None, 0, 0), history)
    assert lookup.calls == 60  # asked at every step
    assert ctl.costs.draft_ms("ngram", 8) < 0.02 * ctl.costs.plain_ms()


class ColdLookup(Named):
    """A cheap lookup whose first ``slow`` calls take 0.5 ms of the simulated clock (cold caches after
    the prompt's indexing), every later one 0.03 ms."""

    def __init__(self, clock: Clock, slow: int) -> None:
        super().__init__("ngram", cheap=True, tokens=(-1,) * 8)
        self.clock, self.slow, self.calls = clock, slow, 0

    def propose(self, history: Sequence[int], draft_len: int) -> Proposal:
        self.calls += 1
        self.clock.spend(0.5 if self.calls <= self.slow else 0.03)
        return super().propose(history, draft_len)


def test_a_lookup_slow_at_first_is_timed_again_and_asked_every_step_once_fast() -> None:
    """A cold start: SmolLM2's extract reply copied 50 tokens of the minutes undrafted because its first
    timed lookups were slow, the estimate passed 2% of a plain step, and a lookup not asked was never
    timed again ("speculation off ... probing again in 58 steps")."""
    clock = Clock()
    lookup = ColdLookup(clock, slow=3)
    ctl = Controller(CostModel(CPU), [lookup], clock=clock)
    history = [0]
    asked = []
    for _ in range(100):
        before = lookup.calls
        plan(ctl, history=history)
        asked.append(lookup.calls > before)
        history.append(len(history))
        ctl.observe(step_event((history[-1],), None, 0, 0), history)
    assert not all(asked[:40])  # the slow start did take it out of planning for a while (what is tested)
    assert all(asked[-40:])  # and, timed again, it is back to every step
    assert ctl.costs.draft_ms("ngram", 8) < 0.02 * ctl.costs.plain_ms()


class SlowController(Controller):
    """A controller whose pricing of an asked lookup's offers takes ``pricing_ms`` of the simulated clock,
    and observing a step ``observe_ms``."""

    def __init__(self, *args, pricing_ms: float, observe_ms: float, **kw) -> None:
        super().__init__(*args, **kw)
        self.pricing_ms, self.observe_ms = pricing_ms, observe_ms

    def _asked_options(self, drafter, proposal, limit):
        self.clock.spend(self.pricing_ms)
        return super()._asked_options(drafter, proposal, limit)

    def _observe(self, step, history):
        self.clock.spend(self.observe_ms)
        super()._observe(step, history)


def run_plain(ctl: Controller, steps: int) -> list[Decision]:
    """Plan ``steps`` steps that each decode one token plainly (nothing drafted is ever verified)."""
    history, decisions = [0], []
    for _ in range(steps):
        decisions.append(plan(ctl, history=history))
        history.append(len(history))
        ctl.observe(step_event((history[-1],), None, 0, 0), history)
    return decisions


def test_the_controllers_own_time_is_handed_to_the_step() -> None:
    """A lookup's own time is the step's draft time (``proposal_ms``) and what it is learned to cost:
    asking it first is what the 2% rule bounds. Pricing the options happens whether a drafter was asked
    or not, so it is planning: with observing the step before, it is handed to the step as
    ``planning_ms``, which the engine counts in the step's Python time (and the overhead estimate learns)."""
    clock = Clock()
    lookup = SpikyLookup(clock, set())  # 0.03 ms a lookup
    ctl = SlowController(CostModel(CPU), [lookup], clock=clock, pricing_ms=0.05, observe_ms=0.1)
    decisions = run_plain(ctl, 30)
    assert lookup.calls == 30
    assert all(d.proposal_ms == pytest.approx(0.03) for d in decisions)
    assert decisions[0].planning_ms == pytest.approx(0.05)  # nothing observed yet
    assert all(d.planning_ms == pytest.approx(0.15) for d in decisions[1:])
    assert ctl.costs.draft_ms("ngram", ctl.draft_len_cap) == pytest.approx(0.03, rel=0.2)
    ctl.start([lookup])  # the next generation's first step pays for no observing of the last one's
    assert run_plain(ctl, 1)[0].planning_ms == pytest.approx(0.05)


def test_recovers_after_probes() -> None:
    """A drafter that was useless for 2000 steps turns good: it is drafting again within a bounded time."""
    sim = Sim(CPU, {"d": lambda t: 0.05 if t < 2000 else 0.95}, max_wait=512)
    sim.run(2000)
    probes_while_bad = sim.ctl.stats.probes
    assert probes_while_bad <= 20  # waits doubled: 8, 16, ..., 512
    sim.run(1500)
    first = next(t for t, d in enumerate(sim.decisions) if t >= 2000 and d.name and not d.probe)
    # at most one max_wait until a probe, then a few successful probes
    assert first - 2000 <= 512 + 400
    assert [d.name for d in sim.decisions[-500:]].count("d") > 450


def test_fixed_draft_length_is_honoured() -> None:
    ctl = controller(CPU, "a", "b", draft_len=5)
    teach(ctl, "a", [0.5] * 16)
    teach(ctl, "b", [0.2] * 16)
    decision = plan(ctl)  # drafting loses here, but the user asked for 5
    assert (decision.name, decision.draft_len) == ("a", 5)
    assert "draft length fixed at 5" in decision.reason
    assert plan(ctl, 3).draft_len == 3  # the context still limits it
    teach(ctl, "b", [0.9] * 16)
    assert (plan(ctl).name, plan(ctl).draft_len) == ("b", 5)  # still chooses among drafters
    assert controller(CPU, "a", draft_len=0).plan([0], room=64, remaining=ROOM).plain


def test_a_fixed_length_above_the_automatic_cap_is_honoured() -> None:
    """Issue 9: a fixed 40 ran at 16 because the automatic cap also capped a fixed length."""
    ctl = controller(CPU, "a", draft_len=40)
    assert plan(ctl).draft_len == 40 > ctl.draft_len_cap
    assert controller(CPU, "a").plan([0], room=64, remaining=ROOM).draft_len <= ctl.draft_len_cap
    with pytest.raises(ValueError, match="0..64"):
        controller(CPU, "a", draft_len=65)


def test_a_lookup_proposal_is_cut_to_a_fixed_length() -> None:
    ctl = Controller(CostModel(CPU), [Named("a", cheap=True, tokens=(1, 2))], draft_len=5)
    decision = plan(ctl)
    assert decision.draft_len == 2 and decision.proposal is not None and decision.proposal.tokens == (1, 2)


# --- never slower than plain -----------------------------------------------------------
@pytest.mark.parametrize("points", [CPU, GPU], ids=["cpu", "gpu"])
@pytest.mark.parametrize("draft_cost", [LOOKUP, DRAFT_MODEL], ids=["lookup", "draft-model"])
def test_probe_overhead_bound_with_a_useless_drafter(points: Mapping[int, float],
                                                     draft_cost: tuple[float, float]) -> None:
    sim = Sim(points, {"d": lambda t: 0.0}, draft_costs={"d": draft_cost})
    sim.run(4000)
    assert sim.speed_vs_plain >= 0.97
    stats = sim.ctl.stats
    assert stats.probes > 0 and stats.probe_successes == 0


def test_an_accurate_drafter_too_costly_to_win_is_probed_ever_more_rarely() -> None:
    """A draft model as slow as the target (the Q4_0 self-draft on a CPU) is often right, yet can never pay:
    its probes must not count as successes, or they would recur every ``min_wait`` steps."""
    sim = Sim(CPU, {"d": lambda t: 0.75}, draft_costs={"d": DRAFT_MODEL})
    sim.run(3000)
    stats = sim.ctl.stats
    assert stats.draft_steps == 0 and stats.probe_successes == 0
    assert stats.probes <= 12  # waits doubling: 8, 16, ..., 512, then every 512 steps
    assert sim.speed_vs_plain >= 0.97


@pytest.mark.parametrize("prompt", [20, 150, 600])
def test_a_draft_model_as_costly_as_the_target_never_slows_a_chat_reply(prompt: int) -> None:
    """Issue 10: the draft's prefill and catch-up are charged to the decisions that cause them. A draft
    model whose every decode costs what the target's does (the Q4_0 self-draft on a CPU), often right,
    is kept off: in a 160-token reply it decodes nothing at all, and over every prefix of a long run
    its probes, which pay its catch-up, keep the speed within 3% of plain."""
    sim = Sim(CPU, {"draft": lambda t: 0.75}, upkeep=("draft",), prompt=prompt)
    for _ in range(160):
        sim.one(remaining=ROOM)
    draft = sim.drafters["draft"]
    assert draft.decoded == 0 and draft.proposals == 0 and sim.speed_vs_plain == pytest.approx(1.0)
    assert sim.ctl.stats.last_reason.startswith("speculation off") and "catching up" in sim.ctl.stats.last_reason
    for _ in range(3000):
        sim.one()
        assert sim.speed_vs_plain >= 0.97
    assert sim.ctl.stats.draft_steps == 0


def test_probes_pay_their_catch_up_from_the_budget() -> None:
    """The same draft model charged without its catch-up is probed within 400 steps (a probe's excess is
    ~5 plain steps, which the budget covers after ~200 tokens); with its catch-up of 150+ tokens it is not."""
    without = Sim(CPU, {"draft": lambda t: 0.75}, draft_costs={"draft": DRAFT_MODEL}, prompt=150)
    without.run(400)
    assert without.ctl.stats.probes > 0
    upkeep = Sim(CPU, {"draft": lambda t: 0.75}, upkeep=("draft",), prompt=150)
    upkeep.run(400)
    assert upkeep.ctl.stats.probes == 0 and upkeep.drafters["draft"].decoded == 0


@pytest.mark.parametrize("fixed", [None, 4])
def test_a_cheap_draft_model_is_started_despite_its_prefill_but_not_before_the_first_token(fixed) -> None:
    """A draft model 10x cheaper than the target, 90% right, on a GPU: its prefill is spread over the
    tokens it will serve, so it is used from the second step instead of waiting for a probe. The
    first token waits for no prefill (issue 10: time to first token must not grow because a draft
    model is loaded); a draft length the user fixed drafts from the first step, prefill included."""
    cheap = {k: v / 10 for k, v in GPU.items()}
    sim = Sim(GPU, {"draft": lambda t: 0.9}, upkeep=("draft",), prompt=150, draft_len=fixed)
    sim.drafters["draft"].upkeep = CostModel(cheap)
    sim.ctl.costs.set_model_drafter("draft", CostModel(cheap))
    sim.run(50)
    first, second = sim.decisions[:2]
    if fixed is None:
        assert first.plain and first.reason == (
            "plain: the first token waits for no catch-up (draft is 150 tokens behind)")
        assert second.name == "draft" and "catching up 151 tokens" in second.reason
    else:
        assert first.name == "draft" and "catching up 150 tokens" in first.reason
    assert sim.speed_vs_plain > 2.0
    # the next reply's first token waits for the draft's catch-up over the new prompt too
    sim.ctl.start(list(sim.drafters.values()), draft_len=fixed)
    sim.history.extend(range(len(sim.history), len(sim.history) + 20))
    assert sim.one().plain is (fixed is None)
    assert sim.one().name == "draft"


def test_probe_budget_holds_over_a_short_run_on_cpu() -> None:
    """On a CPU the prior already says no, so only probes cost: the budget keeps every prefix >= 0.97x."""
    sim = Sim(CPU, {"d": lambda t: 0.0}, draft_costs={"d": DRAFT_MODEL})
    for _ in range(600):
        sim.one()
        assert sim.speed_vs_plain >= 0.97


def test_drafting_wins_where_it_should() -> None:
    sim = Sim(GPU, {"d": lambda t: 0.8})
    sim.run(1000)
    assert sim.speed_vs_plain > 2.0


def test_every_cost_is_priced_at_the_depth_the_step_decodes_at() -> None:
    # Attention grows with the context: one more cached cell costs a one-token decode 0.01 ms and a
    # 16-token batch 0.05 ms (its rows share the cells' reads), so deep in a long context a batch
    # costs relatively less than near its start, and plain decoding more.
    costs = CostModel(CPU, per_cell={1: 0.01, 16: 0.05})
    ctl = Controller(costs, [Named("d")])
    teach(ctl, "d", [0.9] * 16)
    shallow = plan(ctl, history=range(1))
    assert costs.depth == 0 and shallow.expected_ms == pytest.approx(ctl.step_ms("d", shallow.draft_len))
    deep = plan(ctl, history=range(3001))
    assert costs.depth == 3000  # the cells the step's decode attends to: all but the last token
    assert costs.plain_ms() == pytest.approx(5.4 + 30.0 + costs.overhead_ms(0))
    assert deep.expected_ms == pytest.approx(ctl.step_ms("d", deep.draft_len))
    assert deep.speedup > shallow.speedup and deep.draft_len >= shallow.draft_len
    # the gain a drafting step reports is against plain decoding at its own depth
    t0 = costs.plain_ms()
    tokens = tuple(range(3001, 3001 + 4))
    ctl.observe(step_event(tokens, "d", deep.draft_len, 3, verify_ms=costs.verify_ms(1 + deep.draft_len)),
                list(range(3001 + 4)))
    assert ctl.stats.measured_plain_ms == pytest.approx(4 * t0)


# --- explaining ------------------------------------------------------------------------
def test_stats_count_choices_probes_and_gains() -> None:
    sim = Sim(GPU, {"d": lambda t: 0.8}, seed=3)
    sim.run(500)
    stats: ControllerStats = sim.ctl.stats
    assert stats.steps == 500 == stats.plain_steps + stats.draft_steps + stats.probes
    assert sum(sum(ks.values()) for ks in stats.choices.values()) == 500
    # expected and measured gains agree when the cost model is right and the estimate has settled
    assert stats.measured_gain == pytest.approx(stats.expected_gain, rel=0.25)
    assert stats.measured_gain > 2.0
    summary = stats.to_dict()
    assert summary["choices"]["d"] and summary["last_reason"].startswith("d k=")


def test_stats_since_an_earlier_copy_count_one_generation() -> None:
    sim = Sim(GPU, {"d": lambda t: 0.8}, seed=5)
    sim.run(200)
    before = sim.ctl.stats.copy()
    sim.run(100)
    delta = sim.ctl.stats.since(before)
    assert delta.steps == 100 == delta.plain_steps + delta.draft_steps + delta.probes
    assert sum(sum(ks.values()) for ks in delta.choices.values()) == 100
    drafted = [d.draft_len for d in sim.decisions[200:] if not d.plain]
    assert delta.mean_draft_len == pytest.approx(sum(drafted) / len(drafted))
    assert delta.measured_gain > 2.0 and delta.last_reason == sim.ctl.stats.last_reason
    # The copy is independent: later steps did not change it.
    assert before.steps == 200 and sum(sum(ks.values()) for ks in before.choices.values()) == 200


def test_unused_proposals_are_scored_position_by_position_as_the_text_comes() -> None:
    book = UnusedProposals()
    history = [9, 9, 9]
    long_match = Evidence(12, 1, (1.0,) * 4)
    book.add(3, "a", [(1, 2, 3, 4)], long_match)  # a chain of depth 4 for what follows history[:3]
    book.add(3, "b", [(1, 2, 7), (5,)])  # a tree
    book.add(3, "c", [])                 # nothing proposed: nothing kept
    assert len(book) == 2
    assert book.ready(history) == []     # nothing followed yet: nothing to tell
    history.append(1)                    # a plain step emitted one token: both matched it, both still pending
    assert book.ready(history) == [("a", ((1, 2, 3, 4),), [1], long_match, 0),
                                   ("b", ((1, 2, 7), (5,)), [1], None, 0)]
    assert len(book) == 2 and book.ready(history) == []  # told once: nothing new until the text moves
    history.append(2)
    history.append(3)                    # the tree's (1, 2, 7) parted at its third position: done
    assert book.ready(history) == [("a", ((1, 2, 3, 4),), [1, 2, 3], long_match, 1),
                                   ("b", ((1, 2, 7), (5,)), [1, 2, 3], None, 1)]
    assert len(book) == 1
    history.append(4)                    # the chain's depth is covered, every position matched: done
    assert book.ready(history) == [("a", ((1, 2, 3, 4),), [1, 2, 3, 4], long_match, 3)]
    assert len(book) == 0
    # Told in parts, an outcome counts each position once, and forgets once, like one told whole.
    ctl, whole = controller(CPU, "a"), controller(CPU, "a")
    for emitted, known in (([1], 0), ([1, 2, 3], 1), ([1, 2, 3, 4], 3)):
        ctl.observe_shadow("a", [(1, 2, 3, 4)], emitted, deferred=True, known=known)
    whole.observe_shadow("a", [(1, 2, 3, 4)], [1, 2, 3, 4], deferred=True)
    assert ctl.acceptance("a").reached == pytest.approx(whole.acceptance("a").reached)
    assert ctl.acceptance("a").kept == pytest.approx(whole.acceptance("a").kept)
    # Scored that way, deep positions learn: a lookup right 4 deep raises the rate at position 3.
    ctl = controller(CPU, "ngram")
    before = ctl.acceptance("ngram").rate(3)
    for _ in range(5):
        ctl.observe_shadow("ngram", [(1, 2, 3, 4)], [1, 2, 3, 4], deferred=True)
    assert ctl.acceptance("ngram").rate(3) > before


def test_reason_says_when_the_next_probe_comes() -> None:
    ctl = controller(CPU, "draft")
    ctl.costs.set_draft_cost("draft", *DRAFT_MODEL)
    decision = plan(ctl)
    assert decision.plain
    assert "probing again in" in decision.reason and "× plain" in decision.reason


def test_shadow_scoring_counts_only_known_outcomes() -> None:
    ctl = controller(CPU, "ngram")
    ctl.observe_shadow("ngram", [(5, 6, 7, 8)], emitted=(5, 6))  # matched all 2 emitted: position 2 unknown
    est = ctl.acceptance("ngram")
    assert est.reached == [1.0, 1.0] and est.kept == [1.0, 1.0]
    ctl.observe_shadow("ngram", [(9, 9), (5, 7, 1)], emitted=(5, 6, 4))  # best branch kept 1, rejected at 2
    assert est.reached[:2] == pytest.approx([1.95, 1.95]) and est.kept[:2] == pytest.approx([1.95, 0.95])


def test_unused_drafters_follow_the_text() -> None:
    """Every member is told each step's outcome; only the one whose proposal was verified with its count."""
    a, b = Named("a", cheap=True, tokens=(1, 2, 3)), Named("b", cheap=True, tokens=(7,))
    ctl = Controller(CostModel(GPU), [a, b])
    teach(ctl, "a", [0.99] * 16)
    decision = plan(ctl)
    assert decision.name == "a"
    ctl.observe(step_event((1, 2, 3, 4), "a", 3, 3), [0, 1, 2, 3, 4])
    assert b.kept == [0] and a.kept == []  # a's outcome is the step's to report (speculative_step)


def test_controller_does_not_load_llama_cpp() -> None:
    code = "import sys, localspec.policy.controller; assert 'llama_cpp' not in sys.modules, 'llama_cpp imported'"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_an_unused_draft_model_is_re_planned_only_every_few_steps() -> None:
    """While speculation is off, the full plan (every length, the catch-up) runs every 8 steps; the
    steps between decode plainly with a reason whose probe count stays true."""
    sim = Sim(CPU, {"draft": lambda t: 0.75}, upkeep=("draft",), prompt=150)
    calls = []
    drafter = sim.drafters["draft"]
    behind = drafter.behind
    drafter.behind = lambda history: calls.append(len(history)) or behind(history)  # type: ignore[method-assign]
    sim.run(81)
    assert all(d.plain for d in sim.decisions)
    # the first token waits for no catch-up (asked once); from the second step on, one plan in 8
    assert sim.decisions[0].reason.startswith("plain: the first token waits for no catch-up")
    assert sorted(set(calls)) == [150, *range(151, 151 + 80, 8)]
    counts = [int(d.reason.rsplit("in ", 1)[1].split()[0]) for d in sim.decisions[1:9]]
    assert counts == [counts[0] - i for i in range(8)] or counts[0] < 8


def test_each_generation_earns_its_own_probe_budget() -> None:
    """A reply never probes with budget saved by earlier replies: its first token waits for no probe."""
    sim = Sim(CPU, {"draft": lambda t: 0.75}, upkeep=("draft",), prompt=30)
    sim.run(2000)
    assert sim.ctl.stats.probe_budget_ms > 0
    sim.ctl.start(list(sim.drafters.values()))
    assert sim.ctl.stats.probe_budget_ms == 0.0
    assert not sim.one().probe


def test_steps_that_keep_less_than_their_evidence_promised_temper_every_class() -> None:
    """Verified steps from one class keep nothing: the drafter's calibration falls, and a class
    never observed (a 12-token match) is expected to keep less too."""
    ctl = Controller(CostModel(GPU), [EvidenceLookup(tuple(range(100, 108)), Evidence(5, 1, (1.0,) * 8))])
    fresh = Evidence(12, 1, (1.0,) * 8)
    before = ctl.expected_tokens("ngram", 8, evidence=fresh)
    history = [0]
    for _ in range(10):
        decision = plan(ctl, history=history)
        history.append(len(history))
        ctl.observe(step_event((history[-1],), "ngram" if decision.draft_len else None, decision.draft_len, 0),
                    history)
    assert ctl._states["ngram"].calibration < 0.5
    assert ctl.expected_tokens("ngram", 8, evidence=fresh) - 1 < 0.5 * (before - 1)


class ScriptedLookup(Named):
    """A cheap lookup over the text whose token i is i: ``script(len(history))`` gives the evidence it
    offers and whether its 8 tokens are the text's (a copy) or wrong (a guess the text does not take)."""

    def __init__(self, script: Callable[[int], tuple[Evidence, bool]]) -> None:
        super().__init__("ngram", cheap=True)
        self.script = script

    def propose(self, history: Sequence[int], draft_len: int) -> Proposal:
        evidence, right = self.script(len(history))
        n = min(draft_len, 8)
        start = len(history)
        tokens = tuple(range(start, start + n)) if right else (-1,) * n
        return Proposal(tokens, None, self.name, Evidence(evidence.match_len, evidence.occurrences,
                                                          evidence.support[:n]))


def follow_text(ctl: Controller, steps: int, history: list[int]) -> list[Decision]:
    """Run ``ctl`` over the text (token i at position i) with a greedy target: what it drafted and kept."""
    decisions = []
    for _ in range(steps):
        decision = plan(ctl, history=history)
        proposal = decision.proposal
        drafted = tuple(proposal.tokens[: decision.draft_len]) if proposal is not None and not decision.plain else ()
        kept = 0
        while kept < len(drafted) and drafted[kept] == len(history) + kept:
            kept += 1
        tokens = tuple(range(len(history), len(history) + kept + 1))
        history.extend(tokens)
        ctl.observe(step_event(tokens, "ngram" if drafted else None, len(drafted), kept), history)
        decisions.append(decision)
    return decisions


def test_a_copy_after_misses_is_drafted_again_within_a_few_steps() -> None:
    """Verified drafts kept nothing (prose repeating a phrase of the prompt, then parting from it): the
    calibration has fallen to 0.4, tempering every class. Then the text copies its source (an 8-token
    match, growing, every offer right). The scored offers show the copy, and the calibration ages
    while the drafter does not draft: drafting resumes within a few steps, deep. (Learned only from
    verified steps, the calibration once stayed low for good, and the copy went undrafted.)"""
    ctl = Controller(CostModel(CPU), [ScriptedLookup(lambda n: (Evidence(min(32, n - 2), 1, (1.0,) * 8), True))])
    state = ctl._states["ngram"]
    state.kept_tokens, state.expected_kept = 0.0, 12.0
    assert state.calibration == pytest.approx(0.4)
    history = list(range(10))
    copy = follow_text(ctl, 30, history)
    first = next(i for i, d in enumerate(copy) if not d.plain)
    assert first <= 10
    assert sum(d.draft_len for d in copy[first:]) >= 0.75 * 8 * (len(copy) - first)  # the copy, drafted deep


def test_guesses_the_text_never_takes_stay_within_the_probe_bound() -> None:
    """The other side: a lookup whose offers look confident (4- and 6-token matches seen once) but which
    the text never takes, all reply long. However the calibration ages, the classes learn from every
    scored offer: few are verified, and the reply runs within ~2.5% of plain decoding."""
    ctl = Controller(CostModel(CPU), [ScriptedLookup(
        lambda n: (Evidence(4 + 2 * (n % 2), 1, (1.0,) * 8), False))])
    history = list(range(10))
    decisions = follow_text(ctl, 300, history)
    truth = CostModel(CPU)
    plain_ms = truth.verify_ms(1) + truth.overhead_ms(0)
    ms = sum(truth.verify_ms(1 + d.draft_len) + truth.overhead_ms(d.draft_len) for d in decisions)
    assert sum(not d.plain for d in decisions) <= 10
    assert len(history) - 10 == len(decisions)  # every step emitted one token
    assert ms <= 1.025 * plain_ms * len(decisions)


def test_the_calibration_ages_while_its_drafter_verifies_nothing() -> None:
    """Learned only from verified steps, a calibration that fell would stay down while it keeps its
    drafter from drafting: it ages on every step that verifies nothing of that drafter instead, and
    returns toward 1 over a few dozen steps (its memory: ~30 steps)."""
    ctl = controller(CPU, "ngram")
    state = ctl._states["ngram"]
    state.kept_tokens, state.expected_kept = 0.0, 12.0
    history = [0]
    seen = []
    for _ in range(100):
        plan(ctl, history=history)
        history.append(len(history))
        ctl.observe(step_event((history[-1],), None, 0, 0), history)
        seen.append(state.calibration)
    assert seen == sorted(seen)
    assert 0.6 < seen[39] < 0.8 and 0.9 < seen[-1] < 1.0
