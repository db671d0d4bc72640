"""`--help` on every subcommand: it works without a model, and it says how models are named."""

from __future__ import annotations

import re
from pathlib import Path

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


def test_every_subcommand_is_listed_in_the_help_and_the_readme(capsys: pytest.CaptureFixture[str]) -> None:
    """A command added to the CLI shows in `localspec --help` and in the README's commands table."""
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    listed = capsys.readouterr().out
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    for command in cli.COMMANDS:
        assert re.search(rf"^\s+{command}\b", listed, re.M), (command, listed)
        assert f"`localspec {command}" in readme, f"README lacks `localspec {command}`"


@pytest.mark.parametrize("command", ["run", "generate"])
def test_the_drafts_cutoff_is_not_offered_beside_min_p(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    """--draft-p-min (the draft's confidence cut-off) is offered; --p-min, one letter from --min-p
    (sampling), is only a hidden alias that still parses into the same setting."""
    with pytest.raises(SystemExit):
        cli.main([command, "--help"])
    text = capsys.readouterr().out
    assert "--draft-p-min P" in text and "--min-p P" in text
    assert "--p-min" not in text.replace("--draft-p-min", "")
    parser = cli.build_parser()
    assert parser.parse_args([command, "--p-min", "0.4"]).p_min == 0.4
    assert parser.parse_args([command, "--draft-p-min", "0.3"]).p_min == 0.3
    assert parser.parse_args([command]).p_min == 0.0


def test_generate_help_says_system_implies_chat(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["generate", "--help"])
    assert "implies --chat" in " ".join(capsys.readouterr().out.split())
