"""The official ``openai`` client against a real server: log-probabilities the same with speculation on and
off (chat and completions, whole and streamed), penalties and logit bias exact under speculation, and each
refusal in OpenAI's error shape."""

from __future__ import annotations

import openai
import pytest
from served import Served

pytestmark = pytest.mark.timeout(300)

COUNTING = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,"
HELLO = [{"role": "user", "content": "Name three colours."}]
COUNT_CHAT = [{"role": "user", "content": "Count from 1 to 30, separated by commas."}]
OFF = {"localspec": {"draft": "off"}}


def _chat_logprobs(reply) -> list[tuple[str, float, list[str]]]:  # noqa: ANN001
    return [(c.token, c.logprob, [t.token for t in c.top_logprobs]) for c in reply.choices[0].logprobs.content]


def test_chat_logprobs_are_the_same_with_speculation_on_and_off(server: Served) -> None:
    client = server.client()
    ask = dict(model=server.model_id, messages=COUNT_CHAT, max_tokens=32, temperature=0, logprobs=True,
               top_logprobs=3)
    spec = client.chat.completions.create(**ask)
    plain = client.chat.completions.create(**ask, extra_body=OFF)
    assert spec.model_dump()["speculative"]["drafted"] > 0
    assert spec.choices[0].message.content == plain.choices[0].message.content
    got = _chat_logprobs(spec)
    assert got == _chat_logprobs(plain)
    assert len(got) == spec.usage.completion_tokens  # type: ignore[union-attr]
    assert "".join(t for t, _, _ in got) == spec.choices[0].message.content
    assert all(lp <= 0 and len(top) == 3 and top[0] == t for t, lp, top in got)  # greedy: the top token
    # Streamed: the same numbers, spread over the chunks.
    chunks = list(client.chat.completions.create(**ask, stream=True))
    streamed = [(c.token, c.logprob, [t.token for t in c.top_logprobs])
                for ch in chunks if ch.choices and ch.choices[0].logprobs for c in ch.choices[0].logprobs.content]
    assert streamed == got


def test_completion_logprobs_are_the_same_with_speculation_on_and_off(server: Served) -> None:
    client = server.client()
    ask = dict(model=server.model_id, prompt=COUNTING, max_tokens=16, temperature=0, logprobs=2)
    spec = client.completions.create(**ask)
    plain = client.completions.create(**ask, extra_body=OFF)
    assert spec.model_dump()["speculative"]["accepted"] > 0
    a, b = spec.choices[0].logprobs, plain.choices[0].logprobs
    assert a.tokens == b.tokens and a.token_logprobs == b.token_logprobs and a.top_logprobs == b.top_logprobs
    assert "".join(a.tokens) == spec.choices[0].text and a.text_offset[0] == 0
    assert all(len(top) == 2 for top in a.top_logprobs)
    chunks = list(client.completions.create(**ask, stream=True))
    assert [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.token_logprobs] == \
        a.token_logprobs
    assert [o for c in chunks if c.choices[0].logprobs for o in c.choices[0].logprobs.text_offset] == a.text_offset


def test_no_logprobs_unless_asked(server: Served) -> None:
    reply = server.client().chat.completions.create(model=server.model_id, messages=HELLO, max_tokens=4,
                                                    temperature=0)
    assert reply.choices[0].logprobs is None


def test_penalties_and_bias_are_exact_under_speculation(server: Served) -> None:
    client = server.client()
    ask = dict(model=server.model_id, prompt=COUNTING, max_tokens=24, temperature=0, presence_penalty=0.8,
               frequency_penalty=0.5, extra_body={"repeat_penalty": 1.2})
    spec = client.completions.create(**ask)
    plain = client.completions.create(**{**ask, "extra_body": {**ask["extra_body"], **OFF}})
    free = client.completions.create(model=server.model_id, prompt=COUNTING, max_tokens=24, temperature=0)
    assert spec.choices[0].text == plain.choices[0].text
    assert spec.choices[0].text != free.choices[0].text  # the penalties changed the reply
    # A bias of +100 on one token makes it the only choice, speculating or not.
    biased = dict(model=server.model_id, prompt=COUNTING, max_tokens=6, temperature=0, logprobs=0,
                  logit_bias={"28": 100})
    spec_b = client.completions.create(**biased).choices[0].logprobs
    plain_b = client.completions.create(**biased, extra_body=OFF).choices[0].logprobs
    assert len(set(spec_b.tokens)) == 1 and spec_b.tokens == plain_b.tokens
    assert spec_b.token_logprobs == plain_b.token_logprobs and spec_b.token_logprobs[0] > -0.01


@pytest.mark.parametrize("fields,param", [
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"presence_penalty": 3}, "presence_penalty"),
    ({"frequency_penalty": -2.5}, "frequency_penalty"),
    ({"logit_bias": {"12": 500}}, "logit_bias"),
    ({"logit_bias": {"99999999": 1}}, "logit_bias"),  # past the vocabulary: known only to the engine
    ({"extra_body": {"repeat_penalty": 0}}, "repeat_penalty"),
])
def test_each_refusal_names_its_field(server: Served, fields: dict, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        server.client().chat.completions.create(model=server.model_id, messages=HELLO, max_tokens=2,  # type: ignore
                                                **fields)
    assert caught.value.status_code == 400 and caught.value.param == param
    body = caught.value.body
    assert isinstance(body, dict) and body["type"] == "invalid_request_error" and param in body["message"]
