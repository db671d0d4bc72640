"""The ASGI middleware around the routes: the API-key gate and the request log, and the error
response both they and the routes answer with."""

from __future__ import annotations

import hmac
import logging
import time

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from localspec.server.metrics import ServerMetrics
from localspec.server.schema import RequestError

log = logging.getLogger("localspec.server")

PUBLIC_PATHS = ("/health",)
"""Paths answered without the API key (a liveness probe learns nothing but "ok")."""


def error_response(err: RequestError, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=headers)


class KeyGate:
    """Refuse (401) every request without ``Authorization: Bearer KEY``, but PUBLIC_PATHS."""

    def __init__(self, app: ASGIApp, key: str) -> None:
        self.app = app
        self.expected = key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in PUBLIC_PATHS:
            given = bearer_token(dict(scope["headers"]).get(b"authorization", b""))
            if not hmac.compare_digest(given, self.expected):  # in constant time: no key guessed by timing
                err = RequestError("missing or wrong API key; send the header Authorization: Bearer KEY",
                                   status=401, code="invalid_api_key")
                response = error_response(err, headers={"WWW-Authenticate": "Bearer"})
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def bearer_token(header: bytes) -> bytes:
    """The token of an ``Authorization: Bearer TOKEN`` header (b"" for another scheme): the scheme in any
    case and the spaces around the token as a client sends them (RFC 7235)."""
    parts = header.split(None, 1)
    return parts[1].strip() if len(parts) == 2 and parts[0].lower() == b"bearer" else b""


KNOWN_PATHS = ("/health", "/metrics", "/v1/models", "/v1/chat/completions", "/v1/completions")
CLIENT_LEFT = "localspec.client_left"
"""Set in the request's scope when its client hung up before the reply was whole: such a request is
counted and logged as 499 (nginx's "client closed request"), not as the status its answer started with."""
CLIENT_CLOSED = 499


class RequestLog:
    """One log line and one count per request (a streamed one when its stream ends)."""

    def __init__(self, app: ASGIApp, metrics: ServerMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500
        path = scope["path"]
        if path != "/" and path.endswith("/") and path.rstrip("/") in KNOWN_PATHS:
            # A trailing slash (POST /v1/chat/completions/) is the same route: a redirect would not
            # be followed with its body by every client.
            path = path.rstrip("/")
            scope = {**scope, "path": path, "raw_path": path.encode()}

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            if scope.get(CLIENT_LEFT):
                status = CLIENT_CLOSED
            # Paths a client made up are counted together: a label per path would grow without end.
            endpoint = path if path in KNOWN_PATHS else "/v1/models/*" if path.startswith("/v1/models/") else "other"
            self.metrics.count_request(endpoint, status)
            log.info("%s %s %d %.0f ms", scope["method"], path, status, (time.perf_counter() - start) * 1e3)
