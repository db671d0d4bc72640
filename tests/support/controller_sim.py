"""The controller's test harness: simulated drafters, costs and a clock, fed to it as the engine would.

A simulation runs the controller against simulated drafters over a text
whose token at position i is i: a drafter's proposal matches the text for a
run of positions drawn from its acceptance rate (which may change mid-way),
time is charged from a "true" cost model on a simulated clock, and the
controller is fed each step exactly as the engine would. All times are
simulated: nothing here measures the machine.
"""

from __future__ import annotations

import dataclasses
import math
import random
from typing import Callable, Mapping, Sequence

from localspec.drafting.base import DrafterBase, Evidence, Proposal
from localspec.events import StepEvent
from localspec.policy.controller import Controller
from localspec.policy.costs import CostModel
from localspec.policy.decision import Decision
from localspec.policy.sim_clock import SimClock

# ms for one decode of k tokens: SmolLM2-135M on 2 CPU threads, and a GPU that verifies 8 for the price of 1.
CPU = {1: 5.4, 2: 11.3, 4: 16.2, 8: 24.9, 16: 41.1}
GPU = {1: 10.0, 2: 10.1, 4: 10.2, 8: 10.5, 16: 12.0}
LOOKUP = (0.3, 0.0)      # ms: fixed, per token
CHEAP_LOOKUP = (0.02, 0.0)  # an n-gram lookup: asked before planning every step
DRAFT_MODEL = (1.0, 5.0)  # a draft model as slow as the CPU target: never worth it there
ROOM = 10**6


class SimDrafter(DrafterBase):
    """A drafter whose proposal for ``history`` matches the text (token i at position i) for a run
    of positions drawn at ``rate(step)``, and which spends simulated time proposing.

    ``cost``: (fixed, per token) ms; ``upkeep``: the decode costs of a draft model, which must
    also catch up on every token since it last drafted (its prefill, the first time); ``empty_misses``: a
    proposal whose first token would miss is empty (a lookup that found no match offers nothing).
    """

    def __init__(self, sim: "Sim", name: str, rate: Callable[[int], float], *, cost: tuple[float, float] = LOOKUP,
                 cheap: bool = False, depth: int = 8, extra: int = 0, upkeep: CostModel | None = None,
                 empty_misses: bool = False) -> None:
        self.sim, self.name, self.rate, self.cost = sim, name, rate, cost
        self.empty_misses = empty_misses
        self.cheap = cheap  # type: ignore[misc]
        self.batch_extra_tokens = extra  # type: ignore[misc]
        self.depth, self.upkeep = depth, upkeep
        self.synced = 0  # a draft model's cache holds history[:synced]
        self.proposals = 0
        self.decoded = 0  # tokens a draft model decoded (catch-up and drafts)

    def behind(self, history: Sequence[int]) -> int:
        return len(history) - min(self.synced, len(history) - 1) if self.upkeep is not None else 0

    def propose(self, history: Sequence[int], draft_len: int) -> Proposal:
        self.proposals += 1
        n = min(draft_len, self.depth) if self.cheap else draft_len
        if self.upkeep is not None:
            behind = self.behind(history)
            self.sim.clock.spend(self.upkeep.verify_ms(behind) + (n - 1) * self.upkeep.verify_ms(1))
            self.decoded += behind + n - 1
            self.synced = len(history) + n - 1
        else:
            self.sim.clock.spend(self.cost[0] + self.cost[1] * n)
        matched = self.sim.chain(self.rate(self.sim.step), n)
        if not matched and self.empty_misses:
            return Proposal((), None, self.name)
        start = len(history)
        return Proposal(tuple(range(start, start + matched)) + (-1,) * (n - matched), None, self.name)

    def accepted(self, history: Sequence[int], n_accepted: int) -> None:
        self.synced = min(self.synced, len(history) - 1)


class Sim:
    """A controller run against simulated drafters (``rates[name](step)``: true per-position acceptance).

    Drafters in ``shadow`` are cheap lookups (proposals 8 deep) the controller asks before planning;
    ``upkeep`` names draft models whose decode costs are ``points`` (as costly as the target); drafters in
    ``empty_misses`` offer nothing where their first token would miss.
    """

    def __init__(self, points: Mapping[int, float], rates: Mapping[str, Callable[[int], float]], *,
                 draft_costs: Mapping[str, tuple[float, float]] | None = None, shadow: tuple[str, ...] = (),
                 upkeep: tuple[str, ...] = (), extra: Mapping[str, int] | None = None, seed: int = 0,
                 prompt: int = 10, empty_misses: tuple[str, ...] = (), **controller_kw) -> None:
        self.truth = CostModel(points)
        self.clock = SimClock()
        self.rng = random.Random(seed)
        self.step = 0
        self.history = list(range(prompt))
        default = {name: CHEAP_LOOKUP if name in shadow else LOOKUP for name in rates}
        self.drafters = {name: SimDrafter(self, name, rate, cost=(draft_costs or {}).get(name, default[name]),
                                          cheap=name in shadow, extra=(extra or {}).get(name, 0),
                                          upkeep=CostModel(points) if name in upkeep else None,
                                          empty_misses=name in empty_misses)
                         for name, rate in rates.items()}
        self.ctl = Controller(CostModel(points), list(self.drafters.values()), clock=self.clock, **controller_kw)
        for name, d in self.drafters.items():
            if d.upkeep is not None:
                self.ctl.costs.set_model_drafter(name, CostModel(points))
            else:
                self.ctl.costs.set_draft_cost(name, *d.cost)
        self.total_ms = 0.0
        self.tokens = 0
        self.decisions: list[Decision] = []

    @property
    def plain_ms(self) -> float:
        return self.truth.verify_ms(1) + self.truth.overhead_ms(0)

    @property
    def speed_vs_plain(self) -> float:
        return self.tokens * self.plain_ms / self.total_ms

    def chain(self, rate: float, depth: int) -> int:
        n = 0
        while n < depth and self.rng.random() < rate:
            n += 1
        return n

    def run(self, n_steps: int, max_k: int = 64) -> list[Decision]:
        return [self.one(max_k) for _ in range(n_steps)]

    def one(self, max_k: int = 64, remaining: int = ROOM) -> Decision:
        history = self.history
        decision = self.ctl.plan(history, room=max_k, remaining=remaining)
        k, drafter, proposal = decision.draft_len, decision.chosen, decision.proposal
        t = self.clock()
        if not decision.plain and proposal is None:
            proposal = drafter.propose(history, k)
        own_ms = (self.clock() - t) * 1e3
        draft = tuple(proposal.tokens[:k]) if proposal is not None and not decision.plain else ()
        accepted = 0
        while accepted < len(draft) and draft[accepted] == len(history) + accepted:
            accepted += 1
        extra = drafter.batch_extra_tokens if drafter is not None and not decision.plain else 0
        batch = 1 + len(draft) + extra
        tokens = tuple(range(len(history), len(history) + accepted + 1))
        step = StepEvent(index=self.step + 1, drafter=drafter.name if draft else None, drafted=len(draft),
                         accepted=accepted, emitted=len(tokens), draft_ms=decision.proposal_ms + own_ms,
                         verify_ms=self.truth.verify_ms(batch), python_ms=self.truth.overhead_ms(len(draft)),
                         verified=len(draft), tokens=tokens, batch_tokens=batch)
        history.extend(tokens)
        if not decision.plain:
            drafter.verified(len(draft))
            drafter.accepted(history, accepted)
        self.ctl.observe(step, history)
        self.total_ms += step.step_ms
        self.tokens += len(tokens)
        self.step += 1
        self.decisions.append(decision)
        return decision


class Named(DrafterBase):
    """A drafter that only has a name (for planning without proposing)."""

    def __init__(self, name: str, *, cheap: bool = False, extra: int = 0, tokens: tuple[int, ...] = ()) -> None:
        self.name, self.tokens = name, tokens
        self.cheap = cheap  # type: ignore[misc]
        self.batch_extra_tokens = extra  # type: ignore[misc]
        self.kept: list[int] = []

    def propose(self, history: Sequence[int], draft_len: int) -> Proposal:
        return Proposal(self.tokens[:draft_len], None, self.name)

    def accepted(self, history: Sequence[int], n_accepted: int) -> None:
        self.kept.append(n_accepted)


def controller(points: Mapping[int, float], *names: str, **kw) -> Controller:
    return Controller(CostModel(points), [Named(n) for n in names], **kw)


def plan(ctl: Controller, max_k: int = 64, history: Sequence[int] = (0,)) -> Decision:
    return ctl.plan(list(history), room=max_k, remaining=ROOM)


def step_event(tokens: tuple[int, ...], drafter: str | None, drafted: int, accepted: int, *, draft_ms: float = 0.0,
               verify_ms: float = 0.0, verified: int | None = None, batch: int | None = None) -> StepEvent:
    verified = drafted if verified is None else verified
    return StepEvent(index=0, drafter=drafter, drafted=drafted, accepted=accepted, emitted=len(tokens),
                     draft_ms=draft_ms, verify_ms=verify_ms, python_ms=0.0, verified=verified, tokens=tokens,
                     batch_tokens=1 + verified if batch is None else batch)


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


class EvidenceLookup(Named):
    """A cheap lookup offering ``tokens`` resting on ``evidence`` (cut to the depth asked, like a real one)."""

    def __init__(self, tokens: tuple[int, ...], evidence: Evidence) -> None:
        super().__init__("ngram", cheap=True, tokens=tokens)
        self.evidence = evidence

    def propose(self, history: Sequence[int], draft_len: int) -> Proposal:
        return Proposal(self.tokens[:draft_len], None, self.name,
                        dataclasses.replace(self.evidence, support=self.evidence.support[:draft_len]))


LONG_COPY = Evidence(20, 1, (1.0,) * 15)   # a 20-token match: a copy in progress
ONE_TOKEN = Evidence(1, 6, (0.4,) * 15)    # one shared token, its six continuations split
