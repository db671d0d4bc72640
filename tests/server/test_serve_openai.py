"""The official ``openai`` client against a real server on the embedded SmolLM2: chat and completions,
streamed and whole, the extension field, the cached chat prefix, and text identical to `localspec generate`."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import openai
import pytest
from served import Served, metric

pytestmark = pytest.mark.timeout(300)

COUNTING = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,"  # repetitive: the n-gram drafter finds drafts in it
HELLO = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name three colours."}]

TIMINGS = {"prompt_n", "prompt_ms", "predicted_n", "predicted_ms", "predicted_per_second", "draft_n",
           "draft_n_accepted", "cache_n"}
SPECULATIVE = {"drafter", "steps", "drafted", "accepted", "acceptance_rate", "alpha", "tokens_per_step",
               "acceptance_by_position", "drafters", "controller"}


def extra(obj: object, name: str) -> dict:
    """A field OpenAI's models do not declare (the client keeps it as an extra)."""
    value = obj.model_dump()[name]  # type: ignore[attr-defined]
    assert isinstance(value, dict)
    return value


def test_chat_whole(server: Served) -> None:
    reply = server.client().chat.completions.create(model=server.model_id, messages=HELLO, max_tokens=12,
                                                    temperature=0)
    choice = reply.choices[0]
    assert reply.object == "chat.completion" and reply.id.startswith("chatcmpl-") and reply.model == server.model_id
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    u = reply.usage
    assert u is not None and u.completion_tokens <= 12 and u.total_tokens == u.prompt_tokens + u.completion_tokens
    timings, spec = extra(reply, "timings"), extra(reply, "speculative")
    assert TIMINGS <= set(timings) and SPECULATIVE <= set(spec)
    assert timings["predicted_n"] == u.completion_tokens
    assert timings["prompt_n"] + timings["cache_n"] == u.prompt_tokens
    assert timings["draft_n"] == spec["drafted"] and timings["draft_n_accepted"] == spec["accepted"]
    assert spec["drafter"] == "ngram" and spec["controller"]["last_reason"]


def test_chat_streamed_with_usage_is_the_whole_reply_in_pieces(server: Served) -> None:
    client = server.client()
    whole = client.chat.completions.create(model=server.model_id, messages=HELLO, max_tokens=16, temperature=0)
    chunks = list(client.chat.completions.create(model=server.model_id, messages=HELLO, max_tokens=16,
                                                 temperature=0, stream=True, stream_options={"include_usage": True}))
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    # The last chunk carries the usage and no choices; the one before it, the finish reason.
    usage_chunk, finish_chunk = chunks[-1], chunks[-2]
    assert usage_chunk.choices == [] and usage_chunk.usage is not None
    assert finish_chunk.choices[0].finish_reason == whole.choices[0].finish_reason
    assert TIMINGS <= set(extra(usage_chunk, "timings")) and SPECULATIVE <= set(extra(finish_chunk, "speculative"))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert usage_chunk.usage.completion_tokens == whole.usage.completion_tokens  # type: ignore[union-attr]
    assert text == whole.choices[0].message.content  # greedy: the same reply, streamed or not


def test_completions_whole_and_streamed(server: Served) -> None:
    client = server.client()
    whole = client.completions.create(model=server.model_id, prompt=COUNTING, max_tokens=24, temperature=0)
    assert whole.object == "text_completion" and whole.choices[0].text
    assert whole.choices[0].finish_reason == "length" and whole.usage.completion_tokens == 24  # type: ignore
    chunks = list(client.completions.create(model=server.model_id, prompt=COUNTING, max_tokens=24, temperature=0,
                                            stream=True))
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length"
    spec = extra(chunks[-1], "speculative")
    # Counting on is what n-grams predict: the drafter drafted, and the target accepted some.
    assert spec["drafted"] > 0 and spec["accepted"] > 0 and spec["drafters"]["ngram"]["drafted"] == spec["drafted"]
    assert spec["tokens_per_step"] > 1 and len(spec["acceptance_by_position"]) <= 3


def test_the_extension_field_picks_the_drafter(server: Served) -> None:
    client = server.client()
    plain = client.completions.create(model=server.model_id, prompt=COUNTING, max_tokens=12, temperature=0,
                                      extra_body={"localspec": {"draft": "off"}})
    spec = extra(plain, "speculative")
    assert spec["drafter"] == "off" and spec["drafted"] == 0 and spec["controller"] is None
    assert spec["steps"] == plain.usage.completion_tokens  # type: ignore[union-attr]  (one token a step)
    ngram = client.completions.create(model=server.model_id, prompt=COUNTING, max_tokens=12, temperature=0,
                                      extra_body={"localspec": {"draft": "ngram"}})
    assert extra(ngram, "speculative")["drafter"] == "ngram"
    assert ngram.choices[0].text == plain.choices[0].text  # exact: speculation never changes greedy text
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=server.model_id, prompt="x", max_tokens=2,
                                  extra_body={"localspec": {"draft": "lookahead"}})
    assert caught.value.param == "localspec.draft" and "ngram" in caught.value.message


def test_the_chat_prefix_stays_in_the_cache_between_turns(server: Served) -> None:
    client = server.client()
    first = client.chat.completions.create(model=server.model_id, messages=HELLO, max_tokens=8, temperature=0)
    history = [*HELLO, {"role": "assistant", "content": first.choices[0].message.content},
               {"role": "user", "content": "And three more?"}]
    second = client.chat.completions.create(model=server.model_id, messages=history, max_tokens=8, temperature=0)
    cached = second.usage.prompt_tokens_details.cached_tokens  # type: ignore[union-attr]
    # Everything the first turn's prompt held was kept; only the new turn was decoded.
    assert cached >= first.usage.prompt_tokens  # type: ignore[union-attr]
    assert extra(second, "timings")["cache_n"] == cached
    assert extra(second, "timings")["prompt_n"] == second.usage.prompt_tokens - cached  # type: ignore[union-attr]


def test_models_health_and_metrics(server: Served) -> None:
    client = server.client()
    models = client.models.list().data
    assert [m.id for m in models] == [server.model_id]
    assert client.models.retrieve("SmolLM2-135M-Instruct.Q4_1").id == server.model_id  # the file's stem
    assert server.request("GET", "/health", key=None).json() == {"status": "ok"}  # no key needed
    before = metric(server, "llamacpp:tokens_predicted_total")
    drafted = metric(server, "llamacpp:spec_decode_num_draft_tokens_total")
    client.completions.create(model=server.model_id, prompt=COUNTING, max_tokens=10, temperature=0)
    assert metric(server, "llamacpp:tokens_predicted_total") == before + 10
    assert metric(server, "llamacpp:spec_decode_num_draft_tokens_total") > drafted
    for name in ("llamacpp:prompt_tokens_total", "llamacpp:n_decode_total", "llamacpp:spec_decode_num_drafts_total",
                 "llamacpp:spec_decode_num_accepted_tokens_total", "llamacpp:step_seconds_count"):
        assert metric(server, name) > 0, name
    assert metric(server, "llamacpp:spec_decode_num_reached_tokens_per_pos_total", position="0") >= metric(
        server, "llamacpp:spec_decode_num_accepted_tokens_per_pos_total", position="0") > 0
    assert metric(server, "llamacpp:requests_total", endpoint="/v1/completions", code="200") > 0


def generate(*args: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "localspec", "generate", *args, "--ctx", "1024", "--gpu-layers", "0",
                           "--json", "--quiet"], capture_output=True, text=True, timeout=240,
                          env={**os.environ, "LOCALSPEC_NO_HISTORY": "1"})
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_greedy_text_is_what_generate_writes(server: Served, smollm2_path) -> None:
    """The same prompt, greedy: the API's text is `localspec generate`'s (plain decoding there,
    n-gram speculation here: exactness on a batch-invariant build; see tests/greedy.py elsewhere)."""
    from localspec.backend import batch_invariant

    client = server.client()
    prompt = "The three primary colours are"
    cli = generate(str(smollm2_path), "--prompt", prompt, "--max-tokens", "16")
    api = client.completions.create(model=server.model_id, prompt=prompt, max_tokens=16, temperature=0)
    cli_chat = generate(str(smollm2_path), "--system", "Be brief.", "--prompt", "Name three colours.",
                        "--max-tokens", "16")
    api_chat = client.chat.completions.create(model=server.model_id, messages=HELLO, max_tokens=16, temperature=0)
    assert api.usage.prompt_tokens == cli["stats"]["prompt_tokens"]  # type: ignore[union-attr]
    assert api_chat.usage.prompt_tokens == cli_chat["stats"]["prompt_tokens"]  # type: ignore[union-attr]
    if batch_invariant():
        assert api.choices[0].text == cli["text"]
        assert api_chat.choices[0].message.content == cli_chat["text"]
