"""How `run`, `generate` and `bench` choose context and GPU offload: the plan applied, without a GPU.

The decisions are pure functions of GGUF metadata and memory (synthetic shapes from tests/support/model_shapes.py);
the commands applying it are tested in tests/cli/test_placement_cli.py.
"""

from __future__ import annotations


import pytest

from localspec.models import placement
from localspec.commands.flags import parse_ctx
from localspec.errors import InvalidOptionError
from localspec.models.placement import DEFAULT_CTX, LoadSettings, Vram, manual_settings, planned_settings
from localspec.models.memory import GIB
from localspec.models.planner import plan
from model_shapes import LLAMA_1B, LLAMA_70B, QWEN3_06B, QWEN3_14B

MIB = 1 << 20


# --- the decision ---------------------------------------------------------------------------------


def test_a_cpu_build_offloads_nothing_and_keeps_the_old_context() -> None:
    assert manual_settings(None, None, offload=False) == LoadSettings(DEFAULT_CTX, 0, 0)
    assert manual_settings(8192, None, offload=False) == LoadSettings(8192, 0, 0)
    # --gpu-layers places the layers itself, on any build; no plan is made.
    assert manual_settings(None, 20, offload=True) == LoadSettings(DEFAULT_CTX, 20, 20)
    assert manual_settings(None, None, offload=True) is None


def test_70b_on_24_gib_is_partially_offloaded_as_planned() -> None:
    s = planned_settings(LLAMA_70B, LLAMA_1B, ctx=None, vram=Vram(24 * GIB, "--vram 24GiB"))
    # test_planner works the numbers out by hand: 42 of 80 layers plus the output layer, at the floor.
    assert (s.n_ctx, s.n_gpu_layers, s.draft_n_gpu_layers) == (4096, 43, -1)
    # Everything at 8192: target weights 80 x 500,000,000 + 860,000,000 + 2,000,000, KV 8192 x 80 x 4096,
    # compute 2048 x (128256 + 8192) + 4 MiB = 43,829,994,368; draft 1,239,085,056 + 8192 x 16 x 2048 +
    # 70,909,952 (its n_ubatch is 128) = 1,578,430,464; together 45,408,424,832 B = 42.29 GiB.
    assert s.message == (
        "GPU plan for --vram 24GiB: 42/80 target layers on the GPU (n_gpu_layers 43; 38 layers on the CPU), "
        "draft fully on the GPU, context 4096 (reduced from 8192): everything on the GPU at context 8192 "
        "needs 42.29 GiB and 23.00 GiB is usable"
    )
    assert s.brief == "plan: 42/80 layers, ctx 4096"


def test_a_given_context_is_kept_and_fewer_layers_offloaded() -> None:
    at_floor = planned_settings(LLAMA_70B, LLAMA_1B, ctx=None, vram=Vram(24 * GIB, "x"))
    s = planned_settings(LLAMA_70B, LLAMA_1B, ctx=8192, vram=Vram(24 * GIB, "x"))
    assert s.n_ctx == 8192 and 0 < s.n_gpu_layers < at_floor.n_gpu_layers
    assert s.n_gpu_layers == plan(LLAMA_70B, LLAMA_1B, 24 * GIB, 8192, ctx_floor=8192).target.n_gpu_layers
    assert "reduced from" not in (s.message or "")


def test_what_fits_is_fully_offloaded_at_the_training_context() -> None:
    s = planned_settings(QWEN3_14B, QWEN3_06B, ctx=None, vram=Vram(24 * GIB, "GPU (24.00 GiB free)"))
    assert (s.n_ctx, s.n_gpu_layers, s.draft_n_gpu_layers) == (40960, -1, -1)
    assert s.message == ("GPU plan for GPU (24.00 GiB free): target and draft fully on the GPU, context 40960 "
                         "(18.90 GiB of 23.00 GiB usable)")
    shrunk = planned_settings(QWEN3_14B, QWEN3_06B, ctx=None, vram=Vram(16 * GIB, "x"))
    assert (shrunk.n_ctx, shrunk.n_gpu_layers) == (25_856, -1)  # test_planner's hand-worked 16 GiB case
    assert "context 25856 (reduced from 40960): everything on the GPU at context 40960 needs" in (shrunk.message or "")
    alone = planned_settings(QWEN3_14B, None, ctx=32 * 1024, vram=Vram(24 * GIB, "x"))
    assert (alone.n_ctx, alone.n_gpu_layers) == (32768, -1) and "the model fully on the GPU" in (alone.message or "")


def test_unknown_or_exhausted_memory() -> None:
    unknown = planned_settings(QWEN3_14B, QWEN3_06B, ctx=None, vram=None)
    assert (unknown.n_ctx, unknown.n_gpu_layers, unknown.draft_n_gpu_layers) == (DEFAULT_CTX, -1, -1)
    assert "pass --vram SIZE" in (unknown.message or "")
    full = planned_settings(QWEN3_14B, QWEN3_06B, ctx=None, vram=Vram(512 * MIB, "GPU (0.50 GiB free)"))
    assert (full.n_gpu_layers, full.draft_n_gpu_layers) == (0, 0) and "runs on the CPU" in (full.message or "")


def test_nvidia_smi_output() -> None:
    vram = placement.parse_nvidia_smi("NVIDIA GeForce RTX 4090, 24564, 1210\nNVIDIA H100, 81559, 0\n")
    assert vram == Vram((24564 - 1210) * MIB, "NVIDIA GeForce RTX 4090 (22.81 GiB free of 23.99 GiB, nvidia-smi)")
    assert placement.parse_nvidia_smi("") is None
    assert placement.parse_nvidia_smi("No devices were found\n") is None
    assert placement.parse_nvidia_smi("GPU, [N/A], [N/A]\n") is None


# --- --ctx ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "tokens"), [("4096", 4096), ("32k", 32768), ("8K", 8192), (" 2k ", 2048)])
def test_ctx_takes_a_k_suffix(text: str, tokens: int) -> None:
    assert parse_ctx(text) == tokens


@pytest.mark.parametrize("text", ["32kb", "1.5k", "-1", "k", "lots"])
def test_ctx_refuses_anything_else(text: str) -> None:
    with pytest.raises(InvalidOptionError, match="is not a token count; use e.g. 8192 or 8k"):
        parse_ctx(text)
