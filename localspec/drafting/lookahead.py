"""Lookahead decoding (Fu et al. 2024): Jacobi iteration in a window, plus an n-gram pool.

Each step puts three things into ONE target batch: the history's last token,
a trie of candidates taken from the n-gram pool (verified like any tree), and
a W x (N-1) window of guesses that the target refines by Jacobi iteration.
The window's newest guesses and the n-grams read along it feed the pool, so
later steps can propose continuations the text has not shown yet.

The window. ``levels[j][i]`` (level j < N-1, column i < W) is a guess for the
token at offset ``i + j`` after the last token (offset 0); level 0 is the
oldest iteration, level N-2 the newest. Each level is the previous one moved
one position on, so column i holds a chain of consecutive offsets i..i+N-2.
Level 0 column 0 would sit at offset 0, where the last token itself is, so it
is never decoded.

Attention, as in llama.cpp's lookahead example (and the LMSYS mask): column i
is drafter sequence i, and its newest token must see the history, the last
token, level 0 at offsets 1..i (the oldest guesses up to its column), then its
own column upward (levels 1..N-2 at offsets i+1..i+N-2). llama.cpp masks a
token by its FIRST sequence id (it sees the cells carrying that id at
positions <= its own), so:

* the last token carries every sequence (the step does that);
* level 0, column i >= 1 carries sequences (i, i+1, ..., W-1): every column
  at or right of it sees it, and its own id comes first;
* level j >= 1, column i carries sequence i alone.

Each sequence's positions are then contiguous (what llama.cpp requires), and
the logits of the newest level give, by argmax, the next iteration's guesses
one position further on (``fresh``). The chain of column f, extended by its
fresh guess, is an N-gram over offsets f..f+N-1; it goes into the pool.

Moving on. A step that emits e tokens (accepted + the target's own) moves the
last token e positions on, so old level j + e becomes new level j: every
guess keeps its absolute position, the oldest levels drop out, and levels the
stack cannot supply are filled from the one before (``shift_levels``). This
is llama.cpp's level shift, one level per emitted token; llama.cpp refills
the newest level with a copy of level 0, which sits N-2 positions off.

Cost on a CPU: a step computes W-1 + W*(N-2) window tokens plus up to
G*(N-1) candidates, and verification there is compute-bound (on the 2-core
test machine a 16-token batch cost ~8 single-token decodes, a 30-token one
~12). llama.cpp's W=15, N=5, G=15 means ~120 tokens a step; the defaults here
(W=5, N=4, G=5: 14 window tokens, at most 15 candidate nodes) keep a step
near 30, and W + G = 10 sequences leaves the engine's 32 room for larger
settings where a GPU makes batch tokens cheap.

Everything here is pure Python on token lists; the step (speculative.py)
does the decoding.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from localspec.drafting.base import BatchExtra, DrafterBase, TreeProposal
from localspec.drafting.tree import tree_from_branches
from localspec.sampling import argmax
from localspec.token_ids import as_list, common_prefix


class NgramPool:
    """First token -> up to ``per_key`` distinct continuations of ``n - 1`` tokens, most recent first.

    Adding a continuation already held moves it to the front. At most
    ``max_keys`` first tokens are kept; the one least recently added to goes
    first, so a long life over many replies stays bounded in memory.
    """

    def __init__(self, n: int, per_key: int, max_keys: int = 1 << 16) -> None:
        if n < 2 or per_key < 1 or max_keys < 1:
            raise ValueError("need n >= 2, per_key >= 1 and max_keys >= 1")
        self.n, self.per_key, self.max_keys = n, per_key, max_keys
        self._pool: dict[int, list[tuple[int, ...]]] = {}

    def __len__(self) -> int:
        return len(self._pool)

    def add(self, ngram: Sequence[int]) -> None:
        """Remember ``ngram`` (exactly ``n`` tokens) as a continuation of its first token."""
        if len(ngram) != self.n:
            raise ValueError(f"the pool holds {self.n}-grams, got {len(ngram)} tokens")
        first, cont = int(ngram[0]), tuple(int(t) for t in ngram[1:])
        # Popped and re-inserted, so dict order is the order of last update (oldest first).
        conts = self._pool.pop(first, [])
        if cont in conts:
            conts.remove(cont)
        conts.insert(0, cont)
        del conts[self.per_key:]
        self._pool[first] = conts
        if len(self._pool) > self.max_keys:
            del self._pool[next(iter(self._pool))]

    def get(self, first: int) -> list[tuple[int, ...]]:
        """The continuations of ``first``, most recent first (a copy)."""
        return list(self._pool.get(first, ()))


def seed_levels(history: Sequence[int], width: int, n_levels: int) -> list[list[int]]:
    """A first window: guess that the text repeats its last tokens.

    The guess at offset o is ``tail[o % len(tail)]``, the same at every level,
    so the seed is consistent along positions; Jacobi iteration replaces it.
    Tokens from the history are always valid ones (never special or unused).
    """
    tail = [int(t) for t in history[-(width + n_levels):]] or [0]
    return [[tail[(i + j) % len(tail)] for i in range(width)] for j in range(n_levels)]


def window_batch(levels: Sequence[Sequence[int]]) -> tuple[list[int], list[int], list[tuple[int, ...]], list[bool]]:
    """The window as batch rows: tokens, offsets, drafter sequence ids, outputs.

    Row order: level 0 columns 1..W-1, then each level j >= 1 columns 0..W-1,
    so the newest level's W output rows come last, column order. See the
    module docstring for why each row carries the sequences it does.
    """
    width, n_levels = len(levels[0]), len(levels)
    tokens, offsets, seqs, outputs = [], [], [], []
    for i in range(1, width):
        tokens.append(levels[0][i])
        offsets.append(i)
        seqs.append(tuple(range(i, width)))  # its own column first: the mask uses the first id
        outputs.append(False)
    for j in range(1, n_levels):
        for i in range(width):
            tokens.append(levels[j][i])
            offsets.append(i + j)
            seqs.append((i,))
            outputs.append(j == n_levels - 1)
    return tokens, offsets, seqs, outputs


def column_ngrams(levels: Sequence[Sequence[int]], last: int, fresh: Sequence[int]) -> list[list[int]]:
    """The N-gram of each column: its chain of guesses (offsets f..f+N-2) and its fresh guess.

    Column 0 starts at offset 0, which is the last token itself rather than
    the stale level-0 guess there.
    """
    out = []
    for f in range(len(fresh)):
        gram = [levels[j][f] for j in range(len(levels))] + [fresh[f]]
        if f == 0:
            gram[0] = last
        out.append(gram)
    return out


def shift_levels(stack: Sequence[Sequence[int]], by: int, n_levels: int) -> list[list[int]] | None:
    """The window after the last token moved ``by`` positions on; None if nothing survives.

    ``stack[j][i]`` sits at offset i + j (the window, plus the fresh level when
    the target refined it). After the shift, new level j must sit at new offset
    i + j = old offset i + j + by, which is exactly old level j + by. Levels
    beyond the stack are filled from the level before, moved one column left:
    that keeps every guess at its own position, and only the last column
    repeats its neighbour (nothing was ever guessed that far).
    """
    if by < 0 or by >= len(stack):
        return None
    levels = [list(level) for level in stack[by:by + n_levels]]
    while len(levels) < n_levels:
        prev = levels[-1]
        levels.append(prev[1:] + prev[-1:])
    return levels


@dataclass
class LookaheadStats:
    """What the drafter did: proposals made, candidate nodes offered, tokens kept, windows refined."""

    proposals: int = 0
    drafted: int = 0
    accepted: int = 0
    window_steps: int = 0
    reseeds: int = 0


@dataclass
class LookaheadDrafter(DrafterBase):
    """Lookahead decoding behind the Drafter protocol (deterministic tree drafts plus a window).

    ``width`` (W) columns of Jacobi guesses over ``ngram`` - 1 (N - 1) levels;
    at most ``max_candidates`` (G) pool n-grams verified per step. A step needs
    G leaf sequences and W window sequences, so ``G + W <= max_seqs``.

    The pool also learns the n-grams of the accepted history (prompt lookup
    with a one-token key), and it outlives ``reset``: its entries are only
    candidates the target verifies, and text from earlier replies often
    repeats in later ones. A new history's n-grams that lie within the part it
    shares with the last one (a chat's next turn: all but the new message) are
    in it already and are not added again. The window is tied to a position,
    so reset drops it.
    """

    width: int = 5
    ngram: int = 4
    max_candidates: int = 5
    max_seqs: int = 32
    max_keys: int = 1 << 16
    learn_history: bool = True  # False: the pool holds the window's n-grams only (to measure the window)
    name: str = "lookahead"
    stats: LookaheadStats = field(default_factory=LookaheadStats)

    def __post_init__(self) -> None:
        if self.width < 1 or self.ngram < 3 or self.max_candidates < 1:
            # N = 2 would leave only level 0, whose column 0 is the last token: no window to decode.
            raise ValueError("lookahead needs width >= 1, ngram >= 3 and max_candidates >= 1")
        if self.width + self.max_candidates > self.max_seqs:
            raise ValueError(f"width {self.width} + max_candidates {self.max_candidates} sequences exceed "
                             f"max_seqs {self.max_seqs}")
        self.pool = NgramPool(self.ngram, self.max_candidates, self.max_keys)
        self._levels: list[list[int]] | None = None
        self._anchor = -1  # history index of offset 0 (the last token) for _levels
        self._anchor_token = -1
        self._fresh: list[int] | None = None  # the newest level, once the target has computed it
        self._step = 0  # proposals made: ties on_logits to the proposal it belongs to
        self._indexed = 0  # history n-grams starting before this index are in the pool ...
        self._seen: list[int] = []  # ... of this history (its tokens up to the last one indexed)
        self._trusted = True  # False after a reset: the next history is compared with _seen first

    @property
    def n_levels(self) -> int:
        return self.ngram - 1

    @property
    def batch_extra_tokens(self) -> int:
        """Tokens the window adds to every verification batch (what ``window_batch`` emits)."""
        return self.width * self.n_levels - 1

    def reset(self) -> None:
        self._levels = None
        self._fresh = None
        # The next history is a new one, but a chat's next turn begins with this one: the n-grams of
        # the part they share are in the pool already (adding the whole history again took a turn
        # 25 ms for 12,000 tokens on a 2-core CPU). Compared at the next indexing (_index_history).
        self._trusted = False

    def propose(self, history: Sequence[int], draft_len: int) -> TreeProposal:
        """Pool n-grams continuing the last token (a trie up to ``draft_len`` deep), plus the window."""
        self._index_history(history)
        anchor = len(history) - 1
        if self._levels is None or self._anchor != anchor or self._anchor_token != int(history[-1]):
            self._seed(history)
        assert self._levels is not None
        last = int(history[-1])
        self._step += 1
        self._fresh = None
        branches = [c[:draft_len] for c in self.pool.get(last)[: self.max_candidates]] if draft_len > 0 else []
        tree = tree_from_branches(branches)
        tokens, offsets, seqs, outputs = window_batch(self._levels)
        step, levels = self._step, self._levels
        extra = BatchExtra(
            tokens=tuple(tokens), positions=tuple(offsets), seq_ids=tuple(seqs), outputs=tuple(outputs),
            on_logits=lambda get: self._on_logits(step, levels, last, get, len(tokens) - self.width),
        )
        self.stats.proposals += 1
        self.stats.drafted += len(tree)
        return TreeProposal(tree=tree, drafter=self.name, extra=extra)

    def _on_logits(self, step: int, levels: list[list[int]], last: int,
                   get: Callable[[int], np.ndarray], first_output: int) -> None:
        """The Jacobi update: the argmax at each newest-level row is the next guess one position on."""
        if step != self._step or levels is not self._levels:
            return  # logits of an older proposal: the window has moved since
        fresh = [argmax(get(first_output + i)) for i in range(self.width)]
        for gram in column_ngrams(levels, last, fresh):
            self.pool.add(gram)
        self._fresh = fresh
        self.stats.window_steps += 1

    def accepted(self, history: Sequence[int], n_accepted: int) -> None:
        """Move the window on by the tokens emitted this step; learn the history's new n-grams.

        The window moves whether or not the target refined it this step (the
        controller may have verified another drafter's proposal instead):
        a stale window still holds guesses for the positions ahead. When the
        history does not continue the one the window was made for, or the
        step emitted more tokens than the window reaches, it is seeded afresh.
        """
        self.stats.accepted += n_accepted
        self._index_history(history)
        if self._levels is None:
            return
        new_anchor = len(history) - 1
        stack = self._levels + ([self._fresh] if self._fresh is not None else [])
        continues = 0 <= self._anchor < new_anchor and int(history[self._anchor]) == self._anchor_token
        shifted = shift_levels(stack, new_anchor - self._anchor, self.n_levels) if continues else None
        self._fresh = None
        if shifted is None:
            self._seed(history)
            return
        self._levels = shifted
        self._anchor, self._anchor_token = new_anchor, int(history[-1])

    def _seed(self, history: Sequence[int]) -> None:
        self._levels = seed_levels(history, self.width, self.n_levels)
        self._anchor, self._anchor_token = len(history) - 1, int(history[-1])
        self._fresh = None
        self.stats.reseeds += 1

    def _index_history(self, history: Sequence[int]) -> None:
        """Add every complete N-gram of ``history`` not yet added (all of it after a reset)."""
        if not self.learn_history:
            return
        n = self.ngram
        if not self._trusted or self._indexed > len(history):  # a new history, or a shorter one
            shared = common_prefix(self._seen, history)
            self._indexed = min(self._indexed, max(0, shared - n + 1))  # n-grams within the shared part
            del self._seen[shared:]
            self._trusted = True
        end = len(history) - n + 1
        if end <= self._indexed:
            return
        tokens = as_list(history[len(self._seen):])
        self._seen.extend(tokens)
        tokens = self._seen[self._indexed:]
        for q in range(end - self._indexed):
            self.pool.add(tokens[q:q + n])
        self._indexed = end
