"""A draft of another vocabulary family is refused from the registry alone (issue 33), before any download."""

from __future__ import annotations

import pytest

from localspec.commands.common import check_registry_pair
from localspec.errors import IncompatibleDraftError, UnsupportedModelError
from localspec.models.registry_file import load_registry


def test_families_that_differ_are_refused_with_a_draft_that_fits():
    registry = load_registry()
    target = registry.resolve("qwen3-8b")
    with pytest.raises(IncompatibleDraftError) as err:
        check_registry_pair(target, registry.resolve("smollm2-135m"), registry)
    best = registry.drafts_for(target.spec)[0].name
    assert str(err.value) == ("smollm2-135m cannot draft for qwen3-8b: their vocabularies differ (SmolLM2 and Qwen3 "
                              "in `localspec models`), so no token could be accepted; use --draft "
                              f"{best} (the Qwen3 family)")


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
