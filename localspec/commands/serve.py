"""``localspec serve``: one loaded model behind an OpenAI-compatible HTTP API (docs/server.md).

The web stack (the ``serve`` extra: Starlette, uvicorn, prometheus-client) is imported only
inside the handler, so that ``localspec --help`` and every other command run without it.
"""

from __future__ import annotations

import argparse
import importlib
import ipaddress
import os
import signal
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from localspec.commands.flags import add_model_options, check_engine_options
from localspec.commands.loading import load_engine
from localspec.commands.refs import resolve_draft_refs, resolve_ref
from localspec.commands.signals import Terminated, stop_on_signals
from localspec.errors import InvalidOptionError, LocalspecError

if TYPE_CHECKING:
    from localspec.models.registry import Resolved
    from localspec.server.app import ServedModel

API_KEY_ENV = "LOCALSPEC_API_KEY"
SERVE_EXTRA = (("starlette", "starlette"), ("uvicorn", "uvicorn"), ("prometheus_client", "prometheus-client"))
"""The serve extra's modules, with the distribution each comes from."""


class MissingExtraError(LocalspecError):
    """An optional extra a command needs is not installed."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="serve a model over an OpenAI-compatible HTTP API",
        description="Load MODEL (default: the embedded SmolLM2-135M) once and answer OpenAI's "
                    "/v1/chat/completions and /v1/completions with exact speculative decoding, one "
                    "request at a time (others wait in a short line). Binds 127.0.0.1 unless told "
                    "otherwise; see docs/server.md.",
    )
    add_model_options(p, model_required=False)
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", metavar="ADDR",
                   help="address to listen on (default 127.0.0.1: this machine only); any other needs "
                        "--api-key or --insecure")
    g.add_argument("--port", type=int, default=8080, metavar="N", help="port (default 8080; 0: any free port)")
    g.add_argument("--api-key", default=None, metavar="KEY",
                   help=f"require 'Authorization: Bearer KEY' on every request but /health (default: "
                        f"${API_KEY_ENV})")
    g.add_argument("--insecure", action="store_true",
                   help="allow a --host beyond this machine without an API key (anyone who reaches it may use it)")
    g.add_argument("--queue", type=int, default=4, metavar="N",
                   help="requests that may wait while one generates (default 4); more get 503 with Retry-After")
    g.add_argument("--quiet", "-q", action="store_true", help="no line per request on stderr")
    s = p.add_argument_group("speculation (the same for every request)")
    s.add_argument("--draft-max", dest="draft_len", type=int, default=None, metavar="G",
                   help="draft exactly up to G tokens per step (0 turns speculation off); by default an adaptive "
                        "controller picks the length each step from measured costs and acceptance")
    s.add_argument("--draft-p-min", dest="p_min", type=float, default=0.0, metavar="P",
                   help="a draft model stops drafting when its own top probability (a DSpark draft's "
                        "confidence head, where it has one) falls below P (default 0)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    check_serve_extra()
    stop_on_signals()
    api_key = resolve_api_key(args.api_key)
    check_exposure(args.host, api_key, insecure=args.insecure)
    if not 0 <= args.port <= 65535:
        raise InvalidOptionError(f"--port {args.port} is out of range: use 1..65535, or 0 for any free port")
    if args.queue < 0:
        raise InvalidOptionError(f"--queue {args.queue} is out of range: use 0 or more")
    check_engine_options(args)
    from localspec.engine import GenerateOptions

    base = GenerateOptions(draft_len=args.draft_len, p_min=args.p_min)
    base.validate()
    # Every name is checked, and the port taken, before anything is downloaded or loaded.
    target_ref = resolve_ref(args.model)
    drafts = resolve_draft_refs(args.draft)
    sock = bind(args.host, args.port)
    try:
        from localspec.commands.generate import context_notice
        from localspec.server.run import serve

        engine, target = load_engine(args, target_ref, drafts)
        try:
            notice = context_notice(args.ctx, engine.n_ctx)
            if notice:
                print(f"localspec: {notice}", file=sys.stderr)
            if engine.drafter_names():
                engine.controller()  # measures (or loads) the costs now, not during the first request
            model = served_model(target_ref, target, n_ctx=engine.n_ctx, drafters=engine.drafter_names())
            ready = (f"localspec: serving {model.id} at {base_url(sock)} (drafters: "
                     f"{', '.join(d for d in model.drafters if ',' not in d) or 'off'}; context {engine.n_ctx} "
                     f"tokens; queue {args.queue}; {'API key required' if api_key else 'no API key'}); Ctrl-C stops")
            stopped_by = serve(engine, sock, model, api_key=api_key, queue=args.queue, base=base,
                               log_requests=not args.quiet, on_ready=lambda: print(ready, file=sys.stderr, flush=True))
            # uvicorn raises the stop signal again once it has shut down, for the handler it found to act;
            # under asyncio's runner that once ended in a normal return (a loaded machine: Ctrl-C exited 0).
            # The exit code says how the server was stopped, whichever way that went.
            if stopped_by == signal.SIGINT:
                raise KeyboardInterrupt
            if stopped_by is not None:
                raise Terminated(stopped_by)
        finally:
            engine.close()
    finally:
        sock.close()
    return 0


def check_serve_extra() -> None:
    """Refuse in one line when the serve extra is missing, naming what to install."""
    missing = []
    for module, dist in SERVE_EXTRA:
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(dist)
    if missing:
        verb = "is" if len(missing) == 1 else "are"
        raise MissingExtraError(f"localspec serve needs {', '.join(missing)}, which {verb} not installed; install "
                                "the serve extra: pip install 'localspec[serve]'")


def resolve_api_key(given: str | None) -> str | None:
    """``--api-key``, else ``$LOCALSPEC_API_KEY``, else None; an empty key is a mistake, not "no key"."""
    key = given if given is not None else os.environ.get(API_KEY_ENV)
    if key is not None and not key.strip():
        source = "--api-key" if given is not None else API_KEY_ENV
        raise InvalidOptionError(f"{source} is empty; give a key, or leave it out to serve this machine only")
    return key


def is_loopback(host: str) -> bool:
    """Whether ``host`` is reachable from this machine only (a name other than localhost counts as not)."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:
        return False


def check_exposure(host: str, api_key: str | None, *, insecure: bool) -> None:
    """Serving beyond this machine takes a key, or the explicit ``--insecure``."""
    if is_loopback(host) or api_key or insecure:
        return
    raise InvalidOptionError(f"--host {host} serves beyond this machine, and without a key anyone who reaches it "
                             f"may use the model; pass --api-key KEY (or set {API_KEY_ENV}), or --insecure to "
                             "serve it open")


def bind(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port``, not yet listening: the port is ours while the model loads, and a
    client that connects before the server is ready is refused at once rather than left hanging."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as err:
        raise InvalidOptionError(f"--host {host} is not an address of this machine ({err.strerror}); "
                                 "use e.g. 127.0.0.1") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as err:
        sock.close()
        raise InvalidOptionError(f"cannot listen on {host}:{port}: {err.strerror or err}; pick another --port "
                                 "(0: any free one) or stop what uses it") from None
    return sock


def base_url(sock: socket.socket) -> str:
    """The API's base URL for clients (``http://127.0.0.1:8080/v1``)."""
    host, port = sock.getsockname()[:2]
    if sock.family == socket.AF_INET6:
        host = f"[{host}]"
    return f"http://{host}:{port}/v1"


def served_model(ref: "Resolved", path: Path, *, n_ctx: int, drafters: list[str]) -> "ServedModel":
    """The id clients see (the registry name, else the file's stem) and the names also accepted
    as ``model``: the registry entry's aliases, the file's name and its stem."""
    from localspec.server.app import ServedModel

    model_id = ref.spec.name if ref.spec is not None else path.stem
    names = [*(ref.spec.aliases if ref.spec is not None else ()), path.name, path.stem]
    aliases = tuple(dict.fromkeys(n for n in names if n.lower() != model_id.lower()))
    return ServedModel(model_id, aliases, n_ctx=n_ctx, drafters=tuple(drafters))
