"""`--rpc` as a user runs it: a server down, killed or hung mid-reply is one line and an end, never a hang.

Real rpc-server processes on loopback ports (tests/support/rpc_servers.py). ggml's RPC client aborts the
process when a server goes away; `localspec` turns that into its one error line, keeps what was
printed, and a server that hangs ends the reply after LOCALSPEC_RPC_TIMEOUT_S.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support.cli import assert_clean_error, localspec, one_error_line
from tests.support.rpc_servers import RpcServer, free_port, rpc_server_binary

HANG_GUARD_S = 600  # a test that waits longer than this has found a hang: it fails instead of waiting on
COUNTING = "1, 2, 3, 4, 5, 6,"  # SmolLM2 counts on for as long as it is let
COUNTED_ON = "".join(f" {i}," for i in range(7, 5000))


@pytest.fixture
def two_servers(tmp_path):
    binary = rpc_server_binary()
    started = [RpcServer(binary, tmp_path) for _ in range(2)]
    yield started
    for server in started:
        server.stop()


def _rpc(servers) -> str:
    return ",".join(s.endpoint for s in servers)


def test_a_server_that_is_down_is_one_line_before_anything_loads(smollm2_path):
    endpoint = f"127.0.0.1:{free_port()}"
    proc = localspec("generate", str(smollm2_path), "-p", "hi", "--rpc", endpoint, "--gpu-layers", "10")
    assert_clean_error(proc, endpoint, "refused the connection", "rpc-server")
    assert proc.stdout == ""


def test_a_malformed_rpc_list_names_the_flag(smollm2_path):
    proc = localspec("generate", str(smollm2_path), "-p", "hi", "--rpc", "127.0.0.1:50052,:x")
    assert_clean_error(proc, "--rpc ':x'", "host:port")


def test_gpu_choices_without_a_gpu_are_one_line(smollm2_path):
    from localspec.backend import gpu_offload_supported

    if gpu_offload_supported():
        pytest.skip("this machine has a GPU llama.cpp can use")
    proc = localspec("generate", str(smollm2_path), "-p", "hi", "--gpus", "0")
    assert_clean_error(proc, "--gpus '0' names a GPU this machine lacks", "sees no GPU", "localspec doctor")
    proc = localspec("generate", str(smollm2_path), "-p", "hi", "--split-mode", "row")
    assert_clean_error(proc, "need a GPU", "--rpc adds remote devices")


@pytest.mark.parametrize("draft", ["ngram", "model"])
def test_greedy_text_over_two_servers_is_the_local_text(smollm2_path, smollm2_q4_0_path, two_servers, draft):
    args = ("generate", str(smollm2_path), "-p", "The cat sat on the mat. The cat sat on the", "--max-tokens", "24",
            "--draft", "ngram" if draft == "ngram" else str(smollm2_q4_0_path), "--draft-max", "3")
    local = localspec(*args, "--draft-max", "0")  # plain decoding, all here
    remote = localspec(*args, "--rpc", _rpc(two_servers), "--gpu-layers", "20")
    assert local.returncode == remote.returncode == 0, remote.stderr
    assert remote.stdout == local.stdout and remote.stdout.strip()
    assert "20 layers over RPC0" in remote.stderr


def test_plan_counts_the_servers_memory_as_llama_cpp_reports_it(smollm2_path, two_servers):
    proc = localspec("plan", str(smollm2_path), "--draft", str(smollm2_path), "--rpc", _rpc(two_servers),
                     "--vram", "2GiB")
    assert proc.returncode == 0, proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines() if line.startswith("  RPC") or line.startswith("  GPU")]
    assert [(r[0], r[1]) for r in rows] == [("RPC0", two_servers[0].endpoint), ("RPC1", two_servers[1].endpoint),
                                            ("GPU0", "--vram")]
    assert "+ draft" in [line for line in proc.stdout.splitlines() if line.startswith("  GPU0")][0]  # stays local


def _generate_until_output(smollm2_path, servers, env: dict[str, str] | None = None) -> subprocess.Popen:
    """`localspec generate` counting over ``servers``, returned once its first numbers are out."""
    proc = subprocess.Popen([sys.executable, "-m", "localspec", "generate", str(smollm2_path), "-p", COUNTING,
                             "--max-tokens", "2000", "--ctx", "4096", "--draft", "off", "--rpc", _rpc(servers),
                             "--gpu-layers", "20"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", "LOCALSPEC_NO_HISTORY": "1", **(env or {})})
    first = b""
    while b" 7, 8," not in first:  # blocks until the reply has begun: the servers are in use
        byte = proc.stdout.read(1)
        assert byte, proc.stderr.read()
        first += byte
    proc.first = first  # type: ignore[attr-defined]
    return proc


def _finish(proc: subprocess.Popen) -> subprocess.CompletedProcess:
    out, err = proc.communicate(timeout=HANG_GUARD_S)
    return subprocess.CompletedProcess(proc.args, proc.returncode, proc.first.decode() + out.decode(), err.decode())


def test_a_server_killed_mid_reply_is_one_line_and_the_text_so_far_stays(smollm2_path, two_servers):
    proc = _generate_until_output(smollm2_path, two_servers)
    two_servers[1].kill()
    done = _finish(proc)
    # Everything printed before the server went stays printed, whole: the count as far as it got.
    assert COUNTED_ON.startswith(done.stdout) and len(done.stdout) >= len(" 7, 8,")
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("localspec: error")]
    assert lines == [f"localspec: error: RPC server {two_servers[1].endpoint} went away mid-reply (the connection "
                     "closed); llama.cpp cannot continue without it: restart rpc-server there and run again"]
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and "GGML_ABORT" not in done.stderr and "ggml_abort" not in done.stderr


def test_a_server_that_hangs_mid_reply_ends_the_reply_by_itself(smollm2_path, two_servers):
    proc = _generate_until_output(smollm2_path, two_servers, {"LOCALSPEC_RPC_TIMEOUT_S": "3"})
    two_servers[0].pause()
    done = _finish(proc)
    line = one_error_line(subprocess.CompletedProcess(done.args, done.returncode, "",
                                                      "\n".join(ln for ln in done.stderr.splitlines()
                                                                if not ln.startswith("localspec: placement"))))
    assert "stopped answering mid-reply (no reply within 3 s" in line
    assert COUNTED_ON.startswith(done.stdout)


def test_doctor_lists_each_server_and_whether_it_answers(two_servers):
    down = f"127.0.0.1:{free_port()}"
    proc = localspec("doctor", "--rpc", f"{two_servers[0].endpoint},{down}")
    assert proc.returncode == 1, proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RPC server")]
    assert len(lines) == 2
    assert lines[0].startswith(f"RPC server    {two_servers[0].endpoint}: reachable, protocol 7.0.0; RPC")
    assert " free of " in lines[0]
    assert lines[1].startswith(f"RPC server    {down}: NOT usable: RPC server {down} refused the connection")
