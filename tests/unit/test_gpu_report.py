"""The GPU check's report (benchmarks/gpu/report.py): the step overhead's, the CUDA graphs' and the kernel
phases' tables, and a phase's file that is missing or unreadable left out rather than failing the report."""

from __future__ import annotations

import json
import sys
from pathlib import Path

GPU_DIR = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu"
sys.path.insert(0, str(GPU_DIR))

import report  # noqa: E402

GRAPHS = {"model": "target-8b.gguf", "k": 4, "n": 48,
          "address": {"one, steady": 3.6, "one, alternating": 4.5},
          "shape": {"one, steady": 3.6, "one, alternating": 3.7, "batch, alternating": 8.1}}


def test_the_graphs_table_sets_each_decode_keyed_by_shape_beside_keyed_by_address() -> None:
    lines = report.graphs_lines(GRAPHS)
    assert "| one, steady | 3.600 | 3.600 | 1.00 |" in lines
    assert "| one, alternating | 4.500 | 3.700 | 0.82 |" in lines
    assert "| batch, alternating | | 8.100 | |" in lines  # (the address run had no such row)
    assert any("batches of k + 1 = 5 rows" in line for line in lines)


OVERHEAD = {"model": "target-8b.gguf", "tokens": 128, "rounds": 3,
            "rows": [{"loop": "plain", "anchor": "raw plain", "ratio": 0.97, "host_us_per_step": 80.0,
                      "raw_host_us_per_step": 60.0, "host_ratio": 0.99, "goal": 0.95}]}


def test_the_overhead_section_says_what_the_device_argmax_did_when_it_was_measured() -> None:
    lines = report.overhead_lines(OVERHEAD)
    assert "| plain | raw plain | 0.970 | 80.0 / 60.0 | 0.990 | >= 0.95 |" in lines
    assert not any("greedy sampler" in line for line in lines)  # (a file from before it was measured)
    device = {"ratio": 1.042, "same_tokens": False, "host_us_per_step": 20.5, "raw_host_us_per_step": 60.0}
    lines = report.overhead_lines({**OVERHEAD, "device_argmax": device})
    said = next(line for line in lines if "greedy sampler" in line)
    assert "1.042x the raw loop's tokens/s" in said and "20.5 us a step against 60.0" in said
    assert said.endswith("the same tokens: no.")


def test_the_overhead_section_gives_the_warm_host_cost_when_it_was_measured() -> None:
    assert not any("no decode at all" in line for line in report.overhead_lines(OVERHEAD))
    lines = report.overhead_lines({**OVERHEAD, "warm_host_us_per_step": {"raw plain": 7.2, "plain": 13.5}})
    said = next(line for line in lines if "no decode at all" in line)
    assert "a plain step 13.5 us on the host, against the raw loop's 7.2" in said
    assert "ngram" not in said  # (its lookup drafted: left out)
    lines = report.overhead_lines({**OVERHEAD, "warm_host_us_per_step": {"raw plain": 7.2, "plain": 13.5,
                                                                          "ngram-none": 19.25}})
    said = next(line for line in lines if "no decode at all" in line)
    assert "a plain step 13.5 us on the host, an ngram-none step 19.2 us, against the raw loop's 7.2" in said
    # (a reply ended early: not measured, nothing said)
    assert not any("no decode at all" in line
                   for line in report.overhead_lines({**OVERHEAD, "warm_host_us_per_step": None}))


KERNELS = {"model": "target-8b.gguf", "n": 16, "processes": 6,
           "stock": {"1": 3.74, "4": 5.94, "8": 8.73, "max_diff 4": 0.5, "top_differs 4": 0},
           "mmq": {"1": 3.70, "4": 4.44, "16": 5.2, "max_diff 4": 1.25, "top_differs 4": 1},
           "invariant": {"1": 3.80, "4": 6.08, "8": 9.5, "max_diff 4": 0.0, "top_differs 4": 0}}


def test_the_kernels_table_sets_each_batch_under_each_setting_beside_ggmls_choice() -> None:
    lines = report.kernels_lines(KERNELS)
    assert "| k | stock (ms) | × k = 1 | MMQ from 2 (ms) | × k = 1 | × stock | batch-invariant (ms) | × k = 1 | " \
           "× stock |" in lines
    assert "| 1 | 3.740 | 1.00 | 3.700 | 1.00 | 0.99 | 3.800 | 1.00 | 1.02 |" in lines
    assert "| 4 | 5.940 | 1.59 | 4.440 | 1.20 | 0.75 | 6.080 | 1.60 | 1.02 |" in lines
    assert "| 8 | 8.730 | 2.33 | | | | 9.500 | 2.50 | 1.09 |" in lines  # (the mmq runs had no such size)
    assert "| 16 | | | 5.200 | 1.41 | | | | |" in lines  # (nor stock's and the invariant's this one)
    assert any("6 processes, in the order stock, mmq, invariant, invariant, mmq, stock" in line for line in lines)
    assert "| 4 | 0.5 | 0 | 1.25 | 1 | 0 | 0 |" in lines  # each batch row against the same row decoded alone
    assert not any(line.startswith("| max_diff") for line in lines)


def test_a_kernels_file_from_before_the_invariant_setting_still_makes_its_tables() -> None:
    old = {key: value for key, value in KERNELS.items() if key != "invariant"}
    lines = report.kernels_lines(old)
    assert "| 4 | 5.940 | 1.59 | 4.440 | 1.20 | 0.75 |" in lines
    assert "| 4 | 0.5 | 0 | 1.25 | 1 |" in lines
    assert any("in the order stock, mmq, mmq, stock" in line for line in lines)


def test_a_missing_or_unreadable_phase_is_left_out(tmp_path: Path) -> None:
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"device": {"gpus": []}}))
    bad = tmp_path / "graphs.json"
    bad.write_text("{not json")
    good = tmp_path / "good.json"
    good.write_text(json.dumps(GRAPHS))
    for graphs, shown in ((tmp_path / "none.json", False), (bad, False), (good, True)):
        out = tmp_path / "RESULTS.md"
        assert report.main([str(results), "--out", str(out), "--graphs", str(graphs)]) == 0
        assert ("## CUDA graphs across speculation's shapes" in out.read_text()) is shown
