"""The GPU check: offload, the verification cost curve, plain vs speculative decoding.

Runs on the models ``make_models.py`` wrote (random weights, realistic shapes)
and writes one JSON with everything it measured:

* ``offload``: whether this llama.cpp build can offload, how many layers
  llama.cpp says it put on the GPU, and how much GPU memory the load took
  (``nvidia-smi``) against the file's size;
* ``verify_costs``: ms of one target decode of k = 1..16 tokens (logits for
  every row, as verification asks) and the ratio to k = 1, after a short and a
  long context; the controller's GPU defaults are meant to come from these;
* ``speculative``: tokens/s of plain decoding and of speculative decoding,
  alternating plain, speculative, plain, ... in this one process, for the
  target drafting for itself (loaded twice), the small draft model, and
  ``ngram``; each with a fixed draft length and with the adaptive controller.
  Two prompts: ``free`` (text; nothing to copy) and ``echo`` (the free prompt,
  the target's own greedy continuation of it, and the free prompt again: the
  continuation repeats, as in editing or quoting tasks, which n-gram drafting
  is for).
* ``mtp``: what the target's own MTP (NextN) head costs per draft token, on a
  glm4moe model with GLM-4.5-Air's NextN block at the 8B width: ms of one
  head decode of k = 1..5 rows (1: a draft token; more: the catch-up after a
  step kept k - 1 drafts) after 64 and 1024 tokens, next to the 0.5B draft's
  and the 8B target's one-token decode.

    python benchmarks/gpu/check.py MODEL_DIR --out results.json [--tiny]

Greedy throughout. Every phase watches one deadline (``--budget-s``): what does
not fit is recorded as skipped, and the JSON is written whatever happens.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

# Fresh state: no personal n-gram history, a private cost cache (this run measures).
os.environ["LOCALSPEC_NO_HISTORY"] = "1"
os.environ.setdefault("LOCALSPEC_CACHE_DIR", tempfile.mkdtemp(prefix="localspec-gpu-cache-"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

FREE_PROMPT = ("The history of the lighthouse begins in the ancient world, where fires were lit on hills "
               "to guide ships home. Over the centuries the towers grew taller, the lamps brighter, and")
KS = tuple(range(1, 17))
START = time.perf_counter()


def log(msg: str) -> None:
    print(f"[check {time.strftime('%H:%M:%S')} +{time.perf_counter() - START:6.1f}s] {msg}", flush=True)


# --- the device -----------------------------------------------------------------
def nvidia_smi(query: str) -> list[str] | None:
    """One ``nvidia-smi --query-gpu`` row per GPU, or None without a working nvidia-smi."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, f"--query-gpu={query}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return [line.strip() for line in out.splitlines() if line.strip()]


def gpu_memory_used_mib() -> int | None:
    rows = nvidia_smi("memory.used")
    return sum(int(float(r)) for r in rows) if rows else None


def device_info() -> dict[str, Any]:
    from localspec import backend

    rows = nvidia_smi("name,memory.total,driver_version,compute_cap")
    gpus = []
    for row in rows or []:
        name, total, driver, cap = (part.strip() for part in row.split(","))
        gpus.append({"name": name, "memory_total_mib": int(float(total)), "driver": driver, "compute_cap": cap})
    return {"gpus": gpus or "no GPU", "gpu_offload_supported": backend.gpu_offload_supported(),
            "system_info": backend.system_info(), "cpu_count": os.cpu_count()}


def load_with_offload_check(path: Path, *, load_mtp: bool = False) -> tuple[Any, dict[str, Any]]:
    """Load ``path`` with every layer offloaded; say where llama.cpp put them."""
    from localspec import backend

    before = gpu_memory_used_mib()
    t0 = time.perf_counter()
    model = backend.Model(path, n_gpu_layers=-1, load_mtp=load_mtp)
    load_s = time.perf_counter() - t0
    after = gpu_memory_used_mib()
    found = [re.search(r"offloaded (\d+)/(\d+) layers", line) for line in backend.recent_log()]
    hits = [m for m in found if m]
    info: dict[str, Any] = {
        "file": path.name, "file_mib": round(path.stat().st_size / 2**20), "load_s": round(load_s, 2),
        "n_layers": model.n_layers,
        "offloaded_layers": int(hits[-1].group(1)) if hits else None,
        "offloadable_layers": int(hits[-1].group(2)) if hits else None,
        "gpu_mib_added": None if before is None or after is None else after - before,
    }
    if not backend.gpu_offload_supported():
        info["verdict"] = "no GPU offload in this llama.cpp build"
    elif hits and hits[-1].group(1) == hits[-1].group(2) and int(hits[-1].group(1)) > 0:
        info["verdict"] = "all layers on the GPU"
    elif info["gpu_mib_added"] is not None and info["gpu_mib_added"] > 0.8 * info["file_mib"]:
        info["verdict"] = "GPU memory grew by about the model's size"
    else:
        info["verdict"] = "NOT OFFLOADED (see the llama.cpp log)"
    log(f"loaded {path.name}: {info}")
    return model, info


# --- the cost curve ---------------------------------------------------------------
def cost_curve(model: Any, prompt: list[int], depth: int, budget_s: float) -> dict[str, Any]:
    """ms per decode of k tokens after ``depth`` tokens of context."""
    from localspec.backend import Context
    from localspec.policy.measure import measure_verify_costs

    ctx = Context(model, n_ctx=depth + 64, n_batch=512)
    try:
        history = (prompt * (depth // max(1, len(prompt)) + 1))[:depth]
        ctx.append(history)
        m = measure_verify_costs(ctx, KS, budget_s=budget_s, min_reps=5, max_reps=40)
    finally:
        ctx.close()
    ms = {k: round(v, 3) for k, v in sorted(m.items())}
    return {"depth": depth, "rounds": m.rounds, "ms": ms, "ratio": {k: round(v / ms[1], 3) for k, v in ms.items()}}


# --- the MTP head's step cost ----------------------------------------------------------
MTP_KS = (1, 2, 3, 4, 5)


def mtp_costs(path: Path, prompt: list[int], budget_s: float) -> dict[str, Any]:
    """ms of one MTP head decode of k rows after 64 and 1024 tokens (the trunk fed first, as in use)."""
    import numpy as np
    from localspec.backend import Context, MtpContext

    model, info = load_with_offload_check(path, load_mtp=True)
    out: dict[str, Any] = {"offload": info, "n_nextn_layers": model.n_nextn_layers}
    ctx = Context(model, n_ctx=1024 + 64, n_batch=512)
    ctx.enable_hidden_rows()
    head = MtpContext(ctx, n_batch=128)
    zeros = np.zeros((max(MTP_KS), head.n_embd), dtype=np.float32)
    try:
        for depth in (64, 1024):
            history = (prompt * (depth // max(1, len(prompt)) + 1))[:depth]
            ctx.clear()
            head.clear()
            ctx.append(history)
            for start in range(0, depth, head.n_batch):  # the head's own cache of the history
                chunk = history[start:start + head.n_batch]
                head.decode(chunk, range(start, start + len(chunk)), zeros[:1].repeat(len(chunk), 0),
                            [False] * (len(chunk) - 1) + [True])
            ms: dict[int, float] = {}
            stop = time.perf_counter() + budget_s / 2
            for k in MTP_KS:
                times = []
                for _ in range(40):
                    t0 = time.perf_counter()
                    head.decode(history[:k], range(depth, depth + k), zeros[:k], [True] * k)
                    np.asarray(head.logits(k - 1))[0]  # the result is read, as a drafter does
                    times.append((time.perf_counter() - t0) * 1e3)
                    head.rollback_to(depth)
                    if len(times) >= 5 and time.perf_counter() > stop:
                        break
                ms[k] = round(statistics.median(times), 3)
            out[f"depth_{depth}"] = {"head_ms": ms}
            log(f"MTP head ms at depth {depth}: {ms}")
    finally:
        head.close()
        ctx.close()
        model.close()
    return out


# --- plain vs speculative ------------------------------------------------------------
def run_once(engine: Any, prompt: list[int], opts: Any) -> Any:
    return engine.generate(prompt, opts).run()


def repetition(tokens: tuple[int, ...]) -> dict[str, Any]:
    """How repetitive greedy output is: n-gram drafting on a loop would mean nothing."""
    n = len(tokens)
    grams = [tokens[i:i + 4] for i in range(max(0, n - 3))]
    return {"tokens": n, "distinct": len(set(tokens)),
            "repeated_4gram_share": round(1 - len(set(grams)) / len(grams), 3) if grams else 0.0}


def compare(plain: Any, spec: Any, prompt: list[int], opts_plain: Any, opts_spec: Any,
            rounds: int) -> dict[str, Any]:
    ratios, plain_tps, spec_tps, alphas, taus, same = [], [], [], [], [], []
    for _ in range(rounds):
        a = run_once(plain, prompt, opts_plain)
        b = run_once(spec, prompt, opts_spec)
        plain_tps.append(a.stats.tokens_per_second)
        spec_tps.append(b.stats.tokens_per_second)
        ratios.append(b.stats.tokens_per_second / max(a.stats.tokens_per_second, 1e-9))
        alphas.append(b.stats.acceptance_rate)
        taus.append(b.stats.tokens_per_step)
        # GPU kernels are not batch-invariant: near-ties may part ways; report, do not assert.
        common = next((i for i, (x, y) in enumerate(zip(a.tokens, b.tokens)) if x != y), min(len(a.tokens), len(b.tokens)))
        same.append(common)
    last = b.stats
    return {
        "plain_tps": round(statistics.median(plain_tps), 2), "spec_tps": round(statistics.median(spec_tps), 2),
        "ratio_median": round(statistics.median(ratios), 3), "ratio_min": round(min(ratios), 3),
        "ratio_max": round(max(ratios), 3), "alpha": round(statistics.median(alphas), 3),
        "tau": round(statistics.median(taus), 3), "steps": last.steps, "drafted": last.drafted,
        "verify_ms": round(last.verify_ms, 1), "draft_ms": round(last.draft_ms, 1),
        "python_ms": round(last.python_ms, 1), "tokens_same_as_plain": min(same), "tokens": len(a.tokens),
        "controller": dataclasses.asdict(last.control) if last.control is not None else None,
    }


def speculative_section(target: Any, target_path: Path, draft_path: Path, args: argparse.Namespace,
                        deadline: float, results: dict[str, Any]) -> None:
    from localspec.backend import Model
    from localspec.drafting.specs import DrafterSpec
    from localspec.engine import Engine, GenerateOptions

    ctx = args.ctx
    plain = Engine(target, n_ctx=ctx)
    opts_plain = GenerateOptions(max_tokens=args.max_tokens, speculative=False)
    free = plain.tokenize(FREE_PROMPT)
    run_once(plain, free, opts_plain)  # warm-up: kernels, allocator, CUDA graphs
    continuation = run_once(plain, free, opts_plain).tokens
    prompts = {"free": free, "echo": free + list(continuation) + free}
    results["greedy_output"] = repetition(continuation)
    log(f"greedy continuation of the free prompt: {results['greedy_output']}")

    # (label, engine factory, fixed draft length); each also runs with the controller (draft_len None).
    drafters: list[tuple[str, Callable[[], Any], int]] = [
        ("ngram", lambda: Engine(target, specs=[DrafterSpec("ngram")], n_ctx=ctx), args.ngram_k),
        ("draft-small", lambda: Engine(target, draft=Model(draft_path, n_gpu_layers=-1), n_ctx=ctx), args.draft_k),
        ("self", lambda: Engine(target, draft=Model(target_path, n_gpu_layers=-1), n_ctx=ctx), args.draft_k),
    ]
    rows = results["speculative"] = {}
    for label, factory, fixed_k in drafters:
        if time.perf_counter() > deadline:
            rows[label] = {"skipped": "out of time"}
            log(f"{label}: skipped (out of time)")
            continue
        try:
            engine = factory()
        except Exception as err:  # noqa: BLE001 - record and go on with the next drafter
            rows[label] = {"error": f"{type(err).__name__}: {err}"}
            log(f"{label}: cannot build the engine: {err}")
            continue
        try:
            for k_label, draft_len in ((f"k={fixed_k}", fixed_k), ("auto", None)):
                opts = GenerateOptions(max_tokens=args.max_tokens, draft_len=draft_len)
                run_once(engine, free, opts)  # warm-up (and the controller's cost measurement)
                for pname, prompt in prompts.items():
                    key = f"{label} {k_label} {pname}"
                    if time.perf_counter() > deadline:
                        rows[key] = {"skipped": "out of time"}
                        continue
                    rows[key] = compare(plain, engine, prompt, opts_plain, opts, args.rounds)
                    log(f"{key}: {rows[key]}")
        finally:
            # Not engine.close(): the target model is shared by every engine here.
            for obj in (engine.ctx, engine.draft_ctx, engine.draft):
                if obj is not None:
                    obj.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model_dir", type=Path)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--tiny", action="store_true", help="use target-tiny/draft-tiny (the CPU dry run)")
    p.add_argument("--budget-s", type=float, default=240.0, help="stop starting new measurements after this")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--ctx", type=int, default=2048)
    p.add_argument("--draft-k", type=int, default=4, help="fixed draft length for the model drafters")
    p.add_argument("--ngram-k", type=int, default=8, help="fixed draft length for ngram")
    p.add_argument("--cost-budget-s", type=float, default=4.0)
    args = p.parse_args(argv)
    deadline = START + args.budget_s
    suffix = "tiny" if args.tiny else None
    target_path = args.model_dir / (f"target-{suffix}.gguf" if suffix else "target-8b.gguf")
    draft_path = args.model_dir / (f"draft-{suffix}.gguf" if suffix else "draft-0.5b.gguf")
    results: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "errors": []}

    def save() -> None:
        results["wall_s"] = round(time.perf_counter() - START, 1)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1, default=str))

    try:
        results["device"] = device_info()
        log(f"device: {results['device']['gpus']}; offload supported: "
            f"{results['device']['gpu_offload_supported']}")
        target, results["offload_target"] = load_with_offload_check(target_path)
        save()
        prompt = target.tokenize(FREE_PROMPT)
        curves = results["verify_costs"] = {}
        for depth in (64, 1024):
            if time.perf_counter() > deadline:
                break
            curves[f"depth_{depth}"] = cost_curve(target, prompt, depth, args.cost_budget_s)
            log(f"target verify ms at depth {depth}: {curves[f'depth_{depth}']['ms']}")
            log(f"  ratio to k=1: {curves[f'depth_{depth}']['ratio']}")
        draft, results["offload_draft"] = load_with_offload_check(draft_path)
        results["verify_costs_draft"] = cost_curve(draft, prompt, 64, min(2.0, args.cost_budget_s))
        log(f"draft verify ms at depth 64: {results['verify_costs_draft']['ms']}")
        draft.close()
        save()
        mtp_path = args.model_dir / (f"mtp-{suffix}.gguf" if suffix else "mtp-8b.gguf")
        if mtp_path.is_file() and time.perf_counter() < deadline:
            try:
                mtp = results["mtp"] = mtp_costs(mtp_path, prompt, min(4.0, args.cost_budget_s))
                one = mtp["depth_64"]["head_ms"][1]
                mtp["head_vs_draft_small_k1"] = float(f"{one / results['verify_costs_draft']['ms'][1]:.4g}")
                mtp["head_vs_target_k1"] = float(f"{one / curves['depth_64']['ms'][1]:.4g}")
                log(f"MTP head / 0.5B draft one-token decode: {mtp['head_vs_draft_small_k1']}; "
                    f"/ target: {mtp['head_vs_target_k1']}")
            except Exception:  # noqa: BLE001 - the rest of the check still runs
                results["errors"].append(traceback.format_exc())
                log("MTP costs FAILED (see errors)")
            save()
        speculative_section(target, target_path, draft_path, args, deadline, results)
    except Exception as err:  # noqa: BLE001 - the JSON must be written whatever failed
        results["errors"].append(traceback.format_exc())
        log(f"FAILED: {type(err).__name__}: {err}")
    save()
    log(f"wrote {args.out}")
    return 1 if results["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
