"""The target over several devices, as pure logic: the names users give, the shares, the draft's device.

Multi-GPU cannot run here (no GPU); what llama.cpp is handed is checked in tests/engine/test_rpc.py
(``model_params``), the shares and the plan here, on synthetic shapes (tests/support/model_shapes.py).
"""

from __future__ import annotations

import pytest

from localspec.errors import InvalidOptionError
from localspec.models.memory import GIB
from localspec.models.placement import split_settings
from localspec.models.planner import plan, split_plan
from localspec.models.split import Device, DeviceSplit, draft_device, parse_endpoints, parse_gpus, target_shares
from model_shapes import LLAMA_1B, LLAMA_70B

GPU = [Device(f"CUDA{i}", "RTX 4090", 24 * GIB, 24 * GIB) for i in range(2)]
RPC = Device("RPC0", "10.0.0.2:50052", 24 * GIB, 32 * GIB, remote=True)


def test_endpoints_take_the_default_port_and_refuse_the_rest() -> None:
    assert parse_endpoints("10.0.0.2:50053,gpu-box") == ("10.0.0.2:50053", "gpu-box:50052")
    for bad in ("10.0.0.2:0", "10.0.0.2:70000", "a b:1", "", "x:1,x:1", "host:port"):
        with pytest.raises(InvalidOptionError) as err:
            parse_endpoints(bad)
        assert err.value.param == "rpc" and str(err.value).startswith("rpc ")


def test_gpus_are_llama_cpp_numbers_each_once_and_present() -> None:
    assert parse_gpus("1,0", 2) == (1, 0) and parse_gpus("3", None) == (3,)
    with pytest.raises(InvalidOptionError, match="lacks: llama.cpp sees GPUs 0–1"):
        parse_gpus("0,2", 2)
    with pytest.raises(InvalidOptionError, match="sees no GPU"):
        parse_gpus("0", 0)
    for bad in ("0,0", "-1", "a", ""):
        with pytest.raises(InvalidOptionError) as err:
            parse_gpus(bad, 4)
        assert err.value.param == "gpus"


def test_the_draft_goes_to_the_local_device_with_the_most_room() -> None:
    devices = [RPC, *GPU]
    assert draft_device(devices, [30, 10, 20], None) == 2  # the server has more room, but is remote
    assert draft_device(devices, [30, 20, 20], None) == 1  # a tie: the first
    assert draft_device(devices, [30, 20, 10], 2) == 2     # --draft-gpu wins
    assert draft_device([RPC], [30], None) is None          # all remote: the CPU
    with pytest.raises(InvalidOptionError) as err:
        draft_device(devices, [30, 20, 10], 0)
    assert err.value.param == "draft_gpu"


def test_the_target_shares_what_is_left_after_the_draft() -> None:
    assert target_shares([20, 20], 4, 0) == (16 / 36, 20 / 36)
    assert target_shares([10, 30], 0, None) == (0.25, 0.75)
    assert target_shares([3, 0], 5, 0) == (0.5, 0.5)  # nothing left anywhere: equal shares, llama.cpp's own
    assert DeviceSplit(tuple(GPU), (0.25, 0.75)).describe() == "CUDA0 (RTX 4090) 25%, CUDA1 (RTX 4090) 75%"
    assert DeviceSplit(()).describe() == "the CPU"


def test_a_70b_target_that_needs_two_cards_fits_on_two() -> None:
    one = plan(LLAMA_70B, LLAMA_1B, 24 * GIB)
    assert not one.target.full_offload  # one 24 GiB card: 42 of 80 layers (test_placement)
    two = split_plan(LLAMA_70B, LLAMA_1B, GPU)
    assert two.target.full_offload and two.draft.full_offload and two.n_ctx == LLAMA_70B.context_length
    assert two.draft_card == 0 and [c.device for c in two.cards] == GPU
    assert sum(c.share for c in two.cards) == pytest.approx(1.0)
    assert two.cards[0].share < two.cards[1].share  # card 0 also holds the draft
    for card in two.cards:  # what each card holds fits it
        assert card.target_bytes + card.draft_bytes <= card.usable_bytes
    assert two.cards[0].draft_bytes == two.draft.gpu_bytes and two.cards[1].draft_bytes == 0
    assert any("compute buffer of its own" in note for note in two.notes)


def test_with_only_remote_devices_the_draft_runs_on_the_cpu() -> None:
    p = split_plan(LLAMA_70B, LLAMA_1B, [RPC, RPC])
    assert p.draft_card is None and p.draft.gpu_layers == 0 and not p.draft.output_on_gpu
    assert all(c.draft_bytes == 0 for c in p.cards) and p.cards[0].share == p.cards[1].share == 0.5
    assert any("draft runs on this machine's CPU" in note for note in p.notes)


def test_settings_put_the_draft_on_its_device_and_the_target_over_all() -> None:
    s = split_settings(LLAMA_70B, LLAMA_1B, [RPC, *GPU], ctx=None, gpu_layers=None, draft_at=2)
    assert s.split.devices == (RPC, *GPU) and s.split.mode == "layer"
    assert s.draft_split.devices == (GPU[1],)
    assert s.n_gpu_layers == -1 and s.draft_n_gpu_layers == -1
    assert s.split.shares[2] < s.split.shares[1]  # the draft's card takes less of the target
    assert "target over RPC0 (10.0.0.2:50052)" in s.message


def test_gpu_layers_given_share_by_room_and_split_mode_none_keeps_one_device() -> None:
    small = Device("CUDA1", "RTX 3060", 12 * GIB + GIB, 12 * GIB + GIB)
    s = split_settings(LLAMA_70B, None, [GPU[0], small], ctx=8192, gpu_layers=30)
    assert (s.n_ctx, s.n_gpu_layers) == (8192, 30)
    assert s.split.shares == pytest.approx((23 / 35, 12 / 35))
    assert s.message == "placement: 30 layers over CUDA0 (RTX 4090) 66%, CUDA1 (RTX 3060) 34%"
    one = split_settings(LLAMA_70B, LLAMA_1B, [small, GPU[0]], ctx=None, gpu_layers=None, mode="none")
    assert one.split.devices == (GPU[0],) and one.split.mode == "none" and one.draft_split.devices == (GPU[0],)
    remote_only = split_settings(LLAMA_70B, LLAMA_1B, [RPC], ctx=None, gpu_layers=40)
    assert remote_only.draft_split.devices == () and remote_only.draft_n_gpu_layers == 0


def test_row_split_is_refused_over_rpc_servers() -> None:
    with pytest.raises(InvalidOptionError) as err:
        split_settings(LLAMA_70B, None, [RPC, *GPU], ctx=None, gpu_layers=None, mode="row")
    assert err.value.param == "split_mode" and "use layer" in str(err.value)
    assert split_settings(LLAMA_70B, None, list(GPU), ctx=None, gpu_layers=None, mode="row").split.mode == "row"
