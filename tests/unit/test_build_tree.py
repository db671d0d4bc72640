"""setup.sh's kept build tree: scripts/sync-tree.py carries freshly patched sources into it, writing only
files whose bytes changed (so only they look newer than what was built from them) and removing whatever
the new sources no longer have; a wrong LOCALSPEC_BUILD_TREE is one line before anything is built."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "sync-tree.py"
OLD = 1_000_000_000  # a modification time long before the sync (2001)


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def _sync(source: Path, dest: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), str(source), str(dest)], capture_output=True, text=True)


def _files(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


def test_only_changed_files_are_written_and_gone_ones_removed(tmp_path: Path) -> None:
    tree = _write(tmp_path / "tree", {"ggml/cuda/a.cu": "kernel a", "ggml/cuda/b.cu": "kernel b",
                                      "ggml/old.c": "dropped", "gone/x.h": "dropped folder", "CMakeLists.txt": "cmake"})
    for p in tree.rglob("*"):
        os.utime(p, (OLD, OLD))
    fresh = _write(tmp_path / "fresh", {"ggml/cuda/a.cu": "kernel a", "ggml/cuda/b.cu": "kernel b, patched",
                                        "ggml/new.c": "added", "CMakeLists.txt": "cmake"})

    done = _sync(fresh, tree)

    assert done.returncode == 0, done.stderr
    assert _files(tree) == _files(fresh)
    assert (tree / "ggml/cuda/a.cu").stat().st_mtime == OLD  # same bytes: untouched, nothing to recompile
    assert (tree / "CMakeLists.txt").stat().st_mtime == OLD
    assert (tree / "ggml/cuda/b.cu").stat().st_mtime > OLD  # patched: newer than its object file
    assert (tree / "ggml/new.c").stat().st_mtime > OLD
    assert not (tree / "gone").exists()
    assert "2 file(s) written, 2 removed" in done.stdout


def test_a_file_that_became_a_folder_and_a_first_sync(tmp_path: Path) -> None:
    tree = _write(tmp_path / "tree", {"src": "a file first"})
    fresh = _write(tmp_path / "fresh", {"src/main.c": "now a folder", "run.sh": "#!/bin/sh\n"})
    (fresh / "run.sh").chmod(0o755)

    assert _sync(fresh, tree).returncode == 0
    assert _files(tree) == _files(fresh)
    assert os.access(tree / "run.sh", os.X_OK)  # the mode comes along

    empty = tmp_path / "new-tree"  # a first build: the tree does not exist yet
    assert _sync(fresh, empty).returncode == 0 and _files(empty) == _files(fresh)


def test_a_source_that_is_not_a_folder_is_one_line(tmp_path: Path) -> None:
    done = _sync(tmp_path / "missing", tmp_path / "tree")
    assert done.returncode == 2
    assert done.stderr.strip() == f"sync-tree.py: {tmp_path / 'missing'} is not a folder"
    assert not (tmp_path / "tree").exists()


def test_setup_refuses_an_unknown_build_tree_setting_in_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "LOCALSPEC_BUILD_TREE": "sometimes", "LOCALSPEC_CUDA": "off", "HOME": str(tmp_path)}
    done = subprocess.run(["bash", str(REPO / "scripts" / "setup.sh")], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip() == "setup.sh: LOCALSPEC_BUILD_TREE must be auto, on or off, not 'sometimes'"
    assert not any(tmp_path.iterdir())  # nothing built, fetched or kept
