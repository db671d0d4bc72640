"""The one drafter protocol that every drafter stands behind.

A drafter proposes up to ``draft_len`` tokens that continue ``history`` (the
prompt plus everything generated so far, the last token included). After the
target has verified them, the drafter is told how many it kept and which
token the target produced next, so it can update its state (KV cache, n-gram
index). ``reset`` forgets everything tied to the current sequence.

Which drafter drafts, and how much, is decided elsewhere: the controller
(``localspec.policy.controller``) plans each step from what every drafter declares
here (``cheap``, ``batch_extra_tokens``, ``behind``) and the measured costs.
A lookup decides no length: it offers its candidates as deep as it is asked,
with the ``Evidence`` behind them (match length, occurrences, agreement), and
the controller turns that evidence into expected acceptance.

Proposals are a chain (``Proposal``) or a trie of candidates (``TreeProposal``).
Chains come in two kinds:

* ``probs`` set: the drafter *sampled* each token from a distribution q (a
  draft model). Verification uses exact rejection sampling with p and q.
* ``probs`` None: the tokens are deterministic guesses (n-gram lookup, a
  datastore, lookahead). Greedy verification keeps them while they equal the
  target's argmax; sampled verification treats them as drawn from a one-hot q
  (``acceptance.accept_sampled``): a token is kept with probability p(x) and a
  rejection draws from p with x taken out, so the output is exactly plain
  decoding's. Trees of such guesses are walked with the target's own choices
  (``acceptance.accept_tree``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, ClassVar, Protocol, Sequence, runtime_checkable

import numpy as np

from localspec.drafting.tree import CandidateTree, tree_from_branches
from localspec.sampling import Sampler, argmax, sample


@dataclass(frozen=True)
class Evidence:
    """What a lookup's proposal rests on, for the controller to judge (a lookup decides no length).

    ``match_len``: tokens of context matched; ``occurrences``: earlier
    occurrences of that match; ``support[d]``: the share of the occurrences
    considered whose continuation agrees with the proposal's most probable
    path up to depth d + 1 (non-increasing, one entry per proposed depth).
    ``gapped``: the match has one token substituted (``match_len`` counts the
    others), as a list's next item matches the last one but for its number.
    ``loop``: the proposal carries on a loop, the history's end repeating a
    span of a few tokens over and over; ``loop`` tokens of it so far (0: no
    loop). A greedy decode caught in a loop rarely leaves it, and the run's
    length is the evidence a capped ``match_len`` cannot show.
    """

    match_len: int
    occurrences: int
    support: tuple[float, ...] = ()
    gapped: bool = False
    loop: int = 0

    def agreement(self, depth: int) -> tuple[float, ...]:
        """The evidence's own chance of depth d + 1 once right up to d, for d < ``depth``."""
        out, prev = [], 1.0
        for s in self.support[:depth]:
            out.append(min(1.0, s / prev) if prev > 0 else 0.0)
            prev = s
        return tuple(out)


@dataclass(frozen=True)
class Proposal:
    """Tokens proposed to follow the history, in order.

    ``probs[i]`` is the full draft distribution q that ``tokens[i]`` was sampled
    from (float array over the vocabulary), or ``probs`` is None for
    deterministic drafts. ``evidence``: what a lookup's tokens rest on (None
    for drafters that have none to offer).
    """

    tokens: tuple[int, ...] = ()
    probs: tuple[np.ndarray, ...] | None = None
    drafter: str = ""
    evidence: Evidence | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.probs is not None and len(self.probs) != len(self.tokens):
            raise ValueError("a proposal needs one draft distribution per token")

    def __len__(self) -> int:
        return len(self.tokens)


@dataclass(frozen=True)
class BatchExtra:
    """Tokens a drafter wants computed in the verification batch beside the candidates.

    Lookahead decoding runs its Jacobi window in the same ``llama_decode`` call
    as verification. ``positions`` are offsets from the history's last token
    (which sits at offset 0); ``seq_ids`` are the drafter's own sequence numbers
    0..k-1 (the step maps them onto free llama.cpp sequences, each of which sees
    the whole history); ``on_logits(row)`` is called after the decode with a
    function returning the logits of extra token ``j`` (None when not output).
    """

    tokens: tuple[int, ...]
    positions: tuple[int, ...]
    seq_ids: tuple[tuple[int, ...], ...]
    outputs: tuple[bool, ...]
    on_logits: Callable[[Callable[[int], np.ndarray]], None]

    @property
    def n_seqs(self) -> int:
        return 1 + max((s for ids in self.seq_ids for s in ids), default=-1)


@dataclass(frozen=True)
class TreeProposal:
    """Several candidate continuations sharing their prefixes, as one trie (deterministic, or sampled
    with ``child_q``).

    All branches are verified in one batch: a token shared by several branches
    is computed once, carrying the sequence ids of every branch below it.
    """

    tree: CandidateTree = field(default_factory=lambda: tree_from_branches(()))
    drafter: str = ""
    extra: BatchExtra | None = None
    evidence: Evidence | None = field(default=None, compare=False)  # for the most probable path (see Proposal)
    child_q: dict[tuple[int, ...], np.ndarray] | None = field(default=None, compare=False)
    """Sampled children (a draft model's tree): for each node with children, keyed by its token path from
    the root (``()`` for the root), the distribution q its children were drawn from, without replacement,
    in node order. Verified by recursive rejection sampling (``acceptance.accept_siblings``). None: the
    children are deterministic candidates, verified by following the target's own choice."""
    probs = None  # a chain's q; a tree's are ``child_q``

    @property
    def tokens(self) -> tuple[int, ...]:
        """The path that follows the most probable child at each depth (a chain's worth)."""
        t = self.tree
        out: list[int] = []
        node = -1  # the root
        while True:
            kids = [i for i in range(len(t)) if t.parents[i] == node]
            if not kids:
                return tuple(out)
            node = max(kids, key=lambda i: t.probs[i])
            out.append(t.tokens[node])

    def __len__(self) -> int:
        return len(self.tree)


@runtime_checkable
class Drafter(Protocol):
    """Everything the controller and the speculative step use of a drafter.

    ``DrafterBase`` gives every member but ``name``, ``propose`` and
    ``accepted`` a default; a drafter says what it offers by overriding them.
    """

    name: str
    cheap: bool
    """``propose`` is a deterministic lookup costing microseconds with no state
    the step depends on, so the controller may ask it before planning every
    step, plan with what it offers, and score its unused proposals for free."""
    batch_extra_tokens: int
    """Tokens every verification batch of this drafter carries besides the
    candidates (lookahead's Jacobi window)."""
    tree_width: int
    """The most children a node may have in a tree this drafter grows when the
    controller asks for one (``propose_tree``); 0: it drafts chains only."""
    follows_each_step: bool
    """``accepted`` must see every step, those that used none of its proposal
    too (lookahead moves its window on). False: it does nothing then (it
    catches up from the history at its next ``propose``), so a step the
    controller takes without planning (a pause) leaves it out."""

    def propose(self, history: Sequence[int], draft_len: int) -> "Proposal | TreeProposal":
        """Propose up to ``draft_len`` tokens (a tree: up to that depth) that continue ``history``.

        A ``cheap`` drafter offers all it has up to ``draft_len``, with its ``evidence``:
        the controller cuts the proposal to the length it chooses."""
        ...

    def propose_tree(self, history: Sequence[int], draft_len: int, nodes: int) -> "Proposal | TreeProposal":
        """Propose a tree of at most ``nodes`` tokens, ``draft_len`` deep, grown where the draft's
        cumulative probability is highest (``draft_tree.grow_tree``); the controller chose ``nodes`` by
        cost. A drafter whose ``tree_width`` is 0 proposes its chain."""
        ...

    def behind(self, history: Sequence[int]) -> int:
        """Tokens this drafter must decode before it can propose for ``history`` (a draft
        model's prefill and catch-up; 0 for a lookup)."""
        ...

    def verified(self, depth: int) -> None:
        """The last proposal was verified ``depth`` deep (0: not at all); called before ``accepted``."""
        ...

    def accepted(self, history: Sequence[int], n_accepted: int) -> None:
        """Learn the outcome of the step.

        ``history`` now ends with the tokens that were kept: the first
        ``n_accepted`` proposed tokens and the target's own token after them.
        Drafters whose proposal was not used are called too, with 0.
        """
        ...

    def reset(self) -> None:
        """A new sequence begins: forget, or stop trusting, the state tied to the last one. What a drafter
        keeps of it (a draft model's or a head's cache, the n-gram index, lookahead's indexed history) is
        compared with the next history before use, so a chat's next turn pays only for what is new."""
        ...

    def remember_reply(self, reply: Sequence[int], context: Sequence[int]) -> bool:
        """After a finished reply: keep ``reply`` (with the tail of ``context``, the prompt it
        answered) wherever this drafter learns from past replies (the n-gram drafter's personal
        store, appended to its file). False: this drafter keeps none. Raises ``StoreError`` when
        the store cannot be written (the reply itself is delivered all the same)."""
        ...

    def close(self) -> None:
        """Free what the drafter holds outside Python (a listener on the target's decodes)."""
        ...


class DrafterBase:
    """The defaults of the ``Drafter`` protocol: not cheap, no extra batch tokens, no trees, told of every
    step, never behind, nothing remembered across replies, nothing to free."""

    cheap: ClassVar[bool] = False
    batch_extra_tokens: ClassVar[int] = 0
    tree_width: int = 0
    follows_each_step: ClassVar[bool] = True

    def propose_tree(self, history: Sequence[int], draft_len: int, nodes: int) -> "Proposal | TreeProposal":
        return self.propose(history, draft_len)  # type: ignore[attr-defined]

    def behind(self, history: Sequence[int]) -> int:
        return 0

    def verified(self, depth: int) -> None:
        pass

    def reset(self) -> None:
        pass

    def remember_reply(self, reply: Sequence[int], context: Sequence[int]) -> bool:
        return False

    def close(self) -> None:
        pass


def draft_token(logits: np.ndarray, sampler: Sampler, p_min: float, history: Sequence[int] = (),
                path: Sequence[int] = ()) -> tuple[int, np.ndarray | None] | None:
    """The token a model-based drafter (a draft model, an MTP head) proposes from ``logits``.

    Greedy: the argmax, with no distribution (verification matches it). Otherwise a
    sample from q, the target's own sampling settings applied to the drafter's
    logits, returned with q so rejection sampling can use it. None when the
    drafter's top probability is below ``p_min`` (it doubts itself: stop drafting).

    ``history`` + ``path`` (the tokens this proposal drafted so far): what precedes the row, for the
    sampler's shaper (a grammar), which shapes the draft's logits as it shapes the target's row there,
    so a draft never proposes what the target's row rules out. None when it rules out everything.
    """
    if sampler.shaper is not None:
        logits = sampler.shaper.shape(logits, history, path)
        if not np.isfinite(logits.max()):
            return None
    if sampler.params.greedy:
        if p_min > 0.0 and top_probability(logits) < p_min:
            return None
        return argmax(logits), None
    q = sampler.draft_distribution(logits)
    if p_min > 0.0 and float(q.max()) < p_min:
        return None
    return sample(q, sampler.rng), q


def draft_chain(logits_at: Callable[[int, Sequence[int]], np.ndarray | None], sampler: Sampler, p_min: float,
                history: Sequence[int], draft_len: int, drafter: str) -> Proposal:
    """A chain of up to ``draft_len`` tokens from a model-based drafter, each picked by ``draft_token``.

    ``logits_at(depth, drafted)`` gives the logits the token at ``depth`` is drawn from, ``drafted`` being the
    tokens picked before it (the drafter feeds the last of them to its model here, so a chain's last token is
    never fed); None stops the chain (the drafter cannot go on). The proposal carries each token's q
    unless sampling is greedy.
    """
    tokens: list[int] = []
    probs: list[np.ndarray] = []
    for depth in range(draft_len):
        logits = logits_at(depth, tokens)
        if logits is None:
            break
        picked = draft_token(logits, sampler, p_min, history, tokens)
        if picked is None:
            break
        tok, q = picked
        tokens.append(tok)
        if q is not None:
            probs.append(q)
    return Proposal(tuple(tokens), None if sampler.params.greedy else tuple(probs), drafter)


def top_probability(logits: np.ndarray) -> float:
    """The softmax of ``logits`` at its maximum (0 when nothing is finite)."""
    m = float(logits.max())
    return 1.0 / float(np.exp(logits - m, dtype=np.float64).sum()) if np.isfinite(m) else 0.0


