"""The cost cache: measured verify costs kept per model and machine, and dropped when the machine moves.

``load_or_measure`` (``measure``) keeps a measurement in ``cache_dir()/costs/<key>.json``,
keyed by everything it depends on (``CostKey``: model file, llama.cpp build and
version, offload, thread count, weight repacking). A cached cost corrects itself
(``CachedCostModel``): costs measured while the machine was busy would otherwise
keep the controller off in every later run on a quiet machine, so when the steps
it observes settle away from what the cache says (by more than ``DRIFT``), the
entry is dropped (``drop_costs``; this module is the only one that removes cache
files) and the next run measures afresh. The running generation follows the
machine anyway (``CostModel`` refines).

Only ``cost_key`` imports the backend (llama.cpp), and only when called.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

from localspec.paths import atomic_write, cache_dir
from localspec.policy.costs import CostModel

if TYPE_CHECKING:
    from localspec.backend import Context

# 2: per-cell costs and the depth measured at; 3: per-cell costs timed side by side, fitted to a line in k,
# and a sliding-window model's window; 4: batches of 24 and 32 (drafts up to 31 tokens); 5: the device
# the decodes ran on is part of the key.
SCHEMA = 5
# A cached cost is dropped when the refined estimates settle this far from it (either way),
# after at least DRIFT_MIN_STEPS observed decodes: one slow step never moves it.
DRIFT = 1.25
DRIFT_MIN_STEPS = 32
# ... and compared every this many decodes (the estimates move by a few percent a step; comparing every
# step cost more than learning from it).
DRIFT_CHECK_EVERY = 16


class Measurement(dict[int, float]):
    """Median ms per batch size, and whether the planned ``min_reps`` rounds all ran; ``depth``: the
    cached cells they were measured after; ``per_cell``: ms each further cached cell adds, per batch size
    (empty when not measured).

    An incomplete measurement (the machine was so loaded that the rounds overran
    the time limit) is still the best guess for now, but it is not cached. One cut short on a CPU
    that kept its threads busy is complete (``measure.kept_its_cpus``): the model is slow there.
    """

    def __init__(self, costs: Mapping[int, float], rounds: int, complete: bool, *, depth: int = 0,
                 per_cell: Mapping[int, float] | None = None, window: int = 0) -> None:
        super().__init__(costs)
        self.rounds = rounds
        self.complete = complete
        self.depth = depth
        self.per_cell = dict(per_cell or {})
        self.window = window  # a sliding-window model's window (0: none): per_cell is timed over it (CostModel)


@dataclass(frozen=True)
class CostKey:
    """Everything a measured cost depends on; its hash names the cache file."""

    model: str
    model_size: int
    model_mtime_ns: int
    system_info: str
    gpu_offload: bool
    n_gpu_layers: int
    n_threads: int
    n_ctx: int
    n_seq: int
    llama_cpp_version: str
    repack: bool  # weights repacked for the CPU (Model's choice, not the build's)
    # Where the decodes run: "cpu", or the GPUs layers are offloaded to (name and memory). A CUDA build
    # run on the CPU (n_gpu_layers 0, or no driver) and on a GPU never share costs, nor two GPUs.
    devices: str = "cpu"

    def digest(self) -> str:
        raw = json.dumps({"schema": SCHEMA, **self.__dict__}, sort_keys=True).encode()
        return hashlib.sha256(raw).hexdigest()[:20]


def cost_key(ctx: "Context", *, n_threads: int | None = None, n_gpu_layers: int = -1) -> CostKey:
    """The key for ``ctx``'s model on this machine.

    ``Context`` does not keep its thread count or the model's offload, so the
    caller passes what it created them with (None threads: the backend default).
    """
    from importlib.metadata import PackageNotFoundError, version

    from localspec.backend import default_threads, gpu_devices, gpu_offload_supported, system_info

    path = Path(ctx.model.path).resolve()
    st = path.stat()
    try:
        llama_version = version("llama-cpp-python")
    except PackageNotFoundError:  # pragma: no cover - a source checkout of the bindings
        llama_version = "unknown"
    offload = gpu_offload_supported()
    gpus = gpu_devices() if offload and n_gpu_layers != 0 else []
    devices = "; ".join(f"{name} ({total} bytes)" for name, _free, total in gpus) or "cpu"
    if ctx.model.split is not None:  # chosen devices (RPC servers, some GPUs) and their shares cost otherwise
        devices = f"{ctx.model.split.mode} split over {ctx.model.split.describe()}"
    return CostKey(
        model=str(path), model_size=st.st_size, model_mtime_ns=st.st_mtime_ns,
        system_info=system_info(), gpu_offload=offload, n_gpu_layers=n_gpu_layers,
        n_threads=n_threads or default_threads(), n_ctx=ctx.n_ctx, n_seq=ctx.n_seq,
        llama_cpp_version=llama_version, repack=ctx.model.repack, devices=devices,
    )


def cost_path(key: CostKey) -> Path:
    return cache_dir() / "costs" / f"{key.digest()}.json"


def save_costs(path: Path, key: CostKey, verify: Mapping[int, float]) -> None:
    """Write the record, and drop the folder's records of model files that are gone or changed."""
    record = {"schema": SCHEMA, "key": key.__dict__, "measured_at": time.time(),
              "verify_ms": {str(k): float(v) for k, v in sorted(verify.items())},
              "depth": int(getattr(verify, "depth", 0)),
              "per_cell_ms": {str(k): float(v) for k, v in sorted(getattr(verify, "per_cell", {}).items())},
              "window": int(getattr(verify, "window", 0))}
    with atomic_write(path) as fh:
        fh.write(json.dumps(record, indent=1).encode())
    prune_costs(path.parent, keep=path)


def prune_costs(folder: Path, *, keep: Path | None = None) -> int:
    """Remove the records whose model file no longer exists or was rewritten since (its size or
    mtime differs): no key can match them again, and the folder would otherwise grow with every
    model ever measured (temporary ones included). ``keep`` is never removed. Returns how many went."""
    removed = 0
    for entry in folder.glob("*.json"):
        if entry == keep:
            continue
        try:
            key = json.loads(entry.read_text())["key"]
            model = Path(str(key["model"]).split("#", 1)[0])  # "path#mtp": a head's costs
            try:
                st = model.stat()
                gone = st.st_size != key["model_size"] or st.st_mtime_ns != key["model_mtime_ns"]
            except FileNotFoundError:
                gone = True
            if gone:
                entry.unlink()
                removed += 1
        except (OSError, ValueError, KeyError, TypeError):
            continue  # unreadable or foreign: load_costs ignores it; leave it to whoever wrote it
    return removed


def drop_costs(path: Path) -> None:
    """Remove a record (a read-only cache keeps it; the running generation follows the machine anyway)."""
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass


def load_costs(path: Path, key: CostKey, *, max_age_s: float | None = None) -> Measurement | None:
    """The cached verify costs for ``key`` (with their depth and per-cell costs), or None when absent,
    stale, foreign or unreadable."""
    try:
        record = json.loads(path.read_text())
        if record.get("schema") != SCHEMA or record.get("key") != key.__dict__:
            return None
        if max_age_s is not None and time.time() - float(record["measured_at"]) > max_age_s:
            return None
        verify = {int(k): float(v) for k, v in record["verify_ms"].items()}
        per_cell = {int(k): float(v) for k, v in record["per_cell_ms"].items()}
        depth = int(record["depth"])
        window = int(record["window"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        # A half-written or hand-edited file is not an error: measuring again fixes it.
        return None
    if not verify or not all(v > 0 for v in verify.values()):
        return None
    return Measurement(verify, 0, True, depth=depth, per_cell=per_cell, window=window)


class CachedCostModel(CostModel):
    """A ``CostModel`` that remembers the cache entry it was built from and drops it when the
    machine it observes no longer matches it.

    Every ``observe_verify`` refines the estimates as ``CostModel`` does. Once
    ``DRIFT_MIN_STEPS`` decodes were observed, the refined estimate at each measured
    k that was observed is compared with the cached one; when their geometric mean
    ratio lies outside ``[1/DRIFT, DRIFT]`` (a cache measured on a loaded machine now
    read on a quiet one, or the reverse), the entry at ``path`` is removed, once:
    the next ``load_or_measure`` measures again. ``dropped_ratio`` says why (None:
    kept). A fresh measurement (``path`` None) is never dropped.
    """

    def __init__(self, verify: Mapping[int, float], path: Path | None = None) -> None:
        super().__init__(verify, per_cell=getattr(verify, "per_cell", None), measured_depth=getattr(verify, "depth", 0),
                         window=getattr(verify, "window", 0))
        self.path = path
        self.observed_steps = 0
        self.dropped_ratio: float | None = None
        self._seen: set[int] = set()

    def observe_verify(self, k: int, ms: float) -> None:
        super().observe_verify(k, ms)
        if self.path is None or self.dropped_ratio is not None or not ms > 0:
            return
        self.observed_steps += 1
        if k in self.measured:
            self._seen.add(k)
        if self.observed_steps >= DRIFT_MIN_STEPS and self.observed_steps % DRIFT_CHECK_EVERY == 0 and self._seen:
            ratio = self.drift()
            if not 1 / DRIFT <= ratio <= DRIFT:
                self.dropped_ratio = ratio
                drop_costs(self.path)

    def drift(self) -> float:
        """Refined over cached cost, geometric mean over the measured k seen in use (1.0: none)."""
        if not self._seen:
            return 1.0
        now = self.points
        logs = [math.log(now[k] / self.measured[k]) for k in sorted(self._seen)]
        return math.exp(sum(logs) / len(logs))
