"""Several drafters behind one: each step, the proposal expected to keep the most tokens.

Each drafter's acceptance is tracked by draft position (a Beta-style running
estimate with a prior, so a new drafter is tried before it is judged). The
expected number of accepted tokens of a proposal of depth d is
sum_{i<d} prod_{j<=i} a_j — the same quantity the tokens-per-step formula uses.
Cheap drafters (n-gram lookups) propose first so the depth they offer is known;
a draft model, whose proposal costs forward passes, is asked only when its
expected value for the full depth beats what the cheap ones offer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from localspec.drafting.base import Drafter, Proposal, TreeProposal


def tree_depth(p: Proposal | TreeProposal) -> int:
    if isinstance(p, TreeProposal):
        return max(p.tree.depths, default=0)
    return len(p.tokens)


@dataclass
class PositionAcceptance:
    """Running acceptance by draft position, with a prior of ``prior`` worth ``weight`` trials."""

    prior: float = 0.6
    weight: float = 2.0
    reached: list[int] = field(default_factory=list)
    kept: list[int] = field(default_factory=list)

    def rate(self, i: int) -> float:
        r = self.reached[i] if i < len(self.reached) else 0
        k = self.kept[i] if i < len(self.kept) else 0
        return (k + self.prior * self.weight) / (r + self.weight)

    def expected_accepted(self, depth: int) -> float:
        total, run = 0.0, 1.0
        for i in range(depth):
            run *= self.rate(i)
            total += run
        return total

    def update(self, drafted_depth: int, accepted: int) -> None:
        reached = min(drafted_depth, accepted + 1)
        while len(self.reached) < drafted_depth:
            self.reached.append(0)
            self.kept.append(0)
        for i in range(reached):
            self.reached[i] += 1
        for i in range(accepted):
            self.kept[i] += 1


class DrafterSet:
    """Drafters combined: one proposal per step, from the most promising drafter.

    ``expensive`` names the drafters whose ``propose`` costs model forward
    passes; they are consulted last and only when their estimate wins.
    """

    def __init__(self, drafters: Sequence[Drafter], *, expensive: Sequence[str] = ()) -> None:
        if not drafters:
            raise ValueError("a DrafterSet needs at least one drafter")
        self.drafters = list(drafters)
        self.name = ",".join(d.name for d in drafters)
        self.expensive = set(expensive)
        self.acceptance = {d.name: PositionAcceptance() for d in drafters}
        self._last: tuple[str, int] | None = None

    def propose(self, history: Sequence[int], max_tokens: int) -> Proposal | TreeProposal:
        best: Proposal | TreeProposal = Proposal()
        best_value = 0.0
        for d in self.drafters:
            if d.name in self.expensive:
                continue
            p = d.propose(history, max_tokens)
            value = self.acceptance[d.name].expected_accepted(tree_depth(p))
            if value > best_value:
                best, best_value = p, value
            elif best_value == 0.0 and isinstance(p, TreeProposal) and p.extra is not None and not best.tokens:
                # Nothing to verify yet, but lookahead's window advances only when it is decoded:
                # run it rather than a bare plain step, so its n-gram pool can fill.
                best = p
        for d in self.drafters:
            if d.name in self.expensive and self.acceptance[d.name].expected_accepted(max_tokens) > best_value:
                best = d.propose(history, max_tokens)
                best_value = self.acceptance[d.name].expected_accepted(tree_depth(best))
        self._last = (best.drafter, tree_depth(best)) if tree_depth(best) else None
        return best

    @property
    def cheap(self) -> bool:
        """Whether every member is a cheap lookup (then the engine proposes before planning)."""
        return all(getattr(d, "cheap", False) for d in self.drafters)

    def verified(self, depth: int) -> None:
        """The last proposal was verified only ``depth`` deep (0: not at all); judge it on that much."""
        if self._last is not None:
            self._last = (self._last[0], min(depth, self._last[1])) if depth else None

    def accepted(self, history: Sequence[int], n_accepted: int) -> None:
        chosen = None
        if self._last is not None:
            chosen, depth = self._last
            if chosen in self.acceptance:
                self.acceptance[chosen].update(depth, n_accepted)
        self._last = None
        for d in self.drafters:
            # Every drafter follows the history; only the chosen one had tokens accepted.
            d.accepted(history, n_accepted if d.name == chosen else 0)

    def reset(self) -> None:
        self._last = None
        for d in self.drafters:
            d.reset()
