"""The target's layers on two real rpc-server processes and this CPU: placed as asked, the same bits.

The servers are llama.cpp's rpc-server built from the same vendored sources with our patches, run
with our ggml-cpu switches (tests/support/rpc_servers.py); each serves its CPU on a loopback port.
A server killed or hung mid-reply is tested through the CLI (tests/cli/test_rpc_cli.py): ggml
aborts the process it happens in.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from localspec.backend import Context, Model, model_params, recent_log, rpc_devices
from localspec.engine import Engine, GenerateOptions
from localspec.drafting.specs import DrafterSpec
from localspec.models.split import DeviceSplit
from localspec.sampling import SamplingParams
from tests.support.rpc_servers import RpcServer, rpc_server_binary

PROMPT = "The three primary colours are red, yellow and"
TARGET_LAYERS = 20  # of SmolLM2's 30: 10 on each server, 10 and the output layer on this CPU


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    binary = rpc_server_binary()
    started = [RpcServer(binary, tmp_path_factory.mktemp("rpc")) for _ in range(2)]
    yield started
    for server in started:
        server.stop()


@pytest.fixture(scope="module")
def split(servers) -> DeviceSplit:
    return DeviceSplit(tuple(rpc_devices([s.endpoint for s in servers])), (0.5, 0.5))


def test_each_server_is_a_device_with_the_memory_llama_cpp_reports(servers, split):
    assert [d.description for d in split.devices] == [s.endpoint for s in servers]
    assert all(d.remote and d.handle and 0 < d.free <= d.total for d in split.devices)
    assert len({d.name for d in split.devices}) == 2  # RPC0, RPC1


def test_model_params_carry_the_devices_shares_and_mode(split):
    params, keep = model_params(n_gpu_layers=TARGET_LAYERS, split=DeviceSplit(split.devices, (0.25, 0.75), "row", 1))
    listed = (ctypes.c_void_p * 3).from_address(params.devices)
    assert [listed[0], listed[1], listed[2]] == [split.devices[0].handle, split.devices[1].handle, None]
    assert (params.split_mode, params.main_gpu, params.n_gpu_layers) == (2, 1, TARGET_LAYERS)
    assert [params.tensor_split[i] for i in range(3)] == [0.25, 0.75, 0.0]
    default, _ = model_params()
    assert not default.devices and not default.tensor_split and default.split_mode == 1  # llama.cpp's own choice
    with pytest.raises(ValueError, match="backend's devices"):
        model_params(split=DeviceSplit((split.devices[0].__class__("GPU0", "planned", 1, 1),)))


@pytest.fixture(scope="module")
def remote_target(smollm2_path, split):
    model = Model(smollm2_path, n_gpu_layers=TARGET_LAYERS, split=split)
    log = "".join(recent_log())
    yield model, log
    model.close()


def test_layers_go_to_both_servers_and_the_rest_stays_on_the_cpu(remote_target, servers):
    _, log = remote_target
    assert f"offloaded {TARGET_LAYERS}/31 layers to GPU" in log
    for server in servers:
        assert f"[{server.endpoint}] model buffer size" in log
    assert "CPU_Mapped model buffer size" in log or "CPU model buffer size" in log


def _logits_along(model: Model, prompt: list[int], steps: int) -> tuple[list[int], list[np.ndarray], np.ndarray]:
    """Greedy tokens and each step's logits (one-token decodes), then a 5-row batch's logits."""
    ctx = Context(model, n_ctx=512)
    ctx.append(prompt)
    tokens, rows = [], []
    for _ in range(steps):
        logits = ctx.logits(-1).copy()
        rows.append(logits)
        tokens.append(int(np.argmax(logits)))
        ctx.append(tokens[-1:])
    ctx.rollback_to(len(prompt))
    ctx.append(tokens[:5], outputs="all")
    batch = np.stack([ctx.logits(i).copy() for i in range(5)])
    ctx.close()
    return tokens, rows, batch


def test_remote_layers_give_the_local_bits_alone_and_in_a_batch(remote_target, smollm2_path):
    remote, _ = remote_target
    local = Model(smollm2_path, n_gpu_layers=0)
    try:
        prompt = local.tokenize(PROMPT)
        here = _logits_along(local, prompt, 16)
        there = _logits_along(remote, prompt, 16)
    finally:
        local.close()
    assert here[0] == there[0]
    assert all(np.array_equal(a, b) for a, b in zip(here[1], there[1]))
    assert np.array_equal(here[2], there[2])
    # The batch rows are the one-token decodes' bits too (row i predicts the token after tokens[i]).
    assert all(np.array_equal(there[2][i], there[1][i + 1]) for i in range(4))


@pytest.mark.parametrize("draft", ["ngram", "model"])
def test_speculation_over_rpc_is_token_identical_to_plain_local(smollm2_path, smollm2_q4_0_path, split, draft):
    prompt = "Repeat exactly: the cat sat on the mat, the cat sat on the mat, the cat sat on the mat,"
    opts = dict(max_tokens=40, sampling=SamplingParams())
    local = Engine.load(smollm2_path, n_ctx=1024, n_gpu_layers=0, personal_history=False)
    try:
        plain = list(local.generate(prompt, GenerateOptions(**opts, speculative=False)))[-1]
    finally:
        local.close()
    specs = [DrafterSpec("ngram")] if draft == "ngram" else []
    remote = Engine.load(smollm2_path, smollm2_q4_0_path if draft == "model" else None, specs=specs, n_ctx=1024,
                         n_gpu_layers=TARGET_LAYERS, draft_n_gpu_layers=0, split=split,
                         draft_split=DeviceSplit(()), personal_history=False)
    try:
        spec = list(remote.generate(prompt, GenerateOptions(**opts, draft_len=4)))[-1]
    finally:
        remote.close()
    assert spec.stats.drafted > 0 and spec.stats.accepted > 0
    assert spec.tokens == plain.tokens and spec.finish_reason == plain.finish_reason == "length"


def test_a_server_whose_listener_closes_just_after_the_abort_counts_as_gone():
    """A server killed mid-reply closes our connection a moment before its listening socket: the probe
    after ggml's abort must not take the last moments of a dying listener for a hung server (CI saw one
    reported as "stopped answering"). A listener that stays up is one that accepts without answering."""
    import socket
    import threading

    from localspec.backend.devices import _what_went

    dying, hung = socket.socket(), socket.socket()
    for s in (dying, hung):
        s.bind(("127.0.0.1", 0))
        s.listen()
    ends = [f"127.0.0.1:{s.getsockname()[1]}" for s in (dying, hung)]
    closer = threading.Timer(0.3, dying.close)
    closer.start()
    try:
        said = _what_went(ends)
        assert said.startswith(f"RPC server {ends[0]} went away mid-reply"), said
        assert _what_went(ends[1:]).startswith(f"RPC server {ends[1]} stopped answering mid-reply")
    finally:
        closer.cancel()
        dying.close()
        hung.close()
