"""How often a Gemma 4 assistant's drafts are kept: exact rejection sampling against llama.cpp's match rule.

On the tiny synthetic pair of ``tests/support/gemma4_model.py`` (a target and an
assistant built to agree often; random weights, so this compares the two rules
on one synthetic assistant and says nothing of a trained one). For each
temperature: localspec samples drafts from the assistant's q and accepts by
min(1, p/q); llama.cpp's ``draft-mtp`` drafts the assistant's top token and
keeps it only where the target's own sample matches it (here: the same
assistant drafting greedily, verified by matching). Prints acceptance rates.

    .venv/bin/python benchmarks/bench_assistant_acceptance.py [--tokens 64] [--seeds 3]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))

from gemma4_model import write_gemma4_assistant, write_gemma4_target  # noqa: E402

from localspec.backend import AssistantContext, Context, Model  # noqa: E402
from localspec.drafting.assistant import AssistantDrafter  # noqa: E402
from localspec.sampling import Sampler, SamplingParams  # noqa: E402
from localspec.speculative import speculative_step  # noqa: E402

PROMPTS = ("The quick brown fox jumps over the lazy dog, and then", "Once upon a time there was",
           "def fibonacci(n):", "1, 2, 3, 4,")


def rates(tctx: Context, head: AssistantContext, prompts: list[list[int]], temperature: float, seeds: int,
          tokens: int, draft_len: int, match_rule: bool) -> tuple[int, int]:
    drafted = accepted = 0
    for seed in range(seeds):
        sampler = Sampler(SamplingParams(temperature=temperature, seed=seed))
        draft_sampler = Sampler(SamplingParams(temperature=0.0)) if match_rule else sampler
        drafter = AssistantDrafter(head, tctx, draft_sampler)
        for prompt in prompts:
            tctx.clear()
            tctx.append(prompt[:-1])
            history = list(prompt)
            while len(history) < len(prompt) + tokens:
                step = speculative_step(tctx, history, drafter, sampler, draft_len)
                drafted += step.drafted
                accepted += step.accepted
        drafter.close()
    return drafted, accepted


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--draft-len", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        target = Model(write_gemma4_target(Path(d) / "t.gguf", mix=0.1, logit_scale=0.5))
        assistant = Model(write_gemma4_assistant(Path(d) / "a.gguf", mix=0.1, logit_scale=0.5))
        tctx = Context(target, n_ctx=512, n_threads=1)
        head = AssistantContext(assistant, tctx, n_threads=1)
        prompts = [target.tokenize(p) for p in PROMPTS]
        print(f"{len(prompts)} prompts x {args.seeds} seeds x {args.tokens} tokens, {args.draft_len} drafts a step")
        for temperature in (0.0, 0.5, 1.0):
            row = [f"T={temperature}"]
            for label, match in (("rejection sampling", False), ("match (llama.cpp)", True)):
                if temperature == 0.0 and match:
                    continue  # the same rule at T=0
                d, a = rates(tctx, head, prompts, temperature, args.seeds, args.tokens, args.draft_len, match)
                row.append(f"{label}: {a}/{d} = {a / d:.0%}" if d else f"{label}: nothing drafted")
            print("  ".join(row))
        head.close()
        tctx.close()


if __name__ == "__main__":
    main()
