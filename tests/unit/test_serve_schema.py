"""Request parsing as pure functions on dicts: every field mapped, refused with its name, or ignored."""

from __future__ import annotations

import pytest

from localspec.chat import Message, ToolCall
from localspec.penalties import Penalties
from localspec.sampling import SamplingParams
from localspec.server.schema import (
    IGNORED,
    MAPPED,
    NEUTRAL,
    RequestError,
    matches_model,
    parse_chat,
    parse_completion,
)

DRAFTERS = ["draft,ngram", "draft", "ngram"]
HELLO = [{"role": "user", "content": "Hello"}]


def refused(parse, body: object, param: str | None, *, status: int = 400, code: str | None = None) -> RequestError:
    with pytest.raises(RequestError) as caught:
        parse(body, drafters=DRAFTERS)
    err = caught.value
    assert (err.status, err.param) == (status, param), err.body()
    if code is not None:
        assert err.code == code
    assert "\n" not in str(err) and str(err)
    return err


def test_a_minimal_chat_takes_openai_defaults() -> None:
    req = parse_chat({"model": "m", "messages": HELLO})
    assert req.endpoint == "chat" and req.model == "m"
    assert req.messages == (Message("user", "Hello"),)
    # OpenAI samples at temperature 1 when none is sent; no max_tokens: to the end of the context.
    assert req.sampling == SamplingParams(temperature=1.0)
    assert req.max_tokens is None and req.stop == () and not req.stream and not req.include_usage
    assert req.speculative and req.drafter is None


def test_the_sampling_fields_are_mapped() -> None:
    req = parse_chat({"messages": HELLO, "temperature": 0, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "seed": 7,
                      "stop": ["\n\n", "END"], "max_tokens": 16, "stream": True,
                      "stream_options": {"include_usage": True}})
    assert req.sampling == SamplingParams(temperature=0.0, top_k=40, top_p=0.9, min_p=0.05, seed=7)
    assert req.stop == ("\n\n", "END") and req.max_tokens == 16 and req.stream and req.include_usage
    assert parse_completion({"prompt": "x", "stop": "END"}).stop == ("END",)
    assert parse_completion({"prompt": "x", "top_k": 3.0}).sampling.top_k == 3  # JSON clients may write 3.0


def test_max_completion_tokens_is_max_tokens() -> None:
    assert parse_chat({"messages": HELLO, "max_completion_tokens": 9}).max_tokens == 9
    assert parse_chat({"messages": HELLO, "max_completion_tokens": 9, "max_tokens": 9}).max_tokens == 9
    refused(parse_chat, {"messages": HELLO, "max_completion_tokens": 9, "max_tokens": 10}, "max_tokens")


def test_a_completion_prompt_is_a_string_or_one_string_in_a_list() -> None:
    assert parse_completion({"prompt": "Once"}).prompt == "Once"
    assert parse_completion({"prompt": ["Once"]}).prompt == "Once"
    refused(parse_completion, {"prompt": ["a", "b"]}, "prompt", code="unsupported_value")
    refused(parse_completion, {"prompt": [1, 2, 3]}, "prompt", code="unsupported_value")
    refused(parse_completion, {"prompt": 5}, "prompt", code="invalid_type")
    refused(parse_completion, {}, "prompt", code="missing_required_parameter")


@pytest.mark.parametrize("field,value", [
    ("temperature", "hot"), ("temperature", True), ("top_p", [1]), ("top_k", 2.5), ("top_k", "3"), ("seed", 1.5),
    ("max_tokens", "ten"), ("stream", "yes"), ("stop", 3), ("stop", ["a", 1]), ("model", 3),
    ("messages", "hello"), ("localspec", "ngram"),
])
def test_wrong_types_name_the_field(field: str, value: object) -> None:
    body = {"messages": HELLO, field: value}
    err = refused(parse_chat, body, field, code="invalid_type")
    assert field in str(err)


@pytest.mark.parametrize("field,value", [
    ("temperature", -0.1), ("temperature", 5.5), ("temperature", float("nan")), ("top_p", 0), ("top_p", 1.01),
    ("min_p", 1.0), ("top_k", -1), ("seed", -1), ("seed", 2**63), ("max_tokens", 0), ("stop", [""]),
    ("stop", ["s"] * 17), ("top_logprobs", 21), ("top_logprobs", -1), ("presence_penalty", 2.5),
    ("frequency_penalty", -2.1), ("repeat_penalty", 0), ("repeat_last_n", -2), ("logit_bias", {"42": 101}),
    ("logit_bias", {"x": 1}),
])
def test_out_of_range_values_name_the_field(field: str, value: object) -> None:
    extra = {"logprobs": True} if field == "top_logprobs" else {}
    refused(parse_chat, {"messages": HELLO, field: value, **extra}, field, code="invalid_value")


def test_logprobs_and_penalties_become_options() -> None:
    assert parse_chat({"messages": HELLO}).logprobs is None and parse_chat({"messages": HELLO}).penalties is None
    assert parse_chat({"messages": HELLO, "logprobs": True}).logprobs == 0
    assert parse_chat({"messages": HELLO, "logprobs": True, "top_logprobs": 20}).logprobs == 20
    assert parse_chat({"messages": HELLO, "logprobs": False}).logprobs is None
    refused(parse_chat, {"messages": HELLO, "top_logprobs": 2}, "top_logprobs", code="invalid_value")
    assert parse_completion({"prompt": "x", "logprobs": 3}).logprobs == 3
    refused(parse_completion, {"prompt": "x", "logprobs": 21}, "logprobs", code="invalid_value")
    got = parse_chat({"messages": HELLO, "presence_penalty": 0.5, "frequency_penalty": 1, "repeat_penalty": 1.1,
                      "repeat_last_n": -1, "logit_bias": {"42": -100, "7": 2.5}}).penalties
    assert got == Penalties(presence=0.5, frequency=1.0, repeat=1.1, last_n=-1, logit_bias=((42, -100.0), (7, 2.5)))


@pytest.mark.parametrize("field,value", [
    ("n", 2), ("functions", [{}]), ("function_call", "auto"), ("audio", {"voice": "x"}),
    ("modalities", ["text", "audio"]),
])
def test_features_this_server_lacks_are_refused(field: str, value: object) -> None:
    err = refused(parse_chat, {"messages": HELLO, field: value}, field, code="unsupported_parameter")
    assert "not supported" in str(err)


@pytest.mark.parametrize("field,value,quoted", [
    ("functions", [{"name": "f"}], 'functions [{"name": "f"}] '),
    ("tool_choice", "sometimes", 'tool_choice "sometimes" '), ("n", None, None),
    ("temperature", "hot", 'the string "hot"'),
    ("messages", [{"role": "function", "content": "x"}], 'role "function" '), ("stream", None, None),
    ("messages", [{"role": "robot", "content": "x"}], 'role "robot" '), ("top_k", 2.5, "the number 2.5"),
])
def test_values_are_quoted_as_the_client_wrote_them_in_json(field: str, value: object, quoted: str | None) -> None:
    """Issue 41: the messages quoted Python's reprs (logprobs True, tools [{'type': ...) of what was JSON."""
    body = {"messages": HELLO, field: value}
    if quoted is None:
        parse_chat(body)
        return
    with pytest.raises(RequestError) as caught:
        parse_chat(body, drafters=DRAFTERS)
    assert quoted in str(caught.value) and "'" not in str(caught.value), str(caught.value)


@pytest.mark.parametrize("field,value", [("echo", True), ("suffix", "}"), ("best_of", 3)])
def test_completion_only_features_are_refused(field: str, value: object) -> None:
    refused(parse_completion, {"prompt": "x", field: value}, field, code="unsupported_parameter")


@pytest.mark.parametrize("field,value", [
    ("n", 1), ("logprobs", False), ("tools", []), ("tool_choice", "none"), ("response_format", {"type": "text"}),
    ("presence_penalty", 0), ("frequency_penalty", 0.0), ("logit_bias", {}), ("n", None),
])
def test_the_values_that_change_nothing_are_accepted(field: str, value: object) -> None:
    assert parse_chat({"messages": HELLO, field: value}).messages


@pytest.mark.parametrize("field", IGNORED)
def test_harmless_fields_are_ignored(field: str) -> None:
    assert parse_chat({"messages": HELLO, field: "anything"}).messages == (Message("user", "Hello"),)


def test_an_unknown_field_is_refused_not_ignored() -> None:
    err = refused(parse_chat, {"messages": HELLO, "temprature": 0.2}, "temprature", code="unknown_parameter")
    assert "temprature" in str(err)
    refused(parse_completion, {"prompt": "x", "messages": HELLO}, "messages", code="unknown_parameter")
    refused(parse_chat, {"messages": HELLO, "prompt": "x"}, "prompt", code="unknown_parameter")


def test_every_field_is_in_exactly_one_table() -> None:
    for endpoint in ("chat", "completion"):
        tables = [set(MAPPED[endpoint]), set(NEUTRAL[endpoint]), set(IGNORED)]
        for i, a in enumerate(tables):
            for b in tables[i + 1:]:
                assert not a & b, (endpoint, a & b)


def test_the_body_must_be_an_object() -> None:
    refused(parse_chat, [HELLO], None, code="invalid_type")
    refused(parse_chat, "hello", None, code="invalid_type")


def test_messages_are_checked_one_by_one() -> None:
    refused(parse_chat, {}, "messages", code="missing_required_parameter")
    refused(parse_chat, {"messages": []}, "messages", code="invalid_value")
    refused(parse_chat, {"messages": ["hi"]}, "messages[0]", code="invalid_type")
    refused(parse_chat, {"messages": [*HELLO, {"role": "robot", "content": "x"}]}, "messages[1].role",
            code="invalid_value")
    refused(parse_chat, {"messages": [{"role": "function", "content": "x", "name": "f"}]}, "messages[0].role",
            code="unsupported_value")
    refused(parse_chat, {"messages": [{"role": "user", "content": 3}]}, "messages[0].content", code="invalid_type")
    refused(parse_chat, {"messages": [{"role": "user", "content": "x", "mood": "happy"}]}, "messages[0].mood",
            code="unknown_parameter")
    image = {"type": "image_url", "image_url": {"url": "http://x/y.png"}}
    refused(parse_chat, {"messages": [{"role": "user", "content": [image]}]}, "messages[0].content[0].type",
            code="unsupported_value")
    calls = {"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]}
    refused(parse_chat, {"messages": [*HELLO, calls]}, "messages[1].tool_calls[0].function", code="invalid_type")


def test_message_forms_clients_send() -> None:
    parts = [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]
    echoed = {"role": "assistant", "content": "Hi!", "refusal": None, "tool_calls": None, "function_call": None,
              "audio": None, "annotations": []}
    req = parse_chat({"messages": [{"role": "developer", "content": "Be brief."},
                                   {"role": "user", "content": parts, "name": "ann"}, echoed]})
    assert req.messages == (Message("system", "Be brief."), Message("user", "one\ntwo"), Message("assistant", "Hi!"))


def test_stream_options_need_a_stream() -> None:
    refused(parse_chat, {"messages": HELLO, "stream_options": {"include_usage": True}}, "stream_options")
    refused(parse_chat, {"messages": HELLO, "stream": True, "stream_options": {"include_usage": 1}},
            "stream_options.include_usage", code="invalid_type")
    refused(parse_chat, {"messages": HELLO, "stream": True, "stream_options": {"chunked": True}},
            "stream_options.chunked", code="unknown_parameter")


def test_the_drafter_extension() -> None:
    def pick(value: object) -> tuple[bool, str | None]:
        req = parse_chat({"messages": HELLO, "localspec": {"draft": value}}, drafters=DRAFTERS)
        return req.speculative, req.drafter

    assert pick("ngram") == (True, "ngram")
    assert pick("draft,ngram") == (True, "draft,ngram")
    assert pick(None) == (True, None)
    assert pick("off") == pick("plain") == pick("OFF") == (False, None)
    assert parse_chat({"messages": HELLO, "localspec": {}}).speculative
    err = refused(parse_chat, {"messages": HELLO, "localspec": {"draft": "ngrma"}}, "localspec.draft")
    assert "ngram" in str(err) and "off" in str(err)  # what exists is named
    refused(parse_chat, {"messages": HELLO, "localspec": {"draft": "ngram,ngram"}}, "localspec.draft")
    refused(parse_chat, {"messages": HELLO, "localspec": {"draft": 3}}, "localspec.draft", code="invalid_type")
    refused(parse_chat, {"messages": HELLO, "localspec": {"gamma": 3}}, "localspec.gamma", code="unknown_parameter")
    with pytest.raises(RequestError, match="start it with --draft"):
        parse_chat({"messages": HELLO, "localspec": {"draft": "ngram"}}, drafters=[])


def test_the_model_is_matched_by_id_or_alias_case_aside() -> None:
    names = ("smollm2-135m", "smollm2", "SmolLM2-135M-Instruct.Q4_1")
    assert matches_model(None, names) and matches_model("SmolLM2", names) and matches_model("smollm2-135m", names)
    assert not matches_model("gpt-4o", names)


def test_the_error_body_is_openais_shape() -> None:
    err = refused(parse_chat, {"messages": HELLO, "n": 3}, "n")
    assert err.body() == {"error": {"message": str(err), "type": "invalid_request_error", "param": "n",
                                    "code": "unsupported_parameter"}}


# --- what constrains the reply: response_format, and llama-server's grammar and json_schema ----------
PERSON = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}


@pytest.mark.parametrize("fields,grammar,schema,param", [
    ({"response_format": {"type": "text"}}, None, None, None),
    ({"response_format": {"type": "json_object"}}, None, True, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON, "strict": True}}},
     None, PERSON, "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "p"}}}, None, {},
     "response_format.json_schema.schema"),
    ({"grammar": 'root ::= "yes" | "no"'}, 'root ::= "yes" | "no"', None, "grammar"),
    ({"json_schema": PERSON}, None, PERSON, "json_schema"),
])
def test_a_constraint_becomes_the_requests_grammar_or_schema(fields, grammar, schema, param) -> None:
    for parse, base in ((parse_chat, {"messages": HELLO}), (parse_completion, {"prompt": "x"})):
        if parse is parse_completion and "response_format" in fields:
            continue
        request = parse({**base, **fields})
        assert (request.grammar, request.json_schema, request.constraint_param) == (grammar, schema, param)


@pytest.mark.parametrize("fields,param,code", [
    ({"response_format": {"type": "xml"}}, "response_format.type", "invalid_value"),
    ({"response_format": "json"}, "response_format", "invalid_type"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema", "invalid_type"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": [1]}}},
     "response_format.json_schema.schema", "invalid_type"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "p", "strict": "yes"}}},
     "response_format.json_schema.strict", "invalid_type"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "p", "shape": {}}}},
     "response_format.json_schema.shape", "unknown_parameter"),
    ({"response_format": {"type": "json_object", "schema": {}}}, "response_format.schema", "unknown_parameter"),
    ({"grammar": 3}, "grammar", "invalid_type"),
    ({"json_schema": "{}"}, "json_schema", "invalid_type"),
    ({"grammar": 'root ::= "a"', "json_schema": PERSON}, "json_schema", "invalid_value"),
])
def test_a_malformed_constraint_names_its_field(fields, param, code) -> None:
    refused(parse_chat, {"messages": HELLO, **fields}, param, code=code)


# --- tools (issue 42 item 2) ------------------------------------------------------------------
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                             "parameters": {"type": "object",
                                                            "properties": {"city": {"type": "string"}},
                                                            "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time"}}


def test_tools_and_each_tool_choice_are_taken() -> None:
    req = parse_chat({"messages": HELLO, "tools": [WEATHER, TIME]})
    assert [t.name for t in req.tools] == ["get_weather", "get_time"]
    assert req.tools[0].parameters["required"] == ["city"] and req.tools[0].description == "The weather in a city"
    assert req.tools[1].parameters == {"type": "object", "properties": {}}  # no parameters: an empty object
    assert (req.tool_choice, req.calls_tools, req.forced_tools) == ("auto", True, ())
    none = parse_chat({"messages": HELLO, "tools": [WEATHER], "tool_choice": "none"})
    assert not none.calls_tools and none.forced_tools == ()
    required = parse_chat({"messages": HELLO, "tools": [WEATHER, TIME], "tool_choice": "required",
                           "parallel_tool_calls": False})
    assert required.forced_tools == required.tools and required.parallel_tool_calls is False
    named = parse_chat({"messages": HELLO, "tools": [WEATHER, TIME],
                        "tool_choice": {"type": "function", "function": {"name": "get_time"}}})
    assert (named.tool_choice, named.tool_name) == ("function", "get_time")
    assert [t.name for t in named.forced_tools] == ["get_time"]
    assert parse_chat({"messages": HELLO}).tool_choice == "none"


@pytest.mark.parametrize("fields,param,code,needle", [
    ({"tools": [{"type": "function", "function": {"description": "x"}}]}, "tools[0].function.name",
     "missing_required_parameter", "is required"),
    ({"tools": [{"type": "function", "function": {"name": "get weather"}}]}, "tools[0].function.name",
     "invalid_value", "not a tool name"),
    ({"tools": [TIME, TIME]}, "tools[1].function.name", "invalid_value", "names a tool twice"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0].type", "invalid_value", "only function tools"),
    ({"tools": {"get_time": {}}}, "tools", "invalid_type", "a list"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]},
     "tools[0].function.parameters", "invalid_type", "JSON Schema"),
    ({"tool_choice": "required"}, "tool_choice", "invalid_value", "needs tools"),
    ({"tools": [TIME], "tool_choice": "sometimes"}, "tool_choice", "invalid_value", "not one of"),
    ({"tools": [TIME], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}, "tool_choice",
     "invalid_value", "not in tools (they are: get_time)"),
    ({"tools": [TIME], "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice",
     "invalid_value", "both constrain the reply"),
    ({"tools": [TIME], "parallel_tool_calls": "yes"}, "parallel_tool_calls", "invalid_type", "true or false"),
])
def test_bad_tools_are_refused_naming_the_field(fields: dict, param: str, code: str, needle: str) -> None:
    err = refused(parse_chat, {"messages": HELLO, **fields}, param, code=code)
    assert needle in str(err), str(err)


def test_a_tool_round_trip_comes_back_as_messages() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    req = parse_chat({"messages": [*HELLO, {"role": "assistant", "content": None, "tool_calls": [call]},
                                   {"role": "tool", "tool_call_id": "call_1", "content": "4 degrees"}],
                      "tools": [WEATHER]})
    assistant, tool = req.messages[1:]
    assert assistant.content == "" and assistant.tool_calls == (ToolCall("call_1", "get_weather", '{"city": "Oslo"}'),)
    assert tool == Message("tool", "4 degrees", tool_call_id="call_1")
    assert assistant.as_dict()["tool_calls"][0]["function"]["arguments"] == {"city": "Oslo"}  # templates take objects
    assert tool.as_dict() == {"role": "tool", "content": "4 degrees", "tool_call_id": "call_1"}


@pytest.mark.parametrize("message,param,code", [
    ({"role": "tool", "content": "4 degrees"}, "messages[1].tool_call_id", "missing_required_parameter"),
    ({"role": "user", "content": "x", "tool_call_id": "call_1"}, "messages[1].tool_call_id", "invalid_value"),
    ({"role": "user", "content": "x", "tool_calls": [{"id": "1"}]}, "messages[1].tool_calls", "invalid_value"),
    ({"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{oops"}}]},
     "messages[1].tool_calls[0].function.arguments", "invalid_value"),
    ({"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]},
     "messages[1].tool_calls[0].function.arguments", "invalid_type"),
])
def test_bad_tool_messages_are_refused(message: dict, param: str, code: str) -> None:
    refused(parse_chat, {"messages": [*HELLO, message]}, param, code=code)
