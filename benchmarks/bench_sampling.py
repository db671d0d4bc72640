"""What the host pays per row of logits: the target's p, a draft's q and a greedy argmax.

    python benchmarks/bench_sampling.py [--rounds 7] [--vocab 49152,152064,262144]

Random float32 logits (standard normal x 3) handed out read-only, as ``Context.logits`` hands out
llama.cpp's rows. Per vocabulary size, at T = 0.8 with no filters (the CLI's and the server's default
filters) and with top-k 40, top-p 0.95, min-p 0.05, alternating round by round, medians in microseconds:

  p       ``Sampler.distribution``: every verified row read at T > 0 (float64 throughout)
  q       ``Sampler.draft_distribution``: every drafted token at T > 0 (float32 exponentials)
  sample  ``sample`` of q: the draw, once per drafted token and once per emitted one
  argmax  ``sampling.argmax`` of the read-only row: every row read when greedy

On a GPU each is host time between decodes; the decode of a 0.6B draft token takes ~1.25 ms on an
H200, of an 8B target ~3.7 ms.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import timeit
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from localspec.sampling import Sampler, SamplingParams, argmax, sample  # noqa: E402


def read_only_row(n: int, seed: int = 0) -> np.ndarray:
    """Logits over ``n`` tokens as a read-only view of a writeable vector (``Context.logits``'s rows)."""
    vector = (np.random.default_rng(seed).standard_normal(n) * 3).astype(np.float32)
    row = vector.view()
    row.flags.writeable = False
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--vocab", default="49152,152064,262144", help="vocabulary sizes, comma-separated")
    args = ap.parse_args(argv)
    settings = {"T 0.8": SamplingParams(temperature=0.8, seed=0),
                "T 0.8, filters": SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=0)}
    print(f"{'vocab':>7}  {'sampling':<15} {'p':>8} {'q':>8} {'q/p':>6} {'sample':>8} {'argmax':>8}   (us, medians of "
          f"{args.rounds} rounds)")
    for n in (int(v) for v in args.vocab.split(",")):
        row = read_only_row(n)
        for name, params in settings.items():
            sampler = Sampler(params)
            q = sampler.draft_distribution(row)
            calls = {"p": lambda: sampler.distribution(row), "q": lambda: sampler.draft_distribution(row),
                     "sample": lambda: sample(q, sampler.rng), "argmax": lambda: argmax(row)}
            times: dict[str, list[float]] = {k: [] for k in calls}
            for _ in range(args.rounds):
                for k, call in calls.items():
                    number = 20 if k in ("p", "q") else 200
                    times[k].append(min(timeit.repeat(call, number=number, repeat=3)) / number * 1e6)
            us = {k: statistics.median(v) for k, v in times.items()}
            print(f"{n:>7}  {name:<15} {us['p']:>8.1f} {us['q']:>8.1f} {us['q'] / us['p']:>6.2f} {us['sample']:>8.1f} "
                  f"{us['argmax']:>8.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
