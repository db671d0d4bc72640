"""A simulated clock for the controller (``Controller(clock=...)``): seconds that pass only when spent.

For what runs the controller on simulated costs (the tests' harness, the GPU simulation in
``benchmarks/gpu/simulate.py``): the time a simulated drafter or step takes is spent on it, so what
the controller times is what the simulation charged, and nothing measures the machine.
"""

from __future__ import annotations


class SimClock:
    """Simulated seconds: ``clock()`` reads them, ``spend(ms)`` moves them on."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def spend(self, ms: float) -> None:
        self.now += ms / 1e3
