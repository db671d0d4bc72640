"""The GPU check: offload, verification cost curves, exactness, plain vs speculative decoding.

Runs on the models ``make_models.py`` wrote (random weights, realistic shapes)
and writes one JSON with everything it measured (``report.py`` turns it into RESULTS.md):

* ``offload``: whether this llama.cpp build can offload, how many layers
  llama.cpp says it put on the GPU, and how much GPU memory the load took
  (``nvidia-smi``) against the file's size;
* ``verify_costs``: ms of one target decode of k = 1..32 tokens (logits for
  every row, as verification asks) and the ratio to k = 1, after a short and a
  long context, for the 8B-class Q4_K_M target; ``curves``: the same after a
  short context for the other targets (8B Q8_0, 27B Q4_K_M, 27B Q8_0; written
  while the check runs, each deleted once loaded), and the 0.6B draft's;
* ``exactness``: for each model, a row's logits in a one-token decode against
  the same row in verification batches of 2..32 (largest difference, rows whose
  top token differs); ``exact_replies``: how many of N greedy replies with a
  draft (the draft model, ngram) are token for token the plain reply;
* ``speculative``: tokens/s of plain decoding and of speculative decoding,
  alternating plain, speculative, plain, ... in this one process, for the
  small draft model, ``ngram``, the target drafting for itself (loaded twice:
  acceptance near 1, so it prices a step whose draft is kept) and ``mtp`` (the
  MTP model's own head, against that model's plain decoding: its random head is
  never right, so it prices the drafting); each with a fixed draft length and
  with the adaptive controller. Two prompts: ``free`` (text; nothing to copy)
  and ``echo`` (the free prompt, the target's own greedy continuation of it, and
  the free prompt again: the continuation repeats, which n-gram drafting is for).
  Random weights give no real acceptance: the target and the draft share a
  hidden successor map (make_models.py), which is what they agree on.
* ``controller``: what the controller chooses, and the speedup it predicts, with
  the measured costs (``simulate.py``: each target's curve and the draft's step);
* ``mtp``: what one MTP head decode of k = 1..5 rows costs after 64 and 1024
  tokens, next to the draft's and the target's one-token decodes.

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

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

FREE_PROMPT = ("The history of the lighthouse begins in the ancient world, where fires were lit on hills "
               "to guide ships home. Over the centuries the towers grew taller, the lamps brighter, and")
KS = tuple(range(1, 33))
# Verification batches compared row by row with one-token decodes.
EXACT_SIZES = tuple(range(2, 33))
# Greedy replies compared token for token with plain decoding.
EXACT_PROMPTS = ("The history of the lighthouse begins in the ancient world, where",
                 "def merge_sorted(a, b):\n    \"\"\"Merge two sorted lists.\"\"\"\n",
                 "Dear committee, I am writing to apply for the position of",
                 "In 1887 the expedition reached the northern coast and",
                 "The recipe calls for two cups of flour, one egg and",
                 "Q: What is the capital of France?\nA:",
                 "Once upon a time, in a small village by the sea,",
                 "The results of the experiment show that the")
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


# --- exactness: a batch's rows against one-token decodes ----------------------------------
def batch_vs_single(model: Any, prompt: list[int], sizes: tuple[int, ...] = EXACT_SIZES, *,
                    flash_attn: bool | None = None) -> dict[str, Any]:
    """The largest difference between a row's logits decoded alone (as plain decoding does) and the same
    row inside a verification batch of each size, after ``prompt``; and the rows whose top token differs.
    ``flash_attn``: as ``Context`` takes it (None: what a generation uses)."""
    import numpy as np
    from localspec.backend import Context

    rows = (prompt * (max(sizes) // max(1, len(prompt)) + 2))[1:max(sizes) + 1]
    ctx = Context(model, n_ctx=len(prompt) + max(sizes) + 8, n_batch=max(64, max(sizes)), flash_attn=flash_attn)
    try:
        ctx.append(prompt)
        pos0 = len(ctx.tokens)
        single = []
        for token in rows:
            ctx.append([token])
            single.append(np.array(ctx.logits(0), dtype=np.float32))
        ctx.rollback_to(pos0)
        by_size: dict[int, dict[str, float]] = {}
        for b in sizes:
            ctx.decode(rows[:b], range(pos0, pos0 + b), outputs=[True] * b)
            diff, top_differs = 0.0, 0
            for i in range(b):
                row = np.asarray(ctx.logits(i))
                diff = max(diff, float(np.max(np.abs(row - single[i]))))
                top_differs += int(np.argmax(row)) != int(np.argmax(single[i]))
            by_size[b] = {"max_diff": float(f"{diff:.4g}"), "top_token_differs": top_differs}
            ctx.tokens.extend(rows[:b])
            ctx.rollback_to(pos0)
    finally:
        ctx.close()
    worst = max(v["max_diff"] for v in by_size.values())
    spread = float(np.std(single[0]))
    return {"flash_attn": ctx.flash_attn, "by_batch": by_size, "max_diff": worst,
            "logit_std": float(f"{spread:.4g}"),
            "bit_identical": worst == 0.0,
            "top_token_differs": sum(v["top_token_differs"] for v in by_size.values())}


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
    if args.no_auto:
        rows["note"] = "fixed draft lengths only (--no-auto)"
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
            lengths = ((f"k={fixed_k}", fixed_k),) if args.no_auto else ((f"k={fixed_k}", fixed_k), ("auto", None))
            for k_label, draft_len in lengths:
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
            _close_sharing(engine)
    _close_sharing(plain)
    mtp_path = args.model_dir / ("mtp-tiny.gguf" if args.tiny else "mtp-8b.gguf")
    if mtp_path.is_file():
        if time.perf_counter() > deadline:
            rows["mtp"] = {"skipped": "out of time"}
        else:
            try:
                mtp_section(mtp_path, args, rows)
            except Exception as err:  # noqa: BLE001 - record and go on
                rows["mtp"] = {"error": f"{type(err).__name__}: {err}"}
                log(f"mtp: {err}")


def _close_sharing(engine: Any) -> None:
    """Close an engine's contexts and draft model, not its target (shared by the engines here)."""
    for obj in (engine.ctx, engine.draft_ctx, engine.draft, engine.drafter_context("mtp")):
        if obj is not None:
            obj.close()


def mtp_section(mtp_path: Path, args: argparse.Namespace, rows: dict[str, Any]) -> None:
    """The MTP model with its own head drafting (a fixed length), against its own plain decoding."""
    from localspec.drafting.specs import DrafterSpec
    from localspec.engine import Engine, GenerateOptions

    plain = Engine.load(mtp_path, n_ctx=args.ctx, personal_history=False)
    spec = Engine.load(mtp_path, specs=[DrafterSpec("mtp")], n_ctx=args.ctx, personal_history=False)
    try:
        opts_plain = GenerateOptions(max_tokens=args.max_tokens, speculative=False)
        opts = GenerateOptions(max_tokens=args.max_tokens, draft_len=args.mtp_k)
        free = plain.tokenize(FREE_PROMPT)
        run_once(plain, free, opts_plain)
        run_once(spec, free, opts)
        key = f"mtp k={args.mtp_k} free"
        rows[key] = compare(plain, spec, free, opts_plain, opts, args.rounds)
        rows[key]["note"] = "the MTP model's own plain decoding is the baseline; its random head is never right"
        log(f"{key}: {rows[key]}")
    finally:
        spec.close()
        plain.close()


def exact_replies(target: Any, draft_path: Path, args: argparse.Namespace) -> dict[str, Any]:
    """How many greedy replies with a draft are token for token the plain reply (each drafter, N prompts)."""
    from localspec.backend import Model
    from localspec.drafting.specs import DrafterSpec
    from localspec.engine import Engine, GenerateOptions

    plain = Engine(target, n_ctx=args.ctx)
    opts_plain = GenerateOptions(max_tokens=args.exact_tokens, speculative=False)
    out: dict[str, Any] = {}
    drafters = (("draft-small", lambda: Engine(target, draft=Model(draft_path, n_gpu_layers=-1), n_ctx=args.ctx),
                 args.draft_k),
                ("ngram", lambda: Engine(target, specs=[DrafterSpec("ngram")], n_ctx=args.ctx), args.ngram_k))
    try:
        for label, factory, k in drafters:
            engine = factory()
            try:
                opts = GenerateOptions(max_tokens=args.exact_tokens, draft_len=k)
                same, parted = 0, []
                for text in EXACT_PROMPTS[:args.exact_n]:
                    prompt = plain.tokenize(text)
                    a = run_once(plain, prompt, opts_plain).tokens
                    b = run_once(engine, prompt, opts).tokens
                    same += tuple(a) == tuple(b)
                    if tuple(a) != tuple(b):
                        parted.append(next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b))))
                out[label] = {"replies": min(args.exact_n, len(EXACT_PROMPTS)), "identical": same, "draft_len": k,
                              "max_tokens": args.exact_tokens, "parted_at_token": parted}
                log(f"exact replies with {label} k={k}: {same} of {out[label]['replies']} identical to plain")
            finally:
                _close_sharing(engine)
    finally:
        _close_sharing(plain)
    return out


# --- the other targets' curves: written while the check runs -------------------------------
_BYTES_PER_WEIGHT = {"Q4_0": 18 / 32, "Q8_0": 34 / 32, "Q4_K_M": 0.62}


class CurveModels:
    """Writes the curve-only models one after the other in child processes (make_models.py), each
    started once the one before it is written and the disk has room for it; ``next(i)`` waits for one."""

    def __init__(self, model_dir: Path, specs: list[tuple[str, str]], log_path: Path) -> None:
        import make_models

        self.make_models = make_models
        self.model_dir, self.specs, self.log_path = model_dir, list(specs), log_path
        self.procs: list[subprocess.Popen[bytes]] = []
        self._start_next()

    def _estimate(self, shape: str, qtype: str) -> int:
        return int(self.make_models.SHAPES[shape].n_params(49152) * _BYTES_PER_WEIGHT[qtype])

    def _start_next(self) -> None:
        if len(self.procs) >= len(self.specs) or (self.procs and self.procs[-1].poll() is None):
            return
        shape, qtype = self.specs[len(self.procs)]
        if shutil.disk_usage(self.model_dir).free < self._estimate(shape, qtype) + (4 << 30):
            return  # not yet: a model still on disk must be loaded (and deleted) first
        script = Path(__file__).with_name("make_models.py")
        with open(self.log_path, "ab") as fh:
            self.procs.append(subprocess.Popen(
                [sys.executable, str(script), str(self.model_dir), "--only", "curves", "--curve", f"{shape}:{qtype}"],
                stdout=fh, stderr=subprocess.STDOUT))

    def next(self, index: int, deadline: float) -> Path | None:
        """The file of ``specs[index]`` once written (None: out of time, or its writer failed)."""
        shape, qtype = self.specs[index]
        path = self.make_models.curve_path(self.model_dir, shape, qtype)
        while time.perf_counter() < deadline:
            self._start_next()
            if path.is_file():
                return path
            if index < len(self.procs) and self.procs[index].poll() not in (None, 0):
                return None
            time.sleep(0.5)
        return None

    def loaded(self) -> None:
        """A model was loaded and its file deleted: there may be room for the next now."""
        self._start_next()

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def curve_section(writer: CurveModels, prompt: list[int], args: argparse.Namespace, deadline: float,
                  results: dict[str, Any], save: Callable[[], None]) -> None:
    curves = results.setdefault("curves", {})
    for i, (shape, qtype) in enumerate(writer.specs):
        label = f"{shape} {qtype}"
        path = writer.next(i, deadline)
        if path is None:
            curves[label] = {"skipped": "out of time or not written (models.log)"}
            log(f"curve {label}: skipped")
            continue
        try:
            model, info = load_with_offload_check(path)
        except Exception as err:  # noqa: BLE001
            curves[label] = {"error": f"{type(err).__name__}: {err}"}
            path.unlink(missing_ok=True)
            continue
        path.unlink(missing_ok=True)  # its weights are on the GPU now; the disk is for the next one
        writer.loaded()
        try:
            row: dict[str, Any] = {"offload": info}
            row["depth_64"] = cost_curve(model, prompt, 64, args.cost_budget_s)
            log(f"curve {label} ratio to k=1: {row['depth_64']['ratio']}")
            row["exactness"] = batch_vs_single(model, prompt)
            log(f"curve {label} batch vs single: max diff {row['exactness']['max_diff']}, "
                f"top token differs in {row['exactness']['top_token_differs']} rows")
            curves[label] = row
        except Exception as err:  # noqa: BLE001
            curves[label] = {"error": f"{type(err).__name__}: {err}"}
        finally:
            model.close()
        save()


def main(argv: list[str] | None = None) -> int:
    # Fresh state: no personal n-gram history, a private cost cache (this run measures). Set here, not at
    # import, so importing this module (a test does) leaves the importer's environment alone.
    os.environ["LOCALSPEC_NO_HISTORY"] = "1"
    os.environ.setdefault("LOCALSPEC_CACHE_DIR", tempfile.mkdtemp(prefix="localspec-gpu-cache-"))
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model_dir", type=Path)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--tiny", action="store_true", help="use the tiny models (the CPU dry run)")
    p.add_argument("--budget-s", type=float, default=240.0, help="stop starting new measurements after this")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--ctx", type=int, default=2048)
    p.add_argument("--draft-k", type=int, default=4, help="fixed draft length for the model drafters")
    p.add_argument("--ngram-k", type=int, default=8, help="fixed draft length for ngram")
    p.add_argument("--mtp-k", type=int, default=2, help="fixed draft length for mtp")
    p.add_argument("--cost-budget-s", type=float, default=4.0)
    p.add_argument("--exact-n", type=int, default=len(EXACT_PROMPTS), help="greedy replies compared with plain")
    p.add_argument("--exact-tokens", type=int, default=64)
    p.add_argument("--no-auto", action="store_true", help="fixed draft lengths only (no controller runs)")
    p.add_argument("--curve-models", default="8b:Q8_0,27b:Q4_K_M,27b:Q8_0",
                   help="SHAPE:QTYPE,... written and measured while the check runs (empty: none)")
    args = p.parse_args(argv)
    deadline = START + args.budget_s
    suffix = "tiny" if args.tiny else None
    target_path = args.model_dir / (f"target-{suffix}.gguf" if suffix else "target-8b.gguf")
    draft_path = args.model_dir / (f"draft-{suffix}.gguf" if suffix else "draft-0.6b.gguf")
    results: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "errors": [],
                               "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    specs = [tuple(x.split(":", 1)) for x in args.curve_models.split(",") if x]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    writer = CurveModels(args.model_dir, specs, args.out.with_name("curve-models.log")) if specs else None

    def save() -> None:
        results["wall_s"] = round(time.perf_counter() - START, 1)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1, default=str))

    def phase(name: str, fn: Callable[[], None]) -> None:
        """Run one phase unless out of time; a phase that fails is recorded and the next one runs."""
        if time.perf_counter() > deadline:
            results.setdefault("skipped", []).append(name)
            log(f"{name}: skipped (out of time)")
            return
        try:
            fn()
        except Exception:  # noqa: BLE001 - the JSON must be written whatever failed
            results["errors"].append(f"{name}: {traceback.format_exc()}")
            log(f"{name} FAILED (see errors)")
        save()

    try:
        results["device"] = device_info()
        log(f"device: {results['device']['gpus']}; offload supported: "
            f"{results['device']['gpu_offload_supported']}")
        target, results["offload_target"] = load_with_offload_check(target_path)
        save()
        prompt = target.tokenize(FREE_PROMPT)
        curves = results["verify_costs"] = {}

        def target_curves() -> None:
            for depth in (64, 1024):
                if time.perf_counter() > deadline:
                    break
                curves[f"depth_{depth}"] = cost_curve(target, prompt, depth, args.cost_budget_s)
                log(f"target verify ms at depth {depth}: {curves[f'depth_{depth}']['ms']}")
                log(f"  ratio to k=1: {curves[f'depth_{depth}']['ratio']}")

        def exactness() -> None:
            rows = results.setdefault("exactness", {})
            rows["target"] = batch_vs_single(target, prompt)
            log(f"target batch vs single: {rows['target']['max_diff']} max diff")
            # Without flash attention: whether the attention kernels or the matmuls make the difference.
            rows["target, flash attention off"] = batch_vs_single(target, prompt, flash_attn=False)
            log(f"target batch vs single, flash attention off: {rows['target, flash attention off']['max_diff']}")

        def draft_curve() -> None:
            draft, results["offload_draft"] = load_with_offload_check(draft_path)
            try:
                results["verify_costs_draft"] = cost_curve(draft, prompt, 64, min(2.0, args.cost_budget_s))
                log(f"draft verify ms at depth 64: {results['verify_costs_draft']['ms']}")
                results.setdefault("exactness", {})["draft"] = batch_vs_single(draft, prompt)
            finally:
                draft.close()

        def replies() -> None:
            results["exact_replies"] = exact_replies(target, draft_path, args)

        def mtp_head() -> None:
            mtp_path = args.model_dir / (f"mtp-{suffix}.gguf" if suffix else "mtp-8b.gguf")
            if not mtp_path.is_file():
                return
            mtp = results["mtp"] = mtp_costs(mtp_path, prompt, min(4.0, args.cost_budget_s))
            one = mtp["depth_64"]["head_ms"][1]
            if "verify_costs_draft" in results:
                mtp["head_vs_draft_small_k1"] = float(f"{one / results['verify_costs_draft']['ms'][1]:.4g}")
            if "depth_64" in curves:
                mtp["head_vs_target_k1"] = float(f"{one / curves['depth_64']['ms'][1]:.4g}")

        phase("target curves", target_curves)
        phase("target exactness", exactness)
        phase("draft curve", draft_curve)
        phase("exact replies", replies)
        phase("speculative", lambda: speculative_section(target, target_path, draft_path, args, deadline, results))
        target.close()
        if writer is not None:
            phase("curves", lambda: curve_section(writer, prompt, args, deadline, results, save))
        phase("mtp head", mtp_head)
    except Exception as err:  # noqa: BLE001 - the JSON must be written whatever failed
        results["errors"].append(traceback.format_exc())
        log(f"FAILED: {type(err).__name__}: {err}")
    finally:
        if writer is not None:
            writer.stop()
    save()
    log(f"wrote {args.out}")
    return 1 if results["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
