"""The controller is never slower than plain decoding by more than its probe budget, and explains each choice (simulated)."""

from __future__ import annotations

import subprocess
import sys
from typing import Callable, Mapping, Sequence

import pytest
from controller_sim import (
    CPU,
    DRAFT_MODEL,
    GPU,
    LOOKUP,
    ROOM,
    EvidenceLookup,
    Named,
    Sim,
    controller,
    plan,
    step_event,
    teach,
)

from localspec.drafting.base import Evidence, Proposal
from localspec.policy.controller import Controller
from localspec.policy.costs import CostModel
from localspec.policy.decision import ControllerStats, Decision
from localspec.policy.estimates import (
    UnusedProposals,
)


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
    assert costs.kv_depth == 0 and shallow.expected_ms == pytest.approx(ctl.step_ms("d", shallow.draft_len))
    deep = plan(ctl, history=range(3001))
    assert costs.kv_depth == 3000  # the cells the step's decode attends to: all but the last token
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
        ctl.observe_unused("a", [(1, 2, 3, 4)], emitted, deferred=True, known=known)
    whole.observe_unused("a", [(1, 2, 3, 4)], [1, 2, 3, 4], deferred=True)
    assert ctl.acceptance("a").reached == pytest.approx(whole.acceptance("a").reached)
    assert ctl.acceptance("a").kept == pytest.approx(whole.acceptance("a").kept)
    # Scored that way, deep positions learn: a lookup right 4 deep raises the rate at position 3.
    ctl = controller(CPU, "ngram")
    before = ctl.acceptance("ngram").rate(3)
    for _ in range(5):
        ctl.observe_unused("ngram", [(1, 2, 3, 4)], [1, 2, 3, 4], deferred=True)
    assert ctl.acceptance("ngram").rate(3) > before


def test_reason_says_when_the_next_probe_comes() -> None:
    ctl = controller(CPU, "draft")
    ctl.costs.set_draft_cost("draft", *DRAFT_MODEL)
    decision = plan(ctl)
    assert decision.plain
    assert "probing again in" in decision.reason and "× plain" in decision.reason


def test_shadow_scoring_counts_only_known_outcomes() -> None:
    ctl = controller(CPU, "ngram")
    ctl.observe_unused("ngram", [(5, 6, 7, 8)], emitted=(5, 6))  # matched all 2 emitted: position 2 unknown
    est = ctl.acceptance("ngram")
    assert est.reached == [1.0, 1.0] and est.kept == [1.0, 1.0]
    ctl.observe_unused("ngram", [(9, 9), (5, 7, 1)], emitted=(5, 6, 4))  # best branch kept 1, rejected at 2
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
    steps between decode plainly, their decision the pause's own, and the stats' last reason counts
    down to the next probe."""
    sim = Sim(CPU, {"draft": lambda t: 0.75}, upkeep=("draft",), prompt=150)
    calls = []
    drafter = sim.drafters["draft"]
    behind = drafter.behind
    drafter.behind = lambda history: calls.append(len(history)) or behind(history)  # type: ignore[method-assign]
    sim.one()
    reasons = []
    for _ in range(80):
        sim.one()
        reasons.append(sim.ctl.stats.last_reason)
    assert all(d.plain for d in sim.decisions)
    # the first token waits for no catch-up (asked once); from the second step on, one plan in 8
    assert sim.decisions[0].reason.startswith("plain: the first token waits for no catch-up")
    assert sorted(set(calls)) == [150, *range(151, 151 + 80, 8)]
    planned, paused = sim.decisions[1], sim.decisions[2:9]
    assert planned.reason.startswith("speculation off") and " probing again in " in planned.reason
    assert all(d is paused[0] for d in paused)  # one decision for the whole pause
    assert paused[0].reason.startswith(planned.reason.rsplit("; ", 1)[0] + "; paused for 7 steps, then probing")
    counts = [int(r.rsplit("in ", 1)[1].split()[0]) for r in reasons[:8]]
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
