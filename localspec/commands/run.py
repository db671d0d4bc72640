"""``localspec run``: chat with a model in the terminal, with a live speculation dashboard.

The engine is loaded before the Textual app starts, so a missing or broken
model is a one-line CLI error. The app (``localspec_tui``) is imported only
here, inside the handler: nothing else in ``localspec`` depends on Textual.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, TypeVar

from localspec.commands.flags import (
    add_model_options,
    add_sampling_options,
    check_engine_options,
    generate_options,
)
from localspec.commands.loading import guard_remote_devices, load_settings
from localspec.commands.refs import (
    DraftRefs,
    OFF,
    check_registry_pair,
    drafts_for_itself,
    fetch_models,
    pair_notice,
    reference,
    resolve_draft_refs,
    resolve_ref,
    with_mtp,
)
from localspec.drafting.specs import MODEL_FREE, DrafterSpec
from localspec.errors import InvalidOptionError, LocalspecError
from localspec.history import Session, SessionLock, latest_session, load_session
from localspec.models.registry import Resolved

if TYPE_CHECKING:
    from localspec.engine import GenerateOptions

T = TypeVar("T")
LATEST = "latest"
"""What ``--resume`` without an id means."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        help="chat with a model in the terminal, with a live speculation dashboard",
        description="Chat with MODEL (default: the bundled SmolLM2-135M) in a terminal app that shows "
                    "acceptance, tokens per step and the speedup over plain decoding as the reply streams. "
                    "Every turn is saved; --resume continues a saved chat.",
    )
    add_model_options(p, model_required=False)
    p.add_argument("--system", default=None, metavar="TEXT",
                   help="system prompt (editable in the app with ctrl+s)")
    p.add_argument("--resume", nargs="?", const=LATEST, default=None, metavar="SESSION_ID",
                   help="continue a saved chat: the latest one, or SESSION_ID (write --resume after MODEL, "
                        "or as --resume=ID); without MODEL and --draft, on the models it was held with")
    add_sampling_options(p)
    p.set_defaults(func=run)


DEFAULT_DRAFTERS = "ngram"
"""What `run` drafts with when --draft is not given: model-free, so it suits any model (a model with
MTP layers drafts with them first: ``mtp,ngram``)."""


@dataclass(frozen=True)
class Choice:
    """The models `run` chats with, resolved through the registry but not yet downloaded."""

    target: Resolved
    drafts: DraftRefs


def choose_models(model: str | None, draft: str | None, session: Session | None = None) -> Choice:
    """Resolve MODEL and --draft (every name, before any download), falling back to a resumed chat's.

    MODEL omitted: the session's model when resuming, else the registry's default (SmolLM2-135M,
    carried by a PyPI package). --draft omitted: the session's drafters when the chat continues on
    its own model, else ``ngram``; ``--draft off`` means none. A MODEL other than the session's
    is said in one line on stderr.
    """
    if session is not None and model is None and session.model is not None:
        saved_model = session.model
        target = _resolve_saved(session, "model", lambda: resolve_ref(saved_model))
    else:
        target = resolve_ref(model)
    same_model = session is not None and session.model == reference(target)
    if session is not None and model is not None and session.model and not same_model:
        print(f"localspec: session {session.id} was held with {session.model}; the chat continues on "
              f"{reference(target)}", file=sys.stderr)
    if draft is None and same_model and session is not None and session.draft:
        saved_draft = session.draft
        drafts = _resolve_saved(session, "draft", lambda: _draft_refs(saved_draft))
    else:
        drafts = _draft_refs(draft if draft is not None else DEFAULT_DRAFTERS)
    check_registry_pair(target, drafts.model)
    return Choice(target, drafts)


def _draft_refs(text: str | None) -> DraftRefs:
    if text is not None and text.strip().lower() in (OFF, "none"):
        return DraftRefs(None, [])
    return resolve_draft_refs(text)


def _resolve_saved(session: Session, what: str, resolve: Callable[[], T]) -> T:
    """``resolve()`` for a name saved in ``session``; a name that no longer resolves is one clear error."""
    try:
        return resolve()
    except LocalspecError:
        saved = getattr(session, what)
        flag = "MODEL" if what == "model" else "--draft"
        raise InvalidOptionError(
            f"--resume: session {session.id} was held with {what} {saved!r}, which is neither a name from "
            f"`localspec models` nor a file here; pass {flag} to continue the chat with another one") from None


def resolve_models(model: str | None, draft: str | None, *,
                   offline: bool = False) -> tuple[Path, Path | None, list[DrafterSpec]]:
    """The target path, the draft model path (or None) and the model-free drafter specs.

    Every name is resolved before anything is downloaded (``choose_models``).
    """
    choice = choose_models(model, draft)
    target, draft = fetch_models(choice.target, choice.drafts.model, offline=offline)
    return target, draft, choice.drafts.specs


def switchable_drafters(drafts: DraftRefs, opts: GenerateOptions) -> tuple[list[DrafterSpec], GenerateOptions]:
    """The model-free specs to load for the app, and ``opts`` naming the drafters the user chose.

    The app's drafter switch (ctrl+o) offers every drafter the engine holds, so the model-free
    ones that cost nothing until used (ngram, lookahead) are loaded beside what ``--draft`` named;
    the first reply uses exactly what ``--draft`` named. ``--draft off`` loads none.
    """
    chosen = (["draft"] if drafts.model is not None else []) + [s.name for s in drafts.specs]
    if not chosen:
        return [], opts
    have = {s.kind for s in drafts.specs}
    extra = [DrafterSpec(kind) for kind in MODEL_FREE if kind not in have]
    return [*drafts.specs, *extra], dataclasses.replace(opts, drafter=",".join(chosen))


def needs_terminal() -> None:
    """The app draws on a terminal and reads keys from it: say so in one line instead of writing escape
    codes into a pipe or file (``localspec run </dev/null >/dev/null`` would run until killed)."""
    missing = [name for name, stream in (("input", sys.stdin), ("output", sys.stdout))
               if stream is None or not stream.isatty()]
    if missing:
        raise InvalidOptionError(
            f"localspec run is a chat app and needs a terminal (its {' and '.join(missing)} is not one); "
            "use `localspec generate -p TEXT` for a reply in a pipe or script"
        )


def run(args: argparse.Namespace) -> int:
    check_engine_options(args)
    opts = generate_options(args)
    if args.model is None and args.resume not in (None, LATEST) and args.resume.endswith(".gguf"):
        # `run --resume model.gguf`: argparse gave MODEL to the optional id; the user meant both.
        args.model, args.resume = args.resume, LATEST
    session = None
    if args.resume is not None:
        session = latest_session() if args.resume == LATEST else load_session(args.resume)
        if session is None:
            raise InvalidOptionError("--resume: there is no saved chat yet; run without --resume to start one")
    # Held until the app ends, so a second app on the same chat is refused before it loads anything.
    session = session or Session()
    lock = SessionLock.acquire(session.id)
    try:
        return _run_app(args, opts, session, lock, resumed=args.resume is not None)
    finally:
        lock.release()


def _run_app(args: argparse.Namespace, opts: "GenerateOptions", session: Session, lock: SessionLock, *,
             resumed: bool) -> int:
    choice = choose_models(args.model, args.draft, session if resumed else None)
    # After the names are checked (a misspelling is the first thing to hear), before any download or load.
    needs_terminal()
    target, draft = fetch_models(choice.target, choice.drafts.model, offline=args.offline)
    if args.draft is None and (not resumed or not session.draft) and drafts_for_itself(target):
        choice = dataclasses.replace(choice, drafts=with_mtp(choice.drafts))
    settings = load_settings(args, target, draft)
    app = None

    def last_words(line: str) -> str:
        # A remote device went away mid-reply: the process ends now, with the chat saved first.
        if app is None:
            return line
        app.keep_before_fatal()
        if app.unsaved_error is not None or not app.session.messages:
            return line
        return f"{line}; the chat is saved as session {app.session.id} (`localspec run --resume` continues it)"

    guard_remote_devices(args, last_words)

    from localspec.engine import Engine

    specs, opts = switchable_drafters(choice.drafts, opts)
    engine = Engine.load(target, draft, specs=specs, n_ctx=settings.n_ctx, n_threads=args.threads,
                         n_gpu_layers=settings.n_gpu_layers, draft_n_gpu_layers=settings.draft_n_gpu_layers,
                         split=settings.split, draft_split=settings.draft_split)
    if notice := pair_notice(engine, choice.target, choice.drafts.model):
        print(f"localspec: {notice}", file=sys.stderr)
    # The first reply starts at once, plain, while costs are measured (a fixed --draft-max drafts from the
    # first step, which needs the costs first).
    engine.measure_in_background = opts.draft_len is None
    # Saved with the chat, so that `--resume` alone brings back these models.
    session.model, session.draft = reference(choice.target), choice.drafts.text()
    try:
        # A model without a usable chat template cannot chat: say so before the app starts.
        engine.chat_tokens([{"role": "user", "content": "hello"}])
        from localspec_tui.app import LocalspecApp

        app = LocalspecApp(engine, opts, session=session, system=args.system, placement=settings,
                           session_lock=lock)
        app.run()
    finally:
        if app is not None:
            # The app stopped its worker on exit (and saved the reply in flight); however it ended,
            # wait for the worker before freeing the models under it.
            app.wait_for_engine()
        engine.close()
    say_how_it_ended(app.session, exit_signal=app.exit_signal, unsaved_error=app.unsaved_error)
    return app.return_code or 0


def say_how_it_ended(session: Session, *, exit_signal: int | None, unsaved_error: str | None) -> None:
    """One line on stderr after the app when the chat was not saved, or when a signal ended it
    (where it was saved). Nothing for a plain ctrl+q. After SIGHUP there may be no terminal to write to."""
    if unsaved_error is not None:
        line = f"localspec: warning: {unsaved_error}; the chat's last change is not on disk"
    elif exit_signal is not None and session.messages:
        line = (f"localspec: stopped by {signal.Signals(exit_signal).name}; the chat is saved as session "
                f"{session.id} (`localspec run --resume` continues it)")
    else:
        return
    with contextlib.suppress(OSError, ValueError):
        print(line, file=sys.stderr, flush=True)
