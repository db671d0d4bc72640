"""What model-free drafting costs per step, in CPython. Prints numbers only.

    python benchmarks/bench_drafting_cost.py [--quick]

* n-gram index: extend per token, query at 8k tokens of context (Zipf text
  that rarely repeats, and code-like text that repeats with edits), and a
  whole NgramDrafter.propose + accepted step (index sync included).
* suffix array build: 1M and 10M uniform tokens over a 50k vocabulary.
* REST store query on 10M tokens: longest match and lookup, for contexts cut
  from the store (long matches) and random contexts (short matches).
* a fed head's (MTP, EAGLE-3, DFlash) bookkeeping per drafting step at 12k tokens of
  context: ``behind`` and the catch-up's comparison of the history with what its cache
  was built from, with a head that decodes nothing (the decodes are the head's own cost).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np

from localspec.drafting.ngram import NgramDrafter
from localspec.drafting.ngram_index import NgramIndex
from localspec.drafting.suffix_array import build_suffix_array, open_store, write_store

VOCAB = 50_000


def per_call_us(fn: Callable[[], object], repeat: int) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) / repeat * 1e6


def zipf_text(rng: np.random.Generator, n: int) -> np.ndarray:
    return np.minimum(rng.zipf(1.2, n), VOCAB - 1).astype(np.int32)


def code_like(rng: np.random.Generator, n: int) -> np.ndarray:
    """Blocks of 40 tokens, each a copy of an earlier block with a few edits."""
    blocks = [rng.integers(0, VOCAB, 40)]
    while sum(map(len, blocks)) < n:
        block = blocks[rng.integers(len(blocks))].copy() if rng.random() < 0.7 else rng.integers(0, VOCAB, 40)
        block[rng.integers(0, 40, 3)] = rng.integers(0, VOCAB, 3)
        blocks.append(block)
    return np.concatenate(blocks)[:n].astype(np.int32)


def bench_ngram(rng: np.random.Generator) -> None:
    print("n-gram index (n 1..4) at 8192 tokens of context; query over the next 512 history ends")
    for label, make in (("zipf text", zipf_text), ("code-like", code_like)):
        tokens = make(rng, 8192 + 1024).tolist()
        index = NgramIndex(1, 4)
        start = time.perf_counter()
        index.extend(tokens[:8192])
        bulk = (time.perf_counter() - start) / 8192 * 1e6
        # Steady state, as decode steps would: extend by 3 tokens per call.
        pos = [8192]

        def step() -> None:
            index.extend(tokens[pos[0] : pos[0] + 3])
            pos[0] += 3

        ext = per_call_us(step, 150) / 3
        index.truncate(8192)
        costs, matched = [], 0
        for i in range(512):
            index.extend(tokens[8192 + i : 8193 + i])
            t0 = time.perf_counter()
            hit = index.query(8)
            costs.append(time.perf_counter() - t0)
            matched += hit is not None and hit.match_len >= 2
        q = np.array(costs) * 1e6
        print(f"  {label:10s} extend: bulk {bulk:4.1f} us/token, 3 at a time {ext:4.1f} us/token")
        print(f"  {label:10s} query: median {np.median(q):5.1f} us, p90 {np.percentile(q, 90):5.1f}, "
              f"max {q.max():6.1f}  ({matched / 5.12:.0f}% of ends match >= 2 tokens)")  # fmt: skip
        drafter = NgramDrafter()
        hist = tokens[:8192]
        drafter.propose(hist, 8)
        cost = []
        for i in range(200):
            hist = hist + tokens[8192 + 2 * i : 8194 + 2 * i]
            t0 = time.perf_counter()
            drafter.propose(hist, 8)
            drafter.accepted(hist, 1)
            cost.append(time.perf_counter() - t0)
        print(f"  {label:10s} NgramDrafter propose + accepted (sync included): median {np.median(cost) * 1e6:5.1f} us")


def bench_suffix_array(rng: np.random.Generator, sizes: list[int]) -> dict[int, np.ndarray]:
    print(f"suffix array build, uniform tokens over {VOCAB}")
    made = {}
    for n in sizes:
        tokens = rng.integers(0, VOCAB, n).astype(np.int32)
        start = time.perf_counter()
        build_suffix_array(tokens)
        print(f"  {n:>10,} tokens: {time.perf_counter() - start:6.2f} s")
        made[n] = tokens
    return made


def bench_store(rng: np.random.Generator, tokens: np.ndarray) -> None:
    n = len(tokens)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.lsp"
        docs = np.array_split(tokens, 100)  # 100 documents
        start = time.perf_counter()
        write_store(path, docs, "bench")
        print(f"REST store of {n:,} tokens: write (SA included) {time.perf_counter() - start:.2f} s, "
              f"{path.stat().st_size / 2**20:.0f} MiB")  # fmt: skip
        start = time.perf_counter()
        store = open_store(path, "bench")
        print(f"  open {(time.perf_counter() - start) * 1e3:.2f} ms")
        cut = [tokens[i : i + 32].tolist() for i in rng.integers(0, n - 32, 200)]
        rand = [rng.integers(0, VOCAB, 32).tolist() for _ in range(200)]
        for label, contexts in (("context from the store", cut), ("random context", rand)):
            it = iter(contexts * 10)
            match = per_call_us(lambda: store.longest_suffix_match(next(it)), 1000)
            it = iter(contexts * 10)
            lookup = per_call_us(lambda: store.lookup(next(it), 8), 1000)
            m = np.mean([store.longest_suffix_match(c)[0] for c in contexts])
            print(f"  {label:22s}: longest match {match:6.1f} us, lookup {lookup:6.1f} us (mean match {m:.1f})")
        frequent = [[int(np.bincount(tokens[:100_000]).argmax())]] * 100
        it = iter(frequent * 10)
        print(f"  most frequent 1-gram  : lookup {per_call_us(lambda: store.lookup(next(it), 8), 1000):6.1f} us")
        store.close()


class _NoHead:
    """A head that decodes nothing: what is left of a catch-up is the drafter's own bookkeeping."""

    n_embd, n_batch, n_heads, n_seq = 4, 8, 1, 1

    def rollback_to(self, start: int) -> None:
        pass

    def decode(self, *args: object) -> None:
        pass


class _NoRows:
    """The target as a fed drafter sees it, with no rows (they read as zeros)."""

    def hidden_rows(self, n: int) -> np.ndarray:
        return np.zeros((n, 4), dtype=np.float32)

    def add_decode_listener(self, listener: object) -> None:
        pass

    def remove_decode_listener(self, listener: object) -> None:
        pass


def bench_fed_bookkeeping(rng: np.random.Generator, context: int = 12_000, steps: int = 200) -> None:
    from localspec.drafting.mtp import MtpDrafter
    from localspec.sampling import Sampler, SamplingParams

    drafter = MtpDrafter(_NoHead(), _NoRows(), Sampler(SamplingParams(temperature=0.0)))  # type: ignore[arg-type]
    history = [int(t) for t in rng.integers(0, VOCAB, context)]
    drafter._catch_up(history)
    runs = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(steps):
            history.extend(int(t) for t in rng.integers(0, VOCAB, 2))  # two tokens kept a step
            drafter.behind(history)
            drafter._catch_up(history)
        runs.append((time.perf_counter() - start) / steps * 1e6)
    print(f"fed head bookkeeping at {context:,} tokens (behind + catch-up, no decodes): "
          f"median {np.median(runs):6.1f} us a step")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1M tokens only for the datastore")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    bench_ngram(rng)
    sizes = [1_000_000] if args.quick else [1_000_000, 10_000_000]
    made = bench_suffix_array(rng, sizes)
    bench_store(rng, made[sizes[-1]])
    bench_fed_bookkeeping(rng)


if __name__ == "__main__":
    main()
