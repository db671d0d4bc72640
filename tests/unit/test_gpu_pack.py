"""benchmarks/gpu/pack.sh finds the CUDA wheel setup.sh cached for the GPU's architecture, whether it was
built for that architecture alone (``sm_90``) or among others (``sm_89,90``), and no other."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NONE_FOUND = "pack.sh: no CUDA wheel for sm_90 in ~/.cache/localspec/wheels"


def _pack(tmp_path: Path, cuda_line: str) -> subprocess.CompletedProcess[str]:
    """pack.sh from a scratch repository (it clears the repository's .gpu/), with one cached build whose
    record says ``cuda_line``; its wheel is not a real one, so a chosen build fails when unpacked."""
    repo = tmp_path / "repo"
    (repo / "benchmarks" / "gpu").mkdir(parents=True)
    shutil.copy(REPO / "benchmarks" / "gpu" / "pack.sh", repo / "benchmarks" / "gpu" / "pack.sh")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    cached = tmp_path / "home" / ".cache" / "localspec" / "wheels" / "0123456789abcdef"
    cached.mkdir(parents=True)
    (cached / "BUILD.txt").write_text(f"llama-cpp-python 0.3.36\n{cuda_line}\n")
    (cached / "llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl").write_text("not a wheel")
    env = {**os.environ, "HOME": str(tmp_path / "home"), "ARCH": "90", "PYTHON": "python3"}
    return subprocess.run(["bash", str(repo / "benchmarks" / "gpu" / "pack.sh")], env=env, capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize("cuda_line", ["cuda: 13.0.88 sm_90 (/opt/cu13)", "cuda: 13.0.88 sm_89,90 (/opt/cu13)"])
def test_a_build_for_the_architecture_is_chosen(tmp_path: Path, cuda_line: str) -> None:
    done = _pack(tmp_path, cuda_line)
    assert done.returncode != 0  # (the stand-in wheel cannot be unpacked)
    assert NONE_FOUND not in done.stderr, done.stderr


@pytest.mark.parametrize("cuda_line", ["cuda: 13.0.88 sm_89 (/opt/cu13)", "cuda: 13.0.88 sm_900 (/opt/cu13)",
                                       "cuda: off"])
def test_a_build_for_another_architecture_is_not(tmp_path: Path, cuda_line: str) -> None:
    done = _pack(tmp_path, cuda_line)
    assert done.returncode == 1
    assert done.stderr.startswith(NONE_FOUND), done.stderr
