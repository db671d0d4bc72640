"""``generate --logprobs`` and the penalty flags: the same numbers and text with speculation on and off, and
each mistake refused in one line."""

from __future__ import annotations

import json

import pytest
from cli import assert_clean_error, localspec

PROMPT = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,"


def _json(*args: str) -> dict:
    proc = localspec("generate", *args, "--prompt", PROMPT, "--max-tokens", "16", "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_logprobs_and_penalties_are_the_same_with_speculation_on_and_off(smollm2_path) -> None:
    flags = ("--logprobs", "2", "--presence-penalty", "0.5", "--repeat-penalty", "1.2")
    spec = _json(str(smollm2_path), "--draft", "ngram", "--draft-max", "3", *flags)
    plain = _json(str(smollm2_path), "--draft", "off", *flags)
    free = _json(str(smollm2_path), "--draft", "off", "--logprobs", "0")
    drafted = _json(str(smollm2_path), "--draft", "ngram", "--draft-max", "3", "--logprobs", "0")
    # Log-probabilities are the same bits with speculation drafting and without.
    assert drafted["stats"]["drafted"] > 0
    assert drafted["token_ids"] == free["token_ids"] and drafted["logprobs"] == free["logprobs"]
    # A penalised reply is drafted too, and is the same reply with the same numbers (issue 42).
    assert spec["stats"]["drafted"] > 0
    assert spec["token_ids"] == plain["token_ids"] and spec["logprobs"] == plain["logprobs"]
    assert spec["token_ids"] != free["token_ids"]  # the penalties changed the reply
    assert [lp["token"] for lp in spec["logprobs"]] == spec["token_ids"]
    assert all(len(lp["top"]) == 2 and lp["top"][0][0] == lp["token"] for lp in spec["logprobs"])  # greedy
    assert all(lp["top"] == [] for lp in free["logprobs"])


@pytest.mark.parametrize("args, needles", [
    (("--logprobs", "2"), ("--logprobs", "--json")),
    (("--json", "--logprobs", "21"), ("--logprobs 21", "[0, 20]")),
    (("--json", "--frequency-penalty", "-3"), ("--frequency-penalty", "[-2, 2]")),
    (("--json", "--logit-bias", "7"), ("--logit-bias", "ID=BIAS")),
    (("--repeat-last-n", "-2"), ("--repeat-last-n -2", ">= -1")),  # refused with every penalty off too
])
def test_mistakes_are_one_line(args: tuple[str, ...], needles: tuple[str, ...]) -> None:
    assert_clean_error(localspec("generate", "--prompt", "x", *args), *needles)
