"""Chat history: atomic writes, clear errors for broken files, listing and the latest session."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from localspec import history, paths  # noqa: F401 - history used below; paths.os is where writes happen
from localspec.errors import LocalspecError
from localspec.events import DrafterStats, GenerationStats
from localspec.history import (
    Session,
    SessionError,
    SessionMessage,
    latest_session,
    list_sessions,
    load_session,
    remove_session,
    save_session,
    stats_summary,
    valid_text,
)


def make_session(*turns: str) -> Session:
    s = Session(system="be brief", model="target", draft="draft")
    for i, text in enumerate(turns):
        s.messages.append(SessionMessage("user" if i % 2 == 0 else "assistant", text))
    return s


def test_round_trip_keeps_roles_content_finish_reason_and_stats(tmp_path: Path) -> None:
    stats = GenerationStats(tokens=10, steps=4, drafted=12, accepted=6, elapsed_s=0.5,
                            drafters=(DrafterStats("draft", 4, 12, 6),))
    s = make_session("hi")
    s.messages.append(SessionMessage("assistant", "héllo ✓", "cancelled", stats_summary(stats, "draft")))
    save_session(s, tmp_path)
    back = load_session(s.id, tmp_path)
    assert back.messages == s.messages
    assert back.system == "be brief" and back.model == "target" and back.draft == "draft"
    reply = back.messages[-1]
    assert reply.finish_reason == "cancelled"
    assert reply.stats == {"drafter": "draft", "tokens": 10, "steps": 4, "drafted": 12, "accepted": 6,
                           "acceptance_rate": 0.5, "tokens_per_step": 2.5, "tokens_per_second": 20.0,
                           "elapsed_s": 0.5}
    assert back.chat_messages() == [{"role": "system", "content": "be brief"},
                                    {"role": "user", "content": "hi"},
                                    {"role": "assistant", "content": "héllo ✓"}]


def test_data_dir_order(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("LOCALSPEC_DATA_DIR", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert history.sessions_dir() == tmp_path / "xdg" / "localspec" / "sessions"
    monkeypatch.setenv("LOCALSPEC_DATA_DIR", str(tmp_path / "own"))
    assert history.sessions_dir() == tmp_path / "own" / "sessions"
    monkeypatch.delenv("LOCALSPEC_DATA_DIR")
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert history.sessions_dir() == tmp_path / "home" / ".local" / "share" / "localspec" / "sessions"


def test_default_directory_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LOCALSPEC_DATA_DIR", str(tmp_path))
    s = make_session("hello")
    path = save_session(s)
    assert path == tmp_path / "sessions" / f"{s.id}.json"
    assert latest_session().id == s.id


@pytest.mark.parametrize("fail_at", ["write", "fsync", "replace"])
def test_a_crash_mid_write_leaves_the_previous_file_intact(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                          fail_at: str) -> None:
    s = make_session("first")
    path = save_session(s, tmp_path)
    before = path.read_bytes()
    s.messages.append(SessionMessage("assistant", "second " * 1000))

    class Crash(Exception):
        pass

    def crash(*args: object, **kwargs: object) -> None:
        raise Crash

    if fail_at == "write":
        # The new contents are half written when the process "dies".
        real_fdopen = os.fdopen

        def half_writer(fd: int, mode: str = "r", *a: object, **k: object):
            f = real_fdopen(fd, mode, *a, **k)
            real_write = f.write

            def write(data: bytes) -> int:
                real_write(data[: len(data) // 2])
                f.flush()
                raise Crash
            f.write = write  # type: ignore[method-assign]
            return f
        monkeypatch.setattr(paths.os, "fdopen", half_writer)
    else:
        monkeypatch.setattr(paths.os, fail_at, crash)
    with pytest.raises(Crash):
        save_session(s, tmp_path)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert [m.content for m in load_session(s.id, tmp_path).messages] == ["first"]
    # The temporary file is cleaned up (and would be ignored by listing if a real crash left it).
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def test_leftover_temp_files_are_ignored(tmp_path: Path) -> None:
    s = make_session("x")
    save_session(s, tmp_path)
    (tmp_path / f".{s.id}.abc123.tmp").write_text("{half")
    assert [i.id for i in list_sessions(tmp_path)] == [s.id]


def test_corrupt_file_gives_a_clear_error_naming_the_file(tmp_path: Path) -> None:
    s = make_session("x")
    path = save_session(s, tmp_path)
    path.write_text('{"format": 1, "id": "' + s.id + '", "messages": [')
    with pytest.raises(SessionError) as info:
        load_session(s.id, tmp_path)
    assert isinstance(info.value, LocalspecError)
    message = str(info.value)
    assert str(path) in message and "corrupt" in message and "\n" not in message


@pytest.mark.parametrize("content", [
    b"\xff\xfe not utf-8",
    b"[]",
    b'{"format": 99, "id": "x", "messages": []}',
    b'{"format": 1, "messages": []}',
    b'{"format": 1, "id": "ID", "messages": [{"role": "user"}]}',
    b'{"format": 1, "id": "ID", "messages": [{"role": 1, "content": "x"}]}',
    b'{"format": 1, "id": "someone-else", "messages": []}',
])
def test_malformed_sessions_are_reported_as_corrupt(tmp_path: Path, content: bytes) -> None:
    sid = "20250101-000000-aaaaaa"
    (tmp_path / f"{sid}.json").write_bytes(content.replace(b"ID", sid.encode()))
    with pytest.raises(SessionError, match="corrupt"):
        load_session(sid, tmp_path)


def test_missing_session_lists_what_exists(tmp_path: Path) -> None:
    s = make_session("x")
    save_session(s, tmp_path)
    with pytest.raises(SessionError, match=f"no saved session 'nope'.*{s.id}"):
        load_session("nope", tmp_path)
    with pytest.raises(SessionError, match="not a session id"):
        load_session("../etc/passwd", tmp_path)
    with pytest.raises(SessionError) as info:  # a long text (a prompt typed after --resume) is cut
        load_session("x" * 3000, tmp_path)
    assert "(3,000 characters) is not a session id" in str(info.value) and len(str(info.value)) < 200


def test_listing_and_latest(tmp_path: Path) -> None:
    assert list_sessions(tmp_path / "missing") == []
    assert latest_session(tmp_path) is None
    first, second = make_session("a"), make_session("b")
    save_session(first, tmp_path)
    save_session(second, tmp_path)
    os.utime(tmp_path / f"{first.id}.json", ns=(1_000_000_000, 1_000_000_000))
    assert [i.id for i in list_sessions(tmp_path)] == [second.id, first.id]
    assert latest_session(tmp_path).id == second.id
    # Writing the older session again makes it the latest.
    first.messages.append(SessionMessage("assistant", "reply"))
    save_session(first, tmp_path)
    assert latest_session(tmp_path).id == first.id
    assert json.loads((tmp_path / f"{first.id}.json").read_text())["messages"][-1]["content"] == "reply"


def test_latest_skips_chats_without_messages(tmp_path: Path) -> None:
    # What an older localspec left after ctrl+n: a newer session with nothing said in it.
    chat, empty = make_session("a", "b"), Session(system="be brief")
    save_session(chat, tmp_path)
    save_session(empty, tmp_path)
    os.utime(tmp_path / f"{chat.id}.json", ns=(1_000_000_000, 1_000_000_000))
    assert list_sessions(tmp_path)[0].id == empty.id
    latest = latest_session(tmp_path)
    assert latest is not None and latest.id == chat.id
    assert remove_session(chat.id, tmp_path) and not remove_session(chat.id, tmp_path)
    assert latest_session(tmp_path) is None  # only the empty one is left: no chat to continue


def test_latest_does_not_pass_over_a_corrupt_newer_file(tmp_path: Path) -> None:
    chat, broken = make_session("a"), make_session("b")
    save_session(chat, tmp_path)
    path = save_session(broken, tmp_path)
    os.utime(tmp_path / f"{chat.id}.json", ns=(1_000_000_000, 1_000_000_000))
    path.write_text("{half")
    with pytest.raises(SessionError, match="corrupt"):
        latest_session(tmp_path)


@pytest.mark.parametrize(("turns", "kept", "unanswered"), [
    (("q1", "a1"), ["user:q1", "assistant:a1"], None),
    (("q1", "a1", "q2"), ["user:q1", "assistant:a1"], "q2"),
    (("q1",), [], "q1"),
    ((), [], None),
])
def test_an_unanswered_last_message_is_taken_out(turns: tuple[str, ...], kept: list[str],
                                                 unanswered: str | None) -> None:
    s = make_session(*turns)
    assert s.take_unanswered() == unanswered
    assert [f"{m.role}:{m.content}" for m in s.messages] == kept
    assert s.take_unanswered() is None  # nothing more to take


def test_user_turns_in_a_row_are_merged() -> None:
    # An older localspec lost a reply, then the next message was saved after the unanswered one.
    s = Session()
    for role, text in [("user", "q1"), ("user", "q1 again"), ("assistant", "a1"), ("user", "q2"),
                       ("assistant", "a2"), ("user", "q3"), ("user", "q4")]:
        s.messages.append(SessionMessage(role, text))
    assert s.take_unanswered() == "q3\n\nq4"
    assert [(m.role, m.content) for m in s.messages] == [
        ("user", "q1\n\nq1 again"), ("assistant", "a1"), ("user", "q2"), ("assistant", "a2")]


@pytest.mark.parametrize(("text", "expected", "changed"), [
    ("plain ✓", "plain ✓", False),
    ("Be brief \udcff", "Be brief \ufffd", True),      # a byte that was not UTF-8 (surrogateescape, argv)
    ("caf\udcc3\udca9", "café", True),                 # escaped bytes that are UTF-8 after all
    ("a\ud800b", "a\ufffdb", True),                    # a lone surrogate from a JSON escape
    ("\ud83d\ude00", "\U0001f600", True),               # a pair that pairs
    ("x\udcff\ud800", "x\ufffd\ufffd", True),
])
def test_valid_text_replaces_what_is_not_utf8(text: str, expected: str, changed: bool) -> None:
    assert valid_text(text) == (expected, changed)
    expected.encode("utf-8")  # never raises


def test_a_session_holding_a_lone_surrogate_still_saves(tmp_path: Path) -> None:
    s = make_session("hello \udcff")
    s.system = "Be brief \ud800"
    save_session(s, tmp_path)
    back = load_session(s.id, tmp_path)
    assert back.messages[0].content == "hello \ufffd" and back.system == "Be brief \ufffd"


# --- one app per session ---------------------------------------------------------
def test_a_session_is_held_by_one_app_at_a_time(tmp_path: Path) -> None:
    from localspec.history import SessionLock

    first = SessionLock.acquire("20250131-142502-3fa2c1", tmp_path)
    with pytest.raises(SessionError, match=rf"open in another `localspec run` \(pid {os.getpid()}\)"):
        SessionLock.acquire("20250131-142502-3fa2c1", tmp_path)
    other = SessionLock.acquire("20250131-142502-aaaaaa", tmp_path)  # another chat is free
    first.release()
    first.release()  # idempotent
    assert not first.held and not (tmp_path / "20250131-142502-3fa2c1.lock").exists()
    again = SessionLock.acquire("20250131-142502-3fa2c1", tmp_path)
    assert again.held
    again.release()
    other.release()


def test_the_lock_of_a_process_that_died_is_taken_over(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys

    from localspec.history import SessionLock

    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; from localspec.history import "
         "SessionLock; lock = SessionLock.acquire('s1', Path(sys.argv[1])); print('held', flush=True); time.sleep(60)",
         str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(SessionError, match=rf"pid {holder.pid}"):
            SessionLock.acquire("s1", tmp_path)
        holder.send_signal(signal.SIGKILL)  # dies without releasing: its lock file stays behind
        holder.wait(10)
        assert (tmp_path / "s1.lock").exists()
        lock = SessionLock.acquire("s1", tmp_path)
        assert (tmp_path / "s1.lock").read_text().strip() == str(os.getpid())
        lock.release()
    finally:
        holder.kill()
        holder.wait(10)
