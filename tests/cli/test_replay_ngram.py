"""benchmarks/replay_ngram.py: the bounds it reports (ceiling, oracle) hold on hand-built replies and costs,
and a bench run's replies are read back once each, at the costs it measured."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import replay_ngram as rp  # noqa: E402
from localspec.policy.costs import CostModel  # noqa: E402
from localspec.drafting.ngram import NgramDrafter  # noqa: E402

FLAT = {1: 10.0, 16: 10.0}                    # a batch costs what one token costs (memory-bound)
LINEAR = {1: 10.0, 2: 20.0, 4: 40.0, 16: 160.0}  # a batch costs its tokens decoded one by one


def test_no_drafter_pays_where_a_batch_costs_its_tokens() -> None:
    assert rp.ceiling(LINEAR) < 1.05


def test_where_batches_are_free_the_ceiling_is_the_longest_draft() -> None:
    # DRAFT_LEN_CAP = 31 draft tokens and the bonus token, less the Python work of each drafted token
    assert 30.0 < rp.ceiling(FLAT) <= 32.0
    assert 3.0 < rp.ceiling(FLAT, cap=3) <= 4.0


def _copying_case() -> tuple[list[int], list[int]]:
    """A prompt of 60 distinct tokens and a reply that copies 40 of them, with two edits."""
    prompt = list(range(100, 160))
    reply = prompt[5:25] + [7] + prompt[25:40] + [8] + prompt[40:45]
    return prompt, reply


def test_the_oracle_bounds_the_controller_and_the_ceiling_bounds_both() -> None:
    prompt, reply = _copying_case()
    for costs in (FLAT, {1: 10.0, 2: 14.0, 4: 20.0, 16: 60.0}):
        ours = rp.replay(NgramDrafter(max_branches=1), prompt, reply, costs)
        best = rp.oracle(NgramDrafter(max_branches=1), prompt, reply, costs)
        assert ours["tokens"] == best["tokens"] == len(reply)
        assert best["steps"] <= ours["steps"]
        assert ours["speedup"] <= best["speedup"] + 1e-9 <= rp.ceiling(costs) + 1e-9


def test_each_step_is_priced_at_its_depth_in_the_context() -> None:
    # Every cached cell adds 0.1 ms to a one-token decode and to a 16-token batch alike (a memory-bound
    # machine): deep in a context a batch costs relatively less, so the same copy gains more there.
    prompt, reply = _copying_case()
    costs, per_cell = {1: 10.0, 2: 14.0, 4: 20.0, 16: 60.0}, {1: 0.1, 16: 0.1}
    # plain decoding of the reply: its j-th token is decoded after len(prompt) + j - 1 cells
    plain = sum(10.0 + 0.1 * (len(prompt) + j - 1) for j in range(len(reply)))
    truth = CostModel(costs, per_cell=per_cell)
    assert abs(rp._plain_ms(truth, len(prompt), len(reply)) - plain - len(reply) * truth.overhead_ms(0)) < 1e-6
    flat = rp.oracle(NgramDrafter(max_branches=1), prompt, reply, costs)
    deep = rp.oracle(NgramDrafter(max_branches=1), prompt, reply, costs, per_cell=per_cell)
    assert deep["speedup"] > flat["speedup"]
    ours = rp.replay(NgramDrafter(max_branches=1), prompt, reply, costs, per_cell=per_cell)
    assert ours["speedup"] <= deep["speedup"] + 1e-9


def test_the_oracle_drafts_nothing_where_drafting_cannot_pay() -> None:
    prompt, reply = _copying_case()
    dearer = {k: ms * 1.2 if k > 1 else ms for k, ms in LINEAR.items()}  # a batch dearer than its tokens
    best = rp.oracle(NgramDrafter(max_branches=1), prompt, reply, dearer)
    assert best["steps"] == len(reply)
    assert rp.ceiling(dearer) == 1.0


def test_compare_takes_geometric_means_of_ratios_on_the_same_replies() -> None:
    speedups = {"defaults": [1.0, 2.0, 4.0], "other": [2.0, 2.0, 1.0]}
    got = rp.compare(speedups, "defaults")
    assert got["defaults"] == (1.0, 0, 0)
    ratio, gained, lost = got["other"]
    assert ratio == pytest.approx((2.0 * 1.0 * 0.25) ** (1 / 3)) and (gained, lost) == (1, 1)
    assert rp.geomean([]) == 1.0 and rp.geomean([2.0, 8.0]) == pytest.approx(4.0)


def test_a_bench_runs_replies_are_replayed_once_each_at_the_costs_it_measured(smollm2_path: Path) -> None:
    """Every system's reply is a case, a reply two systems (or rounds) share only once, and the costs the
    run recorded (JSON keys are strings) price them; a run that recorded none falls back to CPU_COSTS."""
    from localspec.backend import Model

    def run(system: str, text: str, prompt: str = "code-rename", model: str = "smollm2") -> dict:
        return {"model": model, "prompt": prompt, "system": system, "round": 0, "text": text}

    data = {"runs": [run("localspec plain", "class Stock:\n    pass\n"),
                     run("localspec ngram", "class Stock:\n    pass\n"),
                     run("llama-lookup@4", "class Stock:\n    pass\n<|im_end|>\n\n"),  # the same, as a tool prints it
                     run("llama-completion", "class Store:\n    pass\n"),
                     run("llama-completion", "other", model="gemma3")],
            "costs": {"smollm2": {"verify": {"1": 10.0, "4": 20.0}, "per_cell": {"1": 0.01}, "measured_depth": 300,
                                  "window": 0, "past_window": 0.0}}}
    model = Model(smollm2_path, vocab_only=True)
    try:
        cases = rp.bench_cases(data, "smollm2", model)
        assert [name for name, _, _ in cases] == ["code-rename", "code-rename"]
        assert [model.detokenize(reply) for _, _, reply in cases] == ["class Stock:\n    pass", "class Store:\n    pass"]
        assert cases[0][1] == cases[1][1] and len(cases[0][1]) > 50  # the prompt, in the chat template
    finally:
        model.close()
    costs, depth = rp.bench_costs(data, "smollm2")
    assert costs == {1: 10.0, 4: 20.0}
    assert depth == {"per_cell": {1: 0.01}, "measured_depth": 300, "window": 0, "past_window": 0.0}
    assert rp.bench_costs(data, "gemma3") == (rp.CPU_COSTS["gemma3"], {})
