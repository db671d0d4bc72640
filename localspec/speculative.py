"""The speculative step: propose -> verify -> accept -> update.

Invariant, on entry and on exit: the target's cache holds every token of
``history`` except the last one, which has been chosen but not yet fed to
the model. A step feeds ``[last, d1, ..., dk]`` to the target in ONE batch
and asks for k+1 rows of logits: row i is the target's distribution for the
position right after ``[last, d1..di]`` (read only up to the first
rejection). The acceptance rule keeps a prefix d1..dn and yields the
target's own next token t; the cache is cut back to ``[last, d1..dn]`` and
``t`` becomes the new unfed last token.

With k = 0 (no drafter, or the drafter has nothing) this is exactly one step
of plain decoding, so plain and speculative decoding share one loop.
"""

from __future__ import annotations

import time
from typing import Callable, Sequence, TypeVar

import numpy as np

from localspec.acceptance import (
    ROOT,
    Verdict,
    accept_greedy,
    accept_sampled,
    accept_sampled_tree,
    accept_tree,
)
from localspec.backend import Context
from localspec.drafting.base import Drafter, Proposal, TreeProposal
from localspec.events import StepEvent, TokenLogprob
from localspec.logprobs import token_logprob
from localspec.sampling import RowShaper, Sampler, argmax as _argmax, sample

NO_PROPOSAL = Proposal()
T = TypeVar("T")


class _LazyRows(Sequence[T]):
    """What ``read`` makes of each verified row's logits (a distribution, an argmax), computed only
    when the acceptance rule asks, once.

    The rule stops at the first rejection, so rows after it are never read: a
    softmax over a 262k vocabulary costs ~1 ms, an argmax over it ~0.15 ms, and
    a 31-token draft rejected at its first token would otherwise pay for 32 rows.
    """

    __slots__ = ("_ctx", "_n", "_read", "_cache")

    def __init__(self, ctx: Context | _ShapedRows, n: int, read: Callable[[np.ndarray], T]) -> None:
        self._ctx, self._n, self._read = ctx, n, read
        self._cache: list[T | None] = [None] * n

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i):  # type: ignore[override]
        if type(i) is int and 0 <= i < self._n:  # the rule's own way in: one row, in order
            hit = self._cache[i]
            if hit is None:
                hit = self._cache[i] = self._read(self._ctx.logits(i))
            return hit
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._n))]
        i = int(i)
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError(i)
        return self[i]


class _ShapedRows:
    """A context's verified rows as the sampler's shaper shapes them (``sampling.RowShaper``): row ``i``
    follows ``history`` + ``path_of(i)``, the drafted tokens between the history and that row. It stands
    in for the context where ``_LazyRows`` reads rows, so only a constrained step pays for shaping."""

    __slots__ = ("_ctx", "_shaper", "_history", "_path_of")

    def __init__(self, ctx: Context, shaper: RowShaper, history: Sequence[int],
                 path_of: Callable[[int], Sequence[int]]) -> None:
        self._ctx, self._shaper, self._history, self._path_of = ctx, shaper, history, path_of

    def logits(self, i: int) -> np.ndarray:
        return self._shaper.shape(self._ctx.logits(i), self._history, self._path_of(i))


def speculative_step(target: Context, history: list[int], drafter: Drafter | None, sampler: Sampler,
                     draft_len: int, proposal: Proposal | TreeProposal | None = None,
                     proposal_ms: float = 0.0, tree_nodes: int = 0, *, index: int = 0, reason: str = "",
                     planning_ms: float = 0.0, logprobs: int | None = None) -> StepEvent:
    """Draft up to ``draft_len`` tokens, verify them in one target pass, keep the accepted prefix.

    ``history`` is extended in place with the emitted tokens. ``proposal``: one
    ``drafter`` already made for this history (a lookup asked before
    planning). Either is cut to ``draft_len`` and to the batch (``fit_proposal``). ``proposal_ms``: drafting time
    spent before this call (such lookups), counted in the step's ``draft_ms``. ``tree_nodes`` >
    ``draft_len``: ask the drafter for a tree of that many nodes (``propose_tree``), not a chain.
    The step updates the drafter it used (``verified`` then ``accepted``). The record it returns
    carries the caller's ``index`` and ``reason`` (the controller's decision), and ``planning_ms``
    (the controller's time for the step) in its ``python_ms``. ``logprobs`` not None: the record
    carries each emitted token's log-probability with that many alternatives, read from the target
    row that produced it (``logprobs.token_logprob``); None (the default) reads nothing more.

    Timing: ``verify_ms`` is the target's decode until the device finished it
    (``Context.decode`` waits for it, so on a GPU the wait is not mistaken for Python time);
    ``draft_ms`` the wall time of proposing, which reads the draft's rows and so waits for its
    decodes; ``python_ms`` the rest of the step, planning included.
    """
    t0 = time.perf_counter()
    # propose
    if draft_len <= 0 or drafter is None:
        proposal = NO_PROPOSAL
    elif proposal is None:
        proposal = (drafter.propose_tree(history, draft_len, tree_nodes) if tree_nodes > draft_len
                    else drafter.propose(history, draft_len))
    t1 = time.perf_counter()
    decode_before = target.decode_seconds
    if proposal is not NO_PROPOSAL:
        proposal = fit_proposal(proposal, draft_len, min(target.n_ctx - len(target.tokens), target.max_verify_rows))

    # verify + accept (a chain, or a tree of branches in one batch)
    walk: tuple[tuple[int, int], ...] = ()
    lps = _Logprobs(logprobs) if logprobs is not None else None
    if type(proposal) is TreeProposal and (len(proposal.tree) or proposal.extra):
        accepted, next_token = _verify_tree(target, history, proposal, sampler, lps)
        drafted, verified = max(proposal.tree.depths, default=0), len(proposal.tree)
        batch = 1 + verified + (len(proposal.extra.tokens) if proposal.extra is not None else 0)
        walk = proposal.tree.walk(accepted) if len(proposal.tree) else ()
    else:
        draft = proposal.tokens
        accepted, next_token = _verify_chain(target, history, draft, proposal.probs, sampler, lps)
        drafted = verified = len(draft)
        batch = 1 + verified
    verify_s = target.decode_seconds - decode_before

    # update: the drafter learns what was kept
    n_acc = len(accepted)
    tokens = (*accepted, next_token) if n_acc else (next_token,)
    history.extend(tokens)
    if drafter is not None and draft_len > 0:
        drafter.verified(drafted)
        drafter.accepted(history, n_acc)
    t2 = time.perf_counter()
    return StepEvent(
        index=index,
        drafter=(proposal.drafter or drafter.name) if drafted and drafter is not None else None,
        drafted=drafted,
        accepted=n_acc,
        emitted=len(tokens),
        draft_ms=proposal_ms + (t1 - t0) * 1e3,
        verify_ms=verify_s * 1e3,
        python_ms=((t2 - t1) - verify_s) * 1e3 + planning_ms,
        verified=verified,
        decision=reason,
        tokens=tokens,
        batch_tokens=batch,
        walk=walk,
        logprobs=() if lps is None else lps.of(tokens),
    )


def fit_proposal(proposal: Proposal | TreeProposal, draft_len: int, free_cells: int) -> Proposal | TreeProposal:
    """The one place a proposal is cut to what this step verifies: no deeper than ``draft_len`` (a
    lookup offers all it has, and the controller chose how much), and a batch of at most ``free_cells``
    rows (the cache's free cells near the context's end, or the rows a verification may hold and stay
    exact: ``Context.max_verify_rows``).

    A verification batch takes one cell per token, ``last`` included. A tree is
    cut to its nodes within ``draft_len``; then, if it still does not fit, it
    first loses its extra tokens (lookahead's window), then falls back to its
    most probable branch. A chain is cut, its draft distributions with it.
    """
    if isinstance(proposal, TreeProposal):
        if max(proposal.tree.depths, default=0) > draft_len:
            proposal = TreeProposal(proposal.tree.truncated(draft_len), proposal.drafter, proposal.extra,
                                    child_q=proposal.child_q)
        extra = len(proposal.extra.tokens) if proposal.extra is not None else 0
        if 1 + len(proposal.tree) + extra <= free_cells:
            return proposal
        if 1 + len(proposal.tree) <= free_cells:
            return TreeProposal(proposal.tree, proposal.drafter, child_q=proposal.child_q)
        return Proposal(proposal.tokens[: max(0, free_cells - 1)], None, proposal.drafter)
    depth = max(0, min(draft_len, free_cells - 1))
    if len(proposal.tokens) <= depth:
        return proposal
    probs = proposal.probs[:depth] if proposal.probs is not None else None
    return Proposal(tuple(proposal.tokens[:depth]), probs, proposal.drafter, proposal.evidence)


class _Logprobs:
    """Where a step collects the rows its emitted tokens came from, in order (``rows[i]`` produced the
    i-th emitted token): the log-probabilities are taken as each row is seen, before a later decode
    overwrites the logits."""

    __slots__ = ("top_n", "rows")

    def __init__(self, top_n: int) -> None:
        self.top_n = top_n
        self.rows: list[np.ndarray] = []

    def add(self, logits: np.ndarray) -> None:
        self.rows.append(np.array(logits, copy=True))

    def of(self, tokens: Sequence[int]) -> tuple[TokenLogprob, ...]:
        assert len(self.rows) == len(tokens), "one row per emitted token"
        return tuple(token_logprob(row, tok, self.top_n) for row, tok in zip(self.rows, tokens))


def _verify_chain(target: Context, history: Sequence[int], draft: Sequence[int],
                  probs: Sequence[np.ndarray] | None, sampler: Sampler,
                  lps: _Logprobs | None = None) -> tuple[tuple[int, ...], int]:
    """Feed ``[last, *draft]`` in one batch, apply the acceptance rule, cut the cache back."""
    n_past = len(target.tokens)
    last = history[-1]
    if not draft:  # a plain step: one row, its choice
        target.decode((last,), (n_past,), None, None)
        target.tokens.append(last)
        logits = target.logits(0)
        if sampler.shaper is not None:
            logits = sampler.shaper.shape(logits, history, ())
        if lps is not None:
            lps.add(logits)
        return (), (_argmax(logits) if sampler.params.greedy else sample(sampler.distribution(logits), sampler.rng))
    batch = [last, *draft]
    target.decode(batch, range(n_past, n_past + len(batch)), None, [True] * len(batch))
    target.tokens.extend(batch)
    rows: Context | _ShapedRows = target
    if sampler.shaper is not None:
        rows = _ShapedRows(target, sampler.shaper, history, lambda i: draft[:i])
    verdict: Verdict
    if sampler.params.greedy:
        verdict = accept_greedy(draft, _LazyRows(rows, len(batch), _argmax))
    else:
        verdict = accept_sampled(draft, probs, _LazyRows(rows, len(batch), sampler.distribution), sampler.rng)
    if lps is not None:  # emitted token i (the accepted drafts, then the target's own) came from row i
        for i in range(verdict.n_accepted + 1):
            lps.add(rows.logits(i))
    target.rollback_to(n_past + 1 + verdict.n_accepted)
    return tuple(draft[: verdict.n_accepted]), verdict.next_token


def _verify_tree(target: Context, history: Sequence[int], proposal: TreeProposal,
                 sampler: Sampler, lps: _Logprobs | None = None) -> tuple[tuple[int, ...], int]:
    """Verify every branch of a candidate trie in one batch; keep the longest accepted path.

    Each leaf gets its own llama.cpp sequence (1..L) that first shares the whole
    history with sequence 0; a node carries the ids of every leaf below it, so
    it is computed once and attends exactly to its ancestors (llama.cpp masks
    by a token's first sequence id). Extra tokens (lookahead's window) get the
    sequences after the leaves. Afterwards the accepted path is copied into
    sequence 0 and every other sequence is removed; a path that is not the
    first branch is decoded again after the part that is (``_place_rest``), so
    the cache holds every kept token in the cell plain decoding gives it.
    """
    tree, extra = proposal.tree, proposal.extra
    n_past = len(target.tokens)
    leaves = tree.leaves
    leaf_seq = {leaf: 1 + i for i, leaf in enumerate(leaves)}
    n_extra_seqs = extra.n_seqs if extra is not None else 0
    n_seqs = 1 + len(leaves) + n_extra_seqs
    if n_seqs > target.n_seq:
        raise ValueError(f"a proposal needs {n_seqs} sequences; the context has {target.n_seq}")
    # seqs of node i = the leaves below it; walk each leaf's path once
    node_seqs: list[list[int]] = [[] for _ in range(len(tree))]
    for leaf in leaves:
        for node in tree.path(leaf):
            node_seqs[node].append(leaf_seq[leaf])
    for seq in range(1, n_seqs):
        target.copy_seq(0, seq, 0, n_past)

    # Batch order: depth first, most probable child first. llama.cpp places a batch
    # in consecutive cells, so when the accepted path is the first one the kept cells
    # stay contiguous, exactly where plain decoding would have put them (and the
    # second decode of ``_place_rest`` is needed least often).
    order = _depth_first(tree)
    row = {node: 1 + i for i, node in enumerate(order)}
    tokens = [history[-1], *(tree.tokens[n] for n in order)]
    positions = [n_past, *(n_past + tree.depths[n] for n in order)]
    seq_ids: list[Sequence[int]] = [range(n_seqs), *(node_seqs[n] for n in order)]
    outputs = [True] * len(tokens)
    if extra is not None:
        base = 1 + len(leaves)
        tokens += extra.tokens
        positions += [n_past + off for off in extra.positions]
        seq_ids += [[base + s for s in ids] for ids in extra.seq_ids]
        outputs += extra.outputs
    target.decode(tokens, positions, seq_ids, outputs)

    def row_of(node: int) -> int:
        return 0 if node == ROOT else row[node]

    source: Context | _ShapedRows = target
    if sampler.shaper is not None:
        node_at = [ROOT, *order]  # batch row -> node
        source = _ShapedRows(target, sampler.shaper, history,
                             lambda i: tuple(tree.tokens[n] for n in tree.path(node_at[i])))
    if sampler.params.greedy:
        result = accept_tree(tree, lambda node: _argmax(source.logits(row_of(node))))
    elif proposal.child_q is not None:
        result = accept_sampled_tree(tree, proposal.child_q, _LazyRows(source, len(tree) + 1, sampler.distribution),
                                     row_of, sampler.rng)
    else:
        rows = _LazyRows(source, len(tree) + 1, sampler.distribution)
        result = accept_tree(tree, lambda node: sample(rows[row_of(node)], sampler.rng))
    if extra is not None:
        first_extra = len(tree) + 1
        extra.on_logits(lambda j: target.logits(first_extra + j))

    # Keep [last, *accepted path] in sequence 0, in the cells plain decoding uses, and drop every
    # other sequence. The batch took consecutive cells from ``n_past`` (llama.cpp's slot search
    # starts at its head, which the last rollback left right after the history), so node ``i`` sits
    # in cell ``n_past + row[i]``; plain decoding puts depth d in cell ``n_past + d``. The path's
    # leading nodes that are first children all the way down have row == depth and stay; the rest
    # are removed and decoded again (``_place_rest``).
    path = result.nodes
    in_place = 0
    while in_place < len(path) and row[path[in_place]] == tree.depths[path[in_place]]:
        in_place += 1
    if lps is not None:  # the rows before the first misplaced node (the rest are decoded again below)
        for node in (ROOT, *path[:in_place]):
            lps.add(source.logits(row_of(node)))
    if in_place:
        keep_seq = node_seqs[path[in_place - 1]][0]
        target.copy_seq(keep_seq, 0, n_past + 1, n_past + 1 + in_place)
    for seq in range(1, n_seqs):
        target.remove_seq(seq)
    target.tokens.extend([history[-1], *result.tokens[:in_place]])
    if in_place == len(path):
        return result.tokens, result.next_token
    return _place_rest(target, history, result.tokens, in_place, result.next_token, sampler, lps)


def _place_rest(target: Context, history: Sequence[int], accepted: tuple[int, ...], in_place: int, next_token: int,
                sampler: Sampler, lps: _Logprobs | None = None) -> tuple[tuple[int, ...], int]:
    """Decode ``accepted[in_place:]`` again, as one batch at the end of sequence 0, and return what to emit.

    Why: the tree batch left these tokens in cells past other branches' cells. Once those are freed,
    the next tokens would fill them, so the cache would list positions out of order, and batch-invariant
    flash attention (which sums a row's cells in fixed 128-cell chunks, in cell order) would sum them in
    another order than plain decoding: another rounding, and at a near-tie another token. With every
    cell after the kept ones free, llama.cpp's slot search (``find_slot`` from the head that the removal
    moved to the first freed cell) puts this batch in the cells right after them, where plain decoding
    puts these positions.

    The tree's rows for those nodes were also computed at the wrong cells. Greedy, the choices are
    therefore taken again from this batch's rows, computed in the right cells: the same bits as plain
    decoding, so where they differ (only at a rounding-level near-tie) the path is cut there and the
    target's own token from this batch follows. Sampled, the tree's draws stand (the rows differ by
    rounding only) and only the cells are fixed. Log-probabilities of the tokens after these are read
    from this batch's rows too, for the same reason.
    """
    rest = accepted[in_place:]
    start = len(target.tokens)
    greedy = sampler.params.greedy
    rows = greedy or lps is not None
    target.decode(rest, range(start, start + len(rest)), None, [True] * len(rest) if rows else None)
    target.tokens.extend(rest)
    if not greedy:
        if lps is not None:
            for k in range(len(rest)):
                lps.add(sampler.shaped(target.logits(k), history, accepted[:in_place + k + 1]))
        return accepted, next_token
    for k in range(len(rest)):
        logits = target.logits(k)
        if sampler.shaper is not None:  # the row after history + accepted[:in_place + k + 1]
            logits = sampler.shaper.shape(logits, history, accepted[:in_place + k + 1])
        if lps is not None:
            lps.add(logits)
        choice = _argmax(logits)
        expected = accepted[in_place + k + 1] if in_place + k + 1 < len(accepted) else next_token
        if choice != expected:
            kept = in_place + k + 1
            target.rollback_to(start + k + 1)
            return accepted[:kept], choice
    return accepted, next_token


def _depth_first(tree) -> list[int]:
    """Node indices in depth-first order, the most probable child first at each node."""
    children: dict[int, list[int]] = {}
    for node, parent in enumerate(tree.parents):
        children.setdefault(parent, []).append(node)
    out: list[int] = []
    stack = sorted(children.get(ROOT, []), key=lambda n: tree.probs[n])
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(sorted(children.get(node, []), key=lambda n: tree.probs[n]))
    return out
