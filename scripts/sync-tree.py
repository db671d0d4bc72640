"""Make folder DEST hold exactly what folder SOURCE holds, writing only the files whose bytes differ.

    python scripts/sync-tree.py SOURCE DEST

setup.sh's kept build tree (docs/gpu.md, "Rebuilding after a change"): each build extracts the sdist
afresh and applies the patches to that copy; this carries the result into the tree CMake builds from.
A file whose bytes are unchanged keeps its old modification time, so the build tool recompiles only
what the change touched; a changed or new file is written now (a newer time than any object built
from it); a file or folder SOURCE no longer has is removed. Prints what it changed, one count a line.
"""

from __future__ import annotations

import filecmp
import os
import shutil
import sys
from pathlib import Path


def sync(source: Path, dest: Path) -> tuple[int, int]:
    """(files written, entries removed)."""
    written = removed = 0
    dest.mkdir(parents=True, exist_ok=True)
    for folder, dirs, files in os.walk(source):
        here = Path(folder)
        there = dest / here.relative_to(source)
        keep = set(dirs) | set(files)
        for entry in list(there.iterdir()) if there.is_dir() else ():
            if entry.name not in keep or entry.is_dir() != (here / entry.name).is_dir():
                shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
                removed += 1
        for name in dirs:
            (there / name).mkdir(exist_ok=True)
        for name in files:
            src, dst = here / name, there / name
            if dst.is_file() and not dst.is_symlink() and filecmp.cmp(src, dst, shallow=False):
                continue
            if dst.is_symlink():
                dst.unlink()
            shutil.copyfile(src, dst)  # (the time is now: newer than whatever was built from the old bytes)
            shutil.copymode(src, dst)
            written += 1
    return written, removed


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: sync-tree.py SOURCE DEST", file=sys.stderr)
        return 2
    source, dest = Path(argv[0]), Path(argv[1])
    if not source.is_dir():
        print(f"sync-tree.py: {source} is not a folder", file=sys.stderr)
        return 2
    written, removed = sync(source, dest)
    print(f"build tree: {written} file(s) written, {removed} removed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
