"""Drafting by text (issue 43): a draft of another tokenizer against plain decoding, on this machine.

For each direction (Gemma 3 270M target with SmolLM2-135M drafting, and the reverse): greedy replies to a
few prompts, plain and speculative with a fixed draft length (the controller is left out, so what is
measured is the mechanism), on one thread. Prints acceptance, tokens per step, the wall-time ratio
against plain in the same run, and whether the output was identical. Numbers only; no assertion on time.

    .venv/bin/python benchmarks/bench_by_text.py [--draft-len 4] [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from localspec.backend import Context, Model
from localspec.drafting.by_text import TextDrafter
from localspec.sampling import Sampler, SamplingParams
from localspec.speculative import speculative_step

MODELS = Path.home() / ".cache" / "localspec" / "models"
GEMMA, SMOLLM2 = MODELS / "gemma-3-270m-q4_k_m.gguf", MODELS / "SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPTS = ["The capital of France is Paris. The capital of Germany is",
           "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
           "Once upon a time, in a small village by the sea,"]


def run(target: Model, draft: Model | None, prompt: list[int], max_tokens: int, draft_len: int):
    tctx = Context(target, n_ctx=512, n_threads=1)
    dctx = Context(draft, n_ctx=512, n_threads=1) if draft is not None else None
    drafter = TextDrafter(dctx, target) if dctx is not None else None
    sampler = Sampler(SamplingParams(temperature=0.0))
    try:
        tctx.append(prompt[:-1])
        history, steps, drafted, accepted = list(prompt), 0, 0, 0
        t0 = time.perf_counter()
        while len(history) - len(prompt) < max_tokens:
            step = speculative_step(tctx, history, drafter, sampler, draft_len if drafter else 0)
            steps, drafted, accepted = steps + 1, drafted + step.drafted, accepted + step.accepted
        return history[len(prompt):len(prompt) + max_tokens], time.perf_counter() - t0, steps, drafted, accepted
    finally:
        tctx.close()
        if dctx is not None:
            dctx.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draft-len", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()
    gemma, smollm2 = Model(GEMMA), Model(SMOLLM2)
    print("| target | draft | acceptance | tokens/step | wall time ÷ plain (lower is faster) | identical to plain |")
    print("|---|---|---|---|---|---|")
    for target, draft in ((gemma, smollm2), (smollm2, gemma)):
        plain_s = spec_s = 0.0
        steps = drafted = accepted = emitted = 0
        same = True
        for text in PROMPTS:
            prompt = target.tokenize(text)
            want, s0, *_ = run(target, None, prompt, args.max_tokens, 0)
            got, s1, n, d, a = run(target, draft, prompt, args.max_tokens, args.draft_len)
            plain_s, spec_s = plain_s + s0, spec_s + s1
            steps, drafted, accepted, emitted = steps + n, drafted + d, accepted + a, emitted + len(got)
            same = same and got == want
        print(f"| {target.name} | {draft.name} | {accepted / max(drafted, 1):.2f} | {emitted / steps:.2f} | "
              f"{spec_s / plain_s:.2f}× | {'yes' if same else 'NO'} |")


if __name__ == "__main__":
    main()
