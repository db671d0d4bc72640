"""The JSON the server answers with, as pure functions of the engine's records.

Bodies and stream chunks follow OpenAI's shapes; ``timings`` follows llama.cpp's
``llama-server``; ``speculative`` is localspec's own (what the drafters did).
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from localspec.chat import ToolCall
from localspec.events import GenerationStats, TokenLogprob

FINISH_REASONS = {"stop": "stop", "length": "length", "context": "length"}
"""The engine's finish reasons as OpenAI's: a full context is a length limit too. A cancelled
generation has no OpenAI reason: its client left, or the server is stopping (an error event). A reply
that stopped after calling tools finishes with ``tool_calls`` (``finish_reason``)."""


def finish_reason(engine_reason: str, called: bool) -> str:
    """OpenAI's finish reason for the engine's, ``called`` when the reply holds tool calls."""
    reason = FINISH_REASONS[engine_reason]
    return "tool_calls" if called and reason == "stop" else reason


@dataclass(frozen=True)
class Reply:
    """What one response is about: its id, creation time, the served model's id and the endpoint."""

    endpoint: str  # "chat" or "completion"
    model: str
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    @classmethod
    def new(cls, endpoint: str, model: str) -> "Reply":
        prefix = "chatcmpl-" if endpoint == "chat" else "cmpl-"
        return cls(endpoint, model, prefix + secrets.token_hex(12))

    @property
    def object(self) -> str:
        return "chat.completion" if self.endpoint == "chat" else "text_completion"

    @property
    def chunk_object(self) -> str:
        return "chat.completion.chunk" if self.endpoint == "chat" else "text_completion"


def usage(stats: GenerationStats, cached: int) -> dict[str, Any]:
    """Token counts as OpenAI reports them; ``cached`` prompt tokens were kept from the last request."""
    return {
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": stats.tokens,
        "total_tokens": stats.prompt_tokens + stats.tokens,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def timings(stats: GenerationStats, cached: int) -> dict[str, Any]:
    """``timings`` as llama-server writes it.

    The prompt part counts only what was decoded (``cache_n`` tokens came from the cache);
    the predicted part is generation after the prompt, every speculative step included.
    """
    prompt_n = max(0, stats.prompt_tokens - cached)
    predicted_ms = stats.elapsed_s * 1e3
    return {
        "cache_n": cached,
        "prompt_n": prompt_n,
        "prompt_ms": stats.prefill_ms,
        "prompt_per_token_ms": stats.prefill_ms / prompt_n if prompt_n else 0.0,
        "prompt_per_second": prompt_n * 1e3 / stats.prefill_ms if stats.prefill_ms > 0 else 0.0,
        "predicted_n": stats.tokens,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / stats.tokens if stats.tokens else 0.0,
        "predicted_per_second": stats.tokens_per_second,
        "draft_n": stats.drafted,
        "draft_n_accepted": stats.accepted,
    }


def speculative(stats: GenerationStats, drafter: str) -> dict[str, Any]:
    """What speculation did for this reply.

    ``acceptance_rate``: accepted / drafted tokens; ``alpha``: acceptance of a draft token given
    every earlier one in its draft was accepted (the α of τ = (1 - α^(γ+1)) / (1 - α));
    ``tokens_per_step``: τ, generated tokens per target forward pass. ``drafter`` is what the
    request drafted with ("off": plain decoding).
    """
    control = stats.control
    return {
        "drafter": drafter,
        "steps": stats.steps,
        "drafted": stats.drafted,
        "accepted": stats.accepted,
        "acceptance_rate": stats.acceptance_rate,
        "alpha": stats.conditional_acceptance,
        "tokens_per_step": stats.tokens_per_step,
        "acceptance_by_position": list(stats.position_acceptance),
        "drafters": {d.name: {"steps": d.steps, "drafted": d.drafted, "accepted": d.accepted,
                              "acceptance_rate": d.acceptance_rate} for d in stats.drafters},
        "controller": None if control is None else {
            "draft_steps": control.draft_steps, "plain_steps": control.plain_steps, "probes": control.probes,
            "mean_draft_len": control.mean_draft_len, "expected_gain": control.expected_gain,
            "measured_gain": control.measured_gain, "last_reason": control.last_reason,
        },
    }


def extras(stats: GenerationStats, cached: int, drafter: str) -> dict[str, Any]:
    """The fields a final chunk and a whole body carry beyond OpenAI's."""
    return {"timings": timings(stats, cached), "speculative": speculative(stats, drafter)}


# --- log-probabilities ------------------------------------------------------------------------
FORBIDDEN_LOGPROB = -9999.0
"""What a token ruled out (log-probability -inf, which JSON cannot write) is reported as: OpenAI's value."""


def _finite(logprob: float) -> float:
    return logprob if logprob > FORBIDDEN_LOGPROB else FORBIDDEN_LOGPROB


def logprobs(endpoint: str, items: Sequence[TokenLogprob], piece: Callable[[int], bytes],
             offset: int = 0) -> dict[str, Any]:
    """A choice's ``logprobs`` as OpenAI writes it for ``endpoint``; ``piece`` gives a token's bytes.

    Chat: ``{"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}], "refusal"}``.
    Completions (the legacy shape): ``tokens``, ``token_logprobs``, ``top_logprobs`` (a token -> logprob
    object per position) and ``text_offset`` (each token's start in the text, from ``offset``)."""
    def text(token: int) -> str:
        return piece(token).decode("utf-8", errors="replace")

    if endpoint == "chat":
        return {"content": [{"token": text(lp.token), "logprob": _finite(lp.logprob), "bytes": list(piece(lp.token)),
                             "top_logprobs": [{"token": text(t), "logprob": _finite(v), "bytes": list(piece(t))}
                                              for t, v in lp.top]} for lp in items],
                "refusal": None}
    offsets, at = [], offset
    for lp in items:
        offsets.append(at)
        at += len(text(lp.token))
    return {"tokens": [text(lp.token) for lp in items], "token_logprobs": [_finite(lp.logprob) for lp in items],
            "top_logprobs": [{text(t): _finite(v) for t, v in lp.top} for lp in items], "text_offset": offsets}


# --- whole bodies -----------------------------------------------------------------------------
def body(reply: Reply, text: str | None, finish_reason: str, stats: GenerationStats, cached: int,
         drafter: str, token_logprobs: dict[str, Any] | None = None,
         tool_calls: Sequence[ToolCall] = ()) -> dict[str, Any]:
    """The non-streamed response; ``token_logprobs``: the choice's ``logprobs`` (``logprobs()``), if asked for;
    ``tool_calls``: the calls read from the reply (``text`` is then what else it said, or None)."""
    choice: dict[str, Any] = {"index": 0, "logprobs": token_logprobs, "finish_reason": finish_reason}
    if reply.endpoint == "chat":
        choice["message"] = {"role": "assistant", "content": text}
        if tool_calls:
            choice["message"]["tool_calls"] = [c.as_openai() for c in tool_calls]
    else:
        choice["text"] = text
    return {"id": reply.id, "object": reply.object, "created": reply.created, "model": reply.model,
            "choices": [choice], "usage": usage(stats, cached), **extras(stats, cached, drafter)}


# --- stream chunks ----------------------------------------------------------------------------
def chunk(reply: Reply, text: str | None, *, finish_reason: str | None = None, first: bool = False,
          token_logprobs: dict[str, Any] | None = None,
          tool_calls: Sequence[dict[str, Any]] | None = None) -> dict[str, Any]:
    """One ``chat.completion.chunk`` / streamed ``text_completion``: text (None: none) or the finish, with
    its tokens' ``logprobs`` when asked for; ``tool_calls``: a chat delta's calls (``call_deltas``)."""
    choice: dict[str, Any] = {"index": 0, "logprobs": token_logprobs, "finish_reason": finish_reason}
    if reply.endpoint == "chat":
        delta: dict[str, Any] = {}
        if first:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        if tool_calls:
            delta["tool_calls"] = list(tool_calls)
        choice["delta"] = delta
    else:
        choice["text"] = text or ""
    return {"id": reply.id, "object": reply.chunk_object, "created": reply.created, "model": reply.model,
            "choices": [choice]}


def call_deltas(call: ToolCall, index: int) -> list[dict[str, Any]]:
    """A call as the deltas OpenAI streams it in: its index, id, type and name first (arguments empty),
    then its arguments; a client joins each index's arguments in order."""
    return [{"index": index, "id": call.id, "type": "function", "function": {"name": call.name, "arguments": ""}},
            {"index": index, "function": {"arguments": call.arguments}}]


def usage_chunk(reply: Reply, stats: GenerationStats, cached: int) -> dict[str, Any]:
    """The last chunk ``stream_options.include_usage`` asks for: no choices, the usage."""
    return {"id": reply.id, "object": reply.chunk_object, "created": reply.created, "model": reply.model,
            "choices": [], "usage": usage(stats, cached)}


def models_list(model_id: str, created: int, meta: dict[str, Any]) -> dict[str, Any]:
    """``GET /v1/models``: the one served model."""
    return {"object": "list", "data": [model_entry(model_id, created, meta)]}


def model_entry(model_id: str, created: int, meta: dict[str, Any]) -> dict[str, Any]:
    return {"id": model_id, "object": "model", "created": created, "owned_by": "localspec", "meta": meta}
