"""The ``localspec run`` chat app: a chat pane and a live speculation dashboard.

Threading: the engine is not thread-safe, so every use of it happens on a
worker thread holding ``_engine_lock`` (replies and plain-speed runs take
turns). Workers only post messages (``localspec_tui.messages``); handlers on
the UI thread update widgets and write the history.

Leaving: ctrl+q, SIGTERM, SIGHUP, SIGINT (``localspec_tui.signals``) and an
exception in the app all end in ``wait_for_engine``, which stops the reply in
flight after its current step and saves it as it stands (``finish_reason``
"interrupted"), so the history always ends with the reply to its last message.
A signal saves at once, before the terminal (perhaps already gone) is restored.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
from pathlib import Path

from textual import events, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import Footer, Header, Static
from textual.geometry import Size
from textual.worker import get_current_worker

from localspec.backend import gpu_offload_supported
from localspec.engine import Engine, GenerateOptions
from localspec.errors import LocalspecError
from localspec.events import DoneEvent, GenerationStats
from localspec.history import (
    Session,
    SessionLock,
    SessionMessage,
    remove_session,
    save_session,
    stats_summary,
    valid_text,
)
from localspec.models.placement import LoadSettings
from localspec_tui.dashboard import Dashboard
from localspec_tui.messages import (
    PlainSpeedFailed,
    PromptProgress,
    PlainSpeedMeasured,
    ReplyFailed,
    ReplyFinished,
    ReplyProgress,
)
from localspec_tui.signals import ExitSignals
from localspec_tui.streaming import UpdatePace, measure_plain_speed, stream_reply
from localspec_tui.widgets import (
    MessageBox,
    ReplyView,
    StatusLine,
    SystemPromptScreen,
    UserMessage,
    drafter_colours,
    legend,
)

SWITCH_INTERVAL_S = 0.0005
"""The interpreter's thread switch interval while the app runs (Python's default is 5 ms). The reply's
worker gives up the interpreter in every llama.cpp call and needs it back when the call returns; while the
UI thread renders, it waits for it up to the switch interval each time. With a decode of a few
milliseconds (a GPU) the 5 ms default cost the reply ~20% of its speed in the app; see docs/app.md."""

OFF = "off"
"""The drafter choice that turns speculation off (plain decoding)."""

INTERRUPTED = "interrupted"
"""The finish reason saved with a reply cut short by leaving the app (Esc saves "cancelled")."""

GENERATING_ACTIVITY = "generating… (Esc stops)"
MEASURING_ACTIVITY = "measuring costs… (plain decoding until they are known; Esc stops)"
"""The first reply with new models, threads or build: the costs are measured between its steps."""

NARROW_COLUMNS = 80
"""Below this width the dashboard (46 columns) folds away so the chat keeps the room; ctrl+b shows it
in the chat's place and back."""

SHORT_ROWS = 16
"""Below this height the header goes, so the chat and the message box keep the rows."""

SIGNAL_WAIT_S = 10.0
"""How long a signal waits for the reply's current step before saving what is on screen instead."""


def error_line(err: Exception) -> str:
    """One line for a failure while generating: a LocalspecError says what to do; anything else is named."""
    lines = str(err).splitlines()
    first = lines[0] if lines else ""
    if isinstance(err, LocalspecError) and first:
        return first
    return f"the reply failed with an internal error ({type(err).__name__}{': ' if first else ''}{first})"


class LocalspecApp(App[int]):
    """Chat with ``engine``; every turn and reply is saved to ``session`` as it happens.

    ``opts`` are the CLI's generation options; the drafter choice (key ctrl+o)
    overrides ``speculative``/``drafter`` per reply. ``history_dir`` None
    means the user's data dir. ``plain_tokens`` is the length of the plain
    baseline run, measured at start when ``measure_on_start``. ``placement`` is what the
    models were loaded with; its GPU plan, if one was made, shows in the title and a notification.
    ``session_lock``: the caller's hold on ``session`` (``localspec run`` takes it before loading
    models); without one the app takes its own, so constructing a second app on a chat that is open
    raises ``SessionError``. The app holds its current chat's lock until it ends.
    """

    CSS_PATH = Path(__file__).with_name("app.tcss")  # absolute: subclasses live elsewhere
    TITLE = "localspec"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS = [
        Binding("escape", "stop", "Stop reply"),
        Binding("ctrl+n", "new_chat", "New chat"),
        Binding("ctrl+s", "edit_system", "System prompt"),
        Binding("ctrl+o", "next_drafter", "Drafter"),
        Binding("ctrl+t", "toggle_colours", "Colours"),
        Binding("ctrl+r", "measure_plain", "Plain speed"),
        Binding("ctrl+b", "toggle_dashboard", "Dashboard"),
        Binding("ctrl+q", "quit", "Quit", priority=True),
    ]

    def __init__(self, engine: Engine, opts: GenerateOptions | None = None, *, session: Session | None = None,
                 system: str | None = None, history_dir: Path | None = None, plain_tokens: int = 24,
                 measure_on_start: bool = True, placement: LoadSettings | None = None,
                 session_lock: SessionLock | None = None) -> None:
        super().__init__()
        self.engine = engine
        self.placement = placement
        self.base_opts = opts or GenerateOptions()
        self.history_dir = history_dir
        names = engine.drafter_names()
        self.session = session or Session(model=engine.target.name,
                                          draft=engine.draft.name if engine.draft is not None else None)
        self.session_lock = session_lock or SessionLock.acquire(self.session.id, history_dir)
        self._notices: list[str] = []  # shown once the app is mounted
        self._switch_interval = sys.getswitchinterval()  # restored when the app ends
        self.pace = UpdatePace()  # how often the reply's worker posts progress (made anew for each reply)
        if system is not None:
            self.session.system = self._valid(system, "the system prompt") or None
        self._clean_session()
        # A message a lost reply left unanswered goes back into the input box (history.take_unanswered).
        self.unanswered = self.session.take_unanswered()
        wanted = (self.base_opts.drafter if self.base_opts.speculative and self.base_opts.draft_len != 0
                  else OFF)
        # ctrl+o cycles: what the command line chose (it may be a combination of some of the
        # drafters), each combination the engine offers, each drafter alone, then off.
        self.drafter_choices = list(dict.fromkeys([*([wanted] if wanted else []), *names, OFF]))
        self.drafter = wanted if wanted else self.drafter_choices[0]
        self.colours = drafter_colours(names)
        self.colour = False  # replies as Markdown; ctrl+t: provenance colours
        self.dashboard_asked = False
        self._told_folded = False
        """ctrl+b: on a wide screen, hide the dashboard; on a narrow one, show it in the chat's place."""
        self.plain_tokens = plain_tokens
        self.measure_on_start = measure_on_start
        self.plain_tok_s = 0.0
        self.last_done: DoneEvent | None = None
        self.reply_running = False
        self.measuring = False
        self._engine_lock = threading.Lock()
        self._reply_id = 0
        self._reply_view: ReplyView | None = None
        self._user_view: UserMessage | None = None
        self._cancel = threading.Event()
        self._shutting_down = threading.Event()
        self._recorded_id = 0  # the last reply id whose reply is in the history
        self._reply_drafter: str | None = None
        self._worker_done: tuple[int, DoneEvent] | None = None  # set by the reply worker under _engine_lock
        self._exit_signals = ExitSignals(self._exit_on_signal)
        self.exit_signal: int | None = None
        """The signal that ended the app, if one did."""
        self.unsaved_error: str | None = None
        """Why the last save of the history failed; None when the history on disk is up to date."""

    # --- layout ------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="main"):
            with Vertical(id="chat-column"):
                with VerticalScroll(id="chat"):
                    yield Static(id="system-note")
                yield StatusLine(id="status")
                yield MessageBox(placeholder="Message (Enter sends, Ctrl+J or Shift+Enter: new line)", id="prompt")
            yield Dashboard(legend=legend(self.colours), id="dashboard")
        yield Footer()

    def on_mount(self) -> None:
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        self.sub_title = self.model_line()
        self.query_one("#chat", VerticalScroll).anchor()
        dashboard = self.query_one(Dashboard)
        dashboard.draft_len = self.base_opts.draft_len or 0  # 0: the adaptive controller decides
        dashboard.drafter = self.drafter
        self.query_one(StatusLine).drafter = self.drafter
        self.query_one(StatusLine).colour = self.colour
        self._show_system_note()
        for m in self.session.messages:
            if m.role == "user":
                self._chat().mount(UserMessage(m.content))
            elif m.role == "assistant":
                view = ReplyView(self.colours, colour=self.colour, text=m.content)
                view.finish_reason = m.finish_reason
                self._chat().mount(view)
        if self.session.messages:
            self.notify(f"resumed session {self.session.id}")
        prompt = self.query_one("#prompt", MessageBox)
        if self.unanswered is not None:
            prompt.value = self.unanswered
            self.notify("your last message was never answered; it is back in the input box (Enter sends it)",
                        severity="warning", timeout=10)
        if self.placement is not None and self.placement.message:
            self.notify(self.placement.message, timeout=15)
        if self.asked_ctx is not None and self.asked_ctx != self.engine.n_ctx:
            self.notify(f"the context holds {self.engine.n_ctx} tokens: llama.cpp rounded up the "
                        f"{self.asked_ctx} asked for", timeout=10)
        for notice in self._notices:
            self.notify(notice, severity="warning", timeout=10)
        self._notices.clear()
        prompt.focus()
        self._fit_layout()
        self._exit_signals.install()
        if self.measure_on_start:
            self.action_measure_plain()

    def on_resize(self, event: events.Resize) -> None:
        # ``self.size`` still holds the old size here (the app passes the new one to its screen on a
        # timer): fold for the size in the event, before the screen lays out at it. Laying out first put
        # the 46-column dashboard beside a chat of width 0, which Rich cannot draw.
        self._fit_layout(event.size)

    def _fit_layout(self, size: Size | None = None) -> None:
        """Fold the dashboard on a narrow screen and the header on a short one (ctrl+b overrides the first)."""
        width, height = size if size is not None else self.size
        narrow = width < NARROW_COLUMNS
        show_dashboard = narrow == self.dashboard_asked  # wide: shown unless hidden; narrow: hidden unless asked
        dashboard = self.query_one(Dashboard)
        dashboard.display = show_dashboard
        dashboard.set_class(narrow, "full")
        self.query_one("#chat-column").display = not (narrow and show_dashboard)
        self.query_one(Header).display = height >= SHORT_ROWS
        if narrow and not show_dashboard and not self._told_folded:
            self._told_folded = True
            self.notify("narrow window: the dashboard is folded away (ctrl+b shows it)", timeout=6)

    def action_toggle_dashboard(self) -> None:
        self.dashboard_asked = not self.dashboard_asked
        self._fit_layout()
        if not self.query_one("#chat-column").display:
            return
        self.query_one("#prompt", MessageBox).focus()

    @property
    def asked_ctx(self) -> int | None:
        """The context size the engine was asked for (``--ctx`` or the GPU plan), when known."""
        return self.placement.n_ctx if self.placement is not None else None

    def model_line(self) -> str:
        """'target → draft · GPU offload: yes/no · ctx N', file names rather than metadata names (they show
        the quant); the context is the one llama.cpp made ('ctx 256 (asked 17)' when it rounded up what
        was asked), then the GPU plan in brief ('plan: 42/80 layers, ctx 4096') when one was made."""
        line = self.engine.target.path.stem
        if self.engine.draft is not None:
            line += f" → draft {self.engine.draft.path.stem}"
        line += f" · GPU offload: {'yes' if gpu_offload_supported() else 'no (CPU build)'}"
        line += f" · ctx {self.engine.n_ctx}"
        if self.asked_ctx is not None and self.asked_ctx != self.engine.n_ctx:
            line += f" (asked {self.asked_ctx})"
        brief = self.placement.brief if self.placement is not None else None
        return f"{line} · {brief}" if brief else line

    def _chat(self) -> VerticalScroll:
        return self.query_one("#chat", VerticalScroll)

    def _status(self) -> StatusLine:
        return self.query_one(StatusLine)

    def _show_system_note(self) -> None:
        note = self.query_one("#system-note", Static)
        note.update(f"system: {self.session.system}" if self.session.system else "")
        note.display = bool(self.session.system)

    # --- text in -----------------------------------------------------------
    def _valid(self, text: str, what: str) -> str:
        """``text`` fit for the model and the history: bytes that were not UTF-8 become U+FFFD, said once."""
        fixed, changed = valid_text(text)
        if changed:
            self._say_replaced(what)
        return fixed

    def _say_replaced(self, what: str) -> None:
        note = f"{what} held bytes that are not UTF-8; they were replaced with U+FFFD (\ufffd)"
        if self.is_running:
            self.notify(note, severity="warning", timeout=10)
        else:
            self._notices.append(note)

    def _clean_session(self) -> None:
        """A resumed file may hold escaped lone surrogates (another tool wrote it): replace them, said once."""
        s = self.session
        replaced = False
        if s.system:
            s.system, replaced = valid_text(s.system)
        for m in s.messages:
            m.content, changed = valid_text(m.content)
            replaced = replaced or changed
        if replaced:
            self._say_replaced("the resumed chat")

    # --- history -----------------------------------------------------------
    def _save(self) -> None:
        """Write the session; a chat with no messages is no session (its file, if one was written, goes)."""
        try:
            if self.session.messages:
                save_session(self.session, self.history_dir)
            else:
                remove_session(self.session.id, self.history_dir)
        except OSError as err:
            self.unsaved_error = f"could not save the chat history: {err}"
            self._error(self.unsaved_error)
        else:
            self.unsaved_error = None

    def _error(self, text: str) -> None:
        """Show a user-caused failure as one line; the app keeps running."""
        if not self.is_running:  # leaving: the widgets are gone (the caller keeps what matters)
            return
        self._status().error = text
        self.notify(text, severity="error", timeout=8)

    def _record_reply(self, text: str, finish_reason: str, stats: dict[str, object] | None) -> None:
        """Add the current reply to the history and save it, once per reply."""
        if self._recorded_id == self._reply_id:
            return
        self._recorded_id = self._reply_id
        self.session.messages.append(SessionMessage("assistant", text, finish_reason, stats))
        self._save()

    def _keep_unfinished_reply(self) -> None:
        """Leaving mid-reply: save the reply as it stands, marked "interrupted".

        The worker's final DoneEvent holds everything generated (it ends after its current step
        once told to stop); if it has not ended, what is on screen is saved. A reply with no text
        yet is not saved: its message stays the last turn, and --resume offers it again.
        """
        if not self.reply_running or self._recorded_id == self._reply_id:
            return
        finished = self._worker_done
        done = finished[1] if finished is not None and finished[0] == self._reply_id else None
        if done is not None and done.finish_reason != "cancelled":
            reason = done.finish_reason  # it ended by itself before it could be stopped
        else:
            reason = INTERRUPTED
        text = done.text if done is not None else (self._reply_view.text if self._reply_view is not None else "")
        if not text:
            return
        stats = stats_summary(done.stats, self._reply_drafter) if done is not None else None
        self._record_reply(text, reason, stats)

    # --- sending -----------------------------------------------------------
    def reply_options(self) -> GenerateOptions:
        """The options for the next reply: the CLI's, with the current drafter choice."""
        if self.drafter == OFF:
            return dataclasses.replace(self.base_opts, speculative=False, drafter=None)
        return dataclasses.replace(self.base_opts, speculative=True, drafter=self.drafter)

    def on_message_box_submitted(self, event: MessageBox.Submitted) -> None:
        text = event.value.strip()
        if not text:
            return
        if self.reply_running:
            self.notify("a reply is still streaming; press Esc to stop it", severity="warning")
            return
        event.box.clear()
        text = self._valid(text, "your message")
        self.session.messages.append(SessionMessage("user", text))
        self._save()
        self._reply_view = ReplyView(self.colours, colour=self.colour)
        self._user_view = UserMessage(text)
        self._chat().mount(self._user_view, self._reply_view)
        self._reply_id += 1
        self._reply_drafter = None if self.drafter == OFF else self.drafter
        self._cancel = threading.Event()
        self.reply_running = True
        self._status().error = ""
        self._status().activity = GENERATING_ACTIVITY
        dashboard = self.query_one(Dashboard)
        dashboard.drafter = self.drafter
        dashboard.begin_reply()
        self.pace = UpdatePace()
        self.refresh_bindings()
        self._generate_reply(self._reply_id, self.session.chat_messages(), self.reply_options(),
                             None if self.drafter == OFF else self.drafter, self._cancel)

    @work(thread=True, exclusive=True, group="reply")
    def _generate_reply(self, reply_id: int, messages: list[dict[str, str]], opts: GenerateOptions,
                        drafter: str | None, cancel: threading.Event) -> None:
        worker = get_current_worker()
        with self._engine_lock:
            if self._shutting_down.is_set():
                return
            try:
                generation = self.engine.generate(self.engine.chat_tokens(messages), opts)
            except Exception as err:  # whatever fails, the app goes on: one line, the message back in the input
                self.post_message(ReplyFailed(reply_id, error_line(err), ends_reply=True))
                return
            done = stream_reply(generation, reply_id, self.post_message, drafter=drafter, describe=error_line,
                                pace=self.pace, should_stop=lambda: (cancel.is_set() or worker.is_cancelled
                                                     or self._shutting_down.is_set()))
            self._worker_done = (reply_id, done)  # for leaving before ReplyFinished is handled

    def on_reply_progress(self, message: ReplyProgress) -> None:
        if message.reply_id != self._reply_id or self._reply_view is None:
            return
        self.pace.updated()
        self._reply_view.append(message.pieces)
        self.query_one(Dashboard).show_stats(message.stats)
        if not self._cancel.is_set():  # "stopping…" stays
            self._status().activity = MEASURING_ACTIVITY if message.stats.measuring_costs else GENERATING_ACTIVITY

    def on_prompt_progress(self, message: PromptProgress) -> None:
        if message.reply_id != self._reply_id or self._cancel.is_set():
            return
        self._status().activity = (f"reading the prompt… {message.done}/{message.total} tokens "
                                   f"({100 * message.done // max(1, message.total)}%; Esc stops)")

    def on_reply_finished(self, message: ReplyFinished) -> None:
        if message.reply_id != self._reply_id or self._reply_view is None:
            return
        done = message.done
        if done.finish_reason == "cancelled" and not done.text:
            # Stopped before its first word (still reading the prompt): no reply to save. Leaving, the
            # message stays the chat's last turn (--resume offers it again); after Esc it goes back into
            # the input box, as after a failure.
            if self._shutting_down.is_set():
                self._recorded_id = self._reply_id
                return
            self._take_back_turn()
            self._status().error = ""
            self.notify("stopped before the first word; your message is back in the input", timeout=6)
            self._end_reply("ready · stopped")
            return
        self.last_done = done
        self._reply_view.finish(done.finish_reason)
        self.query_one(Dashboard).show_stats(done.stats)
        self._record_reply(done.text, done.finish_reason, stats_summary(done.stats, message.drafter))
        self._end_reply(f"ready · last reply: {done.finish_reason}, {done.stats.tokens} tokens")
        if done.finish_reason == "context":
            self.notify("the context window is full; start a new chat (ctrl+n)", severity="warning")

    def on_reply_failed(self, message: ReplyFailed) -> None:
        if message.reply_id != self._reply_id:
            return
        if not message.ends_reply:  # a ReplyFinished with the partial text follows
            self._error(message.error)
            return
        self._take_back_turn()
        self._error(f"{message.error} (your message is back in the input; ctrl+n starts a new chat)")
        self._end_reply("ready")

    def _take_back_turn(self) -> None:
        """Nothing was generated: the turn is taken back into the input box (and out of the
        history and the next prompt), so it can be sent again, shortened or sent in a new chat."""
        last = self.session.messages[-1] if self.session.messages else None
        if last is not None and last.role == "user":
            self.session.messages.pop()
            self._save()
            prompt = self.query_one("#prompt", MessageBox)
            prompt.value = last.content
        for view in (self._user_view, self._reply_view):
            if view is not None:
                view.remove()

    def _end_reply(self, activity: str) -> None:
        self.reply_running = False
        self._reply_view = self._user_view = None
        self._status().activity = activity
        self.refresh_bindings()

    # --- plain speed baseline ----------------------------------------------
    def action_measure_plain(self) -> None:
        if self.measuring:
            return
        self.measuring = True
        self._status().activity = "measuring plain speed…"
        self._measure_plain()

    @work(thread=True, exclusive=True, group="measure")
    def _measure_plain(self) -> None:
        with self._engine_lock:
            if self._shutting_down.is_set():
                return
            try:
                measure_plain_speed(self.engine, self.post_message, max_tokens=self.plain_tokens,
                                    sampling=self.base_opts.sampling, should_stop=self._shutting_down.is_set)
            except Exception as err:  # the baseline is a nicety: its failure is one line, never the app's end
                self.post_message(PlainSpeedFailed(error_line(err)))

    def on_plain_speed_measured(self, message: PlainSpeedMeasured) -> None:
        self.measuring = False
        self.plain_tok_s = message.tokens_per_second
        self.query_one(Dashboard).plain_tok_s = message.tokens_per_second
        if not self.reply_running:
            self._status().activity = f"ready · plain speed {message.tokens_per_second:.1f} tok/s"

    def on_plain_speed_failed(self, message: PlainSpeedFailed) -> None:
        self.measuring = False
        self._error(f"measuring the plain speed failed: {message.error}")

    # --- keys --------------------------------------------------------------
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if len(self.screen_stack) > 1 and action != "quit":
            return False  # the system prompt editor is open: only its own keys apply
        if action == "stop":
            return True if self.reply_running else None
        if action in ("new_chat", "edit_system"):
            return None if self.reply_running else True
        return True

    def action_stop(self) -> None:
        """Esc: end the reply after the current step; what was generated is kept."""
        if self.reply_running:
            self._cancel.set()
            self._status().activity = "stopping…"

    def action_new_chat(self) -> None:
        if self.reply_running:
            return
        self.session = Session(system=self.session.system, model=self.session.model, draft=self.session.draft)
        self.session_lock.release()
        self.session_lock = SessionLock.acquire(self.session.id, self.history_dir)
        for widget in self._chat().query("UserMessage, ReplyView"):
            widget.remove()
        self.query_one(Dashboard).show_stats(GenerationStats())
        self._status().activity = "ready · new chat"
        self._status().error = ""

    def action_next_drafter(self) -> None:
        i = self.drafter_choices.index(self.drafter)
        self.drafter = self.drafter_choices[(i + 1) % len(self.drafter_choices)]
        self._status().drafter = self.drafter
        dashboard = self.query_one(Dashboard)
        if dashboard.stats.steps == 0:  # otherwise it still describes the last reply's drafter
            dashboard.drafter = self.drafter
        self.notify(f"the next reply uses drafter: {self.drafter}")

    def action_toggle_colours(self) -> None:
        self.colour = not self.colour
        self._status().colour = self.colour
        for view in self.query(ReplyView):
            view.colour = self.colour

    def action_edit_system(self) -> None:
        if self.reply_running:
            return

        def done(text: str | None) -> None:
            if text is None:
                return
            text = self._valid(text, "the system prompt")
            self.session.system = text or None
            self._show_system_note()
            if self.session.messages:
                self._save()
            self.notify("system prompt set" if text else "system prompt cleared")

        self.push_screen(SystemPromptScreen(self.session.system or ""), done)

    # --- leaving -----------------------------------------------------------
    def _exit_on_signal(self, signum: int) -> None:
        # Save before anything touches the terminal: after SIGHUP it may be gone.
        self.exit_signal = signum
        self.wait_for_engine(SIGNAL_WAIT_S)
        self.exit(return_code=128 + signum)

    def keep_before_fatal(self) -> None:
        """The process is about to end on a failure outside the app (a remote device gone mid-reply, which
        ggml reports on its own thread and cannot recover from): save the reply in flight as it stands,
        then give the terminal back. Called from any thread, while the worker is stuck in llama.cpp."""
        self._keep_unfinished_reply()
        driver = self._driver
        if driver is not None:
            driver.stop_application_mode()
            driver.close()  # its writer thread writes what it queued (leaving the alternate screen), then ends

    def on_unmount(self) -> None:
        sys.setswitchinterval(self._switch_interval)
        self.wait_for_engine()
        self.session_lock.release()
        self._exit_signals.release()

    def wait_for_engine(self, timeout_s: float = 60.0) -> bool:
        """Stop any generation, wait until no worker uses the engine (so it can be closed or reused),
        and save the reply in flight as it stands.

        A cancelled generation ends after its current step, so this waits at
        most one step (or one prompt prefill). Returns False on timeout (what
        is on screen is saved then).
        """
        self._shutting_down.set()
        self._cancel.set()
        idle = self._engine_lock.acquire(timeout=timeout_s)
        if idle:
            self._engine_lock.release()
        self._keep_unfinished_reply()
        return idle
