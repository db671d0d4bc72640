"""The adaptive controller: each step, which drafter drafts how many tokens — or none.

Pure logic (no llama.cpp): it plans with a ``CostModel`` (``localspec.costs``)
and a running acceptance estimate per drafter, and learns both from the steps
it is shown.

The decision rule
-----------------
For drafter d drafting k tokens with conditional acceptance a_0, a_1, ... by
position, a step emits on average

    E(k) = 1 + sum_{i<k} prod_{j<=i} a_j          tokens (the target's own token always counts)

and takes

    T(k) = draft_ms(d, k) + verify_ms(1 + w_d k + x_d) + overhead_ms(k)

where w_d is the drafter's verified tokens per planned draft token (1 for a
full chain, more for a tree of branches, less for a drafter that often comes
back empty) and x_d the tokens its every batch carries besides the
candidates (lookahead's Jacobi window; known up front, so the controller
need not first lose time to learn what a window costs). Plain decoding
emits 1 token in T0 = verify_ms(1) + overhead_ms(0).
The controller picks the (d, k) with the highest E/T and drafts only when that
beats plain by ``margin`` (5%); otherwise it decodes plainly. A user's fixed
``--draft-max`` forces k; the controller then only chooses the drafter.

Probing, and why it costs at most ~2.5% speed
---------------------------------------------
A drafter that is not used learns nothing, so one that turned good (the text
became repetitive) would never be picked again. Drafters whose proposals are
known before planning (cheap lookups, passed as ``offers``) can be scored
every step for free against what was emitted (``observe_shadow``). The others
are *probed*: after ``wait`` unobserved steps, one step drafts ``probe_k``
tokens with them. ``wait`` doubles after each failed probe (up to
``max_wait``) and falls back to ``min_wait`` after a success: more tokens
accepted than the estimate expected, at a rate that could beat plain
decoding at all (a drafter that is often right but too costly ever to pay
is not worth watching closely).

Probes are paid from a budget: every non-probe step adds ``probe_share`` x
T0 x (tokens emitted) — a share of what plain decoding would have spent on
those tokens — and a probe starts only when the budget covers its worst-case
excess over plain (its estimated time - T0: the probe emits a single token);
its measured excess (time - T0 x tokens) is then charged. Hence over any run,
with N tokens emitted and non-probe steps no slower than plain (they beat it
by the margin, or are plain):

    time <= T0 N + sum(probe excess) <= T0 N (1 + probe_share) + one probe's estimation error,

so speed >= 1 / 1.025 = 0.976 x plain for probe_share = 0.025, i.e. >= 0.97x
with room for estimation error. With a useless drafter on a small CPU (probe
of 3 tokens ~ 3.2 x T0, so an excess of ~2.2 T0) the budget alone spaces
probes ~88 steps apart, and the doubling wait spaces them further. A probe
that succeeds is usually profitable (negative excess) and funds the next.
Where drafting is nearly free (a GPU), forgetting returns an unused drafter's
estimate to the prior, which is enough to try it again as an ordinary step;
each such try costs a few percent of one step.

Acceptance estimates forget: each observation of a drafter discounts its
past evidence by ``decay`` (memory ~20 observations, so a drafter that
degrades is dropped within a few dozen steps, at any temperature), and every
step a drafter goes unobserved discounts it by ``idle_decay`` (so evidence
from long ago weighs little against a fresh probe).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Mapping, Protocol, Sequence

from localspec.costs import CostModel
from localspec.drafting.base import Proposal, TreeProposal


class StepLike(Protocol):
    """The fields of ``localspec.speculative.StepResult`` the controller reads.

    (A protocol, not an import: ``speculative`` imports llama.cpp, and the
    controller is pure logic.)
    """

    tokens: tuple[int, ...]
    drafter: str | None
    drafted: int
    accepted: int
    draft_s: float
    verify_s: float
    python_s: float
    verified: int


# --- acceptance with forgetting ----------------------------------------------
@dataclass
class DecayingAcceptance:
    """Running acceptance by draft position that forgets, with a prior worth ``weight`` trials.

    Same API as ``drafting.combine.PositionAcceptance`` (``rate``,
    ``expected_accepted``, ``update``), so it can replace it. Two differences:

    * evidence decays: by ``decay`` at each observation of the drafter, and
      by ``idle_decay`` per step without any observation (``update(...,
      idle_steps=n)``), so the estimate follows a drafter whose quality changes;
    * position i's prior is the estimate at position i - 1 (position 0's is
      ``prior``): a deep position rarely reached inherits what the shallower
      ones show instead of a fixed guess.
    """

    prior: float = 0.6
    weight: float = 2.0
    decay: float = 0.95
    idle_decay: float = 0.99
    reached: list[float] = field(default_factory=list)
    kept: list[float] = field(default_factory=list)

    def rates(self, depth: int) -> list[float]:
        """Conditional acceptance at positions 0..depth-1."""
        out: list[float] = []
        prev = self.prior
        for i in range(depth):
            r = self.reached[i] if i < len(self.reached) else 0.0
            k = self.kept[i] if i < len(self.kept) else 0.0
            prev = (k + prev * self.weight) / (r + self.weight)
            out.append(prev)
        return out

    def rate(self, i: int) -> float:
        return self.rates(i + 1)[i]

    def expected_accepted(self, depth: int) -> float:
        """sum_{i<depth} prod_{j<=i} rate(j): the mean number of accepted draft tokens."""
        total, run = 0.0, 1.0
        for a in self.rates(depth):
            run *= a
            total += run
        return total

    def update(self, drafted_depth: int, accepted: int, *, idle_steps: int = 0) -> None:
        """One outcome: positions < min(depth, accepted + 1) were reached, the first ``accepted`` kept."""
        if idle_steps > 0:
            self.forget(self.idle_decay ** idle_steps)
        reached = min(drafted_depth, accepted + 1)
        while len(self.reached) < reached:
            self.reached.append(0.0)
            self.kept.append(0.0)
        # Every position forgets, reached or not: after a drafter degrades, its deep
        # positions are rarely reached, and their old (good) evidence must not linger;
        # they fall back to the shallower positions' estimate instead.
        self.forget(self.decay)
        for i in range(reached):
            self.reached[i] += 1.0
            self.kept[i] += 1.0 if i < accepted else 0.0

    def forget(self, factor: float) -> None:
        """Scale all evidence by ``factor`` (0: back to the prior, 1: keep everything)."""
        self.reached = [r * factor for r in self.reached]
        self.kept = [k * factor for k in self.kept]


def expected_tokens_per_step(alpha: float, gamma: float) -> float:
    """(1 − α^(γ+1)) / (1 − α): tokens per target pass when each drafted token is kept with probability α.

    With α = 1 every draft is kept and a step yields γ + 1 tokens. γ may be a mean (fractional).
    """
    if alpha >= 1.0:
        return gamma + 1.0
    return (1.0 - alpha ** (gamma + 1.0)) / (1.0 - alpha)


# --- what the controller takes and gives --------------------------------------
@dataclass(frozen=True)
class Offer:
    """A proposal a cheap drafter has already made this step.

    ``depth`` caps k (the drafter has nothing deeper). ``confidence[i]``, when
    given, is the drafter's own probability that position i is right given
    the earlier ones are (for a tree: the mass its branches cover at that
    depth); the controller never plans with more than that, nor with more
    than the drafter's measured acceptance.
    """

    depth: int
    confidence: tuple[float, ...] = ()


def proposal_offer(proposal: Proposal | TreeProposal) -> Offer:
    """The offer a proposal makes: its depth and, for a tree, its own confidence by depth.

    A tree node's probability is the share of the continuations' weight that
    starts with its path, so the mass at depth d+1 over the mass at depth d is
    the tree's own chance of still being right at d+1 once right up to d.
    """
    if not isinstance(proposal, TreeProposal):
        return Offer(len(proposal.tokens))
    tree = proposal.tree
    depth = max(tree.depths, default=0)
    mass = [1.0] + [0.0] * depth
    for d, p in zip(tree.depths, tree.probs):
        mass[d] += p
    confidence = tuple(min(1.0, mass[d + 1] / mass[d]) if mass[d] > 0 else 0.0 for d in range(depth))
    return Offer(depth, confidence)


def proposal_branches(proposal: Proposal | TreeProposal) -> tuple[tuple[int, ...], ...]:
    """The candidate continuations of a proposal, for ``Controller.observe_shadow``."""
    if isinstance(proposal, TreeProposal):
        return proposal.tree.branches
    return (tuple(proposal.tokens),) if proposal.tokens else ()


@dataclass(frozen=True)
class Decision:
    """What to do this step: draft ``k`` tokens with ``drafter``, or decode plainly (k = 0).

    ``expected_tokens``/``expected_ms`` per step under the current estimates;
    ``speedup`` = (expected_tokens / expected_ms) / (1 / plain step ms).
    ``probe``: a step taken to re-test a drafter, not because it is expected to win.
    """

    drafter: str | None
    k: int
    expected_tokens: float
    expected_ms: float
    speedup: float
    reason: str
    probe: bool = False

    @property
    def plain(self) -> bool:
        return self.drafter is None or self.k == 0


@dataclass
class ControllerStats:
    """Counters behind the controller's decisions, for the dashboard and ``--verbose`` output.

    ``choices[name][k]`` counts steps planned with that drafter and k (plain
    steps under ``"plain"``, k = 0). Gains compare planned and measured
    drafting steps (probes excluded) with plain decoding of the same tokens
    at the plain cost estimated at the time.
    """

    steps: int = 0
    plain_steps: int = 0
    draft_steps: int = 0
    probes: int = 0
    probe_successes: int = 0
    choices: dict[str, dict[int, int]] = field(default_factory=dict)
    expected_tokens: float = 0.0
    expected_ms: float = 0.0
    expected_plain_ms: float = 0.0
    measured_tokens: int = 0
    measured_ms: float = 0.0
    measured_plain_ms: float = 0.0
    probe_budget_ms: float = 0.0
    last_reason: str = ""

    @property
    def expected_gain(self) -> float:
        """Planned speedup of the drafting steps over plain (1.0 before any)."""
        return self.expected_plain_ms / self.expected_ms if self.expected_ms > 0 else 1.0

    @property
    def measured_gain(self) -> float:
        """Measured speedup of the drafting steps over plain (1.0 before any)."""
        return self.measured_plain_ms / self.measured_ms if self.measured_ms > 0 else 1.0

    def since(self, before: "ControllerStats") -> "ControllerStats":
        """The counts added after ``before`` (a copy taken earlier), e.g. one generation's."""
        choices: dict[str, dict[int, int]] = {}
        for name, ks in self.choices.items():
            old = before.choices.get(name, {})
            row = {k: n - old.get(k, 0) for k, n in ks.items() if n - old.get(k, 0)}
            if row:
                choices[name] = row
        return ControllerStats(
            steps=self.steps - before.steps, plain_steps=self.plain_steps - before.plain_steps,
            draft_steps=self.draft_steps - before.draft_steps, probes=self.probes - before.probes,
            probe_successes=self.probe_successes - before.probe_successes, choices=choices,
            expected_tokens=self.expected_tokens - before.expected_tokens,
            expected_ms=self.expected_ms - before.expected_ms,
            expected_plain_ms=self.expected_plain_ms - before.expected_plain_ms,
            measured_tokens=self.measured_tokens - before.measured_tokens,
            measured_ms=self.measured_ms - before.measured_ms,
            measured_plain_ms=self.measured_plain_ms - before.measured_plain_ms,
            probe_budget_ms=self.probe_budget_ms, last_reason=self.last_reason,
        )

    def copy(self) -> "ControllerStats":
        return dataclasses.replace(self, choices={n: dict(ks) for n, ks in self.choices.items()})

    @property
    def mean_k(self) -> float:
        """Mean draft length over the steps that drafted (probes included)."""
        n = sum(c for name, ks in self.choices.items() if name != "plain" for c in ks.values())
        total = sum(k * c for name, ks in self.choices.items() if name != "plain" for k, c in ks.items())
        return total / n if n else 0.0

    def to_dict(self) -> dict[str, object]:
        return {
            "steps": self.steps, "plain_steps": self.plain_steps, "draft_steps": self.draft_steps,
            "probes": self.probes, "probe_successes": self.probe_successes,
            "choices": {n: dict(sorted(ks.items())) for n, ks in self.choices.items()},
            "expected_gain": self.expected_gain, "measured_gain": self.measured_gain,
            "probe_budget_ms": self.probe_budget_ms, "last_reason": self.last_reason,
        }


@dataclass
class _DrafterState:
    acceptance: DecayingAcceptance
    width: float = 1.0      # verified tokens per planned draft token
    extra: float = 0.0      # tokens every verification batch carries besides the candidates (a window)
    last_seen: int = 0      # step of the last acceptance observation
    wait: int = 0           # unobserved steps before the next probe


# --- the controller -----------------------------------------------------------
class Controller:
    """Plans each step (``plan``) and learns from it (``observe``); see the module notes.

    ``drafters``: the names ``plan`` may choose (what the engine can run).
    ``fixed_k``: the user's ``--draft-max``; None lets the controller choose k
    up to ``k_cap`` (the verify costs are measured up to 16 tokens).
    One controller should live as long as the engine: its costs and
    acceptance estimates carry over from one generation to the next.
    """

    def __init__(self, costs: CostModel, drafters: Sequence[str], *, fixed_k: int | None = None,
                 k_cap: int = 15, margin: float = 0.05, probe_share: float = 0.025, probe_k: int = 3,
                 min_wait: int = 8, max_wait: int = 512, prior: float = 0.6,
                 extra_tokens: Mapping[str, int] | None = None) -> None:
        if fixed_k is not None and fixed_k < 0:
            raise ValueError(f"fixed_k must be >= 0, not {fixed_k}")
        self.costs = costs
        self.fixed_k = fixed_k
        self.k_cap = k_cap
        self.margin = margin
        self.probe_share = probe_share
        self.probe_k = probe_k
        self.min_wait = min_wait
        self.max_wait = max_wait
        self._drafters = {name: _DrafterState(DecayingAcceptance(prior=prior), wait=min_wait,
                                              extra=float((extra_tokens or {}).get(name, 0)))
                          for name in drafters}
        self.stats = ControllerStats()
        self._step = 0
        self._pending: tuple[Decision, float] | None = None  # the planned decision and T0 then
        self._last_used: str | None = None  # the drafter the last observed step verified

    @property
    def drafters(self) -> list[str]:
        return list(self._drafters)

    def acceptance(self, name: str) -> DecayingAcceptance:
        return self._drafters[name].acceptance

    # --- the objective ------------------------------------------------------
    def evaluate(self, name: str, k: int, offer: Offer | None = None) -> tuple[float, float]:
        """(expected tokens, expected ms) of one step drafting ``k`` tokens with ``name``."""
        if k <= 0:
            return 1.0, self.costs.plain_ms()
        state = self._drafters[name]
        rates = state.acceptance.rates(k)
        if offer is not None and offer.confidence:
            rates = [min(a, offer.confidence[i]) if i < len(offer.confidence) else a
                     for i, a in enumerate(rates)]
        tokens, run = 1.0, 1.0
        for a in rates:
            run *= a
            tokens += run
        return tokens, self._step_ms(name, k)

    def _step_ms(self, name: str, k: int) -> float:
        """T(k): drafting ``k`` tokens with ``name``, verifying its batch, and the step's Python work."""
        state = self._drafters[name]
        return (self.costs.draft_ms(name, k) + self.costs.verify_ms(1.0 + state.width * k + state.extra)
                + self.costs.overhead_ms(k))

    # --- planning -----------------------------------------------------------
    def plan(self, max_k: int, offers: Mapping[str, Offer] | None = None) -> Decision:
        """The decision for the next step.

        ``max_k``: the most draft tokens that fit (context room, tokens left).
        ``offers``: proposals cheap drafters already made this step; a drafter
        missing from a given mapping has nothing this step (None: no drafter
        proposed in advance, each may draft up to ``max_k``).
        """
        t0 = self.costs.plain_ms()
        limits: dict[str, int] = {}
        for name in self._drafters:
            limit = max(0, max_k if self.fixed_k is None else min(max_k, self.fixed_k))
            if self.fixed_k is None:
                limit = min(limit, self.k_cap)
            if offers is not None:
                offer = offers.get(name)
                limit = min(limit, offer.depth) if offer is not None else 0
            if limit > 0:
                limits[name] = limit

        best: tuple[float, str, int, float, float] | None = None  # speed, name, k, tokens, ms
        for name, limit in limits.items():
            offer = offers.get(name) if offers is not None else None
            for k in ([limit] if self.fixed_k is not None else range(1, limit + 1)):
                tokens, ms = self.evaluate(name, k, offer)
                if best is None or tokens / ms > best[0]:
                    best = (tokens / ms, name, k, tokens, ms)

        choice: Decision | None = None
        if best is not None:
            speed, name, k, tokens, ms = best
            speedup = speed * t0
            if self.fixed_k is not None:
                choice = Decision(name, k, tokens, ms, speedup,
                                  f"{name}: --draft-max {self.fixed_k} → k={k}, expected {tokens:.1f} tok/step "
                                  f"at {ms:.0f} ms → {speedup:.2f}× plain")
            elif speedup >= 1.0 + self.margin:
                choice = Decision(name, k, tokens, ms, speedup,
                                  f"{name}: expected {tokens:.1f} tok/step at {ms:.0f} ms → {speedup:.2f}× plain")

        # A stale drafter is probed whatever the choice (it may now beat the chosen one too).
        probe = self._probe(limits, choice.drafter if choice is not None else None, offers, t0)
        if probe is not None:
            return self._decide(probe, t0)
        if choice is not None:
            return self._decide(choice, t0)
        if best is None:
            why = "no room to draft" if max_k <= 0 or self.fixed_k == 0 else "no drafter has a proposal"
            return self._decide(Decision(None, 0, 1.0, t0, 1.0, f"plain: {why}"), t0)
        nxt = self._next_probe_in(t0)
        again = f"probing again in {nxt} steps" if nxt is not None else "drafters re-scored every step"
        return self._decide(Decision(
            None, 0, 1.0, t0, 1.0,
            f"speculation off: best expected {best[0] * t0:.2f}× plain ({best[1]} k={best[2]}); {again}"), t0)

    def _probe(self, limits: Mapping[str, int], chosen: str | None, offers: Mapping[str, Offer] | None,
               t0: float) -> Decision | None:
        """A probe of the longest-unobserved drafter (other than ``chosen``) that is due and
        whose expected excess over plain the budget covers, if any."""
        due = [(self._step - s.last_seen, name) for name, s in self._drafters.items()
               if name in limits and name != chosen and self._step - s.last_seen >= s.wait]
        for _, name in sorted(due, reverse=True):
            # A fixed --draft-max holds for probes too; otherwise a short draft keeps them cheap.
            k = limits[name] if self.fixed_k is not None else min(self.probe_k, limits[name])
            tokens, ms = self.evaluate(name, k, offers.get(name) if offers is not None else None)
            if self.stats.probe_budget_ms >= ms - t0:  # worst case: the probe emits one token
                return Decision(name, k, tokens, ms, tokens / ms * t0,
                                f"probe {name} k={k}: unobserved for {self._step - self._drafters[name].last_seen} "
                                f"steps, expected {tokens / ms * t0:.2f}× plain", probe=True)
        return None

    def _next_probe_in(self, t0: float) -> int | None:
        """Steps until the next probe could start (by wait and budget), for the reason text."""
        best: int | None = None
        for name, s in self._drafters.items():
            if self._step > 0 and s.last_seen == self._step:
                continue  # observed in the last step (shadow-scored): needs no probe
            by_wait = max(0, s.wait - (self._step - s.last_seen))
            tokens, ms = self.evaluate(name, min(self.probe_k, self.k_cap))
            deficit = ms - t0 - self.stats.probe_budget_ms
            by_budget = math.ceil(deficit / (self.probe_share * t0)) if deficit > 0 and self.probe_share > 0 else 0
            n = max(by_wait, by_budget)
            best = n if best is None else min(best, n)
        return best

    def _decide(self, decision: Decision, t0: float) -> Decision:
        self._pending = (decision, t0)
        self.stats.last_reason = decision.reason
        return decision

    # --- learning -----------------------------------------------------------
    def observe(self, step: StepLike, *, batch_tokens: int | None = None) -> None:
        """Learn from the step just taken (after the ``plan`` that decided it).

        ``batch_tokens``: tokens in the verification decode when it held more
        than ``1 + step.verified`` (lookahead's window); otherwise inferred.
        A step without a preceding ``plan`` is attributed to ``step.drafter``.
        """
        decision, t0 = self._pending or (None, self.costs.plain_ms())
        self._pending = None
        self._step += 1
        if decision is None:
            k = step.drafted if step.drafter in self._drafters else 0
            decision = Decision(step.drafter if k else None, k, 1.0, t0, 1.0, "")
        batch = batch_tokens if batch_tokens is not None else 1 + step.verified
        step_ms = (step.draft_s + step.verify_s + step.python_s) * 1e3
        n_tokens = len(step.tokens)

        # costs
        if step.verify_s > 0:
            self.costs.observe_verify(batch, step.verify_s * 1e3)
        self.costs.observe_overhead(decision.k, step.python_s * 1e3)

        # the drafter: cost when asked for k, acceptance over the k planned positions
        # (a proposal shorter than planned counts its missing positions as rejected,
        # so expected tokens match what such steps really emit)
        name = decision.drafter if not decision.plain else None
        self._last_used = name
        if name is not None and name in self._drafters:
            state = self._drafters[name]
            self.costs.observe_draft(name, decision.k, step.draft_s * 1e3)
            state.acceptance.update(decision.k, step.accepted,
                                    idle_steps=max(0, self._step - state.last_seen - 1))
            state.width += 0.1 * (max(0.0, batch - 1 - state.extra) / decision.k - state.width)
            state.last_seen = self._step

        # counters, the probe budget, probe outcomes
        stats = self.stats
        stats.steps += 1
        row = stats.choices.setdefault(name or "plain", {})
        row[decision.k] = row.get(decision.k, 0) + 1
        if decision.probe and name is not None:
            stats.probes += 1
            stats.probe_budget_ms -= step_ms - t0 * n_tokens
            state = self._drafters[name]
            # Success: the probe kept more than the estimate expects (a drafter gone good beats a
            # stale low estimate; a useless one never does), and acceptance as good as the probe's
            # could pay at all. A drafter that is often right but too costly to win (a draft model
            # as slow as the target) fails like a useless one, so its probes thin out.
            rate = step.accepted / decision.k
            if step.accepted > decision.expected_tokens - 1.0 and self._could_win(name, rate, decision.k):
                stats.probe_successes += 1
                state.wait = self.min_wait
            else:
                state.wait = min(2 * state.wait, self.max_wait)
            return
        stats.probe_budget_ms += self.probe_share * t0 * n_tokens
        if name is None:
            stats.plain_steps += 1
        else:
            stats.draft_steps += 1
            stats.expected_tokens += decision.expected_tokens
            stats.expected_ms += decision.expected_ms
            stats.expected_plain_ms += decision.expected_tokens * t0
            stats.measured_tokens += n_tokens
            stats.measured_ms += step_ms
            stats.measured_plain_ms += n_tokens * t0

    def _could_win(self, name: str, alpha: float, k: int) -> bool:
        """Whether a ``k``-token draft by ``name``, accepted at ``alpha`` per position, would beat plain by the
        margin at the estimated costs (judging a probe at its own length: a 3-token probe that was fully
        accepted says little about 15-token drafts)."""
        speedup = expected_tokens_per_step(alpha, k) / self._step_ms(name, k) * self.costs.plain_ms()
        return speedup >= 1.0 + self.margin

    def observe_shadow(self, name: str, branches: Sequence[Sequence[int]], emitted: Sequence[int], *,
                       deferred: bool = False) -> None:
        """Score a deterministic drafter's proposal that was not verified this step.

        ``branches``: its candidate continuations (one for a chain);
        ``emitted``: the tokens the step produced (``step.tokens``). Emitted
        tokens are exact target outputs (greedy picks or samples of the
        target's distribution, whoever drafted them), so a deterministic
        draft matching them is exactly as likely as its being accepted; past
        the end of ``emitted`` the outcome is unknown and not counted. Not for
        sampled drafts (a draft model), whose acceptance is min(1, p/q), and
        not for the drafter the step used (``observe`` counted it). ``deferred``:
        ``emitted`` is what followed a proposal of some steps ago (scored once
        enough tokens are known), so the last step's use does not matter.
        """
        state = self._drafters.get(name)
        depth = max((len(b) for b in branches), default=0)
        if state is None or depth == 0 or (name == self._last_used and not deferred):
            return
        matched = max(common_prefix(b, emitted) for b in branches)
        if matched >= len(emitted):
            state.acceptance.update(matched, matched, idle_steps=max(0, self._step - state.last_seen - 1))
        else:
            state.acceptance.update(depth, matched, idle_steps=max(0, self._step - state.last_seen - 1))
        nodes = len({tuple(b[:i]) for b in branches for i in range(1, len(b) + 1)})
        state.width += 0.1 * (nodes / depth - state.width)
        state.last_seen = self._step


class UnusedProposals:
    """Proposals a step did not verify, kept until the text that followed them can judge them.

    A plain step emits one token, which would only ever judge a proposal's
    first position; so an unused proposal waits until its depth is covered
    (or it has parted from the text), and is then scored at every position
    (``Controller.observe_shadow``), teaching the controller a lookup's
    acceptance by position without paying for a verification.
    """

    def __init__(self) -> None:
        self._pending: list[tuple[int, tuple[tuple[int, ...], ...]]] = []  # (history index, branches)

    def __len__(self) -> int:
        return len(self._pending)

    def add(self, start: int, branches: Sequence[Sequence[int]]) -> None:
        """A proposal for the text from ``history[start]`` on."""
        if any(branches):
            self._pending.append((start, tuple(tuple(b) for b in branches if b)))

    def ready(self, history: Sequence[int]) -> list[tuple[tuple[tuple[int, ...], ...], list[int]]]:
        """(branches, what followed, up to their depth) of each proposal the history now judges."""
        out, pending = [], []
        for start, branches in self._pending:
            followed = list(history[start:])
            depth = max(len(b) for b in branches)
            matched = max(common_prefix(b, followed) for b in branches)
            if len(followed) >= depth or matched < len(followed):
                out.append((branches, followed[:depth]))
            else:
                pending.append((start, branches))
        self._pending = pending
        return out


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
