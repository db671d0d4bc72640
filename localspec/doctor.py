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


@dataclass(frozen=True)
class PairFinding:
    """What ``doctor --draft`` found of the model and a draft model: which kind of pair they are, from
    their GGUF headers (llama.cpp is not loaded), or why they cannot run together."""

    draft: str
    """The draft as the user named it (a registry name, or a file's name)."""
    kind: str | None = None
    """``SAME_VOCAB`` or ``TEXT_PAIR`` (``localspec.drafting.by_text``); None: refused or not judged."""
    better: str | None = None
    """For a pair drafting by text: a draft of the target's own family the registry knows."""
    problem: str = ""
    """Why the pair cannot run, in one line ("" when it can)."""
    unchecked: str = ""
    """Why the headers were not read (a file not downloaded); "" when they were."""

    def to_dict(self) -> dict[str, Any]:
        from localspec.drafting.by_text import TEXT_PAIR, TEXT_PAIR_COST

        return {"draft": self.draft, "kind": self.kind, "cost": TEXT_PAIR_COST if self.kind == TEXT_PAIR else None,
                "better": self.better, "problem": self.problem or None, "unchecked": self.unchecked or None}


def judge_pair(target: Path | None, draft: Path | None, draft_name: str, *, missing: str = "",
               by_family: str | None = None, better: str | None = None) -> PairFinding:
    """The kind of pair ``draft`` makes with ``target`` (``pairing.pair_kind``), or the one line that refuses
    it. ``missing``: the name of whichever file is not on disk; then nothing is read, and the kind is
    ``by_family``, what the registry's families say (None: unknown). ``better`` is kept for a pair that
    drafts by text."""
    from localspec.drafting.by_text import TEXT_PAIR
    from localspec.errors import LocalspecError
    from localspec.models.gguf_info import read_info
    from localspec.pairing import pair_kind, refuse_assistant_as_target

    if target is None or draft is None:
        return PairFinding(draft_name, by_family, better if by_family == TEXT_PAIR else None,
                           unchecked=f"{missing} is not downloaded (`localspec pull {missing}`)")
    try:
        target_info, draft_info = read_info(target), read_info(draft)
        refuse_assistant_as_target(target_info.label, target_info.architecture)
        kind = pair_kind(target_info, draft_info)
    except LocalspecError as err:
        return PairFinding(draft_name, problem=str(err))
    return PairFinding(draft_name, kind, better if kind == TEXT_PAIR else None)
