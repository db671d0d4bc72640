"""`localspec serve` as a user starts it: what it refuses in one line before loading anything, the
serve extra kept out of the engine, the key from the environment, and a clean stop on Ctrl-C."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys

import pytest
from served import start_server, stop_server

pytestmark = pytest.mark.timeout(240)


def serve(*args: str, env: dict[str, str] | None = None, code: str | None = None) -> subprocess.CompletedProcess:
    """``localspec serve ARGS`` (or ``code`` run in its place) in a child process; no model is loaded
    by any of the refusals below, so each takes a second."""
    command = [sys.executable, "-c", code] if code else [sys.executable, "-m", "localspec", "serve", *args]
    clean = {k: v for k, v in os.environ.items() if k != "LOCALSPEC_API_KEY"}
    return subprocess.run(command, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
                          env={**clean, "PYTHONUNBUFFERED": "1", "LOCALSPEC_NO_HISTORY": "1", **(env or {})})


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("localspec: error: "), proc.stderr
    return lines[0]


def test_a_host_beyond_this_machine_needs_a_key() -> None:
    line = one_error_line(serve("--host", "0.0.0.0"))
    assert "--api-key" in line and "LOCALSPEC_API_KEY" in line and "--insecure" in line


def test_an_empty_key_is_refused() -> None:
    assert "empty" in one_error_line(serve("--api-key", ""))
    assert "LOCALSPEC_API_KEY is empty" in one_error_line(serve(env={"LOCALSPEC_API_KEY": " "}))


@pytest.mark.parametrize("args,word", [(("--port", "70000"), "--port"), (("--queue", "-1"), "--queue"),
                                       (("--draft-max", "99"), "--draft-max"), (("--ctx", "4"), "--ctx"),
                                       (("--draft", "ngrma"), "ngram")])
def test_bad_options_are_one_line(args: tuple[str, ...], word: str) -> None:
    assert word in one_error_line(serve(*args))


def test_a_port_in_use_is_one_line_before_any_model_loads() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        line = one_error_line(serve("--port", str(port)))
    assert f"cannot listen on 127.0.0.1:{port}" in line and "--port" in line


def test_without_the_serve_extra_it_says_what_to_install() -> None:
    code = ("import sys; sys.modules['uvicorn'] = None; sys.argv = ['localspec', 'serve']\n"
            "from localspec.cli import main; sys.exit(main())")
    line = one_error_line(serve(code=code))
    assert "uvicorn" in line and "pip install 'localspec[serve]'" in line


def test_the_engine_imports_no_web_framework() -> None:
    code = ("import sys, localspec, localspec.engine, localspec.api, localspec.cli\n"
            "localspec.cli.build_parser()  # every command registered, serve included\n"
            "web = ('starlette', 'uvicorn', 'prometheus_client', 'openai', 'localspec.server')\n"
            "print(' '.join(sorted(m for m in sys.modules if m.startswith(web))))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "", f"importing the engine loaded the web stack: {proc.stdout}"


def test_the_key_from_the_environment_and_a_clean_stop_mid_stream(smollm2_path) -> None:
    served = start_server(str(smollm2_path), "--ctx", "512", "--gpu-layers", "0", "--quiet", api_key=None,
                          env={"LOCALSPEC_API_KEY": "sk-from-env"})
    try:
        assert "API key required" in served.stderr()
        assert served.request("GET", "/v1/models", key=None).status == 401
        assert served.request("GET", "/v1/models", key="sk-from-env").status == 200
        served.api_key = "sk-from-env"
        reply = served.client().completions.create(model=served.model_id, prompt="Hello", max_tokens=3)
        assert reply.usage.completion_tokens <= 3  # type: ignore[union-attr]
        assert "drafters: off" in served.stderr()  # no --draft: plain decoding, as `generate` does
        # Ctrl-C while a long reply streams: it is cut short with an error event, and the server exits.
        conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=60)
        conn.request("POST", "/v1/completions", json.dumps({"prompt": "Once upon a time", "max_tokens": 400,
                                                            "stream": True}).encode(),
                     {"Authorization": "Bearer sk-from-env", "Content-Type": "application/json"})
        stream = conn.getresponse()
        assert stream.readline().startswith(b"data: {")
    finally:
        code = stop_server(served)
    rest = stream.read().decode()
    conn.close()
    assert '"code": "server_stopping"' in rest and rest.endswith("data: [DONE]\n\n")
    assert code == 130, served.stderr()  # as Ctrl-C ends every command
    assert "Traceback" not in served.stderr()
    assert "POST /v1/completions" not in served.stderr()  # --quiet: no request lines
