"""Chat templates: the model's own Jinja template, rendered in a sandbox.

A GGUF carries its chat template (``tokenizer.chat_template``) as Jinja
source written by whoever published the model. It is rendered in jinja2's
immutable sandbox, so a template can format messages but cannot reach into
Python objects or mutate anything.
"""

from __future__ import annotations

import datetime
import functools
import json
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from jinja2 import Template, TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from localspec.errors import UnsupportedModelError


@dataclass(frozen=True)
class ToolCall:
    """A call of a client's function: its id, the function's name, its arguments as JSON text."""

    id: str
    name: str
    arguments: str

    def as_openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class Message:
    """One chat message. An assistant's may carry ``tool_calls``; a ``tool`` message answers the call
    ``tool_call_id`` names."""

    role: str
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """The message as templates read it: the keys of OpenAI's message, a call's arguments as an object
        (templates write them with ``tojson``; Qwen's takes a string too, Llama's only an object)."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [{"id": c.id, "type": "function",
                                  "function": {"name": c.name, "arguments": _arguments(c.arguments)}}
                                 for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out


def _arguments(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text  # checked where it came in (the server refuses it); a template shows it as written


def _raise(message: str) -> None:
    raise TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    """``tojson`` as the templates' authors rendered it (Hugging Face's): keys in the order given and no
    HTML escaping, where jinja2's own sorts keys and escapes ``<``, ``>``, ``&`` and ``'``."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                      separators=tuple(separators) if separators else None, sort_keys=sort_keys)


_env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
_env.globals.update(raise_exception=_raise, strftime_now=_strftime_now)
_env.filters["tojson"] = _tojson


def render_chat(template: str | None, messages: Iterable[Message | Mapping[str, Any]], *,
                bos_token: str = "", eos_token: str = "", add_generation_prompt: bool = True,
                model_name: str = "the model", tools: Sequence[Mapping[str, Any]] | None = None) -> str:
    """The prompt text for ``messages`` in the model's own format; ``tools`` (OpenAI's
    ``{"type": "function", "function": {...}}`` objects) are given to the template as its ``tools``
    variable (left undefined when None, as templates test for).

    The result may contain special-token text (``<|im_start|>``); tokenize it
    with special tokens parsed.
    """
    if not template:
        raise UnsupportedModelError(
            f"{model_name} has no chat template in its GGUF metadata; run without --chat and write the prompt yourself"
        )
    msgs = [m.as_dict() if isinstance(m, Message) else dict(m) for m in messages]
    extra = {} if tools is None else {"tools": [dict(t) for t in tools]}
    try:
        return _compiled(template).render(
            messages=msgs, bos_token=bos_token, eos_token=eos_token,
            add_generation_prompt=add_generation_prompt, **extra,
        )
    except TemplateError as err:
        raise UnsupportedModelError(f"the chat template of {model_name} failed: {err}") from None


@functools.lru_cache(maxsize=16)
def _compiled(template: str) -> Template:
    """A template compiled once: compiling is most of rendering a chat (3 of 3.5 ms for SmolLM2's small
    template and a 12,000-token chat on a 2-core CPU), and a chat renders its template every turn."""
    return _env.from_string(template)


_OPEN, _CLOSE = "\U0010fffd", "\U0010fffe"
"""Around a sentinel that stands for a message's content while the template renders (noncharacters:
no user text holds them, and no template treats them specially)."""


def content_spans(template: str | None, messages: Iterable[Message | Mapping[str, Any]], rendered: str, *,
                  bos_token: str = "", eos_token: str = "", add_generation_prompt: bool = True,
                  model_name: str = "the model",
                  tools: Sequence[Mapping[str, Any]] | None = None) -> list[tuple[str, bool]] | None:
    """``rendered`` (``render_chat`` of the same arguments) cut into (text, is_content) pieces in order:
    the template's own text, whose special-token markers are control tokens, and each message's
    content, which is text whatever it holds, so a message cannot forge a role boundary by typing
    ``<|im_end|>``. The template is rendered again with a sentinel per content; None when that does
    not give back ``rendered`` with the contents put in (a template that rewrites content: the caller
    tokenizes ``rendered`` whole, as before)."""
    msgs = [m.as_dict() if isinstance(m, Message) else dict(m) for m in messages]
    # Empty content has nothing to protect and stays empty: a template may test it (Qwen's puts a newline
    # before a call only after content), and a stand-in there would change what it renders.
    stand_ins = [dict(m, content=f"{_OPEN}{i}{_CLOSE}") if isinstance(m.get("content"), str) and m["content"]
                 else m for i, m in enumerate(msgs)]
    skeleton = render_chat(template, stand_ins, bos_token=bos_token, eos_token=eos_token,
                           add_generation_prompt=add_generation_prompt, model_name=model_name, tools=tools)
    pieces: list[tuple[str, bool]] = []
    rest = skeleton
    while _OPEN in rest:
        before, _, after = rest.partition(_OPEN)
        index, closed, rest = after.partition(_CLOSE)
        if not closed or not index.isdigit() or int(index) >= len(msgs):
            return None
        pieces.extend([(before, False), (msgs[int(index)]["content"], True)])
    pieces.append((rest, False))
    if "".join(text for text, _ in pieces) != rendered:
        return None
    return [(text, content) for text, content in pieces if text]
