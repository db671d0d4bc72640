"""Model-free drafting from the context itself (prompt lookup).

``NgramIndex`` maps every n-gram of the history (n_min <= n <= n_max) to the
positions right after its occurrences. To draft, take the longest suffix of
the history that occurred before and propose what followed it. Text that
repeats its context (code edits, quoting, summaries, structured output) then
drafts whole spans for free; the target verifies them, so a wrong guess costs
a little compute and never changes the output.

All of this is pure Python on token lists: no model, no llama_cpp.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar, Sequence

from localspec.drafting.base import DrafterBase, Proposal, TreeProposal
from localspec.drafting.lookup import Lookup, NgramSource, ReplyStore, proposal_from_lookup, strongest
from localspec.drafting.loops import end_loop, loop_lookup, loop_run
from localspec.drafting.ngram_index import NgramIndex
from localspec.token_ids import as_list, held_prefix


@dataclass
class DrafterStats:
    proposals: int = 0
    drafted: int = 0
    accepted: int = 0


# The tokens a match with one substituted token needs besides it to be offered (NgramDrafter.gapped_min).
GAPPED_MIN = 6

# A match shorter than this (or one whose occurrences disagree) is no copy in progress: it gives way to a
# match with one token substituted.
COPY_MIN_MATCH = 4


# What taking a token out of the index costs (``NgramIndex.truncate``) in tokens indexed (``extend``):
# 3.4 against 1.3 µs a token on a 2-core CPU.
_UNDO_COST = 3


@dataclass
class NgramDrafter(DrafterBase):
    """Prompt-lookup drafting behind the Drafter protocol (deterministic drafts).

    The engine passes the whole history every call; the index catches up with
    it when asked for a proposal (not when told a step's outcome, so steps it
    is not asked for cost nothing). It follows the history by
    bookkeeping, not by comparing it whole: when the history is at least as
    long as the index and agrees on the index's last ``sync_check`` tokens,
    only the new tokens are indexed; otherwise the common prefix is found
    (C-speed list comparison) and the index is rolled back to it. A change
    hidden before the checked tail would only make drafts worse, never the
    output wrong, since every draft is verified by the target. A new sequence
    (``reset``) keeps the index, as the engine keeps the KV cache, and compares
    the next history with it whole: a chat's next turn indexes only what is new.

    ``sources`` are extra n-gram sources (e.g. a personal store of past
    outputs, or a REST datastore); the lookup with the strongest evidence
    (``strongest``) proposes. The drafter decides no length: it offers its
    best candidate (or a trie of them) as deep as asked, with the evidence,
    and the controller chooses how much of it to verify.

    A match with one token substituted: where the context's own match is
    short or split (no copy in progress), the history's end is also matched
    allowing one substituted token (``NgramIndex.gapped``); with at least
    ``gapped_min`` tokens matched besides it, and more than the exact match,
    what followed that place is offered, its evidence marked ``gapped`` (a
    class the controller learns apart). A numbered list's next item (``7.``
    where the last line began ``6.``) or a copied line after a renamed
    identifier is continued so at once, where the exact match is one token
    (``.``) whose continuations split (``benchmarks/replay_ngram.py`` compares
    ``gapped_min`` values on recorded replies).

    A loop: where the history's end repeats a span over and over and the
    proposal carries it on, its evidence says how long the loop has run
    (``Evidence.loop``, see ``loop_run``), and the controller learns such
    offers apart from other matches of their length (``loops=False`` turns it off).
    A span said three times over at the end is carried on as a loop even when
    the index's longest match points elsewhere (``end_loop``).
    """

    n_min: int = 1
    n_max: int = 4
    max_match: int = 32  # see NgramIndex: a match may grow past n_max to find the place being copied
    sources: list[NgramSource] = field(default_factory=list)
    reply_store: ReplyStore | None = None  # where finished replies are kept (one of ``sources`` too)
    max_candidates: int = 8
    sync_check: int = 16
    max_branches: int = 1  # > 1: propose a trie of continuations when the evidence splits
    gapped_min: int = GAPPED_MIN  # see the class notes: 0 turns matches with a substituted token off
    loops: bool = True  # see the class notes: mark proposals that carry on a loop (``loop_run``)
    name: str = "ngram"
    stats: DrafterStats = field(default_factory=DrafterStats)
    cheap: ClassVar[bool] = True  # a lookup: the controller may ask it before planning (see Drafter)
    follows_each_step: ClassVar[bool] = False  # a step it had no part in changes nothing here (see Drafter)

    def __post_init__(self) -> None:
        self._index = self._new_index()
        self.reset()

    def _new_index(self) -> NgramIndex:
        return NgramIndex(self.n_min, self.n_max, max_match=self.max_match)

    def reset(self) -> None:
        # A new sequence. The index is kept, as the KV cache is: a chat's next turn (a request that
        # shares a system prompt) begins with what it indexed, and indexing that again cost the turn's
        # first lookup ~2 µs a token (25 ms for a 12,000-token conversation on a 2-core CPU, beside a
        # GPU's ~20 ms to the first token). None of it is trusted: the next lookup compares it whole.
        self._trusted = False
        self._last_own: Lookup | None = None  # the context index's own lookup of the last proposal

    def remember_reply(self, reply: Sequence[int], context: Sequence[int]) -> bool:
        return self.reply_store.remember(reply, context) if self.reply_store is not None else False

    def _sync(self, history: Sequence[int]) -> None:
        index = self._index
        n_idx = len(index)
        common = held_prefix(index.tokens, history, trusted=self._trusted, check=self.sync_check)
        if _UNDO_COST * (n_idx - common) > common:  # cheaper to index the shared part again than to undo the rest
            index = self._index = self._new_index()
            common = 0
        elif common < n_idx:
            index.truncate(common)
        index.extend(history[common:])
        self._trusted = True

    def _best_lookup(self, history: Sequence[int], draft_len: int) -> Lookup | None:
        self._sync(history)
        lookup = self._last_own = self._index.query(draft_len, self.max_candidates)
        if not self.sources:
            return lookup
        tail = as_list(history[-64:])
        return strongest([lookup] + [s.lookup(tail, draft_len, self.max_candidates) for s in self.sources])

    def propose(self, history: Sequence[int], draft_len: int) -> Proposal | TreeProposal:
        lookup = self._best_lookup(history, draft_len)
        own = lookup is not None and lookup is self._last_own
        run = loop_run(self._index.tokens, lookup) if self.loops and own else 0
        if self.loops and not run:
            period, run = end_loop(self._index.tokens)
            if run:  # the end repeats a span three times over, and the lookup chose another match
                lookup = loop_lookup(self._index.tokens, period, run, draft_len)
        # A copy or a loop in progress proposes as it is; otherwise a match with one token substituted
        # may propose instead, when it is longer.
        copying = run > 0 or (lookup is not None and lookup.match_len >= COPY_MIN_MATCH
                              and lookup.candidates[0].support[0] >= 0.999)
        proposal = None
        if not copying and self.gapped_min > 0:
            gapped = self._index.gapped(draft_len, self.max_candidates, min_match=self.gapped_min)
            if gapped is not None and gapped.candidates and (lookup is None or gapped.match_len > lookup.match_len):
                proposal = proposal_from_lookup(gapped, draft_len, self.max_branches, self.name)
        if proposal is None:
            proposal = proposal_from_lookup(lookup, draft_len, self.max_branches, self.name)
            if run and proposal.evidence is not None:
                proposal = dataclasses.replace(proposal, evidence=dataclasses.replace(proposal.evidence, loop=run))
        self.stats.proposals += 1
        self.stats.drafted += len(proposal)
        return proposal

    def accepted(self, history: Sequence[int], n_accepted: int) -> None:
        # The index follows the history at the next proposal (``_sync``), the tokens it missed in one
        # go: a drafter the controller does not ask for a few steps costs those steps nothing.
        self.stats.accepted += n_accepted
