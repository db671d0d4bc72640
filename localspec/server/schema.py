"""OpenAI request bodies, parsed and checked as pure functions on plain dicts.

Every top-level field a client may send sits in exactly one table: ``MAPPED`` fields become
generation options; ``NEUTRAL`` fields are accepted only at the value that changes nothing
(``n: 1``, ``logprobs: false``) and refused at any other; ``IGNORED`` fields are dropped
because ignoring them cannot change a reply (``user``, ``metadata``). Any other field is refused
as unknown, so that no client believes a field took effect when it did not. Every refusal is a
``RequestError`` whose ``param`` names the field. docs/server.md lists the tables.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from localspec.chat import Message, ToolCall
from localspec.errors import InvalidOptionError, LocalspecError, shown
from localspec.logprobs import MAX_TOP_LOGPROBS
from localspec.penalties import DEFAULT_LAST_N, Penalties
from localspec.sampling import SamplingParams
from localspec.tools import Tool

OFF_WORDS = ("off", "plain", "none")
"""``{"localspec": {"draft": "off"}}``: plain decoding for this request."""
MAX_STOP_STRINGS = 16
MAX_SEED = 2**63  # the sampler's range: [0, 2**63)
MAX_TEMPERATURE = 5.0  # the sampler's range: [0, 5]


class RequestError(LocalspecError):
    """A request the server refuses: an HTTP status and OpenAI's error fields.

    ``str(err)`` is the one-line message; ``param`` names the offending field (dotted and
    indexed for nested ones: ``messages[1].role``), ``code`` is a machine-readable word.
    """

    def __init__(self, message: str, *, status: int = 400, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.param = param
        self.code = code
        self.kind = kind

    def body(self) -> dict[str, Any]:
        """The error as OpenAI writes it: ``{"error": {"message", "type", "param", "code"}}``."""
        return {"error": {"message": str(self), "type": self.kind, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class Request:
    """What a client asked for, checked. ``endpoint`` is ``chat`` or ``completion``.

    ``max_tokens`` None: generate until a stop or the end of the context (as OpenAI does
    without a limit). ``speculative`` False: plain decoding (the ``localspec.draft`` "off");
    ``drafter`` None with ``speculative``: every drafter the server was started with.
    """

    endpoint: str
    model: str | None = None
    messages: tuple[Message, ...] = ()
    prompt: str = ""
    max_tokens: int | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    drafter: str | None = None
    speculative: bool = True
    grammar: str | None = None
    json_schema: Any = None
    constraint_param: str | None = None  # the field the grammar or schema came from, for its errors
    logprobs: int | None = None  # alternatives per token (0..20); None: no log-probabilities
    penalties: Penalties | None = None
    tools: tuple[Tool, ...] = ()
    tool_choice: str = "auto"  # auto, none, required, or function (the one named ``tool_name``)
    tool_name: str | None = None
    parallel_tool_calls: bool = True

    @property
    def calls_tools(self) -> bool:
        """Whether the model is offered tools (and may, or must, call them)."""
        return bool(self.tools) and self.tool_choice != "none"

    @property
    def forced_tools(self) -> tuple[Tool, ...]:
        """The tools a grammar makes the reply call (required: any of them; a named one: that one)."""
        if self.tool_choice == "required":
            return self.tools
        if self.tool_choice == "function":
            return tuple(t for t in self.tools if t.name == self.tool_name)
        return ()


# --- the tables -------------------------------------------------------------------------------
MAPPED_COMMON = ("model", "stream", "stream_options", "temperature", "top_p", "top_k", "min_p", "seed", "stop",
                 "max_tokens", "localspec", "grammar", "json_schema", "logprobs", "presence_penalty",
                 "frequency_penalty", "repeat_penalty", "repeat_last_n", "logit_bias")
MAPPED = {
    "chat": MAPPED_COMMON + ("messages", "max_completion_tokens", "response_format", "top_logprobs", "tools",
                             "tool_choice", "parallel_tool_calls"),
    "completion": MAPPED_COMMON + ("prompt",),
}

IGNORED = ("user", "metadata", "store", "service_tier", "prompt_cache_key", "prompt_cache_retention",
           "safety_identifier", "cache_prompt")
"""Dropped: none of them can change the reply. ``store`` asks OpenAI to keep the reply (nothing is kept
here), ``cache_prompt`` is llama-server's switch for what this server always does (keep the
conversation's prefix in the cache)."""


def _absent(value: Any) -> bool:
    return value is None


def _is(*neutral: Any) -> Callable[[Any], bool]:
    """A test for the values that change nothing (None always does)."""
    return lambda value: value is None or any(value == n and type(value) is type(n) for n in neutral)


def _empty(value: Any) -> bool:
    return value is None or value == [] or value == {}


_LEGACY_FUNCTIONS = "functions and function_call are the retired names of tools and tool_choice; send those"

# name -> (does this value change nothing?, why any other value is refused)
_NEUTRAL_COMMON: dict[str, tuple[Callable[[Any], bool], str]] = {
    "n": (_is(1), "this server generates one choice per request; send n: 1 or leave it out"),
}
NEUTRAL: dict[str, dict[str, tuple[Callable[[Any], bool], str]]] = {
    "chat": {
        **_NEUTRAL_COMMON,
        "functions": (_empty, _LEGACY_FUNCTIONS),
        "function_call": (_is("none"), _LEGACY_FUNCTIONS),
        "modalities": (_is(["text"]), "only text is generated"),
        "audio": (_absent, "only text is generated"),
        "prediction": (_absent, "predicted outputs are not supported (the drafters already propose the reply)"),
        "reasoning_effort": (_absent, "reasoning effort is not a setting of these models"),
        "web_search_options": (_absent, "this server has no web search"),
        "verbosity": (_absent, "reply length is steered by max_tokens and stop here"),
    },
    "completion": {
        **_NEUTRAL_COMMON,
        "echo": (_is(False), "the prompt is not echoed; prepend it yourself"),
        "suffix": (_is(""), "insertion (a suffix after the completion) is not supported"),
        "best_of": (_is(1), "this server generates one choice per request; send best_of: 1 or leave it out"),
    },
}


# --- the entry points -------------------------------------------------------------------------
def parse_chat(body: Any, *, drafters: Sequence[str] = ()) -> Request:
    """A ``POST /v1/chat/completions`` body as a Request; ``drafters`` are the engine's names."""
    fields = _check_fields(body, "chat")
    messages = parse_messages(fields.get("messages"))
    limit = _max_tokens(fields, "max_completion_tokens")
    legacy = _max_tokens(fields, "max_tokens")
    if limit is not None and legacy is not None and limit != legacy:
        raise RequestError(f"max_tokens {legacy} and max_completion_tokens {limit} disagree; send one of them",
                           param="max_tokens", code="invalid_value")
    tools = parse_tools(fields.get("tools"))
    choice, name = parse_tool_choice(fields.get("tool_choice"), tools)
    parallel = _boolean(fields, "parallel_tool_calls", True)
    request = _request("chat", fields, drafters, messages=messages, max_tokens=limit if limit is not None else legacy,
                       tools=tools, tool_choice=choice, tool_name=name, parallel_tool_calls=parallel)
    if request.forced_tools and request.constraint_param is not None:
        raise RequestError(f"tool_choice {_show(fields.get('tool_choice'))} and {request.constraint_param} both "
                           "constrain the reply; send one of them", param="tool_choice", code="invalid_value")
    return request


def parse_completion(body: Any, *, drafters: Sequence[str] = ()) -> Request:
    """A ``POST /v1/completions`` body as a Request; ``drafters`` are the engine's names."""
    fields = _check_fields(body, "completion")
    return _request("completion", fields, drafters, prompt=parse_prompt(fields.get("prompt", _MISSING)),
                    max_tokens=_max_tokens(fields, "max_tokens"))


def matches_model(requested: str | None, names: Sequence[str]) -> bool:
    """Whether ``requested`` (None: the client named none) names the served model, case aside."""
    return requested is None or requested.strip().lower() in {n.lower() for n in names}


_MISSING = object()


def _check_fields(body: Any, endpoint: str) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise RequestError(f"the request body must be a JSON object, not {_json_type(body)}", code="invalid_type")
    neutral = NEUTRAL[endpoint]
    for name, value in body.items():
        if name in MAPPED[endpoint] or name in IGNORED:
            continue
        if name in neutral:
            changes_nothing, why = neutral[name]
            if not changes_nothing(value):
                raise RequestError(f"{name} {_show(value)} is not supported: {why}", param=name,
                                   code="unsupported_parameter")
            continue
        raise RequestError(f"unknown field {_show(str(name))}; see docs/server.md for the fields this server takes",
                           param=str(name), code="unknown_parameter")
    return body


def _request(endpoint: str, fields: Mapping[str, Any], drafters: Sequence[str], **parsed: Any) -> Request:
    stream = _boolean(fields, "stream", False)
    options = fields.get("stream_options")
    include_usage = False
    if options is not None:
        if not stream:
            raise RequestError("stream_options is only allowed with stream: true", param="stream_options",
                               code="invalid_value")
        _object_of(options, "stream_options", ("include_usage",), "an object")
        include_usage = _boolean(options, "include_usage", False, prefix="stream_options.")
    speculative, drafter = parse_extension(fields.get("localspec"), drafters)
    grammar, json_schema, where = parse_constraint(fields)
    return Request(endpoint=endpoint, model=_model(fields.get("model")), sampling=parse_sampling(fields),
                   stop=parse_stop(fields.get("stop")), stream=stream, include_usage=include_usage,
                   drafter=drafter, speculative=speculative, grammar=grammar, json_schema=json_schema,
                   constraint_param=where, logprobs=parse_logprobs(fields, endpoint),
                   penalties=parse_penalties(fields), **parsed)


# --- the fields -------------------------------------------------------------------------------
def parse_sampling(fields: Mapping[str, Any]) -> SamplingParams:
    """temperature, top_p, top_k, min_p and seed, each in the sampler's own range (None: its default)."""
    temperature = _number(fields, "temperature", 1.0, low=0.0, high=MAX_TEMPERATURE,
                          rule=f"in [0, {MAX_TEMPERATURE:g}]; 0 is greedy")
    top_p = _number(fields, "top_p", 1.0, low=0.0, high=1.0, low_open=True, rule="in (0, 1]; 1 switches it off")
    min_p = _number(fields, "min_p", 0.0, low=0.0, high=1.0, high_open=True, rule="in [0, 1); 0 switches it off")
    top_k = _integer(fields, "top_k", 0, low=0, rule="an integer >= 0; 0 switches it off")
    seed = _integer(fields, "seed", None, low=0, high=MAX_SEED - 1, rule="an integer in [0, 2**63)")
    return SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed)


def parse_constraint(fields: Mapping[str, Any]) -> tuple[str | None, Any, str | None]:
    """(GBNF text, JSON schema, the field they came from) for what constrains the reply: OpenAI's
    ``response_format`` (``text``; ``json_object``: any JSON object; ``json_schema``: its ``schema``,
    enforced whether ``strict`` or not) or llama-server's ``grammar`` and ``json_schema``; at most one.
    Whether the grammar parses, or the schema converts, is the engine's check (``Engine.shaper``)."""
    given = [name for name in ("response_format", "grammar", "json_schema") if fields.get(name) is not None]
    if len(given) > 1:
        raise RequestError(f"{given[0]} and {given[1]} both constrain the reply; send one of them", param=given[1],
                           code="invalid_value")
    if not given:
        return None, None, None
    name = given[0]
    value = fields[name]
    if name == "grammar":
        if not isinstance(value, str):
            raise _wrong_type("grammar", value, "GBNF text (a string)")
        return value, None, "grammar"
    if name == "json_schema":
        if not isinstance(value, dict):
            raise _wrong_type("json_schema", value, "a JSON Schema object")
        return None, value, "json_schema"
    if not isinstance(value, dict):
        raise _wrong_type("response_format", value, 'an object such as {"type": "json_object"}')
    kind = value.get("type")
    if kind == "text":
        _object_of(value, "response_format", ("type",), '{"type": "text"}')
        return None, None, None
    if kind == "json_object":
        _object_of(value, "response_format", ("type",), '{"type": "json_object"}')
        return None, True, "response_format"
    if kind == "json_schema":
        _object_of(value, "response_format", ("type", "json_schema"), '{"type": "json_schema", "json_schema": {...}}')
        spec = value.get("json_schema")
        if not isinstance(spec, dict):
            raise _wrong_type("response_format.json_schema", spec,
                              'an object such as {"name": "person", "schema": {...}, "strict": true}')
        _object_of(spec, "response_format.json_schema", ("name", "description", "schema", "strict"),
                   "an object with name, description, schema and strict")
        schema = spec.get("schema")
        if schema is None:
            schema = {}  # as llama-server: no schema, any JSON object
        if not isinstance(schema, dict):
            raise _wrong_type("response_format.json_schema.schema", schema, "a JSON Schema object")
        strict = spec.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise _wrong_type("response_format.json_schema.strict", strict, "true or false")
        return None, schema, "response_format.json_schema.schema"
    raise RequestError(f"response_format.type {_show(kind)} is not one of text, json_object, json_schema",
                       param="response_format.type", code="invalid_value")


def parse_logprobs(fields: Mapping[str, Any], endpoint: str) -> int | None:
    """How many alternatives per token to report, or None for no log-probabilities.

    Chat: ``logprobs`` true/false and ``top_logprobs`` in [0, 20] (which needs ``logprobs: true``, as
    OpenAI has it). Completions: ``logprobs`` an integer in [0, 20] (OpenAI's legacy field; its own
    limit is 5)."""
    rule = f"an integer in [0, {MAX_TOP_LOGPROBS}]"
    if endpoint == "completion":
        return _integer(fields, "logprobs", None, low=0, high=MAX_TOP_LOGPROBS, rule=rule)
    wanted = _boolean(fields, "logprobs", False)
    top = _integer(fields, "top_logprobs", None, low=0, high=MAX_TOP_LOGPROBS, rule=rule)
    if top is not None and not wanted:
        raise RequestError("top_logprobs needs logprobs: true", param="top_logprobs", code="invalid_value")
    return (top or 0) if wanted else None


def parse_penalties(fields: Mapping[str, Any]) -> Penalties | None:
    """presence_penalty, frequency_penalty, llama-server's repeat_penalty and repeat_last_n, and
    logit_bias (``{"token id": bias}``), each in its range; None when none was sent."""
    names = ("presence_penalty", "frequency_penalty", "repeat_penalty", "repeat_last_n", "logit_bias")
    if all(fields.get(n) is None for n in names):
        return None
    presence = _number(fields, "presence_penalty", 0.0, low=-2.0, high=2.0, rule="in [-2, 2]; 0 switches it off")
    frequency = _number(fields, "frequency_penalty", 0.0, low=-2.0, high=2.0, rule="in [-2, 2]; 0 switches it off")
    repeat = _number(fields, "repeat_penalty", 1.0, low=0.0, high=10.0, low_open=True,
                     rule="in (0, 10]; 1 switches it off")
    last_n = _integer(fields, "repeat_last_n", DEFAULT_LAST_N, low=-1,
                      rule="an integer >= -1 (-1: every token so far; 0: none)")
    bias = fields.get("logit_bias")
    pairs: list[tuple[int, float]] = []
    if bias is not None:
        if not isinstance(bias, dict):
            raise _wrong_type("logit_bias", bias, 'an object of token ids to biases, like {"1234": -100}')
        for key, value in bias.items():
            if not (isinstance(key, str) and key.isdigit()):
                raise RequestError(f"logit_bias key {shown(str(key))} is not a token id; keys are token ids as "
                                   "strings", param="logit_bias", code="invalid_value")
            pairs.append((int(key), _number(bias, key, 0.0, low=-100.0, high=100.0,
                                            rule="in [-100, 100]", prefix="logit_bias.")))
    penalties = Penalties(presence=presence, frequency=frequency, repeat=repeat, last_n=last_n,
                          logit_bias=tuple(pairs))
    try:
        penalties.validate()
    except InvalidOptionError as err:
        raise RequestError(str(err), param=err.param, code="invalid_value") from None
    return penalties


_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def parse_tools(value: Any) -> tuple[Tool, ...]:
    """``tools``: a list of ``{"type": "function", "function": {name, description, parameters, strict}}``,
    each name as OpenAI allows it (letters, digits, _ and -, at most 64) and used once."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise _wrong_type("tools", value, 'a list of {"type": "function", "function": {...}} objects')
    tools: list[Tool] = []
    for i, item in enumerate(value):
        where = f"tools[{i}]"
        _object_of(item, where, ("type", "function"), '{"type": "function", "function": {"name": ...}}')
        if item.get("type") != "function":
            raise RequestError(f"{where}.type {_show(item.get('type'))} is not supported: only function tools are",
                               param=f"{where}.type", code="invalid_value")
        function = item.get("function")
        _object_of(function, f"{where}.function", ("name", "description", "parameters", "strict"),
                   'an object like {"name": "get_weather", "parameters": {...}}')
        name = function.get("name")
        if name is None:
            raise RequestError(f"{where}.function.name is required: the name the model calls the tool by",
                               param=f"{where}.function.name", code="missing_required_parameter")
        if not isinstance(name, str) or not _TOOL_NAME.fullmatch(name):
            raise RequestError(f"{where}.function.name {_show(name)} is not a tool name: use letters, digits, _ "
                               "and -, at most 64", param=f"{where}.function.name", code="invalid_value")
        if any(t.name == name for t in tools):
            raise RequestError(f"{where}.function.name {_show(name)} names a tool twice",
                               param=f"{where}.function.name", code="invalid_value")
        description = function.get("description")
        if description is not None and not isinstance(description, str):
            raise _wrong_type(f"{where}.function.description", description, "a string")
        parameters = function.get("parameters")
        if parameters is None:
            parameters = {"type": "object", "properties": {}}
        if not isinstance(parameters, dict):
            raise _wrong_type(f"{where}.function.parameters", parameters, "a JSON Schema object")
        strict = function.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise _wrong_type(f"{where}.function.strict", strict, "true or false")
        tools.append(Tool(name, description, parameters))
    return tuple(tools)


def parse_tool_choice(value: Any, tools: Sequence[Tool]) -> tuple[str, str | None]:
    """``tool_choice`` as (choice, name): auto (the default with tools), none (the default without),
    required, or ``{"type": "function", "function": {"name": ...}}`` naming one of ``tools``."""
    if value is None:
        return ("auto" if tools else "none"), None
    if isinstance(value, str):
        if value not in ("auto", "none", "required"):
            raise RequestError(f"tool_choice {_show(value)} is not one of auto, none, required, or "
                               '{"type": "function", "function": {"name": ...}}', param="tool_choice",
                               code="invalid_value")
        if value != "none" and not tools:
            raise RequestError(f"tool_choice {_show(value)} needs tools; send the functions in tools",
                               param="tool_choice", code="invalid_value")
        return value, None
    _object_of(value, "tool_choice", ("type", "function"), '{"type": "function", "function": {"name": ...}}')
    function = value.get("function")
    if value.get("type") != "function" or not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise RequestError('tool_choice must be auto, none, required, or {"type": "function", "function": '
                           '{"name": ...}}', param="tool_choice", code="invalid_value")
    name = function["name"]
    if not any(t.name == name for t in tools):
        have = ", ".join(t.name for t in tools) or "none"
        raise RequestError(f"tool_choice names {_show(name)}, which is not in tools (they are: {have})",
                           param="tool_choice", code="invalid_value")
    return "function", name


def parse_messages(value: Any) -> tuple[Message, ...]:
    """Chat messages: role system/developer/user/assistant/tool, content a string or a list of text parts.

    ``developer`` is OpenAI's newer name for the system role and becomes ``system``, the role
    chat templates know. Text parts are joined with newlines; any other part is refused. An
    assistant message may carry ``tool_calls``; a ``tool`` message answers one by ``tool_call_id``.
    """
    if value is None or value is _MISSING:
        raise RequestError("messages is required: a list of {role, content} objects", param="messages",
                           code="missing_required_parameter")
    if not isinstance(value, list):
        raise _wrong_type("messages", value, "a list of {role, content} objects")
    if not value:
        raise RequestError("messages is empty; send at least one message", param="messages", code="invalid_value")
    return tuple(_message(m, f"messages[{i}]") for i, m in enumerate(value))


_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
# Keys an echoed assistant message carries (the openai package writes them back as null or empty).
_MESSAGE_NEUTRAL: dict[str, Callable[[Any], bool]] = {
    "refusal": _absent, "function_call": _absent, "audio": _absent, "annotations": _empty,
}


def _message(value: Any, where: str) -> Message:
    if not isinstance(value, dict):
        raise _wrong_type(where, value, "an object with role and content")
    role = value.get("role")
    if not isinstance(role, str):
        raise _wrong_type(f"{where}.role", role, "a string")
    if role == "function":
        raise RequestError(f"{where}.role \"function\" is not supported: {_LEGACY_FUNCTIONS} (answer a call "
                           "with role tool)", param=f"{where}.role", code="unsupported_value")
    if role not in _ROLES:
        raise RequestError(f"{where}.role {_show(role)} is not a role; use system, user, assistant or tool",
                           param=f"{where}.role", code="invalid_value")
    for key, item in value.items():
        if key in ("role", "content", "name", "tool_calls", "tool_call_id"):  # name: who spoke; not rendered
            continue
        neutral = _MESSAGE_NEUTRAL.get(key)
        if neutral is None:
            raise RequestError(f"unknown field {where}.{key}", param=f"{where}.{key}", code="unknown_parameter")
        if not neutral(item):
            why = _LEGACY_FUNCTIONS if key == "function_call" else "only text messages are supported"
            raise RequestError(f"{where}.{key} is not supported: {why}", param=f"{where}.{key}",
                               code="unsupported_parameter")
    calls = _tool_calls(value.get("tool_calls"), f"{where}.tool_calls", role)
    call_id = value.get("tool_call_id")
    if role == "tool":
        if not isinstance(call_id, str) or not call_id:
            raise RequestError(f"{where}.tool_call_id is required: the id of the call this message answers",
                               param=f"{where}.tool_call_id", code="missing_required_parameter")
    elif call_id is not None:
        raise RequestError(f"{where}.tool_call_id belongs on a tool message, not on role {_show(role)}",
                           param=f"{where}.tool_call_id", code="invalid_value")
    content = _content(value.get("content"), f"{where}.content", "assistant" if calls else role)
    return Message(_ROLES[role], content, tool_calls=calls, tool_call_id=call_id if role == "tool" else None)


def _tool_calls(value: Any, where: str, role: str) -> tuple[ToolCall, ...]:
    """An assistant message's ``tool_calls`` (echoed back): each ``{id, type: function, function: {name,
    arguments}}`` with the arguments JSON text, as the reply gave them."""
    if _empty(value):
        return ()
    if role != "assistant":
        raise RequestError(f"{where} belongs on an assistant message, not on role {_show(role)}", param=where,
                           code="invalid_value")
    if not isinstance(value, list):
        raise _wrong_type(where, value, "a list of tool calls")
    calls: list[ToolCall] = []
    for j, call in enumerate(value):
        at = f"{where}[{j}]"
        _object_of(call, at, ("id", "type", "function"), '{"id": ..., "type": "function", "function": {...}}')
        function = call.get("function")
        _object_of(function, f"{at}.function", ("name", "arguments"), '{"name": ..., "arguments": "{...}"}')
        call_id, name, arguments = call.get("id"), function.get("name"), function.get("arguments")
        if call.get("type", "function") != "function":
            raise RequestError(f"{at}.type {_show(call.get('type'))} is not supported: only function calls are",
                               param=f"{at}.type", code="invalid_value")
        if not isinstance(call_id, str):
            raise _wrong_type(f"{at}.id", call_id, "a string (the id the reply gave the call)")
        if not isinstance(name, str):
            raise _wrong_type(f"{at}.function.name", name, "a string")
        if not isinstance(arguments, str):
            raise _wrong_type(f"{at}.function.arguments", arguments, "a string of JSON, as the reply gave it")
        try:
            json.loads(arguments)
        except json.JSONDecodeError as err:
            raise RequestError(f"{at}.function.arguments is not JSON: {err}", param=f"{at}.function.arguments",
                               code="invalid_value") from None
        calls.append(ToolCall(call_id, name, arguments))
    return tuple(calls)


def _content(value: Any, where: str, role: str) -> str:
    if isinstance(value, str):
        return value
    if value is None and role == "assistant":
        return ""
    if not isinstance(value, list):
        raise _wrong_type(where, value, "a string or a list of text parts")
    texts: list[str] = []
    for j, part in enumerate(value):
        if not isinstance(part, dict):
            raise _wrong_type(f"{where}[{j}]", part, 'an object like {"type": "text", "text": "..."}')
        if part.get("type") != "text":
            raise RequestError(f"{where}[{j}].type {_show(part.get('type'))} is not supported: only text parts are",
                               param=f"{where}[{j}].type", code="unsupported_value")
        text = part.get("text")
        if not isinstance(text, str):
            raise _wrong_type(f"{where}[{j}].text", text, "a string")
        texts.append(text)
    return "\n".join(texts)


def parse_prompt(value: Any) -> str:
    """A completion prompt: a string, or a list holding one string."""
    if value is _MISSING or value is None:
        raise RequestError("prompt is required: the text to continue", param="prompt",
                           code="missing_required_parameter")
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str):
        value = value[0]
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        raise RequestError(f"prompt holds {len(value)} prompts; this server completes one per request",
                           param="prompt", code="unsupported_value")
    if isinstance(value, list) and value and all(isinstance(v, (int, list)) and not isinstance(v, bool)
                                                 for v in value):
        raise RequestError("prompt as token ids is not supported; send the text", param="prompt",
                           code="unsupported_value")
    raise _wrong_type("prompt", value, "a string")


def parse_stop(value: Any) -> tuple[str, ...]:
    """``stop``: None, one string, or a list of up to MAX_STOP_STRINGS non-empty strings."""
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise _wrong_type("stop", value, "a string or a list of strings")
    if len(items) > MAX_STOP_STRINGS:
        raise RequestError(f"stop has {len(items)} strings; at most {MAX_STOP_STRINGS} are taken", param="stop",
                           code="invalid_value")
    if any(not s for s in items):
        raise RequestError("stop holds an empty string, which would stop before the first token", param="stop",
                           code="invalid_value")
    return tuple(items)


def _object_of(value: Any, name: str, keys: tuple[str, ...], shape: str) -> None:
    """Refuse ``value`` unless it is an object holding only ``keys`` (a nested field such as stream_options)."""
    if not isinstance(value, dict):
        raise _wrong_type(name, value, shape)
    for key in value:
        if key not in keys:
            raise RequestError(f"unknown field {name}.{key}; {name} takes only {', '.join(keys)}",
                               param=f"{name}.{key}", code="unknown_parameter")


def parse_extension(value: Any, drafters: Sequence[str]) -> tuple[bool, str | None]:
    """``"localspec": {"draft": NAME}`` as (speculative, drafter).

    NAME is one of ``drafters`` (the engine's names), several joined by commas, or one of
    OFF_WORDS for plain decoding; absent: every drafter the server was started with.
    """
    if value is None:
        return True, None
    _object_of(value, "localspec", ("draft",), 'an object like {"draft": "ngram"}')
    name = value.get("draft")
    if name is None:
        return True, None
    if not isinstance(name, str):
        raise _wrong_type("localspec.draft", name, "a string")
    if name.strip().lower() in OFF_WORDS:
        return False, None
    singles = [d for d in drafters if "," not in d]
    parts = [p.strip() for p in name.split(",")]
    for part in parts:
        if part not in singles:
            have = ", ".join(singles) if singles else "none (start it with --draft, e.g. --draft ngram)"
            raise RequestError(f"unknown drafter {_show(part)}; this server has: {have}; or off for plain decoding",
                               param="localspec.draft", code="invalid_value")
    if len(set(parts)) < len(parts):
        raise RequestError(f"localspec.draft {_show(name)} names a drafter twice", param="localspec.draft",
                           code="invalid_value")
    return True, ",".join(parts)


def _model(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise _wrong_type("model", value, "a string")


def _max_tokens(fields: Mapping[str, Any], name: str) -> int | None:
    return _integer(fields, name, None, low=1, rule="an integer >= 1")


# --- typed values -----------------------------------------------------------------------------
def _number(fields: Mapping[str, Any], name: str, default: float, *, low: float, high: float, rule: str,
            low_open: bool = False, high_open: bool = False, prefix: str = "") -> float:
    value = fields.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _wrong_type(prefix + name, value, "a number")
    x = float(value)
    inside = (math.isfinite(x) and (low < x if low_open else low <= x) and (x < high if high_open else x <= high))
    if not inside:
        where = prefix + name
        raise RequestError(f"{where} {_show(value)} is out of range: it must be {rule}",
                           param=where.split(".")[0] if prefix else name, code="invalid_value")
    return x


def _integer(fields: Mapping[str, Any], name: str, default: int | None, *, low: int, rule: str,
             high: int | None = None) -> Any:
    value = fields.get(name)
    if value is None:
        return default
    # 3.0 is 3 (JavaScript clients have no integers); 3.5 and "3" are not.
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _wrong_type(name, value, "an integer")
    if value < low or (high is not None and value > high):
        raise RequestError(f"{name} {value} is out of range: it must be {rule}", param=name, code="invalid_value")
    return value


def _boolean(fields: Mapping[str, Any], name: str, default: bool, *, prefix: str = "") -> bool:
    value = fields.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _wrong_type(prefix + name, value, "true or false")
    return value


def _wrong_type(name: str, value: Any, want: str) -> RequestError:
    return RequestError(f"{name} must be {want}, not {_json_type(value)}", param=name, code="invalid_type")


def _json_type(value: Any) -> str:
    """How JSON would name the value's type."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return f"the number {_show(value)}"
    if isinstance(value, str):
        return f"the string {_show(value)}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _show(value: Any) -> str:
    """A value for a one-line message, short, as JSON writes it (the client sent JSON, not Python)."""
    if isinstance(value, str):
        return shown(value, 40, quote='"')
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 60 else text[:60] + "…"
