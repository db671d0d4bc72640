"""The controller: the one owner of every drafting decision.

Each step it decides which drafter drafts, how many tokens (``draft_len``)
and, for a lookup that found several continuations, how wide a tree — or
that the step decodes plainly. It sees the drafters themselves (what each
declares in ``localspec.drafting.base.Drafter``), one decaying acceptance
estimate per drafter, and a ``CostModel`` (``localspec.policy.costs``) for every
cost a choice causes. Pure logic: no llama.cpp.

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
step's depth in the context (``CostModel.depth``: attention grows with every cached cell).

The catch-up is paid once and then serves the steps that follow, so options
are ranked by E / (T - C + C min(1, E / H)), the catch-up spread over the
next H tokens (the tokens left, at most ``catch_up_horizon``). The best
option is taken when it beats plain by ``margin`` (5%); otherwise the step
decodes plainly. A fixed draft length (the user's) forces k; the controller
then still chooses the drafter and the width. Without one, a reply's first
step never drafts (nor probes) with a drafter that must catch up first (a
draft model's prefill): time to the first token does not grow because a
draft model is loaded, even when stale or noisy costs say it would pay.

Cheap drafters (``cheap``: deterministic lookups costing microseconds) are
asked before planning, while their lookups cost at most ``lookup_share`` of
a plain step: the controller then plans with what they actually offer
(depth, and for a tree its own confidence by depth and its node count, or
only its most probable path), and scores the proposals it did not verify
against the text that follows, position by position as it comes, for free.
A lookup's measured time moves its cost estimate by at most
``LOOKUP_SURPRISE`` x per lookup: one caught by a pause must not push it past
``lookup_share``. One whose estimate is past it anyway is still asked every
``LOOKUP_RETIME`` steps: timed again, a lookup that was slow once (its first
lookups after the prompt's indexing, on a cold start) is asked every step
again as soon as it is fast; never re-timed, it stayed out for good, and the
copy it would have drafted went plain.

What the controller learns about each drafter (acceptance by position that
forgets; for a lookup, which decides no length but offers its candidates as
deep as the limit with their ``Evidence``, per class of that evidence,
tempered by a calibration while the classes learn, with line starts judged
apart) lives in ``localspec.policy.estimates``, with the reasons for each choice.

A lookup's time is spent whatever is decided, so it is not part of T; it is
counted in the step's ``draft_ms``. The controller's own time (pricing the
options, learning from the step before) is handed to the step as
``Decision.planning_ms`` and counted in its ``python_ms``, so overhead_ms
learns it, for plain and drafting steps alike.

Probing, and why it costs at most ~2.5% speed
---------------------------------------------
A drafter that is not used learns nothing, so one that turned good (the text
became repetitive) would never be picked again. Drafters not asked
beforehand are *probed*: after ``wait`` unobserved steps, one step drafts
``probe_len`` tokens with them. ``wait`` doubles after each failed probe (up
to ``max_wait``) and falls back to ``min_wait`` after a success: more tokens
accepted than the estimate expected, at a rate that could beat plain
decoding at all.

Probes are paid from a budget: every non-probe step adds ``probe_share`` x
T0 x (tokens emitted) and a probe starts only when the budget covers its
worst-case excess over plain (T(k) - T0 with its whole catch-up: the probe
emits a single token); its measured excess (time - T0 x tokens) is then
charged. Hence over any run, with N tokens emitted and non-probe steps no
slower than plain (they beat it by the margin, or are plain):

    time <= T0 N + sum(probe excess) <= T0 N (1 + probe_share) + one probe's estimation error,

so speed >= 1 / 1.025 = 0.976 x plain for probe_share = 0.025 (over a reply that emits at least
``PROBE_ADVANCE_TOKENS`` or all it was allowed; see below), plain as the
controller runs it: its planning comes on top (0.3-0.5 ms a step on a 2-core
CPU while a lookup is asked every step, about 2% of a small model's step; while
speculation is off and nothing is asked, the full plan runs every
``replan_every`` steps only). A draft model
as costly as the target is never chosen (T(k) exceeds E(k) T0 at any
acceptance), and its probes, which pay its prefill and catch-up, wait until
the budget covers them: in a short reply, never, so nothing is decoded with
it at all. Where drafting is nearly free (a GPU), forgetting returns an
unused drafter's estimate to the prior, which is enough to try it again as
an ordinary step.

A draft model's catch-up grows with every token it does not see, faster than
the budget grows on a GPU (H200, 8B target: 0.16 ms a token against 0.09), so
a draft model judged late was never probed at all. Two rules fix that: a
probe may draw the reply's *advance* (the budget of its first
``PROBE_ADVANCE_TOKENS`` tokens, at most those it may emit; repaid before
its steps add to the budget) when the drafter's estimates say it would pay
once in step, so it is probed while its catch-up is the prompt alone; and a
probe that paid a catch-up goes on for ``PROBE_BURST`` steps while the draft
is in step (each costs only its drafting and wider verification) and is
judged on all of them, by acceptance per position reached, against beating
plain at any length up to the probe's.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

from localspec.policy.costs import CostModel
from localspec.drafting.base import Drafter, Evidence, Proposal, TreeProposal, common_prefix
from localspec.policy.estimates import (
    DecayingAcceptance,
    DrafterEstimates,
    UnusedProposals,
    best_path,
    expected_tokens_per_step,
    proposal_branches,
    tree_confidence,
    tree_expected_tokens,
)
from localspec.events import StepEvent
from localspec.policy.decision import ControllerStats, Decision

# The most tokens the controller drafts per step when the length is not fixed: a batch of 32 with the
# last token, the largest the verify costs are measured for (``localspec.policy.measure.DEFAULT_KS``).
DRAFT_LEN_CAP = 31
# The longest fixed draft length accepted (a batch of 65 tokens).
DRAFT_LEN_MAX = 64
# Trees a drafter grows (``Drafter.tree_width``): the deepest priced, and the further nodes beyond the chain
# each depth is priced with (the most the target's sequences allow). Kept few: a plan prices every one.
TREE_DEPTH_MAX = 8
TREE_EXTRAS = (1, 2, 3, 4, 6, 8, 12, 16, 24)
# A held plan (see Controller._hold) is planned afresh once its drafter is this many tokens behind: the held
# decision priced a catch-up of a step's tokens, not a longer one.
HELD_BEHIND_MAX = 8
# A lookup's time teaches its cost estimate at most this many times the estimate (see Controller._look_up).
LOOKUP_SURPRISE = 2.0
# A lookup whose estimate is past ``lookup_share`` is still asked (and timed) every this many steps.
LOOKUP_RETIME = 8
# A probe that paid a draft model's catch-up goes on for this many steps while the draft is in step
# (each costs only its drafting and its wider verification): one short probe is a coin toss at
# alpha 0.7, and a drafter judged on it falls behind again and is not probed for a long time.
PROBE_BURST = 8
# Each reply is advanced the probe budget of its first tokens (at most this many of those it may
# emit; repaid by what its steps earn before they add to it), so a draft model can be probed while
# its catch-up is the prompt alone, not hundreds of tokens later when it would cost more than the
# budget could ever cover.
PROBE_ADVANCE_TOKENS = 512


@dataclass
class _DrafterState(DrafterEstimates):
    """What the controller keeps about one drafter (by name: it outlives a generation): what it
    learned (``DrafterEstimates``) and the planning's own bookkeeping."""

    width: float = 1.0      # verified tokens per planned draft token (drafters not asked beforehand)
    last_seen: int = 0      # step of the last acceptance observation
    wait: int = 0           # unobserved steps before the next probe
    lookups: int = 0        # lookups since the drafter was reset (the first one indexes the prompt)
    asked_at: int = -(1 << 30)  # step of the last lookup asked before planning
    # A probe of a drafter that had to catch up goes on for PROBE_BURST steps (see _probe), judged as one.
    burst: int = 0          # probe steps still to come in the current burst
    burst_kept: int = 0     # tokens its steps so far kept
    burst_expected: float = 0.0  # tokens the estimates expected them to keep
    burst_reached: int = 0  # positions they reached (drafted up to the first rejection)
    burst_steps: int = 0
    burst_len: int = 0      # the length its steps drafted


@dataclass(frozen=True)
class _Option:
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


# --- the controller -----------------------------------------------------------
class Controller:
    """Plans each step (``plan``) and learns from it (``observe``); see the module notes.

    ``drafters``: the drafters ``plan`` may choose this generation (``start``
    replaces them). ``draft_len``: a fixed draft length (the user's); None
    lets the controller choose up to ``draft_len_cap``. ``draft_len_limit``:
    the most tokens any step may draft whatever else is asked (set by the
    engine from the backend, e.g. how far the target's cache can roll back).
    One controller lives as long as the engine: its costs and acceptance
    estimates carry over from one generation to the next. ``clock`` (seconds)
    times the lookups it makes. While speculation is off and no lookup is
    asked, the full plan runs every ``replan_every`` steps (its inputs drift
    slowly; a due probe is never delayed), so an unused draft model costs a
    plain step almost nothing.
    """

    def __init__(self, costs: CostModel, drafters: Sequence[Drafter] = (), *, draft_len: int | None = None,
                 draft_len_limit: int | None = None, tree_nodes_limit: int = 0,
                 draft_len_cap: int = DRAFT_LEN_CAP, margin: float = 0.05,
                 probe_share: float = 0.025, probe_len: int = 3, min_wait: int = 8, max_wait: int = 512,
                 prior: float = 0.6, lookup_share: float = 0.02, catch_up_horizon: int = 64,
                 replan_every: int = 8, hold_steps: int = 8, clock: Callable[[], float] = time.perf_counter,
                 ends_line: Callable[[int], bool] | None = None) -> None:
        self.costs = costs
        self.ends_line = ends_line
        """Whether a token's text ends a line (None: no line structure is used)."""
        self.replan_every = replan_every
        self.hold_steps = hold_steps
        """Steps a plan drafting with a drafter asked only once chosen is held (see ``_hold``; 1: none)."""
        self.draft_len_cap = draft_len_cap
        self.margin = margin
        self.probe_share = probe_share
        self.probe_len = probe_len
        self.min_wait = min_wait
        self.max_wait = max_wait
        self.prior = prior
        self.lookup_share = lookup_share
        self.catch_up_horizon = catch_up_horizon
        self.clock = clock
        self.stats = ControllerStats()
        self._states: dict[str, _DrafterState] = {}
        self._members: dict[str, Drafter] = {}
        self.draft_len: int | None = None
        self.draft_len_limit: int | None = None
        self.tree_nodes_limit = 0
        self._step = 0
        self._pending: tuple[Decision, float] | None = None  # the planned decision and T0 then
        self._asked: dict[str, Proposal | TreeProposal] = {}  # lookups made while planning the pending step
        self._unused = UnusedProposals()
        self._last_used: str | None = None  # the drafter the last observed step verified
        self._plan_started = 0.0  # clock() when the pending plan began
        self._observe_ms = 0.0  # the last observe's time, charged to the next decision's planning_ms
        # While speculation is off and no lookup is asked, the full plan is redone only every few steps
        # (nothing it depends on moves faster): until step _off_until, plain with this reason prefix.
        self._off_until = 0
        self._off_reason: tuple[str, int] = ("", 0)  # (reason up to the probe count, step of the next probe)
        # Likewise while drafting with a drafter asked only once chosen (a draft model, a head): its full
        # plan's decision is held until step _held[1] (see _hold).
        # (decision, last step, the limit and the history's length it was planned at)
        self._held: tuple[Decision, int, int, int] | None = None
        self.start(drafters, draft_len=draft_len, draft_len_limit=draft_len_limit, tree_nodes_limit=tree_nodes_limit)

    def start(self, drafters: Sequence[Drafter], *, draft_len: int | None = None,
              draft_len_limit: int | None = None, tree_nodes_limit: int = 0) -> None:
        """Begin a generation with ``drafters`` (reset for a new sequence). What was learned stays.

        ``tree_nodes_limit``: the most nodes a tree grown by a drafter (``Drafter.tree_width``) may have,
        as the target can verify it (its sequences); 0: such drafters draft chains."""
        if draft_len is not None and not 0 <= draft_len <= DRAFT_LEN_MAX:
            raise ValueError(f"a fixed draft length must be in 0..{DRAFT_LEN_MAX}, not {draft_len}")
        names = [d.name for d in drafters]
        if len(set(names)) != len(names):
            raise ValueError(f"drafter names must differ: {names}")
        self._members = {d.name: d for d in drafters}
        for name in self._members:
            state = self._states.get(name)
            if state is None:
                state = self._states[name] = _DrafterState(DecayingAcceptance(prior=self.prior), wait=self.min_wait)
            state.lookups = 0
        self.draft_len = draft_len
        self.draft_len_limit = draft_len_limit
        self.tree_nodes_limit = tree_nodes_limit
        self._off_until = 0
        self._held = None
        # Each generation earns its own probe budget: a reply never pays for a probe with what earlier
        # replies saved, so none slows a reply (or its first token) beyond the bound.
        self.stats.probe_budget_ms = 0.0
        self._advance_due = True  # the reply's advance is set at its first plan (see PROBE_ADVANCE_TOKENS)
        self._advance = 0.0  # the advance a probe may still draw on
        self._owed = 0.0  # what the advance drawn still owes the budget
        self._pending = None
        self._observe_ms = 0.0  # the last generation's last observe is not this one's first step's
        self._asked = {}
        self._unused.clear()
        self._first = True  # the generation's first step is still to come (see plan)

    @property
    def drafters(self) -> list[Drafter]:
        return list(self._members.values())

    def acceptance(self, name: str) -> DecayingAcceptance:
        return self._states[name].acceptance

    # --- the objective ------------------------------------------------------
    def expected_tokens(self, name: str, draft_len: int, confidence: Sequence[float] = (),
                        evidence: Evidence | None = None) -> float:
        """E(k): the estimate's rates (for proposals resting on ``evidence``, when given), never above
        the proposal's own ``confidence`` where it has one."""
        return self._expected_by_length(name, draft_len, confidence, evidence)[draft_len]

    def _expected_by_length(self, name: str, limit: int, confidence: Sequence[float] = (),
                            evidence: Evidence | None = None, tokens: Sequence[int] = ()) -> list[float]:
        """E(k) for k = 0..limit in one pass; with ``evidence``, from what proposals resting on such
        evidence were seen to keep (see evidence_class), never above the evidence's own agreement,
        nor, where one of the proposal's ``tokens`` starts a line, above ``line_start_rate``."""
        state = self._states[name]
        estimate = state.acceptance if evidence is None else state.evidence_acceptance(evidence)
        if evidence is not None and not confidence:
            confidence = evidence.agreement(limit)
        scale = state.calibrated(estimate) if evidence is not None else 1.0
        starts = set(self._line_starts(tokens, limit, evidence)) if evidence is not None else set()
        line_start = state.line_start_rate
        out, total, run = [1.0], 1.0, 1.0
        for i, a in enumerate(estimate.rates(limit)):
            if i in starts:
                a = min(a, line_start)
            run *= min(a, confidence[i]) if i < len(confidence) else a
            total += run * scale
            out.append(total)
        return out

    def _line_starts(self, tokens: Sequence[int], depth: int, evidence: Evidence | None = None) -> list[int]:
        """The positions below ``depth`` of a draft's ``tokens`` whose token starts a line (none for a loop
        carried on, ``evidence.loop``: its lines repeat whole, so its class alone judges them, breaks included)."""
        if self.ends_line is None or (evidence is not None and evidence.loop):
            return []
        return [i for i in range(1, min(depth, len(tokens))) if self.ends_line(tokens[i - 1])]

    def step_ms(self, name: str, draft_len: int, *, verified: float | None = None, drafting: bool = True,
                catch_up_ms: float = 0.0, verify_ms: float | None = None) -> float:
        """T(k): drafting (unless already done), the catch-up, verifying the batch (``verified``
        candidate tokens; default: the learned width times k, plus the drafter's extra tokens;
        ``verify_ms``: that batch's cost when already read from ``CostModel.verify_ms_at``)
        and the step's Python work."""
        if verify_ms is None:
            member = self._members.get(name)
            extra = member.batch_extra_tokens if member is not None else 0
            n = self._states[name].width * draft_len if verified is None else verified
            verify_ms = self.costs.verify_ms(1.0 + n + extra)
        draft = self.costs.draft_ms(name, draft_len) if drafting else 0.0
        return draft + catch_up_ms + verify_ms + self.costs.overhead_ms(draft_len)

    def evaluate(self, name: str, draft_len: int, *, behind: int = 0) -> tuple[float, float]:
        """(expected tokens, expected ms) of one step where ``name`` drafts ``draft_len`` tokens when asked,
        after catching up ``behind`` tokens."""
        if draft_len <= 0:
            return 1.0, self.costs.plain_ms()
        return (self.expected_tokens(name, draft_len),
                self.step_ms(name, draft_len, catch_up_ms=self.costs.catch_up_ms(name, behind)))

    def _lengths(self, limit: int) -> range:
        return range(limit, limit + 1) if self.draft_len is not None else range(1, limit + 1)

    def _asked_options(self, drafter: Drafter, proposal: Proposal | TreeProposal, limit: int) -> list[_Option]:
        """The best option from a proposal in hand: of every depth, as the whole tree or its most probable
        path, the one that gives the most tokens per ms, the first of equals (as ``plan`` ranks them; a
        lookup has no catch-up, so the ranking needs no horizon). Only that one is built: with drafts of
        up to 31 tokens a tree offers 62 options every step, and building each was most of a plan's time."""
        best: _Option | None = None
        best_rate = -1.0
        # every batch an offer verifies, its cost read from one walk along the measured points
        extra = drafter.batch_extra_tokens
        nodes = len(proposal.tree) if isinstance(proposal, TreeProposal) else len(proposal.tokens)
        verify_ms = self.costs.verify_ms_at(range(1, 2 + extra + nodes))
        for k, tokens, verified, offer, shape in self._offers(drafter.name, proposal, limit):
            ms = self.step_ms(drafter.name, k, drafting=False, verify_ms=verify_ms[extra + verified])
            if tokens / ms > best_rate:
                best_rate = tokens / ms
                best = _Option(drafter, k, tokens, ms, proposal=offer, shape=shape)
        return [best] if best is not None else []

    def _offers(self, name: str, proposal: Proposal | TreeProposal, limit: int
                ) -> Iterator[tuple[int, float, int, Proposal | TreeProposal, str]]:
        """(k, expected tokens, candidate tokens verified, what to verify, its shape) for every depth k of a
        proposal in hand: a tree of several leaves whole and as its most probable path, a chain as it is."""
        if isinstance(proposal, TreeProposal) and len(proposal.tree.leaves) > 1:
            tree = proposal.tree
            depth = min(max(tree.depths), limit)
            evidence = proposal.evidence
            tree_tokens = self._expected_by_length(name, depth, tree_confidence(tree), evidence)
            path, path_confidence = best_path(tree)
            path_tokens = self._expected_by_length(name, depth, path_confidence, evidence, path)
            path_proposal = Proposal(path, None, proposal.drafter or name, evidence)
            nodes_to = [0] * (depth + 1)  # nodes_to[k]: the tree's nodes at depth k or less
            for d in tree.depths:
                if d <= depth:
                    nodes_to[d] += 1
            for k in range(1, depth + 1):
                nodes_to[k] += nodes_to[k - 1]
            for k in self._lengths(depth):
                yield k, tree_tokens[k], nodes_to[k], proposal, f"a {nodes_to[k]}-node tree"
                yield k, path_tokens[k], k, path_proposal, ""
            return
        depth = min(len(proposal.tokens), limit)
        expected = self._expected_by_length(name, depth, evidence=proposal.evidence, tokens=proposal.tokens)
        for k in self._lengths(depth):
            yield k, expected[k], k, proposal, ""

    def _options(self, drafter: Drafter, limit: int, behind: int, horizon: float) -> list[_Option]:
        """Options for a drafter asked only once chosen: chains of every length and, for one that grows
        trees, the best tree (``horizon``: the tokens a catch-up is spread over, see _Option.ranked_ms)."""
        name = drafter.name
        catch_up = self.costs.catch_up_ms(name, behind)
        expected = self._expected_by_length(name, limit)
        lengths = self._lengths(limit)
        # every k's batch (the learned width times k, and the drafter's extra tokens) walked once
        width, extra = self._states[name].width, drafter.batch_extra_tokens
        verify_ms = self.costs.verify_ms_at([1.0 + width * k + extra for k in lengths])
        chains = [_Option(drafter, k, expected[k], self.step_ms(name, k, catch_up_ms=catch_up, verify_ms=v),
                          catch_up, behind)
                  for k, v in zip(lengths, verify_ms)]
        return chains + self._tree_options(drafter, limit, catch_up, behind, horizon, chains)

    def _tree_options(self, drafter: Drafter, limit: int, catch_up: float, behind: int,
                      horizon: float, chains: Sequence[_Option]) -> list[_Option]:
        """The best tree for a drafter that grows them (``tree_width`` > 1), if any: at each depth k up to
        ``TREE_DEPTH_MAX``, the chain plus m further nodes for each m of ``TREE_EXTRAS`` the target can
        verify, with E from the chain's rates and the siblings' (``tree_expected_tokens``) and T from
        what the tree costs to draft (``CostModel.tree_draft_ms``: for a draft model, its extra rows;
        for DFlash, nothing but its nodes' Python work) and to verify (1 + k + m rows). Only the best
        is built (ranked as ``plan`` ranks, the catch-up spread over ``horizon``), and a depth whose
        trees cannot beat the best of ``chains`` even at the largest gain per node is not priced: a plan
        would otherwise price 72 trees every step.

        A fixed draft length (``draft_len``) grows no tree: it drafts a chain of exactly that many tokens,
        whatever the clock says. A tree's width follows measured costs, so it varied from run to run, and
        with it which random numbers a seeded step consumed and which siblings counted as drafted."""
        width, most = drafter.tree_width, self.tree_nodes_limit
        lengths = [k for k in self._lengths(limit) if k <= TREE_DEPTH_MAX and k < most]
        if width <= 1 or not lengths or self.draft_len is not None:
            return []
        name = drafter.name
        state = self._states[name]
        rates = state.acceptance.rates(max(lengths))
        rejects = state.siblings.rates(width - 1)
        extra = drafter.batch_extra_tokens
        sizes = [float(n) for n in range(1 + min(lengths) + 1 + extra, 2 + max(lengths) + TREE_EXTRAS[-1] + extra)]
        verify = dict(zip(sizes, self.costs.verify_ms_at(sizes)))
        best: tuple[float, int, int, float, float] | None = None  # (rate, k, m, tokens, ms)
        floor = max((o.tokens / o.ranked_ms(horizon) for o in chains), default=0.0)
        # No further node adds more than reach_j (1 - a_j) at some depth j < k times the most any rank
        # of sibling rescues (prod_{r<n} b_r (1 - b_n)): a depth whose trees cannot beat the best option
        # so far even at that gain per node is not priced (on a CPU, most).
        rescue = max(math.prod(rejects[:n]) * (1.0 - rejects[n]) for n in range(len(rejects)))
        reach, chain_tokens, top_gain = 1.0, [1.0], [0.0]
        for a in rates:
            top_gain.append(max(top_gain[-1], reach * (1.0 - a) * rescue))
            reach *= a
            chain_tokens.append(chain_tokens[-1] + reach)
        for k in lengths:
            extras = [m for m in TREE_EXTRAS if m <= most - k]
            if not extras:
                continue
            costs = [draft + catch_up + verify[1.0 + k + m + extra] + self.costs.overhead_ms(k + m)
                     for m, draft in zip(extras, self.costs.tree_draft_ms_at(name, k, extras))]
            bar = max(floor, best[0] if best is not None else 0.0)
            bounds = (chain_tokens[k] + m * top_gain[k] for m in extras)
            if all(e / (ms - catch_up + catch_up * min(1.0, e / horizon)) <= bar for e, ms in zip(bounds, costs)):
                continue
            expected = tree_expected_tokens(rates, rejects, depth=k, extra=extras[-1], width=width)
            for m, ms in zip(extras, costs):
                tokens = expected[m]
                ranked = ms - catch_up + catch_up * min(1.0, tokens / horizon)
                if best is None or tokens / ranked > best[0]:
                    best = (tokens / ranked, k, m, tokens, ms)
        if best is None:
            return []
        _, k, m, tokens, ms = best
        return [_Option(drafter, k, tokens, ms, catch_up, behind, shape=f"a {k + m}-node tree", tree_nodes=k + m)]

    # --- planning -----------------------------------------------------------
    def _limit(self, room: int, remaining: int) -> tuple[int, str]:
        """The most tokens this step may draft, and when that is 0, why (in words)."""
        if self.draft_len == 0:
            return 0, "the draft length is fixed at 0"
        if self.draft_len_limit is not None and self.draft_len_limit <= 0:
            return 0, "the model cannot roll back a draft"
        if room <= 0:
            return 0, "the context has no room for a draft"
        if remaining <= 1:
            return 0, "one token left to generate"
        limit = min(room, remaining - 1, self.draft_len if self.draft_len is not None else self.draft_len_cap)
        if self.draft_len_limit is not None:
            limit = min(limit, self.draft_len_limit)
        return limit, ""

    def _lookup_pays(self, drafter: Drafter, limit: int) -> bool:
        """Whether to ask ``drafter`` before planning: a lookup that stays within ``lookup_share`` of a plain step."""
        return drafter.cheap and self.costs.draft_ms(drafter.name, limit) <= self.lookup_share * self.costs.plain_ms()

    def _look_up(self, history: Sequence[int], limit: int) -> float:
        """Ask the cheap drafters; returns the ms it took (spent whatever is decided)."""
        self._asked = {}
        total = 0.0
        for drafter in self._members.values():
            state = self._states[drafter.name]
            retime = not self._lookup_pays(drafter, limit)
            if retime and not (drafter.cheap and self._step - state.asked_at >= LOOKUP_RETIME):
                continue
            state.asked_at = self._step
            t = self.clock()
            proposal = drafter.propose(history, limit)
            ms = (self.clock() - t) * 1e3
            total += ms
            if retime and ms <= self.lookup_share * self.costs.plain_ms():
                # Timed again and fast: what kept it out (a cold start, a long pause) is past, and
                # its old times would take hundreds of steps to outweigh.
                self.costs.restart_draft(drafter.name)
            if state.lookups:  # the first lookup of a sequence indexes the whole prompt: not a step's cost
                # A lookup takes tens of microseconds, so one caught by a garbage collection or a
                # preemption (milliseconds) would lift its estimate past lookup_share for dozens of
                # steps, and a lookup not asked is not timed again: the copy it would have drafted
                # goes undrafted. Its time still counts in the step; its estimate moves by at most
                # LOOKUP_SURPRISE x per lookup, so a lookup that really turned slow is still caught.
                expected = self.costs.draft_ms(drafter.name, limit)
                self.costs.observe_draft(drafter.name, limit, min(ms, LOOKUP_SURPRISE * expected))
            state.lookups += 1
            self._asked[drafter.name] = proposal
        return total

    def plan(self, history: Sequence[int], *, room: int, remaining: int) -> Decision:
        """The decision for the next step.

        ``history``: the tokens so far (the last one not yet decoded by the
        target); ``room``: draft tokens that fit in the context; ``remaining``:
        tokens still to generate (a draft can emit at most that many).
        """
        self._plan_started = self.clock()
        # Every cost of this step is priced at the cells its decode attends to (all but the last token).
        self.costs.depth = max(0, len(history) - 1)
        t0 = self.costs.plain_ms()
        limit, why = self._limit(room, remaining)
        self._asked = {}
        if limit <= 0 or not self._members:
            return self._decide(Decision(None, 0, 1.0, t0, 1.0, f"plain: {why or 'no drafter'}"), t0, forced=True)
        if self._advance_due:
            self._advance_due = False
            self._advance = self.probe_share * t0 * min(remaining, PROBE_ADVANCE_TOKENS)
        if self._step < self._off_until:
            prefix, probe_at = self._off_reason
            return self._decide(Decision(None, 0, 1.0, t0, 1.0,
                                         f"{prefix}; probing again in {probe_at - self._step} steps"), t0)
        held = self._held_decision(history, limit)
        if held is not None:
            return self._decide(held, t0)
        lookup_ms = self._look_up(history, limit)

        options: list[_Option] = []
        horizon = float(max(1, min(remaining, self.catch_up_horizon)))
        waiting = ""  # a drafter left out of the first step, and why
        for name, drafter in self._members.items():
            if name in self._asked:
                options += self._asked_options(drafter, self._asked[name], limit)
                continue
            behind = drafter.behind(history)
            if self._first_token_waits(behind):
                waiting = f"{name} is {behind} tokens behind"
                continue
            options += self._options(drafter, limit, behind, horizon)
        best = max(options, key=lambda o: o.tokens / o.ranked_ms(horizon), default=None)
        if best is None and waiting:
            return self._decide(Decision(None, 0, 1.0, t0, 1.0, f"plain: the first token waits for no catch-up "
                                         f"({waiting})", proposal_ms=lookup_ms), t0)

        choice: Decision | None = None
        if best is not None:
            speedup = best.tokens / best.ranked_ms(horizon) * t0
            what = f"{best.drafter.name} k={best.draft_len}" + (f" as {best.shape}" if best.shape else "")
            costs = f"expected {best.tokens:.1f} tok/step at {best.ms:.0f} ms"
            if best.behind > 2:
                costs += f" (catching up {best.behind} tokens)"
            if self.draft_len is not None:
                choice = self._chosen(best, speedup, lookup_ms,
                                      f"{what}: draft length fixed at {self.draft_len}; {costs} → {speedup:.2f}× plain")
            elif speedup >= 1.0 + self.margin:
                choice = self._chosen(best, speedup, lookup_ms, f"{what}: {costs} → {speedup:.2f}× plain")

        # A stale drafter is probed whatever the choice (it may now beat the chosen one too).
        probe = self._probe(history, limit, choice.chosen if choice is not None else None, lookup_ms, t0)
        if probe is not None:
            return self._decide(probe, t0)
        if choice is not None:
            self._hold(choice, limit, len(history))
            return self._decide(choice, t0)
        if best is None:
            return self._decide(Decision(None, 0, 1.0, t0, 1.0, "plain: no drafter has a proposal",
                                         proposal_ms=lookup_ms), t0)
        nxt = self._next_probe_in(history, limit, t0)
        again = f"probing again in {nxt} steps" if nxt is not None else "drafters re-scored every step"
        speedup = best.tokens / best.ranked_ms(horizon) * t0
        catch_up = f", catching up {best.behind} tokens" if best.behind > 2 else ""
        prefix = (f"speculation off: best expected {speedup:.2f}× plain ({best.drafter.name} k={best.draft_len}"
                  f"{catch_up})")
        if nxt is not None and not self._asked and speedup < 1.0:
            # Nothing moves fast enough to change this within a few steps: skip the full plan until then.
            self._off_until = self._step + min(self.replan_every, nxt)
            self._off_reason = (prefix, self._step + nxt)
        return self._decide(Decision(None, 0, 1.0, t0, 1.0, f"{prefix}; {again}", proposal_ms=lookup_ms), t0)

    def _hold(self, choice: Decision, limit: int, length: int) -> None:
        """Keep ``choice`` for the next steps (``_held_decision``) when nothing changes it faster than the
        estimates drift: it drafts with a drafter asked only once chosen, no lookup was asked for this
        plan (a lookup's proposal is new every step), and no other drafter's probe falls due sooner.

        Why: a full plan prices every length and tree a drafter could draft (72 trees and 31 chains
        for a draft model), more Python than a plain step's own on a fast device, and its inputs (the
        drafters' acceptance estimates, the costs) move by a few percent a step. A held plan is redone
        after ``hold_steps`` steps, and at once when the most a step may draft changed (the tokens
        left, the room), the drafter has fallen far behind (its catch-up was not priced) or the
        history is not the one the held steps grew (another text: its depth was not priced)."""
        self._held = None
        if self._asked or choice.chosen is None or choice.proposal is not None or self.hold_steps <= 1:
            return
        steps = self.hold_steps
        for name, state in self._states.items():
            if name in self._members and self._members[name] is not choice.chosen:
                steps = min(steps, max(0, state.wait - (self._step - state.last_seen)))
        if steps > 1:
            self._held = (choice, self._step + steps, limit, length)

    def _held_decision(self, history: Sequence[int], limit: int) -> Decision | None:
        """The held plan's decision for this step (see ``_hold``), or None: plan in full."""
        if self._held is None:
            return None
        decision, until, planned_at, length = self._held
        behind = decision.chosen.behind(history) if decision.chosen is not None else 0
        grown = len(history) - length  # at most what the held steps emit, unless the text moved on without us
        if (self._step >= until or limit != planned_at or behind > HELD_BEHIND_MAX
                or not 0 <= grown <= self.hold_steps * (1 + decision.draft_len)):
            self._held = None
            return None
        return Decision(decision.chosen, decision.draft_len, decision.expected_tokens, decision.expected_ms,
                        decision.speedup, decision.reason, behind=behind, tree_nodes=decision.tree_nodes)

    def _first_token_waits(self, behind: int) -> bool:
        """Whether a drafter ``behind`` tokens behind is left out of this step: a reply's first token never
        waits for a draft model's prefill or catch-up, whatever it would gain later (unless the user fixed
        the draft length); the drafter may catch up from the next step on, by the same cost rule."""
        return self._first and self.draft_len is None and behind > 2

    def _chosen(self, option: _Option, speedup: float, lookup_ms: float, reason: str) -> Decision:
        return Decision(option.drafter, option.draft_len, option.tokens, option.ms, speedup, reason,
                        proposal=option.proposal, proposal_ms=lookup_ms, behind=option.behind,
                        tree_nodes=option.tree_nodes)

    def _probe(self, history: Sequence[int], limit: int, chosen: Drafter | None, lookup_ms: float,
               t0: float) -> Decision | None:
        """A probe of the longest-unobserved drafter not asked beforehand (nor ``chosen``) that is due
        and whose worst-case excess over plain, its catch-up included, the budget covers."""
        bursting = [name for name, d in self._members.items()
                    if self._states[name].burst > 0 and name not in self._asked and d is not chosen]
        for name in bursting:  # a burst goes on while its drafter is in step and the budget covers it
            decision = self._burst_step(history, limit, name, lookup_ms, t0)
            if decision is not None:
                return decision
        due = [(self._step - self._states[name].last_seen, name) for name, d in self._members.items()
               if name not in self._asked and d is not chosen
               and self._step - self._states[name].last_seen >= self._states[name].wait]
        for unseen, name in sorted(due, reverse=True):
            drafter = self._members[name]
            # A fixed draft length holds for probes too; otherwise a short draft keeps them cheap.
            k = limit if self.draft_len is not None else min(self.probe_len, limit)
            behind = drafter.behind(history)
            if self._first_token_waits(behind):
                continue
            tokens, ms = self.evaluate(name, k, behind=behind)
            if self.stats.probe_budget_ms < ms - t0 <= self.stats.probe_budget_ms + self._advance \
                    and self._pays_in_step(name, limit, t0):
                self.stats.probe_budget_ms += self._advance  # drawn: the steps to come repay it first
                self._owed, self._advance = self._owed + self._advance, 0.0
            if self.stats.probe_budget_ms >= ms - t0:  # worst case: the probe emits one token
                catch_up = f", catching up {behind} tokens" if behind > 2 else ""
                return Decision(drafter, k, tokens, ms, tokens / ms * t0,
                                f"probe {name} k={k}: unobserved for {unseen} steps{catch_up}, "
                                f"expected {tokens / ms * t0:.2f}× plain", probe=True, proposal_ms=lookup_ms,
                                behind=behind)
        return None

    def _pays_in_step(self, name: str, limit: int, t0: float) -> bool:
        """Whether ``name`` would draft by its estimates once in step (no catch-up): only then may a
        probe draw on the reply's advance, the catch-up being all that stands between it and drafting."""
        return any(tokens / ms * t0 >= 1.0
                   for tokens, ms in (self.evaluate(name, k) for k in range(1, min(limit, TREE_DEPTH_MAX) + 1)))

    def _burst_step(self, history: Sequence[int], limit: int, name: str, lookup_ms: float,
                    t0: float) -> Decision | None:
        """The next step of ``name``'s probe burst, or None (the burst judged as it stands) when its
        drafter fell behind or the budget no longer covers the step's worst case."""
        drafter, state = self._members[name], self._states[name]
        k = limit if self.draft_len is not None else min(self.probe_len, limit)
        behind = drafter.behind(history)
        tokens, ms = self.evaluate(name, k, behind=behind)
        if behind > 2 or self.stats.probe_budget_ms < ms - t0:
            state.burst = 0
            self._judge_probe(name)
            return None
        return Decision(drafter, k, tokens, ms, tokens / ms * t0,
                        f"probe {name} k={k}: burst, {state.burst} steps to go, "
                        f"expected {tokens / ms * t0:.2f}× plain", probe=True, proposal_ms=lookup_ms,
                        behind=behind)

    def _judge_probe(self, name: str) -> None:
        """A probe's (or a burst's) verdict. Success: it kept more than the estimates expected (a
        drafter gone good beats a stale low estimate; a useless one never does), and acceptance as good
        as its could pay at all. A drafter that is often right but too costly to win (a draft model as
        slow as the target) fails like a useless one, so its probes thin out."""
        state = self._states[name]
        if not state.burst_reached:
            return
        steps = state.burst_steps
        rate = state.burst_kept / state.burst_reached  # conditional acceptance per position reached
        if state.burst_kept > state.burst_expected - steps and self._could_win(name, rate, state.burst_len):
            self.stats.probe_successes += 1
            state.wait = self.min_wait
        else:
            state.wait = min(2 * state.wait, self.max_wait)
        state.burst_kept, state.burst_expected, state.burst_reached, state.burst_steps = 0, 0.0, 0, 0

    def _next_probe_in(self, history: Sequence[int], limit: int, t0: float) -> int | None:
        """Steps until the next probe could start (by wait and budget), for the reason text."""
        best: int | None = None
        for name, drafter in self._members.items():
            if name in self._asked:
                continue  # scored every step: needs no probe
            s = self._states[name]
            by_wait = max(0, s.wait - (self._step - s.last_seen))
            _, ms = self.evaluate(name, min(self.probe_len, limit), behind=drafter.behind(history))
            deficit = ms - t0 - self.stats.probe_budget_ms
            by_budget = math.ceil(deficit / (self.probe_share * t0)) if deficit > 0 and self.probe_share > 0 else 0
            n = max(by_wait, by_budget)
            best = n if best is None else min(best, n)
        return best

    def _decide(self, decision: Decision, t0: float, *, forced: bool = False) -> Decision:
        planning_ms = (self.clock() - self._plan_started) * 1e3 - decision.proposal_ms + self._observe_ms
        self._observe_ms = 0.0
        decision = decision.with_planning(max(0.0, planning_ms))
        self._pending = (decision, t0)
        if not forced or not self.stats.last_reason:
            self.stats.last_reason = decision.reason
        return decision

    # --- learning -----------------------------------------------------------
    def observe(self, step: StepEvent, history: Sequence[int]) -> None:
        """Learn from the step just taken (after the ``plan`` that decided it); ``history`` ends with
        its tokens. Every drafter the step did not use is told the outcome (``accepted(history, 0)``).
        Its own time is charged to the next decision's ``planning_ms``."""
        started = self.clock()
        self._observe(step, history)
        self._observe_ms = (self.clock() - started) * 1e3

    def _observe(self, step: StepEvent, history: Sequence[int]) -> None:
        decision, t0 = self._pending or (Decision(None, 0, 1.0, self.costs.plain_ms(), 1.0, ""),
                                         self.costs.plain_ms())
        self._pending = None
        self._step += 1
        self._first = False
        self._learn_costs(step, decision)
        calibrated = self._learn_drafter(step, decision)
        for other, other_state in self._states.items():
            if other != calibrated:
                other_state.age_calibration()
        self._learn_unused(history, decision.name, start=len(history) - step.emitted)
        self._count(step, decision, t0)

    def _learn_costs(self, step: StepEvent, decision: Decision) -> None:
        """The verification batch's time and the step's Python work teach the cost model."""
        if step.verify_ms > 0:
            self.costs.observe_verify(step.batch_tokens, step.verify_ms)
        self.costs.observe_overhead(max(decision.draft_len, decision.tree_nodes), step.python_ms)

    def _learn_drafter(self, step: StepEvent, decision: Decision) -> str | None:
        """The drafter the step used: its cost when asked for k, and its acceptance over the k planned
        positions (a proposal shorter than planned counts its missing positions as rejected, so expected
        tokens match what such steps really emit). Returns its name when its evidence calibration
        learned (the others' calibrations age)."""
        name = decision.name
        self._last_used = name
        if name is None or name not in self._states:
            return None
        state = self._states[name]
        grown = decision.tree_nodes > decision.draft_len  # a tree the drafter grew (asked by propose_tree)
        if name not in self._asked and decision.behind <= 8:
            own_ms = max(0.0, step.draft_ms - decision.proposal_ms - self.costs.catch_up_ms(name, decision.behind))
            if grown:
                self.costs.observe_tree_draft(name, decision.draft_len, decision.tree_nodes, own_ms)
            else:
                self.costs.observe_draft(name, decision.draft_len, own_ms)
        idle = max(0, self._step - state.last_seen - 1)
        if grown and step.walk:
            # The chain within the tree (each first child) teaches the chain's rates; the further
            # children where a first one was rejected teach the siblings' (see learn_walk).
            drafted, kept = state.learn_walk(step.walk)
            state.acceptance.update(drafted, kept, idle_steps=idle)
        else:
            state.acceptance.update(decision.draft_len, step.accepted, idle_steps=idle)
        calibrated = None
        evidence = decision.proposal.evidence if decision.proposal is not None else None
        if evidence is not None:
            estimate = state.evidence_acceptance(evidence)
            state.calibrate(step.accepted, decision.expected_tokens - 1.0, state.calibrated(estimate))
            chain = decision.proposal.tokens if isinstance(decision.proposal, Proposal) else ()
            state.learn_evidence(evidence, self._line_starts(chain, decision.draft_len, evidence),
                                 decision.draft_len, step.accepted)
            calibrated = name
        if name not in self._asked and not grown:
            extra = self._members[name].batch_extra_tokens if name in self._members else 0
            candidates = max(0.0, step.batch_tokens - 1 - extra)
            state.width += 0.1 * (candidates / decision.draft_len - state.width)
        state.last_seen = self._step
        return calibrated

    def _learn_unused(self, history: Sequence[int], used: str | None, *, start: int) -> None:
        """The drafters the step did not use follow the text (``accepted(history, 0)``); the lookups made
        while planning wait to be scored against the text that follows (``observe_unused``)."""
        for other, drafter in self._members.items():
            if other == used:
                continue
            if other in self._asked:
                drafter.verified(0)
                asked = self._asked[other]
                self._unused.add(start, other, proposal_branches(asked), asked.evidence)
            drafter.accepted(history, 0)
        self._asked = {}
        for other, branches, followed, evidence, known in self._unused.ready(history):
            self.observe_unused(other, branches, followed, deferred=True, evidence=evidence, known=known)

    def _count(self, step: StepEvent, decision: Decision, t0: float) -> None:
        """The counters, the probe budget (earned by every step but a probe, which spends it) and a
        probe's outcome."""
        stats, name, n_tokens = self.stats, decision.name, step.emitted
        stats.steps += 1
        row = stats.choices.setdefault(name or "plain", {})
        row[decision.draft_len] = row.get(decision.draft_len, 0) + 1
        if decision.probe and name is not None:
            stats.probes += 1
            stats.probe_budget_ms -= step.step_ms - t0 * n_tokens
            state = self._states[name]
            state.burst_kept += step.accepted
            state.burst_expected += decision.expected_tokens - 1.0
            state.burst_reached += min(decision.draft_len, step.accepted + 1)
            state.burst_steps += 1
            state.burst_len = decision.draft_len
            if state.burst > 0:
                state.burst -= 1
            elif decision.behind > 2 and self.draft_len is None:
                state.burst = PROBE_BURST - 1  # it paid a catch-up: go on while the draft is in step
            if state.burst == 0:
                self._judge_probe(name)
            return
        earned = self.probe_share * t0 * n_tokens
        repaid = min(self._owed, earned)
        self._owed -= repaid
        stats.probe_budget_ms += earned - repaid
        if name is None:
            stats.plain_steps += 1
        else:
            stats.draft_steps += 1
            stats.expected_tokens += decision.expected_tokens
            stats.expected_ms += decision.expected_ms
            stats.expected_plain_ms += decision.expected_tokens * t0
            stats.measured_tokens += n_tokens
            stats.measured_ms += step.step_ms
            stats.measured_plain_ms += n_tokens * t0

    def _could_win(self, name: str, alpha: float, draft_len: int) -> bool:
        """Whether a draft of at most ``draft_len`` tokens by ``name``, accepted at ``alpha`` per position,
        would beat plain at the estimated costs, once caught up (judging a probe at its own length at most:
        a 3-token probe that was fully accepted says little about 15-token drafts; one that kept few may
        still pay at 1). Not by the margin: this decides how soon it is probed again, not whether it drafts."""
        t0 = self.costs.plain_ms()
        return any(expected_tokens_per_step(alpha, k) / self.step_ms(name, k) * t0 >= 1.0
                   for k in range(1, draft_len + 1))

    def observe_unused(self, name: str, branches: Sequence[Sequence[int]], emitted: Sequence[int], *,
                       deferred: bool = False, evidence: Evidence | None = None, known: int = 0) -> None:
        """Score a deterministic drafter's proposal that was not verified.

        ``branches``: its candidate continuations (one for a chain);
        ``emitted``: the tokens that followed. Emitted tokens are exact target
        outputs (greedy picks or samples of the target's distribution, whoever
        drafted them), so a deterministic draft matching them is exactly as
        likely as its being accepted; past the end of ``emitted`` the outcome
        is unknown and not counted. Not for sampled drafts (a draft model),
        whose acceptance is min(1, p/q), and not for the drafter the last step
        used (``observe`` counted it) unless ``deferred``: ``emitted`` is what
        followed a proposal of some steps ago. ``evidence``: what the proposal
        rested on; its class learns the outcome too. ``known``: positions of
        this proposal scored before (see UnusedProposals); only the rest count.
        """
        state = self._states.get(name)
        depth = max((len(b) for b in branches), default=0)
        if state is None or depth == 0 or (name == self._last_used and not deferred):
            return
        matched = max(common_prefix(b, emitted) for b in branches)
        idle = max(0, self._step - state.last_seen - 1)
        reached = matched if matched >= len(emitted) else depth  # past the text's end: unknown
        state.acceptance.update(reached, matched, idle_steps=idle, known=known)
        if evidence is not None:
            chain = branches[0] if len(branches) == 1 else ()
            state.learn_evidence(evidence, self._line_starts(chain, reached, evidence), reached, matched, known=known)
        state.last_seen = self._step
