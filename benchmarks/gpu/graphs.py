"""Do CUDA graphs stay warm across the shapes speculation alternates between? (#39, item 3)

Times one context's decodes in two patterns, each in a process of its own for each way ggml-cuda keys
its captured graphs (``LOCALSPEC_CUDA_GRAPH_KEY``, read once per process, see
scripts/llama.cpp-patches/cuda/50-cuda-graph-key-by-shape.patch):

  steady       one-token decodes in a row, then verification batches of k + 1 rows in a row
  alternating  a one-token decode, then a batch of k + 1 rows cut back to one kept token, and again
               (what a draft model's context and the target's do under speculation)

``address`` keys a graph by its first node alone (upstream): in the alternating pattern each change of
shape resets the one shared graph's warmup, and the decodes run without a graph. ``shape`` (our patch)
keys it by its shape too. Each decode is timed until the device finished it (``Context.decode``).
The processes run in the order address, shape, shape, address (``--rounds`` such pairs): the same decode
costs a few percent more or less from one process to the next, and the first pays for a cold start; each
figure is the median over a keying's processes. On a CPU (a dry run) there are no graphs and both ways
measure the same: what a dry run shows between them is that noise.

    python benchmarks/gpu/graphs.py MODEL.gguf --json graphs.json [--k 4] [--n 48] [--rounds 1]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

from variants import measure_variants

MODES = ("address", "shape")


def measure(model_path: Path, k: int, n: int, gpu_layers: int) -> dict[str, float]:
    """Median ms of each decode kind in each pattern, on one context (this process's graph keying)."""
    from localspec.backend import Context, Model

    model = Model(model_path, n_gpu_layers=gpu_layers)
    ctx = Context(model, n_ctx=512 + 4 * n * (k + 2), n_batch=512, n_threads=1)  # (all offloaded on a GPU)
    rng = random.Random(0)

    def tokens(m: int) -> list[int]:
        return [rng.randrange(model.n_vocab) for _ in range(m)]

    def decode(batch: list[int], keep: int) -> float:
        """Decode ``batch`` after what the cache holds, keep its first ``keep`` tokens; its ms."""
        n_past, before = len(ctx.tokens), ctx.decode_seconds
        ctx.decode(batch, range(n_past, n_past + len(batch)), None, [True] * len(batch))
        ctx.tokens.extend(batch)
        ctx.rollback_to(n_past + keep)
        return (ctx.decode_seconds - before) * 1e3

    decode(tokens(256), 256)  # a prompt
    times: dict[str, list[float]] = {"one, steady": [], "batch, steady": [], "one, alternating": [],
                                     "batch, alternating": []}
    for _ in range(n):
        times["one, steady"].append(decode(tokens(1), 1))
    for _ in range(n):
        times["batch, steady"].append(decode(tokens(k + 1), 1))
    for _ in range(n):
        times["one, alternating"].append(decode(tokens(1), 1))
        times["batch, alternating"].append(decode(tokens(k + 1), 1))
    skip = min(4, n // 4)  # warm-up: a graph is captured on its second identical call
    return {name: statistics.median(t[skip:]) for name, t in times.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--k", type=int, default=4, help="draft length: verification batches of k + 1 rows")
    ap.add_argument("--n", type=int, default=48, help="decodes of each kind in each pattern")
    ap.add_argument("--rounds", type=int, default=1,
                    help="pairs of processes for each keying, run address, shape, shape, address")
    ap.add_argument("--gpu-layers", type=int, default=-1)
    ap.add_argument("--variant", choices=MODES, help=argparse.SUPPRESS)  # (a child process: one keying)
    args = ap.parse_args(argv)
    if args.variant is not None:
        print(json.dumps(measure(args.model, args.k, args.n, args.gpu_layers)))
        return 0
    child = [str(args.model), "--k", str(args.k), "--n", str(args.n), "--gpu-layers", str(args.gpu_layers)]
    results = measure_variants(__file__, child, {m: {"LOCALSPEC_CUDA_GRAPH_KEY": m} for m in MODES}, args.rounds,
                               {"model": args.model.name, "k": args.k, "n": args.n}, args.json)
    if results is None:
        return 1
    for name in results["shape"]:
        row = "  ".join(f"{mode} {results[mode][name]:7.3f} ms" for mode in MODES)
        print(f"{name:20s} {row}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
