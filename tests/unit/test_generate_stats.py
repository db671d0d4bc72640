"""`localspec generate`'s statistics lines: one name per quantity, no infinity, no context past full."""

from __future__ import annotations

from localspec.commands.generate import format_stats
from localspec.events import GenerationStats


def stats(**kw) -> GenerationStats:
    base = dict(prompt_tokens=4, tokens=12, steps=10, elapsed_s=1.0, n_ctx=256)
    base.update(kw)
    return GenerationStats(**base)


def test_the_two_alphas_have_different_names():
    """Issue 33: "acceptance 0.17" stood next to "α 0.20 per position reached"."""
    # 6 steps drafting 3 each (18 drafted, 3 kept); position 0 reached 6 times, kept 2; position 1 reached 2, kept 1.
    s = stats(drafted=18, accepted=3, position_drafted=(6, 2, 1), position_accepted=(2, 1, 0))
    text = format_stats(s, "length")
    assert "drafts: 3 of 18 drafted tokens kept (17%)" in text
    assert "α 0.33 (a token kept when every token before it was)" in text  # 3 of 9 reached
    assert "α by position: 0.33 0.50 0.00" in text
    assert "ceiling 1/(1−α) = 1.50" in text
    assert "acceptance 3/18" not in text and "per position reached" not in text


def test_no_infinity_when_every_draft_token_was_kept():
    s = stats(drafted=8, accepted=8, position_drafted=(4, 4), position_accepted=(4, 4))
    text = format_stats(s, "length")
    assert "no ceiling (α = 1)" in text
    assert "inf" not in text


def test_a_full_context_is_not_reported_past_its_size():
    """Issue 33: --max-tokens 300 --ctx 256 reported "context 257 of 256 tokens used"."""
    text = format_stats(stats(prompt_tokens=3, tokens=254), "context")
    assert "the context of 256 tokens is full" in text and "257" not in text
    assert "context 16 of 256 tokens used" in format_stats(stats(prompt_tokens=4, tokens=12), "length")
    assert "of 256 tokens used" in format_stats(stats(prompt_tokens=3, tokens=254), "length")
    assert "257 of 256" not in format_stats(stats(prompt_tokens=3, tokens=254), "length")
