"""How `run`, `generate` and `bench` choose context and GPU offload: the plan applied, without a GPU.

The decisions are pure functions of GGUF metadata and memory (synthetic shapes from test_planner);
the command tests pretend the installed llama.cpp can offload and stop at Engine.load to see
what it would have been given.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import localspec.backend
import localspec.engine
import localspec.models.gguf_info
from localspec import cli, placement
from localspec.commands.common import parse_ctx
from localspec.errors import InvalidOptionError, LocalspecError
from localspec.placement import DEFAULT_CTX, LoadSettings, Vram, manual_settings, planned_settings
from localspec.planner import GIB, plan
from test_planner import LLAMA_1B, LLAMA_70B, QWEN3_06B, QWEN3_14B

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


def test_detect_vram_asks_llama_cpp_first_then_nvidia_smi(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(localspec.backend, "gpu_devices", lambda: [("CUDA0 (Fake 24G)", 20 * GIB, 24 * GIB)])
    assert placement.detect_vram() == Vram(20 * GIB, "CUDA0 (Fake 24G) (20.00 GiB free of 24.00 GiB)")
    monkeypatch.setattr(localspec.backend, "gpu_devices", lambda: [])
    monkeypatch.setattr(placement.shutil, "which", lambda name: None)
    assert placement.detect_vram() is None


def test_this_build_reports_its_gpus() -> None:
    devices = localspec.backend.gpu_devices()
    if not localspec.backend.gpu_offload_supported():
        assert devices == []  # the CPU device is not a GPU
    for name, free, total in devices:
        assert name and 0 <= free <= total


# --- --ctx ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "tokens"), [("4096", 4096), ("32k", 32768), ("8K", 8192), (" 2k ", 2048)])
def test_ctx_takes_a_k_suffix(text: str, tokens: int) -> None:
    assert parse_ctx(text) == tokens


@pytest.mark.parametrize("text", ["32kb", "1.5k", "-1", "k", "lots"])
def test_ctx_refuses_anything_else(text: str) -> None:
    with pytest.raises(InvalidOptionError, match="is not a token count; use e.g. 8192 or 8k"):
        parse_ctx(text)


# --- the commands apply it ----------------------------------------------------------------------


class Stop(LocalspecError):
    """Raised by the fake Engine.load once it has seen its arguments."""


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[dict[str, Any]]:
    """Engine.load replaced: records its keyword arguments, then stops the command (exit 2)."""
    seen: list[dict[str, Any]] = []

    def fake_load(cls: Any, target: Any, draft: Any = None, **kwargs: Any) -> None:
        seen.append({"target": target, "draft": draft, **kwargs})
        raise Stop("stopped before loading")

    monkeypatch.setattr(localspec.engine.Engine, "load", classmethod(fake_load))
    monkeypatch.setenv("LOCALSPEC_DATA_DIR", str(tmp_path / "data"))
    return seen


def model_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """Two files whose metadata reads as a 70B target and a 1B draft."""
    target, draft = tmp_path / "llama-70b.gguf", tmp_path / "llama-1b.gguf"
    target.write_bytes(b"GGUF")
    draft.write_bytes(b"GGUF")
    infos = {target: LLAMA_70B, draft: LLAMA_1B}
    monkeypatch.setattr(localspec.models.gguf_info, "read_info", lambda path: infos[Path(path)])
    return target, draft


@pytest.mark.parametrize("command", ["generate", "run"])
def test_a_gpu_build_loads_what_the_plan_chose(command: str, loads: list[dict[str, Any]], tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    target, draft = model_files(tmp_path, monkeypatch)
    monkeypatch.setattr(localspec.backend, "gpu_offload_supported", lambda: True)
    prompt = ["-p", "hi"] if command == "generate" else []
    assert cli.main([command, str(target), "--draft", str(draft), "--vram", "24GiB", *prompt]) == 2
    assert (loads[0]["n_ctx"], loads[0]["n_gpu_layers"], loads[0]["draft_n_gpu_layers"]) == (4096, 43, -1)
    err = capsys.readouterr().err
    if command == "generate":  # `run` shows the line in the app instead
        assert "localspec: GPU plan for --vram 24GiB: 42/80 target layers on the GPU (n_gpu_layers 43;" in err

    loads.clear()
    assert cli.main([command, str(target), "--draft", str(draft), "--vram", "24GiB", "--ctx", "8k", *prompt]) == 2
    assert loads[0]["n_ctx"] == 8192 and loads[0]["n_gpu_layers"] < 43
    loads.clear()
    assert cli.main([command, str(target), "--gpu-layers", "10", "--vram", "24GiB", *prompt]) == 2
    assert (loads[0]["n_ctx"], loads[0]["n_gpu_layers"]) == (DEFAULT_CTX, 10)


def test_the_plan_reads_the_gpus_free_memory(loads: list[dict[str, Any]], tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    target, draft = model_files(tmp_path, monkeypatch)
    monkeypatch.setattr(localspec.backend, "gpu_offload_supported", lambda: True)
    monkeypatch.setattr(localspec.backend, "gpu_devices", lambda: [("CUDA0 (Fake)", 24 * GIB, 24 * GIB)])
    assert cli.main(["generate", str(target), "--draft", str(draft), "-p", "hi"]) == 2
    assert loads[0]["n_gpu_layers"] == 43
    assert "GPU plan for CUDA0 (Fake) (24.00 GiB free of 24.00 GiB): 42/80" in capsys.readouterr().err


def test_a_cpu_build_loads_as_before(loads: list[dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    target, draft = model_files(tmp_path, monkeypatch)
    monkeypatch.setattr(localspec.backend, "gpu_offload_supported", lambda: False)
    assert cli.main(["generate", str(target), "--draft", str(draft), "-p", "hi", "--ctx", "2k"]) == 2
    assert (loads[0]["n_ctx"], loads[0]["n_gpu_layers"], loads[0]["draft_n_gpu_layers"]) == (2048, 0, 0)
    assert "GPU plan" not in capsys.readouterr().err


@pytest.mark.parametrize(("args", "message"), [
    (["--ctx", "32kb"], "localspec: error: --ctx '32kb' is not a token count; use e.g. 8192 or 8k"),
    (["--ctx", "8"], "localspec: error: --ctx 8 is too small: use at least 16 tokens"),
    (["--vram", "lots"], "localspec: error: --vram 'lots' is not a size"),
])
def test_bad_engine_options_are_one_line(args: list[str], message: str, loads: list[dict[str, Any]],
                                         capsys: pytest.CaptureFixture[str]) -> None:
    for command in (["generate", "-p", "hi"], ["run"], ["bench", "--draft", "ngram"]):
        assert cli.main([*command, *args]) == 2
        captured = capsys.readouterr()
        assert captured.err.startswith(message) and captured.err.count("\n") == 1 and captured.out == ""
    assert loads == []

