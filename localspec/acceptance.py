"""Deciding how many drafted tokens the target keeps (Leviathan et al. 2023, Chen et al. 2023).

Two verifiers, both exact: the tokens they emit are distributed as if the target had generated
them one at a time on its own.

* :func:`accept_greedy` for greedy decoding: keep drafted tokens while they equal the target's
  argmax; the first mismatch is replaced by the target's argmax.
* :func:`accept_sampled` for sampling: modified rejection sampling against the target
  distributions p (and the draft distributions q the tokens were sampled from).

Both return a :class:`Verdict`. Every round emits ``n_accepted + 1`` tokens: the accepted draft
prefix, then ``next_token`` (a correction, or the bonus token if everything was accepted).

* :func:`accept_tree` for a tree of deterministic candidates (several continuations verified in
  one batch): at each position the target chooses its token (argmax, or a sample from its
  distribution), and the walk follows the child holding that token. Children of a node hold
  distinct tokens, so at most one child matches; when none does, the target's token is the next
  token and the walk ends. Every emitted token is the target's own choice at its position, so the
  output is exactly plain decoding's, greedy or sampled.
* :func:`accept_siblings` for several SAMPLED candidates at one position (a draft model's tree,
  SpecInfer / SpecTr multi-draft verification): recursive rejection sampling over the siblings,
  each tried against what the earlier ones left of p; :func:`draw_siblings` draws them. Its proof
  is in the notes below the function.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import numpy as np

from localspec.sampling import sample

ROOT = -1  # a tree's root: the history's last token, not a node; the parent index of depth-1 nodes


class Tree(Protocol):
    """What the tree rule needs of a candidate tree (``drafting.tree.CandidateTree``)."""

    def __len__(self) -> int: ...

    def child(self, node: int, token: int) -> int | None:
        """The child of ``node`` (``ROOT``: the root) holding ``token``, or None."""
        ...


class SampledTree(Tree, Protocol):
    """A tree whose children were drawn from the draft's distributions (``accept_sampled_tree``)."""

    parents: Sequence[int]  # each node's parent (``ROOT`` for depth 1)
    tokens: Sequence[int]  # each node's token


@dataclass(frozen=True)
class Verdict:
    """The outcome of verifying one draft."""

    n_accepted: int
    """How many draft tokens were kept, left to right."""
    next_token: int
    """The target's token after them: the correction on rejection, or the bonus token when all
    were accepted."""


def accept_greedy(draft: Sequence[int], target_choice: Sequence[int]) -> Verdict:
    """Verify a draft against the target's greedy choices.

    ``target_choice[i]`` is the target's argmax at the position of ``draft[i]`` (i.e. given the
    context and ``draft[:i]``); it has ``len(draft) + 1`` entries, the last being the bonus.
    Drafted tokens are accepted while they equal the target's choice; ``next_token`` is
    ``target_choice[n_accepted]``. The emitted tokens are exactly what greedy decoding with the
    target alone would produce. Raises ValueError if the lengths do not fit.
    """
    if len(target_choice) != len(draft) + 1:
        raise ValueError(
            f"target_choice needs len(draft) + 1 = {len(draft) + 1} entries, "
            f"got {len(target_choice)}"
        )
    n = 0
    while n < len(draft) and int(draft[n]) == int(target_choice[n]):
        n += 1
    return Verdict(n_accepted=n, next_token=int(target_choice[n]))


def accept_sampled(
    draft: Sequence[int],
    q: Sequence[np.ndarray] | None,
    p: Sequence[np.ndarray],
    rng: np.random.Generator,
) -> Verdict:
    """Verify a sampled (or deterministic) draft by exact rejection sampling.

    ``p`` holds ``len(draft) + 1`` target distributions (as returned by
    :func:`localspec.sampling.distribution`): ``p[i]`` is the target's distribution at the
    position of ``draft[i]``, and ``p[len(draft)]`` the one after the whole draft. ``q`` holds
    the ``len(draft)`` draft distributions the tokens were sampled from, or is None for
    deterministic drafts, which are treated as sampled from a one-hot q at the drafted token.

    For i in order, with x = draft[i]: accept x with probability min(1, p_i(x) / q_i(x)); a
    token with p_i(x) >= q_i(x) is accepted without drawing. On the first rejection, draw
    ``next_token`` from the residual norm(max(0, p_i - q_i)) and stop. If every token was
    accepted, draw the bonus ``next_token`` from ``p[len(draft)]``. Each draw is one
    ``rng.random()`` (acceptance tests) or one :func:`localspec.sampling.sample`.

    Guarantee: the emitted sequence (accepted tokens, then ``next_token``) has exactly the
    distribution of sampling each token from the target's p in turn.

    ``p`` may be a lazy sequence: it is indexed in order and only as far as needed (up to the
    first rejection, or the bonus), so target rows after a rejection are never computed.

    Raises ValueError (a programming error) when the lengths or shapes do not fit, a token id
    is out of range, or a drafted token has probability 0 under the q it was drawn from.
    """
    n_draft = len(draft)
    if len(p) != n_draft + 1:
        raise ValueError(f"p needs len(draft) + 1 = {n_draft + 1} distributions, got {len(p)}")
    if q is not None and len(q) != n_draft:
        raise ValueError(f"q needs len(draft) = {n_draft} distributions, got {len(q)}")
    vocab = -1  # fixed by the first distribution we look at

    def target(i: int) -> np.ndarray:
        nonlocal vocab
        d = _as_dist(p[i], "p", i)
        if vocab < 0:
            vocab = d.size
        elif d.size != vocab:
            raise ValueError(f"p[{i}] has {d.size} entries, p[0] has {vocab}")
        return d

    for i in range(n_draft):
        p_i = target(i)
        q_i = None if q is None else _as_dist(q[i], "q", i)
        if q_i is not None and q_i.size != vocab:
            raise ValueError(f"q[{i}] has {q_i.size} entries, p[0] has {vocab}")
        x = int(draft[i])
        if not 0 <= x < vocab:
            raise ValueError(f"draft[{i}] = {x} is not a token id for a vocabulary of {vocab}")
        px = float(p_i[x])
        qx = 1.0 if q_i is None else float(q_i[x])
        if not qx > 0.0:
            raise ValueError(
                f"draft[{i}] = {x} has probability {qx} under q[{i}], "
                "so it cannot have been sampled from it"
            )

        # Why this is exact. x arrives with probability q(x) and survives with probability
        # min(1, p(x)/q(x)), so token y is emitted here through acceptance with probability
        # q(y) * min(1, p(y)/q(y)) = min(p(y), q(y)). The rejection probability is
        # 1 - sum_y min(p(y), q(y)) = sum_y max(0, p(y) - q(y)), and the residual below is
        # max(0, p - q) divided by exactly that mass, so y is emitted through rejection with
        # probability max(0, p(y) - q(y)). Together: min(p, q) + max(0, p - q) = p(y).
        # Accepting makes the position's token draft[i] and moves on to p[i+1], which is the
        # target's distribution given it, so the argument repeats position by position.
        if px >= qx:
            continue  # min(1, p/q) = 1: accepted with certainty, no draw needed
        if rng.random() < px / qx:  # P(u < a) = a for u ~ U[0, 1)
            continue

        if q_i is None:
            # One-hot q at x: max(0, p - q) is p with x removed (p(x) < 1 = q(x) here), i.e.
            # resampling from the target conditioned on not drawing x.
            residual = p_i.copy()
            residual[x] = 0.0
        else:
            residual = p_i - q_i
            np.maximum(residual, 0.0, out=residual)
        if not residual.sum() > 0.0:
            # Rejection implies p(x) < q(x), so the residual has mass >= q(x) - p(x) > 0 in
            # exact arithmetic; it can only vanish through rounding (p, q each summing to 1
            # only approximately). Falling back to p keeps the output a valid target draw.
            residual = p_i
        return Verdict(n_accepted=i, next_token=sample(residual, rng))

    # Everything accepted: the bonus token comes straight from the target.
    return Verdict(n_accepted=n_draft, next_token=sample(target(n_draft), rng))


def _as_dist(d: np.ndarray, name: str, i: int) -> np.ndarray:
    a = np.asarray(d, dtype=np.float64)
    if a.ndim != 1 or a.size == 0:
        raise ValueError(f"{name}[{i}] must be a non-empty 1-D array, got shape {a.shape}")
    return a


@dataclass(frozen=True)
class TreeAcceptance:
    """The outcome of walking a tree with the target's choices.

    ``tokens`` are the accepted drafted tokens (along ``nodes``), and
    ``next_token`` is the target's own token after them, so the step produces
    ``len(tokens) + 1`` tokens.
    """

    tokens: tuple[int, ...]
    nodes: tuple[int, ...]
    next_token: int


def accept_tree(
    tree: Tree, target: Callable[[int], int] | Sequence[int] | np.ndarray
) -> TreeAcceptance:
    """Follow the target's choices down ``tree`` from the root.

    ``target`` gives the target's token after a node's path: either a callable
    ``target(node)`` (``node`` = ``ROOT`` for the position right after the
    history), called once per visited position, so it may sample the target's
    distribution there; or an array of ``len(tree) + 1`` tokens where entry 0
    is the root's choice and entry ``i + 1`` is node ``i``'s (e.g. the argmax
    of each row of the verification batch).

    Sampling the target once at each visited position and following the
    matching child draws every token from the target's distribution, so the
    result is exactly what plain decoding would produce.
    """
    if callable(target):
        choose = target
    else:
        choices = np.asarray(target)
        if choices.shape != (len(tree) + 1,):
            raise ValueError(f"need {len(tree) + 1} target choices (root + one per node), got {choices.shape}")
        choose = lambda node: int(choices[node + 1])  # noqa: E731 - ROOT is -1, so row 0
    tokens: list[int] = []
    nodes: list[int] = []
    node = ROOT
    while True:
        token = int(choose(node))
        nxt = tree.child(node, token)
        if nxt is None:
            return TreeAcceptance(tuple(tokens), tuple(nodes), token)
        tokens.append(token)
        nodes.append(nxt)
        node = nxt


# --- several sampled candidates at one position (multi-draft) -----------------------------------
#
# A draft model's tree offers, at one position, k children x_1..x_k drawn from its distribution q
# there. Recursive rejection sampling (SpecInfer, Miao et al. 2024; SpecTr, Sun et al. 2023;
# Jeon et al. 2024 for the without-replacement form) tries them in the order drawn:
#
#     r_1 = p
#     round j: accept x_j with probability min(1, r_j(x_j) / q_j(x_j));
#              on rejection r_{j+1} = norm(max(0, r_j - q_j)) and try x_{j+1};
#     all k rejected: emit a draw from r_{k+1}.
#
# where q_j is the distribution x_j was drawn from GIVEN x_1..x_{j-1}. Which q_j that is depends
# on how the siblings were drawn, and the residual must use it:
#
# * with replacement (i.i.d. from q): q_j = q for every j (siblings may repeat a token);
# * without replacement (what this module implements by default, ``replacement=False``): x_j is
#   drawn from q with x_1..x_{j-1} removed and renormalised, q_j = q restricted to the tokens not
#   yet drawn, divided by 1 - q(x_1) - ... - q(x_{j-1}). Using q instead of q_j here would be
#   wrong: a token the draft cannot draw again would still be subtracted from the residual as if
#   it could.
#
# Claim: for ANY history H_j of rounds 1..j-1 (the tokens drawn, all rejected), conditional on H_j
# the emitted token is distributed as r_j (a function of H_j). Then with H_1 empty and r_1 = p the
# emitted token follows p, which is what exactness asks.
#
# Proof, by induction from the last round down. After round k all were rejected and the emitted
# token is drawn from r_{k+1}: the claim for j = k + 1. Round j, given H_j: x_j has distribution
# q_j (by how it was drawn; q_j is a function of H_j). It is emitted through acceptance as token y
# with probability q_j(y) * min(1, r_j(y)/q_j(y)) = min(r_j(y), q_j(y)). It is rejected with
# probability Z_j = 1 - sum_y min(r_j(y), q_j(y)) = sum_y max(0, r_j(y) - q_j(y)); then the history
# is H_{j+1} = (H_j, x_j) and, by the induction hypothesis, the token emitted from there follows
# r_{j+1}, which depends on H_j only (not on which x_j was rejected): r_{j+1} = max(0, r_j - q_j) / Z_j.
# Summing: P(y | H_j) = min(r_j(y), q_j(y)) + Z_j * max(0, r_j(y) - q_j(y)) / Z_j = r_j(y), since
# min(a, b) + max(0, a - b) = a. (Z_j = 0 means r_j <= q_j everywhere, so r_j = q_j and round j
# accepts surely; r_{j+1} is never needed.) The step after an accepted child continues at the
# child's position with the target's distribution there, as in the chain rule, so a tree walk
# that applies this rule at every node it reaches emits exactly the target's sequence distribution.
#
# Why recursive beats independent tries: after a rejection the residual r_{j+1} is zero where q_j
# put more mass than r_j, so later siblings are judged only where the draft under-covered the
# target; acceptance of the best of k grows with k without biasing the output.


@dataclass(frozen=True)
class SiblingVerdict:
    """The outcome of verifying one position's sampled siblings."""

    accepted: int | None
    """The index (in the order given) of the accepted sibling, or None when all were rejected."""
    token: int
    """The emitted token: the accepted sibling's, or a draw from the final residual."""


def draw_siblings(q: np.ndarray, k: int, rng: np.random.Generator, *, replacement: bool = False) -> list[int]:
    """Draw ``k`` siblings from ``q`` in the order :func:`accept_siblings` tries them.

    Without replacement (the default) the draw is Gumbel-top-k: the k largest of
    log q(x) + Gumbel noise, in decreasing order, are distributed as k successive draws
    without replacement (fewer when q has fewer than k tokens of mass). With replacement:
    k independent draws.
    """
    q = _as_dist(q, "q", 0)
    if replacement:
        return [sample(q, rng) for _ in range(k)]
    support = np.flatnonzero(q > 0)
    keys = np.log(q[support]) + rng.gumbel(size=support.size)
    order = np.argsort(-keys)[: min(k, support.size)]
    return [int(support[i]) for i in order]


def accept_siblings(
    siblings: Sequence[int],
    q: np.ndarray,
    p: np.ndarray,
    rng: np.random.Generator,
    *,
    replacement: bool = False,
) -> SiblingVerdict:
    """Recursive rejection sampling over ``siblings``, drawn from ``q`` in this order (see the notes).

    ``replacement`` says how they were drawn (:func:`draw_siblings`): without replacement
    each later sibling is judged against q with the earlier siblings removed and renormalised.
    The emitted token is distributed exactly as ``p``. Raises ValueError when a sibling could
    not have been drawn (probability 0 under its q_j) or the shapes differ.
    """
    residual = _as_dist(p, "p", 0).copy()
    base = _as_dist(q, "q", 0)
    if base.size != residual.size:
        raise ValueError(f"q has {base.size} entries, p has {residual.size}")
    q_j = base.copy()
    for j, x in enumerate(int(t) for t in siblings):
        if not 0 <= x < residual.size:
            raise ValueError(f"sibling {j} = {x} is not a token id for a vocabulary of {residual.size}")
        qx = float(q_j[x])
        if not qx > 0.0:
            raise ValueError(f"sibling {j} = {x} has probability {qx} under its q, so it cannot have been drawn")
        rx = float(residual[x])
        if rx >= qx or rng.random() < rx / qx:
            return SiblingVerdict(j, x)
        residual -= q_j
        np.maximum(residual, 0.0, out=residual)
        mass = residual.sum()
        if not mass > 0.0:
            # Rejection implies r_j(x) < q_j(x), so the residual keeps mass >= q_j(x) - r_j(x) > 0 in
            # exact arithmetic; it vanishes only through rounding. p keeps the output a valid target draw.
            residual = _as_dist(p, "p", 0).copy()
        else:
            residual /= mass
        if not replacement:
            q_j[x] = 0.0
            left = q_j.sum()
            if not left > 0.0:
                break  # q's support is exhausted: no further sibling can have been drawn
            q_j /= left
    return SiblingVerdict(None, sample(residual, rng))


def accept_sampled_tree(tree: SampledTree, child_q: dict[tuple[int, ...], np.ndarray], rows: Sequence[np.ndarray],
                        row_of: Callable[[int], int], rng: np.random.Generator) -> TreeAcceptance:
    """Walk a tree of sampled children: at each node, recursive rejection sampling over its children in
    the order drawn (``accept_siblings``, with ``child_q[path]`` the draft's q there) against the target's
    p there (``rows[row_of(node)]``); an accepted child is descended into, a node without children emits
    the bonus from p. Exact: each position's emitted token follows p given the path (``accept_siblings``),
    so the walk draws the target's joint distribution."""
    children: dict[int, list[int]] = {}
    for node, parent in enumerate(tree.parents):
        children.setdefault(parent, []).append(node)
    tokens: list[int] = []
    nodes: list[int] = []
    node = ROOT
    while True:
        p = rows[row_of(node)]
        kids = children.get(node, [])
        if not kids:
            return TreeAcceptance(tuple(tokens), tuple(nodes), sample(p, rng))
        verdict = accept_siblings([tree.tokens[k] for k in kids], child_q[tuple(tokens)], p, rng)
        if verdict.accepted is None:
            return TreeAcceptance(tuple(tokens), tuple(nodes), verdict.token)
        node = kids[verdict.accepted]
        tokens.append(tree.tokens[node])
        nodes.append(node)
