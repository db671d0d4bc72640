"""The adaptive controller, on simulated costs and acceptance traces.

A simulation draws each step's accepted count from a drafter's acceptance
rate (which may change mid-way), charges time from a "true" cost model, and
feeds the controller the resulting step exactly as the engine would. All
times are simulated: nothing here measures the machine.
"""

from __future__ import annotations

import math
import random
import subprocess
import sys
from dataclasses import dataclass
from typing import Callable, Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localspec.control import (
    Controller,
    ControllerStats,
    DecayingAcceptance,
    Decision,
    Offer,
    proposal_branches,
    proposal_offer,
)
from localspec.costs import CostModel
from localspec.drafting.base import Proposal, TreeProposal
from localspec.drafting.tree import build_tree

# ms for one decode of k tokens: SmolLM2-135M on 2 CPU threads, and a GPU that verifies 8 for the price of 1.
CPU = {1: 5.4, 2: 11.3, 4: 16.2, 8: 24.9, 16: 41.1}
GPU = {1: 10.0, 2: 10.1, 4: 10.2, 8: 10.5, 16: 12.0}
LOOKUP = (0.3, 0.0)      # ms: fixed, per token
DRAFT_MODEL = (1.0, 5.0)  # a draft model as slow as the CPU target: never worth it there


@dataclass(frozen=True)
class FakeStep:
    """The fields of StepResult the controller reads."""

    tokens: tuple[int, ...]
    drafter: str | None
    drafted: int
    accepted: int
    draft_s: float
    verify_s: float
    python_s: float
    verified: int


class Sim:
    """A controller run against simulated drafters.

    ``rates[name](step)`` is the drafter's true per-position acceptance at that
    step. Drafters in ``shadow`` are cheap lookups whose proposals (depth 8)
    are offered before planning and scored after each step they were not used.
    """

    def __init__(self, points: Mapping[int, float], rates: Mapping[str, Callable[[int], float]], *,
                 draft_costs: Mapping[str, tuple[float, float]] | None = None, shadow: tuple[str, ...] = (),
                 seed: int = 0, **controller_kw) -> None:
        self.truth = CostModel(points)
        self.rates = dict(rates)
        self.draft_costs = {name: (draft_costs or {}).get(name, LOOKUP) for name in rates}
        self.shadow = shadow
        self.ctl = Controller(CostModel(points), list(rates), **controller_kw)
        for name, (fixed, per) in self.draft_costs.items():
            self.ctl.costs.set_draft_cost(name, fixed, per)
        self.rng = random.Random(seed)
        self.step = 0
        self.total_ms = 0.0
        self.tokens = 0
        self.decisions: list[Decision] = []
        self._next_token = 0

    @property
    def plain_ms(self) -> float:
        return self.truth.verify_ms(1) + self.truth.overhead_ms(0)

    @property
    def speed_vs_plain(self) -> float:
        return self.tokens * self.plain_ms / self.total_ms

    def _chain(self, rate: float, depth: int) -> int:
        n = 0
        while n < depth and self.rng.random() < rate:
            n += 1
        return n

    def run(self, n_steps: int, max_k: int = 64) -> list[Decision]:
        out = []
        for _ in range(n_steps):
            out.append(self.one(max_k))
        return out

    def one(self, max_k: int = 64) -> Decision:
        offers = {name: Offer(8) for name in self.shadow} if self.shadow else None
        decision = self.ctl.plan(max_k, offers)
        k = decision.k
        accepted = self._chain(self.rates[decision.drafter](self.step), k) if k else 0
        emitted = tuple(range(self._next_token, self._next_token + accepted + 1))
        self._next_token += accepted + 1
        fixed, per = self.draft_costs[decision.drafter] if k else (0.0, 0.0)
        draft_ms = fixed + per * k if k else 0.0
        verify_ms = self.truth.verify_ms(k + 1)
        python_ms = self.truth.overhead_ms(k)
        self.ctl.observe(FakeStep(emitted, decision.drafter if k else None, k, accepted,
                                  draft_ms / 1e3, verify_ms / 1e3, python_ms / 1e3, k))
        for name in self.shadow:
            if name != decision.drafter or not k:
                matched = self._chain(self.rates[name](self.step), 8)
                branch = (emitted + (-1,) * 8)[:matched] + (-2,) * 8
                self.ctl.observe_shadow(name, [branch[:8]], emitted)
        self.total_ms += draft_ms + verify_ms + python_ms
        self.tokens += accepted + 1
        self.step += 1
        self.decisions.append(decision)
        return decision


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
    ctl = Controller(CostModel(CPU), ["ngram"])
    teach(ctl, "ngram", [0.6] * 16)
    decision = ctl.plan(64)
    assert decision.plain and decision.k == 0 and decision.drafter is None
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
def test_picks_the_optimal_k(points: Mapping[int, float], rates: list[float]) -> None:
    ctl = Controller(CostModel(points), ["d"])
    teach(ctl, "d", rates)
    decision = ctl.plan(64)
    k, tokens, ms = brute_force(ctl, "d", ctl.k_cap)
    assert k > 0
    assert (decision.drafter, decision.k) == ("d", k)
    assert decision.expected_tokens == pytest.approx(tokens)
    assert decision.expected_ms == pytest.approx(ms)
    assert decision.speedup == pytest.approx(tokens / ms * ctl.costs.plain_ms())
    assert decision.reason.startswith(f"d: expected {tokens:.1f} tok/step at ")


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
    ctl = Controller(CostModel(points), ["d"])
    teach(ctl, "d", rates)
    decision = ctl.plan(max_k)
    k, tokens, ms = brute_force(ctl, "d", min(max_k, ctl.k_cap))
    best = tokens / ms * ctl.costs.plain_ms()
    # (near-ties, within rounding, may go either way)
    if k and best >= 1.05 + 1e-9:
        assert decision.drafter == "d" and 1 <= decision.k <= max_k
        assert decision.speedup == pytest.approx(best, rel=1e-9)
    elif not k or best < 1.05 - 1e-9:
        assert decision.plain


def test_max_k_limits_the_draft() -> None:
    ctl = Controller(CostModel(GPU), ["d"])
    teach(ctl, "d", [0.95] * 16)
    assert ctl.plan(3).k == 3
    assert ctl.plan(0).plain and ctl.plan(0).reason == "plain: no room to draft"


def test_offers_cap_k_and_confidence_caps_acceptance() -> None:
    ctl = Controller(CostModel(GPU), ["ngram"])
    teach(ctl, "ngram", [0.9] * 16)
    assert ctl.plan(64, {"ngram": Offer(4)}).k == 4
    assert ctl.plan(64, {}).reason == "plain: no drafter has a proposal"
    sure, unsure = ctl.evaluate("ngram", 4), ctl.evaluate("ngram", 4, Offer(4, (0.9, 0.2, 0.2, 0.2)))
    assert unsure[0] < sure[0]


def test_offers_from_proposals() -> None:
    """A tree's own confidence at depth d+1: the mass of its nodes there over the mass at depth d."""
    tree = build_tree([((1, 2, 3), 3.0), ((1, 2, 4), 1.0), ((5,), 1.0)])
    offer = proposal_offer(TreeProposal(tree, "ngram"))
    assert offer.depth == 3
    assert offer.confidence == pytest.approx((1.0, 0.8, 1.0))  # 1 -> 1,5 (all); 1 -> 1,2 (4/5); 1,2 -> 3 or 4
    assert sorted(proposal_branches(TreeProposal(tree, "ngram"))) == [(1, 2, 3), (1, 2, 4), (5,)]
    assert proposal_offer(Proposal((7, 8))) == Offer(2)
    assert proposal_branches(Proposal((7, 8))) == ((7, 8),) and proposal_branches(Proposal()) == ()


def test_a_tree_costs_its_width() -> None:
    """A drafter verifying 3 candidate tokens per depth is planned at 1 + 3k verified tokens."""
    ctl = Controller(CostModel(CPU), ["ngram"], fixed_k=4)
    for i in range(60):
        ctl.plan(64)
        ctl.observe(FakeStep((i,), None, 4, 0, 0.0003, 0.0, 0.0, 12))
    _, ms = ctl.evaluate("ngram", 4)
    expected = ctl.costs.draft_ms("ngram", 4) + ctl.costs.verify_ms(1 + 3 * 4) + ctl.costs.overhead_ms(4)
    assert ms == pytest.approx(expected, rel=0.02)


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
    cpu = Controller(CostModel(CPU), ["lookahead"], extra_tokens={"lookahead": 14})
    assert cpu.plan(8).plain
    tokens, ms = cpu.evaluate("lookahead", 4)
    assert ms == pytest.approx(cpu.costs.draft_ms("lookahead", 4) + cpu.costs.verify_ms(1 + 4 + 14)
                               + cpu.costs.overhead_ms(4))
    unknown = Controller(CostModel(CPU), ["lookahead"])  # without it a probe would look 4x cheaper than it is
    assert unknown.evaluate("lookahead", 3)[1] < cpu.evaluate("lookahead", 3)[1] / 2
    gpu = Controller(CostModel(GPU), ["lookahead"], extra_tokens={"lookahead": 14})
    assert not gpu.plan(8).plain
    # Learning the width leaves the window out: a batch of 1 + 4 candidates + 14 window tokens for k = 4.
    decision = gpu.plan(4)
    gpu.observe(FakeStep((1, 2), "lookahead", 4, 1, 0.0, 0.01, 0.0, 18), batch_tokens=1 + 4 + 14)
    assert decision.k == 4 and gpu._drafters["lookahead"].width == pytest.approx(1.0)


def test_switches_drafters_when_one_degrades() -> None:
    """Two drafters trade places at step 400; neither is scored for free, so the new best is found by probes."""
    sim = Sim(GPU, {"a": lambda t: 0.9 if t < 400 else 0.1, "b": lambda t: 0.1 if t < 400 else 0.9})
    sim.run(1200)
    used = [d.drafter for d in sim.decisions if not d.probe]
    assert used[100:400].count("a") > 0.9 * 300
    assert used[900:].count("b") > 0.9 * 300


def test_cheap_drafters_scored_every_step_switch_within_dozens_of_steps() -> None:
    sim = Sim(CPU, {"a": lambda t: 0.97 if t < 300 else 0.1, "b": lambda t: 0.1 if t < 300 else 0.97},
              shadow=("a", "b"))
    sim.run(600)
    assert all(not d.probe for d in sim.decisions)  # shadow scoring needs no probes
    used = [d.drafter for d in sim.decisions]
    assert used[100:300].count("a") > 0.9 * 200
    switched = next(t for t in range(300, 600) if used[t] == "b")
    assert switched - 300 <= 60
    assert used[400:].count("b") > 0.9 * 200


def test_recovers_after_probes() -> None:
    """A drafter that was useless for 2000 steps turns good: it is drafting again within a bounded time."""
    sim = Sim(CPU, {"d": lambda t: 0.05 if t < 2000 else 0.95}, max_wait=512)
    sim.run(2000)
    probes_while_bad = sim.ctl.stats.probes
    assert probes_while_bad <= 20  # waits doubled: 8, 16, ..., 512
    sim.run(1500)
    first = next(t for t, d in enumerate(sim.decisions) if t >= 2000 and d.drafter and not d.probe)
    # at most one max_wait until a probe, then a few successful probes
    assert first - 2000 <= 512 + 400
    assert [d.drafter for d in sim.decisions[-500:]].count("d") > 450


def test_fixed_draft_max_is_honoured() -> None:
    ctl = Controller(CostModel(CPU), ["a", "b"], fixed_k=5)
    teach(ctl, "a", [0.5] * 16)
    teach(ctl, "b", [0.2] * 16)
    decision = ctl.plan(64)  # drafting loses here, but the user asked for 5
    assert (decision.drafter, decision.k) == ("a", 5)
    assert "--draft-max 5" in decision.reason
    assert ctl.plan(3).k == 3  # the context still limits it
    teach(ctl, "b", [0.9] * 16)
    assert (ctl.plan(64).drafter, ctl.plan(64).k) == ("b", 5)  # still chooses among drafters
    assert ctl.plan(64, {"a": Offer(2)}).k == 2  # and cannot draft deeper than a proposal
    assert Controller(CostModel(CPU), ["a"], fixed_k=0).plan(64).plain


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
    assert summary["choices"]["d"] and summary["last_reason"].startswith("d: expected")


def test_stats_since_an_earlier_copy_count_one_generation() -> None:
    sim = Sim(GPU, {"d": lambda t: 0.8}, seed=5)
    sim.run(200)
    before = sim.ctl.stats.copy()
    sim.run(100)
    delta = sim.ctl.stats.since(before)
    assert delta.steps == 100 == delta.plain_steps + delta.draft_steps + delta.probes
    assert sum(sum(ks.values()) for ks in delta.choices.values()) == 100
    drafted = [d.k for d in sim.decisions[200:] if not d.plain]
    assert delta.mean_k == pytest.approx(sum(drafted) / len(drafted))
    assert delta.measured_gain > 2.0 and delta.last_reason == sim.ctl.stats.last_reason
    # The copy is independent: later steps did not change it.
    assert before.steps == 200 and sum(sum(ks.values()) for ks in before.choices.values()) == 200


def test_unused_proposals_wait_until_the_text_judges_every_position() -> None:
    from localspec.control import UnusedProposals

    book = UnusedProposals()
    history = [9, 9, 9]
    book.add(3, [(1, 2, 3, 4)])          # a chain of depth 4 for what follows history[:3]
    book.add(3, [(1, 2, 7), (5,)])       # a tree
    book.add(3, [])                      # nothing proposed: nothing kept
    assert len(book) == 2
    history.append(1)                    # a plain step emitted one token: both still match
    assert book.ready(history) == [] and len(book) == 2
    history.append(2)
    history.append(3)                    # the tree's (1, 2, 7) parted at its third position
    assert book.ready(history) == [(((1, 2, 7), (5,)), [1, 2, 3])]
    history.append(4)                    # the chain's depth is covered, every position matched
    assert book.ready(history) == [(((1, 2, 3, 4),), [1, 2, 3, 4])]
    assert len(book) == 0
    # Scored that way, deep positions learn: a lookup right 4 deep raises the rate at position 3.
    ctl = Controller(CostModel(CPU), ["ngram"])
    before = ctl.acceptance("ngram").rate(3)
    for _ in range(5):
        ctl.observe_shadow("ngram", [(1, 2, 3, 4)], [1, 2, 3, 4], deferred=True)
    assert ctl.acceptance("ngram").rate(3) > before


def test_reason_says_when_the_next_probe_comes() -> None:
    ctl = Controller(CostModel(CPU), ["draft"])
    ctl.costs.set_draft_cost("draft", *DRAFT_MODEL)
    decision = ctl.plan(64)
    assert decision.plain
    assert "probing again in" in decision.reason and "× plain" in decision.reason


def test_shadow_scoring_counts_only_known_outcomes() -> None:
    ctl = Controller(CostModel(CPU), ["ngram"])
    ctl.observe_shadow("ngram", [(5, 6, 7, 8)], emitted=(5, 6))  # matched all 2 emitted: position 2 unknown
    est = ctl.acceptance("ngram")
    assert est.reached == [1.0, 1.0] and est.kept == [1.0, 1.0]
    ctl.observe_shadow("ngram", [(9, 9), (5, 7, 1)], emitted=(5, 6, 4))  # best branch kept 1, rejected at 2
    assert est.reached[:2] == pytest.approx([1.95, 1.95]) and est.kept[:2] == pytest.approx([1.95, 0.95])


def test_controller_does_not_load_llama_cpp() -> None:
    code = "import sys, localspec.control; assert 'llama_cpp' not in sys.modules, 'llama_cpp imported'"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
