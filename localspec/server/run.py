"""Running the app under uvicorn on a socket the caller bound, with one-line logging."""

from __future__ import annotations

import logging
import socket
import sys
from types import FrameType
from typing import TYPE_CHECKING, Callable

import uvicorn

from localspec.server.app import ServedModel, create_app
from localspec.server.metrics import ServerMetrics
from localspec.server.slot import EngineSlot

if TYPE_CHECKING:
    from localspec.engine import Engine, GenerateOptions

GRACE_S = 5
"""How long a stop waits for open responses (each generation is cancelled first, so it is short)."""


class OneLine(logging.Formatter):
    """``localspec: message`` on one line: an exception is named after the message, never traced."""

    def __init__(self) -> None:
        super().__init__("localspec: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        error = record.exc_info[1] if record.exc_info else None
        plain = logging.makeLogRecord({**record.__dict__, "exc_info": None, "exc_text": None, "stack_info": None})
        line = super().format(plain)
        return f"{line} ({type(error).__name__}: {error})" if error is not None else line


def configure_logging(*, requests: bool = True) -> None:
    """Our request lines at INFO (``requests``), uvicorn's own only from WARNING, all to stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(OneLine())
    for name, level in (("localspec.server", logging.INFO if requests else logging.WARNING),
                        ("uvicorn", logging.WARNING), ("uvicorn.error", logging.WARNING)):
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.setLevel(level)
        logger.propagate = False


class _Server(uvicorn.Server):
    """uvicorn's server, but a stop signal first cancels the running generation (within one step),
    so that the grace period is not spent generating a reply nobody will read to its end."""

    def __init__(self, config: uvicorn.Config, slot: EngineSlot, on_ready: Callable[[], None]) -> None:
        super().__init__(config)
        self.slot = slot
        self.on_ready = on_ready
        self.stopped_by: int | None = None  # the first stop signal

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            self.on_ready()  # listening now: a client told so may connect at once

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.stopped_by is None:
            self.stopped_by = sig
        self.slot.stop()
        super().handle_exit(sig, frame)


def serve(engine: "Engine", sock: socket.socket, model: ServedModel, *, api_key: str | None = None,
          queue: int = 4, base: "GenerateOptions | None" = None, log_requests: bool = True,
          on_ready: Callable[[], None] = lambda: None) -> int | None:
    """Serve ``engine`` on the bound ``sock`` until a stop signal, and return that signal (None: it
    stopped otherwise); the engine stays the caller's.

    ``base``: the server's settings for what requests do not choose (``create_app``); ``on_ready``
    is called once the socket listens.
    """
    configure_logging(requests=log_requests)
    metrics = ServerMetrics()
    slot = EngineSlot(engine, queue=queue, observe=metrics.observe)
    metrics.track(lambda: slot.waiting, lambda: slot.generating)
    app = create_app(slot, metrics, model, api_key=api_key, base=base)
    config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="on",
                            timeout_graceful_shutdown=GRACE_S)
    server = _Server(config, slot, on_ready)
    try:
        server.run(sockets=[sock])
    finally:
        slot.shutdown()  # the worker thread is done with the engine before the caller closes it
    return server.stopped_by
