"""`localspec ...` run as a user runs it, and the one-line error a user mistake must give."""

from __future__ import annotations

import os
import subprocess
import sys


def localspec(*args: str, stdin: str | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """A real process, so a traceback would show; the personal store stays out of it."""
    return subprocess.run([sys.executable, "-m", "localspec", *args], input=stdin, capture_output=True, text=True,
                          timeout=timeout,
                          env={**os.environ, "PYTHONUNBUFFERED": "1", "LOCALSPEC_NO_HISTORY": "1"})


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    """The single `localspec: error: ...` line of a run that exited 2 without a traceback."""
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("localspec: error: ")
    return lines[0]


def assert_clean_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    """``proc`` failed with the one error line, which names every one of ``needles`` (any case)."""
    line = one_error_line(proc)
    for needle in needles:
        assert needle.lower() in line.lower(), line
