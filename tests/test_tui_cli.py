"""``localspec run``: argument handling, errors before the app starts, and a smoke run in a real terminal (tmux)."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

import localspec.cli
from localspec.commands import run as run_command
from localspec.history import Session, SessionMessage, list_sessions, load_session, save_session

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):  # type: ignore[no-untyped-def]
    """``localspec.cli.main`` with the data dir in tmp_path."""
    monkeypatch.setenv("LOCALSPEC_DATA_DIR", str(tmp_path / "data"))
    return localspec.cli.main


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    captured = capsys.readouterr()
    lines = [ln for ln in captured.err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    assert lines[0].startswith("localspec: error: ")
    assert captured.out == ""
    return lines[0]


def test_model_errors_are_one_line_before_the_app_starts(cli, capsys: pytest.CaptureFixture[str],  # type: ignore[no-untyped-def]
                                                         tmp_path: Path) -> None:
    assert cli(["run", "/no/such/model.gguf"]) == 2
    assert "model file not found: /no/such/model.gguf" in one_error_line(capsys)
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"this is not a GGUF file at all" * 10)
    assert cli(["run", str(garbage)]) == 2
    assert "garbage.gguf" in one_error_line(capsys)


def test_resume_errors_are_one_line(cli, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    assert cli(["run", "/no/such/model.gguf", "--resume"]) == 2
    assert "no saved chat yet" in one_error_line(capsys)
    sessions = tmp_path / "data" / "sessions"
    good = Session()
    good.messages.append(SessionMessage("user", "hello"))
    save_session(good, sessions)
    assert cli(["run", "/no/such/model.gguf", "--resume", "nosuch"]) == 2
    assert f"no saved session 'nosuch'; recent sessions: {good.id}" in one_error_line(capsys)
    # `--resume MODEL.gguf` means: this model, the latest chat (argparse hands MODEL to the id).
    assert cli(["run", "--resume", "/no/such/model.gguf"]) == 2
    assert "model file not found: /no/such/model.gguf" in one_error_line(capsys)
    (sessions / f"{good.id}.json").write_text("{not json")
    assert cli(["run", "/no/such/model.gguf", "--resume"]) == 2
    line = one_error_line(capsys)
    assert "corrupt" in line and str(sessions / f"{good.id}.json") in line


def test_default_model_is_the_bundled_smollm2_with_ngram(smollm2_path: Path, tmp_path: Path) -> None:
    from localspec.drafting.specs import DrafterSpec

    target, draft, specs = run_command.resolve_models(None, None)
    assert target.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and target.stat().st_size == smollm2_path.stat().st_size
    assert draft is None and specs == [DrafterSpec("ngram")]
    assert run_command.resolve_models(None, "off")[1:] == (None, [])
    other = tmp_path / "d.gguf"
    other.write_bytes(b"")
    assert run_command.resolve_models(None, str(other))[1:] == (other, [])


def test_help_lists_the_options(cli, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit):
        cli(["run", "--help"])
    out = capsys.readouterr().out
    for option in ("--draft", "--system", "--resume", "--max-tokens", "--temp", "--draft-max", "--ctx"):
        assert option in out


@pytest.mark.slow
def test_run_loads_the_engine_then_hands_the_app_the_resumed_session(
        cli, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, smollm2_path: Path,  # type: ignore[no-untyped-def]
        smollm2_q4_0_path: Path) -> None:
    import localspec_tui.app

    session = Session()
    session.messages.append(SessionMessage("user", "earlier"))
    save_session(session, tmp_path / "data" / "sessions")
    seen: dict[str, Any] = {}

    class FakeApp:
        return_code = 0

        def __init__(self, engine, opts, *, session, system):  # type: ignore[no-untyped-def]
            seen.update(drafters=engine.drafter_names(), opts=opts, session=session, system=system)

        def run(self) -> None:
            seen["ran"] = True

        def wait_for_engine(self) -> bool:
            return True

    monkeypatch.setattr(localspec_tui.app, "LocalspecApp", FakeApp)
    code = cli(["run", str(smollm2_path), "--draft", str(smollm2_q4_0_path), "--ctx", "256",
                "--system", "Be brief.", "--max-tokens", "7", "--resume"])
    assert code == 0 and seen["ran"]
    assert seen["drafters"] == ["draft"] and seen["system"] == "Be brief."
    assert seen["opts"].max_tokens == 7
    assert seen["session"].id == session.id and seen["session"].messages[0].content == "earlier"


# --- a real terminal ------------------------------------------------------------
def localspec_command() -> list[str]:
    """How a user starts localspec."""
    return [sys.executable, "-m", "localspec"]


class Tmux:
    """A detached tmux session running one command; the pane stays open after it exits."""

    def __init__(self, command: list[str], env: dict[str, str]) -> None:
        # A private server (-L): another tmux user's clients or options cannot resize this window.
        self.name = f"localspec-test-{uuid.uuid4().hex[:8]}"
        self.tmux = ["tmux", "-L", self.name, "-f", "/dev/null"]
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        shell = f"cd {shlex.quote(str(REPO))} && env {exports} {shlex.join(command)}; echo EXIT=$?; sleep 600"
        subprocess.run([*self.tmux, "new-session", "-d", "-s", self.name, "-x", "150", "-y", "45", shell],
                       check=True)

    def screen(self) -> str:
        return subprocess.run([*self.tmux, "capture-pane", "-p", "-t", self.name], capture_output=True,
                              text=True, check=True).stdout

    def keys(self, *keys: str) -> None:
        subprocess.run([*self.tmux, "send-keys", "-t", self.name, *keys], check=True)

    def wait_for(self, *patterns: str, timeout_s: float = 300.0) -> str:
        """The screen once every regular expression in ``patterns`` matches it."""
        deadline = time.monotonic() + timeout_s
        while True:
            screen = self.screen()
            if all(re.search(p, screen) for p in patterns):
                return screen
            if time.monotonic() > deadline:
                raise AssertionError(f"never saw {patterns} on screen:\n{screen}")
            time.sleep(0.5)

    def close(self) -> None:
        subprocess.run([*self.tmux, "kill-server"], capture_output=True)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux (apt-get install -y tmux)")
def test_smoke_in_a_real_terminal(tmp_path: Path, smollm2_path: Path, smollm2_q4_0_path: Path) -> None:
    data = tmp_path / "data"
    env = {"LOCALSPEC_DATA_DIR": str(data), "TERM": "xterm-256color", "PYTHONUNBUFFERED": "1"}
    tmux = Tmux([*localspec_command(), "run", str(smollm2_path), "--draft", str(smollm2_q4_0_path),
                 "--ctx", "1024", "--max-tokens", "8", "--threads", "1"], env)
    try:
        tmux.wait_for(r"\^q Quit", "esc Stop reply", r"\^o Drafter", "Acceptance by draft position")
        tmux.wait_for(r"plain \d+\.\d tok/s")  # the startup baseline has been measured
        tmux.keys("Name a fruit.", "Enter")
        screen = tmux.wait_for("Name a fruit.", r"τ tokens/step +\d\.\d\d +[1-9]\d* tokens", r"speedup \d",
                               "last reply")
        assert "Traceback" not in screen
        tmux.keys("C-q")
        screen = tmux.wait_for("EXIT=", timeout_s=60)
        assert "EXIT=0" in screen, screen
    finally:
        tmux.close()
    (info,) = list_sessions(data / "sessions")
    saved = load_session(info.id, data / "sessions")
    assert [m.role for m in saved.messages] == ["user", "assistant"]
    assert saved.messages[0].content == "Name a fruit." and saved.messages[1].content.strip()
