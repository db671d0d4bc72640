"""The controller chooses chain or tree, and the tree's node budget, for drafters that grow trees (DFlash, a
draft model), by the same cost model as every other choice: hand-built costs and acceptance.

On a CPU a verification row costs a good share of a plain step, so a further candidate that rescues a
quarter of the misses does not pay for its row; on a GPU a batch of 16 costs about what one token does,
and the same acceptance buys a wide tree. A draft model's tree also pays its extra draft rows, a DFlash
tree only its verification rows.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import sys
from pathlib import Path

import pytest
from controller_sim import CPU, GPU, Named, plan, step_event, teach

from localspec.policy.controller import Controller
from localspec.policy.pricing import TREE_DEPTH_MAX
from localspec.policy.costs import TREE_NODE_MS, CostModel
from localspec.policy.decision import Decision
from localspec.policy.estimates import tree_expected_tokens

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "gpu"))
import simulate  # noqa: E402

RTX4090 = simulate.load_costs(Path(simulate.__file__).with_name("rtx4090-14b-q4km.toml"))  # ms per decode


class Grower(Named):
    """A drafter that grows trees of up to three children a node (what DFlash and a draft model declare)."""

    def __init__(self, name: str, width: int = 3) -> None:
        super().__init__(name)
        self.tree_width = width


def tree_controller(points, name: str = "dflash", *, nodes_limit: int = 32, draft=None, **kw) -> Controller:  # noqa: ANN001, ANN003
    """A controller over ``points`` with one tree-growing drafter: DFlash-like (one pass of a fixed cost and
    a little per row) or, with ``draft``, a draft model with those decode costs."""
    costs = CostModel(points)
    if draft is None:
        costs.set_draft_cost(name, 0.05 * costs.verify_ms(1), 0.01 * costs.verify_ms(1))
    else:
        costs.set_model_drafter(name, CostModel(draft))
    return Controller(costs, [Grower(name)], tree_nodes_limit=nodes_limit, **kw)


def extra_nodes(decision: Decision) -> int:
    return max(0, decision.tree_nodes - decision.draft_len)


# --- E for a tree --------------------------------------------------------------------------------
def test_a_tree_without_further_nodes_expects_what_its_chain_does() -> None:
    rates = [0.9, 0.7, 0.5]
    out = tree_expected_tokens(rates, [0.75, 0.75], depth=3, extra=0, width=3)
    assert out == [pytest.approx(1 + 0.9 + 0.9 * 0.7 + 0.9 * 0.7 * 0.5)]


def test_each_further_node_goes_where_it_rescues_most() -> None:
    """With a chain 0.5 / 0.9 and siblings kept a quarter of the time: the first further node goes to depth 1
    (reached always, missed half the time: +0.125), the second there too (0.5 * 0.75 * 0.25 = 0.094 beats
    depth 2's 0.5 * 0.1 * 0.25 = 0.0125), the third to depth 2 (width 3: depth 1 is full)."""
    out = tree_expected_tokens([0.5, 0.9], [0.75, 0.75], depth=2, extra=4, width=3)
    chain = 1 + 0.5 + 0.45
    assert out[1] == pytest.approx(chain + 0.125)
    assert out[2] == pytest.approx(chain + 0.125 + 0.09375)
    assert out[3] == pytest.approx(out[2] + 0.0125)
    assert out[4] == pytest.approx(out[3] + 0.5 * 0.1 * 0.75 * 0.25)


@pytest.mark.parametrize("rates", [[0.6, 0.6, 0.6], [0.9, 0.4, 0.8], [0.3, 0.95, 0.5]])
def test_the_greedy_placement_is_the_best_placement(rates: list[float]) -> None:
    """Written out independently: every way of placing m further nodes over the depths (at most width - 1
    each), E computed from the closed form; the greedy choice matches the best of them."""
    rejects = [0.7, 0.7, 0.7]
    width, depth = 4, len(rates)
    out = tree_expected_tokens(rates, rejects, depth=depth, extra=6, width=width)
    for m in range(7):
        best = 0.0
        for placed in itertools.product(range(width), repeat=depth):
            if sum(placed) != m:
                continue
            e, reach = 1.0, 1.0
            for j in range(depth):
                e += reach * (1 - rates[j]) * (1 - math.prod(rejects[:placed[j]]))
                reach *= rates[j]
                e += reach
            best = max(best, e)
        assert out[m] == pytest.approx(best)


def test_a_width_of_one_adds_nothing() -> None:
    out = tree_expected_tokens([0.5, 0.5], [0.5], depth=2, extra=3, width=1)
    assert out == [pytest.approx(1.75)] * 4


# --- chain or tree, by cost ------------------------------------------------------------------------
RTX4090_MS = dict(RTX4090.target)


@pytest.mark.parametrize("rate", [0.9, 0.7, 0.5])
def test_on_a_cpu_a_dflash_draft_drafts_chains_or_nothing(rate: float) -> None:
    """A row costs a third of a plain step here (SmolLM2 on 2 threads): siblings that rescue a quarter of
    the misses never pay for their rows. A strong draft drafts a chain, a weak one nothing."""
    ctl = tree_controller(CPU)
    teach(ctl, "dflash", [rate] * 16)
    decision = plan(ctl)
    assert decision.tree_nodes == 0
    assert (decision.name == "dflash") == (rate == 0.9)


@pytest.mark.parametrize("points, rate, wide", [(GPU, 0.5, 3), (RTX4090_MS, 0.6, 4)], ids=["flat-gpu", "rtx4090"])
def test_on_a_gpu_the_same_draft_drafts_a_tree(points, rate: float, wide: int) -> None:  # noqa: ANN001
    ctl = tree_controller(points)
    teach(ctl, "dflash", [rate] * 16)
    decision = plan(ctl)
    assert decision.name == "dflash"
    assert extra_nodes(decision) >= wide
    assert decision.reason.startswith(f"dflash k={decision.draft_len} as a {decision.tree_nodes}-node tree")
    # and the best chain would have been worth less
    chain = tree_controller(points, nodes_limit=0)
    teach(chain, "dflash", [rate] * 16)
    assert plan(chain).speedup < decision.speedup


def test_on_a_gpu_a_sure_draft_drafts_a_long_chain() -> None:
    """Deep chains beat trees where the draft is rarely wrong: siblings rescue only what the chain misses."""
    ctl = tree_controller(RTX4090_MS)
    teach(ctl, "dflash", [0.9] * 32)
    decision = plan(ctl)
    assert decision.tree_nodes == 0 and decision.draft_len > TREE_DEPTH_MAX


def test_the_weaker_the_draft_the_wider_its_tree_for_its_depth() -> None:
    shapes = []
    for rate in (0.7, 0.5, 0.4):
        ctl = tree_controller(RTX4090_MS)
        teach(ctl, "dflash", [rate] * 16)
        decision = plan(ctl)
        assert extra_nodes(decision) > 0
        shapes.append(extra_nodes(decision) / decision.draft_len)
    assert shapes == sorted(shapes) and shapes[0] < shapes[-1]


def test_a_draft_model_tree_pays_for_its_extra_draft_rows() -> None:
    """The same target, acceptance and one-token draft cost: a draft whose extra rows are nearly free (a
    GPU's) grows a wider tree than one whose every row costs a token's decode (a CPU's)."""
    ks = (1, 2, 4, 8, 16, 32)
    free_rows = tree_controller(GPU, "draft", draft={k: 1.0 + 0.01 * k for k in ks})
    dear_rows = tree_controller(GPU, "draft", draft={k: 1.0 * k for k in ks})
    for ctl in (free_rows, dear_rows):
        teach(ctl, "draft", [0.6] * 16)
    assert extra_nodes(plan(free_rows)) >= 3
    assert extra_nodes(plan(dear_rows)) < extra_nodes(plan(free_rows))


def test_a_draft_models_tree_costs_one_decode_per_level_and_its_rows() -> None:
    costs = CostModel(GPU)
    draft = {1: 1.0, 2: 1.2, 4: 1.6, 8: 2.4}
    costs.set_model_drafter("draft", CostModel(draft))
    costs.set_draft_cost("dflash", 2.0, 0.1)
    chain = costs.draft_ms("draft", 4)
    # 6 further nodes over the 3 decodes after the catch-up's: 3 rows a decode instead of 1 (V(3) = 1.4)
    assert costs.tree_draft_ms("draft", 4, 10) == pytest.approx(chain + 3 * (1.4 - 1.0) + 6 * TREE_NODE_MS)
    assert costs.tree_draft_ms("draft", 1, 4) == pytest.approx(costs.draft_ms("draft", 1) + 3 * TREE_NODE_MS)
    assert costs.tree_draft_ms("dflash", 4, 10) == pytest.approx(costs.draft_ms("dflash", 4) + 6 * TREE_NODE_MS)
    assert costs.tree_draft_ms("draft", 4, 4) == chain


def test_no_tree_beyond_what_the_target_can_verify() -> None:
    assert plan(teach_all(tree_controller(GPU, nodes_limit=0))).tree_nodes == 0
    decision = plan(teach_all(tree_controller(GPU, nodes_limit=6)))
    assert 0 < decision.tree_nodes <= 6


def test_a_fixed_draft_length_drafts_a_chain_whatever_trees_would_gain() -> None:
    # Costs under which the adaptive controller grows a tree at depth 4: a fixed length of 4 still drafts
    # a chain of 4, so a seeded run consumes the same random numbers whatever the clock measured.
    assert plan(teach_all(tree_controller(GPU, draft_len_limit=4))).tree_nodes > 4
    decision = plan(teach_all(tree_controller(GPU, draft_len=4)))
    assert decision.draft_len == 4 and decision.tree_nodes == 0
    assert decision.reason.startswith("dflash k=4: draft length fixed at 4")


def test_trees_are_priced_no_deeper_than_the_cap() -> None:
    ctl = teach_all(tree_controller(GPU), rate=0.99)
    decision = plan(ctl)
    assert decision.tree_nodes == 0 or decision.draft_len <= TREE_DEPTH_MAX


def teach_all(ctl: Controller, rate: float = 0.5) -> Controller:
    for d in ctl.drafters:
        teach(ctl, d.name, [rate] * 32)
    return ctl


# --- learning from the trees verified ---------------------------------------------------------------
def tree_step(ctl: Controller, walk: tuple[tuple[int, int], ...], accepted: int) -> None:
    decision = plan(ctl)
    assert decision.tree_nodes > decision.draft_len
    tokens = tuple(range(1, accepted + 2))
    step = step_event(tokens, decision.name, decision.draft_len, accepted, verified=decision.tree_nodes,
                      draft_ms=1.0, verify_ms=10.0)
    ctl.observe(dataclasses.replace(step, walk=walk), [0, *tokens])


def test_siblings_kept_teach_the_controller_that_trees_pay() -> None:
    """The root's second child kept, step after step: the siblings' rate rises and so does a tree's E;
    the chain's rate at depth 1 learns a rejection each time (the first child's test is the chain's)."""
    # Planned afresh every step (hold_steps=1): this is about what the estimates price, not when a plan is redone.
    ctl = teach_all(tree_controller(GPU, hold_steps=1), rate=0.5)
    state = ctl._states["dflash"]
    before_sibling = state.siblings.rate(0)
    before = plan(ctl).expected_tokens
    reached, kept = ctl.acceptance("dflash").reached[0], ctl.acceptance("dflash").kept[0]
    for _ in range(6):
        tree_step(ctl, ((3, 1), (0, -1)), accepted=1)
    assert state.siblings.rate(0) < before_sibling  # rank 1 is rejected less often
    assert ctl.acceptance("dflash").rate(0) < kept / reached  # position 1's first child: rejected
    assert plan(ctl).expected_tokens > before
    assert state.width == 1.0  # a tree's nodes are not a chain's width


def test_the_chain_inside_a_tree_teaches_the_chains_rates() -> None:
    ctl = teach_all(tree_controller(GPU), rate=0.5)
    state = ctl._states["dflash"]
    est = ctl.acceptance("dflash")
    est.reached, est.kept = [], []
    tree_step(ctl, ((3, 0), (2, 0), (2, 1), (0, -1)), accepted=3)
    assert est.reached[:3] == pytest.approx([1.0, 1.0, 1.0]) and est.kept[:3] == pytest.approx([1.0, 1.0, 0.0])
    assert len(est.reached) == 3  # nothing deeper was judged on the chain
    # the node at depth 3 tried its second child and kept it: one sibling judged, kept
    assert state.siblings.reached[:1] == pytest.approx([1.0]) and state.siblings.kept[:1] == pytest.approx([0.0])


def test_chained_mtp_heads_pay_for_every_nodes_draft_region() -> None:
    """Two chained heads (``passes=2``): a node at depth 1 is decoded as its region [x_last, t1], two rows,
    so the first level's further nodes cost twice the rows a one-head tree's do; past the last head a node
    is one row again."""
    draft = {1: 1.0, 2: 1.2, 4: 1.6, 8: 2.4}
    one, two = CostModel(GPU), CostModel(GPU)
    one.set_model_drafter("mtp", CostModel(draft))
    two.set_model_drafter("mtp", CostModel(draft), passes=2)
    # 6 further nodes over 3 levels: 3 nodes a level; level 1 holds 2 rows a node (V(6) = 2.0 vs V(2) = 1.2),
    # levels 2 and 3 one row a node (V(3) = 1.4 vs V(1))
    rows = (2.0 - 1.2) + 2 * (1.4 - 1.0)
    assert two.tree_draft_ms("mtp", 4, 10) == pytest.approx(two.draft_ms("mtp", 4) + rows + 6 * TREE_NODE_MS)
    assert one.tree_draft_ms("mtp", 4, 10) == pytest.approx(one.draft_ms("mtp", 4) + 3 * (1.4 - 1.0) + 6 * TREE_NODE_MS)
    assert two.tree_draft_ms_at("mtp", 4, [0, 3, 6]) == pytest.approx([two.tree_draft_ms("mtp", 4, 4 + m)
                                                                      for m in (0, 3, 6)])


# --- a held plan ---------------------------------------------------------------------------------
def test_a_draft_models_plan_is_held_until_its_inputs_change() -> None:
    """A draft model's full plan is held for a few steps (Controller._hold): an estimate that moved is
    not priced until the hold ends, while a change in what a step may draft ends it at once."""
    def fresh(hold: int) -> Controller:
        return teach_all(tree_controller(GPU, draft=CPU, hold_steps=hold), rate=0.9)

    held, replanned = fresh(8), fresh(1)
    first = plan(held)
    assert first.chosen is not None and first.draft_len > 1 and plan(replanned).draft_len == first.draft_len
    for ctl in (held, replanned):
        teach(ctl, "dflash", [0.05] * 64)  # the drafter turned bad since the plan
    again = plan(held)
    assert (again.chosen, again.draft_len, again.reason) == (first.chosen, first.draft_len, first.reason)
    assert plan(replanned).draft_len != first.draft_len  # planned afresh, it sees the change at once
    assert plan(held, max_k=2).draft_len <= 1  # a smaller limit is not the one the held plan was made for
