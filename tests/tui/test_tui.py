"""The chat app through Textual's Pilot on the real SmolLM2 (target) with its Q4_0 requantization (draft)."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Iterator

import pytest
from textual.message import Message

from localspec.engine import Engine, GenerateOptions
from localspec.history import latest_session, list_sessions, load_session
from localspec_tui.app import LocalspecApp
from localspec_tui.dashboard import Dashboard, expected_tokens_per_step, tokens_per_step_ceiling
from localspec_tui.messages import ReplyProgress
from localspec_tui.widgets import MessageBox, ReplyView, StatusLine, UserMessage
from tui_support import send, svg_text, wait_until

SIZE = (120, 40)


@pytest.fixture(scope="module")
def engine(smollm2_path: Path, smollm2_q4_0_path: Path) -> Iterator[Engine]:
    # One thread: llama.cpp's spinning worker threads slow down by 10-100x when the cores are shared
    # (a loaded CI runner, parallel test jobs); a single thread keeps these tests' time predictable.
    eng = Engine.load(smollm2_path, smollm2_q4_0_path, n_ctx=1024, n_threads=1)
    yield eng
    eng.close()


def make_app(engine: Engine, history_dir: Path, *, max_tokens: int = 16, measure: bool = False,
             **kwargs: object) -> LocalspecApp:
    # A fixed draft length: these tests check that drafting shows, not whether it pays here.
    return LocalspecApp(engine, GenerateOptions(max_tokens=max_tokens, draft_len=4), history_dir=history_dir,
                        measure_on_start=measure, plain_tokens=8, **kwargs)  # type: ignore[arg-type]


def last_reply(app: LocalspecApp) -> ReplyView:
    return list(app.query(ReplyView))[-1]


async def finish(pilot, app: LocalspecApp) -> None:  # type: ignore[no-untyped-def]
    await wait_until(pilot, lambda: not app.reply_running, what="the reply to finish")
    await pilot.pause()


def test_a_turn_streams_and_the_dashboard_agrees_with_the_engine(engine: Engine, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    progress: list[ReplyProgress] = []
    lengths: list[int] = []  # the reply widget's text length after each update it received
    append = ReplyView.append

    def recording_append(self: ReplyView, pieces) -> None:  # type: ignore[no-untyped-def]
        append(self, pieces)
        lengths.append(len(self.text))
    monkeypatch.setattr(ReplyView, "append", recording_append)

    def hook(message: Message) -> None:
        if isinstance(message, ReplyProgress):
            progress.append(message)

    async def go() -> None:
        app = make_app(engine, tmp_path, max_tokens=16, measure=True)
        async with app.run_test(size=SIZE, message_hook=hook) as pilot:
            app.query_one(MessageBox).cursor_blink = False
            await wait_until(pilot, lambda: app.plain_tok_s > 0, what="the plain-speed baseline")
            await send(pilot, "Name three colours.")
            await wait_until(pilot, lambda: not app.reply_running, what="the reply to finish")
            await pilot.pause()

            done = app.last_done
            assert done is not None and done.finish_reason in ("length", "stop")
            # Streaming: the first step shows at once, the rest follows in later updates of the same widget.
            assert len(lengths) >= 2 and 0 < lengths[0] < lengths[-1], lengths
            assert len(progress) >= 2
            view = last_reply(app)
            assert view.text == done.text == "".join(p.text for m in progress for p in m.pieces)
            assert {run.drafter for run in view.runs} <= {None, "draft"}
            if done.stats.accepted:
                assert any(run.drafter == "draft" for run in view.runs)

            # The dashboard shows exactly the engine's stats.
            s = done.stats
            d = app.query_one(Dashboard)
            assert d.stats == s
            assert d.alpha == s.acceptance_rate and d.tau == s.tokens_per_step
            reached = sum(s.position_accepted) / sum(s.position_drafted)
            assert d.reached_alpha == pytest.approx(reached)
            assert d.ceiling == pytest.approx(tokens_per_step_ceiling(reached))
            assert d.gamma == 4  # make_app fixes the draft length
            assert d.expected_tau == pytest.approx(expected_tokens_per_step(reached, 4))
            assert d.tokens_per_second == s.tokens_per_second
            # one definition: the reply's steps against the controller's plain-step estimate
            assert s.speedup is not None and d.speedup == s.speedup
            assert d.plain_speed == pytest.approx(1000 * s.tokens / s.plain_estimate_ms)
            total = s.draft_ms + s.verify_ms + s.python_ms
            assert d.time_split == pytest.approx((s.draft_ms / total, s.verify_ms / total, s.python_ms / total))
            assert d.speed_samples and all(x > 0 for x in d.speed_samples)
            c = s.control
            assert c is not None and c.draft_steps + c.plain_steps + c.probes == s.steps
            assert c.last_reason and c.last_reason in d.control_text

            # ... and says so on screen (a snapshot of the whole app, checked for labels and values).
            screen = svg_text(app.export_screenshot())
            for expected in (
                f"α accepted      {s.acceptance_rate:5.2f}  {s.accepted}/{s.drafted} drafted",
                f"τ tokens/step   {s.tokens_per_step:5.2f}  {s.tokens} tokens / {s.steps} steps",
                "ceiling 1/(1−α)", "expected τ γ=4 ", "Acceptance by draft position",
                f"reply {s.tokens_per_second:.1f} tok/s · plain {d.plain_speed:.1f} tok/s",
                f"speedup {d.speedup:.2f}×", "Time per step", "draft ", "verify ", "python ",
                "Name three colours.", "drafter draft", "GPU offload:", "Controller",
                f"draft {c.draft_steps} · plain {c.plain_steps} · probes {c.probes}",
                    f"length {c.mean_draft_len:.1f} tokens drafted a step", "why    ",
            ):
                assert expected in screen, (expected, screen)
            for a, n in zip(s.position_acceptance, s.position_drafted, strict=True):
                assert f"{a:4.2f} ({n})" in screen

            # The turn and the reply are in the history with their stats.
            saved = load_session(app.session.id, tmp_path)
            user, reply = saved.messages
            assert (user.role, user.content) == ("user", "Name three colours.")
            assert (reply.role, reply.content, reply.finish_reason) == ("assistant", done.text, done.finish_reason)
            assert reply.stats is not None and reply.stats["tokens"] == s.tokens
            assert reply.stats["drafted"] == s.drafted and reply.stats["drafter"] == "draft"

    asyncio.run(go())


def test_escape_stops_a_reply_midway_and_the_partial_reply_is_kept(engine: Engine, tmp_path: Path) -> None:
    async def go() -> None:
        app = make_app(engine, tmp_path, max_tokens=300)
        async with app.run_test(size=SIZE) as pilot:
            await send(pilot, "Write a long story about a dragon who learns to cook.")
            await wait_until(pilot, lambda: bool(app.query(ReplyView)) and bool(last_reply(app).text),
                             what="the first words")
            await pilot.press("escape")
            await finish(pilot, app)
            done = app.last_done
            assert done is not None and done.finish_reason == "cancelled"
            assert 0 < done.stats.tokens < 300
            view = last_reply(app)
            assert view.text == done.text != ""
            assert view.shown.endswith("[stopped]")
            reply = load_session(app.session.id, tmp_path).messages[-1]
            assert (reply.content, reply.finish_reason) == (done.text, "cancelled")

            # The app goes on: the next turn works after a stop.
            app.base_opts = dataclasses.replace(app.base_opts, max_tokens=4)
            await send(pilot, "Thanks.")
            await finish(pilot, app)
            assert app.last_done is not None and app.last_done.finish_reason in ("length", "stop")
            assert len(load_session(app.session.id, tmp_path).messages) == 4

    asyncio.run(go())


def test_drafter_switch_changes_what_the_next_reply_uses(engine: Engine, tmp_path: Path) -> None:
    async def go() -> None:
        app = make_app(engine, tmp_path, max_tokens=8)
        async with app.run_test(size=SIZE) as pilot:
            assert app.drafter_choices == ["draft", "off"]
            await pilot.press("ctrl+o")
            assert app.drafter == "off" and app.query_one(StatusLine).drafter == "off"
            await send(pilot, "Say hello.")
            await finish(pilot, app)
            plain = app.last_done
            assert plain is not None
            assert plain.stats.drafted == 0 and plain.stats.drafters == ()
            assert app.query_one(Dashboard).drafter == "off"
            assert all(run.drafter is None for run in last_reply(app).runs)

            await pilot.press("ctrl+o")
            assert app.drafter == "draft"
            await send(pilot, "Say goodbye.")
            await finish(pilot, app)
            spec = app.last_done
            assert spec is not None and spec.stats.drafted > 0
            assert [d.name for d in spec.stats.drafters] == ["draft"]
            assert app.query_one(Dashboard).drafter == "draft"
            stats = [m.stats for m in load_session(app.session.id, tmp_path).messages if m.role == "assistant"]
            assert [st["drafter"] for st in stats] == [None, "draft"]  # type: ignore[index]

    asyncio.run(go())


def test_the_switch_offers_every_model_free_drafter_and_starts_on_the_choice(smollm2_path: Path,
                                                                             smollm2_q4_0_path: Path,
                                                                             tmp_path: Path) -> None:
    from localspec.commands.refs import DraftRefs, resolve_name
    from localspec.commands.run import switchable_drafters

    # `run --draft <model>`: ngram and lookahead are loaded too, the first reply drafts with the model only.
    specs, opts = switchable_drafters(DraftRefs(resolve_name(str(smollm2_q4_0_path)), []),
                                      GenerateOptions(max_tokens=8, draft_len=4))
    assert [s.kind for s in specs] == ["ngram", "lookahead"] and opts.drafter == "draft"
    eng = Engine.load(smollm2_path, smollm2_q4_0_path, specs=specs, n_ctx=1024, n_threads=1,
                      personal_history=False)

    async def go() -> None:
        app = LocalspecApp(eng, opts, history_dir=tmp_path, measure_on_start=False)
        async with app.run_test(size=SIZE) as pilot:
            assert app.drafter_choices == ["draft", "draft,ngram,lookahead", "ngram", "lookahead", "off"]
            await send(pilot, "Say hello.")
            await finish(pilot, app)
            assert app.last_done is not None
            assert [d.name for d in app.last_done.stats.drafters] == ["draft"]
            await pilot.press("ctrl+o", "ctrl+o")
            assert app.drafter == "ngram"
            await send(pilot, "Say hello again, say hello again.")
            await finish(pilot, app)
            assert {d.name for d in app.last_done.stats.drafters} <= {"ngram"}

    try:
        asyncio.run(go())
    finally:
        eng.close()


def test_model_free_drafters_are_not_added_when_drafting_is_off() -> None:
    from localspec.commands.refs import DraftRefs
    from localspec.commands.run import switchable_drafters
    from localspec.drafting.specs import parse_draft

    opts = GenerateOptions()
    assert switchable_drafters(DraftRefs(None, []), opts) == ([], opts)  # --draft off: a plain chat
    specs, chosen = switchable_drafters(DraftRefs(None, parse_draft("lookahead")), opts)
    assert [s.kind for s in specs] == ["lookahead", "ngram"] and chosen.drafter == "lookahead"


def test_history_survives_a_restart(engine: Engine, tmp_path: Path) -> None:
    async def first() -> tuple[str, str, int]:
        app = make_app(engine, tmp_path, max_tokens=8, system="You are terse.")
        async with app.run_test(size=SIZE) as pilot:
            await send(pilot, "Remember the word apple.")
            await finish(pilot, app)
            assert app.last_done is not None
            return app.session.id, app.last_done.text, app.last_done.stats.prompt_tokens

    async def second(session_id: str, reply_text: str, first_prompt: int) -> None:
        session = latest_session(tmp_path)
        assert session is not None and session.id == session_id and session.system == "You are terse."
        app = make_app(engine, tmp_path, max_tokens=8, session=session)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            assert [u.text for u in app.query(UserMessage)] == ["Remember the word apple."]
            assert [r.text for r in app.query(ReplyView)] == [reply_text]
            await send(pilot, "Which word?")
            await finish(pilot, app)
            assert app.last_done is not None
            # The earlier turn is part of the new prompt.
            assert app.last_done.stats.prompt_tokens > first_prompt
        saved = load_session(session_id, tmp_path)
        assert [m.role for m in saved.messages] == ["user", "assistant", "user", "assistant"]
        assert saved.messages[1].content == reply_text

    asyncio.run(second(*asyncio.run(first())))


def test_a_prompt_that_does_not_fit_is_one_line_and_the_app_keeps_running(engine: Engine, tmp_path: Path) -> None:
    async def go() -> None:
        app = make_app(engine, tmp_path, max_tokens=8)
        async with app.run_test(size=SIZE, notifications=True) as pilot:
            await send(pilot, "word " * 1500)
            await wait_until(pilot, lambda: not app.reply_running, what="the refusal")
            await pilot.pause()
            error = app.query_one(StatusLine).error
            assert "context holds 1024" in error and "\n" not in error
            assert app.is_running
            # The refused turn is back in the input box, not in the chat, the history or the next prompt.
            assert app.query_one(MessageBox).value == ("word " * 1500).strip()
            assert not app.query(ReplyView) and not app.query(UserMessage)
            # Nothing is left of this chat, so no session file is left either (--resume would reopen it).
            assert list_sessions(tmp_path) == []
            await pilot.press("ctrl+n")
            app.base_opts = dataclasses.replace(app.base_opts, max_tokens=4)
            await send(pilot, "Hi.")
            await finish(pilot, app)
            assert app.last_done is not None and app.query_one(StatusLine).error == ""

    asyncio.run(go())
