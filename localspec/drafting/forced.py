"""The forced-text drafter: what a grammar leaves no choice about, drafted at no model cost.

A JSON schema or a tool-call grammar spells out its keys and punctuation: after ``{"`` the text ``name"``
may be the only one the grammar allows. Where the grammar forces text after the history
(``constraints.GrammarShaper.forced_text``: each byte the only one it allows next), this drafter proposes
that text in the target's tokens, as the tokenizer splits it, less the last tokens that a byte allowed after
the text would join (``{`` where ``{"`` may come). It is a lookup (``cheap``): a grammar check
over about a hundred one-byte tokens per forced byte, and none where the grammar allows a choice (most
positions of free text), so the controller asks it before every step and drafts with it when it offers.

Why text, not tokens: a tokenizer has many spellings of one text (``{"``, ``{`` then ``"``...), and the
grammar allows every spelling whose text it allows, so a position where exactly one *token* is allowed is
rare (a one-byte token that no longer token starts, where the grammar forces that byte and nothing after
it). The tokens are a guess at the target's split of text it must write; verification judges them like any
other deterministic draft (``acceptance``), so the output is exactly the constrained target's, and the
grammar masks every verified row as ever. Without a grammar the drafter offers nothing.
"""

from __future__ import annotations

from typing import Sequence

from localspec.backend import Model
from localspec.constraints import grammar_shaper
from localspec.drafting.base import DrafterBase, Proposal
from localspec.drafting.specs import FORCED
from localspec.sampling import Sampler

BYTES_PER_TOKEN = 8
"""Forced bytes looked for per token asked: enough for the longest tokens of forced JSON text."""


class ForcedDrafter(DrafterBase):
    """Proposes the text the generation's grammar forces next (see the module notes); one per generation."""

    name = FORCED
    cheap = True
    follows_each_step = False  # a step it had no part in changes nothing here (see Drafter)

    def __init__(self, target: Model, sampler: Sampler) -> None:
        self.target = target
        self.sampler = sampler

    def propose(self, history: Sequence[int], draft_len: int) -> Proposal:
        shaper = grammar_shaper(self.sampler.shaper)  # the generation's grammar (None: not constrained)
        if shaper is None or draft_len <= 0:
            return Proposal(drafter=self.name)
        text, after = shaper.forced_text(history, BYTES_PER_TOKEN * draft_len)
        if not text:
            return Proposal(drafter=self.name)
        forced = text.decode("ascii")
        tokens = self.target.tokenize(forced, add_special=False)
        if b"".join(self.target.piece(t) for t in tokens) != text:  # a tokenizer that adds a space prefix
            return Proposal(drafter=self.name)
        # The text's last bytes may be written together with what follows them ('{' then '"' as one
        # '{"'): the tokens kept are those that every byte that may come next leaves as they are.
        keep = len(tokens)
        for byte in after.decode("ascii"):
            spelt = self.target.tokenize(forced + byte, add_special=False)
            keep = next((i for i, (a, b) in enumerate(zip(tokens[:keep], spelt)) if a != b), keep)
            if keep == 0:
                break
        return Proposal(tuple(tokens[:min(keep, draft_len)]), None, self.name)

    def accepted(self, history: Sequence[int], n_accepted: int) -> None:
        pass  # nothing to learn: the grammar alone decides
