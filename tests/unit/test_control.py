"""The controller's objective: expected tokens and time per step, and the option it picks (simulated costs)."""

from __future__ import annotations

from typing import Mapping, Sequence

import pytest
from controller_sim import (
    CPU,
    DRAFT_MODEL,
    GPU,
    Named,
    brute_force,
    controller,
    plan,
    step_event,
    teach,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from localspec.drafting.base import Proposal, TreeProposal
from localspec.drafting.tree import build_tree
from localspec.policy.controller import Controller
from localspec.policy.costs import CostModel
from localspec.policy.estimates import (
    best_path,
    proposal_branches,
    tree_confidence,
)


# --- the objective -------------------------------------------------------------------
def test_plain_where_drafting_loses() -> None:
    """On a small CPU, verifying k+1 tokens costs ~k/2 plain steps: 60% acceptance cannot pay."""
    ctl = controller(CPU, "ngram")
    teach(ctl, "ngram", [0.6] * 16)
    decision = plan(ctl)
    assert decision.plain and decision.draft_len == 0 and decision.chosen is None and decision.name is None
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
    assert first.reason.startswith("speculation off") and first.reason.endswith(" in 192 steps")
    assert ctl.stats.last_reason == first.reason.replace(" in 192 steps", " in 191 steps")  # (read a step later)


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
