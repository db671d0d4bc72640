"""`localspec plan`: the plan printed and refused through the command line, and the contexts the engine builds from it."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from localspec import cli
from localspec.commands import plan as plan_command
from localspec.models.gguf_info import read_info
from localspec.llama_facts import DRAFT_N_UBATCH
from localspec.models.memory import GIB
from localspec.models.planner import plan


@pytest.fixture(scope="module")
def tiny_lfm2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random LFM2 (hybrid) the engine tests use."""
    from hybrid_model import write_lfm2

    return write_lfm2(tmp_path_factory.mktemp("recurrent") / "lfm2-tiny.gguf")


# --- the `plan` command --------------------------------------------------------------------------


def run_plan(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="localspec")
    plan_command.register(parser.add_subparsers())
    args = parser.parse_args(["plan", *argv])
    return args.func(args)


def test_plan_command_json(smollm2_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_plan([str(smollm2_path), "--draft", str(smollm2_path), "--vram", "8G", "--ctx", "2k", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["n_ctx"] == out["requested_ctx"] == 2048 and out["vram_bytes"] == 8 * GIB
    assert out["target"]["n_gpu_layers"] == -1 and out["draft"]["label"] == "SmolLM2-135M-Instruct.Q4_1"
    assert out["gpu_offload_supported"] in (True, False)  # what the installed llama.cpp says
    assert out["gpu_bytes"] == out["target"]["gpu_bytes"] + out["draft"]["gpu_bytes"]


def test_plan_command_table(gemma_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_plan([str(gemma_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("model") and "target gemma-3-270m-q4_k_m" in out and "context 32768 tokens" in out


def test_plan_command_splits_over_one_size_per_gpu(smollm2_path: Path, gemma_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert run_plan([str(gemma_path), "--vram", "1GiB,3GiB", "--reserve", "256MiB"]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.startswith("  GPU")]
    assert [r[0] for r in rows] == ["GPU0", "GPU1"] and [r[4] for r in rows] == ["21%", "79%"]  # 0.75 : 2.75 GiB usable
    assert "devices total" in out and "compute buffer of its own" in out
    assert run_plan([str(smollm2_path), "--draft", str(smollm2_path), "--vram", "2GiB,2GiB", "--draft-gpu", "1",
                     "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["draft_card"] == 1 and [c["draft_bytes"] > 0 for c in out["cards"]] == [False, True]
    assert out["cards"][0]["share"] > out["cards"][1]["share"]  # GPU1 also holds the draft
    assert cli.main(["plan", str(smollm2_path), "--vram", "2GiB,2GiB", "--draft-gpu", "2"]) == 2
    assert "--draft-gpu 2 is none of the 2 GPUs" in capsys.readouterr().err


def test_plan_command_errors_through_the_cli(smollm2_path: Path, gemma_path: Path, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["plan", str(smollm2_path), "--draft", str(tmp_path / "missing.gguf")]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "model file not found" in captured.err
    assert cli.main(["plan", str(tmp_path / "missing.gguf")]) == 2
    assert "model file not found" in capsys.readouterr().err
    assert cli.main(["plan", str(smollm2_path), "--vram", "lots"]) == 2
    assert "--vram 'lots' is not a size" in capsys.readouterr().err
    assert cli.main(["plan", str(smollm2_path), "--ctx", "many"]) == 2
    assert "--ctx 'many' is not a token count" in capsys.readouterr().err


def test_plan_command_names_the_pair_kind(smollm2_path: Path, gemma_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """A draft of another tokenizer drafts by text (issue 43): the plan counts it and says what it costs."""
    assert run_plan([str(gemma_path), "--draft", str(smollm2_path)]) == 0
    assert "\npair: another tokenizer, drafting by text (each step re-encodes" in capsys.readouterr().out
    assert run_plan([str(smollm2_path), "--draft", str(smollm2_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["pair"] == "same vocabulary"


def _logged_compute_mib() -> float:
    """The last compute buffer size llama.cpp logged (MiB)."""
    import re

    from localspec.backend import recent_log

    sizes = re.findall(r"compute buffer size =\s+([\d.]+) MiB", "".join(recent_log()))
    assert sizes, "llama.cpp logged no compute buffer size"
    return float(sizes[-1])


def test_the_draft_context_is_planned_and_built_with_the_small_batch(smollm2_path: Path,
                                                                      smollm2_q4_0_path: Path) -> None:
    from localspec.backend import Context, Model
    from localspec.engine import Engine

    p = plan(read_info(smollm2_path), read_info(smollm2_q4_0_path), n_ctx=1024)
    # The planner sizes the draft's compute buffer for 128 tokens: 512 x (49152 + 576) + 4 MiB.
    assert p.draft.compute_bytes == 4 * DRAFT_N_UBATCH * (49152 + 576) + (4 << 20)
    engine = Engine.load(smollm2_path, smollm2_q4_0_path, n_ctx=1024, personal_history=False)
    try:
        assert engine.draft_ctx is not None and engine.draft_ctx.n_batch == DRAFT_N_UBATCH
        assert engine.ctx.n_batch == 512
    finally:
        engine.close()
    # What llama.cpp reserves for such contexts stays within the planner's estimates (its stage
    # estimate is an upper bound), and the draft's is about a quarter of the target's.
    logged = {}
    for path, n_batch, planned in ((smollm2_path, 512, p.target.compute_bytes),
                                   (smollm2_q4_0_path, DRAFT_N_UBATCH, p.draft.compute_bytes)):
        model = Model(path, n_gpu_layers=0)
        ctx = Context(model, n_ctx=1024, n_batch=n_batch)
        logged[n_batch] = _logged_compute_mib() * (1 << 20)
        ctx.close()
        model.close()
        assert 0.75 * planned <= logged[n_batch] <= planned
    assert logged[DRAFT_N_UBATCH] < logged[512] / 3


# --- recurrent state and its snapshots -------------------------------------------------------------


def test_plan_command_shows_the_snapshots(tiny_lfm2: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_plan([str(tiny_lfm2), "--vram", "8G", "--ctx", "1k"]) == 0
    out = capsys.readouterr().out
    assert "recurrent state in 4 of 6 layers" in out and "16 snapshots" in out


