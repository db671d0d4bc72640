"""The memory check before a context is created (issue 41): the KV cache and compute buffers from the GGUF
header against the RAM or GPU memory there is, refused in one line naming the largest context that fits."""

from __future__ import annotations

import pytest

from localspec.errors import InvalidOptionError
from localspec.models.context_fit import check_context_fits, context_bytes, largest
from localspec.models.memory import GIB, compute_buffer_bytes, kv_cache_bytes
from model_shapes import QWEN3_06B, QWEN3_14B


def test_on_the_cpu_a_context_costs_its_kv_cache_and_compute_buffer_in_ram() -> None:
    b = context_bytes(QWEN3_14B, 40960, n_gpu_layers=0, offload=False)
    # 40 layers x (K + V) x 8 heads x 128 x 2 bytes = 163,840 B per cell (test_planner's hand count)
    assert b.gpu == 0 and b.cpu == 40960 * 163_840 + compute_buffer_bytes(QWEN3_14B, 40960)
    # a CPU-only build ignores n_gpu_layers: everything stays in RAM
    assert context_bytes(QWEN3_14B, 40960, n_gpu_layers=-1, offload=False) == b


def test_offloaded_layers_put_their_cache_on_the_gpu() -> None:
    full = context_bytes(QWEN3_14B, 8192, n_gpu_layers=-1, offload=True)
    assert full.cpu == 0 and full.gpu == kv_cache_bytes(QWEN3_14B, 8192) + compute_buffer_bytes(QWEN3_14B, 8192)
    half = context_bytes(QWEN3_14B, 8192, n_gpu_layers=21, offload=True)  # 20 layers and the output layer
    assert half.cpu == half.gpu - compute_buffer_bytes(QWEN3_14B, 8192) == kv_cache_bytes(QWEN3_14B, 8192) // 2


def test_a_context_too_large_for_ram_is_refused_naming_the_largest_that_fits() -> None:
    ram = 4 * GIB
    with pytest.raises(InvalidOptionError) as caught:
        check_context_fits(QWEN3_14B, QWEN3_06B, 999_999_999_999, n_gpu_layers=0, draft_n_gpu_layers=0,
                           offload=False, ram=ram, vram=None)
    err = caught.value
    assert err.param == "n_ctx" and str(err).startswith("n_ctx 999999999999 is too large")
    assert "4.00 GiB is available" in str(err)
    assert f"compute buffers of {QWEN3_14B.label} and {QWEN3_06B.label} would need" in str(err)
    best = int(str(err).split("the largest context that fits is ")[1].split()[0])

    def need(ctx: int) -> int:
        t = context_bytes(QWEN3_14B, ctx, n_gpu_layers=0, offload=False)
        d = context_bytes(QWEN3_06B, ctx, n_gpu_layers=0, offload=False, draft=True)
        return t.cpu + d.cpu

    assert best % 256 == 0 and need(best) <= ram < need(best + 256)
    # what it names is then accepted
    check_context_fits(QWEN3_14B, QWEN3_06B, best, n_gpu_layers=0, draft_n_gpu_layers=0, offload=False,
                       ram=ram, vram=None)


def test_gpu_memory_is_checked_for_offloaded_layers_and_unknown_memory_is_not() -> None:
    with pytest.raises(InvalidOptionError, match="of GPU memory, and 8.00 GiB is free; the largest context"):
        check_context_fits(QWEN3_14B, None, 1 << 20, n_gpu_layers=-1, draft_n_gpu_layers=-1, offload=True,
                           ram=64 * GIB, vram=8 * GIB)
    check_context_fits(QWEN3_14B, None, 1 << 20, n_gpu_layers=-1, draft_n_gpu_layers=-1, offload=True,
                       ram=None, vram=None)


def test_nothing_fits_says_so() -> None:
    with pytest.raises(InvalidOptionError, match="not even the smallest context fits"):
        check_context_fits(QWEN3_14B, None, 4096, n_gpu_layers=0, draft_n_gpu_layers=0, offload=False,
                           ram=1 << 20, vram=None)


@pytest.mark.parametrize("upper, limit, expected", [(10_000, 5_000, 4864), (512, 10**9, 256), (256, 10**9, 0),
                                                    (10**12, 3 * 256, 768)])
def test_largest_is_the_last_multiple_of_256_below_the_request_that_fits(upper, limit, expected) -> None:
    assert largest(lambda n: n <= limit, upper) == expected
