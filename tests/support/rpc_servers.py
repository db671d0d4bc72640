"""Real ggml ``rpc-server`` processes on loopback ports, started and stopped by the tests.

The binary is llama.cpp's own (tools/rpc), built by ``benchmarks/llama_tools.py`` from the same
vendored sources as our wheel, with our patches (scripts/llama.cpp-patches/), and run with the
ggml-cpu switches this process decodes with (``backend.cpu_switches``): layers computed there are
then the same bits as layers computed here. Without cmake or a C++ compiler the tests skip, saying
so; a build that fails, or a server that does not start, is a failure.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import llama_tools  # noqa: E402
from llama_tools import free_port  # noqa: E402,F401  (the tests' name for a port nothing listens on)


def rpc_server_binary() -> Path:
    """The patched rpc-server, built once into ~/.cache/localspec/llama-tools/<key>."""
    from localspec.backend import library_version

    missing = [tool for tool in ("cmake", "c++") if not llama_tools.shutil.which(tool)]
    if missing:
        pytest.skip(f"{' and '.join(missing)} not found: cannot build llama.cpp's rpc-server for the RPC tests")
    src = llama_tools.llama_sources(library_version())
    if isinstance(src, str):
        pytest.fail(src)
    built = llama_tools.ensure_tools(src, os.cpu_count() or 2, [llama_tools.RPC_SERVER],
                                     patches=llama_tools.our_patches())
    if isinstance(built, str):
        pytest.fail(built)
    return built[llama_tools.RPC_SERVER]


def RpcServer(binary: Path, log_dir: Path) -> llama_tools.RpcServer:  # noqa: N802  (it makes one)
    """An rpc-server with this process's ggml-cpu switches, one thread; a failure to start fails the test."""
    from localspec.backend import cpu_switches

    try:
        return llama_tools.RpcServer(binary, log_dir, cpu_switches())
    except RuntimeError as err:
        pytest.fail(str(err))
