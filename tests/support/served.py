"""Driving a real ``localspec serve`` process: start it, ask it, read its metrics, stop it.

The server is started as a user starts it (``--port 0``; the URL is read from its stderr line), so
the CLI, uvicorn, the app and the engine are all under test; its stderr is collected to check that
no traceback ever reaches the console.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

API_KEY = "sk-test-0123456789"
START_TIMEOUT_S = 240  # a cold start measures the costs the controller plans with (once per model and build)


@dataclass
class Served:
    """A running server: its process, its URLs and everything it wrote to stderr so far."""

    proc: subprocess.Popen[str]
    root: str  # http://127.0.0.1:PORT
    port: int
    model_id: str
    api_key: str | None
    lines: list[str] = field(default_factory=list)

    @property
    def base_url(self) -> str:
        return self.root + "/v1"

    def stderr(self) -> str:
        return "".join(self.lines)

    def rss_kib(self) -> int:
        """The server process's resident memory."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS in /proc/PID/status")

    def client(self, **kw: Any) -> Any:
        """The official OpenAI client, pointed at this server (no retries: a 503 must be seen)."""
        import openai

        kw.setdefault("api_key", self.api_key or "none")
        return openai.OpenAI(base_url=self.base_url, max_retries=0, timeout=120, **kw)

    def request(self, method: str, path: str, body: object = None, *, key: str | None = "default",
                headers: dict[str, str] | None = None, timeout: float = 120) -> "Answer":
        """One raw HTTP request (stdlib http.client), the body read whole: ``body`` as bytes, or as JSON;
        ``key`` None sends no Authorization header, "default" the server's key."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            all_headers = {"Content-Type": "application/json", **(headers or {})}
            key = self.api_key if key == "default" else key
            if key is not None:
                all_headers["Authorization"] = f"Bearer {key}"
            data = body if body is None or isinstance(body, bytes) else json.dumps(body).encode()
            conn.request(method, path, body=data, headers=all_headers)
            response = conn.getresponse()
            return Answer(response.status, {k.lower(): v for k, v in response.getheaders()}, response.read())
        finally:
            conn.close()


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    def events(self) -> list[str]:
        """The ``data:`` payloads of a server-sent-event body, in order."""
        return [line[len("data: "):] for line in self.body.decode().split("\n") if line.startswith("data: ")]


def start_server(*args: str, api_key: str | None = API_KEY, env: dict[str, str] | None = None) -> Served:
    """``localspec serve ARGS --port 0`` in a child process, once it says where it serves."""
    command = [sys.executable, "-m", "localspec", "serve", *args, "--port", "0"]
    if api_key is not None:
        command += ["--api-key", api_key]
    proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONUNBUFFERED": "1", "LOCALSPEC_NO_HISTORY": "1",
                                            **(env or {})})
    lines: list[str] = []
    ready = threading.Event()

    def drain() -> None:  # keeps the pipe from filling, and keeps every line for the checks
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if "localspec: serving " in line:
                ready.set()
        ready.set()

    threading.Thread(target=drain, daemon=True).start()
    if not ready.wait(START_TIMEOUT_S) or proc.poll() is not None:
        proc.kill()
        raise AssertionError(f"the server did not start: {''.join(lines)}")
    line = next(ln for ln in lines if "localspec: serving " in ln)
    model_id = line.split("localspec: serving ", 1)[1].split(" at ", 1)[0]
    url = line.split(" at ", 1)[1].split(" ", 1)[0]
    root = url.removesuffix("/v1")
    return Served(proc, root, int(root.rsplit(":", 1)[1]), model_id, api_key, lines)


def stop_server(served: Served, timeout: float = 60) -> int:
    """Ctrl-C, as a user stops it; the exit code (a server that does not stop is killed, and fails)."""
    if served.proc.poll() is None:
        served.proc.send_signal(signal.SIGINT)
    try:
        return served.proc.wait(timeout)
    except subprocess.TimeoutExpired:
        served.proc.kill()
        raise AssertionError("the server did not stop within a minute of Ctrl-C") from None


def wait_until(check: Any, timeout: float = 30, every: float = 0.2) -> Any:
    """``check()`` once it is truthy (or the last falsy value after ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(every)


def metric(served: Served, name: str, **labels: str) -> float:
    """One sample of ``GET /metrics``, parsed by prometheus-client's own parser (0 when absent)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = served.request("GET", "/metrics").body.decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return 0.0
