"""How often EAGLE-3 and DFlash drafts are kept: exact rejection sampling against llama.cpp's match rule.

On the tiny synthetic pairs of ``tests/support/eagle3_model.py`` (a llama target, an
``eagle3`` and a ``dflash`` draft built to agree with it often; random weights, so this
compares the rules on synthetic drafts and says nothing of trained ones). For each
temperature: localspec samples drafts from the draft's q and accepts by min(1, p/q)
(a DFlash tree: recursive rejection sampling over sampled siblings); llama.cpp's
``draft-eagle3``/``draft-dflash`` draft each row's top token and keep it only where the
target's own sample matches (here: the same draft drafting greedily, verified by
matching). Prints acceptance (kept / drafted) and tokens per step.

    .venv/bin/python benchmarks/bench_feature_drafts_acceptance.py [--tokens 48] [--seeds 2]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))

from eagle3_model import write_dflash_draft, write_eagle3_draft, write_llama_target  # noqa: E402

from localspec.backend import Context, DFlashContext, Eagle3Context, Model  # noqa: E402
from localspec.drafting.base import Drafter  # noqa: E402
from localspec.drafting.dflash import DFlashDrafter  # noqa: E402
from localspec.drafting.eagle3 import Eagle3Drafter  # noqa: E402
from localspec.sampling import Sampler, SamplingParams  # noqa: E402
from localspec.speculative import speculative_step  # noqa: E402

PROMPTS = ("The quick brown fox jumps over the lazy dog, and then", "Once upon a time there was",
           "def fibonacci(n):", "1, 2, 3, 4,")


def rates(tctx: Context, make: Callable[[Sampler], Drafter], prompts: list[list[int]], temperature: float,
          seeds: int, tokens: int, draft_len: int, match_rule: bool, tree_nodes: int = 0) -> tuple[int, int, int, int]:
    drafted = accepted = emitted = steps = 0
    for seed in range(seeds):
        sampler = Sampler(SamplingParams(temperature=temperature, seed=seed))
        drafter = make(Sampler(SamplingParams(temperature=0.0)) if match_rule else sampler)
        for prompt in prompts:
            tctx.clear()
            tctx.append(prompt[:-1])
            history = list(prompt)
            while len(history) < len(prompt) + tokens:
                step = speculative_step(tctx, history, drafter, sampler, draft_len, tree_nodes=tree_nodes)
                drafted += step.drafted
                accepted += step.accepted
                emitted += step.emitted
                steps += 1
        drafter.close()
    return drafted, accepted, emitted, steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--draft-len", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        target = Model(write_llama_target(Path(d) / "t.gguf", mix=0.3))
        eagle3 = Model(write_eagle3_draft(Path(d) / "e.gguf", agree=True))
        dflash = Model(write_dflash_draft(Path(d) / "f.gguf", agree=True))
        tctx = Context(target, n_ctx=512, n_threads=1, n_seq=1 + 8)
        e_ctx = Eagle3Context(eagle3, tctx, n_threads=1)
        f_ctx = DFlashContext(dflash, tctx, n_threads=1)
        tctx.enable_layer_taps(e_ctx.layers)  # both drafts read layers (0, 1, 3)
        prompts = [target.tokenize(p) for p in PROMPTS]
        drafters: dict[str, Callable[[Sampler], Drafter]] = {
            "eagle3": lambda s: Eagle3Drafter(e_ctx, tctx, s),
            "dflash": lambda s: DFlashDrafter(f_ctx, tctx, s),
            "dflash tree(6)": lambda s: DFlashDrafter(f_ctx, tctx, s, tree_width=3),
        }
        print(f"{len(prompts)} prompts x {args.seeds} seeds x {args.tokens} tokens, draft length {args.draft_len}")
        for name, make in drafters.items():
            for temperature in (0.0, 0.7, 1.0):
                row = [f"{name:15} T={temperature}"]
                for label, match in (("rejection sampling", False), ("match (llama.cpp)", True)):
                    if (temperature == 0.0 or "tree" in name) and match:
                        continue  # the same rule at T=0; llama.cpp has no DFlash tree
                    dr, ac, em, st = rates(tctx, make, prompts, temperature, args.seeds, args.tokens,
                                           args.draft_len, match, 6 if "tree" in name else 0)
                    row.append(f"{label}: kept {ac}/{dr} = {ac / max(dr, 1):.0%}, {em / st:.2f} tokens/step")
                print("  ".join(row), flush=True)
        for obj in (e_ctx, f_ctx, tctx):
            obj.close()


if __name__ == "__main__":
    main()
