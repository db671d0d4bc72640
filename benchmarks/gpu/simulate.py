"""What the controller would do on a GPU, before anyone measured one: the real ``Controller`` and
``CostModel`` on a simulated clock, charged from a cost file (``rtx4090-14b-q4km.toml``: published
RTX 4090 figures; or the costs a GPU check measured, ``--from-results``).

A simulated text holds token i at position i. The draft model proposes k tokens; how many of them
agree with the text is drawn from an acceptance rate alpha (each token agrees with probability
alpha while the ones before it did), or read from an acceptance trace: a JSON list of run lengths,
one per step (how many tokens a draft of the maximum length kept there), as ``--record`` writes on
the CPU from a real model and its draft. Time is charged from the file's costs: the draft's decodes
(its catch-up on what it has not seen, then one decode per drafted token) and the target's
verification of k + 1 tokens. Printed per alpha (or trace): the draft lengths the controller chose,
how often it decoded plainly, the speedup over plain decoding it achieved, and the best fixed draft
length with its speedup (every k tried, same draws), so the controller can be judged against it;
for the file's draft model and for a lookup (ngram's kind: microseconds a proposal).

    python benchmarks/gpu/simulate.py benchmarks/gpu/rtx4090-14b-q4km.toml
    python benchmarks/gpu/simulate.py COSTS.toml --alpha 0.6 0.8 --steps 3000 --json
    python benchmarks/gpu/simulate.py COSTS.toml --trace trace.json
    python benchmarks/gpu/simulate.py --record TARGET.gguf DRAFT.gguf --out trace.json   (CPU, real models)

Pure simulation: nothing here loads llama.cpp, except ``--record``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from localspec.policy.controller import DRAFT_LEN_CAP, Controller  # noqa: E402
from localspec.policy.costs import CostModel  # noqa: E402
from localspec.drafting.base import DrafterBase, Proposal  # noqa: E402
from localspec.events import StepEvent  # noqa: E402
from localspec.policy.sim_clock import SimClock  # noqa: E402

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


class CostFileError(ValueError):
    """A cost file that cannot be used; the message says what is wrong with it."""


@dataclass(frozen=True)
class GpuCosts:
    """Milliseconds of one decode of k tokens (k: the key) for the target and for the draft."""

    name: str
    target: dict[int, float]
    draft: dict[int, float]


def _curve(section: Mapping[str, object], base_key: str, where: str) -> dict[int, float]:
    try:
        base = float(section[base_key])  # type: ignore[arg-type]
        relative = {int(k): float(v) for k, v in dict(section.get("relative", {1: 1.0})).items()}  # type: ignore[arg-type]
    except (KeyError, TypeError, ValueError) as err:
        raise CostFileError(f"{where}: needs {base_key} (ms) and a relative = {{k = ratio}} table ({err})") from None
    if base <= 0 or not relative or min(relative) < 1 or any(v <= 0 for v in relative.values()):
        raise CostFileError(f"{where}: {base_key} and every ratio must be positive, every k at least 1")
    return {k: base * r for k, r in sorted(relative.items())}


def load_costs(path: Path) -> GpuCosts:
    """Read a cost file (TOML: ``[target] decode_ms, relative``; ``[draft] step_ms, relative``)."""
    try:
        data = tomllib.loads(path.read_text())
    except OSError as err:
        raise CostFileError(f"cannot read {path}: {err.strerror}") from None
    except tomllib.TOMLDecodeError as err:
        raise CostFileError(f"{path} is not valid TOML: {err}") from None
    if "target" not in data or "draft" not in data:
        raise CostFileError(f"{path}: needs a [target] and a [draft] section")
    return GpuCosts(str(data.get("name", path.stem)), _curve(data["target"], "decode_ms", f"{path} [target]"),
                    _curve(data["draft"], "step_ms", f"{path} [draft]"))


# --- the simulation ---------------------------------------------------------------
# A lookup's proposal (ngram and its kind): a fixed cost of microseconds (localspec.policy.costs' prior).
LOOKUP_MS = (0.05, 0.001)
DRAFTERS = ("draft", "lookup")


class _SimDrafter(DrafterBase):
    """A drafter on the simulated clock; how many of its k tokens agree with the text comes from
    ``agree(k)``. ``costs`` given: a draft model, which catches up on the tokens it has not decoded,
    then decodes one token per drafted token. None: a lookup costing ``LOOKUP_MS``."""

    def __init__(self, name: str, clock: SimClock, costs: CostModel | None, agree: Callable[[int], int]) -> None:
        self.name = name
        self.clock, self.costs, self.agree = clock, costs, agree
        self.synced = 0

    def behind(self, history: Sequence[int]) -> int:
        if self.costs is None:
            return 0
        return len(history) - min(self.synced, len(history) - 1)

    def propose(self, history: Sequence[int], draft_len: int) -> Proposal:
        if self.costs is None:
            self.clock.spend(LOOKUP_MS[0] + LOOKUP_MS[1] * draft_len)
        else:
            self.clock.spend(self.costs.verify_ms(self.behind(history)) + (draft_len - 1) * self.costs.verify_ms(1))
        self.synced = len(history) + draft_len - 1
        matched = min(draft_len, self.agree(draft_len))
        start = len(history)
        return Proposal(tuple(range(start, start + matched)) + (-1,) * (draft_len - matched), None, self.name)

    def accepted(self, history: Sequence[int], n_accepted: int) -> None:
        self.synced = min(self.synced, len(history) - 1)


@dataclass
class SimResult:
    """What one simulated generation did."""

    steps: int = 0
    tokens: int = 0
    total_ms: float = 0.0
    plain_ms: float = 0.0  # one plain step's cost
    lengths: Counter = field(default_factory=Counter)  # draft length chosen -> steps (0: plain)

    @property
    def speedup(self) -> float:
        return self.tokens * self.plain_ms / self.total_ms if self.total_ms else 0.0

    @property
    def plain_steps(self) -> int:
        return self.lengths.get(0, 0)

    def median_length(self) -> float:
        drafted = [k for k, n in self.lengths.items() if k for _ in range(n)]
        return float(statistics.median(drafted)) if drafted else 0.0


def run_lengths_from_alpha(alpha: float, seed: int) -> Callable[[int], int]:
    """Each drafted token agrees with probability ``alpha`` while every one before it did."""
    rng = random.Random(seed)

    def agree(k: int) -> int:
        n = 0
        while n < k and rng.random() < alpha:
            n += 1
        return n
    return agree


def run_lengths_from_trace(runs: Sequence[int]) -> Callable[[int], int]:
    """Step i keeps ``runs[i mod len(runs)]`` tokens (at most the k drafted)."""
    if not runs:
        raise CostFileError("the trace holds no steps")
    it = iter(range(10**12))
    return lambda k: runs[next(it) % len(runs)]


def simulate(costs: GpuCosts, agree: Callable[[int], int], *, drafter_kind: str = "draft", steps: int = 2000,
             draft_len: int | None = None, prompt: int = 64) -> SimResult:
    """One generation of ``steps`` steps with the controller (``draft_len`` None) or a fixed draft length;
    ``drafter_kind``: "draft" (the file's draft model) or "lookup" (``LOOKUP_MS``)."""
    if drafter_kind not in DRAFTERS:
        raise ValueError(f"drafter_kind must be one of {DRAFTERS}, not {drafter_kind!r}")
    clock = SimClock()
    truth = CostModel(costs.target)
    model = drafter_kind == "draft"
    drafter = _SimDrafter(drafter_kind, clock, CostModel(costs.draft) if model else None, agree)
    ctl = Controller(CostModel(costs.target), [drafter], clock=clock, draft_len=draft_len)
    if model:
        ctl.costs.set_model_drafter(drafter.name, CostModel(costs.draft))
    else:
        ctl.costs.set_draft_cost(drafter.name, *LOOKUP_MS)
    result = SimResult(plain_ms=truth.verify_ms(1) + truth.overhead_ms(0))
    history = list(range(prompt))
    for index in range(steps):
        decision = ctl.plan(history, room=10**6, remaining=10**6)
        k = 0 if decision.plain else decision.draft_len
        t = clock()
        proposal = decision.proposal
        if k and proposal is None:
            proposal = drafter.propose(history, k)
        draft_ms = decision.proposal_ms + (clock() - t) * 1e3
        draft = tuple(proposal.tokens[:k]) if k and proposal is not None else ()
        accepted = 0
        while accepted < len(draft) and draft[accepted] == len(history) + accepted:
            accepted += 1
        tokens = tuple(range(len(history), len(history) + accepted + 1))
        verify_ms = truth.verify_ms(1 + len(draft))
        step = StepEvent(index=index + 1, drafter=drafter.name if draft else None, drafted=len(draft),
                         accepted=accepted, emitted=len(tokens), draft_ms=draft_ms, verify_ms=verify_ms,
                         python_ms=truth.overhead_ms(len(draft)), verified=len(draft), tokens=tokens,
                         batch_tokens=1 + len(draft))
        history.extend(tokens)
        if draft:
            drafter.verified(len(draft))
            drafter.accepted(history, accepted)
        ctl.observe(step, history)
        result.steps += 1
        result.tokens += len(tokens)
        result.total_ms += step.step_ms
        result.lengths[len(draft)] += 1
    return result


def best_fixed(costs: GpuCosts, make_agree: Callable[[], Callable[[int], int]], *, drafter_kind: str,
               steps: int) -> tuple[int, float]:
    """The fixed draft length (1..DRAFT_LEN_CAP) with the highest speedup, and that speedup."""
    best = (0, 1.0)
    for k in range(1, DRAFT_LEN_CAP + 1):
        speed = simulate(costs, make_agree(), drafter_kind=drafter_kind, steps=steps, draft_len=k).speedup
        if speed > best[1]:
            best = (k, speed)
    return best


def report(costs: GpuCosts, cases: Sequence[tuple[str, Callable[[], Callable[[int], int]]]], *,
           drafters: Sequence[str] = DRAFTERS, steps: int) -> list[dict[str, object]]:
    rows = []
    for kind in drafters:
        for label, make_agree in cases:
            sim = simulate(costs, make_agree(), drafter_kind=kind, steps=steps)
            k, fixed = best_fixed(costs, make_agree, drafter_kind=kind, steps=steps)
            rows.append({"drafter": kind, "case": label, "speedup": round(sim.speedup, 3),
                         "median_draft_len": sim.median_length(),
                         "plain_steps": sim.plain_steps, "steps": sim.steps,
                         "draft_lens": {str(n): c for n, c in sorted(sim.lengths.items())},
                         "best_fixed_draft_len": k, "best_fixed_speedup": round(fixed, 3)})
    return rows


# --- recording a trace on the CPU ----------------------------------------------------
RECORD_DRAFT_LEN = 16


def record_trace(target: Path, draft: Path, out: Path, *, max_tokens: int = 256) -> int:
    """Run the real engine greedily with ``draft`` drafting ``RECORD_DRAFT_LEN`` tokens every step and
    write how many each step kept (a step that kept all is a lower bound). Returns the steps written."""
    from localspec.engine import Engine, GenerateOptions
    from localspec.events import StepEvent as Step

    prompts = ["The history of the lighthouse begins in the ancient world, where",
               "def merge_sorted(a, b):\n    \"\"\"Merge two sorted lists.\"\"\"\n",
               "Speculative decoding lets a small draft model propose several tokens that"]
    engine = Engine.load(str(target), str(draft), n_ctx=2048, n_gpu_layers=0, draft_n_gpu_layers=0,
                         personal_history=False)
    runs: list[int] = []
    try:
        for text in prompts:
            opts = GenerateOptions(max_tokens=max_tokens, draft_len=RECORD_DRAFT_LEN, drafter="draft")  # greedy
            for event in engine.generate(text, opts):
                if isinstance(event, Step) and event.drafted:
                    runs.append(event.accepted)
    finally:
        engine.close()
    out.write_text(json.dumps({"draft_len": RECORD_DRAFT_LEN, "target": target.name, "draft": draft.name,
                               "runs": runs}))
    return len(runs)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("costs", type=Path, nargs="?", help="a cost file (TOML)")
    p.add_argument("--alpha", type=float, nargs="+", default=[0.5, 0.6, 0.7, 0.8, 0.9])
    p.add_argument("--trace", type=Path, action="append", default=[], help="a trace of run lengths (JSON)")
    p.add_argument("--drafter", choices=[*DRAFTERS, "both"], default="both",
                   help="the file's draft model, a lookup (ngram-like, microseconds), or both (default)")
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    p.add_argument("--record", type=Path, nargs=2, metavar=("TARGET", "DRAFT"),
                   help="record a trace on the CPU with these GGUF files instead (needs --out)")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    try:
        if args.record:
            if args.out is None:
                raise CostFileError("--record needs --out FILE.json")
            n = record_trace(*args.record, args.out)
            print(f"{args.out}: {n} drafting steps")
            return 0
        if args.costs is None:
            raise CostFileError("name a cost file, e.g. benchmarks/gpu/rtx4090-14b-q4km.toml")
        costs = load_costs(args.costs)
        cases: list[tuple[str, Callable[[], Callable[[int], int]]]] = [
            (f"alpha {a:.2f}", lambda a=a: run_lengths_from_alpha(a, args.seed)) for a in args.alpha]
        for trace in args.trace:
            try:
                runs = [int(r) for r in json.loads(trace.read_text())["runs"]]
            except (OSError, ValueError, KeyError, TypeError) as err:
                raise CostFileError(f"{trace}: not a trace ({err}); write one with --record") from None
            cases.append((f"trace {trace.name}", lambda runs=runs: run_lengths_from_trace(runs)))
    except CostFileError as err:
        print(f"simulate.py: error: {err}", file=sys.stderr)
        return 2
    rows = report(costs, cases, drafters=DRAFTERS if args.drafter == "both" else (args.drafter,), steps=args.steps)
    if args.json:
        print(json.dumps({"costs": costs.name, "target_ms": costs.target, "draft_ms": costs.draft, "rows": rows},
                         indent=1))
        return 0
    print(f"costs: {costs.name}")
    print("verify / decode: " + "  ".join(f"{k}:{v / costs.target[1]:.2f}" for k, v in costs.target.items()))
    print(f"{'drafter':<8} {'case':<22} {'speedup':>7} {'median k':>8} {'plain':>8} {'best fixed k':>12} "
          f"{'its speedup':>11}")
    for r in rows:
        print(f"{r['drafter']:<8} {r['case']:<22} {r['speedup']:>7.2f} {r['median_draft_len']:>8.0f} "
              f"{r['plain_steps']:>3}/{r['steps']:<4} {r['best_fixed_draft_len']:>9} {r['best_fixed_speedup']:>11.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
