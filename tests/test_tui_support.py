"""Helpers shared by the TUI tests: this module holds no tests of its own."""

from __future__ import annotations

import html
import re
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

from textual.content import Content
from textual.pilot import Pilot
from textual.widget import Widget
from textual.widgets import Input, Static


async def wait_until(pilot: Pilot, predicate: Callable[[], bool], *, timeout_s: float = 300.0,
                     what: str = "the condition", every_s: float = 0.05) -> None:
    """Let the app run until ``predicate()`` holds; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        await pilot.pause(every_s)


async def send(pilot: Pilot, text: str) -> None:
    """Type ``text`` into the prompt (set at once: per-key typing only slows the tests) and press Enter."""
    prompt = pilot.app.query_one("#prompt", Input)
    prompt.focus()
    prompt.value = text
    await pilot.press("enter")


def shown_text(widget: Widget) -> str:
    """The plain text a Static currently shows."""
    assert isinstance(widget, Static)
    content = widget.content
    return content.plain if isinstance(content, Content) else str(content)


def svg_text(svg: str) -> str:
    """The visible text of a Textual SVG screenshot, one screen row per line."""
    rows: dict[str, list[str]] = {}
    for cls, y, body in re.findall(r'<text class="([^"]*)"[^>]*? y="([0-9.]+)"[^>]*>(.*?)</text>', svg, flags=re.S):
        if not cls.endswith("-title"):  # the window title drawn above the screen
            rows.setdefault(y, []).append(html.unescape(body).replace("\xa0", " "))
    lines = ("".join(parts).rstrip() for _, parts in sorted(rows.items(), key=lambda kv: float(kv[0])))
    return "\n".join(line for line in lines if line)


def stub_engine(drafters: tuple[str, ...] = ("draft",)) -> SimpleNamespace:
    """Enough of an Engine for UI tests that never generate."""
    return SimpleNamespace(
        drafter_names=lambda: list(drafters),
        target=SimpleNamespace(name="Target", path=Path("target-Q4.gguf")),
        draft=SimpleNamespace(name="Draft", path=Path("draft-Q4_0.gguf")) if drafters else None,
    )
