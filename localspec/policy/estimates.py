"""What the controller learns about its drafters: acceptance by draft position.

The controller (``localspec.policy.controller``) ranks a drafter drafting k tokens by
the tokens a step then emits, E(k) = 1 + sum_{i<k} prod_{j<=i} a_j, where a_j
is the acceptance at position j once the positions before it were kept. This
module holds the estimates of a_j and how they learn; the controller owns
the costs and the decisions. Pure logic: no llama.cpp, no timing.

Acceptance estimates forget: each observation of a drafter discounts its
past evidence by ``decay`` (memory ~20 observations, so a drafter that
degrades is dropped within a few dozen steps, at any temperature), and every
step a drafter goes unobserved discounts it by ``idle_decay`` (so evidence
from long ago weighs little against a fresh probe).

A lookup decides no length: it offers its candidates as deep as the
controller lets a step draft, with their ``Evidence`` (match length, occurrences, how
the occurrences agree by depth). The controller learns acceptance by
position per class of evidence (``evidence_class``: match-length class
times agreement class), from verified steps and from the scored unused
offers, each class with its own ``DecayingAcceptance`` starting from a prior
that grows with the match length (``evidence_prior``), and never trusts a
depth more than the occurrences agree on it. As the classes are many and
each is sparse, one calibration per drafter (accepted over expected draft
tokens of its recent verified steps, at most 1) tempers what their priors
expect: it scales the share of a class's estimate that still comes from the
prior (a class that has seen the text answers for itself), and it ages on
every step that verifies nothing of the drafter, so a low value cannot keep
the drafter out of a copy for good. So
a long verbatim copy drafts long once its class has proved itself, and a
1-gram guess whose continuations split drafts short or not at all, by the
same cost rule as every other option.

Copies part where lines start: a rewrite follows its source through a line
and changes how the next one begins (a heading for a numbered item, a new
name). Where in a draft that happens depends on where the draft began, so
learned by draft position it smeared a dip over every draft of the class
(one class read 0.95/0.98/0.99 then 0.75 at position 4, and drafted 3 tokens
four steps running where one 11-token step would have done). So a draft
token that starts a line (after a token that ``ends_line``) gets its own
rate, learned per drafter from every such token verified or scored
(``line_start_rate``), as the most its position can get; and a draft that
broke right there teaches its class only the positions before. Replaying
the test models' bench replies: SmolLM2's share of what a controller that
knows the text reaches went from 0.783 to 0.823, Gemma's from 0.801 to 0.807.

A plain step emits one token, which judges only a proposal's first position,
so a lookup's offer the step did not verify is kept (``UnusedProposals``) and
scored against the text position by position as it comes.
"""

from __future__ import annotations

import bisect
import heapq
from dataclasses import dataclass, field
from typing import Sequence

from localspec.acceptance import ROOT
from localspec.drafting.base import Evidence, Proposal, TreeProposal
from localspec.drafting.tree import CandidateTree
from localspec.token_ids import common_prefix


# --- acceptance with forgetting ----------------------------------------------
@dataclass
class DecayingAcceptance:
    """Running acceptance by draft position that forgets, with a prior worth ``weight`` trials.

    The one acceptance estimator (the controller keeps one per drafter, and
    one per class of a lookup's evidence). Two properties matter:

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

    def update(self, drafted_depth: int, accepted: int, *, idle_steps: int = 0, known: int = 0) -> None:
        """One outcome: positions < min(depth, accepted + 1) were reached, the first ``accepted`` kept.

        ``known``: positions of this same outcome already counted (an outcome learned in parts, as
        the text reveals it): only the positions after them count now, and the evidence forgets
        only with the first part (one outcome, one discount).
        """
        if idle_steps > 0:
            self.forget(self.idle_decay ** idle_steps)
        reached = min(drafted_depth, accepted + 1)
        if reached <= known:
            return
        while len(self.reached) < reached:
            self.reached.append(0.0)
            self.kept.append(0.0)
        # Every position forgets, reached or not: after a drafter degrades, its deep
        # positions are rarely reached, and their old (good) evidence must not linger;
        # they fall back to the shallower positions' estimate instead.
        if known == 0:
            self.forget(self.decay)
        for i in range(known, reached):
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


# --- trees a drafter grows -------------------------------------------------------
# A model drafter asked for a tree (``Drafter.propose_tree``) offers, besides its most probable
# child, further children drawn at the same node. Once the most probable (first drawn) child is
# rejected, the next sibling is tried against what is left (recursive rejection sampling, or the
# target's argmax at temperature 0); how often that rescues the step is learned per drafter, by
# sibling rank, as ``siblings``: the rate at which sibling r + 1 is REJECTED once the first r + 1
# children were (a DecayingAcceptance, whose "kept" is a rejection, so a deeper rank inherits the
# shallower one's rate). Its prior: a second child catches a quarter of what the first missed.
SIBLING_REJECT_PRIOR = 0.75


def tree_expected_tokens(rates: Sequence[float], sibling_rejects: Sequence[float], *, depth: int,
                         extra: int, width: int) -> list[float]:
    """E for a tree ``depth`` deep with 0..``extra`` nodes beyond its chain: out[m] for m extra nodes.

    The tree planned for is the chain (each node its parent's first child, kept at position j with
    probability ``rates[j]`` once the ones before were) with m further children placed at the
    chain's depths, at most ``width`` children a node, each where it adds the most. A further child
    is taken to have no children of its own (what the drafter grows below one only adds), so a
    sibling kept ends the walk: with w children at depth j,

        E = 1 + sum_i prod_{j<=i} a_j + sum_j reach_j (1 - a_j) (1 - prod_{r<w_j-1} b_r),

    reach_j = prod_{i<j} a_i the chance the walk gets to depth j, b_r = ``sibling_rejects[r]``
    the chance sibling r + 1 is rejected once the children before it were. Adding siblings one at a
    time where the gain is largest is optimal here: each depth's gains shrink with every sibling
    added (a product of rates below 1), so the greedy choice of m nodes is the best m-node choice.
    Best-first growth (``draft_tree.grow_tree``) places them where the draft is least sure, which
    is where this model puts them when the draft's doubt and the target's rejections agree.
    """
    chain = [1.0]
    reach = 1.0
    reaches: list[float] = []
    for j in range(depth):
        reaches.append(reach)
        reach *= rates[j]
        chain.append(chain[-1] + reach)
    base = chain[depth]
    out = [base]
    if extra <= 0 or width <= 1 or depth <= 0:
        return out + [base] * max(0, extra)
    # the gain of the next sibling at each depth j: reach_j (1 - a_j) prod_{r < n_j} b_r * (1 - b_{n_j})
    added = [0] * depth
    missed = [reaches[j] * (1.0 - rates[j]) for j in range(depth)]  # the share a next sibling may rescue

    def gain(j: int) -> float:
        n = added[j]
        if n >= width - 1 or n >= len(sibling_rejects):
            return 0.0
        return missed[j] * (1.0 - sibling_rejects[n])

    heap = [(-gain(j), j) for j in range(depth)]
    heapq.heapify(heap)
    total = base
    for _ in range(extra):
        g, j = heapq.heappop(heap) if heap else (0.0, -1)
        if j < 0 or -g <= 0.0:
            out.append(total)
            continue
        total += -g
        missed[j] *= sibling_rejects[added[j]]
        added[j] += 1
        heapq.heappush(heap, (-gain(j), j))
        out.append(total)
    return out


# --- acceptance by evidence -------------------------------------------------------
# A lookup's proposal comes with its evidence (``Evidence``), and its acceptance is
# learned per class of evidence: match lengths 1, 2, 3, 4, 5-7, 8-15, 16-31, 32+ ...
MATCH_CLASSES = (1, 2, 3, 4, 5, 8, 16, 32)
# ... times how the occurrences agree on the first token: seen once, several agreeing,
# a majority, split (below half); or, whatever
# its agreement, a match with one token substituted (``Evidence.gapped``), or a loop carried on, by how
# long it has run (``Evidence.loop``) instead of the match length: learned apart from exact ones.
AGREEMENT_CLASSES = ("once", "unanimous", "majority", "split", "gapped", "loop")
# A class's prior counts as this many observations. A class is sparse (few proposals rest on
# each), and on a CPU a long draft that fails costs several plain steps, so a class must show
# more than one lucky outcome before it drafts deep (replaying the test models' own replies:
# 4 beat 2 on rewriting and extraction alike).
EVIDENCE_PRIOR_WEIGHT = 4.0
# The rate of a draft token that starts a line (``_DrafterState.line_start_rate``): its prior, the
# prior's weight in observations, and the decay of the evidence per observation (memory ~30).
LINE_START_PRIOR = 0.6
LINE_START_WEIGHT = 4.0
LINE_START_DECAY = 0.97
# The calibration (``_DrafterState.calibration``): its prior, in draft tokens at a ratio of 1,
# and the decay of its sums per verified step (memory ~30 steps).
CALIBRATION_PRIOR = 8.0
CALIBRATION_DECAY = 0.97


def evidence_class(evidence: Evidence) -> tuple[int, int]:
    """(match-length class, agreement class) of ``evidence`` (see MATCH_CLASSES, AGREEMENT_CLASSES)."""
    if evidence.loop:
        return bisect.bisect_right(MATCH_CLASSES, evidence.loop) - 1, AGREEMENT_CLASSES.index("loop")
    match = max(0, bisect.bisect_right(MATCH_CLASSES, evidence.match_len) - 1)
    if evidence.gapped:
        return match, AGREEMENT_CLASSES.index("gapped")
    first = evidence.support[0] if evidence.support else 0.0
    if evidence.occurrences <= 1:
        agreement = 0
    elif first >= 0.999:
        agreement = 1
    else:
        agreement = 2 if first >= 0.5 else 3
    return match, agreement


def evidence_prior(match_class: int) -> float:
    """The prior acceptance of a match of ``MATCH_CLASSES[match_class]`` tokens or more: m / (m + 1).

    Only a starting point worth a few observations (``EVIDENCE_PRIOR_WEIGHT``): a single shared
    token is an even bet, a 32-token match nearly certain; what the text really does is learned
    within a few steps.
    """
    m = MATCH_CLASSES[match_class]
    return m / (m + 1.0)


# --- what a proposal offers ---------------------------------------------------
def tree_confidence(tree: CandidateTree) -> tuple[float, ...]:
    """A tree's own chance of being right at depth d+1 once right up to d, for each depth.

    A node's probability is the share of the continuations' weight that
    starts with its path, so the mass at depth d+1 over the mass at depth d
    is that chance.
    """
    depth = max(tree.depths, default=0)
    mass = [1.0] + [0.0] * depth
    for d, p in zip(tree.depths, tree.probs):
        mass[d] += p
    return tuple(min(1.0, mass[d + 1] / mass[d]) if mass[d] > 0 else 0.0 for d in range(depth))


def best_path(tree: CandidateTree) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """The tokens along the most probable child at each depth, and the chance of each given the ones before."""
    probs = tree.probs
    best: dict[int, int] = {}  # parent -> its most probable child (the first of equals)
    for i, parent in enumerate(tree.parents):
        b = best.get(parent)
        if b is None or probs[i] > probs[b]:
            best[parent] = i
    tokens: list[int] = []
    confidence: list[float] = []
    node, prob = best.get(ROOT), 1.0
    while node is not None:
        tokens.append(tree.tokens[node])
        confidence.append(min(1.0, probs[node] / prob) if prob > 0 else 0.0)
        prob = probs[node]
        node = best.get(node)
    return tuple(tokens), tuple(confidence)


def proposal_branches(proposal: Proposal | TreeProposal) -> tuple[tuple[int, ...], ...]:
    """The candidate continuations of a proposal."""
    if isinstance(proposal, TreeProposal):
        return proposal.tree.branches
    return (tuple(proposal.tokens),) if proposal.tokens else ()


@dataclass
class DrafterEstimates:
    """What is learned about one drafter's acceptance: by position, by class of evidence, at line
    starts, and the calibration that tempers the classes while they learn."""

    acceptance: DecayingAcceptance
    by_evidence: dict[tuple[int, int], DecayingAcceptance] = field(default_factory=dict)  # see evidence_class
    # Accepted over expected draft tokens of the recent verified steps planned from evidence
    # (decaying sums, a prior of CALIBRATION_PRIOR tokens at 1): the classes are many and each
    # sparse, so while they are still learning, this one ratio across them keeps their
    # optimism in check (see calibration).
    kept_tokens: float = 0.0
    expected_kept: float = 0.0
    line_starts: float = 0.0        # decaying count of line-starting draft tokens reached ...
    line_starts_kept: float = 0.0   # ... and kept
    siblings: DecayingAcceptance = field(default_factory=lambda: DecayingAcceptance(prior=SIBLING_REJECT_PRIOR))
    """A tree's further children: how often each rank is rejected once those before it were (see
    tree_expected_tokens)."""

    def learn_walk(self, walk: Sequence[tuple[int, int]]) -> tuple[int, int]:
        """Learn from a tree this drafter grew, verified down ``walk`` (``StepEvent.walk``): every node
        where the first child was rejected teaches ``siblings`` how its further children fared.
        Returns (positions drafted, kept) of the chain within it (each node's first child), which is
        what ``acceptance`` learns: the first child's test is the chain's."""
        leading = 0
        while leading < len(walk) and walk[leading][1] == 0:
            leading += 1
        drafted = leading + (1 if leading < len(walk) and walk[leading][0] > 0 else 0)
        for children, rank in walk:
            if rank != 0 and children >= 2:
                tried = children - 1  # the further children
                self.siblings.update(tried, rank - 1 if rank > 0 else tried)
        return drafted, leading

    @property
    def line_start_rate(self) -> float:
        """How often a draft token that starts a line was kept (see the module notes)."""
        return ((self.line_starts_kept + LINE_START_PRIOR * LINE_START_WEIGHT)
                / (self.line_starts + LINE_START_WEIGHT))

    def learn_evidence(self, evidence: Evidence, starts: Sequence[int], drafted: int, accepted: int, *,
                       known: int = 0) -> None:
        """One outcome of a proposal resting on ``evidence`` whose positions ``starts`` start a line
        (``DecayingAcceptance.update``'s arguments): those positions teach ``line_start_rate``; the
        class learns the positions before a break at one of them, not the break."""
        reached = min(drafted, accepted + 1)
        for i in starts:
            if known <= i < reached:
                self.line_starts = LINE_START_DECAY * self.line_starts + 1.0
                self.line_starts_kept = LINE_START_DECAY * self.line_starts_kept + (1.0 if i < accepted else 0.0)
        if accepted < drafted and accepted in starts:
            drafted = accepted  # the line's start broke the copy, not the class's depth
        self.evidence_acceptance(evidence).update(drafted, accepted, known=known)

    def calibrate(self, kept: float, expected: float, scale: float) -> None:
        """Learn from a proposal that kept ``kept`` draft tokens where ``expected`` were expected (with
        the class's ``scale``, see calibrated)."""
        raw = expected / scale  # what the class itself expected
        self.kept_tokens = CALIBRATION_DECAY * self.kept_tokens + kept
        self.expected_kept = CALIBRATION_DECAY * self.expected_kept + raw

    def age_calibration(self, steps: int = 1) -> None:
        """``steps`` steps that verified no proposal of this drafter: the calibration's evidence ages as if
        observed. Learned only from the drafter's own verified steps, a low calibration would
        otherwise lock it out for good: it keeps the drafter from drafting, so nothing corrects
        it, while the classes (scored on every offer) show the text is being copied again."""
        decay = CALIBRATION_DECAY ** steps
        self.kept_tokens *= decay
        self.expected_kept *= decay

    @property
    def calibration(self) -> float:
        """Kept over expected draft tokens of the recent verified steps planned from evidence (at most 1)."""
        return min(1.0, (self.kept_tokens + CALIBRATION_PRIOR) / (self.expected_kept + CALIBRATION_PRIOR))

    def calibrated(self, estimate: DecayingAcceptance) -> float:
        """The factor applied to the draft tokens a class's ``estimate`` expects: the calibration, on
        the share of the estimate its prior still makes (weight / (weight + observations) at the first
        position). The calibration corrects the classes' priors while they are learning; a class
        that has seen the text itself (every offer is scored) answers for its own estimate, so a
        copy that has proved itself is not tempered by misses elsewhere."""
        seen = estimate.reached[0] if estimate.reached else 0.0
        cal = self.calibration
        return cal + (1.0 - cal) * seen / (seen + estimate.weight)

    def evidence_acceptance(self, evidence: Evidence) -> DecayingAcceptance:
        """The acceptance estimate for proposals resting on evidence like ``evidence``."""
        key = evidence_class(evidence)
        est = self.by_evidence.get(key)
        if est is None:
            est = self.by_evidence[key] = DecayingAcceptance(prior=evidence_prior(key[0]),
                                                             weight=EVIDENCE_PRIOR_WEIGHT)
        return est


class UnusedProposals:
    """Proposals a step did not verify, scored against the text that follows them as it comes.

    A plain step emits one token, which judges only a proposal's first
    position; so an unused proposal stays pending while the text follows it,
    and each step reports the positions the text has newly judged (``known``:
    how many were reported before), until its depth is covered or the text
    parts from it (``Controller.observe_unused``). The controller so learns a
    lookup's acceptance by position without paying for a verification, and
    learns it while the text is still copying: a proposal 15 tokens deep
    teaches its first position one step after it was made, not 15.
    """

    def __init__(self) -> None:
        # [history index, name, branches, evidence, positions reported]
        self._pending: list[list] = []

    def __len__(self) -> int:
        return len(self._pending)

    def add(self, start: int, name: str, branches: Sequence[Sequence[int]], evidence: Evidence | None = None) -> None:
        """``name``'s proposal for the text from ``history[start]`` on (resting on ``evidence``)."""
        if any(branches):
            self._pending.append([start, name, tuple(tuple(b) for b in branches if b), evidence, 0])

    def ready(self, history: Sequence[int]
              ) -> list[tuple[str, tuple[tuple[int, ...], ...], list[int], Evidence | None, int]]:
        """(name, branches, what followed so far up to their depth, evidence, positions reported before)
        of each proposal whose outcome the history has told more of since the last call."""
        out, pending = [], []
        for entry in self._pending:
            start, name, branches, evidence, known = entry
            depth = max(len(b) for b in branches)
            followed = list(history[start : start + depth])
            matched = max(common_prefix(b, followed) for b in branches)
            done = len(followed) >= depth or matched < len(followed)
            if done or len(followed) > known:
                out.append((name, branches, followed, evidence, known))
                entry[4] = len(followed)
            if not done:
                pending.append(entry)
        self._pending = pending
        return out

    def clear(self) -> None:
        self._pending.clear()
