"""scripts/link-cuda-libs.sh links a toolkit's CUDA runtime and cuBLAS beside libggml-cuda.so, wherever
the toolkit keeps them (lib64/, lib/, targets/*/lib/), and names the one that is missing."""

from __future__ import annotations

import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "link-cuda-libs.sh"
LIBS = ("libcudart", "libcublas", "libcublasLt")


def _toolkit(root: Path, layout: dict[str, str], major: int = 13) -> Path:
    for lib, folder in layout.items():
        (root / folder).mkdir(parents=True, exist_ok=True)
        real = root / folder / f"{lib}.so.{major}.0.88"
        real.write_text(lib)
        (root / folder / f"{lib}.so.{major}").symlink_to(real.name)
    return root


def _link(libdir: Path, toolkit: Path, major: int = 13) -> subprocess.CompletedProcess[str]:
    libdir.mkdir(exist_ok=True)
    return subprocess.run(["bash", str(SCRIPT), str(libdir), str(toolkit), str(major)], capture_output=True,
                          text=True)


def test_each_library_is_linked_from_wherever_the_toolkit_keeps_it(tmp_path: Path) -> None:
    # PyPI's wheels keep all in lib/; a system toolkit in lib64/ or targets/x86_64-linux/lib/.
    toolkit = _toolkit(tmp_path / "cu13", {"libcudart": "lib", "libcublas": "lib64",
                                           "libcublasLt": "targets/x86_64-linux/lib"})
    done = _link(tmp_path / "site", toolkit)
    assert done.returncode == 0, done.stderr
    for lib in LIBS:
        link = tmp_path / "site" / f"{lib}.so.13"
        assert link.is_symlink() and link.read_text() == lib  # to the real file, not the toolkit's link
        assert Path(link.readlink()).name == f"{lib}.so.13.0.88"


def test_a_missing_library_is_one_line_naming_it(tmp_path: Path) -> None:
    toolkit = _toolkit(tmp_path / "cu13", {"libcudart": "lib", "libcublasLt": "lib"})
    done = _link(tmp_path / "site", toolkit)
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and "libcublas.so.13 is not in the CUDA toolkit at" in done.stderr
