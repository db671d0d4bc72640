"""Drafts of another tokenizer through the real CLI (issue 43): registry names of two families draft by text
with one notice line, and `localspec doctor --draft` says which kind of pair it is and what that costs.

SmolLM2-135M and Gemma 3 270M are a real cross-tokenizer pair; SmolLM2 requantized to Q4_0 shares
SmolLM2's vocabulary.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PROMPT = "The capital of France is Paris. The capital of Germany is"


def localspec(*args: str, config: Path | None = None, env: dict[str, str] | None = None,
              timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "LOCALSPEC_NO_HISTORY": "1", **(env or {})}
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


def pair_line(proc: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("pair ")]
    assert len(lines) == 1, proc.stdout + proc.stderr
    return lines[0].removeprefix("pair").lstrip()


def test_doctor_says_which_kind_of_pair_and_what_it_costs(smollm2_path: Path, gemma_path: Path) -> None:
    """Issue 43 item 3: `doctor --draft` names the pair kind from the GGUF headers and what it costs: Gemma
    drafts for SmolLM2 by text."""
    from localspec.drafting.by_text import TEXT_PAIR_COST

    proc = localspec("doctor", "--model", str(smollm2_path), "--draft", str(gemma_path), "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["pair"] == {"draft": gemma_path.name, "kind": "another tokenizer, drafting by text",
                                               "cost": TEXT_PAIR_COST, "better": None, "problem": None,
                                               "unchecked": None}


def test_doctor_judges_registry_names_before_any_download(tmp_path: Path) -> None:
    """Registry names resolve as `generate --draft` resolves them. With the target not downloaded (no
    self-test runs) the registry's families judge the pair: the same family shares the vocabulary; another
    drafts by text and is told the target's own-family draft would likely be better; an assistant of
    another family cannot run (exit 1); an unknown name is the usual one-line error."""
    empty_hf = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    same = localspec("doctor", "--model", "qwen3-8b", "--draft", "qwen3-0.6b", env=empty_hf)
    assert same.returncode == 0, same.stderr
    assert pair_line(same) == ("qwen3-0.6b for qwen3-8b: same vocabulary (token ids shared: verified by id with the "
                               "draft's probabilities, no re-encoding); from the registry's families, since qwen3-8b "
                               "is not downloaded (`localspec pull qwen3-8b`)")
    by_text = localspec("doctor", "--model", "qwen3-8b", "--draft", "smollm2-135m", env=empty_hf)
    assert by_text.returncode == 0, by_text.stderr
    assert pair_line(by_text).startswith("smollm2-135m for qwen3-8b: another tokenizer, drafting by text (")
    assert pair_line(by_text).endswith("; --draft qwen3-0.6b, of qwen3-8b's own family, would likely be better; "
                                       "from the registry's families, since qwen3-8b is not downloaded "
                                       "(`localspec pull qwen3-8b`)")
    refused = localspec("doctor", "--model", "qwen3-8b", "--draft", "gemma4-e2b-assistant", "--json", env=empty_hf)
    assert refused.returncode == 1, refused.stderr
    assert json.loads(refused.stdout)["pair"]["problem"].startswith(
        "gemma4-e2b-assistant cannot draft for qwen3-8b: it reads its target's cache")
    unknown = localspec("doctor", "--draft", "gemma3-270x")
    assert unknown.returncode == 2 and unknown.stdout == ""
    assert unknown.stderr.startswith("localspec: error: unknown model 'gemma3-270x'")
    assert not (tmp_path / "hf").exists()  # nothing was fetched


@pytest.mark.parametrize(("model", "problem"), [
    ("none", "its GGUF carries no tokenizer, so its tokenizer cannot be loaded"),
    ("llama", "its SPM tokenizer has no byte-level fallback (no <0x00>..<0xFF> tokens), so it cannot encode every text"),
    ("bert", "its WPM tokenizer has no byte-level fallback (no <0x00>..<0xFF> tokens), so it cannot encode every text"),
])
def test_a_draft_that_cannot_draft_by_text_is_one_line_before_generation(model: str, problem: str, tmp_path: Path,
                                                                         smollm2_path: Path) -> None:
    """Issue 43 item 5: a draft of another vocabulary whose tokenizer cannot be loaded, or cannot encode every
    text, is refused from the headers in one line, before any weights load (the file has none to load)."""
    from vocab_gguf import VOCAB, write_vocab_gguf

    draft = write_vocab_gguf(tmp_path / f"{model}.gguf", VOCAB, model=model)
    proc = localspec("generate", str(smollm2_path), "--draft", str(draft), "-p", "hi", "--max-tokens", "4")
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    assert proc.stderr.splitlines() == [
        f"localspec: error: draft {model} has another vocabulary than target {smollm2_path.stem}, and it cannot draft "
        f"by text: the draft {model}: {problem}; pick a draft from the target's own family"]
