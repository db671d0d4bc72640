"""benchmarks/bench_prefill.py: how prompts are built and times read and summed up (the timing runs are the
benchmark's)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_prefill as bp  # noqa: E402


def test_a_prompt_reaches_the_length_asked_for_repeating_the_texts_as_needed() -> None:
    def words(text: str) -> list[int]:  # one "token" per word: enough to check the builder's stopping rule
        return list(range(len(text.split())))

    for length in (1, 50, 5000):
        text = bp.prompt_of(length, words)
        n = len(words(text))
        assert n >= length
        last = text.rstrip("\n").split("\n\n")[-1]
        assert n - len(last.split()) < length  # it stopped at the first paragraph that reached the length
    assert len(words(bp.prompt_of(5000, words))) > sum(len(t.split()) for t in bp.PROMPTS.values())


def test_llama_completions_prompt_time_is_read_not_its_generation_time() -> None:
    stderr = ("common_perf_print:    sampling time =       0.05 ms\n"
              "common_perf_print: prompt eval time =    7534.77 ms /  1989 tokens (    3.79 ms per token)\n"
              "common_perf_print:        eval time =       0.00 ms /     1 runs   (    0.00 ms per token)\n")
    assert bp.completion_prefill(stderr) == (1989, 7534.77)


def test_the_table_gives_medians_of_each_side_and_of_the_per_round_ratio() -> None:
    runs = [bp.Prefill("m", 100, "localspec", 0, 99, 99.0),        # 1.0 ms/token
            bp.Prefill("m", 100, "llama-completion", 0, 100, 200.0),  # 2.0: ratio 0.5
            bp.Prefill("m", 100, "localspec", 1, 99, 297.0),       # 3.0
            bp.Prefill("m", 100, "llama-completion", 1, 100, 200.0),  # ratio 1.5
            bp.Prefill("m", 100, "localspec", 2, 99, 198.0),       # 2.0
            bp.Prefill("m", 100, "llama-completion", 2, 100, 400.0),  # 4.0: ratio 0.5
            bp.Prefill("m", 100, "localspec", 3, 99, 99.0)]        # no partner: left out
    table = bp.report(runs, ["m", "not run"], [100, 200])
    # localspec's median 2.00, llama-completion's 2.00, yet the per-round ratio's median is 0.50
    assert "| m | 100 | 2.00 | 2.00 | 0.50× |" in table.splitlines()
    assert len(table.splitlines()) == 3
