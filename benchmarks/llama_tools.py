"""Building llama.cpp's own tools (``llama-completion``, ``ggml-rpc-server``...) from the vendored sources.

The one builder the benchmarks and the tests share. The tools are built once with cmake from the
vendored llama.cpp of llama-cpp-python's sdist, with the options our wheel uses (llamafile's sgemm
on, AMX off on x86, the RPC backend in), into ~/.cache/localspec/llama-tools/<key>. Two kinds of
build, each keyed by what went into it:

* unpatched (the default): the sources as they are, so a comparison with llama.cpp's tools is a
  comparison with upstream;
* patched (``patches`` given, scripts/llama.cpp-patches/ in name order): what an ``rpc-server`` must
  run for a layer computed there to be the same bits as one computed by our wheel (it reads the same
  switches from its environment: ``localspec.backend.cpu_switches``).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Iterator, Sequence

DEFAULT_SRC = "/tmp/sdist/llama_cpp_python-0.3.36/vendor/llama.cpp"
SOURCES = Path.home() / ".cache" / "localspec" / "llama-src"
PATCH_DIR = Path(__file__).resolve().parents[1] / "scripts" / "llama.cpp-patches"


def build_args() -> list[str]:
    """The cmake options: those of our llama-cpp-python wheel (scripts/setup.sh), tools only."""
    args = ["-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DGGML_LLAMAFILE=ON",
            "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_APP=OFF",
            "-DLLAMA_USE_PREBUILT_UI=OFF", "-DGGML_RPC=ON"]
    if platform.machine().lower() in ("x86_64", "amd64", "i386", "i686"):
        # AMX off, as in setup.sh: ggml's AMX matmul dies with SIGILL in worker threads.
        no_amx = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
        args += [f"-DCMAKE_C_FLAGS={no_amx}", f"-DCMAKE_CXX_FLAGS={no_amx}"]
    return args


def llama_sources(version: str) -> Path | str:
    """The vendored llama.cpp of llama-cpp-python ``version``'s sdist: ``$LOCALSPEC_LLAMA_SRC``, else
    ~/.cache/localspec/llama-src, fetched there with pip on first use; or why it cannot be had."""
    if os.environ.get("LOCALSPEC_LLAMA_SRC"):
        return Path(os.environ["LOCALSPEC_LLAMA_SRC"])
    vendor = SOURCES / f"llama_cpp_python-{version}" / "vendor" / "llama.cpp"
    if (vendor / "CMakeLists.txt").is_file():
        return vendor
    with locked(SOURCES / ".lock"):
        if (vendor / "CMakeLists.txt").is_file():  # another process fetched them meanwhile
            return vendor
        sdist = SOURCES / f"llama_cpp_python-{version}.tar.gz"
        if not sdist.is_file():
            done = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary",
                                   ":all:", f"llama-cpp-python=={version}", "-d", str(SOURCES)],
                                  capture_output=True, text=True)
            if done.returncode != 0 or not sdist.is_file():
                return f"could not download llama-cpp-python {version}'s sources with pip: {done.stderr.strip()[-200:]}"
        with tarfile.open(sdist) as tar:
            tar.extractall(SOURCES, filter="data")
    return vendor


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created if missing) for the block: processes that fetch or build
    into one cache folder at once (two test workers, a benchmark beside the tests) take turns, and the
    later one finds the earlier one's result."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def our_patches() -> list[Path]:
    """scripts/llama.cpp-patches/*.patch in the order setup.sh applies them."""
    return sorted(PATCH_DIR.glob("*.patch"))


def _patch_code(patches: Sequence[Path]) -> str:
    # A patch's code, not its header (as setup.sh keys the wheel): editing a header rebuilds nothing.
    return "".join(p.read_text()[p.read_text().find("diff --git"):] for p in patches)


def tools_dir(src: Path, patches: Sequence[Path] = ()) -> Path:
    """Where the tools built from ``src`` (with ``patches`` applied) live, keyed by version, options and
    the patches' code."""
    version = re.search(r"llama_cpp_python-([\d.]+)", str(src))
    parts = [version.group(1) if version else str(src), *build_args()]
    if patches:
        parts.append(_patch_code(patches))
    key = hashlib.sha256("\n".join(parts).encode())
    return Path.home() / ".cache" / "localspec" / "llama-tools" / key.hexdigest()[:16]


def _patched_copy(src: Path, dest: Path, patches: Sequence[Path], log) -> bool:
    """Copy the sources (without their models and docs) to ``dest`` and apply ``patches``."""
    if dest.exists():
        shutil.rmtree(dest)
    def skipped(folder: str, names: list[str]) -> set[str]:  # the top level's model files and docs
        return {".git"} | ({"models", "docs"} if Path(folder) == src else set())

    shutil.copytree(src, dest, ignore=skipped, symlinks=True)
    for p in patches:
        cmd = ["patch", "-p1", "-s", "-d", str(dest)] if shutil.which("patch") else ["git", "apply", "-p1"]
        with open(p, "rb") as diff:
            if subprocess.run(cmd, stdin=diff, stdout=log, stderr=subprocess.STDOUT,
                              cwd=None if cmd[0] == "patch" else dest).returncode != 0:
                return False
    return True


def _forget_other_sources(build: Path, src: Path) -> None:
    """Drop a cmake cache made from another copy of the same sources (the folder is keyed by version and
    options, not by where the sources lie): cmake refuses to configure over it. Built objects stay."""
    cache = build / "CMakeCache.txt"
    try:
        home = next((line.split("=", 1)[1].strip() for line in cache.read_text().splitlines()
                     if line.startswith("CMAKE_HOME_DIRECTORY:")), None)
    except OSError:
        return
    if home is not None and Path(home).resolve() != src.resolve():
        cache.unlink()
        shutil.rmtree(build / "CMakeFiles", ignore_errors=True)


def ensure_tools(src: Path, jobs: int, tools: Sequence[str], *, patches: Sequence[Path] = ()
                 ) -> dict[str, Path] | str:
    """Paths of the built ``tools`` (cmake targets), building the missing ones first; or why they cannot
    be had (one line). ``patches``: applied to a copy of the sources first (a build of its own)."""
    home = tools_dir(src, patches)
    build = home / "build"
    found = {t: build / "bin" / t for t in tools}
    if all(p.is_file() for p in found.values()):
        return found
    if not (src / "CMakeLists.txt").is_file():
        return f"no llama.cpp sources at {src}; pass --llama-src (the sdist's vendor/llama.cpp)"
    missing = [tool for tool in ("cmake", "c++") if shutil.which(tool) is None]
    if missing:
        return f"cannot build llama.cpp's tools: {' and '.join(missing)} not found; install them"
    with locked(home / ".lock"):
        return _build(src, home, found, jobs, patches)


def _build(src: Path, home: Path, found: dict[str, Path], jobs: int, patches: Sequence[Path]) -> dict[str, Path] | str:
    """``ensure_tools``' build of what ``found`` lacks into ``home``/build (under its lock)."""
    build = home / "build"
    build.mkdir(parents=True, exist_ok=True)
    log = home / "build.log"
    unbuilt = [t for t, path in found.items() if not path.is_file()]
    if not unbuilt:  # another process built them while this one waited for the lock
        return found
    kind = "patched " if patches else ""
    print(f"building {kind}{', '.join(unbuilt)} into {build} (several minutes, once; log: {log})", file=sys.stderr)
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    with open(log, "a") as out:
        if patches:
            source = home / "src"
            if not (source / "CMakeLists.txt").is_file() and not _patched_copy(src, source, patches, out):
                shutil.rmtree(source, ignore_errors=True)
                return f"applying scripts/llama.cpp-patches to {src} failed; see {log}"
            src = source
        _forget_other_sources(build, src)
        for cmd in (["cmake", "-S", str(src), "-B", str(build), *generator, *build_args()],
                    ["cmake", "--build", str(build), f"-j{jobs}", "--target", *unbuilt]):
            if subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT).returncode != 0:
                return f"building llama.cpp's tools failed; see {log}"
    return found


# --- rpc-server processes on loopback ports (the RPC tests and benchmarks/bench_rpc.py) ----------
RPC_SERVER = "ggml-rpc-server"  # tools/rpc's cmake target and binary (llama.cpp's "rpc-server")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RpcServer:
    """One rpc-server on 127.0.0.1 (its CPU device, ``threads`` threads), with ``env`` added to ours
    (the ggml-cpu switches: ``localspec.backend.cpu_switches``). Raises RuntimeError when it does not
    listen within ``wait_s``."""

    def __init__(self, binary: Path, log_dir: Path, env: dict[str, str], *, threads: int = 1,
                 wait_s: float = 60.0) -> None:
        self.port = free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        self.log = Path(log_dir) / f"rpc-server-{self.port}.log"
        with open(self.log, "w") as out:
            self.process = subprocess.Popen([str(binary), "-H", "127.0.0.1", "-p", str(self.port), "-t", str(threads)],
                                            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **env})
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"rpc-server exited with {self.process.returncode}: {self.log.read_text()[-500:]}")
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", self.port)) == 0:
                    return  # a bare connect: the server takes it for a client that left at once
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"rpc-server did not listen on {self.endpoint} within {wait_s:g} s")

    def kill(self) -> None:
        """Gone at once, as a crashed server or a machine without power (SIGKILL)."""
        self.process.kill()
        self.process.wait()

    def pause(self) -> None:
        """Hung: its sockets stay open and nothing answers (SIGSTOP)."""
        self.process.send_signal(signal.SIGSTOP)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()


if __name__ == "__main__":  # .venv/bin/python benchmarks/llama_tools.py [--patched] TARGET...: print the paths
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("targets", nargs="+")
    parser.add_argument("--patched", action="store_true", help="apply scripts/llama.cpp-patches first")
    parser.add_argument("--llama-src", type=Path, default=None)
    parser.add_argument("--jobs", type=int, default=2)
    a = parser.parse_args()
    from importlib.metadata import version

    src = a.llama_src or llama_sources(version("llama-cpp-python"))
    if isinstance(src, str):
        sys.exit(f"llama_tools: {src}")
    result = ensure_tools(src, a.jobs, a.targets, patches=our_patches() if a.patched else ())
    if isinstance(result, str):
        sys.exit(f"llama_tools: {result}")
    print("\n".join(str(p) for p in result.values()))
