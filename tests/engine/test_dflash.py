"""A DFlash GGUF as ``--draft``: a block of drafts from one pass over the target's features, on real llama.cpp.

The models are the tiny dense ``llama`` target of ``tests/support/eagle3_model.py`` and a
tiny ``dflash`` draft built so its first draft agrees with the target often (deeper ones
rarely): drafts are both accepted and rejected.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from localspec.backend import Context, DFlashContext, Model
from localspec.drafting.dflash import DFlashDrafter
from localspec.drafting.specs import parse_draft
from localspec.engine import Engine, GenerateOptions
from localspec.errors import IncompatibleDraftError
from localspec.sampling import Sampler, SamplingParams
from cli import localspec, one_error_line
from stats import assert_first_two_follow

PROMPT = "The quick brown fox jumps over the lazy dog, and then"
MIX = 0.3


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from eagle3_model import write_dflash_draft, write_llama_target

    d = tmp_path_factory.mktemp("dflash")
    return (write_llama_target(d / "llama-tiny.gguf", mix=MIX),
            write_dflash_draft(d / "dflash-tiny.gguf", agree=True))


def _run(engine: Engine, prompt: str, **kw) -> tuple[tuple[int, ...], dict[str, tuple[int, int]]]:
    done = engine.generate(prompt, GenerateOptions(**kw)).run()
    return done.tokens, {d.name: (d.drafted, d.accepted) for d in done.stats.drafters}


@pytest.mark.parametrize("drafters", ["draft", "draft,ngram"])
def test_greedy_with_dflash_is_plain_greedy(drafters, pair):
    target, draft = pair
    plain = Engine.load(target, n_ctx=512, n_threads=1)
    spec = Engine.load(target, draft, specs=parse_draft(drafters.replace("draft", "").strip(",") or None),
                       n_ctx=512, n_threads=1)
    try:
        assert spec.draft_ctx is None and spec.dflash_ctx is not None
        greedy = SamplingParams(temperature=0.0)
        seen = [0, 0]
        for prompt in (PROMPT, PROMPT + " after that", "1, 2, 3,"):
            want, _ = _run(plain, prompt, max_tokens=32, sampling=greedy)
            got, by_drafter = _run(spec, prompt, max_tokens=32, sampling=greedy, draft_len=3, drafter=drafters)
            assert got == want
            assert set(by_drafter) <= {"dflash", "ngram"}  # the stats name it dflash
            drafted, accepted = by_drafter.get("dflash", (0, 0))
            seen = [seen[0] + drafted, seen[1] + accepted]
        if drafters == "draft":
            assert 0 < seen[1] < seen[0]
    finally:
        plain.close()
        spec.close()


def test_one_pass_drafts_the_block(pair):
    """A proposal of k tokens is one draft decode (after the injection), never k; and at most block - 1."""
    target_path, draft_path = pair
    target, draft = Model(target_path), Model(draft_path)
    tctx = Context(target, n_ctx=256, n_threads=1)
    head = DFlashContext(draft, tctx, n_threads=1)
    tctx.enable_layer_taps(head.layers)
    calls: list[int] = []
    block = head.draft_block
    head.draft_block = lambda token, position, k: (calls.append(k), block(token, position, k))  # type: ignore[method-assign]
    drafter = DFlashDrafter(head, tctx, Sampler(SamplingParams(temperature=0.0)))
    try:
        prompt = target.tokenize(PROMPT)
        tctx.append(prompt[:-1])
        proposal = drafter.propose(prompt, 3)
        assert len(proposal.tokens) == 3 and calls == [3]
        assert len(drafter.propose(prompt, 10).tokens) == head.block_size - 1
        assert head.n_past == len(prompt) - 1  # the block left the cache; the features stay
    finally:
        drafter.close()
        head.close()
        tctx.close()
        target.close()
        draft.close()


def test_sampled_tokens_follow_the_target_distribution(pair):
    """At T=1 the first two tokens a step emits follow the target's joint distribution (chi-square):
    the block's drafts are sampled from each row's own q, independently, and accepted with it."""
    target_path, draft_path = pair
    target, draft = Model(target_path), Model(draft_path)
    tctx = Context(target, n_ctx=256, n_threads=1)
    head = DFlashContext(draft, tctx, n_threads=1)
    tctx.enable_layer_taps(head.layers)
    sampler = Sampler(SamplingParams(temperature=1.0, top_k=8, seed=7))
    drafter = DFlashDrafter(head, tctx, sampler)
    prompt = target.tokenize(PROMPT)
    tctx.append(prompt[:-1])
    n0 = len(tctx.tokens)
    tctx.append(prompt[-1:])
    p1 = sampler.distribution(tctx.logits(-1)).copy()
    joint: dict[tuple[int, int], float] = {}
    for x1 in np.flatnonzero(p1):
        tctx.append([int(x1)])
        p2 = sampler.distribution(tctx.logits(-1))
        for x2 in np.flatnonzero(p2):
            joint[(int(x1), int(x2))] = float(p1[x1] * p2[x2])
        tctx.rollback_to(n0 + 1)
    tctx.rollback_to(n0)
    assert_first_two_follow(tctx, prompt, drafter, sampler, joint, lambda: tctx.rollback_to(n0))
    drafter.close()
    head.close()
    tctx.close()
    target.close()
    draft.close()


def test_cli_drafts_with_dflash(pair):
    target, draft = pair
    proc = localspec("generate", str(target), "--draft", str(draft), "--prompt", PROMPT, "--max-tokens",
                     "24", "--temp", "0", "--draft-max", "3", "--threads", "1", "--json")
    assert proc.returncode == 0, proc.stderr
    stats = json.loads(proc.stdout)["stats"]
    assert list(stats["drafters"]) == ["dflash"]
    assert stats["drafters"]["dflash"]["drafted"] > 0


@pytest.mark.parametrize("change, message", [
    ({"n_embd": 32}, "reads features 32 wide, the target's are 64"),
    ({"target_layers": (0, 7)}, r"reads layer\(s\) 7, the target has layers 0..3"),
])
def test_a_dflash_draft_that_does_not_fit_is_refused_before_loading(pair, tmp_path, change, message, monkeypatch):
    from eagle3_model import write_dflash_draft

    target, _ = pair
    wrong = write_dflash_draft(tmp_path / "wrong.gguf", **change)

    def no_load(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003
        raise AssertionError("weights were loaded before the pair was refused")

    monkeypatch.setattr(Model, "__init__", no_load)
    with pytest.raises(IncompatibleDraftError, match=message) as err:
        Engine.load(target, wrong)
    assert "\n" not in str(err.value)


def test_cli_refuses_the_dflash_draft_as_the_model(pair):
    _, draft = pair
    line = one_error_line(localspec("generate", str(draft), "--prompt", "Hi", "--threads", "1"))
    assert "is a DFlash draft" in line and "--draft" in line
