"""The controller follows the text: it learns acceptance and costs from each step, and probes drafters it does not use (simulated)."""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import pytest
from controller_sim import (
    CPU,
    GPU,
    ROOM,
    Named,
    Sim,
    controller,
    plan,
    step_event,
    teach,
)

from localspec.drafting.base import Proposal
from localspec.errors import InvalidOptionError
from localspec.policy.controller import LOOKUP_RETIME, LOOKUP_RETIME_BACKOFF_MAX, LOOKUP_RETIME_MAX, Controller
from localspec.policy.costs import CostModel
from localspec.policy.decision import Decision
from localspec.policy.estimates import (
    CALIBRATION_DECAY,
    DecayingAcceptance,
)
from localspec.policy.sim_clock import SimClock


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

    def __init__(self, clock: SimClock, spikes: set[int]) -> None:
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
    clock = SimClock()
    lookup = SpikyLookup(clock, {10, 11, 12, 30, 31})
    ctl = Controller(CostModel(CPU), [lookup], clock=clock)
    history = [0]
    for _ in range(60):
        plan(ctl, history=history)
        history.append(len(history))
        ctl.observe(step_event((history[-1],), None, 0, 0), history)
    assert lookup.calls == 60  # asked at every step
    assert ctl.costs.draft_ms("ngram", 8) < 0.02 * ctl.costs.plain_ms()


def asked_each_step(ctl: Controller, lookup: Named, steps: int) -> list[bool]:
    """Plain steps planned by ``ctl`` and observed, one token each: whether each plan asked ``lookup``
    (one that counts its ``calls``)."""
    history = [0]
    asked = []
    for _ in range(steps):
        before = lookup.calls
        plan(ctl, history=history)
        asked.append(lookup.calls > before)
        history.append(len(history))
        ctl.observe(step_event((history[-1],), None, 0, 0), history)
    return asked


class ColdLookup(Named):
    """A cheap lookup whose first ``slow`` calls take 0.5 ms of the simulated clock (cold caches after
    the prompt's indexing), every later one 0.03 ms."""

    def __init__(self, clock: SimClock, slow: int) -> None:
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
    clock = SimClock()
    lookup = ColdLookup(clock, slow=3)
    ctl = Controller(CostModel(CPU), [lookup], clock=clock)
    asked = asked_each_step(ctl, lookup, 100)
    assert not all(asked[:40])  # the slow start did take it out of planning for a while (what is tested)
    assert all(asked[-40:])  # and, timed again, it is back to every step
    assert ctl.costs.draft_ms("ngram", 8) < 0.02 * ctl.costs.plain_ms()


class EmptyCostlyLookup(Named):
    """A cheap lookup that never finds anything to copy and takes ``ms`` of the simulated clock (0.5 ms:
    past a plain step's 2% on the CPU's 5.4 ms, asked only to be timed again)."""

    def __init__(self, clock: SimClock, ms: float = 0.5) -> None:
        super().__init__("ngram", cheap=True)
        self.clock, self.calls, self.ms = clock, 0, ms

    def propose(self, history: Sequence[int], draft_len: int) -> Proposal:
        self.calls += 1
        self.clock.spend(self.ms)
        return super().propose(history, draft_len)


class CountingController(Controller):
    """Counts the plans that priced a drafter asked only once chosen (``pricing.options``)."""

    priced = 0

    def _options(self, drafter, max_draft_len, behind, horizon):
        self.priced += 1
        return super()._options(drafter, max_draft_len, behind, horizon)


def test_a_lookup_timed_again_that_finds_nothing_leaves_the_steps_until_its_next_timing_unplanned() -> None:
    """Nothing to copy, a lookup too slow to ask every step: it is asked (timed again, and it would draft a
    copy it found) after LOOKUP_RETIME steps, then twice as long after each timing that found nothing, and
    the steps between are plain without a plan, nothing priced (before, the step after each timing priced it
    at every draft length: 31 lengths, more Python than the rest of a plain step on a fast device)."""
    clock = SimClock()
    lookup = EmptyCostlyLookup(clock)
    ctl = CountingController(CostModel(CPU), [lookup], clock=clock)
    history = [0]
    reasons = []
    for _ in range(200):
        reasons.append(plan(ctl, history=history).reason)
        history.append(len(history))
        ctl.observe(step_event((history[-1],), None, 0, 0), history)
    assert ctl.priced <= 1  # (once: the step its estimate first passed 2%, when no timing was due)
    assert lookup.calls == 6  # steps 0, 1 (the prompt's, not judged), 9, 25, 57, 121 (8, 16, 32, 64 apart; then 128)
    waiting = [r for r in reasons if r.startswith("plain: no drafter has a proposal; paused for ")]
    assert len(waiting) >= 200 - 2 * lookup.calls - 2  # (each pause begins with the plan that timed it)
    assert ctl.costs.draft_ms("ngram", 8) > 0.02 * ctl.costs.plain_ms()  # (what keeps it from every step)


def _paused_run(read_every_step: bool) -> tuple[Controller, list[Decision]]:
    """200 steps of a lookup that finds nothing, asked only to be timed (the steps between are paused),
    the stats read after every step (their counts checked there) or only at the end."""
    clock = SimClock()
    lookup = EmptyCostlyLookup(clock)
    ctl = Controller(CostModel(CPU), [lookup], clock=clock)
    state = ctl._states["ngram"]
    state.kept_tokens, state.expected_kept = 4.0, 8.0  # a calibration learned before (it ages while unused)
    history, decisions = [0], []
    for i in range(1, 201):
        decisions.append(plan(ctl, history=history))
        history.append(len(history))
        ctl.observe(step_event((history[-1],), None, 0, 0), history)
        if read_every_step:
            stats = ctl.stats
            assert stats.steps == stats.plain_steps == stats.choices["plain"][0] == i
    return ctl, decisions


def test_a_pause_settles_its_steps_whenever_the_stats_are_read() -> None:
    """A paused step leaves its counts, the probe budget it earns and the calibrations' ageing in a ledger
    settled in one go (the controller's own time on a fast decode); whoever reads the stats mid-pause reads
    them settled, and when they are read changes nothing of what the controller learns."""
    read, decisions = _paused_run(True)
    unread, _ = _paused_run(False)
    assert sum(d.reason.startswith("plain: no drafter has a proposal; paused for ") for d in decisions) > 150
    # Each plain step earned its share of the plain step's cost when it was planned (no probe spent any).
    earned = sum(read.probing.share * d.expected_ms for d in decisions)
    assert read.stats.probe_budget_ms == pytest.approx(earned)
    counts, unread_counts = dataclasses.asdict(read.stats), dataclasses.asdict(unread.stats)
    assert counts.pop("probe_budget_ms") == pytest.approx(unread_counts.pop("probe_budget_ms"))
    assert counts == unread_counts
    for ctl in (read, unread):  # aged every step, paused or not
        state = ctl._states["ngram"]
        assert (state.kept_tokens, state.expected_kept) == pytest.approx((4.0 * CALIBRATION_DECAY**200, 8.0 * CALIBRATION_DECAY**200))


def test_a_paused_step_tells_only_the_drafters_that_follow_each_step() -> None:
    """``accepted(history, 0)`` after a paused step goes to the drafters that act on every step
    (``follows_each_step``: lookahead moves its window); one that does nothing then (the n-gram index and
    a draft model catch up from the history) is left out of the pauses, the controller's own per-step
    work on a fast decode, and told of the steps it plans."""
    clock = SimClock()
    follower, lazy = EmptyCostlyLookup(clock), EmptyCostlyLookup(clock)
    lazy.name, lazy.follows_each_step = "lookup", False  # type: ignore[misc]
    ctl = Controller(CostModel(CPU), [follower, lazy], clock=clock)
    history, paused = [0], 0
    for _ in range(200):
        paused += plan(ctl, history=history) is ctl._paused  # (a step left unplanned)
        history.append(len(history))
        ctl.observe(step_event((history[-1],), None, 0, 0), history)
    assert follower.kept == [0] * 200
    assert paused > 150 and lazy.kept == [0] * (200 - paused)


@pytest.mark.parametrize("lookup_ms", [0.5, 2.0, 20.0])
def test_a_lookup_timed_again_costs_at_most_its_share_and_waits_longer_each_time_it_finds_nothing(lookup_ms: float) -> None:
    """A lookup asked only to be timed is asked every LOOKUP_RETIME steps, or as seldom as keeps what those
    steps cost within lookup_share of the plain steps between (2 ms against 2% of a 5.4 ms plain step: one
    step in 19), at most every LOOKUP_RETIME_MAX steps; each timing in a row that found nothing doubles
    that, up to LOOKUP_RETIME_BACKOFF_MAX steps. A new text starts it over."""
    clock = SimClock()
    lookup = EmptyCostlyLookup(clock, lookup_ms)
    ctl = Controller(CostModel(CPU), [lookup], clock=clock)
    asked = asked_each_step(ctl, lookup, 800)
    steps = [i for i, a in enumerate(asked) if a]
    gaps = [b - a for a, b in zip(steps, steps[1:])]
    every = max(LOOKUP_RETIME, min(LOOKUP_RETIME_MAX, math.ceil(lookup_ms / (0.02 * ctl.costs.plain_ms()))))
    assert every == {0.5: LOOKUP_RETIME, 2.0: 19, 20.0: LOOKUP_RETIME_MAX}[lookup_ms]
    # steps 0 and 1 (the prompt's lookup, not judged), one timing at LOOKUP_RETIME before the cost of
    # such a step is known, then doubling from the third timing in a row that found nothing
    assert gaps[:3] == [1, LOOKUP_RETIME, 2 * LOOKUP_RETIME]
    assert gaps[3:] == [min(LOOKUP_RETIME_BACKOFF_MAX, every << n) for n in range(2, len(gaps) - 1)]
    assert gaps[-1] == LOOKUP_RETIME_BACKOFF_MAX
    assert lookup_ms * 5 / (steps[-1] - steps[-6]) <= max(0.02 * ctl.costs.plain_ms(), lookup_ms / LOOKUP_RETIME)
    ctl.start([lookup])  # another text: asked at its first step, then at its pace again
    asked = asked_each_step(ctl, lookup, 3 * LOOKUP_RETIME_MAX)
    assert asked[0] and asked.index(True, 1) <= 2 * every


def test_a_copy_after_a_long_stretch_without_one_is_drafted_within_the_longest_wait() -> None:
    """A lookup too slow to ask every step finds nothing for 300 steps, then the text starts copying: the
    timings had backed off to one in LOOKUP_RETIME_BACKOFF_MAX steps; the first that finds the copy brings
    them back to every LOOKUP_RETIME steps, each scored, and drafting starts once the evidence says it pays
    (the price of the backoff: a copy noticed up to LOOKUP_RETIME_BACKOFF_MAX tokens late)."""
    sim = Sim(CPU, {"ngram": lambda t: 0.0 if t < 300 else 1.0}, shadow=("ngram",),
              draft_costs={"ngram": (0.5, 0.0)}, empty_misses=("ngram",))
    asked = []
    for _ in range(700):
        before = sim.drafters["ngram"].proposals
        sim.one()
        asked.append(sim.drafters["ngram"].proposals > before)
    timed = [i for i in range(300) if asked[i]]
    assert [b - a for a, b in zip(timed, timed[1:])][-1] == LOOKUP_RETIME_BACKOFF_MAX
    drafting = next(i for i, d in enumerate(sim.decisions) if d.draft_len)
    assert 300 <= drafting <= 300 + LOOKUP_RETIME_BACKOFF_MAX + 4 * LOOKUP_RETIME
    found = [i for i in range(300, drafting) if asked[i]]
    assert found and all(b - a <= LOOKUP_RETIME for a, b in zip(found, found[1:]))
    assert sum(d.draft_len > 0 for d in sim.decisions[drafting:]) > 0.9 * (700 - drafting)


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
    clock = SimClock()
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
    with pytest.raises(InvalidOptionError, match="0..64"):  # the options' own check (check_draft_len)
        controller(CPU, "a", draft_len=65)


def test_a_lookup_proposal_is_cut_to_a_fixed_length() -> None:
    ctl = Controller(CostModel(CPU), [Named("a", cheap=True, tokens=(1, 2))], draft_len=5)
    decision = plan(ctl)
    assert decision.draft_len == 2 and decision.proposal is not None and decision.proposal.tokens == (1, 2)
