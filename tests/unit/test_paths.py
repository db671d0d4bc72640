"""A path the user asked us to write: checked before the work (paths.output_path), written all or nothing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from localspec import paths
from localspec.errors import OutputPathError
from localspec.paths import atomic_write, output_path


def test_a_symlink_is_written_through_and_kept(tmp_path: Path):
    real = tmp_path / "real.svg"
    real.write_text("old")
    link = tmp_path / "link.svg"
    link.symlink_to(real)
    assert output_path(link) == real
    with atomic_write(link) as f:
        f.write(b"new")
    assert link.is_symlink() and real.read_text() == "new"


def test_a_dangling_symlink_writes_its_target(tmp_path: Path):
    link = tmp_path / "link.svg"
    link.symlink_to(tmp_path / "made.svg")
    assert output_path(link) == tmp_path / "made.svg"
    with atomic_write(link) as f:
        f.write(b"x")
    assert link.is_symlink() and (tmp_path / "made.svg").read_bytes() == b"x"


@pytest.mark.parametrize("make,needle", [
    (lambda p: os.mkfifo(p), "is a FIFO (named pipe), not a regular file"),
    (lambda p: p.mkdir(), "is a folder, not a regular file; name a file inside it"),
    (lambda p: p.symlink_to(p), "is not a usable path: Too many levels of symbolic links"),
])
def test_what_cannot_take_a_file_is_refused_with_the_option_named(tmp_path: Path, make, needle):
    target = tmp_path / "out"
    make(target)
    with pytest.raises(OutputPathError) as err:
        output_path(target, name="--chart out")
    assert str(err.value).startswith("--chart out ") and needle in str(err.value)


def test_a_device_is_refused_and_atomic_write_never_replaces_one():
    with pytest.raises(OutputPathError, match="/dev/null is a device"):
        output_path("/dev/null")
    with pytest.raises(OutputPathError, match="it was left as it is"):
        with atomic_write("/dev/null") as f:
            f.write(b"x")
    assert Path("/dev/null").is_char_device()


def test_a_fifo_is_never_replaced_by_atomic_write(tmp_path: Path):
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    with pytest.raises(OutputPathError):
        with atomic_write(fifo) as f:
            f.write(b"x")
    assert fifo.is_fifo() and os.listdir(tmp_path) == ["f"]  # no temp file left either


def test_missing_and_unwritable_folders_and_files(tmp_path: Path, monkeypatch):
    with pytest.raises(OutputPathError, match="does not exist; create it first"):
        output_path(tmp_path / "no" / "x")
    existing = tmp_path / "x"
    existing.write_text("")
    # Root may write anywhere: stand in for a user without the permission.
    monkeypatch.setattr(paths.os, "access", lambda p, mode: Path(p) != tmp_path)
    with pytest.raises(OutputPathError, match=r"cannot write in the folder .* \(permission denied\)"):
        output_path(existing, name="-o x")
    monkeypatch.setattr(paths.os, "access", lambda p, mode: Path(p) != existing)
    with pytest.raises(OutputPathError, match=r"^-o x is not writable \(permission denied\)"):
        output_path(existing, name="-o x")


def test_a_temp_file_a_killed_writer_left_is_removed_by_the_next_write(tmp_path: Path):
    """Issue 41: a killed `index -o s.lsstore` left a hidden .s.lsstore.*.tmp that nothing removed."""
    import subprocess
    import sys

    from localspec.paths import atomic_write

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    dead_pid = int(dead.stdout)
    store = tmp_path / "s.lsstore"
    stale = tmp_path / f".s.lsstore.{dead_pid}.k2j4h1.tmp"
    live = tmp_path / f".s.lsstore.{os.getpid()}.a8b7c6.tmp"  # a write in progress elsewhere in this process
    foreign = tmp_path / ".s.lsstore.abcdefgh.tmp"  # no pid: an older localspec's, or not ours at all
    other = tmp_path / f".notes.lsstore.{dead_pid}.k2j4h1.tmp"  # beside another file
    for p in (stale, live, foreign, other):
        p.write_bytes(b"half a store")
    with atomic_write(store) as f:
        f.write(b"whole")
    assert store.read_bytes() == b"whole"
    assert not stale.exists() and live.exists() and foreign.exists() and other.exists()
