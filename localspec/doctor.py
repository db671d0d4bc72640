"""``localspec doctor``'s findings: the build, the GPUs, the folders, and a self-test decode.

Nothing here loads llama.cpp into this process: whatever runs llama.cpp runs in
a child (``localspec.backend.selftest``), so a build that crashes the machine it was
built on (SIGILL in ggml's AMX kernels, say) is reported as one line instead of
killing the caller. ``scripts/setup.sh`` uses the same check after installing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

# What a signal that kills the self-test most likely means, and what to do.
SIGNAL_MEANINGS = {
    "SIGILL": "illegal instruction: this llama.cpp build uses CPU instructions this machine cannot run "
              "(a native build made on another CPU, or ggml's AMX kernels); rebuild it here with "
              "scripts/setup.sh, which keeps AMX off unless LOCALSPEC_AMX=on",
    "SIGSEGV": "segmentation fault inside llama.cpp; rebuild with scripts/setup.sh and report it if it stays",
    "SIGBUS": "bus error: the model file changed or shrank while mapped; re-download it with `localspec pull`",
    "SIGABRT": "llama.cpp aborted on a failed check; rerun with LOCALSPEC_LLAMA_LOG=1 to see its reason",
    "SIGFPE": "arithmetic fault inside llama.cpp; rebuild with scripts/setup.sh",
    "SIGKILL": "killed from outside, most likely for lack of memory",
}
SELFTEST_TIMEOUT_S = 300


@dataclass(frozen=True)
class ChildResult:
    """How a child process ended and the JSON records it printed before that."""

    returncode: int | None
    records: dict[str, Any] = field(default_factory=dict)
    stderr_tail: str = ""
    timed_out: bool = False

    @property
    def signal_name(self) -> str | None:
        if self.returncode is None or self.returncode >= 0:
            return None
        try:
            return signal.Signals(-self.returncode).name
        except ValueError:
            return f"signal {-self.returncode}"

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def failure(self) -> str:
        """One line: why the child failed ("" when it did not)."""
        if self.ok:
            return ""
        if self.timed_out:
            return f"did not finish within {SELFTEST_TIMEOUT_S} s"
        name = self.signal_name
        if name is not None:
            return f"died with {name} ({SIGNAL_MEANINGS.get(name, 'killed by a signal')})"
        last = self.stderr_tail.strip().splitlines()[-1:] or ["no output"]
        return f"exited with code {self.returncode}: {last[0]}"


def run_child(cmd: Sequence[str], *, timeout: float = SELFTEST_TIMEOUT_S) -> ChildResult:
    """Run ``cmd``; collect the ``{"key": value}`` lines it printed on stdout, even if it died."""
    env = dict(os.environ)
    env.pop("LOCALSPEC_LLAMA_LOG", None)  # keep stdout to our JSON lines
    try:
        proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, env=env,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as err:
        out = err.stdout.decode() if isinstance(err.stdout, bytes) else (err.stdout or "")
        return ChildResult(None, _records(out), "", timed_out=True)
    return ChildResult(proc.returncode, _records(proc.stdout), proc.stderr[-2000:])


def _records(stdout: str) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for line in stdout.splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict):
            found.update(obj)
    return found


def selftest(model: Path | None, rpc: Sequence[str] = ()) -> ChildResult:
    """Build facts, the RPC servers at ``rpc`` endpoints, and with ``model`` the long-batch and verification
    decode, from a child process (a server that goes away there ends the child, not the doctor)."""
    cmd = [sys.executable, "-m", "localspec.backend.selftest"]
    if rpc:
        cmd += ["--rpc", ",".join(rpc)]
    if model is not None:
        cmd.append(str(model))
    return run_child(cmd)


def folders() -> dict[str, Path]:
    from localspec.paths import cache_dir, data_dir
    from localspec.models.registry_file import user_config_dir

    return {"config": user_config_dir(), "cache": cache_dir(), "data": data_dir()}


def default_model() -> tuple[str, Path | None]:
    """The registry's default model's name and its file on disk (None: not downloaded)."""
    from localspec.models import hub
    from localspec.models.registry_file import load_registry

    spec = load_registry().default
    if spec is None:
        return "", None
    return spec.name, hub.cached_path(spec)
