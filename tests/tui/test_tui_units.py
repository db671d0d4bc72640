"""The TUI without a model: dashboard arithmetic, the worker's message stream, keys, the engine/UI boundary."""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest
from textual.app import App, ComposeResult
from textual.content import Content
from textual.widgets import TextArea

from localspec.engine import GenerateOptions
from localspec.events import DoneEvent, DrafterStats, GenerationStats, StepEvent, TokenEvent
from localspec.history import latest_session
from localspec_tui.app import LocalspecApp
from localspec_tui.dashboard import Dashboard, bar, expected_tokens_per_step, tokens_per_step_ceiling
from localspec_tui.messages import Piece, ReplyFinished, ReplyProgress
from localspec_tui.streaming import DRAW_SHARE, LONGEST_INTERVAL_S, UPDATE_INTERVAL_S, UpdatePace, stream_reply
from localspec_tui.widgets import MessageBox, ReplyView, StatusLine, SystemPromptScreen
from tui_support import shown_text, stub_engine, svg_text

STATS = GenerationStats(
    prompt_tokens=20, tokens=30, steps=12, drafted=50, accepted=20, elapsed_s=1.5,
    prefill_ms=40.0, draft_ms=300.0, verify_ms=600.0, python_ms=100.0,
    position_drafted=(12, 8, 6, 3, 1), position_accepted=(8, 6, 3, 2, 1),
    drafters=(DrafterStats("draft", 12, 50, 20),),
)


# --- pure arithmetic ----------------------------------------------------------
def test_expected_tokens_per_step_formula() -> None:
    assert expected_tokens_per_step(0.0, 5) == 1.0
    assert expected_tokens_per_step(0.5, 1) == pytest.approx(1.5)
    assert expected_tokens_per_step(0.8, 4) == pytest.approx((1 - 0.8 ** 5) / 0.2)
    assert expected_tokens_per_step(1.0, 5) == 6.0
    assert tokens_per_step_ceiling(0.75) == pytest.approx(4.0)
    assert math.isinf(tokens_per_step_ceiling(1.0))
    # The ceiling bounds the finite-gamma expectation.
    for a in (0.1, 0.5, 0.9):
        assert expected_tokens_per_step(a, 8) < tokens_per_step_ceiling(a)


def test_bar_widths() -> None:
    assert bar(0.0, 10) == "·" * 10
    assert bar(1.0, 10) == "█" * 10
    assert bar(0.5, 10) == "█" * 5 + "·" * 5
    assert len(bar(0.33, 10)) == 10 and bar(2.0, 4) == "████"


# --- the dashboard on fixed stats: numbers and a screenshot ---------------------
class DashboardApp(App[None]):
    def compose(self) -> ComposeResult:
        yield Dashboard(id="dashboard")


async def showing_stats(app: DashboardApp, pilot) -> Dashboard:  # type: ignore[no-untyped-def]
    """``app``'s dashboard showing STATS, for a draft model at γ 5, against a plain speed of 10 tok/s."""
    d = app.query_one(Dashboard)
    d.drafter, d.draft_len, d.plain_tok_s = "draft", 5, 10.0
    d.begin_reply()
    d.show_stats(STATS)
    await pilot.pause()
    return d


def test_dashboard_shows_the_engine_numbers_and_a_screenshot_has_them() -> None:
    async def go() -> tuple[Dashboard, str]:
        app = DashboardApp()
        async with app.run_test(size=(60, 50)) as pilot:
            d = await showing_stats(app, pilot)
            return d, svg_text(app.export_screenshot())

    d, screen = asyncio.run(go())
    assert d.alpha == STATS.acceptance_rate == 0.4
    assert d.reached_alpha == pytest.approx(20 / 30)
    assert d.tau == STATS.tokens_per_step == 2.5
    assert d.ceiling == pytest.approx(3.0)
    assert d.expected_tau == pytest.approx(expected_tokens_per_step(20 / 30, 5))
    assert d.tokens_per_second == STATS.tokens_per_second == 20.0
    assert d.speedup == pytest.approx(2.0)
    assert d.time_split == pytest.approx((0.3, 0.6, 0.1))
    assert list(d.speed_samples) == [pytest.approx(20.0)]
    for expected in ("drafter draft  γ 5", "α accepted       0.40  20/50 drafted",
                     "α reached        0.67  20/30 judged", "τ tokens/step    2.50  30 tokens / 12 steps",
                     "ceiling 1/(1−α)  3.00", f"expected τ γ=5   {expected_tokens_per_step(20 / 30, 5):.2f}",
                     "Acceptance by draft position", "0.67 (12)", "0.75 (8)",
                     "reply 20.0 tok/s · plain 10.0 tok/s", "speedup 2.00× over plain decoding",
                     "draft 30%", "verify 60%", "python 10%", "prefill 40 ms",
                     "draft      α 0.40  20/50 in 12 steps"):
        assert expected in screen, (expected, screen)


def test_the_speedup_is_one_number_against_the_controllers_plain_estimate() -> None:
    """Issue 33: "speedup 0.17×" beside "measured 0.66×", from a plain baseline measured while busy."""
    from dataclasses import replace

    from localspec.events import ControlSummary

    control = ControlSummary(draft_steps=8, plain_steps=4, probes=0, mean_draft_len=4.0, expected_gain=1.54,
                             measured_gain=1.3, last_reason="drafting pays")
    # 30 tokens that plain decoding would have taken 1500 ms for (50 ms a token), in 1000 ms of steps
    stats = replace(STATS, plain_estimate_ms=1500.0, control=control)

    async def go() -> tuple[Dashboard, str]:
        app = DashboardApp()
        async with app.run_test(size=(60, 50)) as pilot:
            d = app.query_one(Dashboard)
            d.drafter, d.plain_tok_s = "draft", 1.0  # a start-up baseline taken under load: not the divisor
            d.begin_reply()
            d.show_stats(stats)
            await pilot.pause()
            return d, svg_text(app.export_screenshot())

    d, screen = asyncio.run(go())
    assert stats.speedup == pytest.approx(1.5) and d.speedup == stats.speedup
    assert d.plain_speed == pytest.approx(20.0)
    assert "speedup 1.50× over plain decoding" in screen and "plain 20.0 tok/s" in screen, screen
    assert "drafting steps  expected 1.54× · measured 1.30×" in screen, screen


def test_a_new_draft_length_alone_redraws_the_drafter_line() -> None:
    async def go() -> tuple[str, str]:
        app = DashboardApp()
        async with app.run_test(size=(60, 50)) as pilot:
            d = app.query_one(Dashboard)
            d.drafter = "draft"
            await pilot.pause()
            before = svg_text(app.export_screenshot())
            d.draft_len = 7
            await pilot.pause()
            return before, svg_text(app.export_screenshot())

    before, after = asyncio.run(go())
    assert "drafter draft  γ 5" in before and "drafter draft  γ 7" in after, after


def test_an_update_redraws_only_the_dashboard_parts_whose_text_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each redrawn part costs the UI thread a render, and the reply's decoding waits for that thread."""
    from dataclasses import replace

    from textual.widgets import Static

    redrawn: list[str | None] = []
    update = Static.update

    def recording_update(self: Static, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        redrawn.append(self.id)
        update(self, *args, **kwargs)

    async def go() -> str:
        app = DashboardApp()
        async with app.run_test(size=(60, 50)) as pilot:
            d = await showing_stats(app, pilot)
            monkeypatch.setattr(Static, "update", recording_update)
            d.show_stats(STATS)  # the same totals: nothing to redraw
            assert redrawn == []
            # four more tokens in one more step, in more time: the speed, τ and the time split change;
            # the drafter line, the positions, the drafters and the controller do not
            d.show_stats(replace(STATS, tokens=34, steps=13, elapsed_s=2.0, verify_ms=700.0))
            await pilot.pause()
            return svg_text(app.export_screenshot())

    screen = asyncio.run(go())
    assert sorted(redrawn) == ["dash-acceptance", "dash-speed", "dash-split"], redrawn
    assert "τ tokens/step    2.62  34 tokens / 13 steps" in screen and "reply 17.0 tok/s" in screen, screen


def test_dashboard_before_any_reply_shows_placeholders() -> None:
    async def go() -> str:
        app = DashboardApp()
        async with app.run_test(size=(60, 50)) as pilot:
            await pilot.pause()
            return svg_text(app.export_screenshot())

    screen = asyncio.run(go())
    assert "no drafts yet" in screen and "speedup …" in screen and "none used" in screen


# --- the worker's side: events in, throttled messages out ------------------------
class FakeGeneration:
    """Stands in for engine.Generation: yields scripted events, records cancel()."""

    def __init__(self, events: list) -> None:
        self.events = events
        self.cancelled = False

    def __iter__(self) -> Iterator:
        for event in self.events:
            if self.cancelled and isinstance(event, StepEvent):
                yield event
                yield DoneEvent("cancelled", "ab", (1, 2), GenerationStats(tokens=2, steps=1))
                return
            yield event

    def cancel(self) -> None:
        self.cancelled = True

    def stats(self) -> GenerationStats:
        return GenerationStats(tokens=1)


def test_stream_reply_passes_prompt_progress_on_and_the_app_shows_it(tmp_path: Path) -> None:
    from localspec.events import PrefillEvent
    from localspec_tui.messages import PromptProgress

    events = [PrefillEvent(512, 1300), PrefillEvent(1024, 1300), PrefillEvent(1299, 1299),
              DoneEvent("length", "", (), GenerationStats())]
    posted: list = []
    stream_reply(FakeGeneration(events), 7, posted.append, drafter=None)  # type: ignore[arg-type]
    progress = [(m.done, m.total) for m in posted if isinstance(m, PromptProgress)]
    assert progress == [(512, 1300), (1024, 1300), (1299, 1299)] and isinstance(posted[-1], ReplyFinished)

    async def go() -> str:
        app = LocalspecApp(stub_engine(), GenerateOptions(), history_dir=tmp_path,  # type: ignore[arg-type]
                           measure_on_start=False)
        async with app.run_test(size=(120, 30)) as pilot:
            app._reply_id = 7
            app.post_message(PromptProgress(7, 1024, 1300))
            await pilot.pause()
            return app.query_one(StatusLine).activity

    assert asyncio.run(go()) == "reading the prompt… 1024/1300 tokens (78%; Esc stops)"


def test_stream_reply_posts_all_text_before_finishing() -> None:
    step = StepEvent(1, "draft", 3, 1, 2, 1.0, 2.0, 0.1)
    events = [TokenEvent(1, "He", "draft"), TokenEvent(2, "llo", None), step,
              TokenEvent(3, "", None), TokenEvent(4, " wo", None), TokenEvent(5, "rld", None), step,
              TokenEvent(6, "!", None),
              DoneEvent("stop", "Hello world!", (1, 2, 3, 4, 5, 6), GenerationStats(tokens=6))]
    posted: list = []
    done = stream_reply(FakeGeneration(events), 7, posted.append, drafter="draft",  # type: ignore[arg-type]
                        pace=UpdatePace(shortest=3600))
    assert done.finish_reason == "stop"
    assert isinstance(posted[-1], ReplyFinished) and posted[-1].done is done and posted[-1].reply_id == 7
    progress = [m for m in posted if isinstance(m, ReplyProgress)]
    # The first step is posted at once; the rest is held (long interval) and flushed before the end.
    assert len(progress) == 2
    assert progress[0].pieces == (Piece("He", "draft"), Piece("llo", None))
    assert progress[1].pieces == (Piece(" world!", None),)
    assert "".join(p.text for m in progress for p in m.pieces) == done.text
    assert sum(len(m.steps) for m in progress) == 2


def test_the_update_pace_slows_while_drawing_an_update_takes_more_than_its_share_and_recovers() -> None:
    pace = UpdatePace()
    pace.drew(0.2 * DRAW_SHARE * UPDATE_INTERVAL_S)  # cheap to draw: ten a second
    assert pace.interval_s == UPDATE_INTERVAL_S
    busy = 3 * DRAW_SHARE * UPDATE_INTERVAL_S  # an update takes 3x its share: a 3x longer interval wanted
    pace.drew(busy)
    assert pace.interval_s == pytest.approx(2 * UPDATE_INTERVAL_S)  # halfway there
    for _ in range(20):
        pace.drew(busy)
    assert pace.interval_s == pytest.approx(3 * UPDATE_INTERVAL_S)
    pace.drew(10.0)  # however slow: still twice a second
    assert UPDATE_INTERVAL_S < pace.interval_s <= LONGEST_INTERVAL_S
    for _ in range(20):
        pace.drew(0.0)
    assert pace.interval_s == pytest.approx(UPDATE_INTERVAL_S, abs=1e-4)


def test_the_app_tells_the_pace_what_each_update_cost_its_thread(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    append = ReplyView.append
    costs: list[float] = []

    def slow_append(self: ReplyView, pieces) -> None:  # type: ignore[no-untyped-def]
        start = time.thread_time()
        while time.thread_time() - start < 0.05:  # 50 ms of this thread's CPU an update
            pass
        append(self, pieces)

    def recording_drew(self: UpdatePace, busy_s: float) -> None:
        costs.append(busy_s)
        drew(self, busy_s)

    drew = UpdatePace.drew
    monkeypatch.setattr(UpdatePace, "drew", recording_drew)
    monkeypatch.setattr(ReplyView, "append", slow_append)

    async def go() -> float:
        app = LocalspecApp(stub_engine(), GenerateOptions(), history_dir=tmp_path, measure_on_start=False)  # type: ignore[arg-type]
        async with app.run_test(size=(120, 30)) as pilot:
            app._reply_id = 7
            app._reply_view = ReplyView(app.colours)
            await app.query_one("#chat").mount(app._reply_view)
            app.pace = UpdatePace()  # (as a reply starts)
            for _ in range(4):
                app.post_message(ReplyProgress(7, (Piece("b", None),), (), GenerationStats()))
                await pilot.pause()
            return app.pace.interval_s

    interval = asyncio.run(go())
    # each update is told the thread's time since the one before: from the second on, a slow update's 50 ms
    assert len(costs) == 4 and all(cost >= 0.05 for cost in costs[1:]), costs
    assert interval > 0.8 * LONGEST_INTERVAL_S, interval  # 50 ms an update over a 10% share: 0.5 s wanted


def test_stream_reply_cancels_when_asked() -> None:
    step = StepEvent(1, None, 0, 0, 1, 0.0, 1.0, 0.1)
    gen = FakeGeneration([TokenEvent(1, "a", None), step, TokenEvent(2, "b", None), step, step])
    posted: list = []
    done = stream_reply(gen, 1, posted.append, drafter=None, should_stop=lambda: True)  # type: ignore[arg-type]
    assert gen.cancelled and done.finish_reason == "cancelled"
    assert isinstance(posted[-1], ReplyFinished)


# --- the app's keys and dialogs, with an engine that never generates -------------
def test_footer_shows_every_key_and_drafter_colour_system_new_chat_keys_work(tmp_path: Path) -> None:
    async def go() -> None:
        app = LocalspecApp(stub_engine(("draft", "ngram")), GenerateOptions(), history_dir=tmp_path,  # type: ignore[arg-type]
                           measure_on_start=False)
        async with app.run_test(size=(140, 40)) as pilot:
            app.query_one(MessageBox).cursor_blink = False
            await pilot.pause()
            screen = svg_text(app.export_screenshot())
            for key, label in (("esc", "Stop reply"), ("^n", "New chat"), ("^s", "System prompt"),
                               ("^o", "Drafter"), ("^t", "Colours"), ("^r", "Plain speed"), ("^q", "Quit")):
                assert f"{key} {label}" in screen, (key, screen)
            assert "target-Q4 → draft draft-Q4_0 · GPU offload:" in screen

            # The drafter key cycles through the engine's drafters, then off, then round again.
            status = app.query_one(StatusLine)
            seen = [app.drafter]
            for _ in range(3):
                await pilot.press("ctrl+o")
                seen.append(app.drafter)
            assert seen == ["draft", "ngram", "off", "draft"]
            assert status.drafter == "draft"
            await pilot.press("ctrl+o", "ctrl+o")
            assert app.reply_options().speculative is False
            await pilot.press("ctrl+o")
            assert app.reply_options().drafter == "draft" and app.reply_options().speculative

            # Replies show as Markdown; ctrl+t switches every reply view to provenance colours and back.
            from rich.markdown import Markdown

            view = ReplyView(app.colours, colour=app.colour, text="")
            view.append([Piece("drafted **bold**", "draft"), Piece("\n```python\nx = 1\n", None)])
            await app.query_one("#chat").mount(view)
            await pilot.pause()
            assert app.colour is False and isinstance(view.content, Markdown)
            screen = svg_text(app.export_screenshot())
            # the code block is highlighted (its spaces become separate spans), the emphasis marks are gone
            assert "x=1" in screen.replace(" ", "") and "drafted bold" in screen
            assert "**" not in screen and "```" not in screen
            await pilot.press("ctrl+t")
            assert app.colour is True and view.colour is True
            assert isinstance(view.content, Content) and any(s.style for s in view.content.spans)
            assert "provenance colours" in status.render().plain
            await pilot.press("ctrl+t")
            assert app.colour is False and isinstance(view.content, Markdown)
            assert view.text == "drafted **bold**\n```python\nx = 1\n" and "markdown" in status.render().plain

            # System prompt: ctrl+s opens the editor, ctrl+s there saves.
            await pilot.press("ctrl+s")
            assert isinstance(app.screen, SystemPromptScreen)
            app.screen.query_one(TextArea).text = "Answer in French."
            await pilot.press("ctrl+s")
            await pilot.pause()
            assert not isinstance(app.screen, SystemPromptScreen)
            assert app.session.system == "Answer in French."
            assert shown_text(app.query_one("#system-note")) == "system: Answer in French."
            assert app.session.chat_messages()[0] == {"role": "system", "content": "Answer in French."}
            # Esc in the editor cancels without touching the prompt.
            await pilot.press("ctrl+s")
            app.screen.query_one(TextArea).text = "discarded"
            await pilot.press("escape")
            await pilot.pause()
            assert app.session.system == "Answer in French."

            # New chat: fresh session id, same system prompt, empty chat.
            old_id = app.session.id
            await pilot.press("ctrl+n")
            await pilot.pause()
            assert app.session.id != old_id and app.session.system == "Answer in French."
            assert not app.query(ReplyView)

    asyncio.run(go())
    assert latest_session(tmp_path) is None  # nothing was said, so nothing was written


# --- the boundary: the engine never pulls in the UI ------------------------------
def test_engine_imports_do_not_load_textual() -> None:
    code = (
        "import sys, localspec, localspec.engine, localspec.commands.generate, localspec.history\n"
        "import localspec.commands.run\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('textual', 'localspec_tui'))\n"
        "print(' '.join(bad))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "", f"importing the engine loaded UI modules: {proc.stdout}"


def test_the_gpu_plan_shows_in_the_title_and_a_notification(tmp_path: Path) -> None:
    from localspec.models.placement import LoadSettings

    placement = LoadSettings(4096, 43, -1, message="GPU plan for --vram 24GiB: 42/80 target layers on the GPU",
                             brief="plan: 42/80 layers, ctx 4096")
    notes: list[str] = []

    class Recording(LocalspecApp):
        def notify(self, message: str, **kwargs) -> None:  # type: ignore[no-untyped-def, override]
            notes.append(message)

    async def go() -> None:
        app = Recording(stub_engine(), GenerateOptions(), history_dir=tmp_path, measure_on_start=False,  # type: ignore[arg-type]
                        placement=placement)
        async with app.run_test(size=(160, 30)) as pilot:
            await pilot.pause()
            assert app.sub_title.endswith(" · plan: 42/80 layers, ctx 4096")
            assert "plan: 42/80 layers, ctx 4096" in svg_text(app.export_screenshot())
        assert notes == [placement.message]
        plain = LocalspecApp(stub_engine(), GenerateOptions(), history_dir=tmp_path, measure_on_start=False)  # type: ignore[arg-type]
        assert "plan:" not in plain.model_line()

    asyncio.run(go())


def test_the_app_runs_with_a_short_switch_interval_and_gives_the_old_one_back(tmp_path: Path) -> None:
    """The reply's worker waits for the interpreter up to the switch interval each time a llama.cpp call
    returns while the UI draws (benchmarks/bench_app_overhead.py: 0.77x the engine alone at Python's 5 ms
    with a GPU-like decode, 0.90x at the app's)."""
    from localspec_tui.app import SWITCH_INTERVAL_S

    before = sys.getswitchinterval()
    assert before != SWITCH_INTERVAL_S

    async def go() -> float:
        app = LocalspecApp(stub_engine(), GenerateOptions(), history_dir=tmp_path, measure_on_start=False)  # type: ignore[arg-type]
        async with app.run_test(size=(120, 30)) as pilot:
            await pilot.pause()
            return sys.getswitchinterval()

    assert asyncio.run(go()) == pytest.approx(SWITCH_INTERVAL_S)
    assert sys.getswitchinterval() == pytest.approx(before)


def test_the_header_reports_the_context_llama_cpp_made_and_what_was_asked(tmp_path: Path) -> None:
    from localspec.backend import gpu_offload_supported
    from localspec.models.placement import LoadSettings

    notes: list[str] = []

    class Recording(LocalspecApp):
        def notify(self, message: str, **kwargs) -> None:  # type: ignore[no-untyped-def, override]
            notes.append(message)

    engine = stub_engine()
    engine.n_ctx = 256  # what llama.cpp made of --ctx 17

    async def go() -> None:
        app = Recording(engine, GenerateOptions(), history_dir=tmp_path, measure_on_start=False,  # type: ignore[arg-type]
                        placement=LoadSettings(17, 0, 0))
        async with app.run_test(size=(160, 30)) as pilot:
            await pilot.pause()
            offload = "yes" if gpu_offload_supported() else "no (CPU build)"
            assert app.sub_title.endswith(f"GPU offload: {offload} · ctx 256 (asked 17)")
            assert "ctx 256 (asked 17)" in svg_text(app.export_screenshot())
        assert notes == ["the context holds 256 tokens: llama.cpp rounded up the 17 asked for"]

    asyncio.run(go())
    # Asked and made agree: the size alone, and no notice.
    same = LocalspecApp(engine, GenerateOptions(), history_dir=tmp_path, measure_on_start=False,  # type: ignore[arg-type]
                        placement=LoadSettings(256, 0, 0))
    assert same.model_line().endswith(" · ctx 256")


def test_exit_signals_reach_the_app_and_sigcont_resumes_only_after_a_suspend() -> None:
    import os
    import signal

    from localspec_tui.signals import ExitSignals

    textual_calls: list[str] = []  # stand-ins for the handlers Textual's driver installs

    def textual_stop(signum: int, frame: object) -> None:
        textual_calls.append("suspend")

    def textual_continue(signum: int, frame: object) -> None:
        textual_calls.append("resume")

    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTSTP, signal.SIGCONT, signal.SIGTERM)}
    signal.signal(signal.SIGTSTP, textual_stop)
    signal.signal(signal.SIGCONT, textual_continue)
    caught: list[int] = []

    async def go() -> None:
        signals = ExitSignals(caught.append)
        signals.install()
        try:
            os.kill(os.getpid(), signal.SIGCONT)  # as with the SIGHUP of a closed terminal: no suspend before
            await asyncio.sleep(0.05)
            assert textual_calls == []
            os.kill(os.getpid(), signal.SIGTSTP)
            os.kill(os.getpid(), signal.SIGCONT)
            await asyncio.sleep(0.05)
            assert textual_calls == ["suspend", "resume"]
            assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None)  # else it would end the tests
            os.kill(os.getpid(), signal.SIGTERM)
            await asyncio.sleep(0.05)
            assert caught == [signal.SIGTERM]
        finally:
            signals.release()
        assert signal.getsignal(signal.SIGCONT) is textual_continue
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL

    try:
        asyncio.run(go())
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
