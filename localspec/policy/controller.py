"""The controller: the one owner of every drafting decision.

Each step it decides which drafter drafts, how many tokens (``draft_len``)
and, for a lookup that found several continuations, how wide a tree — or
that the step decodes plainly. It sees the drafters themselves (what each
declares in ``localspec.drafting.base.Drafter``), one decaying acceptance
estimate per drafter, and a ``CostModel`` (``localspec.policy.costs``) for every
cost a choice causes. Pure logic: no llama.cpp.

How it chooses
--------------
Each option is priced by ``localspec.policy.pricing`` (the decision rule: E(k)
tokens a step emits over T(k), the step's time, with a catch-up spread over
the tokens it serves). The best option is taken when it beats plain by
``margin`` (5%); otherwise the step decodes plainly. A fixed draft length (the user's) forces k; the controller
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
deep as a step may draft with their ``Evidence``, per class of that evidence,
tempered by a calibration while the classes learn, with line starts judged
apart) lives in ``localspec.policy.estimates``, with the reasons for each choice.

A lookup's time is spent whatever is decided, so it is not part of T; it is
counted in the step's ``draft_ms``. The controller's own time (pricing the
options, learning from the step before) is handed to the step as
``Decision.planning_ms`` and counted in its ``python_ms``, so overhead_ms
learns it, for plain and drafting steps alike.

Drafters not asked beforehand and not used are probed, from a budget that bounds
what probing costs (``localspec.policy.probing``); a step's outcome teaches the
costs and the drafter's estimates (``localspec.policy.learning``), and is counted
in ``ControllerStats`` (``localspec.policy.decision``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from localspec.drafting.base import Drafter, Evidence, Proposal, TreeProposal
from localspec.events import StepEvent
from localspec.policy import pricing
from localspec.policy.costs import CostModel
from localspec.policy.decision import ControllerStats, Decision
from localspec.policy.estimates import DecayingAcceptance, UnusedProposals, proposal_branches
from localspec.policy.learning import DrafterState, learn_costs, learn_drafter, score_unused
from localspec.policy.pricing import Option
from localspec.policy.probing import Candidate, Probing
from localspec.validation import is_int, out_of_range

# The most tokens the controller drafts per step when the length is not fixed: a batch of 32 with the
# last token, the largest the verify costs are measured for (``localspec.policy.measure.DEFAULT_KS``).
DRAFT_LEN_CAP = 31
# The longest fixed draft length accepted (a batch of 65 tokens).
DRAFT_LEN_MAX = 64
# A held plan (see Controller._hold) is planned afresh once its drafter is this many tokens behind: the held
# decision priced a catch-up of a step's tokens, not a longer one.
HELD_BEHIND_MAX = 8
# A lookup's time teaches its cost estimate at most this many times the estimate (see Controller._look_up).
LOOKUP_SURPRISE = 2.0
# A lookup whose estimate is past ``lookup_share`` is still asked (and timed) every this many steps at
# least, more where such a step (the lookup and the plan it takes) spread over them would cost more than
# ``lookup_share`` of a plain step, at most every LOOKUP_RETIME_MAX (see Controller._retime_every).
LOOKUP_RETIME = 8
LOOKUP_RETIME_MAX = 32
# A lookup timed again that found nothing waits twice as long for its next timing, up to this many steps;
# a proposal, or its time back within ``lookup_share``, bring it back to its pace (see
# Controller._retime_gap). On a fast decode (a tiny model) timing a lookup that keeps finding nothing was
# a few microseconds a step; the price is a copy noticed up to this many tokens late after a long stretch
# without one, and only by a lookup too slow to be asked every step.
LOOKUP_RETIME_BACKOFF_MAX = 128
_RETIME_BACKOFF_SHIFT_MAX = (LOOKUP_RETIME_BACKOFF_MAX // LOOKUP_RETIME).bit_length()  # (enough doublings to reach it)
# Steps taken without planning (a paused plan, see Controller._pause, or a held one, _hold) teach the costs
# one in this many (what each drafter keeps, every step): learning a step's costs took as long as the rest
# of such a step's bookkeeping (20-30 us after a decode has evicted the caches), and the costs drift by a
# few percent over dozens of steps (the scale still follows a change within ~30 steps).
UNPLANNED_LEARN_EVERY = 4


def check_draft_len(draft_len: object) -> None:
    """The one check of a fixed draft length (None: the controller chooses each step), for the options
    and the controller alike: an integer in 0..``DRAFT_LEN_MAX``, else ``InvalidOptionError``."""
    if draft_len is not None and (not is_int(draft_len) or not 0 <= draft_len <= DRAFT_LEN_MAX):
        raise out_of_range("draft_len", draft_len, f"an integer in 0..{DRAFT_LEN_MAX}",
                           "or None to let the controller choose each step")


def _steps(n: int) -> str:
    return "step" if n == 1 else "steps"


def _in_steps(n: int) -> str:
    return f"in {n} {_steps(n)}"


@dataclass
class _PauseLedger:
    """What the paused steps not yet settled add (``Controller._settle_pause``): their number, the tokens
    they emitted, the steps the costs learn from (each with the KV depth it decoded at), and the history
    the lookups made before the pause are scored against."""

    steps: int = 0
    tokens: int = 0
    sampled: list[tuple[StepEvent, int]] = field(default_factory=list)
    history: Sequence[int] | None = None


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
        self.min_wait = min_wait
        self.prior = prior
        self.lookup_share = lookup_share
        self.catch_up_horizon = catch_up_horizon
        self.clock = clock
        self._stats = ControllerStats()
        self.probing = Probing(self._stats, evaluate=lambda name, k, behind: self.evaluate(name, k, behind=behind),
                               step_ms=lambda name, k: self.step_ms(name, k),
                               plain_ms=lambda: self.costs.plain_ms(), share=probe_share, probe_len=probe_len,
                               min_wait=min_wait, max_wait=max_wait)
        self._states: dict[str, DrafterState] = {}
        self._members: dict[str, Drafter] = {}
        self._followers: list[Drafter] = []
        self.draft_len: int | None = None
        self.draft_len_limit: int | None = None
        self.tree_nodes_limit = 0
        self._step = 0
        self._pending: tuple[Decision, float] | None = None  # the planned decision and T0 then
        self._unplanned = False  # the pending decision was taken without planning (a paused or held plan)
        # What the paused steps not yet settled add (see _settle_pause), and whether the pending step is one.
        self._ledger = _PauseLedger()
        self._pending_paused = False
        self.observed_plain_ms = costs.plain_ms()
        """A plain step's estimated ms when the step last observed was planned (what its speedup is told against)."""
        self._asked: dict[str, Proposal | TreeProposal] = {}  # lookups made while planning the pending step
        self._retimed: set[str] = set()  # of those, the ones asked only to be timed again (past lookup_share)
        self._unused = UnusedProposals()
        self._last_used: str | None = None  # the drafter the last observed step verified
        self._plan_started = 0.0  # clock() when the pending plan began
        self._observe_ms = 0.0  # the last observe's time, charged to the next decision's planning_ms
        # While speculation is off and no lookup that pays its time is asked, the full plan is redone only
        # every few steps (nothing it depends on moves faster): until step _off_until, plain with this reason.
        self._off_until = 0
        # (the reason up to its count, what comes next, the step it comes at): "...; probing again in 5 steps"
        self._off_reason: tuple[str, str, int] = ("", "", 0)
        self._off_t0 = 0.0  # the plain step's estimated ms when the pause began
        self._off_live = False  # the last reason is the pause's, its count read as the stats are
        self._paused = Decision(None, 0, 1.0, 0.0, 1.0, "")  # every paused step's decision (see _pause)
        self._retime_ms = 0.0  # what a step that asks a lookup only to time it costs the controller (its mean)
        # Likewise while drafting with a drafter asked only once chosen (a draft model, a head): its full
        # plan's decision is held until step _held[1] (see _hold).
        # (decision, last step, the most it could draft and the history's length it was planned at)
        self._held: tuple[Decision, int, int, int] | None = None
        self.start(drafters, draft_len=draft_len, draft_len_limit=draft_len_limit, tree_nodes_limit=tree_nodes_limit)

    def start(self, drafters: Sequence[Drafter], *, draft_len: int | None = None,
              draft_len_limit: int | None = None, tree_nodes_limit: int = 0) -> None:
        """Begin a generation with ``drafters`` (reset for a new sequence). What was learned stays.

        ``tree_nodes_limit``: the most nodes a tree grown by a drafter (``Drafter.tree_width``) may have,
        as the target can verify it (its sequences); 0: such drafters draft chains."""
        check_draft_len(draft_len)
        self._settle_pause()
        names = [d.name for d in drafters]
        if len(set(names)) != len(names):
            raise ValueError(f"drafter names must differ: {names}")
        self._members = {d.name: d for d in drafters}
        # The drafters a paused step tells of itself (``Drafter.follows_each_step``; the rest catch up later).
        self._followers = [d for d in drafters if getattr(d, "follows_each_step", True)]
        for name in self._members:
            state = self._states.get(name)
            if state is None:
                state = self._states[name] = DrafterState(DecayingAcceptance(prior=self.prior))
                state.probe.wait = self.min_wait
            state.lookups = 0
            # Another text, whose prompt may hold a copy: its lookups are asked (and timed) at its first step.
            state.retime_at, state.retime_backoff = self._step, 0
        self.draft_len = draft_len
        self.draft_len_limit = draft_len_limit
        self.tree_nodes_limit = tree_nodes_limit
        self._off_until = 0
        self._off_live = False
        self._held = None
        self.probing.start()
        self._pending, self._pending_paused = None, False
        self._observe_ms = 0.0  # the last generation's last observe is not this one's first step's
        self._asked = {}
        self._retimed = set()
        self._unused.clear()
        self._first = True  # the generation's first step is still to come (see plan)

    @property
    def stats(self) -> ControllerStats:
        """The counters behind the decisions, a pause's steps included (``_settle_pause``), and the last
        reason as it reads now ("...; asking again in 5 steps")."""
        self._settle_pause()
        if self._off_live:
            prefix, then, at = self._off_reason
            self._stats.last_reason = f"{prefix}; {then} {_in_steps(max(1, at - self._step))}"
        return self._stats

    @property
    def drafters(self) -> list[Drafter]:
        return list(self._members.values())

    def acceptance(self, name: str) -> DecayingAcceptance:
        return self._states[name].acceptance

    # --- the objective (localspec.policy.pricing) ---------------------------------
    def expected_tokens(self, name: str, draft_len: int, confidence: Sequence[float] = (),
                        evidence: Evidence | None = None) -> float:
        """E(k): the estimate's rates (for proposals resting on ``evidence``, when given), never above
        the proposal's own ``confidence`` where it has one."""
        return self._expected_by_length(name, draft_len, confidence, evidence)[draft_len]

    def _expected_by_length(self, name: str, draft_len: int, confidence: Sequence[float] = (),
                            evidence: Evidence | None = None, tokens: Sequence[int] = ()) -> list[float]:
        """E(k) for k = 0..draft_len (``pricing.expected_by_length`` over ``name``'s estimates)."""
        return pricing.expected_by_length(self._states[name], draft_len, confidence, evidence, tokens,
                                          ends_line=self.ends_line)

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
        return pricing.step_ms(self.costs, name, draft_len, verify_ms, drafting=drafting, catch_up_ms=catch_up_ms)

    def evaluate(self, name: str, draft_len: int, *, behind: int = 0) -> tuple[float, float]:
        """(expected tokens, expected ms) of one step where ``name`` drafts ``draft_len`` tokens when asked,
        after catching up ``behind`` tokens."""
        if draft_len <= 0:
            return 1.0, self.costs.plain_ms()
        return (self.expected_tokens(name, draft_len),
                self.step_ms(name, draft_len, catch_up_ms=self.costs.catch_up_ms(name, behind)))

    def _asked_options(self, drafter: Drafter, proposal: Proposal | TreeProposal, max_draft_len: int) -> list[Option]:
        """The best option from the proposal ``drafter`` made while planning (``pricing.asked_options``)."""
        return pricing.asked_options(self.costs, self._states[drafter.name], drafter, proposal, max_draft_len,
                                     fixed=self.draft_len, ends_line=self.ends_line)

    def _options(self, drafter: Drafter, max_draft_len: int, behind: int, horizon: float) -> list[Option]:
        """The options of a drafter asked only once chosen, ``behind`` tokens behind (``pricing.options``)."""
        state = self._states[drafter.name]
        return pricing.options(self.costs, state, drafter, max_draft_len, width=state.width, behind=behind,
                               horizon=horizon, fixed=self.draft_len, tree_nodes_limit=self.tree_nodes_limit)

    # --- planning -----------------------------------------------------------
    def _max_draft_len(self, room: int, remaining: int) -> tuple[int, str]:
        """The most tokens this step may draft, and when that is 0, why (in words)."""
        if self.draft_len == 0:
            return 0, "the draft length is fixed at 0"
        if self.draft_len_limit is not None and self.draft_len_limit <= 0:
            return 0, "the model cannot roll back a draft"
        if room <= 0:
            return 0, "the context has no room for a draft"
        if remaining <= 1:
            return 0, "one token left to generate"
        max_draft_len = min(room, remaining - 1, self.draft_len if self.draft_len is not None else self.draft_len_cap)
        if self.draft_len_limit is not None:
            max_draft_len = min(max_draft_len, self.draft_len_limit)
        return max_draft_len, ""

    def _lookup_pays(self, drafter: Drafter, max_draft_len: int, t0: float) -> bool:
        """Whether to ask ``drafter`` before planning: a lookup that stays within ``lookup_share`` of a plain step."""
        return (drafter.cheap
                and self.costs.draft_ms(drafter.name, max_draft_len) <= self.lookup_share * t0)

    def _look_up(self, history: Sequence[int], max_draft_len: int, t0: float) -> float:
        """Ask the cheap drafters (``t0``: a plain step's ms); returns the ms it took (spent whatever is decided)."""
        self._asked = {}
        self._retimed = set()
        total = 0.0
        for drafter in self._members.values():
            state = self._states[drafter.name]
            retime = not self._lookup_pays(drafter, max_draft_len, t0)
            if retime and not (drafter.cheap and self._step >= state.retime_at):
                continue
            if retime:
                self._retimed.add(drafter.name)
            t = self.clock()
            proposal = drafter.propose(history, max_draft_len)
            ms = (self.clock() - t) * 1e3
            # One asked every step is timed again LOOKUP_RETIME steps after its last lookup, should it stop
            # paying; one asked only to be timed, after _retime_gap (longer after each that found nothing;
            # what one finds is scored, and its evidence grows with each timing).
            if not retime or pricing.proposal_nodes(proposal):
                state.retime_backoff = 0
            else:
                state.retime_backoff = min(state.retime_backoff + 1, _RETIME_BACKOFF_SHIFT_MAX)
            state.retime_at = self._step + (self._retime_gap(state, t0) if retime else LOOKUP_RETIME)
            total += ms
            if retime and ms <= self.lookup_share * t0:
                # Timed again and fast: what kept it out (a cold start, a long pause) is past, and
                # its old times would take hundreds of steps to outweigh.
                self.costs.restart_draft(drafter.name)
            # The first lookup of a sequence may index the whole prompt (a new text; a chat's next turn
            # indexes only what is new): not a step's cost.
            if state.lookups:
                # A lookup takes tens of microseconds, so one caught by a garbage collection or a
                # preemption (milliseconds) would lift its estimate past lookup_share for dozens of
                # steps, and a lookup not asked is not timed again: the copy it would have drafted
                # goes undrafted. Its time still counts in the step; its estimate moves by at most
                # LOOKUP_SURPRISE x per lookup, so a lookup that really turned slow is still caught.
                expected = self.costs.draft_ms(drafter.name, max_draft_len)
                self.costs.observe_draft(drafter.name, max_draft_len, min(ms, LOOKUP_SURPRISE * expected))
            state.lookups += 1
            self._asked[drafter.name] = proposal
        return total

    def plan(self, history: Sequence[int], *, room: int, remaining: int) -> Decision:
        """The decision for the next step.

        ``history``: the tokens so far (the last one not yet decoded by the
        target); ``room``: draft tokens that fit in the context; ``remaining``:
        tokens still to generate (a draft can emit at most that many).
        """
        if self._step < self._off_until and room > 0 and remaining > 1:
            self._pending_paused = True
            return self._paused
        self._plan_started = self.clock()
        self._settle_pause()
        # Every cost of this step is priced at the cells its decode attends to (all but the last token).
        self.costs.kv_depth = max(0, len(history) - 1)
        t0 = self.costs.plain_ms()
        max_draft_len, why = self._max_draft_len(room, remaining)
        self._asked = {}
        if max_draft_len <= 0 or not self._members:
            return self._decide(Decision(None, 0, 1.0, t0, 1.0, f"plain: {why or 'no drafter'}"), t0, forced=True)
        self.probing.open(t0, remaining)
        held = self._held_decision(history, max_draft_len)
        if held is not None:
            return self._decide(held, t0, unplanned=True)
        lookup_ms = self._look_up(history, max_draft_len, t0)

        options: list[Option] = []
        horizon = float(max(1, min(remaining, self.catch_up_horizon)))
        waiting = ""  # a drafter left out of the first step, and why
        for name, drafter in self._members.items():
            if name in self._asked:
                options += self._asked_options(drafter, self._asked[name], max_draft_len)
                continue
            behind = drafter.behind(history)
            if self._first_token_waits(behind):
                waiting = f"{name} is {behind} tokens behind"
                continue
            options += self._options(drafter, max_draft_len, behind, horizon)
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
        chosen = choice.chosen if choice is not None else None
        probe = self.probing.choose(self._probe_candidates(chosen), history, max_draft_len, t0, lookup_ms,
                                    fixed=self.draft_len, first_token_waits=self._first_token_waits)
        if probe is not None:
            return self._decide(probe, t0)
        if choice is not None:
            self._hold(choice, max_draft_len, len(history))
            return self._decide(choice, t0)
        if best is None:  # every drafter was asked, and none found anything
            prefix = "plain: no drafter has a proposal"
            if self._asks_paying():
                return self._decide(Decision(None, 0, 1.0, t0, 1.0, prefix, proposal_ms=lookup_ms), t0)
            # Lookups asked only to be timed again found nothing: they are asked again in a few steps.
            return self._pause(prefix, None, t0, lookup_ms)
        nxt = self.probing.next_in(self._probe_candidates(None), history, max_draft_len, t0)
        speedup = best.tokens / best.ranked_ms(horizon) * t0
        catch_up = f", catching up {best.behind} tokens" if best.behind > 2 else ""
        prefix = (f"speculation off: best expected {speedup:.2f}× plain ({best.drafter.name} k={best.draft_len}"
                  f"{catch_up})")
        if speedup < 1.0 and not self._asks_paying() and (nxt is not None or self._asked):
            return self._pause(prefix, nxt, t0, lookup_ms)
        again = f"probing again {_in_steps(nxt)}" if nxt is not None else "drafters re-scored every step"
        return self._decide(Decision(None, 0, 1.0, t0, 1.0, f"{prefix}; {again}", proposal_ms=lookup_ms), t0)

    def _retime_every(self, t0: float) -> int:
        """Steps between the lookups of a drafter asked only to be timed again: ``LOOKUP_RETIME``, or more
        where a step that asks it (its lookup and its plan, ``_retime_ms``) would cost more than
        ``lookup_share`` of the plain steps it is spread over (a decode of a few hundred microseconds:
        a tiny model, or a small one on a GPU), up to ``LOOKUP_RETIME_MAX``."""
        spread = self._retime_ms / (self.lookup_share * t0)
        return max(LOOKUP_RETIME, min(LOOKUP_RETIME_MAX, math.ceil(spread)))

    def _retime_gap(self, state: DrafterState, t0: float) -> int:
        """Steps until a lookup asked only to be timed is asked again: ``_retime_every``, doubled for each
        timing in a row that found nothing (``retime_backoff``, this one's included), up to
        ``LOOKUP_RETIME_BACKOFF_MAX``."""
        return min(LOOKUP_RETIME_BACKOFF_MAX, self._retime_every(t0) << state.retime_backoff)

    def _asks_paying(self) -> bool:
        """Whether this plan asked a lookup that pays its time every step (one asked only to be timed again,
        ``LOOKUP_RETIME``, is asked next when it falls due, whatever the plan)."""
        return any(name not in self._retimed for name in self._asked)

    def _pause(self, prefix: str, nxt: int | None, t0: float, lookup_ms: float) -> Decision:
        """Plain for the next few steps without planning in full: nothing this plan rested on moves fast
        enough to change it sooner (the estimates drift by a few percent a step; no lookup that pays is
        asked). Planned again after ``replan_every`` steps, or sooner when a probe falls due (``nxt`` steps)."""
        self._off_t0 = t0
        # Planned again when a probe falls due, when a lookup asked only to be timed is due again (its next
        # timing is the plan's), and after replan_every steps while a drafter asked only once chosen is priced.
        window = nxt if nxt is not None else LOOKUP_RETIME_BACKOFF_MAX
        if any(not d.cheap for d in self._members.values()):
            window = min(window, self.replan_every)
        retimes = [self._states[name].retime_at - self._step for name, d in self._members.items() if d.cheap]
        if retimes:
            window = min(window, max(1, min(retimes)))
        self._off_until = self._step + window
        self._off_reason = ((prefix, "probing again", self._step + nxt) if nxt is not None else
                            (prefix, "asking again", self._step + window))
        then, at = self._off_reason[1:]
        # The steps of the pause (after this one) share one decision, plain at this T0 (the few cells the
        # context grows by meanwhile change it by far less than the costs' noise): on a fast decode, a
        # decision and its reason built every step were a visible share of the step (#39).
        self._paused = Decision(None, 0, 1.0, t0, 1.0, f"{prefix}; paused for {window - 1} {_steps(window - 1)}, "
                                                       f"then {then}")
        decision = self._decide(Decision(None, 0, 1.0, t0, 1.0, f"{prefix}; {then} {_in_steps(at - self._step)}",
                                         proposal_ms=lookup_ms), t0)
        self._off_live = True
        return decision

    def _probe_candidates(self, chosen: Drafter | None) -> list[Candidate]:
        """The drafters a probe may try: those not asked beforehand (they are scored every step) nor ``chosen``."""
        return [Candidate(d, self._step - self._states[name].last_seen, self._states[name].probe)
                for name, d in self._members.items() if name not in self._asked and d is not chosen]

    def _hold(self, choice: Decision, max_draft_len: int, length: int) -> None:
        """Keep ``choice`` for the next steps (``_held_decision``) when nothing changes it faster than the
        estimates drift: it drafts with a drafter asked only once chosen, no lookup that pays its time was asked
        for this plan (a lookup's proposal is new every step; one asked only to be timed again is asked
        when the hold ends), and no other drafter's probe falls due sooner.

        Why: a full plan prices every length and tree a drafter could draft (72 trees and 31 chains
        for a draft model), more Python than a plain step's own on a fast device, and its inputs (the
        drafters' acceptance estimates, the costs) move by a few percent a step. A held plan is redone
        after ``hold_steps`` steps, and at once when the most a step may draft changed (the tokens
        left, the room), the drafter has fallen far behind (its catch-up was not priced) or the
        history is not the one the held steps grew (another text: its KV depth was not priced)."""
        self._held = None
        if self._asks_paying() or choice.chosen is None or choice.proposal is not None or self.hold_steps <= 1:
            return
        steps = self.hold_steps
        for name, state in self._states.items():
            if name in self._members and self._members[name] is not choice.chosen:
                steps = min(steps, max(0, state.probe.wait - (self._step - state.last_seen)))
        if steps > 1:
            self._held = (choice, self._step + steps, max_draft_len, length)

    def _held_decision(self, history: Sequence[int], max_draft_len: int) -> Decision | None:
        """The held plan's decision for this step (see ``_hold``), or None: plan in full."""
        if self._held is None:
            return None
        decision, until, planned_at, length = self._held
        behind = decision.chosen.behind(history) if decision.chosen is not None else 0
        grown = len(history) - length  # at most what the held steps emit, unless the text moved on without us
        if (self._step >= until or max_draft_len != planned_at or behind > HELD_BEHIND_MAX
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

    def _chosen(self, option: Option, speedup: float, lookup_ms: float, reason: str) -> Decision:
        return Decision(option.drafter, option.draft_len, option.tokens, option.ms, speedup, reason,
                        proposal=option.proposal, proposal_ms=lookup_ms, behind=option.behind,
                        tree_nodes=option.tree_nodes)

    def _decide(self, decision: Decision, t0: float, *, forced: bool = False, unplanned: bool = False) -> Decision:
        planning_ms = (self.clock() - self._plan_started) * 1e3 - decision.proposal_ms + self._observe_ms
        self._observe_ms = 0.0
        decision = decision.with_planning(max(0.0, planning_ms))
        self._pending = (decision, t0)
        self._unplanned = unplanned
        if not forced or not self._stats.last_reason:
            self._stats.last_reason = decision.reason
            self._off_live = False
        return decision

    # --- learning (localspec.policy.learning) ---------------------------------
    def observe(self, step: StepEvent, history: Sequence[int]) -> None:
        """Learn from the step just taken (after the ``plan`` that decided it); ``history`` ends with
        its tokens. Every drafter the step did not use is told the outcome (``accepted(history, 0)``).
        Its own time is charged to the next decision's ``planning_ms`` (a paused step's is not timed)."""
        if self._pending_paused:
            self._observe_paused(step, history)
            return
        started = self.clock()
        self._observe(step, history)
        self._observe_ms = (self.clock() - started) * 1e3

    def _observe(self, step: StepEvent, history: Sequence[int]) -> None:
        self._settle_pause()
        decision, t0 = self._pending or (Decision(None, 0, 1.0, self.costs.plain_ms(), 1.0, ""),
                                         self.costs.plain_ms())
        self._pending = None
        self.observed_plain_ms = t0
        self._step += 1
        self._first = False
        unplanned, self._unplanned = self._unplanned, False
        learn = not unplanned or self._step % UNPLANNED_LEARN_EVERY == 0  # this step teaches the costs
        if learn:
            learn_costs(self.costs, step, decision)
        if self._retimed and self._asked:  # the plan asked a lookup only to time it: what that step cost
            cost = decision.planning_ms + decision.proposal_ms
            self._retime_ms = cost if not self._retime_ms else self._retime_ms + 0.1 * (cost - self._retime_ms)
        name = decision.name
        self._last_used = name
        calibrated = None
        used = self._states.get(name) if name is not None else None
        if name is not None and used is not None:
            member = self._members.get(name)
            if learn_drafter(self.costs, name, used, step, decision, step_no=self._step, asked=name in self._asked,
                             extra=member.batch_extra_tokens if member is not None else 0, ends_line=self.ends_line,
                             costs_too=learn):
                calibrated = name
        for other, other_state in self._states.items():
            if other != calibrated:
                other_state.age_calibration()
        self._learn_unused(history, name, start=len(history) - step.emitted)
        self._stats.count(step, decision, t0)
        self.probing.settle(step, decision, t0, used.probe if used is not None else None, self.draft_len)

    def _observe_paused(self, step: StepEvent, history: Sequence[int]) -> None:
        """``observe`` for a paused step: the drafters that follow each step are told of it; the rest waits in
        the ledger."""
        self._pending_paused = False
        self._step += 1
        ledger = self._ledger
        ledger.steps += 1
        ledger.tokens += step.emitted
        ledger.history = history
        if self._step % UNPLANNED_LEARN_EVERY == 0:  # the costs learn from one paused step in so many
            ledger.sampled.append((step, len(history) - step.emitted - 1))
        for drafter in self._followers:
            drafter.accepted(history, 0)

    def _settle_pause(self) -> None:
        """Put what the paused steps not yet settled add (``_PauseLedger``) where each step would have put
        it: the stats' counts, the probe budget each earned (plain steps at the pause's T0), the
        calibrations' ageing, the costs learned from the sampled steps (at the KV depth each decoded at),
        and the scoring of lookups made before the pause against the text that followed. Called at the
        next full plan or observe, at a generation's start, and whenever the stats are read."""
        ledger = self._ledger
        if not ledger.steps:
            return
        self._ledger = _PauseLedger()
        stats = self._stats
        stats.steps += ledger.steps
        stats.plain_steps += ledger.steps
        row = stats.choices.setdefault("plain", {})
        row[0] = row.get(0, 0) + ledger.steps
        self.probing.earn(self._off_t0 * ledger.tokens)
        for state in self._states.values():
            state.age_calibration(ledger.steps)
        for step, kv_depth in ledger.sampled:
            self.costs.kv_depth = kv_depth
            learn_costs(self.costs, step, self._paused)
        if self._unused and ledger.history is not None:
            for other, branches, followed, evidence, known in self._unused.ready(ledger.history):
                self.observe_unused(other, branches, followed, deferred=True, evidence=evidence, known=known)

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
        if self._asked:
            self._asked = {}
        if self._unused:
            for other, branches, followed, evidence, known in self._unused.ready(history):
                self.observe_unused(other, branches, followed, deferred=True, evidence=evidence, known=known)

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
        if state is None or (name == self._last_used and not deferred):
            return
        score_unused(state, branches, emitted, step_no=self._step, evidence=evidence, known=known,
                     ends_line=self.ends_line)
