"""A file on an HTTP server, read by range requests: only the blocks that are read are fetched.

``localspec plan`` reads a GGUF header (metadata, tokenizer, tensor table: a few MB at the
start of a multi-gigabyte file) this way, so planning a model needs no download.
"""

from __future__ import annotations

import io
import os
import time
from typing import Callable, Mapping
from urllib.parse import urlsplit

import httpx2

from localspec.errors import DownloadError

BLOCK = 1 << 20
_RETRY_STATUS = (429, 500, 502, 503, 504)
_ATTEMPTS = 3


class HttpRangeFile(io.RawIOBase):
    """The ``size`` bytes at ``url`` as a read-only, seekable binary file.

    Reads fetch whole ``block``-sized pieces with ``Range: bytes=A-B`` GETs through ``client``
    (consecutive missing blocks in one request) and keep every fetched block for the object's
    life, so bytes read twice are fetched once. A server that ignores the range (answers 200
    instead of 206) is refused before its body is read. A dropped connection or a 5xx/429 answer
    is retried twice; then a transport error goes through ``on_error``, which maps it to the
    caller's own one-line error (``DownloadError`` by default). ``name`` names the file in
    messages; ``requests`` counts the GETs sent.
    """

    def __init__(self, url: str, size: int, *, name: str, client: httpx2.Client,
                 headers: Mapping[str, str] | None = None, block: int = BLOCK, timeout: float = 10.0,
                 on_error: Callable[[Exception], BaseException] | None = None) -> None:
        super().__init__()
        self.url, self.size, self.name, self.block = url, size, name, block
        self.requests = 0
        self._client, self._headers, self._timeout = client, dict(headers or {}), timeout
        self._on_error = on_error or (lambda err: DownloadError(
            f"reading {name} from {server_name(url)} failed ({type(err).__name__}: {err}); check your connection"))
        self._blocks: dict[int, bytes] = {}
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: self.size}[whence]
        if base + offset < 0:
            raise ValueError(f"negative seek position {base + offset}")
        self._pos = base + offset
        return self._pos

    def read(self, n: int = -1) -> bytes:
        """Up to ``n`` bytes from the current position (all the rest when ``n`` < 0)."""
        end = self.size if n < 0 else min(self.size, self._pos + n)
        if end <= self._pos:
            return b""
        first, last = self._pos // self.block, (end - 1) // self.block
        self._fetch_missing(first, last)
        data = b"".join(self._blocks[i] for i in range(first, last + 1))
        offset = self._pos - first * self.block
        out = data[offset:offset + end - self._pos]
        self._pos = end
        return out

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)

    def _fetch_missing(self, first: int, last: int) -> None:
        """Fetch every block in ``[first, last]`` not yet held, one request per run of missing blocks."""
        i = first
        while i <= last:
            if i in self._blocks:
                i += 1
                continue
            j = i
            while j + 1 <= last and j + 1 not in self._blocks:
                j += 1
            self._fetch(i, j)
            i = j + 1

    def _fetch(self, first: int, last: int) -> None:
        start, stop = first * self.block, min(self.size, (last + 1) * self.block)
        data = self._get_range(start, stop)
        for i in range(first, last + 1):
            self._blocks[i] = data[(i - first) * self.block:(i - first + 1) * self.block]

    def _get_range(self, start: int, stop: int) -> bytes:
        """Bytes ``[start, stop)``, retrying a dropped connection or a busy server."""
        headers = {**self._headers, "Range": f"bytes={start}-{stop - 1}"}
        for attempt in range(1, _ATTEMPTS + 1):
            try:
                self.requests += 1
                with self._client.stream("GET", self.url, headers=headers, timeout=self._timeout) as r:
                    if r.status_code in _RETRY_STATUS and attempt < _ATTEMPTS:
                        time.sleep(attempt)
                        continue
                    self._check_status(r.status_code)
                    data = r.read()
            except httpx2.TransportError as err:
                if attempt < _ATTEMPTS:
                    time.sleep(attempt)
                    continue
                raise self._on_error(err) from None
            if len(data) != stop - start:
                raise DownloadError(f"{server_name(self.url)} sent {len(data):,} bytes of {self.name} where "
                                    f"{stop - start:,} were asked for; try again")
            return data
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _check_status(self, status: int) -> None:
        if status == 206:
            return
        host = server_name(self.url)
        if status == 200:
            raise DownloadError(f"{host} ignores byte ranges, so the header of {self.name} cannot be read "
                                "without downloading the whole file; download it first (`localspec pull`)")
        raise DownloadError(f"{host} answered HTTP {status} to a range request for {self.name}; try again "
                            "later, or download the file first (`localspec pull`)")


def server_name(url: str) -> str:
    """The ``host:port`` of ``url`` (the URL itself if it has none), as messages name a server."""
    return urlsplit(url).netloc or url
