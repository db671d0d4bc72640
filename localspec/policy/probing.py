"""Probing: trying a drafter that is not used, paid from a budget so that it costs at most ~2.5% speed.

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
plain at any draft length up to the probe's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

from localspec.drafting.base import Drafter
from localspec.events import StepEvent
from localspec.policy.decision import ControllerStats, Decision
from localspec.policy.estimates import expected_tokens_per_step
from localspec.policy.pricing import TREE_DEPTH_MAX

# A probe that paid a draft model's catch-up goes on for this many steps while the draft is in step
# (each costs only its drafting and its wider verification): one short probe is a coin toss at
# alpha 0.7, and a drafter judged on it falls behind again and is not probed for a long time.
PROBE_BURST = 8
# Each reply is advanced the probe budget of its first tokens (at most this many of those it may
# emit; repaid by what its steps earn before they add to it), so a draft model can be probed while
# its catch-up is the prompt alone, not hundreds of tokens later when it would cost more than the
# budget could ever cover.
PROBE_ADVANCE_TOKENS = 512

# (name, draft_len, behind) -> (expected tokens, expected ms) of one step drafting with that drafter
Evaluate = Callable[[str, int, int], tuple[float, float]]
# (name, draft_len) -> expected ms of one step drafting with that drafter, once caught up
StepMs = Callable[[str, int], float]


@dataclass
class ProbeState:
    """What probing keeps about one drafter (it outlives a generation, as the drafter's estimates do)."""

    wait: int = 0           # unobserved steps before the next probe
    # A probe of a drafter that had to catch up goes on for PROBE_BURST steps, judged as one.
    burst: int = 0          # probe steps still to come in the current burst
    kept: int = 0           # tokens its steps so far kept
    expected: float = 0.0   # tokens the estimates expected them to keep
    reached: int = 0        # positions they reached (drafted up to the first rejection)
    steps: int = 0
    draft_len: int = 0      # the draft length its steps drafted


@dataclass(frozen=True)
class Candidate:
    """A drafter that may be probed this step: not asked beforehand, not the one chosen."""

    drafter: Drafter
    unseen: int             # steps since its acceptance was last observed
    probe: ProbeState


class Probing:
    """When to probe which drafter, and the budget that pays for it (``stats.probe_budget_ms``).

    ``evaluate`` and ``step_ms`` price a drafter's step (the controller's), ``plain_ms`` a plain one."""

    def __init__(self, stats: ControllerStats, *, evaluate: Evaluate, step_ms: StepMs,
                 plain_ms: Callable[[], float], share: float, probe_len: int, min_wait: int,
                 max_wait: int) -> None:
        self.stats = stats
        self.evaluate = evaluate
        self.step_ms = step_ms
        self.plain_ms = plain_ms
        self.share = share
        self.probe_len = probe_len
        self.min_wait = min_wait
        self.max_wait = max_wait
        self.start()

    def start(self) -> None:
        """A new generation: it earns its own budget. A reply never pays for a probe with what earlier
        replies saved, so none slows a reply (or its first token) beyond the bound."""
        self.stats.probe_budget_ms = 0.0
        self._advance_due = True  # the reply's advance is set at its first plan (see PROBE_ADVANCE_TOKENS)
        self._advance = 0.0  # the advance a probe may still draw on
        self._owed = 0.0  # what the advance drawn still owes the budget

    def open(self, t0: float, remaining: int) -> None:
        """At each plan: the reply's first sets its advance (``remaining``: the tokens it may emit)."""
        if self._advance_due:
            self._advance_due = False
            self._advance = self.share * t0 * min(remaining, PROBE_ADVANCE_TOKENS)

    def draft_len(self, max_draft_len: int, fixed: int | None) -> int:
        """A probe's draft length: a fixed draft length holds for probes too; otherwise a short draft
        keeps them cheap."""
        return max_draft_len if fixed is not None else min(self.probe_len, max_draft_len)

    def choose(self, candidates: Sequence[Candidate], history: Sequence[int], max_draft_len: int, t0: float,
               lookup_ms: float, *, fixed: int | None, first_token_waits: Callable[[int], bool]
               ) -> Decision | None:
        """A probe of the longest-unobserved candidate that is due and whose worst-case excess over plain,
        its catch-up included, the budget covers (a burst under way goes on first), or None."""
        for c in candidates:  # a burst goes on while its drafter is in step and the budget covers it
            if c.probe.burst > 0:
                decision = self._burst_step(c, history, max_draft_len, t0, lookup_ms, fixed)
                if decision is not None:
                    return decision
        due = [(c.unseen, c.drafter.name, c) for c in candidates if c.unseen >= c.probe.wait]
        for unseen, name, c in sorted(due, key=lambda d: (d[0], d[1]), reverse=True):
            k = self.draft_len(max_draft_len, fixed)
            behind = c.drafter.behind(history)
            if first_token_waits(behind):
                continue
            tokens, ms = self.evaluate(name, k, behind)
            budget = self.stats.probe_budget_ms
            if budget < ms - t0 <= budget + self._advance and self._pays_in_step(name, max_draft_len, t0):
                self.stats.probe_budget_ms += self._advance  # drawn: the steps to come repay it first
                self._owed, self._advance = self._owed + self._advance, 0.0
            if self.stats.probe_budget_ms >= ms - t0:  # worst case: the probe emits one token
                catch_up = f", catching up {behind} tokens" if behind > 2 else ""
                return Decision(c.drafter, k, tokens, ms, tokens / ms * t0,
                                f"probe {name} k={k}: unobserved for {unseen} steps{catch_up}, "
                                f"expected {tokens / ms * t0:.2f}× plain", probe=True, proposal_ms=lookup_ms,
                                behind=behind)
        return None

    def _pays_in_step(self, name: str, max_draft_len: int, t0: float) -> bool:
        """Whether ``name`` would draft by its estimates once in step (no catch-up): only then may a
        probe draw on the reply's advance, the catch-up being all that stands between it and drafting."""
        lengths = range(1, min(max_draft_len, TREE_DEPTH_MAX) + 1)
        return any(tokens / ms * t0 >= 1.0 for tokens, ms in (self.evaluate(name, k, 0) for k in lengths))

    def _burst_step(self, c: Candidate, history: Sequence[int], max_draft_len: int, t0: float, lookup_ms: float,
                    fixed: int | None) -> Decision | None:
        """The next step of a probe burst, or None (the burst judged as it stands) when its drafter fell
        behind or the budget no longer covers the step's worst case."""
        name, probe = c.drafter.name, c.probe
        k = self.draft_len(max_draft_len, fixed)
        behind = c.drafter.behind(history)
        tokens, ms = self.evaluate(name, k, behind)
        if behind > 2 or self.stats.probe_budget_ms < ms - t0:
            probe.burst = 0
            self._judge(name, probe)
            return None
        return Decision(c.drafter, k, tokens, ms, tokens / ms * t0,
                        f"probe {name} k={k}: burst, {probe.burst} steps to go, "
                        f"expected {tokens / ms * t0:.2f}× plain", probe=True, proposal_ms=lookup_ms,
                        behind=behind)

    def _judge(self, name: str, probe: ProbeState) -> None:
        """A probe's (or a burst's) verdict. Success: it kept more than the estimates expected (a
        drafter gone good beats a stale low estimate; a useless one never does), and acceptance as good
        as its could pay at all. A drafter that is often right but too costly to win (a draft model as
        slow as the target) fails like a useless one, so its probes thin out."""
        if not probe.reached:
            return
        rate = probe.kept / probe.reached  # conditional acceptance per position reached
        if probe.kept > probe.expected - probe.steps and self._could_win(name, rate, probe.draft_len):
            self.stats.probe_successes += 1
            probe.wait = self.min_wait
        else:
            probe.wait = min(2 * probe.wait, self.max_wait)
        probe.kept, probe.expected, probe.reached, probe.steps = 0, 0.0, 0, 0

    def _could_win(self, name: str, alpha: float, draft_len: int) -> bool:
        """Whether a draft of at most ``draft_len`` tokens by ``name``, accepted at ``alpha`` per position,
        would beat plain at the estimated costs, once caught up (judging a probe at its own draft length at
        most: a 3-token probe that was fully accepted says little about 15-token drafts; one that kept few
        may still pay at 1). Not by the margin: this decides how soon it is probed again, not whether it
        drafts."""
        t0 = self.plain_ms()
        return any(expected_tokens_per_step(alpha, k) / self.step_ms(name, k) * t0 >= 1.0
                   for k in range(1, draft_len + 1))

    def next_in(self, candidates: Sequence[Candidate], history: Sequence[int], max_draft_len: int,
                t0: float) -> int | None:
        """Steps until the next probe could start (by wait and budget), for the reason text."""
        best: int | None = None
        for c in candidates:
            by_wait = max(0, c.probe.wait - c.unseen)
            _, ms = self.evaluate(c.drafter.name, min(self.probe_len, max_draft_len), c.drafter.behind(history))
            deficit = ms - t0 - self.stats.probe_budget_ms
            by_budget = math.ceil(deficit / (self.share * t0)) if deficit > 0 and self.share > 0 else 0
            n = max(by_wait, by_budget)
            best = n if best is None else min(best, n)
        return best

    def earn(self, plain_ms: float) -> None:
        """Steps that did not probe, worth ``plain_ms`` of plain decoding, earn the budget its share, repaying a
        drawn advance first."""
        earned = self.share * plain_ms
        repaid = min(self._owed, earned)
        self._owed -= repaid
        self.stats.probe_budget_ms += earned - repaid

    def settle(self, step: StepEvent, decision: Decision, t0: float, probe: ProbeState | None,
               fixed: int | None) -> None:
        """After a step: a probe spends its measured excess over plain and counts towards its verdict
        (``probe``: the probed drafter's state); every other step earns the budget, repaying a drawn
        advance first."""
        if not decision.probe or probe is None:
            self.earn(t0 * step.emitted)
            return
        self.stats.probe_budget_ms -= step.step_ms - t0 * step.emitted
        probe.kept += step.accepted
        probe.expected += decision.expected_tokens - 1.0
        probe.reached += min(decision.draft_len, step.accepted + 1)
        probe.steps += 1
        probe.draft_len = decision.draft_len
        if probe.burst > 0:
            probe.burst -= 1
        elif decision.behind > 2 and fixed is None:
            probe.burst = PROBE_BURST - 1  # it paid a catch-up: go on while the draft is in step
        if probe.burst == 0:
            self._judge(decision.name, probe)
