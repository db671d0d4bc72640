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
    assert build.default_threads() == 2 and build.usable_cpus() == 4
    # This process's real topology: never more threads than CPUs, at least one.
    monkeypatch.undo()
    assert 1 <= build.default_threads() <= build.usable_cpus() == len(os.sched_getaffinity(0))
    assert build._thread_siblings(min(os.sched_getaffinity(0))) is not None or not os.path.isdir("/sys/devices/system/cpu")
