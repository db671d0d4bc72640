"""The message box (multi-line, pastes kept whole), one app per chat, and narrow terminals: an engine that
never generates, driven through Pilot."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from textual import events
from textual.widgets import Header

from localspec.engine import GenerateOptions
from localspec.history import SessionError, load_session
from localspec_tui.app import LocalspecApp
from localspec_tui.dashboard import Dashboard
from localspec_tui.widgets import MessageBox, UserMessage

from tui_support import stub_engine


class Recording(LocalspecApp):
    """The app with the reply worker replaced: what was sent is recorded, nothing generates."""

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.sent: list[str] = []

    def _generate_reply(self, reply_id, messages, opts, drafter, cancel) -> None:  # type: ignore[no-untyped-def, override]
        self.sent.append(messages[-1]["content"])
        self.reply_running = False


def make(tmp_path: Path, **kwargs: object) -> Recording:
    return Recording(stub_engine(), GenerateOptions(), history_dir=tmp_path, measure_on_start=False,  # type: ignore[arg-type]
                     **kwargs)


def saved_messages(app: LocalspecApp, tmp_path: Path) -> list[str]:
    data = json.loads((tmp_path / f"{app.session.id}.json").read_text())
    return [m["content"] for m in data["messages"]]


def test_enter_sends_and_ctrl_j_or_shift_enter_start_a_new_line(tmp_path: Path) -> None:
    async def go() -> None:
        app = make(tmp_path)
        async with app.run_test(size=(100, 30)) as pilot:
            box = app.query_one("#prompt", MessageBox)
            assert box.has_focus
            await pilot.press("o", "n", "e", "ctrl+j", "t", "w", "o", "shift+enter", "x")
            assert box.value == "one\ntwo\nx" and app.sent == []
            await pilot.press("enter")
            await pilot.pause()
            assert app.sent == ["one\ntwo\nx"] and box.value == ""
            assert saved_messages(app, tmp_path) == ["one\ntwo\nx"]
            assert app.query(UserMessage).last().text == "one\ntwo\nx"

    asyncio.run(go())


def test_a_bracketed_paste_of_three_lines_sends_three_lines(tmp_path: Path) -> None:
    pasted = "def f(x):\n    return x\n\nprint(f(1))"

    async def go() -> None:
        app = make(tmp_path)
        async with app.run_test(size=(100, 30)) as pilot:
            box = app.query_one("#prompt", MessageBox)
            app.post_message(events.Paste(pasted))  # what the driver makes of a bracketed paste
            await pilot.pause()
            assert box.value == pasted and app.sent == []  # a paste's newlines do not send
            await pilot.press("enter")
            await pilot.pause()
            assert app.sent == [pasted]
            assert saved_messages(app, tmp_path) == [pasted]

    asyncio.run(go())


def test_a_second_app_on_an_open_chat_is_refused_and_the_first_keeps_every_turn(tmp_path: Path) -> None:
    async def go() -> None:
        first = make(tmp_path)
        async with first.run_test(size=(100, 30)) as pilot:
            first.query_one("#prompt", MessageBox).value = "first turn"
            await pilot.press("enter")
            await pilot.pause()
            resumed = load_session(first.session.id, tmp_path)
            with pytest.raises(SessionError, match="open in another `localspec run`"):
                make(tmp_path, session=resumed)
            first.query_one("#prompt", MessageBox).value = "second turn"
            await pilot.press("enter")
            await pilot.pause()
            # ctrl+n: the new chat is held, the old one is free again
            old = first.session.id
            await pilot.press("ctrl+n")
            await pilot.pause()
            with pytest.raises(SessionError):
                make(tmp_path, session=load_session(first.session.id, tmp_path)
                     if (tmp_path / f"{first.session.id}.json").exists() else first.session)
            reopened = make(tmp_path, session=load_session(old, tmp_path))
            reopened.session_lock.release()
        assert [m.content for m in load_session(old, tmp_path).messages] == ["first turn", "second turn"]
        # the app let go of its chat when it ended
        again = make(tmp_path, session=load_session(old, tmp_path))
        again.session_lock.release()

    asyncio.run(go())


@pytest.mark.parametrize("size", [(60, 24), (40, 10)])
def test_a_narrow_window_folds_the_dashboard_and_ctrl_b_brings_it_back(tmp_path: Path, size) -> None:
    async def go() -> None:
        app = make(tmp_path)
        async with app.run_test(size=size) as pilot:
            await pilot.pause()
            dashboard, chat, box = app.query_one(Dashboard), app.query_one("#chat"), app.query_one("#prompt")
            assert not dashboard.display
            # the chat and the message box take the whole width, and keep rows
            assert chat.region.width == size[0] and box.region.width == size[0]
            assert chat.region.height >= 2 and box.region.height >= 1
            assert box.region.bottom <= size[1] - 1  # above the footer
            assert app.query_one(Header).display is (size[1] >= 16)
            await pilot.press("ctrl+b")
            await pilot.pause()
            column = app.query_one("#chat-column")
            assert dashboard.display and dashboard.region.width == size[0] and not column.display
            await pilot.press("ctrl+b")
            await pilot.pause()
            assert not dashboard.display and column.display and box.has_focus

    asyncio.run(go())


def test_shrinking_a_running_app_folds_the_dashboard_and_widening_brings_it_back(tmp_path: Path) -> None:
    """From 120 columns to 40 and 60 and back (Rich once failed drawing the message box at width 0, and the
    dashboard never folded after the start, leaving a 14-column chat at 60)."""
    async def go() -> None:
        app = make(tmp_path)
        async with app.run_test(size=(120, 30)) as pilot:
            await pilot.pause()
            for width, height in ((40, 30), (60, 30), (40, 10), (120, 30), (60, 24), (20, 5)):
                await pilot.resize_terminal(width, height)
                await pilot.pause()
                dashboard, box = app.query_one(Dashboard), app.query_one("#prompt")
                assert app.is_running
                assert dashboard.display is (width >= 80), (width, height)
                assert box.region.width == (width if width < 80 else width - 46), (width, box.region)
            # the app still takes a message at the size it ended on
            box.value = "still here"
            await pilot.press("enter")
            await pilot.pause()
            assert app.sent == ["still here"]

    asyncio.run(go())


def test_a_wide_window_keeps_the_dashboard_beside_the_chat(tmp_path: Path) -> None:
    async def go() -> None:
        app = make(tmp_path)
        async with app.run_test(size=(120, 30)) as pilot:
            await pilot.pause()
            dashboard, chat = app.query_one(Dashboard), app.query_one("#chat")
            assert dashboard.display and dashboard.region.width == 46 and chat.region.width == 120 - 46
            await pilot.press("ctrl+b")
            await pilot.pause()
            assert not dashboard.display and chat.region.width == 120

    asyncio.run(go())
