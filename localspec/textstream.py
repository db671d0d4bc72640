"""Turning a stream of token bytes into text that is safe to show.

Two pure pieces used by the generation loop:

* ``Utf8Stream``: a token may end in the middle of a multi-byte character;
  the incomplete tail is held back until the next token completes it, so no
  half character (no U+FFFD) is ever emitted for valid UTF-8.
* ``StopMatcher``: text that might be the start of a stop string is held
  back until it is known not to be one; when a stop string appears, the text
  before it is released and generation ends.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass
from typing import Sequence


class Utf8Stream:
    """Incremental UTF-8 decoding of token pieces."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._partial = False  # the decoder holds the first bytes of a character

    def push(self, data: bytes) -> str:
        """Text completed by ``data`` (possibly empty while a character is partial)."""
        if not self._partial:
            # Most pieces are whole characters: decoded at once, without the incremental decoder's wrapper.
            try:
                return data.decode("utf-8")
            except UnicodeDecodeError:
                pass
        text = self._decoder.decode(data)
        self._partial = bool(self._decoder.getstate()[0])
        return text

    def flush(self) -> str:
        """Whatever is left at the end (an invalid tail becomes U+FFFD)."""
        self._partial = False
        return self._decoder.decode(b"", final=True)


@dataclass
class StopMatcher:
    """Holds back text that may begin a stop string.

    Feed pieces of text with ``push``; it returns ``(release, stopped)``:
    the text that is now safe to show, and whether a stop string was found
    (then ``release`` ends right before it and nothing more may be pushed).
    """

    stops: Sequence[str] = ()

    def __post_init__(self) -> None:
        self.stops = tuple(s for s in self.stops if s)
        self._held = ""
        self._longest = max((len(s) for s in self.stops), default=0)

    @property
    def held(self) -> str:
        return self._held

    def push(self, text: str) -> tuple[str, bool]:
        if not self.stops:
            return text, False
        buf = self._held + text
        cut = min((i for i in (buf.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self._held = ""
            return buf[:cut], True
        keep = self._partial_suffix(buf)
        self._held = buf[len(buf) - keep:] if keep else ""
        return buf[: len(buf) - keep], False

    def flush(self) -> str:
        """Release what is held (generation ended for another reason)."""
        out, self._held = self._held, ""
        return out

    def _partial_suffix(self, buf: str) -> int:
        """Length of the longest suffix of ``buf`` that is a proper prefix of a stop string."""
        for k in range(min(len(buf), self._longest - 1), 0, -1):
            tail = buf[-k:]
            if any(s.startswith(tail) for s in self.stops):
                return k
        return 0


@dataclass
class _Pending:
    token: int
    text: str
    source: str | None
    released: int = 0


class TokenReleaser:
    """Per-token text through the UTF-8 and stop-string filters, in order.

    ``push(token, piece, source)`` returns the tokens whose text is now fully
    released, each as ``(token, text, source)``; ``stopped`` turns true once a
    stop string was met (the token that straddles it is released with its text
    cut at the stop; later tokens are dropped). ``finish`` releases the rest.
    """

    def __init__(self, stops: Sequence[str] = ()) -> None:
        self._utf8 = Utf8Stream()
        self._stops = StopMatcher(stops)
        self._queue: list[_Pending] = []
        self.stopped = False

    def push(self, token: int, piece: bytes, source: str | None) -> list[tuple[int, str, str | None]]:
        if self.stopped:
            return []
        text = self._utf8.push(piece)
        if not self._stops.stops and not self._queue:  # nothing to hold back: released as it comes
            return [(token, text, source)]
        self._queue.append(_Pending(token, text, source))
        release, self.stopped = self._stops.push(text)
        return self._release(len(release), final=self.stopped)

    def finish(self) -> list[tuple[int, str, str | None]]:
        if self.stopped:
            return []
        tail = self._utf8.flush()
        if tail and self._queue:
            self._queue[-1].text += tail
        release, self.stopped = self._stops.push(tail)
        n = len(release) + (0 if self.stopped else len(self._stops.flush()))
        return self._release(n, final=True)

    def _release(self, n_chars: int, *, final: bool) -> list[tuple[int, str, str | None]]:
        out: list[tuple[int, str, str | None]] = []
        for item in self._queue:
            take = min(n_chars, len(item.text) - item.released)
            item.released += take
            n_chars -= take
        while self._queue and self._queue[0].released == len(self._queue[0].text):
            item = self._queue.pop(0)
            out.append((item.token, item.text, item.source))
        if final:
            # A token cut by a stop string keeps the text before the stop; the rest is dropped.
            if self._queue and self._queue[0].released and self.stopped:
                item = self._queue[0]
                out.append((item.token, item.text[: item.released], item.source))
            self._queue.clear()
        return out
