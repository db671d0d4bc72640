"""Real ggml ``rpc-server`` processes on loopback ports, started and stopped by the tests.

The binary is llama.cpp's own (tools/rpc), built by ``benchmarks/llama_tools.py`` from the same
vendored sources as our wheel, with our patches (scripts/llama.cpp-patches/), and run with the
ggml-cpu switches this process decodes with (``backend.cpu_switches``): layers computed there are
then the same bits as layers computed here. Without cmake or a C++ compiler the tests skip, saying
so; a build that fails is a failure.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import llama_tools  # noqa: E402

RPC_SERVER = "ggml-rpc-server"
START_WAIT_S = 60.0  # how long a server may take to listen (a loaded machine); then the test fails


def rpc_server_binary() -> Path:
    """The patched rpc-server, built once into ~/.cache/localspec/llama-tools/<key>."""
    from localspec.backend import library_version

    missing = [tool for tool in ("cmake", "c++") if not llama_tools.shutil.which(tool)]
    if missing:
        pytest.skip(f"{' and '.join(missing)} not found: cannot build llama.cpp's rpc-server for the RPC tests")
    src = llama_tools.llama_sources(library_version())
    if isinstance(src, str):
        pytest.fail(src)
    built = llama_tools.ensure_tools(src, os.cpu_count() or 2, [RPC_SERVER], patches=llama_tools.our_patches())
    if isinstance(built, str):
        pytest.fail(built)
    return built[RPC_SERVER]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RpcServer:
    """One rpc-server on 127.0.0.1 (CPU device, one thread), its endpoint and its process."""

    def __init__(self, binary: Path, log_dir: Path) -> None:
        from localspec.backend import cpu_switches

        self.port = free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        self.log = log_dir / f"rpc-server-{self.port}.log"
        with open(self.log, "w") as out:
            self.process = subprocess.Popen([str(binary), "-H", "127.0.0.1", "-p", str(self.port), "-t", "1"],
                                            stdout=out, stderr=subprocess.STDOUT,
                                            env={**os.environ, **cpu_switches()})
        self._wait_listening()

    def _wait_listening(self) -> None:
        deadline = time.monotonic() + START_WAIT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"rpc-server exited with {self.process.returncode}: {self.log.read_text()[-500:]}")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return  # a bare connect: the server takes it as a client that left at once
            time.sleep(0.1)
        self.stop()
        pytest.fail(f"rpc-server did not listen on {self.endpoint} within {START_WAIT_S:g} s")

    def kill(self) -> None:
        """Gone at once, as a machine that loses power or a server that crashes (SIGKILL)."""
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
