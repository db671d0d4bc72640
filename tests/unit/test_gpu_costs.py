"""The controller at a GPU's costs (benchmarks/gpu/simulate.py, the RTX 4090 cost file): nothing it
learned on a CPU, where a batch of 16 costs ~7 one-token decodes, may keep it short or plain there."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

GPU_DIR = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu"
sys.path.insert(0, str(GPU_DIR))

import simulate  # noqa: E402

COSTS = simulate.load_costs(GPU_DIR / "rtx4090-14b-q4km.toml")
STEPS = 400


def test_the_4090_file_is_a_gpu_curve() -> None:
    ratio = {k: v / COSTS.target[1] for k, v in COSTS.target.items()}
    assert ratio[1] == 1.0 and ratio[16] < 1.5 and ratio[32] < 2.0  # memory-bound: a batch costs little more
    assert COSTS.draft[1] < 0.3 * COSTS.target[1]


@pytest.mark.parametrize("alpha", [0.7, 0.8, 0.9])
def test_at_gpu_costs_a_lookup_drafts_long_and_never_decodes_plainly(alpha: float) -> None:
    sim = simulate.simulate(COSTS, simulate.run_lengths_from_alpha(alpha, seed=1), drafter_kind="lookup",
                            steps=STEPS)
    assert sim.median_length() >= 6
    assert sim.plain_steps == 0
    assert sim.speedup > 2.0


def test_at_gpu_costs_a_good_draft_model_drafts_long_after_the_first_token() -> None:
    """The first token never waits for the draft's prefill (by design); every step after it drafts."""
    sim = simulate.simulate(COSTS, simulate.run_lengths_from_alpha(0.9, seed=1), drafter_kind="draft",
                            steps=STEPS)
    assert sim.median_length() >= 6
    assert sim.plain_steps <= 1
    assert sim.speedup > 1.5


def test_the_controller_is_near_the_best_fixed_length() -> None:
    make = lambda: simulate.run_lengths_from_alpha(0.8, seed=2)  # noqa: E731
    auto = simulate.simulate(COSTS, make(), drafter_kind="lookup", steps=STEPS).speedup
    _, best = simulate.best_fixed(COSTS, make, drafter_kind="lookup", steps=STEPS)
    assert auto >= 0.9 * best


def test_a_trace_replays_its_run_lengths() -> None:
    agree = simulate.run_lengths_from_trace([3, 0, 16])
    assert [agree(8) for _ in range(4)] == [3, 0, 16, 3]


def test_a_bad_cost_file_is_one_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[target]\ndecode_ms = -1\n[draft]\nstep_ms = 1\n")
    assert simulate.main([str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("simulate.py: error: ") and "positive" in err and "Traceback" not in err
