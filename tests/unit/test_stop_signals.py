"""SIGTERM and SIGHUP stop a command as Ctrl-C does; a hangup's second SIGHUP must not kill it before it
writes its result (issue 33: `generate --json` exited 129 with nothing on stdout)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

CHILD = r"""
import os, signal, sys, time
from localspec.commands.signals import Terminated, stop_on_signals
stop_on_signals()
try:
    print("ready", flush=True)  # inside the try: a signal from here on is caught
    while True:
        time.sleep(0.01)
except Terminated as stop:
    # what a hangup does next: the shell passes SIGHUP on to its jobs (a second one), or SIGTERM again
    os.kill(os.getpid(), stop.signum)
    time.sleep(0.2)
    print("result written", stop, flush=True)
    sys.exit(stop.exit_code)
"""


def run_child(signum: int) -> subprocess.CompletedProcess[str]:
    proc = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    # the handlers are in place once it says so (a fixed wait lost the race on a loaded machine)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    proc.send_signal(signum)
    out, _ = proc.communicate(timeout=30)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, "")


def test_a_second_sighup_is_ignored_so_the_result_is_written() -> None:
    done = run_child(signal.SIGHUP)
    assert done.stdout == "result written SIGHUP\n" and done.returncode == 128 + signal.SIGHUP


def test_a_second_sigterm_still_kills_at_once() -> None:
    done = run_child(signal.SIGTERM)
    assert done.stdout == "" and done.returncode == -signal.SIGTERM
