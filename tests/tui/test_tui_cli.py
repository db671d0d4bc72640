"""``localspec run``: argument handling, errors before the app starts, and a smoke run in a real terminal (tmux)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

import localspec.cli
from localspec.commands import run as run_command
from localspec.history import Session, SessionMessage, list_sessions, load_session, save_session
from tui_support import Tmux, localspec_command


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):  # type: ignore[no-untyped-def]
    """``localspec.cli.main`` with the data dir in tmp_path, as if run in a terminal."""
    monkeypatch.setenv("LOCALSPEC_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setattr(run_command, "needs_terminal", lambda: None)
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


@pytest.mark.parametrize("layout", ["data is a file", "sessions is a file", "data under a file"])
def test_an_unusable_data_folder_is_one_line(cli, capsys: pytest.CaptureFixture[str], tmp_path: Path,  # type: ignore[no-untyped-def]
                                            monkeypatch: pytest.MonkeyPatch, layout: str) -> None:
    """Issue 41: history.SessionLock.acquire ended `localspec run` with a traceback."""
    data = tmp_path / "data"
    if layout == "data is a file":
        data.write_text("x")
        blamed = data
    elif layout == "sessions is a file":
        data.mkdir()
        (data / "sessions").write_text("x")
        blamed = data / "sessions"
    else:
        (tmp_path / "file").write_text("x")
        monkeypatch.setenv("LOCALSPEC_DATA_DIR", str(tmp_path / "file" / "data"))
        blamed = tmp_path / "file"
    assert cli(["run", "/no/such/model.gguf"]) == 2
    line = one_error_line(capsys)
    assert "cannot keep the chat history in" in line and f"{blamed} is a file, not a folder" in line, line
    assert "LOCALSPEC_DATA_DIR" in line


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

        exit_signal = unsaved_error = None

        def __init__(self, engine, opts, *, session, system, placement, session_lock):  # type: ignore[no-untyped-def]
            seen.update(drafters=engine.drafter_names(), opts=opts, session=session, system=system,
                        placement=placement)
            self.session = session

        def run(self) -> None:
            seen["ran"] = True

        def wait_for_engine(self) -> bool:
            return True

    monkeypatch.setattr(localspec_tui.app, "LocalspecApp", FakeApp)
    code = cli(["run", str(smollm2_path), "--draft", str(smollm2_q4_0_path), "--ctx", "256",
                "--system", "Be brief.", "--max-tokens", "7", "--resume"])
    assert code == 0 and seen["ran"]
    # The model-free drafters come along for the app's switch; the replies start on the draft model.
    assert seen["drafters"] == ["draft,ngram,lookahead", "draft", "ngram", "lookahead"]
    assert seen["opts"].drafter == "draft" and seen["system"] == "Be brief."
    assert seen["opts"].max_tokens == 7
    assert seen["session"].id == session.id and seen["session"].messages[0].content == "earlier"
    assert seen["placement"].n_ctx == 256  # --ctx as given (and no GPU plan on a CPU build)


# --- a real terminal ------------------------------------------------------------
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


# --- --resume brings back the models the chat was held with ---------------------------------------
class FakeEngine:
    """What `run` needs of an engine before the app starts."""

    pair_notice = ""  # a draft of the target's own vocabulary: no notice

    def chat_tokens(self, messages: list[dict[str, str]]) -> list[int]:
        return [1]

    def close(self) -> None:
        pass


@pytest.fixture
def started(cli, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:  # type: ignore[no-untyped-def]
    """Each `run` that reached the app: what Engine.load got and what the app was handed."""
    import localspec.backend
    import localspec.engine
    import localspec_tui.app

    runs: list[dict[str, Any]] = []

    def fake_load(cls: Any, target: Any, draft: Any = None, **kwargs: Any) -> FakeEngine:
        runs.append({"target": target, "draft": draft, **kwargs})
        return FakeEngine()

    class FakeApp:
        return_code = 0

        exit_signal = unsaved_error = None

        def __init__(self, engine, opts, *, session, system, placement, session_lock):  # type: ignore[no-untyped-def]
            assert session_lock.held and session_lock.session_id == session.id
            runs[-1].update(session=session, placement=placement)
            self.session = session

        def run(self) -> None:
            pass

        def wait_for_engine(self) -> bool:
            return True

    monkeypatch.setattr(localspec.engine.Engine, "load", classmethod(fake_load))
    monkeypatch.setattr(localspec_tui.app, "LocalspecApp", FakeApp)
    monkeypatch.setattr(localspec.backend, "gpu_offload_supported", lambda: False)
    return runs


def saved_chat(tmp_path: Path, model: str | None, draft: str | None) -> Session:
    session = Session(model=model, draft=draft)
    session.messages.append(SessionMessage("user", "earlier"))
    save_session(session, tmp_path / "data" / "sessions")
    return session


def test_a_new_chat_saves_the_models_so_they_resolve_again(cli, started: list[dict[str, Any]],  # type: ignore[no-untyped-def]
                                                          tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "a.gguf").write_bytes(b"GGUF")
    monkeypatch.chdir(tmp_path)
    assert cli(["run", "a.gguf", "--draft", "a.gguf,ngram"]) == 0
    session = started[0]["session"]
    assert (session.model, session.draft) == (str(tmp_path / "a.gguf"), f"{tmp_path / 'a.gguf'},ngram")
    assert started[0]["placement"].n_gpu_layers == 0 and started[0]["n_ctx"] == 4096
    assert cli(["run", "a.gguf", "--draft", "off"]) == 0
    assert started[1]["session"].draft == "off" and started[1]["specs"] == []


def test_resume_without_model_continues_on_the_saved_models(cli, started: list[dict[str, Any]],  # type: ignore[no-untyped-def]
                                                           tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    from localspec.drafting.specs import DrafterSpec

    saved, draft = tmp_path / "saved.gguf", tmp_path / "draft.gguf"
    saved.write_bytes(b"GGUF")
    draft.write_bytes(b"GGUF")
    session = saved_chat(tmp_path, str(saved), f"{draft},lookahead")
    assert cli(["run", "--resume"]) == 0
    run = started[0]
    # (ngram comes along for the app's drafter switch.)
    assert (run["target"], run["draft"], run["specs"]) == (saved, draft,
                                                           [DrafterSpec("lookahead"), DrafterSpec("ngram")])
    assert run["session"].id == session.id and run["session"].messages[0].content == "earlier"
    assert capsys.readouterr().err == ""
    # --draft given: it wins over the saved drafters.
    assert cli(["run", "--resume", "--draft", "ngram"]) == 0
    assert (started[1]["draft"], started[1]["specs"]) == (None, [DrafterSpec("ngram"), DrafterSpec("lookahead")])


def test_resume_with_another_model_says_so(cli, started: list[dict[str, Any]], tmp_path: Path,  # type: ignore[no-untyped-def]
                                           capsys: pytest.CaptureFixture[str]) -> None:
    from localspec.drafting.specs import DrafterSpec

    saved, other = tmp_path / "saved.gguf", tmp_path / "other.gguf"
    for path in (saved, other):
        path.write_bytes(b"GGUF")
    session = saved_chat(tmp_path, str(saved), str(saved))
    assert cli(["run", str(other), "--resume"]) == 0
    assert capsys.readouterr().err == (
        f"localspec: session {session.id} was held with {saved}; the chat continues on {other}\n")
    # The saved draft belonged to the other model: the default drafter instead; the chat now records `other`.
    assert (started[0]["target"], started[0]["draft"], started[0]["specs"]) == (other, None, [DrafterSpec("ngram"), DrafterSpec("lookahead")])
    assert started[0]["session"].model == str(other) and started[0]["session"].messages[0].content == "earlier"
    # The same model named again: no remark, and its saved draft comes back.
    assert cli(["run", str(saved), "--resume"]) == 0
    assert capsys.readouterr().err == "" and started[1]["draft"] == saved


def test_resume_by_registry_name(cli, started: list[dict[str, Any]], tmp_path: Path,  # type: ignore[no-untyped-def]
                                 smollm2_path: Path) -> None:
    saved_chat(tmp_path, "smollm2-135m", "ngram")
    assert cli(["run", "--resume", "--offline"]) == 0
    assert started[0]["target"].name == smollm2_path.name and started[0]["session"].model == "smollm2-135m"


def test_resume_of_a_model_that_no_longer_resolves_is_one_line(cli, started: list[dict[str, Any]],  # type: ignore[no-untyped-def]
                                                              tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    session = saved_chat(tmp_path, "SmolLM2 135M Instruct", None)  # what older versions saved: general.name
    assert cli(["run", "--resume"]) == 2
    assert one_error_line(capsys) == (
        f"localspec: error: --resume: session {session.id} was held with model 'SmolLM2 135M Instruct', which is "
        "neither a name from `localspec models` nor a file here; pass MODEL to continue the chat with another one")
    gone = tmp_path / "gone.gguf"
    gone.write_bytes(b"GGUF")
    session = saved_chat(tmp_path, str(gone), f"{tmp_path / 'deleted.gguf'}")
    assert cli(["run", "--resume", session.id]) == 2
    assert "was held with draft" in one_error_line(capsys) and started == []


def test_run_without_a_terminal_says_so_in_one_line(tmp_path: Path, smollm2_path: Path) -> None:
    """`localspec run </dev/null >/dev/null` wrote escape codes until killed."""
    import os
    import subprocess

    from localspec.history import sessions_dir  # noqa: F401 - the data dir is the env's

    env = {**os.environ, "LOCALSPEC_DATA_DIR": str(tmp_path / "data")}
    for stdin, stdout in ((subprocess.DEVNULL, subprocess.DEVNULL), (subprocess.DEVNULL, None), (None, subprocess.PIPE)):
        proc = subprocess.run([*localspec_command(), "run", str(smollm2_path)], stdin=stdin, stdout=stdout,
                              stderr=subprocess.PIPE, text=True, timeout=120, env=env)
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("localspec: error: localspec run is a chat app and "
                                                       "needs a terminal"), proc.stderr
        assert "\x1b" not in proc.stderr and not (proc.stdout or "")


def test_a_second_run_on_an_open_chat_is_refused_in_one_line(tmp_path: Path, smollm2_path: Path) -> None:
    """Two `localspec run --resume=ID`: the second one refuses before loading anything (last writer won)."""
    import os
    import pty
    import subprocess

    from localspec.history import SessionLock

    data = tmp_path / "data"
    session = Session()
    session.messages.append(SessionMessage("user", "earlier"))
    save_session(session, data / "sessions")
    held = SessionLock.acquire(session.id, data / "sessions")  # the first app
    try:
        leader, follower = pty.openpty()  # a terminal, so only the lock can refuse
        try:
            proc = subprocess.run([*localspec_command(), "run", str(smollm2_path), f"--resume={session.id}"],
                                  stdin=follower, stdout=follower, stderr=subprocess.PIPE, text=True, timeout=120,
                                  env={**os.environ, "LOCALSPEC_DATA_DIR": str(data)})
        finally:
            os.close(follower)
            os.close(leader)
        assert proc.returncode == 2
        assert proc.stderr.splitlines() == [
            f"localspec: error: session {session.id} is open in another `localspec run` (pid {os.getpid()}); "
            "close that one first, or run without --resume to start a new chat"]
    finally:
        held.release()
    assert [m.content for m in load_session(session.id, data / "sessions").messages] == ["earlier"]
