"""A generation's events as an HTTP response: a whole JSON body, or server-sent events.

Either way the client leaving cancels the generation (within one step), and the engine is
released once its worker thread is done (``slot.Run``).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, AsyncIterator, Callable

from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from localspec.chat import ToolCall
from localspec.events import DoneEvent, StepEvent, TokenEvent, TokenLogprob
from localspec.server import responses
from localspec.server.middleware import CLIENT_LEFT
from localspec.server.schema import Request, RequestError
from localspec.server.slot import Busy, Run
from localspec.tools import Content, ToolCallReader

log = logging.getLogger("localspec.server")


class ClientGone(Exception):
    """The client hung up before its whole reply was ready (the generation was cancelled for it)."""


async def whole_reply(run: Run, reply: responses.Reply, drafter: str, receive: Receive,
                      reader: ToolCallReader | None = None) -> Response:
    """A non-streamed reply; the client leaving before it is ready cancels the generation too. With
    ``reader`` (tools offered), the calls in the reply come back as ``message.tool_calls``."""
    async with run:
        watch = asyncio.ensure_future(wait_for_disconnect(receive))
        watch.add_done_callback(lambda task: task.cancelled() or run.cancel())
        done: DoneEvent | None = None
        lps: list[TokenLogprob] = []
        try:
            async for event in run.events():
                if isinstance(event, TokenEvent):
                    if event.logprob is not None:
                        lps.append(event.logprob)
                elif isinstance(event, DoneEvent):
                    done = event
        finally:
            watch.cancel()
    assert done is not None, "a generation always ends with a DoneEvent"
    if done.finish_reason == "cancelled":  # the client is gone, or the server is stopping
        if watch.done() and not watch.cancelled():
            raise ClientGone()
        raise Busy("the server is stopping")
    cached = run.generation.cached_tokens
    asked = run.generation.opts.logprobs is not None
    token_logprobs = responses.logprobs(reply.endpoint, lps, run.generation.engine.target.piece) if asked else None
    content, calls = reader.whole(done.text) if reader is not None else (done.text, [])
    return JSONResponse(responses.body(reply, content, responses.finish_reason(done.finish_reason, bool(calls)),
                                       done.stats, cached, drafter, token_logprobs, calls))


async def stream_chunks(run: Run, parsed: Request, reply: responses.Reply, drafter: str,
                        reader: ToolCallReader | None = None) -> AsyncIterator[bytes]:
    """The reply as server-sent events: one text chunk per speculative step (the tokens it accepted
    together), the finish chunk with ``timings`` and ``speculative``, the usage chunk when asked, then
    ``[DONE]``. A generation that fails midway ends the stream with an error event. With ``reader``
    (tools offered), text that may begin a call is held back, and each call is sent as ``delta.tool_calls``
    (id and name, then arguments) when it is complete."""
    async with run:
        if reply.endpoint == "chat":
            yield sse(responses.chunk(reply, "", first=True))
        pending: list[str] = []
        lps: list[TokenLogprob] = []  # the pending tokens' log-probabilities, when asked for
        piece = run.generation.engine.target.piece
        offset = 0  # where the pending text starts in the reply (a completion's text_offset)
        done: DoneEvent | None = None
        try:
            async for event in run.events():
                if isinstance(event, TokenEvent):
                    if event.text:
                        pending.append(event.text)
                    if event.logprob is not None:
                        lps.append(event.logprob)
                elif (pending or lps) and isinstance(event, (StepEvent, DoneEvent)):
                    text = "".join(pending)
                    if reader is None:
                        token_logprobs = responses.logprobs(reply.endpoint, lps, piece, offset) if lps else None
                        yield sse(responses.chunk(reply, text, token_logprobs=token_logprobs))
                        offset += len(text)
                        lps.clear()
                    else:
                        for payload in _reader_chunks(reply, reader, reader.feed(text), lps, piece):
                            yield sse(payload)
                    pending.clear()
                if isinstance(event, DoneEvent):
                    done = event
                    if reader is not None:
                        for payload in _reader_chunks(reply, reader, reader.finish(), lps, piece):
                            yield sse(payload)
        except Exception as err:
            log.error("a streamed generation failed: %s: %s", type(err).__name__, err)
            failure = RequestError(f"the generation failed: {type(err).__name__}: {err}", status=500,
                                   kind="server_error")
            yield sse(failure.body())
            yield DONE
            return
        assert done is not None, "a generation always ends with a DoneEvent"
        if done.finish_reason == "cancelled":  # nobody is listening, or the server is stopping
            yield sse(RequestError("the server is stopping; the reply was cut short", status=503,
                                   code="server_stopping", kind="server_error").body())
            yield DONE
            return
        cached = run.generation.cached_tokens
        extras = responses.extras(done.stats, cached, drafter)
        final = responses.chunk(reply, None, finish_reason=responses.finish_reason(done.finish_reason,
                                                                               bool(reader and reader.calls)))
        yield sse({**final, **extras})
        if parsed.include_usage:
            yield sse({**responses.usage_chunk(reply, done.stats, cached), **extras})
        yield DONE


def _reader_chunks(reply: responses.Reply, reader: ToolCallReader, items: list[Content | ToolCall],
                   lps: list[TokenLogprob], piece: Callable[[int], bytes]) -> list[dict[str, Any]]:
    """The chunks for what ``reader`` just gave out: content text, and each whole call as two deltas
    (numbered on from the calls before it). The first chunk carries the pending tokens' ``lps``, which are
    then cleared; with no chunk they wait for the next."""
    out: list[dict[str, Any]] = []
    index = reader.calls - sum(isinstance(item, ToolCall) for item in items)
    for item in items:
        token_logprobs = responses.logprobs(reply.endpoint, lps, piece) if lps and not out else None
        if isinstance(item, Content):
            out.append(responses.chunk(reply, item.text, token_logprobs=token_logprobs))
            continue
        first, rest = responses.call_deltas(item, index)
        index += 1
        out.append(responses.chunk(reply, None, tool_calls=[first], token_logprobs=token_logprobs))
        out.append(responses.chunk(reply, None, tool_calls=[rest]))
    if out:
        lps.clear()
    return out


DONE = b"data: [DONE]\n\n"


def sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, ensure_ascii=False).encode("utf-8") + b"\n\n"


class EventStream(Response):
    """A ``text/event-stream`` response that calls ``on_disconnect`` the moment its client leaves,
    and ``on_close`` when it is over however it ended (even if ``chunks`` never started).

    Starlette's StreamingResponse notices a departure only on some servers' ASGI versions; a
    generation must stop within one step whatever the server, so this watches ``receive`` itself.
    """

    media_type = "text/event-stream"

    def __init__(self, chunks: AsyncIterator[bytes], *, on_disconnect: Callable[[], None],
                 on_close: Callable[[], None]) -> None:
        self.chunks = chunks
        self.on_disconnect = on_disconnect
        self.on_close = on_close
        self.status_code = 200
        self.background = None
        self.init_headers({"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        watch = asyncio.ensure_future(wait_for_disconnect(receive))
        watch.add_done_callback(lambda task: task.cancelled() or self.on_disconnect())
        whole = refused = False
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            async for data in self.chunks:
                if watch.done():
                    break  # the client left: the generation is cancelled, nothing more is sent
                await send({"type": "http.response.body", "body": data, "more_body": True})
            else:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                whole = True
        except OSError:  # servers of ASGI 2.4 raise on a send to a closed connection
            refused = True
            self.on_disconnect()
        finally:
            if not whole and (refused or (watch.done() and not watch.cancelled())):
                scope[CLIENT_LEFT] = True  # counted as a client that hung up, not as a 200 (middleware)
            watch.cancel()
            await self.chunks.aclose()  # type: ignore[attr-defined]  (an async generator)
            self.on_close()


async def wait_for_disconnect(receive: Receive) -> None:
    """Return when the client has gone (the request body is read by then)."""
    while (await receive())["type"] != "http.disconnect":
        pass
