"""The controller on the costs measured on an H200 (benchmarks/gpu/costs/, provenance in its README) and
on the two what-ifs beside them: it reaches >= 95% of the best fixed draft length's speedup for the draft
model and for a lookup at alpha 0.6-0.9 (issue 39). Each figure is the mean over seeded runs of
simulate.py's real Controller and CostModel on a simulated clock; the best fixed length is found with the
same draws."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import pytest

GPU_DIR = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu"
sys.path.insert(0, str(GPU_DIR))

import simulate  # noqa: E402

STEPS = 1500
SEEDS = range(8)
FILES = ("h200-8b-q4km", "h200-8b-flat-verify", "h200-8b-one-layer-draft")


def _costs(name: str) -> simulate.GpuCosts:
    return simulate.load_costs(GPU_DIR / "costs" / f"{name}.toml")


def test_the_measured_file_is_the_h200_run() -> None:
    costs = _costs("h200-8b-q4km")
    assert "MEASURED on 2026-12-04" in (GPU_DIR / "costs" / "h200-8b-q4km.toml").read_text()
    assert costs.target[1] == pytest.approx(3.74) and costs.draft[1] == pytest.approx(1.25)
    assert costs.target[8] / costs.target[1] == pytest.approx(2.33)  # verification far from flat there


@pytest.mark.parametrize("name", FILES)
@pytest.mark.parametrize("kind", simulate.DRAFTERS)
@pytest.mark.parametrize("alpha", [0.6, 0.7, 0.8, 0.9])
def test_the_controller_reaches_95_percent_of_the_best_fixed_length(name: str, kind: str, alpha: float) -> None:
    costs = _costs(name)
    mean = statistics.mean(
        simulate.simulate(costs, simulate.run_lengths_from_alpha(alpha, seed), drafter_kind=kind, steps=STEPS).speedup
        for seed in SEEDS)
    best_k, best = simulate.best_fixed(costs, lambda: simulate.run_lengths_from_alpha(alpha, 0), drafter_kind=kind,
                                       steps=STEPS)
    assert mean >= 0.95 * max(1.0, best), f"{name} {kind} alpha {alpha}: {mean:.3f} vs k={best_k} {best:.3f}"
