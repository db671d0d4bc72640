"""benchmarks/gpu/variants.py: each setting of once-per-process switches in processes of its own, in the
order a, b, b, a, with its switches set and the others' unset; medians per setting; a failed process named."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

GPU_DIR = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu"
sys.path.insert(0, str(GPU_DIR))

from variants import measure_variants, run_variants  # noqa: E402

CHILD = """
import json, os, sys
log, variant = sys.argv[1], sys.argv[sys.argv.index("--variant") + 1]
with open(log, "a") as f:
    runs = sum(1 for _ in open(log)) if os.path.exists(log) else 0
    f.write(variant + "=" + os.environ.get("SWITCH", "<unset>") + "\\n")
if variant == "broken":
    sys.exit("no device")
print("some output first")
print(json.dumps({"ms": 10.0 * (runs + 1), "setting": len(os.environ.get("SWITCH", ""))}))
"""


def test_settings_run_in_order_with_the_switch_set_or_unset_and_medians_per_setting(tmp_path: Path,
                                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    script, log = tmp_path / "child.py", tmp_path / "runs.log"
    script.write_text(CHILD)
    monkeypatch.setenv("SWITCH", "left over from the caller")
    medians, processes = run_variants(str(script), [str(log)], {"stock": {}, "mmq": {"SWITCH": "1"}}, rounds=2)
    assert processes == 8
    assert log.read_text().split() == ["stock=<unset>", "mmq=1", "mmq=1", "stock=<unset>"] * 2
    assert medians["stock"] == {"ms": 45.0, "setting": 0}  # runs 1, 4, 5, 8: 10, 40, 50, 80 ms
    assert medians["mmq"] == {"ms": 45.0, "setting": 1}  # runs 2, 3, 6, 7


def test_each_setting_sets_its_own_switches_and_unsets_the_others(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    script, log = tmp_path / "child.py", tmp_path / "runs.log"
    script.write_text(CHILD.replace('os.environ.get("SWITCH", "<unset>")',
                                    'os.environ.get("SWITCH", "<unset>") + "," + os.environ.get("OTHER", "<unset>")'))
    monkeypatch.setenv("SWITCH", "left over")
    monkeypatch.setenv("OTHER", "left over")
    _, processes = run_variants(str(script), [str(log)], {"stock": {}, "mmq": {"SWITCH": "1"},
                                                          "invariant": {"OTHER": "1"}})
    assert processes == 6
    assert log.read_text().split() == ["stock=<unset>,<unset>", "mmq=1,<unset>", "invariant=<unset>,1",
                                       "invariant=<unset>,1", "mmq=1,<unset>", "stock=<unset>,<unset>"]


def test_a_failed_process_is_named_and_nothing_is_returned(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script, log = tmp_path / "child.py", tmp_path / "runs.log"
    script.write_text(CHILD)
    assert run_variants(str(script), [str(log)], {"stock": {}, "broken": {"SWITCH": "x"}}) is None
    err = capsys.readouterr().err
    assert "no device" in err and "child.py: the broken run failed (exit 1)" in err
    assert log.read_text().split() == ["stock=<unset>", "broken=x"]  # it stopped at the failure


def test_the_results_object_holds_what_was_measured_the_processes_and_the_medians(tmp_path: Path) -> None:
    script, log, out = tmp_path / "child.py", tmp_path / "runs.log", tmp_path / "out.json"
    script.write_text(CHILD)
    results = measure_variants(str(script), [str(log)], {"stock": {}, "mmq": {"SWITCH": "1"}}, 1,
                               {"model": "m.gguf", "n": 4}, out)
    assert results == {"model": "m.gguf", "n": 4, "processes": 4,
                       "stock": {"ms": 25.0, "setting": 0}, "mmq": {"ms": 25.0, "setting": 1}}
    assert json.loads(out.read_text()) == results
    assert measure_variants(str(script), [str(log)], {"broken": {"SWITCH": "x"}}, 1, {}, tmp_path / "no.json") is None
    assert not (tmp_path / "no.json").exists()
