"""A DFlash (or DSpark) draft as the drafter: a whole block of drafts from ONE draft pass.

A DFlash draft (block diffusion over the target's features) keeps a KV cache
built from the target's tapped layer inputs, one row per position, written by
an "injection" decode (``backend.DFlashContext.inject``). To draft k tokens
after the history's last token ``x``, it decodes the block ``[x, MASK * k]``
once, attending non-causally within the block: row i gives the distribution
``q_i`` of the token i places after ``x``. A draft model needs k decodes for k
tokens; DFlash needs one (its cost grows with the block's rows, not passes).

The cache is kept in step lazily, as the EAGLE-3 drafter's is (``fed.FedDrafter``):
the target's tapped rows wait in ``rows`` (keyed by position and token) until
``propose`` injects those the cache lacks (positions up to ``len(history) - 2``);
the block is dropped from the cache right after it is read.

Exactness: each draft token ``d_i`` is sampled from ``q_i`` under the target's
sampling settings, independently of the others (the block's distributions are
computed before any token is chosen). Rejection sampling needs, at each depth,
the draft token's distribution given everything the verifier has seen so far;
``d_i`` is independent of ``d_1 .. d_{i-1}`` and of the verifier's uniforms, so
that distribution is ``q_i`` itself, and accepting with min(1, p/q_i) and
resampling from norm(max(p - q_i, 0)) keeps the output distributed exactly as
the target's (``acceptance.accept_sampled``). llama.cpp's ``draft-dflash`` takes
each row's top token and keeps it on an exact match; at temperature 0 both are
greedy matches.

DSpark: a DFlash draft with a Markov head (``backend.DFlashContext``: row i's
logits get a bias from the token before it, which llama.cpp's graph takes to be
the anchor for the first row and the argmax of the row before for the others).
The argument above holds unchanged: each ``q_i`` is fixed by the one pass before
any token is sampled, whatever the tokens sampled at the rows before. At
temperature 0 the chain's argmax is the drafted token, so the bias is the one
the draft was trained with; at T > 0 a row after a sampled token that is not its
row's argmax is biased for the argmax instead, which can only cost acceptance.
A confidence head (the chance a row is accepted, as DSpark trains it) is what
``p_min`` cuts the block at, as llama.cpp's ``draft-dspark`` does; without one
the row's top probability is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from localspec.drafting.base import Proposal, TreeProposal, draft_chain
from localspec.drafting.draft_tree import TREE_WIDTH, grow_tree, tree_q
from localspec.drafting.eagle3 import check_features_fit, tapped_layers
from localspec.drafting.fed import DraftCache, FedDrafter, Target
from localspec.errors import IncompatibleDraftError
from localspec.llama_facts import DSPARK_MARKOV_TENSOR
from localspec.sampling import Sampler

DFLASH = "dflash"
DSPARK = "dspark"  # a DFlash draft with a Markov head: the stats name it apart


def check_dflash_fits(target: Any, draft: Any) -> None:
    """Raise IncompatibleDraftError unless llama.cpp can run the DFlash (or DSpark) ``draft`` beside ``target``.

    Both are ``models.gguf_info.GGUFInfo``. The rules are what ``src/models/dflash.cpp``
    assumes: target layers it has and whose inputs its graph exposes; features
    ``len(layers) x n_embd`` wide in the DRAFT's width (so it must be the target's);
    the target's vocabulary; a mask token; a DSpark's trained block size (its graph
    aborts without one); and the DFlash-1 backbone (DFlash-2's selector and DSpark's
    DeepSeek-V4 stages are not run here).
    """
    hp = draft.hparams

    def fail(problem: str, fix: str = "use the DFlash draft published for this target model") -> IncompatibleDraftError:
        return IncompatibleDraftError(f"DFlash draft {draft.label} does not fit target {target.label}: {problem}; {fix}")

    layers = tapped_layers(target, draft, fail)
    if not layers:
        raise fail("it names no target layers (dflash.target_layers)", "convert the draft again with llama.cpp's converter")
    check_features_fit(target, draft, fail, layers, draft.n_embd)
    if hp.get("selector_top_k") or hp.get("hyper_connection_count"):
        raise fail("it is a DFlash-2 (selector) or DSpark DeepSeek-V4 draft, which localspec does not run yet",
                   "use a DFlash or DSpark draft with the DFlash-1 backbone")
    if is_dspark(draft) and not hp.get("block_size"):
        raise fail("it is a DSpark draft without its trained block size (dflash.block_size)",
                   "convert the draft again with llama.cpp's converter")


def is_dspark(draft: Any) -> bool:
    """Whether a ``dflash`` GGUF (``GGUFInfo``) carries DSpark's Markov head, as llama.cpp tells them apart."""
    return DSPARK_MARKOV_TENSOR in draft.tensor_names


class BlockHead(DraftCache, Protocol):
    """The draft's context (``backend.DFlashContext``): a cache of injected features, and a block decode that
    drafts ``k`` tokens in one pass (``logits(i)``, ``confidence(i)`` for draft i = 1..k)."""

    n_embd: int
    max_draft_len: int
    markov: bool  # a DSpark draft
    has_confidence: bool  # a DSpark confidence head: ``confidence(i)`` is its score (else None)

    def inject(self, features: np.ndarray, positions: Sequence[int]) -> None: ...

    def draft_block(self, token: int, position: int, draft_len: int) -> None: ...

    def logits(self, i: int) -> np.ndarray: ...

    def confidence(self, i: int) -> float | None: ...


def drafter_name(head: BlockHead) -> str:
    """What the stats and the cost model call a drafter over ``head``."""
    return DSPARK if head.markov else DFLASH


class DFlashDrafter(FedDrafter):
    """Drafts a block with a DFlash model; the drafter protocol.

    Proposes at most ``head.max_draft_len`` tokens (the block it was trained on holds the
    last token and the masks). ``p_min``: the block is cut at the first row whose
    confidence (a DSpark's head), or else top probability, falls below it. ``propose_tree``: a tree of the nodes the controller
    asks for, grown from the same one pass (``draft_tree.grow_tree``; the block's row i
    is the draft's q at depth i whatever the path), ``tree_width`` children a node at
    most: a tree costs no draft pass more than a chain, only verification rows.
    """

    name = DFLASH
    head: BlockHead
    reads_token = False  # row p: the features at p, injected (the last token is the block's anchor)

    def __init__(self, head: BlockHead, target: Target, sampler: Sampler, *, p_min: float = 0.0,
                 max_row_bytes: int | None = None, tree_width: int = TREE_WIDTH) -> None:
        super().__init__(head, target, target.layer_features, head.n_embd, sampler, p_min=p_min,
                         max_row_bytes=max_row_bytes)
        self.name = drafter_name(head)
        self.tree_width = tree_width
        self.max_draft_len = max(1, head.max_draft_len)

    def _feed(self, tokens: Sequence[int], positions: Sequence[int], rows: np.ndarray,
              outputs: Sequence[bool]) -> None:
        self.head.inject(rows, positions)

    def _longest(self, draft_len: int) -> int:
        return min(draft_len, self.max_draft_len)

    def _tree_nodes(self, history: Sequence[int], nodes: int) -> int:
        return nodes if self.tree_width > 0 else 0  # a tree costs no sequences: one pass drafts every depth

    def _draft(self, history: Sequence[int], draft_len: int, nodes: int, row: int) -> Proposal | TreeProposal:
        last = len(history) - 1
        try:
            self.head.draft_block(history[-1], last, draft_len)
            if nodes > draft_len:
                return self._block_tree(history, draft_len, nodes)

            def logits(depth: int, drafted: Sequence[int]) -> np.ndarray | None:
                confidence = self.head.confidence(depth + 1)
                return None if confidence is not None and confidence < self.p_min else self.head.logits(depth + 1)

            # A row with a confidence is cut by it alone; without one, by the row's top probability.
            return draft_chain(logits, self.sampler, 0.0 if self.head.has_confidence else self.p_min, history,
                               draft_len, self.name)
        finally:
            self.head.rollback_to(last)  # the block's rows are not features

    def _block_tree(self, history: Sequence[int], draft_len: int, nodes: int) -> TreeProposal:
        """A tree from the block just decoded: the children of a node at depth d drawn from row d + 1, shaped
        (under a grammar) as the target's row after ``history`` and the node's path: one q per depth
        without a grammar, one per node with one."""
        rows: dict[int, np.ndarray] = {}

        def q_one(path: tuple[int, ...]) -> np.ndarray:
            depth = len(path) + 1
            if self.sampler.shaper is not None:
                return tree_q(self.head.logits(depth), self.sampler, history, path)
            if depth not in rows:
                rows[depth] = tree_q(self.head.logits(depth), self.sampler)
            return rows[depth]

        def q_at(paths: Sequence[tuple[int, ...]]) -> list[np.ndarray]:
            return [q_one(tuple(path)) for path in paths]

        return grow_tree(q_at, max_nodes=nodes, draft_len=draft_len, max_width=self.tree_width,
                         rng=None if self.sampler.params.greedy else self.sampler.rng, drafter=self.name)
