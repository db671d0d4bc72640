"""Pricing a step's options: what each choice is expected to emit, and what it costs.

Plain functions over the costs (``CostModel``), one drafter's estimates (``DrafterEstimates``) and the
limits of the step; the controller (``localspec.policy.controller``) asks them and chooses.

The decision rule
-----------------
For drafter d drafting k tokens with conditional acceptance a_0, a_1, ... by
position, a step emits on average

    E(k) = 1 + sum_{i<k} prod_{j<=i} a_j          tokens (the target's own token always counts)

and takes

    T(k) = draft_ms(d, k) + C_d + verify_ms(1 + n_d(k) + x_d) + overhead_ms(k)

where n_d(k) is the number of candidate tokens verified (k for a chain, the
node count for a tree; a learned width per planned token for drafters whose
proposal is not known beforehand), x_d the tokens every batch of d carries
besides the candidates (``batch_extra_tokens``: lookahead's window), and C_d
the catch-up d must decode first (``behind``: a draft model's prefill of the
prompt the first time, then every token since it last drafted). Plain
decoding emits 1 token in T0 = verify_ms(1) + overhead_ms(0). Verification costs are priced at the
step's KV depth in the context (``CostModel.kv_depth``: attention grows with every cached cell).

The catch-up is paid once and then serves the steps that follow, so options
are ranked by E / (T - C + C min(1, E / H)), the catch-up spread over the
next H tokens (the tokens left, at most the controller's ``catch_up_horizon``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

from localspec.drafting.base import Drafter, Evidence, Proposal, TreeProposal
from localspec.policy.costs import CostModel
from localspec.policy.estimates import (
    DrafterEstimates,
    best_path,
    tree_confidence,
    tree_expected_tokens,
)

# Trees a drafter grows (``Drafter.tree_width``): the deepest priced, and the further nodes beyond the chain
# each depth is priced with (the most the target's sequences allow). Kept few: a plan prices every one.
TREE_DEPTH_MAX = 8
TREE_EXTRAS = (1, 2, 3, 4, 6, 8, 12, 16, 24)


@dataclass(frozen=True)
class Option:
    """One candidate plan: ``drafter`` drafting ``draft_len`` tokens (``proposal``: made already; the
    step cuts it to ``draft_len``, ``speculative.fit_proposal``)."""

    drafter: Drafter
    draft_len: int
    tokens: float
    ms: float
    catch_up_ms: float = 0.0
    behind: int = 0
    proposal: Proposal | TreeProposal | None = None
    shape: str = ""
    tree_nodes: int = 0  # > draft_len: ask the drafter for a tree of this many nodes

    def ranked_ms(self, horizon: float) -> float:
        """The step's time with its catch-up spread over the ``horizon`` tokens it will serve."""
        return self.ms - self.catch_up_ms + self.catch_up_ms * min(1.0, self.tokens / horizon)


def line_starts(tokens: Sequence[int], draft_len: int, evidence: Evidence | None,
                ends_line: Callable[[int], bool] | None) -> list[int]:
    """The positions below ``draft_len`` of a draft's ``tokens`` whose token starts a line (none without
    ``ends_line``, and none for a loop carried on, ``evidence.loop``: its lines repeat whole, so its class
    alone judges them, breaks included)."""
    if ends_line is None or (evidence is not None and evidence.loop):
        return []
    return [i for i in range(1, min(draft_len, len(tokens))) if ends_line(tokens[i - 1])]


def expected_by_length(state: DrafterEstimates, draft_len: int, confidence: Sequence[float] = (),
                       evidence: Evidence | None = None, tokens: Sequence[int] = (), *,
                       ends_line: Callable[[int], bool] | None = None) -> list[float]:
    """E(k) for k = 0..draft_len in one pass; with ``evidence``, from what proposals resting on such
    evidence were seen to keep (see evidence_class), never above the evidence's own agreement, nor,
    where one of the proposal's ``tokens`` starts a line (``ends_line``), above ``line_start_rate``;
    never above the proposal's own ``confidence`` where it has one."""
    estimate = state.acceptance if evidence is None else state.evidence_acceptance(evidence)
    if evidence is not None and not confidence:
        confidence = evidence.agreement(draft_len)
    scale = state.calibrated(estimate) if evidence is not None else 1.0
    starts = set(line_starts(tokens, draft_len, evidence, ends_line)) if evidence is not None else set()
    line_start = state.line_start_rate
    out, total, run = [1.0], 1.0, 1.0
    for i, a in enumerate(estimate.rates(draft_len)):
        if i in starts:
            a = min(a, line_start)
        run *= min(a, confidence[i]) if i < len(confidence) else a
        total += run * scale
        out.append(total)
    return out


def step_ms(costs: CostModel, name: str, draft_len: int, verify_ms: float, *, drafting: bool = True,
            catch_up_ms: float = 0.0) -> float:
    """T(k): drafting (unless already done), the catch-up, verifying the batch (``verify_ms``) and the
    step's Python work."""
    draft = costs.draft_ms(name, draft_len) if drafting else 0.0
    return draft + catch_up_ms + verify_ms + costs.overhead_ms(draft_len)


def draft_lens(max_draft_len: int, fixed: int | None) -> range:
    """The draft lengths an option may have: ``max_draft_len`` alone when the draft length is ``fixed``,
    else 1..``max_draft_len``."""
    return range(max_draft_len, max_draft_len + 1) if fixed is not None else range(1, max_draft_len + 1)


def proposal_nodes(proposal: Proposal | TreeProposal) -> int:
    """The draft tokens a proposal offers (a tree's nodes, a chain's tokens; 0: it found nothing)."""
    return len(proposal.tree) if isinstance(proposal, TreeProposal) else len(proposal.tokens)


def asked_options(costs: CostModel, state: DrafterEstimates, drafter: Drafter,
                  proposal: Proposal | TreeProposal, max_draft_len: int, *, fixed: int | None,
                  ends_line: Callable[[int], bool] | None) -> list[Option]:
    """The best option from a proposal in hand: of every draft length up to ``max_draft_len``, as the whole tree or
    its most probable path, the one that gives the most tokens per ms, the first of equals (as the
    controller ranks them; a lookup has no catch-up, so the ranking needs no horizon). Only that one is
    built: with drafts of up to 31 tokens a tree offers 62 options every step, and building each was most
    of a plan's time."""
    extra = drafter.batch_extra_tokens
    nodes = proposal_nodes(proposal)
    if not nodes:
        return []  # no draft length to offer (a lookup that found nothing: most steps of most texts)
    best: Option | None = None
    best_rate = -1.0
    # every batch an offer verifies, its cost read from one walk along the measured points
    verify_ms = costs.verify_ms_at(range(1, 2 + extra + nodes))
    offered = offers(state, drafter.name, proposal, max_draft_len, fixed=fixed, ends_line=ends_line)
    for k, tokens, verified, offer, shape in offered:
        ms = step_ms(costs, drafter.name, k, verify_ms[extra + verified], drafting=False)
        if tokens / ms > best_rate:
            best_rate = tokens / ms
            best = Option(drafter, k, tokens, ms, proposal=offer, shape=shape)
    return [best] if best is not None else []


def offers(state: DrafterEstimates, name: str, proposal: Proposal | TreeProposal, max_draft_len: int, *,
           fixed: int | None, ends_line: Callable[[int], bool] | None
           ) -> Iterator[tuple[int, float, int, Proposal | TreeProposal, str]]:
    """(k, expected tokens, candidate tokens verified, what to verify, its shape) for every draft length k
    of a proposal in hand: a tree of several leaves whole and as its most probable path, a chain as it is."""
    if isinstance(proposal, TreeProposal) and len(proposal.tree.leaves) > 1:
        tree = proposal.tree
        deepest = min(max(tree.depths), max_draft_len)
        evidence = proposal.evidence
        tree_tokens = expected_by_length(state, deepest, tree_confidence(tree), evidence, ends_line=ends_line)
        path, path_confidence = best_path(tree)
        path_tokens = expected_by_length(state, deepest, path_confidence, evidence, path, ends_line=ends_line)
        path_proposal = Proposal(path, None, proposal.drafter or name, evidence)
        nodes_to = [0] * (deepest + 1)  # nodes_to[k]: the tree's nodes at tree depth k or less
        for d in tree.depths:
            if d <= deepest:
                nodes_to[d] += 1
        for k in range(1, deepest + 1):
            nodes_to[k] += nodes_to[k - 1]
        for k in draft_lens(deepest, fixed):
            yield k, tree_tokens[k], nodes_to[k], proposal, f"a {nodes_to[k]}-node tree"
            yield k, path_tokens[k], k, path_proposal, ""
        return
    longest = min(len(proposal.tokens), max_draft_len)
    expected = expected_by_length(state, longest, evidence=proposal.evidence, tokens=proposal.tokens,
                                  ends_line=ends_line)
    for k in draft_lens(longest, fixed):
        yield k, expected[k], k, proposal, ""


def options(costs: CostModel, state: DrafterEstimates, drafter: Drafter, max_draft_len: int, *, width: float,
            behind: int, horizon: float, fixed: int | None, tree_nodes_limit: int) -> list[Option]:
    """Options for a drafter asked only once chosen: chains of every draft length up to ``max_draft_len`` and, for
    one that grows trees, the best tree (``width``: the verified tokens per planned draft token it was
    seen to need; ``horizon``: the tokens a catch-up is spread over, see Option.ranked_ms)."""
    name = drafter.name
    catch_up = costs.catch_up_ms(name, behind)
    expected = expected_by_length(state, max_draft_len)
    lengths = draft_lens(max_draft_len, fixed)
    # every k's batch (the learned width times k, and the drafter's extra tokens) walked once
    extra = drafter.batch_extra_tokens
    verify_ms = costs.verify_ms_at([1.0 + width * k + extra for k in lengths])
    chains = [Option(drafter, k, expected[k], step_ms(costs, name, k, v, catch_up_ms=catch_up), catch_up, behind)
              for k, v in zip(lengths, verify_ms)]
    return chains + tree_options(costs, state, drafter, max_draft_len, catch_up=catch_up, behind=behind,
                                 horizon=horizon, chains=chains, fixed=fixed, tree_nodes_limit=tree_nodes_limit)


def tree_options(costs: CostModel, state: DrafterEstimates, drafter: Drafter, max_draft_len: int, *, catch_up: float,
                 behind: int, horizon: float, chains: Sequence[Option], fixed: int | None,
                 tree_nodes_limit: int) -> list[Option]:
    """The best tree for a drafter that grows them (``tree_width`` > 1), if any: at each tree depth k up to
    ``TREE_DEPTH_MAX``, the chain plus m further nodes for each m of ``TREE_EXTRAS`` the target can
    verify (``tree_nodes_limit``), with E from the chain's rates and the siblings'
    (``tree_expected_tokens``) and T from what the tree costs to draft (``CostModel.tree_draft_ms``: for
    a draft model, its extra rows; for DFlash, nothing but its nodes' Python work) and to verify
    (1 + k + m rows). Only the best is built (ranked as the controller ranks, the catch-up spread over
    ``horizon``), and a tree depth whose trees cannot beat the best of ``chains`` even at the largest gain
    per node is not priced: a plan would otherwise price 72 trees every step.

    A ``fixed`` draft length grows no tree: it drafts a chain of exactly that many tokens, whatever the
    clock says. A tree's width follows measured costs, so it varied from run to run, and with it which
    random numbers a seeded step consumed and which siblings counted as drafted."""
    width, largest = drafter.tree_width, tree_nodes_limit
    lengths = [k for k in draft_lens(max_draft_len, fixed) if k <= TREE_DEPTH_MAX and k < largest]
    if width <= 1 or not lengths or fixed is not None:
        return []
    name = drafter.name
    rates = state.acceptance.rates(max(lengths))
    rejects = state.siblings.rates(width - 1)
    extra = drafter.batch_extra_tokens
    sizes = [float(n) for n in range(1 + min(lengths) + 1 + extra, 2 + max(lengths) + TREE_EXTRAS[-1] + extra)]
    verify = dict(zip(sizes, costs.verify_ms_at(sizes)))
    best: tuple[float, int, int, float, float] | None = None  # (rate, k, m, tokens, ms)
    floor = max((o.tokens / o.ranked_ms(horizon) for o in chains), default=0.0)
    # No further node adds more than reach_j (1 - a_j) at some tree depth j < k times the most any rank
    # of sibling rescues (prod_{r<n} b_r (1 - b_n)): a tree depth whose trees cannot beat the best option
    # so far even at that gain per node is not priced (on a CPU, most).
    rescue = max(math.prod(rejects[:n]) * (1.0 - rejects[n]) for n in range(len(rejects)))
    reach, chain_tokens, top_gain = 1.0, [1.0], [0.0]
    for a in rates:
        top_gain.append(max(top_gain[-1], reach * (1.0 - a) * rescue))
        reach *= a
        chain_tokens.append(chain_tokens[-1] + reach)
    for k in lengths:
        extras = [m for m in TREE_EXTRAS if m <= largest - k]
        if not extras:
            continue
        priced = [draft + catch_up + verify[1.0 + k + m + extra] + costs.overhead_ms(k + m)
                  for m, draft in zip(extras, costs.tree_draft_ms_at(name, k, extras))]
        bar = max(floor, best[0] if best is not None else 0.0)
        bounds = (chain_tokens[k] + m * top_gain[k] for m in extras)
        if all(e / (ms - catch_up + catch_up * min(1.0, e / horizon)) <= bar for e, ms in zip(bounds, priced)):
            continue
        expected = tree_expected_tokens(rates, rejects, depth=k, extra=extras[-1], width=width)
        for m, ms in zip(extras, priced):
            tokens = expected[m]
            ranked = ms - catch_up + catch_up * min(1.0, tokens / horizon)
            if best is None or tokens / ranked > best[0]:
                best = (tokens / ranked, k, m, tokens, ms)
    if best is None:
        return []
    _, k, m, tokens, ms = best
    return [Option(drafter, k, tokens, ms, catch_up, behind, shape=f"a {k + m}-node tree", tree_nodes=k + m)]
