"""Tool calling: which syntax a chat template teaches its model, the grammar that forces a call in it,
and the parser that reads calls back out of the text the model wrote.

Pure functions on template text and generated text; the grammar is GBNF for the constraint machinery
every other constrained reply goes through (``localspec.constraints``), so a forced call under
speculation is exact for the same reason a JSON-schema reply is.

Two syntaxes cover the families the registry serves:

- ``hermes`` (Qwen2.5/Qwen3, Hermes): ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``,
  one block per call, several in a row for parallel calls.
- ``llama3`` (Llama 3.1/3.2/3.3): the reply is one JSON object ``{"name": ..., "parameters": {...}}``,
  maybe after ``<|python_tag|>``.

SmolLM2's and Gemma 3's templates render no tools at all: ``tool_format`` says None for them, and a
server refuses tools for such a model rather than invent a format it was never trained on.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

from localspec.chat import ToolCall

HERMES, LLAMA3 = "hermes", "llama3"
_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
_PYTHON_TAG = "<|python_tag|>"
_ARGUMENTS_KEY = {HERMES: "arguments", LLAMA3: "parameters"}


@dataclass(frozen=True)
class Tool:
    """One function a client offers: its name, what it does, and its parameters' JSON Schema."""

    name: str
    description: str | None = None
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object"})

    def as_openai(self) -> dict[str, Any]:
        """The tool as OpenAI's request carries it, which is what tool-aware templates iterate over."""
        function: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            function["description"] = self.description
        function["parameters"] = self.parameters
        return {"type": "function", "function": function}


def tool_format(template: str | None) -> str | None:
    """The call syntax ``template`` renders tools for (``HERMES`` or ``LLAMA3``), or None when it renders
    no tools (it never reads a ``tools`` variable, or its call syntax is none of these)."""
    if not template or not re.search(r"\btools\b", template):
        return None
    if _OPEN in template:
        return HERMES
    if "<|start_header_id|>" in template and '"parameters"' in template:
        return LLAMA3
    return None


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


# --- the grammar ------------------------------------------------------------------------------
def call_schema(fmt: str, tools: Sequence[Tool]) -> dict[str, Any]:
    """The JSON Schema of one call's object in ``fmt``: the name one of ``tools``' (as a constant) and the
    arguments that tool's parameters."""
    key = _ARGUMENTS_KEY[fmt]
    alternatives = [{"type": "object",
                     "properties": {"name": {"const": t.name}, key: t.parameters or {"type": "object"}},
                     "required": ["name", key], "additionalProperties": False} for t in tools]
    return alternatives[0] if len(alternatives) == 1 else {"anyOf": alternatives}


def tools_grammar(fmt: str, tools: Sequence[Tool], *, parallel: bool = True) -> str:
    """GBNF for a reply that is nothing but calls of ``tools`` in ``fmt`` (what ``tool_choice`` required or
    a named function enforces): one call, or with ``parallel`` one or more (hermes; llama3 takes one).
    The call objects come from llama.cpp's JSON-schema converter; ``InvalidOptionError`` (param
    ``json_schema``) when a tool's parameters are a schema it cannot express."""
    from localspec.backend.grammar import schema_grammar

    if not tools:
        raise ValueError("a tool grammar needs at least one tool")
    body = schema_grammar(call_schema(fmt, tools))
    # The converter's start rule becomes ``tool-call-object``; the new root wraps it in the family's syntax.
    body, renamed = re.subn(r"(?m)^root ::=", "tool-call-object ::=", body)
    rules = re.sub(r'"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]', "", body)  # literals and classes out
    if renamed != 1 or re.search(r"(?<![\w-])root(?![\w-])", rules):  # the converter's root used as a rule
        raise ValueError("the JSON-schema converter's grammar refers to its own root; it cannot be wrapped")
    if fmt == HERMES:
        block = f'"{_OPEN}\\n" tool-call-object "\\n{_CLOSE}"'
        root = f"root ::= {block} (\"\\n\" {block})*" if parallel else f"root ::= {block}"
    else:
        root = "root ::= tool-call-object"
    return root + "\n" + body


# --- reading calls back -----------------------------------------------------------------------
@dataclass(frozen=True)
class Content:
    """Text of the reply that is not a call."""

    text: str


class ToolCallReader:
    """Reads a reply as it streams: ``feed`` each piece of text, ``finish`` at the end; each returns the
    ``Content`` and ``ToolCall`` items complete so far, in order. Text that might be the start of a call
    is held back until it is clear; a call that does not parse (a model that wrote a broken block, a
    reply cut by max_tokens) comes out as content, as the model wrote it. ``names``: the offered tools';
    a call of any other name is content too."""

    def __init__(self, fmt: str, names: Sequence[str]) -> None:
        self.fmt = fmt
        self.names = frozenset(names)
        self._pending = ""  # text not yet given out
        self._in_call = False
        self._started = False  # llama3: whether the reply's first non-blank text has been seen
        self._after_call = False  # the last item given out was a call
        self.calls = 0

    def feed(self, text: str) -> list[Content | ToolCall]:
        self._pending += text
        return self._give(self._drain(final=False))

    def finish(self) -> list[Content | ToolCall]:
        return self._give(self._drain(final=True))

    def _give(self, items: Iterator[Content | ToolCall]) -> list[Content | ToolCall]:
        """``items`` without the blanks that follow a call (the newlines between blocks are syntax, not text)."""
        out: list[Content | ToolCall] = []
        for item in items:
            if isinstance(item, Content) and self._after_call:
                item = Content(item.text.lstrip())
                if not item.text:
                    continue
            self._after_call = not isinstance(item, Content)
            out.append(item)
        return out

    def whole(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """A whole reply as (content, calls): content None when the reply was only calls (and blanks)."""
        items = self.feed(text) + self.finish()
        calls = [i for i in items if isinstance(i, ToolCall)]
        content = "".join(i.text for i in items if isinstance(i, Content))
        return (None if calls and not content.strip() else content), calls

    def _drain(self, final: bool) -> Iterator[Content | ToolCall]:
        if self.fmt == LLAMA3:
            yield from self._drain_llama3(final)
            return
        while self._pending:
            if self._in_call:
                end = self._pending.find(_CLOSE)
                if end < 0:
                    if final:
                        yield self._call_or_text(self._pending, _OPEN + self._pending)
                        self._pending = ""
                    return
                block, self._pending = self._pending[:end], self._pending[end + len(_CLOSE):]
                self._in_call = False
                yield self._call_or_text(block, _OPEN + block + _CLOSE)
                continue
            start = self._pending.find(_OPEN)
            if start >= 0:
                before, self._pending = self._pending[:start], self._pending[start + len(_OPEN):]
                if before:
                    yield Content(before)
                self._in_call = True
                continue
            keep = 0 if final else _partial_suffix(self._pending, _OPEN)
            out = self._pending[:len(self._pending) - keep]
            self._pending = self._pending[len(out):]
            if out:
                yield Content(out)
            return

    def _drain_llama3(self, final: bool) -> Iterator[Content | ToolCall]:
        if not self._started:
            head = self._pending.lstrip()
            if not head or (not final and _PYTHON_TAG.startswith(head)):
                return  # not yet clear whether a call begins
            self._started = True
            self._in_call = head.startswith(("{", _PYTHON_TAG))
        if not self._in_call:
            out, self._pending = self._pending, ""
            if out:
                yield Content(out)
            return
        if final and self._pending:
            text, self._pending = self._pending, ""
            yield self._call_or_text(text.strip().removeprefix(_PYTHON_TAG), text)

    def _call_or_text(self, body: str, as_written: str) -> Content | ToolCall:
        call = parse_call(self.fmt, body, self.names)
        if call is None:
            return Content(as_written)
        self.calls += 1
        return call


def parse_call(fmt: str, body: str, names: frozenset[str] | set[str]) -> ToolCall | None:
    """One call object's text (``{"name": ..., "arguments": ...}``) as a ToolCall with a new id, or None
    when it is not one (not JSON, no such tool, arguments not an object)."""
    try:
        value = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(value, dict) or value.get("name") not in names:
        return None
    arguments = value.get(_ARGUMENTS_KEY[fmt], value.get("arguments", {}))
    if not isinstance(arguments, dict):
        return None
    return ToolCall(new_call_id(), value["name"], json.dumps(arguments, ensure_ascii=False))


def read_calls(template: str | None, tools: Sequence[Tool], text: str) -> tuple[str | None, list[ToolCall]]:
    """A whole reply of a model with chat template ``template``, offered ``tools``, as (content, calls);
    content None when the reply was only calls. ``ValueError`` when the template has no tool format."""
    fmt = tool_format(template)
    if fmt is None:
        raise ValueError("this chat template has no tool format")
    return ToolCallReader(fmt, [t.name for t in tools]).whole(text)


def _partial_suffix(text: str, marker: str) -> int:
    """The length of the longest end of ``text`` that is a proper start of ``marker``."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0
