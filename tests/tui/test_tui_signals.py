"""`localspec run` in a real terminal (tmux), ended by a real signal in the middle of a reply: the chat on disk
holds the message and the partial reply, and `--resume` reopens that chat."""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from localspec.history import Session, latest_session, list_sessions, load_session, save_session
from tui_support import Tmux, localspec_command, wait_for_exit

pytestmark = [
    pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux (apt-get install -y tmux)"),
]

STORY = "Write a long story about a dragon who learns to cook."
# A system prompt that is not UTF-8, as a shell hands it over: the byte 0xff.
BAD_SYSTEM = "--system \"$(printf 'Be brief \\377')\""


def start(tmp_path: Path, smollm2_path: Path, *extra: str) -> tuple[Tmux, int]:
    """The app in a fresh terminal, on the target alone; its process id once the app shows."""
    pid_file = tmp_path / f"pid-{time.monotonic_ns()}"
    env = {"LOCALSPEC_DATA_DIR": str(tmp_path / "data"), "TERM": "xterm-256color", "PYTHONUNBUFFERED": "1"}
    tmux = Tmux([*localspec_command(), "run", str(smollm2_path), "--draft", "off", "--ctx", "1024",
                 "--max-tokens", "1000", "--threads", "1", *extra], env,
                args=BAD_SYSTEM if "--resume" not in extra else "", pid_file=pid_file)
    tmux.wait_for(r"\^q Quit", timeout_s=300)
    return tmux, int(pid_file.read_text())


@pytest.mark.parametrize("how", ["SIGTERM", "terminal closed"])
def test_a_signal_mid_reply_saves_the_partial_reply_and_resume_reopens_it(tmp_path: Path, smollm2_path: Path,
                                                                          how: str) -> None:
    sessions = tmp_path / "data" / "sessions"
    tmux, pid = start(tmp_path, smollm2_path)
    try:
        tmux.wait_for(r"plain \d+\.\d tok/s")  # the startup baseline is done: the reply starts at once
        tmux.keys(STORY, "Enter")
        # Mid-reply: tokens are counted and the reply is still streaming.
        tmux.wait_for(r"τ tokens/step +\d\.\d\d +[1-9]\d* tokens", "generating")
        if how == "SIGTERM":
            os.kill(pid, signal.SIGTERM)
            screen = tmux.wait_for("EXIT=", timeout_s=60)
            assert "EXIT=143" in screen and "Traceback" not in screen, screen
            assert "localspec: stopped by SIGTERM; the chat is saved as session" in screen, screen
        else:
            tmux.close()  # the terminal goes away: the app gets SIGHUP and has no screen to restore
            wait_for_exit(pid)
    finally:
        tmux.close()

    (info,) = list_sessions(sessions)
    saved = load_session(info.id, sessions)
    assert saved.system == "Be brief \ufffd"
    user, reply = saved.messages
    assert (user.role, user.content) == ("user", STORY)
    assert (reply.role, reply.finish_reason) == ("assistant", "interrupted") and reply.content.strip()
    assert reply.stats is not None and 0 < reply.stats["tokens"] < 1000

    # What an older localspec wrote after ctrl+n: a newer chat with nothing in it. --resume passes over it.
    save_session(Session(), sessions)
    assert latest_session(sessions) is not None and latest_session(sessions).id == saved.id  # type: ignore[union-attr]
    tmux, pid = start(tmp_path, smollm2_path, "--resume")
    try:
        first_words = reply.content.strip().split("\n")[0][:20]
        screen = tmux.wait_for("Write a long story", r"\[interrupted\]", timeout_s=120)
        assert first_words in screen, (first_words, screen)
        assert "Be brief" in screen  # the system prompt came back too
        tmux.keys("C-q")
        screen = tmux.wait_for("EXIT=", timeout_s=60)
        assert "EXIT=0" in screen and "Traceback" not in screen, screen
    finally:
        tmux.close()
    after = load_session(saved.id, sessions)
    assert [(m.role, m.content, m.finish_reason) for m in after.messages] == [
        (m.role, m.content, m.finish_reason) for m in saved.messages]
