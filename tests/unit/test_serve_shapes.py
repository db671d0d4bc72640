"""The response shapes and the metrics, from the engine's records alone (no model, no server)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from localspec.events import ControlSummary, DoneEvent, DrafterStats, GenerationStats, StepEvent
from localspec.server import responses
from localspec.server.metrics import ServerMetrics

STATS = GenerationStats(prompt_tokens=40, tokens=30, steps=12, drafted=24, accepted=18, elapsed_s=1.5,
                        prefill_ms=20.0, position_drafted=(12, 10, 8), position_accepted=(10, 8, 0),
                        drafters=(DrafterStats("ngram", 12, 24, 18),),
                        control=ControlSummary(draft_steps=12, last_reason="draft length fixed at 2"))


def test_timings_are_llama_servers() -> None:
    t = responses.timings(STATS, cached=30)
    assert t["cache_n"] == 30 and t["prompt_n"] == 10 and t["prompt_ms"] == 20.0
    assert t["prompt_per_second"] == pytest.approx(500.0)
    assert t["predicted_n"] == 30 and t["predicted_ms"] == pytest.approx(1500.0)
    assert t["predicted_per_second"] == pytest.approx(20.0)
    assert (t["draft_n"], t["draft_n_accepted"]) == (24, 18)


def test_speculative_says_what_drafting_did() -> None:
    s = responses.speculative(STATS, "ngram")
    assert s["acceptance_rate"] == pytest.approx(0.75)
    assert s["alpha"] == pytest.approx(18 / 30)  # accepted / reached positions
    assert s["tokens_per_step"] == pytest.approx(2.5)
    assert s["acceptance_by_position"] == pytest.approx([10 / 12, 8 / 10, 0.0])
    assert s["drafters"]["ngram"] == {"steps": 12, "drafted": 24, "accepted": 18, "acceptance_rate": 0.75}
    assert s["controller"]["last_reason"] == "draft length fixed at 2"
    assert responses.speculative(GenerationStats(), "off")["controller"] is None


def test_usage() -> None:
    assert responses.usage(STATS, 30) == {"prompt_tokens": 40, "completion_tokens": 30, "total_tokens": 70,
                                          "prompt_tokens_details": {"cached_tokens": 30}}


@pytest.mark.parametrize("engine_reason, called, openai", [
    ("stop", False, "stop"), ("stop", True, "tool_calls"),  # a reply that ends after calling tools says so
    ("length", False, "length"), ("length", True, "length"),  # cut short: its calls may be incomplete
    ("context", False, "length"), ("context", True, "length"),  # a full context is a length limit too
])
def test_finish_reasons_are_openais(engine_reason: str, called: bool, openai: str) -> None:
    """Each finish reason of the engine that has an OpenAI one (a cancelled reply ends in an error event
    instead) reads as OpenAI's, and only a reply that stopped by itself claims tool calls."""
    assert responses.finish_reason(engine_reason, called) == openai


def test_bodies_and_chunks_have_openais_shape() -> None:
    chat = responses.Reply.new("chat", "m")
    body = responses.body(chat, "hi", "stop", STATS, 0, "ngram")
    assert chat.id.startswith("chatcmpl-") and body["object"] == "chat.completion"
    assert body["choices"] == [{"index": 0, "logprobs": None, "finish_reason": "stop",
                                "message": {"role": "assistant", "content": "hi"}}]
    assert {"timings", "speculative", "usage"} <= set(body)
    first = responses.chunk(chat, "", first=True)
    assert first["object"] == "chat.completion.chunk" and first["choices"][0]["delta"] == {"role": "assistant",
                                                                                            "content": ""}
    assert responses.chunk(chat, None, finish_reason="length")["choices"][0]["delta"] == {}
    text = responses.Reply.new("completion", "m")
    assert text.id.startswith("cmpl-") and responses.chunk(text, "x")["choices"][0]["text"] == "x"
    last = responses.usage_chunk(text, STATS, 0)
    assert last["choices"] == [] and last["object"] == "text_completion"


def test_metrics_count_a_generation_by_llama_cpp_and_vllm_names() -> None:
    metrics = ServerMetrics()
    generation = SimpleNamespace(cached_tokens=30)
    metrics.observe(generation, StepEvent(1, "ngram", 2, 2, 3, 1.0, 9.0, 0.0))  # type: ignore[arg-type]
    metrics.observe(generation, DoneEvent("length", "", (), STATS))  # type: ignore[arg-type]
    metrics.count_request("/v1/completions", 200)
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(metrics.render().decode()) for s in family.samples}
    assert samples[("llamacpp:prompt_tokens_total", ())] == 10  # decoded; 30 came from the cache
    assert samples[("llamacpp:prompt_tokens_cached_total", ())] == 30
    assert samples[("llamacpp:tokens_predicted_total", ())] == 30
    assert samples[("llamacpp:n_decode_total", ())] == 12
    assert samples[("llamacpp:spec_decode_num_drafts_total", ())] == 12
    assert samples[("llamacpp:spec_decode_num_draft_tokens_total", ())] == 24
    assert samples[("llamacpp:spec_decode_num_accepted_tokens_total", ())] == 18
    assert samples[("llamacpp:spec_decode_num_accepted_tokens_per_pos_total", (("position", "1"),))] == 8
    assert samples[("llamacpp:spec_decode_num_reached_tokens_per_pos_total", (("position", "1"),))] == 10
    assert samples[("llamacpp:requests_finished_total", (("finish_reason", "length"),))] == 1
    assert samples[("llamacpp:requests_total", (("code", "200"), ("endpoint", "/v1/completions")))] == 1
    assert samples[("llamacpp:step_seconds_count", ())] == 1
    assert samples[("llamacpp:requests_processing", ())] == 0
    assert not any(name.endswith("_created") for name, _ in samples)
