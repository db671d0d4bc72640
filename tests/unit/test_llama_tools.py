"""The tools builder reuses its folder when the same sources lie elsewhere (cmake would refuse its cache)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import llama_tools  # noqa: E402


def _configured(build: Path, src: Path) -> Path:
    (build / "CMakeFiles").mkdir(parents=True)
    (build / "ggml" / "CMakeFiles").mkdir(parents=True)  # where objects live: kept
    cache = build / "CMakeCache.txt"
    cache.write_text(f"CMAKE_BUILD_TYPE:STRING=Release\nCMAKE_HOME_DIRECTORY:INTERNAL={src}\n")
    return cache


def test_a_cache_from_another_copy_of_the_sources_is_dropped(tmp_path: Path) -> None:
    build = tmp_path / "build"
    cache = _configured(build, tmp_path / "old" / "llama.cpp")
    llama_tools._forget_other_sources(build, tmp_path / "new" / "llama.cpp")
    assert not cache.exists() and not (build / "CMakeFiles").exists()
    assert (build / "ggml" / "CMakeFiles").is_dir()


def test_a_cache_from_these_sources_is_kept(tmp_path: Path) -> None:
    src = tmp_path / "llama.cpp"
    src.mkdir()
    build = tmp_path / "build"
    cache = _configured(build, src)
    llama_tools._forget_other_sources(build, src)
    assert cache.exists() and (build / "CMakeFiles").is_dir()
    llama_tools._forget_other_sources(tmp_path / "never-built", src)  # no cache: nothing to do
