"""``localspec run``: chat with a model in the terminal, with a live speculation dashboard.

The engine is loaded before the Textual app starts, so a missing or broken
model is a one-line CLI error. The app (``localspec_tui``) is imported only
here, inside the handler: nothing else in ``localspec`` depends on Textual.
"""

from __future__ import annotations

import argparse

from localspec.commands.common import (
    add_model_options,
    add_sampling_options,
    check_engine_options,
    generate_options,
    resolve_drafters,
    resolve_model,
)
from localspec.errors import InvalidOptionError
from localspec.history import latest_session, load_session

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
                   help="continue a saved chat: the latest one, or SESSION_ID "
                        "(write --resume after MODEL, or as --resume=ID)")
    add_sampling_options(p)
    p.set_defaults(func=run)


DEFAULT_DRAFTERS = "ngram"
"""What `run` drafts with when --draft is not given: model-free, so it suits any model."""


def resolve_models(model: str | None, draft: str | None, *, offline: bool = False):
    """The target path, the draft model path (or None) and the model-free drafter specs.

    MODEL omitted means the registry's default (SmolLM2-135M, carried by a PyPI
    package). --draft omitted means ``ngram``; ``--draft off`` means none.
    """
    target = resolve_model(model, offline=offline)
    if draft is not None and draft.strip().lower() in ("off", "none"):
        return target, None, []
    draft_path, specs = resolve_drafters(draft if draft is not None else DEFAULT_DRAFTERS, offline=offline)
    return target, draft_path, specs


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
    target, draft, specs = resolve_models(args.model, args.draft, offline=args.offline)

    from localspec.engine import Engine

    engine = Engine.load(target, draft, specs=specs, n_ctx=args.ctx, n_threads=args.threads,
                         n_gpu_layers=args.gpu_layers, draft_n_gpu_layers=args.gpu_layers)
    try:
        # A model without a usable chat template cannot chat: say so before the app starts.
        engine.chat_tokens([{"role": "user", "content": "hello"}])
        from localspec_tui.app import LocalspecApp

        app = LocalspecApp(engine, opts, session=session, system=args.system)
        app.run()
        # The app stopped its worker on exit; wait for it before freeing the models under it.
        app.wait_for_engine()
    finally:
        engine.close()
    return app.return_code or 0
