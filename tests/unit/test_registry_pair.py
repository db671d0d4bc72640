"""What the registry alone says of a pair, before any download: a draft model of another vocabulary family
drafts by text (issue 43); a draft that reads its target (an assistant, EAGLE-3, DFlash) of another family,
or such a draft as the model, is refused (issue 33)."""

from __future__ import annotations

import pytest

from localspec.commands.refs import check_registry_pair
from localspec.errors import IncompatibleDraftError, UnsupportedModelError
from localspec.models.registry_file import load_registry


def test_families_that_differ_draft_by_text_and_the_notice_names_the_family_draft():
    """Issue 43: a draft model of another family is no longer refused; it drafts by text, and the notice
    names the draft the registry knows in the target's own family."""
    from localspec.commands.refs import same_family_draft
    from localspec.pairing import text_pair_notice

    registry = load_registry()
    target = registry.resolve("qwen3-8b")
    check_registry_pair(target, registry.resolve("smollm2-135m"), registry)  # no refusal
    best = registry.drafts_for(target.spec)[0].name
    assert same_family_draft(target, registry) == best == "qwen3-0.6b"
    assert text_pair_notice("qwen3-8b", "smollm2-135m", best) == (
        "draft smollm2-135m has another tokenizer than qwen3-8b: it drafts by text (its text re-encoded into "
        "qwen3-8b's tokens each step); --draft qwen3-0.6b, of qwen3-8b's own family, would likely accept more "
        "for less")
    # Without a known draft of its own family (SmolLM2-135M is its family's smallest), the notice says so
    # in general words, and a path target names none.
    assert same_family_draft(registry.resolve("smollm2-135m"), registry) is None
    assert same_family_draft(registry.resolve("/models/mine.gguf"), registry) is None
    assert text_pair_notice("a", "b").endswith("; a draft of a's own family accepts more for less")


@pytest.mark.parametrize(("target", "draft", "reads", "fix"), [
    ("gemma3-4b", "qwen3-4b-dflash", "layers", "--draft gemma3-270m (the Gemma 3 family)"),
    ("smollm2-135m", "gemma4-e2b-assistant", "cache", "--draft ngram, which needs no model"),
])
def test_a_draft_that_reads_a_target_of_another_family_is_still_refused(target, draft, reads, fix):
    """An assistant, EAGLE-3 or DFlash head reads the target's cache or layers: it cannot draft by text."""
    registry = load_registry()
    with pytest.raises(IncompatibleDraftError) as err:
        check_registry_pair(registry.resolve(target), registry.resolve(draft), registry)
    t, d = registry.get(target), registry.get(draft)
    assert str(err.value) == (
        f"{draft} cannot draft for {target}: it reads its target's {reads}, which needs the target's own "
        f"vocabulary, and theirs differ ({registry.family_label(d.family)} and {registry.family_label(t.family)} "
        f"in `localspec models`); use {fix}")


def test_the_same_family_or_a_path_is_left_to_the_header_check(tmp_path):
    registry = load_registry()
    check_registry_pair(registry.resolve("qwen3-8b"), registry.resolve("qwen3-0.6b"), registry)
    check_registry_pair(registry.resolve("qwen3-8b"), registry.resolve(str(tmp_path / "mine.gguf")), registry)
    check_registry_pair(registry.resolve("qwen3-8b"), None, registry)


@pytest.mark.parametrize("name", ["qwen3-4b-dflash", "gemma4-e2b-assistant"])
def test_a_draft_that_reads_its_target_is_refused_as_the_model_before_any_download(name):
    registry = load_registry()
    with pytest.raises(UnsupportedModelError) as err:
        check_registry_pair(registry.resolve(name), None, registry)
    assert str(err.value).startswith(f"{name} is ") and "cannot run alone" in str(err.value)
    assert "as --draft" in str(err.value)


def test_judging_a_pair_from_its_headers_loads_no_llama_cpp() -> None:
    """`doctor --draft` judges the pair in its own process, where a crashing llama.cpp build must never be
    loaded (everything that runs llama.cpp runs in its child)."""
    import subprocess
    import sys

    code = ("import sys, localspec.pairing, localspec.doctor, localspec.commands.doctor; "
            "assert 'llama_cpp' not in sys.modules, 'llama_cpp imported'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
