"""The Starlette app: OpenAI's routes over one ``EngineSlot`` (the responses they stream are
``stream``'s, the key gate and request log ``middleware``'s).

``POST /v1/chat/completions`` and ``POST /v1/completions`` (streamed as server-sent events or
whole), ``GET /v1/models``, ``GET /health`` and ``GET /metrics``. Every failure is answered in
OpenAI's error shape with its status and logged in one line; no traceback reaches a client or the
console. No route reads or writes a file a request names.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, AsyncIterator, Awaitable, Callable

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request as HttpRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp

from localspec.errors import InvalidOptionError, LocalspecError, shown
from localspec.server import responses
from localspec.server.metrics import CONTENT_TYPE, ServerMetrics
from localspec.server.middleware import CLIENT_CLOSED, CLIENT_LEFT, KeyGate, RequestLog, error_response
from localspec.server.schema import Request, RequestError, matches_model, parse_chat, parse_completion
from localspec.server.slot import Busy, EngineSlot
from localspec.server.stream import ClientGone, EventStream, stream_chunks, whole_reply
from localspec.tools import ToolCallReader, tool_format, tools_grammar

if TYPE_CHECKING:
    from localspec.engine import Engine, GenerateOptions
    from localspec.generation import Generation

log = logging.getLogger("localspec.server")

MAX_BODY_BYTES = 4 * 1024 * 1024
"""The largest request body read (413 past it): far more text than any context here holds."""
RETRY_AFTER_S = 1
"""What a 503 tells a client to wait: about one short reply's time on a small model."""


@dataclass(frozen=True)
class ServedModel:
    """The model the server answers as: ``id`` in /v1/models, ``aliases`` also accepted as ``model``."""

    id: str
    aliases: tuple[str, ...] = ()
    n_ctx: int = 0
    drafters: tuple[str, ...] = ()
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def names(self) -> tuple[str, ...]:
        return (self.id, *self.aliases)

    def meta(self) -> dict[str, Any]:
        return {"n_ctx": self.n_ctx, "drafters": list(self.drafters), "aliases": list(self.aliases)}


def create_app(slot: EngineSlot, metrics: ServerMetrics, model: ServedModel, *, api_key: str | None = None,
               base: "GenerateOptions | None" = None, max_body: int = MAX_BODY_BYTES) -> ASGIApp:
    """The ASGI app: the routes behind the request log and, with ``api_key``, the key check.

    ``base`` holds the server's settings for what a request does not choose (the draft length,
    the draft's p_min); each request's own fields replace the rest.
    """
    routes = _Routes(slot, metrics, model, max_body, base)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        slot.stop()  # a generation still running stops within one step; waiting requests get 503

    app = Starlette(
        routes=[
            Route("/health", routes.health, methods=["GET"]),
            Route("/metrics", routes.metrics, methods=["GET"]),
            Route("/v1/models", routes.models, methods=["GET"]),
            Route("/v1/models/{model_id:path}", routes.model, methods=["GET"]),
            Route("/v1/chat/completions", routes.chat, methods=["POST"]),
            Route("/v1/completions", routes.completions, methods=["POST"]),
        ],
        exception_handlers={HTTPException: _http_error},  # type: ignore[dict-item]
        lifespan=lifespan,
    )
    app.router.redirect_slashes = False  # RequestLog serves a known path's trailing slash; others are 404
    gated: ASGIApp = KeyGate(app, api_key) if api_key else app
    return RequestLog(gated, metrics)


# --- routes -----------------------------------------------------------------------------------
Endpoint = Callable[[Any, HttpRequest], Awaitable[Response]]


def _answers_errors(endpoint: Endpoint) -> Endpoint:
    """Every failure of a route as an OpenAI error body: the user's with its status, ours as a 500
    logged in one line (no traceback: the message says what happened)."""

    @functools.wraps(endpoint)
    async def wrapped(self: Any, request: HttpRequest) -> Response:
        try:
            return await endpoint(self, request)
        except RequestError as err:
            return error_response(err)
        except (ClientDisconnect, ClientGone):  # it left (while sending its body, or waiting): nobody hears this
            request.scope[CLIENT_LEFT] = True
            return Response(status_code=CLIENT_CLOSED)
        except Busy as err:
            return error_response(RequestError(str(err), status=503, code="server_busy", kind="server_error"),
                                  headers={"Retry-After": str(RETRY_AFTER_S)})
        except InvalidOptionError as err:  # the core's own check; its parameter names are the API's fields
            return error_response(RequestError(str(err), param=err.param, code="invalid_value"))
        except LocalspecError as err:  # the engine refused the request (a chat template, a drafter)
            return error_response(RequestError(str(err)))
        except Exception as err:
            log.error("%s %s failed: %s: %s", request.method, request.url.path, type(err).__name__, err)
            return error_response(RequestError(f"internal error: {type(err).__name__}: {err}", status=500,
                                               kind="server_error"))

    return wrapped


class _Routes:
    """The endpoints, each answering its own errors."""

    def __init__(self, slot: EngineSlot, metrics: ServerMetrics, model: ServedModel, max_body: int,
                 base: "GenerateOptions | None") -> None:
        self._slot = slot
        self._base = base
        self._metrics = metrics
        self._model = model
        self._max_body = max_body

    @_answers_errors
    async def health(self, request: HttpRequest) -> Response:
        return JSONResponse({"status": "ok"})

    @_answers_errors
    async def metrics(self, request: HttpRequest) -> Response:
        return Response(self._metrics.render(), media_type=CONTENT_TYPE)

    @_answers_errors
    async def models(self, request: HttpRequest) -> Response:
        m = self._model
        return JSONResponse(responses.models_list(m.id, m.created, m.meta()))

    @_answers_errors
    async def model(self, request: HttpRequest) -> Response:
        m = self._model
        self._check_model(request.path_params["model_id"])
        return JSONResponse(responses.model_entry(m.id, m.created, m.meta()))

    @_answers_errors
    async def chat(self, request: HttpRequest) -> Response:
        parsed = parse_chat(await read_json(request, self._max_body), drafters=self._model.drafters)
        return await self._generate(parsed, request)

    @_answers_errors
    async def completions(self, request: HttpRequest) -> Response:
        parsed = parse_completion(await read_json(request, self._max_body), drafters=self._model.drafters)
        return await self._generate(parsed, request)

    def _check_model(self, name: str | None) -> None:
        if not matches_model(name, self._model.names):
            quoted = [shown(a, quote=chr(34)) for a in self._model.aliases]
            raise RequestError(f"unknown model {shown(name or '', quote=chr(34))}; this server serves "
                               f"{shown(self._model.id, quote=chr(34))} (also accepted: {', '.join(quoted) or 'none'})",
                               status=404, param="model", code="model_not_found")

    async def _generate(self, parsed: Request, request: HttpRequest) -> Response:
        self._check_model(parsed.model)
        reply = responses.Reply.new(parsed.endpoint, self._model.id)
        run = await self._slot.open(prepare_for(parsed, self._base, self._model.id))
        drafter = drafter_label(parsed, self._model.drafters)
        reader = tool_reader(parsed, run.generation.engine.target.chat_template())
        if parsed.stream:
            return EventStream(stream_chunks(run, parsed, reply, drafter, reader), on_disconnect=run.cancel,
                               on_close=run.close)
        return await whole_reply(run, reply, drafter, request.receive, reader)


def prepare_for(parsed: Request, base: "GenerateOptions | None" = None,
                served_as: str | None = None) -> Callable[["Engine"], "Generation"]:
    """The work done on the engine's thread before a generation starts: the prompt's tokens (the
    model's own chat template for a chat, with the tools offered), the check that it fits, the options
    (``base`` with the request's own fields, and the grammar a forced tool choice needs). ``served_as``:
    the model's name in errors (the served id; None: the GGUF's own name)."""

    def prepare(engine: "Engine") -> "Generation":
        from localspec.engine import GenerateOptions

        chat = parsed.endpoint == "chat"
        grammar = tool_grammar(parsed, engine.target.chat_template(), served_as or engine.target.name)
        tools = [t.as_openai() for t in parsed.tools] if parsed.calls_tools else None
        tokens = engine.chat_tokens(parsed.messages, tools=tools) if chat else engine.tokenize(parsed.prompt)
        if len(tokens) >= engine.n_ctx:
            raise RequestError(
                f"the prompt is {len(tokens)} tokens but the context holds {engine.n_ctx}, and at least one "
                f"must be left to generate; shorten the {'messages' if chat else 'prompt'} or start the server "
                "with a larger --ctx", param="messages" if chat else "prompt", code="context_length_exceeded")
        room = engine.n_ctx - len(tokens)  # no max_tokens: until a stop or the end of the context, as OpenAI does
        opts = dataclasses.replace(base or GenerateOptions(), max_tokens=parsed.max_tokens or room,
                                   sampling=parsed.sampling, stop=parsed.stop, speculative=parsed.speculative,
                                   drafter=parsed.drafter, grammar=grammar or parsed.grammar,
                                   json_schema=parsed.json_schema,
                                   logprobs=parsed.logprobs, penalties=parsed.penalties)
        try:
            return engine.generate(tokens, opts)
        except InvalidOptionError as err:
            if err.param in ("grammar", "json_schema") and grammar is not None:
                raise unenforceable(err) from None
            if err.param in ("grammar", "json_schema") and parsed.constraint_param:
                raise RequestError(err.named(parsed.constraint_param), param=parsed.constraint_param,
                                   code="invalid_value") from None
            raise

    return prepare


def tool_grammar(parsed: Request, template: str | None, model_name: str) -> str | None:
    """The grammar that enforces ``parsed.tool_choice`` (required, or a named function) in the call syntax
    of the model's template; None when nothing is forced. A request offering tools to a model whose
    template renders none is refused (400), whatever the choice but none."""
    if not parsed.calls_tools:
        return None
    fmt = tool_format(template)
    if fmt is None:
        raise RequestError(f"model {shown(model_name, quote=chr(34))}'s chat template has no tool format, so it "
                           "cannot be offered tools; send the request without tools (or tool_choice none), or "
                           "serve a model whose template renders tools (Qwen2.5, Qwen3, Llama 3.1 and later)",
                           param="tools", code="unsupported_value")
    forced = parsed.forced_tools
    if not forced:
        return None
    try:
        return tools_grammar(fmt, forced, parallel=parsed.parallel_tool_calls and parsed.tool_choice == "required")
    except InvalidOptionError as err:
        raise unenforceable(err) from None


def unenforceable(err: InvalidOptionError) -> RequestError:
    """The 400 for tools whose calls no grammar can force (a ``parameters`` schema the converter cannot
    express, or a grammar llama.cpp cannot compile)."""
    return RequestError(f"tools: a function's parameters cannot be enforced: {err}", param="tools",
                        code="invalid_value")


def tool_reader(parsed: Request, template: str | None) -> ToolCallReader | None:
    """What reads the calls out of the reply when tools were offered (None: the text is the reply)."""
    fmt = tool_format(template) if parsed.calls_tools else None
    return ToolCallReader(fmt, [t.name for t in parsed.tools]) if fmt is not None else None


def drafter_label(parsed: Request, drafters: tuple[str, ...]) -> str:
    """What the request drafts with, as ``speculative.drafter`` reports it."""
    if not parsed.speculative or not drafters:
        return "off"
    return parsed.drafter or drafters[0]  # the first name is every drafter combined (Engine.drafter_names)


# --- request bodies and errors ----------------------------------------------------------------
async def read_json(request: HttpRequest, limit: int) -> Any:
    """The body as JSON: 413 past ``limit`` bytes (before reading it, when Content-Length says so),
    400 when it is not JSON (NaN and Infinity included: JSON has neither)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _too_large(int(declared), limit)
    data = bytearray()
    async for piece in request.stream():
        data += piece
        if len(data) > limit:
            raise _too_large(len(data), limit)
    if not data:
        raise RequestError("the request body is empty; send a JSON object", code="invalid_json")
    try:
        return json.loads(data, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as err:
        raise RequestError(f"the request body is not valid JSON: {err}", code="invalid_json") from None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _too_large(size: int, limit: int) -> RequestError:
    return RequestError(f"the request body is {size:,} bytes or more; at most {limit:,} are read", status=413,
                        code="request_too_large")


async def _http_error(request: HttpRequest, exc: HTTPException) -> Response:
    """Starlette's own refusals (no such route, wrong method) in OpenAI's error shape."""
    what = {404: f"no route {request.url.path}; see docs/server.md for the endpoints",
            405: f"{request.method} is not allowed on {request.url.path}"}.get(exc.status_code, str(exc.detail))
    return error_response(RequestError(what, status=exc.status_code, code="not_found" if exc.status_code == 404
                                       else "method_not_allowed"), headers=exc.headers)
