"""An EAGLE-3 draft (Li et al. 2025) as the drafter: one block that drafts from three of the target's layers.

The draft reads, at every position P of the history, the inputs of three target
layers (low, middle, high; the draft names them), side by side: its encoder
projects them to one row ``g_P`` of its width (``backend.Eagle3Context.encode``).
Its decoder block has its own KV cache; its row at position P is built from the
token ``x_{P+1}`` and ``g_P`` and predicts ``x_{P+2}`` (llama.cpp's convention in
``common/speculative.cpp``: the token is "shifted left by one" against g).

The cache is kept in step with the history lazily, as the MTP head's is:

* every target decode hands its tapped rows to ``observe``, keyed by (position,
  token) so a tree verification's accepted path is found too;
* ``propose`` first decodes the rows the cache lacks, ``(x_{P+1}, g_P)`` for P up
  to ``len(history) - 2`` (the last holds the history's last token, whose logits
  give the first draft), encoding their features in one encoder pass; then each
  further draft token is decoded at the next position with the decoder's own
  pre-norm output in place of g (the target has not computed it yet). Those
  draft rows are dropped before the next catch-up rebuilds them from the
  target's features.

Memory: the target's feature rows (3 x its width per token) wait in ``rows``
until a catch-up consumes them; at most ``max_row_bytes`` are kept, the oldest
first dropped, and a dropped row is encoded from zeros: that costs acceptance,
never correctness (the target verifies every draft).

At temperature > 0 the draft tokens are sampled from the draft's distribution q
under the target's sampling settings and the proposal carries q, so the
verifier accepts by exact rejection sampling (min(1, p/q), resampling from
norm(max(p - q, 0))): the output follows the target's distribution exactly.
llama.cpp's ``draft-eagle3`` takes the draft's top token and keeps it on an
exact match only; at temperature 0 both are greedy matches.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from localspec.drafting.base import DrafterBase, Proposal, TreeProposal, draft_token
from localspec.drafting.draft_tree import TREE_WIDTH, grow_fed_tree
from localspec.drafting.hidden_rows import HiddenRows
from localspec.errors import IncompatibleDraftError
from localspec.llama_facts import EAGLE3_N_TARGET_LAYERS, LAYER_TAP_ARCHITECTURES
from localspec.models.memory import DRAFT_ROWS_MAX_BYTES
from localspec.sampling import Sampler

MAX_ROW_BYTES = DRAFT_ROWS_MAX_BYTES
"""Default cap on the target feature rows kept for the next catch-up."""

EAGLE3 = "eagle3"


def tapped_layers(target: Any, draft: Any, fail: Callable[..., IncompatibleDraftError]) -> list[int]:
    """The target layers a draft that reads them names (``<arch>.target_layers``; [] when it names none),
    after refusing a target whose graph cannot hand its layer inputs over. Shared by EAGLE-3 and DFlash;
    ``fail(problem, fix)`` makes each one's refusal."""
    if target.architecture not in LAYER_TAP_ARCHITECTURES:
        raise fail(f"this llama.cpp cannot hand a {target.architecture} target's layer inputs to a draft",
                   "draft with ngram or an ordinary draft model instead")
    layers = draft.hparams.get("target_layers")
    return [int(v) for v in layers] if isinstance(layers, (list, tuple)) else []


def check_features_fit(target: Any, draft: Any, fail: Callable[..., IncompatibleDraftError], layers: Sequence[int],
                       width: int) -> None:
    """Refuse layers beyond the target, features (``width``) not the target's width, another vocabulary."""
    beyond = [i for i in layers if not 0 <= i < target.n_layers]
    if beyond:
        raise fail(f"it reads layer(s) {', '.join(map(str, beyond))}, the target has layers 0..{target.n_layers - 1}")
    if width != target.n_embd:
        raise fail(f"it reads features {width} wide, the target's are {target.n_embd}")
    if draft.n_vocab != target.n_vocab:
        raise fail(f"vocabulary size differs (target {target.n_vocab}, draft {draft.n_vocab})")


def check_eagle3_fits(target: Any, draft: Any) -> None:
    """Raise IncompatibleDraftError unless llama.cpp can run the EAGLE-3 ``draft`` beside ``target``.

    Both are ``models.gguf_info.GGUFInfo`` (headers only, before any weights load). The rules
    are what ``src/models/eagle3.cpp`` and ``common/speculative.cpp`` assume: three target layers
    (``eagle3.target_layers``), each a layer the target has and whose input its graph exposes
    (the id equal to the layer count, the final hidden state, is read by llama.cpp through the NextN
    rows, which this target's graph does not fill); features of the target's width
    (``eagle3.target_hidden_size``); the target's vocabulary; and, where the draft borrows the
    target's token embedding or output matrix, the target's width.
    """
    hp = draft.hparams

    def fail(problem: str, fix: str = "use the EAGLE-3 draft published for this target model") -> IncompatibleDraftError:
        return IncompatibleDraftError(f"EAGLE-3 draft {draft.label} does not fit target {target.label}: {problem}; {fix}")

    layers = tapped_layers(target, draft, fail)
    if len(layers) != EAGLE3_N_TARGET_LAYERS:
        raise fail(f"it names {len(layers)} target layers (eagle3.target_layers), llama.cpp needs "
                   f"{EAGLE3_N_TARGET_LAYERS}", "convert the draft again with llama.cpp's converter")
    check_features_fit(target, draft, fail, layers, int(hp.get("target_hidden_size", 0) or 0))
    borrows = [what for what, size in (("token embedding", draft.token_embd_bytes), ("output matrix", draft.output_bytes))
               if size == 0]
    if borrows and draft.n_embd != target.n_embd:
        raise fail(f"it borrows the target's {' and '.join(borrows)} but is {draft.n_embd} wide, "
                   f"the target {target.n_embd}")


class FeatureSource(Protocol):
    """The target context, as far as the EAGLE-3 drafter needs it (``backend.Context``)."""

    def layer_features(self, n: int) -> np.ndarray: ...

    def add_decode_listener(self, listener) -> None: ...

    def remove_decode_listener(self, listener) -> None: ...


class Eagle3Head(Protocol):
    """The draft's context (``backend.Eagle3Context``)."""

    n_embd: int
    n_features: int
    n_batch: int
    n_seq: int

    def encode(self, features: np.ndarray) -> np.ndarray: ...

    def decode(self, tokens: Sequence[int], positions: Sequence[int], g: np.ndarray,
               outputs: Sequence[bool], seqs: Sequence[int] | None = None) -> None: ...

    def copy_seq(self, src: int, dst: int, p0: int = 0, p1: int = -1) -> None: ...

    def remove_seq(self, seq_id: int) -> None: ...

    def logits(self, row: int) -> np.ndarray: ...

    def hidden(self, row: int) -> np.ndarray: ...

    def rollback_to(self, n: int) -> None: ...


class Eagle3Drafter(DrafterBase):
    """Drafts with an EAGLE-3 model; ``accepted``/``reset`` follow the drafter protocol.

    ``p_min``: stop drafting when the draft's own top probability falls below it.
    ``propose_tree``: a tree grown best-first (``draft_tree.grow_tree``) level by level, where the
    head has sequences for its nodes: each waiting node is decoded in one batch, on a sequence of its
    own sharing its parent's cells, fed its parent's own pre-norm output (as a chain's next token is);
    the sequences are removed afterwards.
    """

    name = EAGLE3

    def __init__(self, head: Eagle3Head, target: FeatureSource, sampler: Sampler, *, p_min: float = 0.0,
                 max_row_bytes: int | None = None) -> None:
        self.head = head
        self.target = target
        self.sampler = sampler
        self.p_min = p_min
        max_rows = (MAX_ROW_BYTES if max_row_bytes is None else max_row_bytes) // (4 * head.n_features)
        self.rows = HiddenRows(head.n_features, max(2, max_rows))
        self.tree_width = TREE_WIDTH if head.n_seq > 1 else 0
        # The history prefix whose decoder rows the cache holds: rows P = 0 .. len - 2.
        self._tokens: list[int] = []
        target.add_decode_listener(self.observe)

    def observe(self, tokens: Sequence[int], positions: Sequence[int],
                seq_ids: Sequence[Sequence[int]] | None) -> None:
        """Keep the tapped rows of a target decode (called by the target context after each one)."""
        if tokens:
            self.rows.add(tokens, positions, self.target.layer_features(len(tokens)))

    def _first_row(self, history: Sequence[int]) -> int:
        """The first decoder position to (re)build: rows before it were built from this history's tokens;
        the last row (the history's last token) is always rebuilt, as its logits start the draft."""
        n = 0
        for a, b in zip(self._tokens, history):
            if a != b:
                break
            n += 1
        return max(0, min(n, len(history) - 1) - 1)

    def behind(self, history: Sequence[int]) -> int:
        return max(0, len(history) - 1 - self._first_row(history))

    def _sync(self, history: Sequence[int]) -> int:
        """Build the decoder rows ``history`` needs; return the batch row holding the last one's logits."""
        start, last = self._first_row(history), len(history) - 2
        del self._tokens[start + 1:]
        self.head.rollback_to(start)
        row = 0
        try:
            for p0 in range(start, last + 1, self.head.n_batch):
                p1 = min(last + 1, p0 + self.head.n_batch)
                positions = range(p0, p1)
                g = self.head.encode(np.stack([self.rows.row(history, p) for p in positions]))
                self.head.decode([history[p + 1] for p in positions], positions, g,
                                 [p == last for p in positions])
                row = p1 - 1 - p0
        except BaseException:
            self._tokens.clear()  # a failed decode leaves the cache unknown (it was cleared)
            raise
        self._tokens = list(history)
        self.rows.drop_before(last)  # consumed; the next catch-up needs no earlier row
        return row

    def propose(self, history: Sequence[int], draft_len: int) -> Proposal:
        if draft_len <= 0 or len(history) < 2:
            return Proposal(drafter=self.name)
        row = self._sync(history)
        greedy = self.sampler.params.greedy
        tokens: list[int] = []
        probs: list[np.ndarray] = []
        pos = len(history) - 1
        try:
            for depth in range(draft_len):
                picked = draft_token(self.head.logits(row), self.sampler, self.p_min, history, tokens)
                if picked is None:
                    break
                tok, q = picked
                if q is not None:
                    probs.append(q)
                tokens.append(tok)
                if depth + 1 == draft_len:
                    break
                # The draft drafts on from its own pre-norm output, one position further.
                own = np.array(self.head.hidden(row))
                self.head.decode([tok], [pos + depth], own[None, :], [True])
                row = 0
        except BaseException:
            self._tokens.clear()
            raise
        return Proposal(tuple(tokens), None if greedy else tuple(probs), self.name)

    def propose_tree(self, history: Sequence[int], draft_len: int, nodes: int) -> Proposal | TreeProposal:
        nodes = min(nodes, self.head.n_seq)  # each decoded node takes a sequence
        if self.tree_width <= 1 or nodes <= draft_len or draft_len <= 0 or len(history) < 2:
            return self.propose(history, draft_len)
        row = self._sync(history)
        try:
            # The root's children sit at the last token's decoder position (its token is x_{P+1}).
            return grow_fed_tree(self.head, self.sampler, row, len(history) - 1, max_nodes=nodes,
                                 max_depth=draft_len, max_width=self.tree_width, drafter=self.name)
        except BaseException:
            self._tokens.clear()
            raise

    def accepted(self, history: Sequence[int], n_accepted: int) -> None:
        # Nothing eager: the next propose() rebuilds the rows from the target's features.
        pass

    def reset(self) -> None:
        pass

    def close(self) -> None:
        self.target.remove_decode_listener(self.observe)
