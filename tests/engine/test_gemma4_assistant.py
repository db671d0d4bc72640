"""Gemma 4's assistant GGUF as ``--draft``: a draft that reads its target's own cache, on real llama.cpp.

The models are a tiny ``gemma4`` target and a tiny ``gemma4-assistant`` with
random weights (``tests/support/gemma4_model.py``), built so the assistant agrees with
its target often: drafts are both accepted and rejected.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from localspec import backend
from localspec.backend import AssistantContext, Context, Model
from localspec.drafting.assistant import AssistantDrafter
from localspec.drafting.specs import parse_draft
from localspec.engine import Engine, GenerateOptions
from localspec.errors import IncompatibleDraftError, UnsupportedModelError
from localspec.models.gguf_info import read_info
from localspec.models.planner import plan
from localspec.sampling import Sampler, SamplingParams
from cli import localspec, one_error_line
from stand_ins import HiddenRowSource
from stats import assert_first_two_follow, first_two_joint

PROMPT = "The quick brown fox jumps over the lazy dog, and then"
MIX, LOGIT_SCALE = 0.1, 0.5


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from gemma4_model import write_gemma4_assistant, write_gemma4_target

    d = tmp_path_factory.mktemp("gemma4")
    return (write_gemma4_target(d / "gemma4-tiny.gguf", mix=MIX, logit_scale=LOGIT_SCALE),
            write_gemma4_assistant(d / "gemma4-assistant-tiny.gguf", mix=MIX, logit_scale=LOGIT_SCALE))


def _run(engine: Engine, prompt: str, **kw) -> tuple[tuple[int, ...], dict[str, tuple[int, int]]]:
    done = engine.generate(prompt, GenerateOptions(**kw)).run()
    return done.tokens, {d.name: (d.drafted, d.accepted) for d in done.stats.drafters}


@pytest.mark.parametrize("drafters", ["draft", "draft,ngram"])
def test_greedy_with_the_assistant_is_plain_greedy(drafters, pair):
    target, assistant = pair
    plain = Engine.load(target, n_ctx=512, n_threads=1)
    spec = Engine.load(target, assistant, specs=parse_draft(drafters.replace("draft", "").strip(",") or None),
                       n_ctx=512, n_threads=1)
    try:
        assert spec.draft_ctx is None and isinstance(spec.drafter_context("draft"), AssistantContext)  # no cache of its own
        greedy = SamplingParams(temperature=0.0)
        seen = [0, 0]
        # The second prompt extends the first (a chat's next turn): the target keeps the shared prefix.
        for prompt in (PROMPT, PROMPT + " after that", "1, 2, 3,"):
            want, _ = _run(plain, prompt, max_tokens=32, sampling=greedy)
            got, by_drafter = _run(spec, prompt, max_tokens=32, sampling=greedy, draft_len=4, drafter=drafters)
            assert got == want
            assert set(by_drafter) <= set(drafters.split(","))
            drafted, accepted = by_drafter.get("draft", (0, 0))
            seen = [seen[0] + drafted, seen[1] + accepted]
        if drafters == "draft":
            assert 0 < seen[1] < seen[0]  # the stats name it "draft"; both accepted and rejected drafts
    finally:
        plain.close()
        spec.close()


def test_sampled_tokens_follow_the_target_distribution(pair):
    """At T=1 the first two tokens a step emits are distributed as the target's, jointly (chi-square).

    The assistant's drafts are accepted by rejection sampling with its own distribution q;
    a wrong q (or a verifier that only matched) would skew the counts.
    """
    target_path, assistant_path = pair
    target, assistant = Model(target_path), Model(assistant_path)
    tctx = Context(target, n_ctx=256, n_threads=1)
    head = AssistantContext(assistant, tctx, n_threads=1)
    sampler = Sampler(SamplingParams(temperature=1.0, top_k=8, seed=7))
    drafter = AssistantDrafter(head, tctx, sampler)
    prompt = target.tokenize(PROMPT)
    tctx.append(prompt[:-1])
    n0 = len(tctx.tokens)

    # The target's own joint distribution of the next two tokens: p1(x1) p2(x2 | x1).
    joint = first_two_joint(tctx, sampler, prompt[-1])
    # The drafter's hidden row for the prompt's last position comes from this decode.
    tctx.append(prompt[-1:])
    tctx.rollback_to(n0)

    assert_first_two_follow(tctx, prompt, drafter, sampler, joint, lambda: tctx.rollback_to(n0))
    drafter.close()
    head.close()
    tctx.close()
    target.close()
    assistant.close()


def test_the_assistant_reads_the_target_cache_and_leaves_it_alone(pair):
    """Same token, position and hidden row: different target histories give different drafts' logits,
    and an assistant decode changes nothing in the target's cache."""
    target_path, assistant_path = pair
    target, assistant = Model(target_path), Model(assistant_path)
    tctx = Context(target, n_ctx=256, n_threads=1)
    head = AssistantContext(assistant, tctx, n_threads=1)
    try:
        h = np.linspace(-1.0, 1.0, head.n_embd, dtype=np.float32)
        a, b = target.tokenize("Alpha beta gamma delta"), target.tokenize("One two three four")
        n = min(len(a), len(b))
        tctx.append(a[:n])
        want = np.array(tctx.logits(-1))
        assert head.decode(42, n, h)
        after_a = np.array(head.logits())
        assert np.isfinite(after_a).all() and np.isfinite(head.hidden()).all()
        assert head.decode(42, n, h)
        assert np.array_equal(np.array(head.logits()), after_a)  # it wrote nothing it reads next time
        assert tctx.seq_pos_max(0) == n - 1
        tctx.rollback_to(n - 1)
        tctx.append(a[n - 1:n])
        assert np.allclose(tctx.logits(-1), want, atol=1e-4)  # the target's cache is as it was
        tctx.clear()
        tctx.append(b[:n])
        assert head.decode(42, n, h)
        assert not np.allclose(head.logits(), after_a, atol=1e-3)  # it attends to the target's cache
    finally:
        head.close()
        tctx.close()
        target.close()
        assistant.close()


def test_cli_drafts_with_the_assistant(pair):
    target, assistant = pair
    proc = localspec("generate", str(target), "--draft", str(assistant), "--prompt", PROMPT, "--max-tokens",
                      "24", "--temp", "0", "--draft-max", "3", "--threads", "1", "--json")
    assert proc.returncode == 0, proc.stderr
    stats = json.loads(proc.stdout)["stats"]
    assert list(stats["drafters"]) == ["draft"]
    assert stats["drafters"]["draft"]["drafted"] > 0


def test_cli_refuses_an_assistant_for_another_architecture(pair, smollm2_path):
    """SmolLM2 shares the tiny assistant's vocabulary, so only the pairing rule can refuse it."""
    _, assistant = pair
    line = one_error_line(localspec("generate", str(smollm2_path), "--draft", str(assistant), "--prompt", "Hi",
                                      "--threads", "1"))
    assert "does not fit" in line and "drafts for gemma4 models" in line and "llama" in line


@pytest.mark.parametrize("change, message", [
    ({"target_embd": 96}, "reads hidden rows of 96, the target's are 64 wide"),
    ({"n_head_kv": 1}, "reads 1 KV heads of size 16, the target's layer"),
])
def test_an_assistant_of_other_sizes_is_refused_before_loading(pair, tmp_path, change, message):
    from gemma4_model import write_gemma4_assistant

    target, _ = pair
    wrong = write_gemma4_assistant(tmp_path / "wrong.gguf", **change)
    with pytest.raises(IncompatibleDraftError, match=message) as err:
        Engine.load(target, wrong)
    assert "\n" not in str(err.value) and "use the assistant published for this target" in str(err.value)


def test_missing_nextn_functions_refuse_the_assistant(pair, monkeypatch):
    """A libllama without the C++-linkage functions the assistant needs: refused in one line."""
    target, assistant = pair
    monkeypatch.setitem(backend.nextn._NEXTN_SYMBOLS, "get_embeddings_nextn", "_Z99llama_no_such_function")
    backend.nextn.nextn_api.cache_clear()
    try:
        with pytest.raises(UnsupportedModelError, match="llama_get_embeddings_nextn") as err:
            Engine.load(target, assistant)
        assert "\n" not in str(err.value)
    finally:
        monkeypatch.undo()
        backend.nextn.nextn_api.cache_clear()
    assert backend.mtp_unavailable_reason() is None


def test_the_plan_counts_the_assistant_weights_but_no_cache(pair):
    target, assistant = pair
    p = plan(read_info(target), read_info(assistant), n_ctx=4096)
    assert p.draft is not None
    assert p.draft.kv_gpu_bytes == p.draft.kv_cpu_bytes == 0  # it reads the target's cache
    info = read_info(assistant)
    assert p.draft.weights_gpu_bytes >= sum(info.layer_bytes) > 0


def test_cli_refuses_the_assistant_as_the_model(pair):
    _, assistant = pair
    line = one_error_line(localspec("generate", str(assistant), "--prompt", "Hi", "--threads", "1"))
    assert "cannot run alone" in line and "as --draft" in line


def test_a_one_token_prompt_drafts_nothing_until_the_target_holds_a_token(pair):
    """With an empty target cache the assistant has nothing to attend to (NaN logits): it proposes nothing."""
    target, assistant = pair
    plain = Engine.load(target, n_ctx=256, n_threads=1)
    spec = Engine.load(target, assistant, n_ctx=256, n_threads=1)
    try:
        for temperature in (0.0, 1.0):
            sampling = SamplingParams(temperature=temperature, seed=3)
            want, _ = _run(plain, [42], max_tokens=8, sampling=sampling, speculative=False)
            got, by_drafter = _run(spec, [42], max_tokens=8, sampling=sampling, draft_len=3)
            assert by_drafter["draft"][0] > 0
            if temperature == 0.0:
                assert got == want
    finally:
        plain.close()
        spec.close()


class _Head:
    """A stand-in assistant: predicts token + 1, returns hidden [100 + decodes], records its inputs."""

    n_embd = 4

    def __init__(self) -> None:
        self.calls: list[tuple[int, int, float]] = []

    def decode(self, token: int, position: int, hidden: np.ndarray) -> bool:
        self.calls.append((token, position, float(hidden[0])))
        return True

    def logits(self) -> np.ndarray:
        out = np.zeros(64, dtype=np.float32)
        out[self.calls[-1][0] + 1] = 10.0
        return out

    def hidden(self) -> np.ndarray:
        return np.full(4, 100.0 + len(self.calls), dtype=np.float32)


def test_each_draft_step_reads_the_right_hidden_row_at_the_same_position():
    """The first step pairs the last token with the target's row before it; later steps with the
    assistant's own output; all at the last token's position. A tree's shared key is not trusted."""
    rows, head = HiddenRowSource(), _Head()
    drafter = AssistantDrafter(head, rows, Sampler(SamplingParams(temperature=0.0)))  # type: ignore[arg-type]
    # a verification tree at positions 3..4 over history [10, 11, 12]: root 12 at 2, then 20 | 21 at 3
    rows.block = np.array([[2], [30], [31]], dtype=np.float32).repeat(4, 1)
    drafter.observe([12, 20, 21], [2, 3, 3], [[0, 1, 2], [1], [2]])
    proposal = drafter.propose([10, 11, 12, 21, 7], 3)
    assert proposal.tokens == (8, 9, 10) and proposal.probs is None
    assert head.calls == [(7, 4, 31.0), (8, 4, 101.0), (9, 4, 102.0)]
    # the same key in two branches: zeros, never the wrong branch's row
    rows.block = np.array([[5], [6]], dtype=np.float32).repeat(4, 1)
    drafter.observe([21, 21], [3, 3], [[1], [2]])
    head.calls.clear()
    drafter.propose([10, 11, 12, 21, 7], 1)
    assert head.calls == [(7, 4, 0.0)]
    # nothing in the target's cache yet: no proposal at all
    head.calls.clear()
    assert len(drafter.propose([10], 3)) == 0 and head.calls == []
