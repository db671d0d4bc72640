"""Typed messages from the engine worker thread to the app.

The worker never touches a widget: it posts these (``post_message`` is
thread-safe) and the app's handlers update widgets on the UI thread.
"""

from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message

from localspec.events import DoneEvent, GenerationStats, StepEvent


@dataclass(frozen=True)
class Piece:
    """Released reply text and who produced it: a drafter's name, or None for the target."""

    text: str
    drafter: str | None


class ReplyProgress(Message):
    """New reply text and the running stats, at most ~10 per second.

    ``pieces`` is everything released since the previous ReplyProgress;
    ``steps`` the StepEvents since then; ``stats`` the generation's running
    totals after the last of them.
    """

    def __init__(self, reply_id: int, pieces: tuple[Piece, ...], steps: tuple[StepEvent, ...],
                 stats: GenerationStats) -> None:
        super().__init__()
        self.reply_id = reply_id
        self.pieces = pieces
        self.steps = steps
        self.stats = stats


class ReplyFinished(Message):
    """The reply ended (stop, length, context full, or cancelled); ``done`` is the engine's DoneEvent."""

    def __init__(self, reply_id: int, done: DoneEvent, drafter: str | None) -> None:
        super().__init__()
        self.reply_id = reply_id
        self.done = done
        self.drafter = drafter


class ReplyFailed(Message):
    """The engine refused or failed with a LocalspecError; ``error`` is its one-line message.

    ``ends_reply`` is True when nothing was generated and no ReplyFinished
    follows (e.g. the conversation no longer fits the context); False when the
    failure came mid-stream and a ReplyFinished with the partial text follows.
    """

    def __init__(self, reply_id: int, error: str, *, ends_reply: bool) -> None:
        super().__init__()
        self.reply_id = reply_id
        self.error = error
        self.ends_reply = ends_reply


class PlainSpeedMeasured(Message):
    """A short plain (non-speculative) generation finished: the baseline for the speedup."""

    def __init__(self, tokens_per_second: float, stats: GenerationStats) -> None:
        super().__init__()
        self.tokens_per_second = tokens_per_second
        self.stats = stats


class PromptProgress(Message):
    """The reply's prompt is being read: ``done`` of ``total`` tokens are in the cache (a long prompt)."""

    def __init__(self, reply_id: int, done: int, total: int) -> None:
        super().__init__()
        self.reply_id = reply_id
        self.done = done
        self.total = total


class PlainSpeedFailed(Message):
    """Measuring the plain speed failed with a LocalspecError."""

    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error
