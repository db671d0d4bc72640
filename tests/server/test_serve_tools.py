"""Tool calling through the official ``openai`` client against a real ``localspec serve`` of a tiny
random-weight model carrying Qwen3's chat template (support/tools_model.py): a required or named
``tool_choice`` is enforced by a grammar, so even random weights give a well-formed call, parsed into
``tool_calls``, the same with speculation on and off, streamed as deltas that reassemble to it, and
answered back with ``role: tool``. (The refusal for a template without tools is in test_serve_errors,
on SmolLM2.)"""

from __future__ import annotations

import json
from typing import Any, Iterator

import openai
import pytest
from served import Served, start_server, stop_server
from tools_model import write_tools_model

pytestmark = pytest.mark.timeout(300)

ASK = [{"role": "user", "content": "What is the weather in Oslo, and what time is it?"}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Today's weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"enum": ["Oslo", "Lima"]},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"],
    "additionalProperties": False}}}
NAMED = {"type": "function", "function": {"name": "get_weather"}}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    model = write_tools_model(tmp_path_factory.mktemp("tools") / "random-qwen3-tools.gguf")
    served = start_server(str(model), "--draft", "ngram", "--draft-max", "3", "--ctx", "1024", "--gpu-layers", "0")
    yield served
    stop_server(served)


def ask(served: Served, **fields: Any) -> Any:
    fields = {"messages": ASK, "max_tokens": 80, "temperature": 0, "tools": [WEATHER, TIME], **fields}
    return served.client().chat.completions.create(model=served.model_id, **fields)


def valid_weather(arguments: str) -> dict:
    value = json.loads(arguments)
    assert set(value) == {"city", "unit"} and value["city"] in ("Oslo", "Lima"), value
    assert value["unit"] in ("celsius", "fahrenheit"), value
    return value


def test_a_named_tool_choice_is_called_and_speculation_does_not_change_it(served: Served) -> None:
    reply = ask(served, tool_choice=NAMED)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    valid_weather(call.function.arguments)
    plain = ask(served, tool_choice=NAMED, extra_body={"localspec": {"draft": "off"}})
    assert plain.choices[0].message.tool_calls[0].function == call.function
    assert plain.choices[0].message.tool_calls[0].id != call.id  # each call its own id
    assert reply.model_dump()["speculative"]["drafted"] > 0


def test_required_calls_one_of_the_tools(served: Served) -> None:
    for seed in (1, 2, 3):  # sampled: the grammar holds whatever the draws
        reply = ask(served, tool_choice="required", parallel_tool_calls=False, temperature=1.0, seed=seed)
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        (call,) = choice.message.tool_calls
        if call.function.name == "get_weather":
            valid_weather(call.function.arguments)
        else:
            assert call.function.name == "get_time" and json.loads(call.function.arguments)["zone"] in ("UTC", "CET")


def test_streamed_deltas_reassemble_to_the_same_call(served: Served) -> None:
    whole = ask(served, tool_choice=NAMED).choices[0].message.tool_calls[0]
    calls: dict[int, dict[str, Any]] = {}
    finish, content = None, ""
    for chunk in ask(served, tool_choice=NAMED, stream=True):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        finish = chunk.choices[0].finish_reason or finish
        for part in delta.tool_calls or []:
            if part.index not in calls:  # the first delta of a call names it
                assert part.id and part.function.name and part.type == "function", part
                calls[part.index] = {"id": part.id, "name": part.function.name, "arguments": ""}
            calls[part.index]["arguments"] += part.function.arguments or ""
    assert finish == "tool_calls" and content == ""
    assert [(c["name"], c["arguments"]) for c in calls.values()] == [(whole.function.name, whole.function.arguments)]


def test_a_tool_result_goes_back_through_the_template(served: Served) -> None:
    first = ask(served, tool_choice=NAMED)
    call = first.choices[0].message.tool_calls[0]
    history = [*ASK, first.choices[0].message,  # as agents send it back: the reply's own message object
               {"role": "tool", "tool_call_id": call.id, "content": "4 degrees and snow"}]
    second = ask(served, messages=history, tool_choice={"type": "function", "function": {"name": "get_time"}})
    (again,) = second.choices[0].message.tool_calls
    assert again.function.name == "get_time" and json.loads(again.function.arguments)["zone"] in ("UTC", "CET")
    # The call and the result are in the prompt: Qwen3's template wraps them in <tool_call>/<tool_response>.
    grown = second.usage.prompt_tokens - first.usage.prompt_tokens
    answered = served.request("POST", "/v1/chat/completions", {
        "messages": [*ASK, {"role": "assistant", "content": "", "tool_calls": [call.model_dump()]}],
        "tools": [WEATHER, TIME], "max_tokens": 1}).json()
    assert answered["usage"]["prompt_tokens"] > first.usage.prompt_tokens  # the call alone renders
    assert grown > answered["usage"]["prompt_tokens"] - first.usage.prompt_tokens  # and the result after it


def test_auto_renders_the_tools_and_lets_the_model_choose(served: Served) -> None:
    reply = ask(served, max_tokens=12)
    bare = served.client().chat.completions.create(model=served.model_id, messages=ASK, max_tokens=1)
    assert reply.usage.prompt_tokens > bare.usage.prompt_tokens + 50  # the tools' signatures are in the prompt
    choice = reply.choices[0]
    assert (choice.finish_reason == "tool_calls") == bool(choice.message.tool_calls)


@pytest.mark.parametrize("tools,param,needle", [
    ([{"type": "function", "function": {"name": "f", "parameters": {"not": {}}}}], "tools",
     "cannot be enforced"),
    ([{"type": "function", "function": {"parameters": {}}}], "tools[0].function.name", "is required"),
])
def test_a_tool_that_cannot_be_enforced_or_has_no_name_is_refused(served: Served, tools: list, param: str,
                                                                   needle: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        served.client().chat.completions.create(model=served.model_id, messages=ASK, max_tokens=4, tools=tools,
                                                tool_choice="required")
    assert caught.value.param == param and needle in caught.value.message, caught.value.message
