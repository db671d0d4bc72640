"""Chat widgets: user turns, streaming replies coloured by provenance, the status line, the system prompt editor."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.content import Content
from textual.message import Message
from textual.reactive import reactive
from textual.screen import ModalScreen
from textual.widgets import Footer, Label, Static, TextArea

from localspec_tui.messages import Piece

PALETTE = ("#7fd962", "#5fb3f5", "#e3a6ff", "#f2c14e", "#4fd6be", "#ff9e64")
"""Colours for drafters, assigned in the engine's drafter order; target tokens keep the plain foreground."""

FINISH_NOTES = {
    "cancelled": "stopped",
    "length": "max tokens reached",
    "context": "context full: start a new chat",
    "error": "failed",
    "interrupted": "interrupted",
}


def drafter_colours(names: Sequence[str]) -> dict[str, str]:
    """A stable colour per drafter name (order of ``names``, wrapping around the palette)."""
    return {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(names)}


def legend(colours: dict[str, str]) -> Content:
    """'■ target ■ draft …' in the colours replies use."""
    parts: list[str | tuple[str, str]] = ["■ target"]
    for name, colour in colours.items():
        parts.extend(["  ", (f"■ {name}", colour)])
    return Content.assemble(*parts)


NEWLINE_KEYS = ("shift+enter", "ctrl+j", "alt+enter")
"""Keys that start a new line in the message box. Most terminals send Enter and Shift+Enter alike (a
carriage return); Shift+Enter arrives apart only where the terminal speaks the kitty keyboard protocol
(kitty, WezTerm, foot, Ghostty), which Textual asks for. Ctrl+J (a line feed) arrives apart everywhere,
tmux and screen included, and Alt+Enter (escape, return) in most terminals."""


class MessageBox(TextArea):
    """The message box: Enter sends, Shift+Enter / Ctrl+J / Alt+Enter start a new line, and a paste keeps
    every line (a one-line ``Input`` kept only the first line of a pasted block and sent it).

    Posts ``MessageBox.Submitted`` with the whole text on Enter; ``value`` is the text, as on ``Input``.
    """

    @dataclass
    class Submitted(Message):
        box: "MessageBox"
        value: str

    def __init__(self, *, placeholder: str = "", id: str | None = None) -> None:
        super().__init__(id=id, soft_wrap=True, show_line_numbers=False, tab_behavior="focus",
                         placeholder=placeholder)

    @property
    def value(self) -> str:
        return self.text

    @value.setter
    def value(self, text: str) -> None:
        self.text = text
        self.move_cursor(self.document.end)

    async def _on_key(self, event: events.Key) -> None:
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            self.post_message(self.Submitted(self, self.text))
            return
        if event.key in NEWLINE_KEYS:
            event.stop()
            event.prevent_default()
            self.insert("\n")
            return
        await super()._on_key(event)


class UserMessage(Static):
    """One user turn, shown verbatim (no markup is interpreted)."""

    def __init__(self, text: str) -> None:
        super().__init__(Content(text), classes="user-message")
        self.text = text


class ReplyView(Static):
    """An assistant reply that grows as pieces arrive (append-only).

    Pieces of consecutive tokens from the same source are merged into runs.
    Shown as Markdown (code blocks, lists, emphasis; re-rendered as it streams,
    so an open code fence is a code block at once), or, with ``colour`` on
    (ctrl+t), verbatim with each drafter's runs in that drafter's colour:
    provenance is per token, and Markdown blocks cannot carry per-token styles.
    """

    colour: reactive[bool] = reactive(False, init=False)

    def __init__(self, colours: dict[str, str], *, colour: bool = False, text: str = "") -> None:
        super().__init__("", classes="reply")
        self.colours = colours
        self.runs: list[Piece] = [Piece(text, None)] if text else []
        self.finish_reason: str | None = None
        self.set_reactive(ReplyView.colour, colour)

    @property
    def text(self) -> str:
        return "".join(run.text for run in self.runs)

    def on_mount(self) -> None:
        self._redraw()

    def append(self, pieces: Sequence[Piece]) -> None:
        for piece in pieces:
            if self.runs and self.runs[-1].drafter == piece.drafter:
                self.runs[-1] = Piece(self.runs[-1].text + piece.text, piece.drafter)
            else:
                self.runs.append(piece)
        self._redraw()

    def finish(self, finish_reason: str) -> None:
        self.finish_reason = finish_reason
        self._redraw()

    def watch_colour(self) -> None:
        self._redraw()

    @property
    def shown(self) -> str:
        """The reply's text and its finish note, as plain text (what either view shows, without styles)."""
        note = FINISH_NOTES.get(self.finish_reason or "")
        text = self.text if self.runs or self.finish_reason is not None else "…"
        return f"{text}{' ' if self.runs and note else ''}[{note}]" if note else text

    def _redraw(self) -> None:
        if not self.colour:
            self._redraw_markdown()
            return
        parts: list[str | tuple[str, str]] = []
        for run in self.runs:
            style = self.colours.get(run.drafter or "", "") if self.colour and run.drafter else ""
            parts.append((run.text, style) if style else run.text)
        if not self.runs and self.finish_reason is None:
            parts.append(("…", "dim"))
        note = FINISH_NOTES.get(self.finish_reason or "")
        if note:
            parts.append((f"{' ' if self.runs else ''}[{note}]", "dim italic"))
        self.update(Content.assemble(*parts))

    def _redraw_markdown(self) -> None:
        from rich.console import Group
        from rich.markdown import Markdown
        from rich.text import Text

        note = FINISH_NOTES.get(self.finish_reason or "")
        if not self.runs:
            self.update(Content.assemble(("…", "dim") if note is None else (f"[{note}]", "dim italic")))
            return
        body = Markdown(self.text, code_theme="monokai", hyperlinks=False)
        self.update(Group(body, Text(f"[{note}]", style="dim italic")) if note else body)


class StatusLine(Static):
    """One line under the chat: the current drafter, colouring, what the engine is doing, the last error."""

    drafter: reactive[str] = reactive("off")
    colour: reactive[bool] = reactive(True)
    activity: reactive[str] = reactive("ready")
    error: reactive[str] = reactive("")

    def render(self) -> Content:
        # Most urgent first: a narrow terminal cuts the end of the line.
        parts: list[str | tuple[str, str]] = [(self.error, "bold $error"), " · "] if self.error else []
        parts.extend([self.activity, " · drafter ", (self.drafter, "bold"),
                      " · provenance colours (ctrl+t: markdown)" if self.colour else " · markdown"])
        return Content.assemble(*parts)


class SystemPromptScreen(ModalScreen[str | None]):
    """Edit the system prompt: ctrl+s saves (dismisses with the text), Esc cancels (None)."""

    BINDINGS = [
        Binding("ctrl+s", "save", "Save", priority=True),
        Binding("escape", "cancel", "Cancel"),
    ]

    def __init__(self, text: str) -> None:
        super().__init__()
        self.initial = text

    def compose(self) -> ComposeResult:
        with Vertical(id="system-dialog"):
            yield Label("System prompt (applies from the next reply; empty for none)")
            yield TextArea(self.initial, id="system-text", soft_wrap=True)
        yield Footer()

    def on_mount(self) -> None:
        self.query_one(TextArea).focus()

    def action_save(self) -> None:
        self.dismiss(self.query_one(TextArea).text.strip())

    def action_cancel(self) -> None:
        self.dismiss(None)
