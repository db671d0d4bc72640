"""`localspec run --rpc` in a real terminal (tmux): a server killed mid-reply ends the app with the one line,
the terminal given back and the chat saved (the reply so far marked interrupted), ready for `--resume`."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from localspec.history import list_sessions, load_session
from tests.support.rpc_servers import RpcServer, rpc_server_binary
from tui_support import Tmux, localspec_command

pytestmark = [
    pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux (apt-get install -y tmux)"),
]

STORY = "Write a long story about a dragon who learns to cook."


def test_a_server_lost_mid_reply_saves_the_chat_and_says_so(tmp_path: Path, smollm2_path: Path) -> None:
    binary = rpc_server_binary()
    servers = [RpcServer(binary, tmp_path) for _ in range(2)]
    sessions = tmp_path / "data" / "sessions"
    env = {"LOCALSPEC_DATA_DIR": str(tmp_path / "data"), "TERM": "xterm-256color", "PYTHONUNBUFFERED": "1"}
    pid_file = tmp_path / f"pid-{time.monotonic_ns()}"
    tmux = Tmux([*localspec_command(), "run", str(smollm2_path), "--draft", "off", "--ctx", "1024", "--max-tokens",
                 "1000", "--threads", "1", "--rpc", ",".join(s.endpoint for s in servers), "--gpu-layers", "20"],
                env, pid_file=pid_file)
    try:
        tmux.wait_for(r"\^q Quit", timeout_s=300)
        tmux.wait_for(r"plain \d+\.\d tok/s")  # the startup baseline is done: the reply starts at once
        tmux.keys(STORY, "Enter")
        tmux.wait_for(r"τ tokens/step +\d\.\d\d +[1-9]\d* tokens", "generating")
        servers[1].kill()
        screen = tmux.wait_for("EXIT=", timeout_s=120)
        assert "EXIT=2" in screen and "Traceback" not in screen, screen
        line = " ".join(screen.split())  # the terminal wraps the line
        assert f"localspec: error: RPC server {servers[1].endpoint} went away mid-reply" in line, screen
        assert "the chat is saved as session" in line and "localspec run --resume" in line, screen
    finally:
        tmux.close()
        for server in servers:
            server.stop()
    (info,) = list_sessions(sessions)
    user, reply = load_session(info.id, sessions).messages
    assert (user.role, user.content) == ("user", STORY)
    assert (reply.role, reply.finish_reason) == ("assistant", "interrupted") and reply.content.strip()
