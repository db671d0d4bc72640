"""Which CUDA kernels make a verification batch cheap, and which keep it exact? The curve of a batch's cost
against a one-token decode, with ggml's own choice of matmul kernels, with MMQ from two columns on (#40,
item 1) and with our batch-invariant switch (#40, item 2).

For quantized weights ggml-cuda multiplies a batch of up to 8 columns with its matrix-vector kernels
(MMVQ), which dequantize the weights again for each column, and a larger one with MMQ's tiles; where
MMQ starts is tuned per architecture (Hopper: at 9). On the H200 of Dec 4 a batch of 8 rows of the 8B
Q4_K_M target cost 2.33x a one-token decode and one of 16 (MMQ) 2.23x. Our CUDA patch
scripts/llama.cpp-patches/cuda/60-cuda-mmvq-columns-switch.patch adds ``LOCALSPEC_CUDA_MMVQ_COLS``
(read once per process): ``1`` takes MMQ for every batch of 2 columns or more; so this gives both kernel
families' cost at every k from 2 to 8, and where MMQ should start follows.
scripts/llama.cpp-patches/cuda/70-cuda-batch-invariant-switch.patch adds ``LOCALSPEC_CUDA_BATCH_INVARIANT``:
``1`` sums each query of a batch of up to 8 as a lone query is summed (matrix-vector kernels with one warp
count, flash attention's vector kernel with one split of the cache), so its rows should equal one-token
decodes bit for bit up to 8 rows (16 takes MMQ: not covered), at the cost its curve shows. Each setting
runs in processes of its own (``variants.py``: stock, mmq, invariant, invariant, mmq, stock; medians).
Each batch is timed until the device finished it (``Context.decode``), after a 256-token prompt, steady
(the same k in a row, its CUDA graph warm), logits for every row as a verification asks. Then, under each
setting, how far each row of a batch of 2, 4, 8 and 16 is from the same row decoded alone (check.py's
batch_vs_single: the largest logit difference, the rows whose top token differs; #40 item 4's comparison
with each switch on and off). On a CPU (a dry run) the switches change nothing and the settings measure the same.

    python benchmarks/gpu/kernels.py MODEL.gguf --json kernels.json [--n 16] [--rounds 1]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

from variants import measure_variants

KS = (1, 2, 3, 4, 5, 6, 8, 9, 12, 16)
EXACT_SIZES = (2, 4, 8, 16)
# ggml's own choice; MMQ from 2 columns; batches of up to 8 summed per query as a lone query is
SETTINGS = {"stock": {}, "mmq": {"LOCALSPEC_CUDA_MMVQ_COLS": "1"}, "invariant": {"LOCALSPEC_CUDA_BATCH_INVARIANT": "1"}}


def measure(model_path: Path, n: int, gpu_layers: int) -> dict[str, float]:
    """Median ms of a batch of k rows for each k in KS (keyed "k"), on one context (this process's kernel
    choice); then each exactness size b's largest difference from one-token decodes ("max_diff b") and
    its rows whose top token differs ("top_differs b")."""
    from check import batch_vs_single
    from localspec.backend import Context, Model

    model = Model(model_path, n_gpu_layers=gpu_layers)
    ctx = Context(model, n_ctx=512, n_batch=512, n_threads=1)  # (all offloaded on a GPU)
    rng = random.Random(0)
    prompt = [rng.randrange(model.n_vocab) for _ in range(256)]
    ctx.decode(prompt, range(len(prompt)))
    ctx.tokens.extend(prompt)
    out: dict[str, float] = {}
    for k in KS:
        times = []
        for _ in range(n):
            before = ctx.decode_seconds
            batch = [rng.randrange(model.n_vocab) for _ in range(k)]
            ctx.decode(batch, range(len(prompt), len(prompt) + k), None, [True] * k)
            times.append((ctx.decode_seconds - before) * 1e3)
            ctx.tokens.extend(batch)
            ctx.rollback_to(len(prompt))  # (every batch rejected: the next one sits where this one did)
        skip = min(4, n // 4)  # warm-up: a graph is captured on its second identical call
        out[str(k)] = statistics.median(times[skip:])
    ctx.close()
    exact = batch_vs_single(model, prompt[:64], EXACT_SIZES)
    for b, row in exact["by_batch"].items():
        out[f"max_diff {b}"], out[f"top_differs {b}"] = row["max_diff"], row["top_token_differs"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--n", type=int, default=16, help="batches of each size")
    ap.add_argument("--rounds", type=int, default=1, help="sweeps of processes, each setting there and back")
    ap.add_argument("--gpu-layers", type=int, default=-1)
    ap.add_argument("--variant", choices=SETTINGS, help=argparse.SUPPRESS)  # (a child process: one setting)
    args = ap.parse_args(argv)
    if args.variant is not None:
        print(json.dumps(measure(args.model, args.n, args.gpu_layers)))
        return 0
    child = [str(args.model), "--n", str(args.n), "--gpu-layers", str(args.gpu_layers)]
    results = measure_variants(__file__, child, SETTINGS, args.rounds, {"model": args.model.name, "n": args.n},
                               args.json)
    if results is None:
        return 1
    for k in map(str, KS):
        row = "  ".join(f"{name} {results[name][k]:7.3f} ms ({results[name][k] / results[name]['1']:.2f}x)"
                        for name in SETTINGS)
        print(f"k = {k:>2}  {row}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
