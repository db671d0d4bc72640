"""Gemma 4's "assistant" GGUF as the drafter: a draft model that reads its target's own cache.

Gemma 4 publishes, beside each target, a small ``gemma4-assistant`` model. It
keeps no KV cache: llama.cpp runs it in a context tied to the target's
(``backend.AssistantContext``), where its sliding-window layers attend to the
K/V of the target's last sliding-window layer and its global layers to the
target's last layer, over the target's own cells. Each step it reads:

* the token ``x`` to continue from, embedded with the TARGET's token embedding
  (scaled by sqrt of the target's width);
* a hidden row ``h`` of the target's width: for the first draft, the target's
  post-final-norm hidden state at the position before ``x`` (the row whose
  logits chose ``x``); for each further draft, the assistant's own output
  projected back to that width (``nextn.post_projection``);
* the target's KV cache: every cell of sequence 0 up to ``x``'s position.

All draft steps of one proposal run at ``x``'s position (as llama.cpp's
``draft-mtp`` and the reference implementation do: the assistant writes
nothing, so later draft tokens never enter a cache). Nothing needs catching
up or rolling back: after verification, the target's cache already holds what
was kept, and the next proposal starts from the target's hidden row there.

At temperature > 0 the draft tokens are sampled from the assistant's
distribution q under the target's sampling settings, and the proposal carries
q: verification accepts by exact rejection sampling, so the output follows the
target's distribution exactly. At temperature 0 drafts are the assistant's
argmax, kept while they equal the target's. A missing hidden row (one the
target never computed on sequence 0) is replaced by zeros: that costs
acceptance, never correctness.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence

import numpy as np

from localspec.backend import ASSISTANT_TARGETS
from localspec.drafting.base import Proposal, draft_chain
from localspec.drafting.fed import ListeningDrafter, Target
from localspec.errors import IncompatibleDraftError
from localspec.sampling import Sampler

# Target rows kept, the newest: a verification batch is never deeper.
_ROWS_KEPT = 64


class AssistantHead(Protocol):
    """The assistant's context (``backend.AssistantContext``): no cache of its own, one row a decode, which it
    refuses (False) when the target's cache has no free cell left."""

    n_embd: int

    def decode(self, token: int, position: int, hidden: np.ndarray) -> bool: ...

    def logits(self) -> np.ndarray: ...

    def hidden(self) -> np.ndarray: ...


class AssistantDrafter(ListeningDrafter):
    """Drafts with a Gemma 4 assistant; the drafter protocol.

    ``p_min``: stop drafting when the assistant's own top probability falls below it.
    """

    def __init__(self, head: AssistantHead, target: Target, sampler: Sampler, *, p_min: float = 0.0,
                 name: str = "draft") -> None:
        super().__init__(target, target.hidden_rows, head.n_embd, _ROWS_KEPT)
        self.name = name
        self.head = head
        self.sampler = sampler
        self.p_min = p_min

    def propose(self, history: Sequence[int], draft_len: int) -> Proposal:
        pos = len(history) - 1  # where history[-1] goes: the target's cache holds everything before it
        if draft_len <= 0 or pos < 1:
            # With nothing in the target's cache there is nothing to attend to (its logits would be NaN).
            return Proposal(drafter=self.name)
        self.rows.drop_before(pos - 1)

        def logits(depth: int, drafted: Sequence[int]) -> np.ndarray | None:
            # The first step reads the target's row before the last token; each further step the assistant's
            # own output, at the same position.
            token, hidden = ((history[-1], self.rows.row(history, pos - 1)) if depth == 0
                             else (drafted[-1], np.array(self.head.hidden())))
            if not self.head.decode(token, pos, hidden):
                return None  # the target's cache has no free cell left: draft no further
            out = self.head.logits()
            # No cell to attend to (a cache cleared under it): never a draft from NaN.
            return out if np.isfinite(out.max()) else None

        return draft_chain(logits, self.sampler, self.p_min, history, draft_len, self.name)


# --- does an assistant fit its target? (from GGUF headers, before any weights load) ------------


def _per_layer(value: Any, n: int) -> list[int]:
    if isinstance(value, (list, tuple)):
        values = [int(v) for v in value]
        return (values + [values[-1] if values else 0] * n)[:n]
    return [int(value or 0)] * n


def check_assistant_fits(target: Any, assistant: Any) -> None:
    """Raise IncompatibleDraftError unless llama.cpp can run ``assistant`` against ``target``.

    Both are ``models.gguf_info.GGUFInfo``. The rules are what the assistant's graph
    and its shared cache assume (``src/models/gemma4-assistant.cpp``,
    ``llama_model::create_memory``): a target of the architecture it was made for;
    hidden rows of the target's width (``embedding_length_out``); the same vocabulary
    size; a target whose last layer is global and the one before it sliding-window
    (the layers whose K/V it reads); and, per assistant layer, the KV heads and head
    size of the target layer it reads.
    """
    a_hp, t_hp = assistant.hparams, target.hparams
    want = ASSISTANT_TARGETS.get(assistant.architecture)

    def fail(problem: str, fix: str = "use the assistant published for this target model") -> IncompatibleDraftError:
        return IncompatibleDraftError(
            f"assistant {assistant.label} does not fit target {target.label}: {problem}; {fix}")

    if want is None:
        raise fail(f"{assistant.architecture} is not an assistant architecture", "use it as an ordinary draft")
    if target.architecture != want:
        raise fail(f"it drafts for {want} models, the target is {target.architecture}",
                   f"pair it with a {want} target, or draft for this target with ngram or a draft model")
    width = int(a_hp.get("embedding_length_out", 0) or 0)
    if width != target.n_embd:
        raise fail(f"it reads hidden rows of {width}, the target's are {target.n_embd} wide")
    if assistant.n_vocab != target.n_vocab:
        raise fail(f"vocabulary size differs (target {target.n_vocab}, assistant {assistant.n_vocab})")
    t_layers = target.n_layers
    t_swa = t_hp.get("attention.sliding_window_pattern")
    t_swa = [bool(v) for v in t_swa] if isinstance(t_swa, (list, tuple)) else []
    if t_layers < 2 or len(t_swa) < t_layers or t_swa[t_layers - 1] or not t_swa[t_layers - 2]:
        raise fail("the target's last layer is not global after a sliding-window one, "
                   "so there are no layers whose cache it could read", "check the target file")
    a_layers = assistant.n_layers
    a_swa = a_hp.get("attention.sliding_window_pattern")
    a_swa = ([bool(v) for v in a_swa] + [False] * a_layers)[:a_layers] if isinstance(a_swa, (list, tuple)) \
        else [False] * a_layers
    t_kv = _per_layer(t_hp.get("attention.head_count_kv", t_hp.get("attention.head_count", 0)), t_layers)
    a_kv = _per_layer(a_hp.get("attention.head_count_kv", a_hp.get("attention.head_count", 0)), a_layers)

    def head_dim(hp: dict[str, Any], swa: bool) -> int:
        full = int(hp.get("attention.key_length", 0) or 0)
        return int(hp.get("attention.key_length_swa", full) or full) if swa else full

    for il in range(a_layers):
        src = t_layers - 2 if a_swa[il] else t_layers - 1
        kind = "sliding-window" if a_swa[il] else "global"
        if a_kv[il] != t_kv[src] or head_dim(a_hp, a_swa[il]) != head_dim(t_hp, a_swa[il]):
            raise fail(f"its {kind} layer {il} reads {a_kv[il]} KV heads of size {head_dim(a_hp, a_swa[il])}, "
                       f"the target's layer {src} has {t_kv[src]} of size {head_dim(t_hp, a_swa[il])}")
