"""`--help` on every subcommand: it works without a model, and it says how models are named."""

from __future__ import annotations

import re

import pytest

from localspec import cli


@pytest.mark.parametrize("command", cli.COMMANDS)
def test_help_explains_how_models_are_named(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main([command, "--help"])
    assert done.value.code == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    text = " ".join(captured.out.split())  # argparse wraps lines
    assert text.startswith(f"usage: localspec {command}")
    # A model is a name or alias from the registry, or a path to a GGUF file.
    assert "`localspec models`" in text or command == "models"
    assert re.search(r"name (or alias )?(from|listed here).*(a path to a GGUF file|GGUF path)", text), text


def test_every_subcommand_is_covered() -> None:
    assert set(cli.COMMANDS) == {"run", "generate", "bench", "index", "pull", "models", "plan", "doctor"}
