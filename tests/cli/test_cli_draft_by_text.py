"""Drafts of another tokenizer through the real CLI (issue 43): registry names of two families draft by text
with one notice line, and `localspec doctor --draft` says which kind of pair it is and what that costs.

SmolLM2-135M and Gemma 3 270M are a real cross-tokenizer pair; SmolLM2 requantized to Q4_0 shares
SmolLM2's vocabulary.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

PROMPT = "The capital of France is Paris. The capital of Germany is"


def localspec(*args: str, config: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "LOCALSPEC_NO_HISTORY": "1"}
    if config is not None:
        env["LOCALSPEC_CONFIG_DIR"] = str(config)
    return subprocess.run([sys.executable, "-m", "localspec", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, stdin=subprocess.DEVNULL)


@pytest.fixture
def config_with_a_smollm2_draft(tmp_path: Path, smollm2_q4_0_path: Path, gemma_path: Path) -> Path:
    """A user models.toml that gives smollm2-135m a draft of its own family: the Q4_0 copy. (``gemma_path``:
    gemma3-270m, which the registry fetches from PyPI, is on disk.)"""
    config = tmp_path / "config"
    config.mkdir()
    (config / "models.toml").write_text(
        f'[models.smollm2-q4-0]\nfamily = "smollm2"\nparams = "135M"\ncontext = 8192\n'
        f'path = "{smollm2_q4_0_path}"\n\n[models.smollm2-135m]\ndrafts = ["smollm2-q4-0"]\n', encoding="utf-8")
    return config


def test_registry_names_of_two_families_draft_by_text_with_one_notice(config_with_a_smollm2_draft: Path) -> None:
    """`generate smollm2-135m --draft gemma3-270m` was refused from the registry (their families differ):
    it drafts by text now, says so in one line that names the registry's same-family draft, and the
    greedy reply is plain decoding's."""
    common = ["generate", "smollm2-135m", "-p", PROMPT, "--max-tokens", "12", "--offline", "--threads", "1",
              "--ctx", "512"]
    drafted = localspec(*common, "--draft", "gemma3-270m", "--draft-max", "3", config=config_with_a_smollm2_draft)
    assert drafted.returncode == 0, drafted.stderr
    notices = [ln for ln in drafted.stderr.splitlines() if "another tokenizer than" in ln]
    assert notices == ["localspec: draft gemma3-270m has another tokenizer than smollm2-135m: it drafts by text "
                       "(its text re-encoded into smollm2-135m's tokens each step); --draft smollm2-q4-0, of "
                       "smollm2-135m's own family, would likely accept more for less"], drafted.stderr
    assert "draft model: another tokenizer, drafting by text" in drafted.stderr
    plain = localspec(*common, "--draft", "off", config=config_with_a_smollm2_draft)
    assert plain.returncode == 0, plain.stderr
    assert drafted.stdout == plain.stdout and plain.stdout.strip()
