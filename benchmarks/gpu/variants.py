"""One measurement under each setting of switches that a llama.cpp build reads once per process (our CUDA
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
from pathlib import Path
from typing import Any, Sequence


def run_variants(script: str, args: Sequence[str], settings: dict[str, dict[str, str]],
                 rounds: int = 1) -> tuple[dict[str, dict[str, float]], int] | None:
    """Run ``python script *args --variant NAME`` once a sweep for each of ``settings`` (name -> the
    switches it sets, ``{variable: value}``; a variable some setting names is unset in every other
    one), each printing one JSON object of figures as its last line. Returns (each setting's median
    figures, the number of processes run); None when a process failed (its error's tail and one line
    naming the setting are printed)."""
    names = list(settings)
    variables = {variable for switches in settings.values() for variable in switches}
    order = [name for _ in range(rounds) for name in names + names[::-1]]
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    for name in order:
        env = {key: value for key, value in os.environ.items() if key not in variables}
        env.update(settings[name])
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


def measure_variants(script: str, args: Sequence[str], settings: dict[str, dict[str, str]], rounds: int,
                     about: dict[str, object], json_path: Path | None) -> dict[str, Any] | None:
    """``run_variants``, then one results object: ``about`` (what was measured), the processes run and each
    setting's medians, written to ``json_path`` where given. None when a process failed."""
    done = run_variants(script, args, settings, rounds)
    if done is None:
        return None
    medians, processes = done
    results: dict[str, Any] = {**about, "processes": processes, **medians}
    if json_path is not None:
        json_path.write_text(json.dumps(results, indent=1))
    return results
