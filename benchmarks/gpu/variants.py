"""One measurement under each setting of a switch that a llama.cpp build reads once per process (our CUDA
patches' ``LOCALSPEC_CUDA_*`` variables): each setting in processes of its own, run in the order
a, b, ..., b, a (``rounds`` such sweeps), since the same decode costs a few percent more or less from one
process to the next and the first process pays for a cold start; the figures are medians over each
setting's processes. ``graphs.py`` and ``kernels.py`` run their measurements through it.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from typing import Sequence


def run_variants(script: str, args: Sequence[str], variable: str, settings: dict[str, str | None],
                 rounds: int = 1) -> tuple[dict[str, dict[str, float]], int] | None:
    """Run ``python script *args --variant NAME`` once a sweep for each of ``settings`` (name -> the
    value of ``variable``, None: unset), each printing one JSON object of figures as its last line.
    Returns (each setting's median figures, the number of processes run); None when a process failed
    (its error's tail and one line naming the setting are printed)."""
    names = list(settings)
    order = [name for _ in range(rounds) for name in names + names[::-1]]
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    for name in order:
        env = dict(os.environ)
        env.pop(variable, None)
        if settings[name] is not None:
            env[variable] = str(settings[name])
        run = subprocess.run([sys.executable, script, *args, "--variant", name], env=env, capture_output=True,
                             text=True)
        if run.returncode != 0:
            print(run.stderr[-2000:], file=sys.stderr)
            print(f"{os.path.basename(script)}: the {name} run failed (exit {run.returncode})", file=sys.stderr)
            return None
        runs[name].append(json.loads(run.stdout.strip().splitlines()[-1]))
    medians = {name: {key: statistics.median(r[key] for r in runs[name]) for key in runs[name][0]}
               for name in names}
    return medians, len(order)
