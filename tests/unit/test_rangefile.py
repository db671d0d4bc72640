"""HttpRangeFile: a file read by HTTP range requests, against an in-process mock server."""

from __future__ import annotations

import re
from collections.abc import Callable

import httpx2
import pytest

from localspec.errors import DownloadError
from localspec.models.rangefile import HttpRangeFile

DATA = bytes(range(256)) * 40  # 10,240 bytes
BLOCK = 1000


def served(data: bytes = DATA, *, status: Callable[[int], int] = lambda n: 206,
           seen: list[str] | None = None) -> httpx2.Client:
    """A client whose server answers ranges of ``data``; ``status(n)`` picks the status of request n."""
    log = seen if seen is not None else []

    def handle(request: httpx2.Request) -> httpx2.Response:
        log.append(request.headers.get("range", ""))
        code = status(len(log))
        if code == 200:
            return httpx2.Response(200, content=data)
        if code != 206:
            return httpx2.Response(code, content=b"busy")
        start, end = map(int, re.fullmatch(r"bytes=(\d+)-(\d+)", request.headers["range"]).groups())  # type: ignore[union-attr]
        return httpx2.Response(206, content=data[start:end + 1],
                               headers={"Content-Range": f"bytes {start}-{end}/{len(data)}"})

    return httpx2.Client(transport=httpx2.MockTransport(handle))


def open_file(client: httpx2.Client, size: int = len(DATA)) -> HttpRangeFile:
    return HttpRangeFile("http://hub.test/blob", size, name="org/repo/model.gguf", client=client, block=BLOCK)


def test_reads_fetch_whole_blocks_once_and_runs_of_them_together() -> None:
    seen: list[str] = []
    f = open_file(served(seen=seen))
    assert f.read(10) == DATA[:10]
    assert f.seek(2500) == 2500 and f.read(1000) == DATA[2500:3500]  # blocks 2 and 3, one request
    f.seek(5)
    assert f.read(3000) == DATA[5:3005]  # block 1 only is new
    assert seen == ["bytes=0-999", "bytes=2000-3999", "bytes=1000-1999"]
    f.seek(-40, 2)
    assert f.read() == DATA[-40:] and f.read() == b"" and seen[-1] == "bytes=10000-10239"
    assert f.requests == 4 and f.tell() == len(DATA)


def test_a_server_that_ignores_ranges_is_refused() -> None:
    f = open_file(served(status=lambda n: 200))
    with pytest.raises(DownloadError, match=r"hub\.test ignores byte ranges, so the header of org/repo/model\.gguf "
                                            r"cannot be read without downloading the whole file"):
        f.read(10)


def test_a_busy_server_is_asked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("localspec.models.rangefile.time.sleep", lambda s: None)
    f = open_file(served(status=lambda n: 503 if n == 1 else 206))
    assert f.read(10) == DATA[:10] and f.requests == 2
    always = open_file(served(status=lambda n: 503))
    with pytest.raises(DownloadError, match="hub.test answered HTTP 503 to a range request for org/repo/model.gguf"):
        always.read(10)
    assert always.requests == 3


def test_a_short_answer_and_a_dead_connection_are_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("localspec.models.rangefile.time.sleep", lambda s: None)
    liar = open_file(served(), size=len(DATA) + 500)  # the server has fewer bytes than announced
    liar.seek(10_000)
    with pytest.raises(DownloadError, match=r"sent 240 bytes of org/repo/model\.gguf where 740 were asked for"):
        liar.read(700)

    def refuse(request: httpx2.Request) -> httpx2.Response:
        raise httpx2.ConnectError("connection refused")

    dead = HttpRangeFile("http://hub.test/blob", 100, name="m.gguf", block=BLOCK,
                         client=httpx2.Client(transport=httpx2.MockTransport(refuse)),
                         on_error=lambda err: DownloadError(f"mapped: {err}"))
    with pytest.raises(DownloadError, match="mapped: connection refused"):
        dead.read(1)
    assert dead.requests == 3
