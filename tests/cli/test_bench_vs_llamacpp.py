"""benchmarks/bench_vs_llamacpp.py: how replies are read and compared (the timing runs are the benchmark's)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_vs_llamacpp as vs  # noqa: E402


def test_the_reply_is_what_follows_the_printed_prompt() -> None:
    prompt = "<|im_start|>user\nRename Inventory.<|im_end|>\n<|im_start|>assistant\n\n"
    # llama-lookup prints the prompt as it decoded it (the first special token unprinted), then the reply.
    stdout = "\n\nuser\nRename Inventory.<|im_end|>\n<|im_start|>assistant\n\nclass Stock:\n    pass<|im_end|>\n\n\n\n"
    assert vs.reply_after_prompt(stdout, prompt) == "class Stock:\n    pass<|im_end|>\n\n\n\n"
    assert vs.plain_reply(vs.reply_after_prompt(stdout, prompt)) == "class Stock:\n    pass"
    assert vs.reply_after_prompt("no prompt here", prompt) == "no prompt here"


def test_replies_part_where_they_first_differ_not_where_one_stops() -> None:
    assert vs.parts_at("import csv\nimport os", "import csv\nimport os\nimport re<eos>\n") is None
    assert vs.parts_at("import csv\nimport os<end_of_turn>", "import csv\nimport os") is None
    assert vs.parts_at("import csv\nimport os", "import csv\nfrom os") == 11
    assert vs.parts_at("a", "b") == 0


def test_plain_time_is_split_into_llama_decode_and_the_rest() -> None:
    def run(system: str, rnd: int, seconds: float, decode_ms: float) -> vs.Run:
        return vs.Run("m", "p", system, rnd, 100, seconds, extra={"decode_ms": decode_ms})

    runs = [run("localspec plain", 0, 1.2, 11.0), run("localspec plain", 1, 1.0, 9.5), run("localspec plain", 2, 1.1, 10.0),
            run("llama-completion", 0, 1.0, 9.0), run("llama-completion", 1, 1.2, 11.0),
            run("llama-completion", 2, 1.0, 10.0)]
    table = vs.plain_time_table(runs, "m", ["p", "not run"])
    # localspec: 11 ms a step (median), 10 of them in llama_decode; llama-completion 10 ms a decode
    assert "| p | 11.00 | 10.00 | 1.00 | 10.00 | 1.00× |" in table
    assert not any("not run" in line for line in table)
    assert vs.plain_time_table(runs, "other model", ["p"]) == []


def test_llama_lookups_steps_are_priced_as_full_drafts_and_plain_steps() -> None:
    from localspec.policy.costs import CostModel

    costs = CostModel({1: 10.0, 5: 30.0, 16: 80.0})
    # 10 tokens, 6 of 8 drafted kept at n_max 4: 4 steps, 2 of them drafts of 4 (batches of 5), 2 plain
    assert vs.lookup_steps_ms(costs, 10, 6, 8, 4) == 2 * 30.0 + 2 * 10.0
    assert vs.lookup_steps_ms(costs, 10, 0, 0, 4) == 10 * 10.0  # nothing drafted: plain decoding
    assert vs.lookup_steps_ms(costs, 5, 4, 40, 4) == 30.0  # more drafted than steps: every step drafts
