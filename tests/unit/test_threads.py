"""The default thread count: one per physical core among the CPUs this process may use."""

from __future__ import annotations

import os

import pytest

from localspec.backend import build


def test_hardware_threads_of_one_core_count_once() -> None:
    smt = {0: "0,4", 1: "1,5", 2: "2,6", 3: "3,7", 4: "0,4", 5: "1,5", 6: "2,6", 7: "3,7"}
    assert build.physical_cores(set(range(8)), smt.get) == 4  # 4 cores, 2 threads each
    assert build.physical_cores({0, 4}, smt.get) == 1  # pinned to both threads of one core
    assert build.physical_cores({0, 1}, smt.get) == 2
    assert build.physical_cores({0, 1, 2}, {0: "0", 1: "1", 2: "2"}.get) == 3  # no SMT
    assert build.physical_cores({0, 1, 2}, lambda cpu: None) == 3  # topology unknown: each CPU alone
    assert build.physical_cores(set(), smt.get) == 1


def test_default_threads_reads_this_machines_topology(monkeypatch: pytest.MonkeyPatch) -> None:
    if not hasattr(os, "sched_getaffinity"):
        pytest.skip("no CPU affinity on this platform")
    monkeypatch.setattr(build.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.setattr(build, "_thread_siblings", {0: "0-1", 1: "0-1", 2: "2-3", 3: "2-3"}.get)
    monkeypatch.setattr(build, "_performance_cpus", lambda: None)
    assert build.default_threads() == 2 and build.usable_cpus() == 4
    monkeypatch.setattr(build, "_performance_cpus", lambda: {0, 1})  # a hybrid CPU: cores 2-3 are E-cores
    assert build.default_threads() == 1 and build.usable_cpus() == 4
    # This process's real topology: never more threads than CPUs, at least one.
    monkeypatch.undo()
    assert 1 <= build.default_threads() <= build.usable_cpus() == len(os.sched_getaffinity(0))
    assert build._thread_siblings(min(os.sched_getaffinity(0))) is not None or not os.path.isdir("/sys/devices/system/cpu")


def test_a_hybrid_cpu_decodes_on_its_performance_cores(tmp_path) -> None:  # noqa: ANN001
    """An i9-13900K's layout: 8 performance cores with two hardware threads each (CPUs 0-15), 16 efficiency
    cores (16-31). llama.cpp's tools take the 8; so does localspec, and any CPUs when pinned to E-cores."""
    (tmp_path / "cpu_core").mkdir()
    (tmp_path / "cpu_atom").mkdir()
    (tmp_path / "cpu_core" / "cpus").write_text("0-15\n")
    (tmp_path / "cpu_atom" / "cpus").write_text("16-31\n")
    performance = build._performance_cpus(tmp_path)
    assert performance == set(range(16))
    siblings = {cpu: f"{cpu & ~1}-{cpu | 1}" for cpu in range(16)} | {cpu: str(cpu) for cpu in range(16, 32)}
    everything = set(range(32))
    assert build.physical_cores(build.math_cpus(everything, performance), siblings.get) == 8
    assert build.physical_cores(build.math_cpus(everything, None), siblings.get) == 24  # not known as hybrid
    assert build.math_cpus({20, 21}, performance) == {20, 21}  # pinned to efficiency cores
    assert build.math_cpus({1, 20}, performance) == {1}
    # not hybrid: no cpu_atom (or nothing readable)
    (tmp_path / "cpu_atom" / "cpus").unlink()
    assert build._performance_cpus(tmp_path) is None
    assert build._performance_cpus(tmp_path / "nothing") is None
    assert build.cpu_list("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11} and build.cpu_list("") == set()
