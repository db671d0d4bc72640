"""The worker side: turn the engine's event stream into throttled app messages.

These functions run on the worker thread. They never touch a widget; they
only call ``post`` (the app's thread-safe ``post_message``) with the typed
messages from ``localspec_tui.messages``.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable

from textual.message import Message

from localspec.engine import Engine, GenerateOptions
from localspec.generation import Generation
from localspec.events import DoneEvent, PrefillEvent, StepEvent, TokenEvent
from localspec.sampling import SamplingParams
from localspec_tui.messages import (
    Piece,
    PlainSpeedMeasured,
    PromptProgress,
    ReplyFailed,
    ReplyFinished,
    ReplyProgress,
)

UPDATE_INTERVAL_S = 0.1
"""At most ~10 UI updates per second: the dashboard cannot be read faster and Textual need not repaint faster."""

DRAW_SHARE = 0.1
"""The share of a streaming reply's time the app may spend drawing its updates (``UpdatePace``)."""

LONGEST_INTERVAL_S = 0.5
"""However long an update takes to draw, the reply's text still moves twice a second."""


class UpdatePace:
    """How often the worker posts a reply's progress: every ``UPDATE_INTERVAL_S``, or less often when the
    app takes longer to draw an update than ``DRAW_SHARE`` of that.

    The app draws on its own thread, and while it draws the reply's worker waits for the interpreter each
    time a llama.cpp call returns (docs/app.md): drawing a long reply as Markdown took 10-20 ms an update.
    Made on the UI thread as a reply starts; the app calls ``updated`` on that thread at each update, and
    the thread's CPU time since the previous one is what drawing an update costs (``drew``). The interval
    becomes that over ``DRAW_SHARE``, between ``shortest`` and ``LONGEST_INTERVAL_S``, halfway from where it
    was (one slow update does not halve the pace). The worker reads ``interval_s`` (a float: no lock).
    """

    def __init__(self, shortest: float = UPDATE_INTERVAL_S) -> None:
        self.shortest = shortest
        self.interval_s = shortest
        self._drawn_at = time.thread_time()

    def updated(self) -> None:
        now = time.thread_time()
        self.drew(now - self._drawn_at)
        self._drawn_at = now

    def drew(self, busy_s: float) -> None:
        wanted = min(LONGEST_INTERVAL_S, max(self.shortest, busy_s / DRAW_SHARE))
        self.interval_s = (self.interval_s + wanted) / 2


PLAIN_PROMPT = "Count from one to fifty in words, separated by commas."
"""A prompt with a long, predictable answer, so the baseline run rarely stops early."""

Post = Callable[[Message], object]


def stream_reply(generation: Generation, reply_id: int, post: Post, *, drafter: str | None,
                 should_stop: Callable[[], bool] = lambda: False,
                 describe: Callable[[Exception], str] = str,
                 pace: UpdatePace | None = None) -> DoneEvent:
    """Iterate ``generation``, posting ReplyProgress at most every ``pace.interval_s`` (``UpdatePace``;
    ``UPDATE_INTERVAL_S`` without one) and one ReplyFinished.

    The first step is posted at once (the user sees the reply start), later
    ones are batched. Every released piece of text is posted before the
    ReplyFinished, so the UI's reply equals ``done.text``. When ``should_stop()``
    turns true the generation is cancelled and ends after its current step,
    keeping what it produced. Any exception mid-stream ends the reply with
    ``finish_reason == "error"`` (its partial text kept) and a ReplyFailed
    carrying ``describe(error)``: the app shows it and goes on.
    """
    pace = pace or UpdatePace()
    pieces: list[Piece] = []
    steps: list[StepEvent] = []
    last_post = float("-inf")
    done: DoneEvent | None = None

    def flush() -> None:
        nonlocal last_post
        post(ReplyProgress(reply_id, tuple(pieces), tuple(steps), generation.stats()))
        pieces.clear()
        steps.clear()
        last_post = time.monotonic()

    try:
        for event in generation:
            if should_stop():
                generation.cancel()
            if isinstance(event, TokenEvent):
                if not event.text:
                    continue
                if pieces and pieces[-1].drafter == event.drafter:
                    pieces[-1] = Piece(pieces[-1].text + event.text, event.drafter)
                else:
                    pieces.append(Piece(event.text, event.drafter))
            elif isinstance(event, StepEvent):
                steps.append(event)
                if time.monotonic() - last_post >= pace.interval_s:
                    flush()
            elif isinstance(event, PrefillEvent):
                post(PromptProgress(reply_id, event.done, event.total))
            elif isinstance(event, DoneEvent):
                done = event
    except Exception as err:  # a bug or a user's error alike: the worker must end with a ReplyFinished
        done = dataclasses.replace(generation.interrupted(), finish_reason="error")
        post(ReplyFailed(reply_id, describe(err), ends_reply=False))
    assert done is not None, "a generation always ends with a DoneEvent"
    if pieces or steps:
        flush()
    post(ReplyFinished(reply_id, done, drafter))
    return done


def measure_plain_speed(engine: Engine, post: Post, *, max_tokens: int = 24,
                        sampling: SamplingParams | None = None,
                        should_stop: Callable[[], bool] = lambda: False) -> float | None:
    """Generate ``max_tokens`` tokens without speculation and post their tokens/s (PlainSpeedMeasured).

    This is the baseline the dashboard divides by. Returns None (posting
    nothing) when stopped early by ``should_stop``. Raises LocalspecError (the
    caller turns it into a PlainSpeedFailed).
    """
    tokens = engine.chat_tokens([{"role": "user", "content": PLAIN_PROMPT}])
    opts = GenerateOptions(max_tokens=max_tokens, speculative=False, sampling=sampling or SamplingParams())
    generation = engine.generate(tokens, opts)
    done: DoneEvent | None = None
    for event in generation:
        if should_stop():
            generation.cancel()
        if isinstance(event, DoneEvent):
            done = event
    assert done is not None
    if done.finish_reason == "cancelled":
        return None
    rate = done.stats.tokens_per_second
    post(PlainSpeedMeasured(rate, done.stats))
    return rate
