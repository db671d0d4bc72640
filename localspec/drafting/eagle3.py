"""An EAGLE-3 draft (Li et al. 2025) as the drafter: one block that drafts from three of the target's layers.

The draft reads, at every position P of the history, the inputs of three target
layers (low, middle, high; the draft names them), side by side: its encoder
projects them to one row ``g_P`` of its width (``backend.Eagle3Context.encode``).
Its decoder block has its own KV cache; its row at position P is built from the
token ``x_{P+1}`` and ``g_P`` and predicts ``x_{P+2}`` (llama.cpp's convention in
``common/speculative.cpp``: the token is "shifted left by one" against g).

The cache is kept in step with the history lazily, as the MTP head's is
(``fed.FedDrafter``): ``propose`` first decodes the rows the cache lacks,
``(x_{P+1}, g_P)`` for P up to ``len(history) - 2`` (the last holds the history's
last token, whose logits give the first draft), encoding their features in one
encoder pass; then each further draft token is decoded at the next position with
the decoder's own pre-norm output in place of g (the target has not computed it
yet). Those draft rows are dropped before the next catch-up rebuilds them from
the target's features.

Memory: the target's feature rows (3 x its width per token) wait in ``rows``
until a catch-up consumes them; at most ``max_row_bytes`` are kept (``fed``).

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

from localspec.drafting.draft_tree import TREE_WIDTH
from localspec.drafting.fed import FedDrafter, FedHead, Target
from localspec.errors import IncompatibleDraftError
from localspec.llama_facts import EAGLE3_N_TARGET_LAYERS, LAYER_TAP_ARCHITECTURES
from localspec.sampling import Sampler

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


class Eagle3Head(FedHead, Protocol):
    """The draft's context (``backend.Eagle3Context``): a fed head with an encoder in front, which turns rows
    of the target's tapped features (``n_features`` wide) into the rows g its decoder reads."""

    n_features: int

    def encode(self, features: np.ndarray) -> np.ndarray: ...


class Eagle3Drafter(FedDrafter):
    """Drafts with an EAGLE-3 model; the drafter protocol.

    ``p_min``: stop drafting when the draft's own top probability falls below it.
    ``propose_tree``: a tree grown best-first (``draft_tree.grow_tree``) level by level, where the
    head has sequences for its nodes: each waiting node is decoded in one batch, on a sequence of its
    own sharing its parent's cells, fed its parent's own pre-norm output (as a chain's next token is);
    the sequences are removed afterwards.
    """

    name = EAGLE3
    head: Eagle3Head  # row P: the token x_{P+1} with g_P (lag 0, reads a token)

    def __init__(self, head: Eagle3Head, target: Target, sampler: Sampler, *, p_min: float = 0.0,
                 max_row_bytes: int | None = None) -> None:
        super().__init__(head, target, target.layer_features, head.n_features, sampler, p_min=p_min,
                         max_row_bytes=max_row_bytes)
        self.tree_width = TREE_WIDTH if head.n_seq > 1 else 0

    def _feed(self, tokens: Sequence[int], positions: Sequence[int], rows: np.ndarray,
              outputs: Sequence[bool]) -> None:
        # The catch-up's features are encoded in one encoder pass a batch.
        self.head.decode(tokens, positions, self.head.encode(rows), outputs)
