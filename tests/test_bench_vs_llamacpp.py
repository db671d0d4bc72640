"""benchmarks/bench_vs_llamacpp.py: how replies are read and compared (the timing runs are the benchmark's)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

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
