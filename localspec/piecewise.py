"""Tokenizing a long chat a message at a time, to the same ids as tokenizing it whole.

A chat sends its whole conversation every turn, so tokenizing the rendered text is work in
proportion to the conversation before every first token (30 ms a turn for 11,000 tokens on a 2-core
CPU: the largest host cost of a turn once the engine kept its cache and its drafters' indexes).

Why cutting is exact. llama.cpp tokenizes in two passes (``llama-vocab.cpp``:
``tokenizer_st_partition``, then one tokenizer session per fragment). The first pass cuts the text
at every occurrence of a special token's text (control, user-defined and unknown tokens; the longest
texts first, each scanned left to right, a match never taking characters an earlier one took). The
second tokenizes each stretch of text between the cuts on its own; the only state that crosses from
one stretch to the next is SentencePiece's "a special token came before", which also holds at the
start of a text. So take an occurrence of a special token's text that no other occurrence of any
special token's text overlaps: nothing can take its characters before its own scan finds it, so it
is a cut, and no match crosses it; the matches left of it are found alike with or without what
follows, and those right of it with or without what precedes. Tokenized alone, the text up to its end
and the text after it give the two parts of the whole's ids, provided the token does not strip the
whitespace after it (``RSTRIP``: Phi-3's tokens) and does not begin or end with whitespace (a
neighbour's stripping stops at its characters).

Cuts go after end-of-turn markers (``<|im_end|>``, ``<end_of_turn>``, ``<|eot_id|>``): each message is
then a piece whose ids are remembered by its text, and a turn tokenizes only the pieces it has not seen.
``tests/engine/test_piecewise.py`` holds the ids to the whole text's on real vocabularies, and a
vocabulary whose user-defined token overlaps the marker to the fallback.
"""

from __future__ import annotations

from typing import Callable, Iterable

PIECES_HELD = 1_000_000
"""The most token ids remembered across pieces (~40 MB; a long chat holds tens of thousands)."""

WINDOWS_HELD = 8192
"""The most marker neighbourhoods whose answer (a cut or not) is remembered."""


class SpecialTexts:
    """The texts llama.cpp cuts a text at before tokenizing it, by length, and the markers a chat may
    be cut after (those of them that strip nothing and hold no whitespace at either end)."""

    def __init__(self, texts: Iterable[str], markers: Iterable[str]) -> None:
        by_length: dict[int, set[str]] = {}
        for text in texts:
            if text:
                by_length.setdefault(len(text), set()).add(text)
        self.by_length: dict[int, frozenset[str]] = {n: frozenset(s) for n, s in sorted(by_length.items())}
        self.reach = max(self.by_length, default=0)
        """The longest special text: how far from a marker another occurrence could overlap it."""
        self.markers: tuple[str, ...] = tuple(
            m for m in dict.fromkeys(markers) if m and not m[0].isspace() and not m[-1].isspace())

    def stands_alone(self, text: str, start: int, end: int) -> bool:
        """Whether no occurrence of a special text in ``text`` overlaps ``text[start:end]`` (itself a
        special text) but that one: then llama.cpp certainly cuts there."""
        span = end - start
        for n, texts in self.by_length.items():
            for x in range(max(0, start - n + 1), min(end, len(text) - n + 1)):
                if (x != start or n != span) and text[x:x + n] in texts:
                    return False
        return True


class TokenMemo:
    """Token ids remembered by what was tokenized: (text, add_special, parse_special) -> ids, the most
    recently used kept up to ``held`` ids in all. ``tokenize`` is the backend's tokenizer, called on a miss."""

    def __init__(self, tokenize: Callable[[str, bool, bool], list[int]], *, held: int = PIECES_HELD) -> None:
        self.tokenize = tokenize
        self._held_limit = held
        self._ids: dict[tuple[str, bool, bool], list[int]] = {}
        self._held = 0

    def __call__(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        key = (text, add_special, parse_special)
        ids = self._ids.pop(key, None)
        if ids is None:
            ids = self.tokenize(*key)
            self._held += len(ids)
        self._ids[key] = ids  # (re)inserted: the dict's order is the order of use
        while self._held > self._held_limit and len(self._ids) > 1:
            self._held -= len(self._ids.pop(next(iter(self._ids))))
        return ids


class PiecewiseTokenizer:
    """Tokenizes a text (special tokens parsed) as the pieces between its safe cuts, each piece's ids
    remembered by ``memo``. ``add_special`` is asked for the first piece only, so the vocabulary must
    add nothing at the end (no EOS)."""

    def __init__(self, memo: TokenMemo, specials: SpecialTexts) -> None:
        self._memo = memo
        self._specials = specials
        self._windows: dict[tuple[str, int, int], bool] = {}

    def cuts(self, text: str) -> list[int]:
        """The offsets after markers in ``text`` where llama.cpp certainly cuts, in order."""
        specials, reach = self._specials, self._specials.reach
        ends: list[int] = []
        for marker in specials.markers:
            start = text.find(marker)
            while start >= 0:
                end = start + len(marker)
                lo = max(0, start - reach + 1)
                key = (text[lo:min(len(text), end + reach - 1)], start - lo, end - lo)
                alone = self._windows.get(key)
                if alone is None:
                    if len(self._windows) >= WINDOWS_HELD:
                        self._windows.clear()
                    alone = self._windows[key] = specials.stands_alone(key[0], key[1], key[2])
                if alone:
                    ends.append(end)
                start = text.find(marker, start + 1)
        ends.sort()
        return ends

    def tokenize(self, text: str, add_special: bool) -> list[int]:
        """The ids of ``text`` as the backend gives them for the whole text."""
        ends = self.cuts(text) if _utf8(text) else []  # (the backend pairs or replaces lone surrogates)
        if not ends:  # one piece, unlike any other turn's: not worth remembering
            return self._memo.tokenize(text, add_special, True)
        if ends[-1] != len(text):
            ends.append(len(text))
        out: list[int] = []
        start = 0
        for end in ends:
            out += self._memo(text[start:end], add_special and start == 0, True)
            start = end
        return out


def _utf8(text: str) -> bool:
    """Whether ``text`` is UTF-8 as it is, so the special texts found in it are those the backend finds."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
