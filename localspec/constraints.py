"""Constrained output: a grammar's mask on every row, exact under speculation.

A grammar (GBNF, or a JSON schema turned into one) rules tokens out after each prefix. Plain decoding
masks its one row by the state the grammar reached after everything generated; speculation must judge
every verified row by the state reached along the drafted path before it, or the output would not be
plain decoding's. ``GrammarShaper`` is that: a ``sampling.RowShaper`` that keeps the grammar state
after the kept tokens (advanced as the history grows, never undone) and, for a row after a drafted
``path``, clones it and advances the clone along the path (states cached per path within a step and
dropped when the history moves on: the rollback is not keeping them). The draft is masked the same way
before it proposes (``drafting.base.draft_token``), so rejection sampling runs between the two
constrained distributions, and greedy output is token-identical with and without speculation.

Masking a whole vocabulary is llama.cpp's costliest grammar call (every token's text against the parse
stacks, milliseconds for 50k tokens), so at temperature 0 a row is masked only as far as its argmax
needs: the most probable token alone is asked first, and only when the grammar rules it out are the
next most probable asked, in widening batches. The argmax of the row returned is the masked row's
argmax, exactly; the probabilities of tokens below it are left as they were.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Sequence

import numpy as np

from localspec.backend.grammar import Grammar, GrammarState, schema_grammar
from localspec.errors import InvalidOptionError
from localspec.sampling import ShaperChain, argmax

# Candidates asked at once while looking for a greedy row's most probable allowed token.
_WIDTHS = (16, 256, 4096)


def grammar_text(grammar: str | None, json_schema: object) -> str | None:
    """The GBNF a generation is constrained by: ``grammar`` as it is, or ``json_schema`` (a mapping, JSON
    text, or True for any JSON object) converted by llama.cpp's schema converter; None for neither.
    ``InvalidOptionError`` for both, for a schema that is not JSON, or one the converter cannot express."""
    if grammar is not None and json_schema is not None:
        raise InvalidOptionError("grammar and json_schema were both given; constrain the output by one of them",
                                 param="grammar")
    if grammar is not None:
        if not isinstance(grammar, str):
            raise InvalidOptionError(f"grammar must be GBNF text, not {type(grammar).__name__}", param="grammar")
        return grammar
    if json_schema is None:
        return None
    if json_schema is True:
        json_schema = {"type": "object"}
    if isinstance(json_schema, str):
        try:
            json_schema = json.loads(json_schema)
        except json.JSONDecodeError as err:
            raise InvalidOptionError(f"json_schema is not JSON: {err}; give a JSON Schema object",
                                     param="json_schema") from None
    if not isinstance(json_schema, Mapping):
        raise InvalidOptionError(f"json_schema must be a JSON Schema object, not {type(json_schema).__name__}",
                                 param="json_schema")
    return schema_grammar(dict(json_schema))


class GrammarShaper:
    """Masks each row by ``grammar``'s state after the tokens before it (see the module notes).

    ``start``: the history's length when the generation starts (the prompt's: the grammar constrains
    only what follows it). ``greedy``: rows are only read for their argmax (temperature 0), so a row is
    masked only as far as its argmax needs."""

    def __init__(self, grammar: Grammar, start: int, *, greedy: bool) -> None:
        self.grammar = grammar
        self.greedy = greedy
        self._kept = grammar.start()
        self._seen = start
        self._paths: dict[tuple[int, ...], GrammarState | None] = {}

    def state(self, history: Sequence[int], path: Sequence[int] = ()) -> GrammarState | None:
        """The grammar's state after ``history`` + ``path``; None where ``path`` breaks the grammar."""
        if len(history) != self._seen:
            self._advance(history)
        if not path:
            return self._kept
        key = tuple(path)
        hit = self._paths.get(key, False)
        if hit is not False:
            return hit
        n = len(key) - 1
        while n > 0 and key[:n] not in self._paths:
            n -= 1
        state = self._kept if n == 0 else self._paths[key[:n]]
        for i in range(n, len(key)):
            if state is not None:
                if state.allows(key[i]):
                    state = state.clone()
                    state.accept(key[i])
                else:
                    state = None
            self._paths[key[: i + 1]] = state
        return state

    def forced_text(self, history: Sequence[int], max_bytes: int) -> tuple[bytes, bytes]:
        """The text the grammar forces right after ``history``, up to ``max_bytes`` bytes, and the bytes
        that may follow it (``GrammarState.forced_bytes``: a guess for a drafter, which verification judges
        like any other)."""
        state = self.state(history)
        return state.forced_bytes(max_bytes) if state is not None else (b"", b"")

    def _advance(self, history: Sequence[int]) -> None:
        if len(history) < self._seen:
            raise ValueError("a grammar's history only grows within a generation")
        for state in self._paths.values():
            if state is not None:
                state.free()
        self._paths.clear()
        for tok in history[self._seen:]:
            self._kept.accept(tok)  # every kept token came from a row this grammar masked
        self._seen = len(history)

    def shape(self, logits: np.ndarray, history: Sequence[int], path: Sequence[int]) -> np.ndarray:
        state = self.state(history, path)
        if state is None:  # past a token the grammar rules out: no token may follow
            return np.full(len(logits), -np.inf, dtype=np.float32)
        if self.greedy:
            return _masked_for_argmax(state, logits)
        return state.mask(logits)


def grammar_shaper(shaper: object) -> GrammarShaper | None:
    """The ``GrammarShaper`` among a sampler's shapers (itself, or one of a ``ShaperChain``'s); None: the
    generation is not constrained."""
    if isinstance(shaper, GrammarShaper):
        return shaper
    if isinstance(shaper, ShaperChain):
        return next((s for s in shaper.shapers if isinstance(s, GrammarShaper)), None)
    return None


def _masked_for_argmax(state: GrammarState, logits: np.ndarray) -> np.ndarray:
    """``logits`` with the tokens ruled out above the most probable allowed one at ``-inf``: its argmax
    (lowest id among ties, as ``np.argmax``) is the fully masked row's."""
    x = np.asarray(logits)
    top = argmax(x)
    if state.allows(top):
        return x  # the argmax is allowed: nothing above it to rule out
    n = x.size
    for width in _WIDTHS:
        if width >= n:
            break
        ids = np.argpartition(x, n - width)[n - width:]
        floor = x[ids].min()
        ids = ids[np.lexsort((ids, -x[ids]))]  # by logit descending, ties by id
        ok = state.allowed(ids.astype(np.int32))
        hits = np.flatnonzero(ok)
        # A pick tied with the floor might tie with a lower id outside the candidates: ask more.
        if hits.size and x[ids[hits[0]]] > floor:
            out = np.array(x, dtype=np.float32)
            out[ids[: hits[0]]] = -np.inf
            return out
    return state.mask(x)
