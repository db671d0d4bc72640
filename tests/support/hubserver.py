"""A loopback stand-in for the Hugging Face Hub, and a runner for the CLI against it.

``FakeHub`` serves what ``hf_hub_download`` (huggingface_hub 2.4) really asks for:

* ``HEAD``/``GET /{repo}/resolve/{revision}/{file}`` on the hub port. Like the real
  Hub for an LFS file it answers ``302`` to a "CDN" on a second port (another
  origin, so the client reads the metadata from the redirect itself) with
  ``X-Repo-Commit``, ``X-Linked-Etag`` (the sha256) and ``X-Linked-Size``. With
  ``redirect=False`` it serves the bytes itself, with ``ETag`` and
  ``Content-Length``, as the Hub does for small git files.
* ``GET``/``HEAD /blobs/{etag}`` on the CDN port, honouring ``Range: bytes=N-``
  (how the client resumes a broken transfer) and ``Range: bytes=N-M`` (how
  ``localspec plan`` reads a header) with ``206`` and ``Content-Range``.
* The Hub's 404s with ``X-Error-Code`` (RepoNotFound, RevisionNotFound,
  EntryNotFound).

It never sends Xet headers, so the client takes the plain HTTP path. Every request
is recorded. Both servers bind 127.0.0.1 only, serve at most ``max_requests``
requests and stop when the ``with`` block ends.
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import unquote, urlsplit

REPO_ROOT = Path(__file__).resolve().parents[2]
_RANGE_RE = re.compile(r"bytes=(\d+)-(\d*)$")


@dataclass(frozen=True)
class Seen:
    """One request as the server received it."""

    port: str  # "hub" or "cdn"
    method: str
    path: str
    headers: dict[str, str]

    @property
    def range_start(self) -> int | None:
        """The first byte asked for by a ``Range`` header, if there was one."""
        match = _RANGE_RE.match(self.headers.get("range", ""))
        return int(match.group(1)) if match else None

    @property
    def range_end(self) -> int | None:
        """The last byte asked for by a ``Range`` header, if it named one."""
        match = _RANGE_RE.match(self.headers.get("range", ""))
        return int(match.group(2)) if match and match.group(2) else None


@dataclass
class Hosted:
    """A file the fake hub serves."""

    data: bytes
    etag: str  # what the Hub reports as the file's identity: its sha256 for LFS files
    commit: str


@dataclass
class FakeHub:
    """The fake hub's state; use as a context manager to run it."""

    redirect: bool = True
    max_requests: int = 200
    # Cut the first body GET after this many bytes (then serve normally).
    cut_first_body_at: int | None = None
    # Cut every body GET after this many bytes: the network keeps failing mid-download.
    cut_every_body_at: int | None = None
    # Send a body GET's headers, then no byte for this many seconds: a download that stalls at 0 bytes.
    stall_bodies_s: float = 0.0
    files: dict[tuple[str, str, str], Hosted] = field(default_factory=dict)
    _seen: list[Seen] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _servers: list[ThreadingHTTPServer] = field(default_factory=list)
    _cut_done: bool = False

    def add(
        self,
        repo: str,
        filename: str,
        data: bytes,
        *,
        revision: str = "main",
        etag: str | None = None,
        commit: str | None = None,
    ) -> Hosted:
        """Serve ``data`` as ``repo/filename`` at ``revision``; the ETag defaults to its sha256."""
        hosted = Hosted(
            data=data,
            etag=etag or hashlib.sha256(data).hexdigest(),
            commit=commit or hashlib.sha1(f"{repo}@{revision}".encode()).hexdigest(),
        )
        self.files[(repo, revision, filename)] = hosted
        return hosted

    @property
    def endpoint(self) -> str:
        """The value for ``HF_ENDPOINT``."""
        return f"http://127.0.0.1:{self._servers[0].server_address[1]}"

    @property
    def cdn(self) -> str:
        return f"http://127.0.0.1:{self._servers[1].server_address[1]}"

    @property
    def seen(self) -> list[Seen]:
        with self._lock:
            return list(self._seen)

    def body_gets(self) -> list[Seen]:
        """GET requests that would return file bytes (redirects excluded)."""
        return [s for s in self.seen if s.method == "GET" and (s.port == "cdn" or not self.redirect)]

    def clear(self) -> None:
        with self._lock:
            self._seen.clear()

    def __enter__(self) -> FakeHub:
        for port in ("hub", "cdn"):
            server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self, port))
            server.daemon_threads = True
            self._servers.append(server)
            threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        for server in self._servers:
            server.shutdown()
            server.server_close()

    def _record(self, seen: Seen) -> bool:
        """Record a request; ``False`` once the request budget is spent."""
        with self._lock:
            self._seen.append(seen)
            return len(self._seen) <= self.max_requests

    def _take_cut(self) -> int | None:
        with self._lock:
            if self.cut_every_body_at is not None:
                return self.cut_every_body_at
            if self.cut_first_body_at is None or self._cut_done:
                return None
            self._cut_done = True
            return self.cut_first_body_at

    def _find_blob(self, etag: str) -> Hosted | None:
        return next((h for h in self.files.values() if h.etag == etag), None)


def _handler_for(hub: FakeHub, port: str) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = 10  # a stuck client cannot hold a server thread for long

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
            pass  # keep pytest output clean; requests are recorded instead

        def do_HEAD(self) -> None:
            self._serve(body=False)

        def do_GET(self) -> None:
            self._serve(body=True)

        def _serve(self, *, body: bool) -> None:
            seen = Seen(port, self.command, self.path, {k.lower(): v for k, v in self.headers.items()})
            if not hub._record(seen):
                self._plain(503, "request budget spent")
                return
            path = unquote(urlsplit(self.path).path)
            if port == "cdn":
                blob = hub._find_blob(path.removeprefix("/blobs/")) if path.startswith("/blobs/") else None
                if blob is None:
                    self._plain(404, "no such blob")
                else:
                    self._send_bytes(blob, body=body)
                return
            self._resolve(path, body=body)

        def _resolve(self, path: str, *, body: bool) -> None:
            repo, sep, rest = path.lstrip("/").partition("/resolve/")
            revision, _, filename = rest.partition("/")
            if not sep or not filename:
                self._plain(404, "not a resolve URL")
                return
            if not any(r == repo for r, _, _ in hub.files):
                self._plain(404, "Repository not found", {"X-Error-Code": "RepoNotFound"})
                return
            if not any(r == repo and v == revision for r, v, _ in hub.files):
                self._plain(404, "Revision not found", {"X-Error-Code": "RevisionNotFound"})
                return
            hosted = hub.files.get((repo, revision, filename))
            if hosted is None:
                commit = next(h.commit for (r, v, _), h in hub.files.items() if r == repo and v == revision)
                self._plain(404, "Entry not found", {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": commit})
                return
            if hub.redirect:
                self.send_response(302)
                self.send_header("Location", f"{hub.cdn}/blobs/{hosted.etag}")
                self.send_header("X-Repo-Commit", hosted.commit)
                self.send_header("X-Linked-Etag", f'"{hosted.etag}"')
                self.send_header("X-Linked-Size", str(len(hosted.data)))
                # The pointer file's own git ETag: the client must prefer X-Linked-Etag.
                self.send_header("ETag", f'"{hashlib.sha1(hosted.etag.encode()).hexdigest()}"')
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self._send_bytes(hosted, body=body, commit=hosted.commit)

        def _send_bytes(self, hosted: Hosted, *, body: bool, commit: str | None = None) -> None:
            data = hosted.data
            start, stop = 0, len(data)
            match = _RANGE_RE.match(self.headers.get("Range", ""))
            if match:
                start = int(match.group(1))
                if match.group(2):
                    stop = min(stop, int(match.group(2)) + 1)
                if start >= stop:
                    self._plain(416, "range not satisfiable", {"Content-Range": f"bytes */{len(data)}"})
                    return
            self.send_response(206 if match else 200)
            if match:
                self.send_header("Content-Range", f"bytes {start}-{stop - 1}/{len(data)}")
            self.send_header("Content-Length", str(stop - start))
            self.send_header("ETag", f'"{hosted.etag}"')
            self.send_header("Accept-Ranges", "bytes")
            if commit:
                self.send_header("X-Repo-Commit", commit)
            self.end_headers()
            if not body:
                return
            if hub.stall_bodies_s:
                self.wfile.flush()
                time.sleep(hub.stall_bodies_s)
            cut = hub._take_cut()
            if cut is not None:
                # Send part of the body, then end the connection cleanly (FIN, not RST):
                # the client sees a body shorter than Content-Length.
                self.wfile.write(data[start : start + cut])
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_WR)
                self.close_connection = True
                return
            view = memoryview(data)[start:stop]
            try:
                for offset in range(0, len(view), 1 << 20):
                    self.wfile.write(view[offset : offset + (1 << 20)])
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True  # the client gave up (a full disk, an interrupt): its business

        def _plain(self, status: int, text: str, headers: Mapping[str, str] | None = None) -> None:
            payload = text.encode()
            self.send_response(status)
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(payload)

    return Handler


def unused_port() -> int:
    """A loopback port with nothing listening on it (for "the server is down")."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cli_env(tmp: Path, endpoint: str | None = None, **extra: str) -> dict[str, str]:
    """An environment that confines a localspec run to ``tmp``.

    The HF cache, the localspec cache and config dir all live under ``tmp``; no
    token, no telemetry, and ``HF_ENDPOINT`` points at the fake hub.
    """
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("HF_", "HUGGING", "LOCALSPEC_", "XDG_"))
    }
    env.update(
        HF_HOME=str(tmp / "hf"),
        HF_HUB_CACHE=str(tmp / "hf" / "hub"),
        HF_HUB_DISABLE_TELEMETRY="1",
        LOCALSPEC_CONFIG_DIR=str(tmp / "config"),
        LOCALSPEC_CACHE_DIR=str(tmp / "localspec-cache"),
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
    )
    if endpoint is not None:
        env["HF_ENDPOINT"] = endpoint
    env.update(extra)
    return env


def run_localspec(
    args: list[str], env: Mapping[str, str], *, prelude: str = "", timeout: float = 60,
    commands: tuple[str, ...] = ("pull", "models"),
) -> subprocess.CompletedProcess[str]:
    """Run ``localspec ARGS`` in a fresh interpreter (huggingface_hub reads its settings at import).

    ``prelude`` is Python run first, e.g. to simulate a full disk. The CLI's
    ``main`` is used as is; only its command list is set to ``commands``, the ones
    under test, whatever else ``localspec.cli`` lists.
    """
    code = "\n".join(
        [
            "import sys",
            prelude,
            "import localspec.cli as cli",
            f"cli.COMMANDS = {tuple(commands)!r}",
            "sys.exit(cli.main(sys.argv[1:]))",
        ]
    )
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        env=dict(env),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
