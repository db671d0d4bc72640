"""A model whose cache cannot roll back (a real, tiny Mamba): speculation is refused up front, plain decoding works."""

from __future__ import annotations

import pytest

from localspec import engine as engine_module
from localspec.backend import Context, Model
from localspec.drafting.specs import DrafterSpec
from localspec.engine import Engine, GenerateOptions
from localspec.errors import UnsupportedModelError
from localspec.models.gguf_info import check_draft_compatible

from cli import assert_clean_error, localspec


@pytest.fixture
def no_context(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if the engine creates a context: a refusal must come before any cache exists."""
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a context was created before the refusal")

    monkeypatch.setattr(engine_module, "Context", refuse)


def test_mamba_reports_that_it_cannot_roll_back(mamba_path, smollm2_path):
    mamba = Model(mamba_path)
    try:
        assert mamba.is_recurrent and not mamba.is_hybrid
        assert mamba.rollback == "none" and not mamba.can_rollback
        # Asked for snapshots anyway, llama.cpp grants none for Mamba: the context says it cannot roll back.
        ctx = Context(mamba, n_ctx=64, n_rs_seq=4)
        try:
            assert ctx.n_rs_seq == 0 and ctx.max_rollback == 0
            ctx.append(mamba.tokenize("Once upon a time"))
            assert ctx.keepable(2) == 0
            with pytest.raises(UnsupportedModelError, match="one running state"):
                ctx.rollback_to(2)
        finally:
            ctx.close()
    finally:
        mamba.close()
    smollm2 = Model(smollm2_path, vocab_only=True)
    try:
        assert smollm2.can_rollback
    finally:
        smollm2.close()


@pytest.mark.parametrize("drafter", ["ngram", "draft model"])
def test_recurrent_target_refuses_any_drafter_before_making_a_cache(mamba_path, smollm2_q4_0_path, no_context,
                                                                   drafter):
    kwargs = ({"specs": [DrafterSpec("ngram")]} if drafter == "ngram" else {"draft": smollm2_q4_0_path})
    with pytest.raises(UnsupportedModelError) as err:
        Engine.load(mamba_path, **kwargs)
    message = str(err.value)
    assert "\n" not in message
    for needle in ("target random-mamba-tiny", "recurrent model (mamba)", "no snapshots", "cannot roll back",
                   "without --draft"):
        assert needle in message


def test_recurrent_draft_is_refused_before_making_a_cache(smollm2_path, mamba_path, no_context):
    # Same tokenizer: the draft passes the vocabulary check, so it is the rollback check that refuses it.
    check_draft_compatible(smollm2_path, mamba_path)
    with pytest.raises(UnsupportedModelError) as err:
        Engine.load(smollm2_path, mamba_path)
    message = str(err.value)
    assert "\n" not in message
    for needle in ("draft random-mamba-tiny", "recurrent model (mamba)", "cannot roll back", "transformer"):
        assert needle in message


def test_plain_decoding_on_a_recurrent_model_works(mamba_path):
    engine = Engine.load(mamba_path, n_ctx=256)
    try:
        opts = GenerateOptions(max_tokens=6)
        first = engine.generate("Once upon a time", opts).run()
        assert first.finish_reason in ("length", "stop") and first.tokens
        assert first.stats.drafted == 0 and first.stats.steps >= len(first.tokens)
        # Another prompt shares only a prefix with the cache, which a recurrent state cannot cut back
        # to: it is decoded afresh, and the first prompt then gives the same greedy tokens again.
        other = engine.generate("Once upon a hill", opts).run()
        assert other.tokens and other.tokens != first.tokens
        again = engine.generate("Once upon a time", opts).run()
        assert again.tokens == first.tokens
    finally:
        engine.close()


def test_cli_refuses_speculation_on_a_recurrent_model_in_one_line(mamba_path):
    proc = localspec("generate", str(mamba_path), "--draft", "ngram", "-p", "hi")
    assert_clean_error(proc, "recurrent model (mamba)", "cannot roll back", "without --draft")
    assert proc.stdout == ""


def test_cli_plain_decoding_on_a_recurrent_model(mamba_path):
    proc = localspec("generate", str(mamba_path), "-p", "hi", "--max-tokens", "4")
    assert proc.returncode == 0, proc.stderr
    assert "tok/s" in proc.stderr
