"""REST drafting (He et al. 2024): continuations of the context found in a datastore.

The store (``localspec index``) is a suffix array over the user's own files,
tokenized with the target's tokenizer. Each step the longest suffix of the
history that occurs in the store is found by binary search, the continuations
that follow its occurrences are gathered, and the frequent ones become a
candidate trie verified in one batch.
"""

from __future__ import annotations

import os
from typing import Sequence

from localspec.drafting.base import DrafterBase, Proposal, TreeProposal
from localspec.drafting.lookup import proposal_from_lookup
from localspec.drafting.suffix_array import Store, open_store

# How much of the history is searched for a suffix match: matches longer than
# this add no evidence worth the binary-search steps.
CONTEXT_TAIL = 64


class RestDrafter(DrafterBase):
    """Drafts from a memory-mapped datastore; deterministic, stateless between steps.

    Like the n-gram drafter it offers what it found as deep as asked, with the
    evidence; the controller chooses the length."""

    cheap = True  # a lookup: the controller may ask it before planning (see Drafter)
    follows_each_step = False  # a step it had no part in changes nothing here (see Drafter)

    def __init__(self, store: Store, *, name: str = "rest", max_branches: int = 4, max_candidates: int = 8) -> None:
        self.store = store
        self.name = name
        self.max_branches = max_branches
        self.max_candidates = max_candidates

    @classmethod
    def open(cls, store_path: str | os.PathLike[str], model_path: str | os.PathLike[str], *,
             name: str = "rest") -> "RestDrafter":
        """Open a store, refusing one built for another tokenizer than ``model_path``'s,
        or one whose arrays point outside each other or hold ids outside the
        model's vocabulary (which would reach llama_decode); see ``open_store``."""
        from localspec.models.gguf_info import read_info, tokenizer_fingerprint

        fingerprint = tokenizer_fingerprint(model_path)
        return cls(open_store(store_path, fingerprint, n_vocab=read_info(model_path).n_vocab), name=name)

    def propose(self, history: Sequence[int], draft_len: int) -> Proposal | TreeProposal:
        tail = list(history[-CONTEXT_TAIL:])
        lookup = self.store.lookup(tail, draft_len, self.max_candidates)
        return proposal_from_lookup(lookup, draft_len, self.max_branches, self.name)

    def accepted(self, history: Sequence[int], n_accepted: int) -> None:
        pass

    def reset(self) -> None:
        pass
