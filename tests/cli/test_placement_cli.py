"""The commands apply the GPU plan: `run`, `generate` and `bench` pretend the installed llama.cpp can
offload and stop at Engine.load to see what it would have been given (no model runs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import localspec.backend
import localspec.commands.run
import localspec.engine
import localspec.models.gguf_info
from localspec import cli
from localspec.errors import LocalspecError
from localspec.models import placement
from localspec.models.placement import DEFAULT_CTX, Vram
from localspec.models.memory import GIB
from model_shapes import LLAMA_1B, LLAMA_70B


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
    monkeypatch.setattr(localspec.commands.run, "needs_terminal", lambda: None)  # as if in a terminal
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



def test_negative_gpu_layers_other_than_minus_one_are_refused(loads: list[dict[str, Any]],
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 33: --gpu-layers -7 was accepted."""
    for command in (["generate", "-p", "hi"], ["run"], ["bench", "--draft", "ngram"]):
        assert cli.main([*command, "--gpu-layers", "-7"]) == 2
        captured = capsys.readouterr()
        assert captured.err == ("localspec: error: --gpu-layers -7 is out of range: use -1 (all layers), 0 (none) "
                                "or a number of layers\n") and captured.out == ""
    assert loads == []


def test_a_cpu_build_says_gpu_options_do_nothing(loads: list[dict[str, Any]], tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 33: on a CPU-only build --gpu-layers and --vram were ignored without a word."""
    target, draft = model_files(tmp_path, monkeypatch)
    monkeypatch.setattr(localspec.backend, "gpu_offload_supported", lambda: False)
    cases = [(["--gpu-layers", "20"], "--gpu-layers does nothing"), (["--vram", "8GiB"], "--vram does nothing"),
             (["--gpu-layers", "-1", "--vram", "8GiB"], "--gpu-layers and --vram do nothing")]
    for extra, needle in cases:
        assert cli.main(["generate", str(target), "-p", "hi", *extra]) == 2
        warnings = [ln for ln in capsys.readouterr().err.splitlines() if "warning" in ln]
        assert warnings == [f"localspec: warning: {needle} here: this llama.cpp build runs on the CPU only "
                            "(see `localspec doctor`)"]
    assert cli.main(["generate", str(target), "-p", "hi", "--gpu-layers", "0"]) == 2  # asks for what it gets
    assert "warning" not in capsys.readouterr().err
    monkeypatch.setattr(localspec.backend, "gpu_offload_supported", lambda: True)
    assert cli.main(["generate", str(target), "-p", "hi", "--gpu-layers", "20"]) == 2
    assert "warning" not in capsys.readouterr().err
