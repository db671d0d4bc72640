"""The app keeps what is on screen: every way out mid-reply saves the partial reply, a failing reply is one
line, text that is not UTF-8 is cleaned, and a resumed chat never gets two user turns in a row.

Through Textual's Pilot on the real SmolLM2; the same in a real terminal with real signals is in
test_tui_signals.py.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from pathlib import Path
from typing import Iterator

import pytest

from localspec.engine import Engine, GenerateOptions
from localspec.generation import Generation
from localspec.events import Event, PrefillEvent, StepEvent, TokenEvent
from localspec.history import Session, SessionMessage, latest_session, list_sessions, load_session, save_session
from localspec_tui.app import LocalspecApp
from localspec_tui.dashboard import Dashboard
from localspec_tui.widgets import MessageBox, ReplyView, StatusLine, UserMessage
from tui_support import send, wait_until

SIZE = (120, 40)
STORY = "Write a long story about a dragon who learns to cook."


@pytest.fixture(scope="module")
def engine(smollm2_path: Path) -> Iterator[Engine]:
    # The target alone, one thread (see test_tui.py): these tests are about the app, not drafting.
    eng = Engine.load(smollm2_path, n_ctx=1024, n_threads=1)
    yield eng
    eng.close()


def make_app(engine: Engine, history_dir: Path, *, max_tokens: int = 300, **kwargs: object) -> LocalspecApp:
    return LocalspecApp(engine, GenerateOptions(max_tokens=max_tokens), history_dir=history_dir,
                        measure_on_start=False, **kwargs)  # type: ignore[arg-type]


def reply_text(app: LocalspecApp) -> str:
    views = list(app.query(ReplyView))
    return views[-1].text if views else ""


def assert_saved_mid_reply(history_dir: Path, session_id: str, shown: str, finish_reason: str = "interrupted") -> str:
    """The saved chat is the message and the reply as it stood: at least what was on screen."""
    saved = load_session(session_id, history_dir)
    user, reply = saved.messages
    assert (user.role, user.content) == ("user", STORY)
    assert (reply.role, reply.finish_reason) == ("assistant", finish_reason)
    assert shown and reply.content.startswith(shown), (shown, reply.content)
    assert reply.stats is not None and 0 < reply.stats["tokens"] < 300
    return reply.content


class HeldGeneration:
    """A real generation that, once a step has produced text, waits until the app starts leaving.

    Without it "mid-reply" is a race: on a loaded machine the whole reply can be generated before the
    UI has shown its first words. The app's own stop (its shutdown event, then ``should_stop`` on the
    next event) is what releases it, so leaving is tested exactly as it happens.
    """

    def __init__(self, generation: Generation, leaving: threading.Event) -> None:
        self._generation = generation
        self._leaving = leaving
        self._events = self._held()

    def _held(self) -> Iterator[Event]:
        seen_text = False
        for event in self._generation:
            seen_text = seen_text or (isinstance(event, TokenEvent) and bool(event.text))
            yield event
            if seen_text and isinstance(event, StepEvent):
                assert self._leaving.wait(timeout=120), "the app never began to leave"

    def __iter__(self) -> "HeldGeneration":
        return self

    def __next__(self) -> Event:
        return next(self._events)

    def __getattr__(self, name: str) -> object:  # cancel(), stats(), interrupted(): the real generation's
        return getattr(self._generation, name)


async def in_the_middle_of_a_reply(pilot, app: LocalspecApp,  # type: ignore[no-untyped-def]
                                   monkeypatch: pytest.MonkeyPatch) -> str:
    """Ask for a long reply; what is on screen once its first words show (the reply held there)."""
    generate = app.engine.generate
    monkeypatch.setattr(app.engine, "generate",
                        lambda *a, **kw: HeldGeneration(generate(*a, **kw), app._shutting_down))
    await send(pilot, STORY)
    await wait_until(pilot, lambda: bool(reply_text(app)), what="the first words")
    assert app.reply_running
    return reply_text(app)


@pytest.mark.parametrize("how", ["ctrl+q", "SIGTERM", "SIGHUP"])
def test_leaving_mid_reply_saves_the_partial_reply(engine: Engine, tmp_path: Path, how: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    shown = ""

    async def go() -> LocalspecApp:
        nonlocal shown
        app = make_app(engine, tmp_path)
        async with app.run_test(size=SIZE) as pilot:
            shown = await in_the_middle_of_a_reply(pilot, app, monkeypatch)
            if how == "ctrl+q":
                await pilot.press("ctrl+q")
            else:
                sig = getattr(signal, how)
                # The app must have taken the signal over (else it would end this test process).
                assert signal.getsignal(sig) not in (signal.SIG_DFL, signal.SIG_IGN, None)
                os.kill(os.getpid(), sig)
            await wait_until(pilot, lambda: not app.is_running, what="the app to end")
        return app

    app = asyncio.run(go())
    assert_saved_mid_reply(tmp_path, app.session.id, shown)
    if how != "ctrl+q":
        sig = getattr(signal, how)
        assert app.exit_signal == sig and app.return_code == 128 + sig
        assert signal.getsignal(sig) == signal.SIG_DFL  # given back when the app ended
    else:
        assert app.exit_signal is None and app.return_code == 0


def test_resizing_mid_reply_from_120_to_40_and_60_columns_keeps_the_app_and_the_reply(
        engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rich once raised 'range() arg 3 must not be zero' drawing the message box at width 0."""
    shown = ""

    async def go() -> LocalspecApp:
        nonlocal shown
        app = make_app(engine, tmp_path)
        async with app.run_test(size=(120, 40)) as pilot:
            shown = await in_the_middle_of_a_reply(pilot, app, monkeypatch)
            for width in (40, 60, 120, 40):
                await pilot.resize_terminal(width, 40)
                await pilot.pause()
                assert app.is_running and app.reply_running
                assert app.query_one(Dashboard).display is (width >= 80)
                view = list(app.query(ReplyView))[-1]
                assert view.region.width > 0 and view.text.startswith(shown)
            await pilot.press("ctrl+q")
            await wait_until(pilot, lambda: not app.is_running, what="the app to end")
        return app

    app = asyncio.run(go())
    assert app.return_code == 0
    assert_saved_mid_reply(tmp_path, app.session.id, shown)


LONG_PROMPT = "Summarise these notes. " + " ".join(f"note {i}: the kettle is blue." for i in range(90))
"""Longer than one batch (512 tokens) and shorter than the context (1024): read in two batches."""


def held_in_the_prompt(app: LocalspecApp, monkeypatch: pytest.MonkeyPatch, release: threading.Event) -> None:
    """Replies stop after the prompt's first batch until ``release`` is set (the app leaving, or Esc)."""
    generate = app.engine.generate

    class Held:
        def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
            self._generation = generate(*args, **kwargs)
            self._events = self._held()

        def _held(self) -> Iterator[Event]:
            for event in self._generation:
                yield event
                if isinstance(event, PrefillEvent):
                    assert release.wait(timeout=120), "never released"

        def __iter__(self):  # type: ignore[no-untyped-def]
            return self

        def __next__(self) -> Event:
            return next(self._events)

        def __getattr__(self, name: str) -> object:
            return getattr(self._generation, name)

    monkeypatch.setattr(app.engine, "generate", Held)


def test_sigterm_while_reading_the_prompt_saves_no_empty_reply_and_resume_offers_the_message(
        engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 41: an empty reply marked cancelled was saved, and --resume did not give the message back."""
    async def go() -> LocalspecApp:
        app = make_app(engine, tmp_path, max_tokens=8)
        async with app.run_test(size=SIZE) as pilot:
            held_in_the_prompt(app, monkeypatch, app._shutting_down)
            await send(pilot, LONG_PROMPT)
            await wait_until(pilot, lambda: "reading the prompt" in app.query_one(StatusLine).activity,
                             what="the prompt's first batch")
            os.kill(os.getpid(), signal.SIGTERM)
            await wait_until(pilot, lambda: not app.is_running, what="the app to end")
        return app

    app = asyncio.run(go())
    assert app.return_code == 128 + signal.SIGTERM
    saved = load_session(app.session.id, tmp_path)
    assert [(m.role, m.content) for m in saved.messages] == [("user", LONG_PROMPT)]

    async def resume() -> None:
        again = make_app(engine, tmp_path, session=load_session(app.session.id, tmp_path))
        async with again.run_test(size=SIZE) as pilot:
            await pilot.pause()
            assert again.query_one("#prompt", MessageBox).value == LONG_PROMPT
            assert not list(again.query(UserMessage))

    asyncio.run(resume())


def test_esc_while_reading_the_prompt_puts_the_message_back(engine: Engine, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # Another prompt than the test before's: the engine reuses a cached prefix, and a remainder shorter
    # than one batch is read without progress.
    prompt = "Shorten" + LONG_PROMPT.removeprefix("Summarise")

    async def go() -> None:
        app = make_app(engine, tmp_path, max_tokens=8)
        async with app.run_test(size=SIZE) as pilot:
            release = threading.Event()
            held_in_the_prompt(app, monkeypatch, release)
            await send(pilot, prompt)
            await wait_until(pilot, lambda: "reading the prompt" in app.query_one(StatusLine).activity,
                             what="the prompt's first batch")
            await pilot.press("escape")
            release.set()
            await wait_until(pilot, lambda: not app.reply_running, what="the reply to stop")
            await pilot.pause()
            assert app.query_one("#prompt", MessageBox).value == prompt
            assert not list(app.query(ReplyView)) and not list(app.query(UserMessage))
            assert not (tmp_path / f"{app.session.id}.json").exists()  # a chat with no messages is no file

    asyncio.run(go())


def test_an_empty_stopped_reply_an_older_version_saved_is_dropped_on_resume() -> None:
    s = Session(messages=[SessionMessage("user", "hi"), SessionMessage("assistant", "hello", "stop"),
                          SessionMessage("user", "long prompt"), SessionMessage("assistant", "", "cancelled")])
    assert s.take_unanswered() == "long prompt"
    assert [(m.role, m.content) for m in s.messages] == [("user", "hi"), ("assistant", "hello")]


def test_an_exception_in_the_app_still_saves_the_partial_reply(engine: Engine, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug in the UI ends the app (Textual shows the traceback), but not before the chat is saved."""
    class Bug(Exception):
        pass

    show_stats = Dashboard.show_stats
    shown = ""

    def failing(self: Dashboard, stats) -> None:  # type: ignore[no-untyped-def]
        nonlocal shown
        show_stats(self, stats)
        if stats.tokens > 0:
            shown = reply_text(self.app)  # type: ignore[arg-type]
            raise Bug("a widget failed")

    async def go() -> LocalspecApp:
        app = make_app(engine, tmp_path)
        with pytest.raises(Bug):
            async with app.run_test(size=SIZE) as pilot:
                monkeypatch.setattr(Dashboard, "show_stats", failing)
                await send(pilot, STORY)
                await wait_until(pilot, lambda: not app.is_running, what="the app to end")
        return app

    app = asyncio.run(go())
    assert app.return_code == 1
    assert_saved_mid_reply(tmp_path, app.session.id, shown)


def test_a_reply_that_fails_midway_is_one_line_and_the_app_goes_on(engine: Engine, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    piece = engine.target.piece
    calls = 0

    def failing_piece(token: int) -> bytes:
        nonlocal calls
        calls += 1
        if calls == 6:
            raise RuntimeError("decoder broke\nsecond line")
        return piece(token)

    async def go() -> None:
        app = make_app(engine, tmp_path, max_tokens=12)
        async with app.run_test(size=SIZE, notifications=True) as pilot:
            monkeypatch.setattr(engine.target, "piece", failing_piece)
            await send(pilot, STORY)
            await wait_until(pilot, lambda: not app.reply_running, what="the failed reply to end")
            await pilot.pause()
            assert app.is_running
            error = app.query_one(StatusLine).error
            assert error == "the reply failed with an internal error (RuntimeError: decoder broke)"
            done = app.last_done
            assert done is not None and done.finish_reason == "error" and done.text
            assert list(app.query(ReplyView))[-1].shown.endswith("[failed]")
            saved = load_session(app.session.id, tmp_path).messages
            assert [(m.role, m.finish_reason) for m in saved] == [("user", None), ("assistant", "error")]
            assert saved[1].content == done.text

            # The engine recovers: the next message gets its reply.
            monkeypatch.setattr(engine.target, "piece", piece)
            await send(pilot, "Thanks.")
            await wait_until(pilot, lambda: not app.reply_running, what="the next reply")
            assert app.last_done is not None and app.last_done.finish_reason in ("length", "stop")
            assert app.query_one(StatusLine).error == ""
            assert [m.role for m in load_session(app.session.id, tmp_path).messages] == [
                "user", "assistant", "user", "assistant"]

            # A failure before any text: one line, and the message goes back into the input box.
            def broken_template(messages: object) -> list[int]:
                raise ValueError("template exploded")
            monkeypatch.setattr(engine, "chat_tokens", broken_template)
            await send(pilot, "One more.")
            await wait_until(pilot, lambda: not app.reply_running, what="the refusal")
            await pilot.pause()
            assert app.is_running and app.query_one(MessageBox).value == "One more."
            assert app.query_one(StatusLine).error.startswith(
                "the reply failed with an internal error (ValueError: template exploded)")
            assert len(load_session(app.session.id, tmp_path).messages) == 4

    asyncio.run(go())


def test_text_that_is_not_utf8_is_replaced_once_and_the_chat_goes_on(engine: Engine, tmp_path: Path) -> None:
    """`run --system "$(printf 'Be brief \\xff')"`: Python hands the byte over as a lone surrogate."""
    notes: list[str] = []

    class Recording(LocalspecApp):
        def notify(self, message: str, **kwargs) -> None:  # type: ignore[no-untyped-def, override]
            notes.append(message)
            super().notify(message, **kwargs)

    async def go() -> Session:
        app = Recording(engine, GenerateOptions(max_tokens=4), history_dir=tmp_path, measure_on_start=False,
                        system="Be brief \udcff")
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            assert notes == ["the system prompt held bytes that are not UTF-8; they were replaced with U+FFFD (\ufffd)"]
            await send(pilot, "Hello \udcff there")
            await wait_until(pilot, lambda: not app.reply_running, what="the reply")
            assert app.is_running and app.last_done is not None and app.last_done.finish_reason in ("length", "stop")
            assert notes[1:] == ["your message held bytes that are not UTF-8; they were replaced with U+FFFD (\ufffd)"]
            assert [u.text for u in app.query(UserMessage)] == ["Hello \ufffd there"]
            return app.session

    session = asyncio.run(go())
    saved = load_session(session.id, tmp_path)
    assert saved.system == "Be brief \ufffd"
    assert [(m.role, m.content) for m in saved.messages][0] == ("user", "Hello \ufffd there")
    assert [m.role for m in saved.messages] == ["user", "assistant"]


def test_resume_offers_an_unanswered_message_again_and_turns_alternate(engine: Engine, tmp_path: Path) -> None:
    # What an older localspec (or a SIGKILL mid-reply) left: the last message has no reply.
    old = Session(model="smollm2-135m")
    for role, text in [("user", "Name a colour."), ("assistant", "Blue."), ("user", "Name a fruit.")]:
        old.messages.append(SessionMessage(role, text))
    save_session(old, tmp_path)

    async def go() -> None:
        session = latest_session(tmp_path)
        assert session is not None
        app = make_app(engine, tmp_path, max_tokens=4, session=session)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            assert app.query_one(MessageBox).value == "Name a fruit."
            assert [u.text for u in app.query(UserMessage)] == ["Name a colour."]
            assert [r.text for r in app.query(ReplyView)] == ["Blue."]
            # The file keeps the unanswered message until something new is said.
            assert len(load_session(old.id, tmp_path).messages) == 3
            await pilot.press("enter")  # sent as it was offered
            await wait_until(pilot, lambda: not app.reply_running, what="the reply")
            assert app.last_done is not None

    asyncio.run(go())
    saved = load_session(old.id, tmp_path)
    assert [(m.role, m.content) for m in saved.messages][:3] == [
        ("user", "Name a colour."), ("assistant", "Blue."), ("user", "Name a fruit.")]
    assert [m.role for m in saved.messages] == ["user", "assistant", "user", "assistant"]


def test_after_ctrl_n_resume_picks_the_last_chat_with_messages(engine: Engine, tmp_path: Path) -> None:
    async def go() -> str:
        app = make_app(engine, tmp_path, max_tokens=4)
        async with app.run_test(size=SIZE) as pilot:
            await send(pilot, "Hi.")
            await wait_until(pilot, lambda: not app.reply_running, what="the reply")
            first = app.session.id
            await pilot.press("ctrl+n")
            # A message the new chat cannot take (too long) goes back into the input box: nothing is said.
            await send(pilot, "word " * 1500)
            await wait_until(pilot, lambda: not app.reply_running, what="the refusal")
            assert app.session.id != first and app.session.messages == []
            await pilot.press("ctrl+s")  # a system prompt alone does not make a chat either
            app.screen.query_one("TextArea").text = "Be terse."  # type: ignore[attr-defined]
            await pilot.press("ctrl+s")
            await pilot.press("ctrl+q")
        return first

    first = asyncio.run(go())
    assert [s.id for s in list_sessions(tmp_path)] == [first]
    latest = latest_session(tmp_path)
    assert latest is not None and latest.id == first and len(latest.messages) == 2


def test_the_header_shows_the_context_llama_cpp_made_of_ctx_17(smollm2_path: Path, tmp_path: Path) -> None:
    from localspec.models.placement import LoadSettings

    small = Engine.load(smollm2_path, n_ctx=17, n_threads=1)  # llama.cpp pads the context up
    try:
        assert small.n_ctx > 17

        async def go() -> str:
            app = LocalspecApp(small, GenerateOptions(), history_dir=tmp_path, measure_on_start=False,
                               placement=LoadSettings(17, 0, 0))
            async with app.run_test(size=(160, 30)) as pilot:
                await pilot.pause()
                return app.sub_title

        assert asyncio.run(go()).endswith(f" · ctx {small.n_ctx} (asked 17)")
    finally:
        small.close()
