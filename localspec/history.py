"""Chat history: each chat session is one JSON file, rewritten atomically after every change.

Layout: ``<data dir>/sessions/<id>.json`` where the data dir is
``$LOCALSPEC_DATA_DIR``, else ``$XDG_DATA_HOME/localspec``, else
``~/.local/share/localspec``. A session file is replaced with ``os.replace``
after its new contents were fsynced to a temporary file in the same folder, so
a crash mid-write leaves the previous version intact, never a truncated file.

This module is UI-free: the TUI and any other front end use it the same way.
"""

from __future__ import annotations

import datetime
import fcntl
import json
import os
import re
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localspec.paths import atomic_write, data_dir
from localspec.errors import LocalspecError, shown
from localspec.events import GenerationStats

FORMAT = 1
"""Version of the session file layout; bumped if a field changes meaning."""

_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_SURROGATE_RE = re.compile("[\ud800-\udfff]")
"""A lone surrogate: what Python makes of bytes that were not UTF-8."""


class SessionError(LocalspecError):
    """A saved chat session is missing, unreadable or corrupt."""


def sessions_dir() -> Path:
    return data_dir() / "sessions"


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def new_session_id() -> str:
    """Sortable by creation time, unique without coordination: ``20250131-142502-3fa2c1``."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{secrets.token_hex(3)}"


def valid_text(text: str) -> tuple[str, bool]:
    """``text`` with whatever was not UTF-8 replaced by U+FFFD, and whether anything was.

    Python hands undecodable bytes (in argv, a pasted terminal byte, a ``\\udcff`` escape in JSON)
    over as lone surrogates, which neither llama.cpp's tokenizer nor a UTF-8 file can take. Those
    that stand for bytes (``surrogateescape``) are turned back into the bytes and decoded as
    ``bytes.decode(errors="replace")`` does; other surrogates are paired where they pair, and
    each one that does not becomes U+FFFD.
    """
    if not _SURROGATE_RE.search(text):
        return text, False
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace"), True
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace"), True


def stats_summary(stats: GenerationStats, drafter: str | None) -> dict[str, Any]:
    """The few numbers worth keeping with a reply (the full stats are per-step noise)."""
    return {
        "drafter": drafter,
        "tokens": stats.tokens,
        "steps": stats.steps,
        "drafted": stats.drafted,
        "accepted": stats.accepted,
        "acceptance_rate": round(stats.acceptance_rate, 4),
        "tokens_per_step": round(stats.tokens_per_step, 4),
        "tokens_per_second": round(stats.tokens_per_second, 3),
        "elapsed_s": round(stats.elapsed_s, 4),
    }


@dataclass
class SessionMessage:
    """One chat turn. ``finish_reason`` and ``stats`` are set for assistant replies only."""

    role: str
    content: str
    finish_reason: str | None = None
    stats: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.finish_reason is not None:
            out["finish_reason"] = self.finish_reason
        if self.stats is not None:
            out["stats"] = self.stats
        return out


@dataclass
class Session:
    """A chat session: its messages, its system prompt and the models it was held with."""

    id: str = field(default_factory=new_session_id)
    system: str | None = None
    model: str | None = None
    draft: str | None = None
    created: str = field(default_factory=_now)
    updated: str = field(default_factory=_now)
    messages: list[SessionMessage] = field(default_factory=list)

    def take_unanswered(self) -> str | None:
        """Make the turns alternate again after a reply was lost; the unanswered message, if one was.

        A reply is saved on every way out of the app, but a killed process (SIGKILL, power loss)
        or an older localspec can leave a user turn without its reply (or with an empty one, marked
        cancelled or interrupted, which is dropped). User turns in a row are
        merged into one (a blank line between them: the model answered them together); a final
        user turn is taken out and returned, so that the app can offer it again in the input box.
        """
        merged: list[SessionMessage] = []
        for m in self.messages:
            if m.role == "assistant" and not m.content and m.finish_reason in ("cancelled", "interrupted"):
                continue  # an empty reply an older version saved when stopped while reading the prompt
            if merged and m.role == "user" and merged[-1].role == "user":
                merged[-1] = SessionMessage("user", f"{merged[-1].content}\n\n{m.content}")
            else:
                merged.append(m)
        self.messages = merged
        if merged and merged[-1].role == "user":
            return self.messages.pop().content
        return None

    def chat_messages(self) -> list[dict[str, str]]:
        """The conversation as the engine's chat template wants it (system prompt first)."""
        out = [{"role": "system", "content": self.system}] if self.system else []
        out.extend({"role": m.role, "content": m.content} for m in self.messages)
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT, "id": self.id, "created": self.created, "updated": self.updated,
            "model": self.model, "draft": self.draft, "system": self.system,
            "messages": [m.to_json() for m in self.messages],
        }

    @classmethod
    def from_json(cls, data: Any) -> "Session":
        """Parse a session file's object; raises ValueError/TypeError/KeyError on a bad shape."""
        if not isinstance(data, dict):
            raise ValueError("the top level is not an object")
        if data.get("format") != FORMAT:
            raise ValueError(f"unknown format {data.get('format')!r} (this localspec reads {FORMAT})")
        messages = []
        for m in data["messages"]:
            if not isinstance(m, dict) or not isinstance(m["role"], str) or not isinstance(m["content"], str):
                raise ValueError("a message lacks a string role or content")
            messages.append(SessionMessage(m["role"], m["content"], m.get("finish_reason"), m.get("stats")))
        session_id = data["id"]
        if not isinstance(session_id, str) or not _ID_RE.match(session_id):
            raise ValueError(f"bad id {session_id!r}")
        return cls(id=session_id, system=data.get("system"), model=data.get("model"), draft=data.get("draft"),
                   created=str(data.get("created", "")), updated=str(data.get("updated", "")),
                   messages=messages)


@dataclass(frozen=True)
class SessionInfo:
    """A saved session as listed (the file is not parsed)."""

    id: str
    path: Path
    modified_ns: int


def session_path(session_id: str, directory: Path | None = None) -> Path:
    if not _ID_RE.match(session_id):
        raise SessionError(f"{shown(session_id)} is not a session id; ids look like 20250131-142502-3fa2c1")
    return (directory or sessions_dir()) / f"{session_id}.json"


def _unusable_folder(folder: Path, err: OSError) -> str:
    """One line for a chat history folder that cannot take a file."""
    why = err.strerror or str(err)
    for part in (folder, *folder.parents):  # a file where a folder should be: name it
        if part.exists() or part.is_symlink():
            if not part.is_dir():
                why = f"{part} is a file, not a folder"
            break
    return (f"cannot keep the chat history in {folder}: {why}; make it a folder you can write, "
            "or set LOCALSPEC_DATA_DIR to one")


class SessionLock:
    """One app's hold on a session: ``<id>.lock`` beside its file, locked with ``flock`` and holding
    the holder's pid (for the message). Two apps on one chat would each save their own list of turns,
    and the last writer would drop the other's; the second one is refused instead.

    The kernel drops an ``flock`` when its process dies, however it dies, so a lock left by a dead
    process is simply taken over. ``release`` removes the file while still holding it, and ``acquire``
    checks that the file it locked is still the one at the path, so a release racing an acquire
    cannot leave two holders.
    """

    def __init__(self, session_id: str, path: Path, fd: int) -> None:
        self.session_id, self.path, self._fd = session_id, path, fd

    @classmethod
    def acquire(cls, session_id: str, directory: Path | None = None) -> "SessionLock":
        """Hold ``session_id``; SessionError (one line, naming the other process) when another holds it."""
        path = session_path(session_id, directory).with_suffix(".lock")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:  # LOCALSPEC_DATA_DIR a file, or not writable; `sessions` a file
            raise SessionError(_unusable_folder(path.parent, err)) from None
        while True:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            except OSError as err:
                raise SessionError(_unusable_folder(path.parent, err)) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_pid(fd)
                os.close(fd)
                who = f" (pid {holder})" if holder else ""
                raise SessionError(
                    f"session {session_id} is open in another `localspec run`{who}; close that one first, "
                    "or run without --resume to start a new chat"
                ) from None
            try:
                same = os.fstat(fd).st_ino == os.stat(path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)  # the holder released (and removed) it meanwhile: lock the new file
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        return cls(session_id, path, fd)

    def release(self) -> None:
        """Let another app open the session (idempotent)."""
        if self._fd < 0:
            return
        try:
            self.path.unlink()
        except OSError:
            pass
        os.close(self._fd)
        self._fd = -1

    @property
    def held(self) -> bool:
        return self._fd >= 0

    def __del__(self) -> None:  # an app dropped without ending lets go of its chat
        try:
            self.release()
        except Exception:
            pass


def _read_pid(fd: int) -> int | None:
    try:
        return int(os.pread(fd, 32, 0).decode().strip() or "0") or None
    except (OSError, ValueError):
        return None


def save_session(session: Session, directory: Path | None = None) -> Path:
    """Write ``session`` atomically (temp file in the same folder, fsync, os.replace); returns its path.

    Either the old file or the complete new one is on disk at every moment.
    """
    path = session_path(session.id, directory)
    session.updated = _now()
    # The app cleans what it is given (and says so); this only keeps a stray surrogate from failing the save.
    data = valid_text(json.dumps(session.to_json(), ensure_ascii=False, indent=1))[0].encode("utf-8")
    with atomic_write(path) as f:
        f.write(data)
    return path


def remove_session(session_id: str, directory: Path | None = None) -> bool:
    """Delete the file of ``session_id`` (a chat whose last message was taken back); False if there was none."""
    try:
        session_path(session_id, directory).unlink()
    except FileNotFoundError:
        return False
    return True


def list_sessions(directory: Path | None = None) -> list[SessionInfo]:
    """Saved sessions, most recently written first. Leftover temp files are ignored."""
    folder = directory or sessions_dir()
    if not folder.is_dir():
        return []
    found = []
    for path in folder.glob("*.json"):
        if path.name.startswith(".") or not _ID_RE.match(path.stem):
            continue
        try:
            found.append(SessionInfo(path.stem, path, path.stat().st_mtime_ns))
        except FileNotFoundError:  # removed while we looked
            continue
    # Ids start with their creation time, so they break ties between equal mtimes.
    found.sort(key=lambda s: (s.modified_ns, s.id), reverse=True)
    return found


def load_session(session_id: str, directory: Path | None = None) -> Session:
    """The saved session ``session_id``; SessionError if it is missing or its file is corrupt."""
    path = session_path(session_id, directory)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        known = [s.id for s in list_sessions(directory)[:5]]
        hint = f"recent sessions: {', '.join(known)}" if known else f"there are no saved sessions in {path.parent}"
        raise SessionError(f"no saved session {session_id!r}; {hint}") from None
    except OSError as err:
        raise SessionError(f"cannot read session file {path}: {err.strerror}") from None
    try:
        session = Session.from_json(json.loads(raw.decode("utf-8")))
    except (ValueError, TypeError, KeyError) as err:
        detail = f"missing field {err}" if isinstance(err, KeyError) else str(err).splitlines()[0]
        raise SessionError(
            f"session file {path} is corrupt ({detail}); move it aside to start afresh"
        ) from None
    if session.id != session_id:
        raise SessionError(f"session file {path} is corrupt (it holds session {session.id!r})")
    return session


def latest_session(directory: Path | None = None) -> Session | None:
    """The most recently written session that holds a message, or None when there is none.

    A session with no messages (written by an older localspec after ctrl+n) is skipped: it is no
    chat to continue. A corrupt file met on the way is an error (SessionError), not skipped,
    so that a chat is never silently passed over.
    """
    for info in list_sessions(directory):
        session = load_session(info.id, directory)
        if session.messages:
            return session
    return None
