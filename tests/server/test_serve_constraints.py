"""Structured output through the official ``openai`` client against a real server: ``response_format``
(json_object, json_schema with strict) and llama-server's ``grammar``, enforced, the same with speculation
on and off, and every malformed constraint refused with OpenAI's error shape."""

from __future__ import annotations

import json

import openai
import pytest
from served import Served

pytestmark = pytest.mark.timeout(300)

ASK = [{"role": "user", "content": "Anna Schmidt is 34 and lives in Berlin. Give her as JSON."}]
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                   "city": {"type": "string", "enum": ["Paris", "London", "Berlin"]}},
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}
SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}


def valid_person(text: str) -> dict:
    value = json.loads(text)
    assert set(value) == {"name", "age", "city"}, value
    assert isinstance(value["name"], str) and type(value["age"]) is int and value["city"] in PERSON[
        "properties"]["city"]["enum"]
    return value


def test_a_json_schema_reply_validates_and_speculation_does_not_change_it(server: Served) -> None:
    client = server.client()
    reply = client.chat.completions.create(model=server.model_id, messages=ASK, max_tokens=80, temperature=0,
                                           response_format=SCHEMA_FORMAT)
    assert reply.choices[0].finish_reason == "stop"
    valid_person(reply.choices[0].message.content)
    plain = client.chat.completions.create(model=server.model_id, messages=ASK, max_tokens=80, temperature=0,
                                           response_format=SCHEMA_FORMAT, extra_body={"localspec": {"draft": "off"}})
    assert plain.choices[0].message.content == reply.choices[0].message.content
    assert reply.model_dump()["speculative"]["drafted"] > 0


def test_a_sampled_json_object_reply_streams_as_json(server: Served) -> None:
    chunks = server.client().chat.completions.create(model=server.model_id, messages=ASK, max_tokens=120,
                                                     temperature=0.8, seed=5, stream=True,
                                                     response_format={"type": "json_object"})
    text, finish = "", None
    for chunk in chunks:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
    if finish == "stop":
        assert isinstance(json.loads(text), dict)
    else:  # the budget ran out inside the object: what came is still the start of one
        assert finish == "length" and text.lstrip().startswith("{")


def test_a_grammar_on_completions_and_one_that_cannot_finish(server: Served) -> None:
    client = server.client()
    done = client.completions.create(model=server.model_id, prompt="Is the sky blue? Answer:", max_tokens=8,
                                     temperature=0, extra_body={"grammar": 'root ::= " " ("yes" | "no")'})
    assert done.choices[0].text in (" yes", " no") and done.choices[0].finish_reason == "stop"
    endless = client.completions.create(model=server.model_id, prompt="Count:", max_tokens=10, temperature=0,
                                        extra_body={"grammar": 'root ::= (" " [0-9]+)+ "!" [ ]{500}'})
    assert endless.choices[0].finish_reason == "length" and endless.usage.completion_tokens == 10


@pytest.mark.parametrize("fields,param,needle", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": {"not": {}}}}},
     "response_format.json_schema.schema", "cannot be turned into a grammar"),
    ({"response_format": {"type": "json_schema",
                          "json_schema": {"name": "p", "schema": {"type": "string", "pattern": "[a-z]+"}}}},
     "response_format.json_schema.schema", "Pattern must start with"),
    ({"response_format": {"type": "yaml"}}, "response_format.type", "not one of text, json_object, json_schema"),
    ({"extra_body": {"grammar": 'root ::= "a'}}, "grammar", "grammar does not parse"),
    ({"extra_body": {"grammar": "root ::= answer"}}, "grammar", "Undefined rule identifier 'answer'"),
])
def test_a_constraint_that_cannot_be_enforced_is_a_400_naming_it(server: Served, fields: dict, param: str,
                                                                 needle: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        server.client().chat.completions.create(model=server.model_id, messages=ASK, max_tokens=4, **fields)
    assert caught.value.status_code == 400 and caught.value.param == param
    assert needle in caught.value.message and "\n" not in caught.value.message
    # the server is free for the next request
    reply = server.client().chat.completions.create(model=server.model_id, messages=ASK, max_tokens=2)
    assert reply.choices[0].finish_reason in ("stop", "length")
