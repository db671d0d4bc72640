"""RESULTS.md from the GPU check's results.json: the tables, and the controller's choices under the costs
measured there (simulate.py). No GPU needed: run it there after check.py, or here on a fetched JSON.

    python benchmarks/gpu/report.py results.json --out RESULTS.md [--commit SHA] [--dry-run]

``--dry-run`` (or results measured without a GPU) heads the file with a warning: such a file is the
check's CPU rehearsal, never GPU results, and is not to be committed as benchmarks/gpu/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import simulate  # noqa: E402

ALPHAS = (0.6, 0.7, 0.8, 0.9)
SIM_STEPS = 500


def _ms_curve(curve: dict[str, Any]) -> dict[int, float]:
    return {int(k): float(v) for k, v in curve["ms"].items()}


def target_curves(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every measured target curve after a short context: label -> {"ms": ..., "ratio": ..., "offload": ...}."""
    found: dict[str, dict[str, Any]] = {}
    main = results.get("verify_costs", {}).get("depth_64")
    if main:
        found["8b Q4_K_M (target)" if results["args"].get("tiny") != "True" else "tiny Q4_0 (target)"] = {
            **main, "offload": results.get("offload_target", {})}
    for label, row in results.get("curves", {}).items():
        if "depth_64" in row:
            found[label] = {**row["depth_64"], "offload": row.get("offload", {})}
    return found


def controller_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The simulated controller under each measured target curve and the measured draft's step."""
    draft = results.get("verify_costs_draft")
    rows = []
    for label, curve in target_curves(results).items():
        target = _ms_curve(curve)
        costs = simulate.GpuCosts(label, target, _ms_curve(draft) if draft else {1: target[1] * 0.2})
        cases = [(f"alpha {a:.1f}", lambda a=a: simulate.run_lengths_from_alpha(a, 0)) for a in ALPHAS]
        for row in simulate.report(costs, cases, steps=SIM_STEPS):
            rows.append({"target": label, **row})
    return rows


def _gpu_line(results: dict[str, Any]) -> str:
    gpus = results.get("device", {}).get("gpus")
    if not isinstance(gpus, list) or not gpus:
        return "no GPU (a CPU run)"
    g = gpus[0]
    return f"{g['name']}, {g['memory_total_mib']} MiB, driver {g['driver']}, compute capability {g['compute_cap']}"


def _fmt_ratio_row(ratio: dict[str, Any], ks: tuple[int, ...]) -> str:
    return " | ".join(f"{float(ratio[str(k)]):.2f}" if str(k) in ratio else "" for k in ks)


def overhead_lines(overhead: dict[str, Any]) -> list[str]:
    """The step-overhead bench's rows (``benchmarks/bench_step_overhead.py --json``) as a section."""
    out = ["## What the engine costs between decodes (bench_step_overhead.py)", "",
           f"{overhead.get('model', '?')}: {overhead.get('tokens')} tokens, {overhead.get('rounds')} rounds, each "
           f"engine against raw llama.cpp calls on its own contexts. Host time: outside `llama_decode` and the "
           f"wait for the device.", "",
           "| loop | against | tokens/s ratio | host us a step (engine / raw) | ratio at the raw loop's decode time | goal |",
           "|---|---|---|---|---|---|"]
    for r in overhead.get("rows", []):
        out.append(f"| {r['loop']} | {r['anchor']} | {r['ratio']:.3f} | {r['host_us_per_step']:.1f} / "
                   f"{r['raw_host_us_per_step']:.1f} | {r['host_ratio']:.3f} | >= {r['goal']:.2f} |")
    device = overhead.get("device_argmax")
    if device:
        out += ["", f"The raw loop with llama.cpp's greedy sampler in the decode's graph (the argmax on the device, "
                    f"no logits copied to the host): {device['ratio']:.3f}x the raw loop's tokens/s, host "
                    f"{device['host_us_per_step']:.1f} us a step against {device['raw_host_us_per_step']:.1f}; "
                    f"the same tokens: {'yes' if device['same_tokens'] else 'no'}."]
    warm = overhead.get("warm_host_us_per_step")
    if warm:
        ngram = (f", an ngram-none step {warm['ngram-none']:.1f} us" if "ngram-none" in warm else "")
        out += ["", f"With no decode at all (the row rewritten to walk text with nothing to copy; the host's caches "
                    f"stay warm): a plain step {warm['plain']:.1f} us on the host{ngram}, against the raw loop's "
                    f"{warm['raw plain']:.1f}."]
    return out + [""]


def graphs_lines(graphs: dict[str, Any]) -> list[str]:
    """graphs.py's medians (``benchmarks/gpu/graphs.py --json``) as a section: each decode kind's ms with
    ggml-cuda's graphs keyed by address (upstream) and by shape (our patch)."""
    out = ["## CUDA graphs across speculation's shapes (graphs.py)", "",
           f"{graphs.get('model', '?')}: one-token decodes and batches of k + 1 = {graphs.get('k', 0) + 1} rows, "
           f"{graphs.get('n')} of each, in a row (steady) and alternating as speculation does; the median ms of "
           f"each, with ggml-cuda's captured graphs keyed by their first node's address (upstream) and by "
           f"their shape too (scripts/llama.cpp-patches/cuda/50-cuda-graph-key-by-shape.patch); "
           f"{graphs.get('processes', 2)} processes, in the order address, shape, shape, address. On a CPU "
           f"there are no graphs: a difference there is the noise between processes.", "",
           "| decode | keyed by address (ms) | keyed by shape (ms) | shape / address |", "|---|---|---|---|"]
    by_address, by_shape = graphs.get("address", {}), graphs.get("shape", {})
    for name, ms in by_shape.items():
        old = by_address.get(name)
        if old is None:
            out.append(f"| {name} | | {ms:.3f} | |")
            continue
        out.append(f"| {name} | {old:.3f} | {ms:.3f} | {ms / old:.2f} |")
    return out + [""]


# kernels.py's settings, in its order, as the tables name them
KERNEL_SETTINGS = {"stock": "stock", "mmq": "MMQ from 2", "invariant": "batch-invariant"}


def kernels_lines(kernels: dict[str, Any]) -> list[str]:
    """kernels.py's medians (``benchmarks/gpu/kernels.py --json``) as a section: a verification batch's ms
    and its ratio to a one-token decode for each k under each setting (ggml's kernel choice, MMQ from 2
    columns, the batch-invariant switch; a setting the file lacks is left out), each beside stock; then
    each setting's batch rows against the same rows decoded alone."""
    names = [name for name in KERNEL_SETTINGS if isinstance(kernels.get(name), dict)]
    order = ", ".join(names + names[::-1])
    out = ["## Which kernels make a verification batch cheap, and which keep it exact (kernels.py)", "",
           f"{kernels.get('model', '?')}: a batch of k rows with logits for each, after a 256-token prompt, "
           f"{kernels.get('n')} of each size in a row; the median ms, with ggml-cuda's own choice of matmul "
           f"kernels (stock: matrix-vector kernels up to 8 columns on Hopper), with MMQ from 2 columns "
           f"(LOCALSPEC_CUDA_MMVQ_COLS=1, scripts/llama.cpp-patches/cuda/60-cuda-mmvq-columns-switch.patch) and "
           f"with each query summed as a lone query is, up to 8 (LOCALSPEC_CUDA_BATCH_INVARIANT=1, "
           f"70-cuda-batch-invariant-switch.patch); {kernels.get('processes', 2)} processes, in the order {order}. "
           f"On a CPU the switches change nothing: a difference there is the noise between processes.", ""]
    head, rule = ["k"], ["---"]
    for name in names:
        head += [f"{KERNEL_SETTINGS[name]} (ms)", "× k = 1"] + (["× stock"] if name != "stock" else [])
        rule += ["---"] * (2 if name == "stock" else 3)
    out += ["| " + " | ".join(head) + " |", "|" + "|".join(rule) + "|"]
    stock = kernels.get("stock", {})
    sizes = sorted({k for name in names for k in kernels[name] if k.isdigit()}, key=int)
    for k in sizes:
        cells = [k]
        for name in names:
            side = kernels[name]
            ms, one = side.get(k), side.get("1")
            cells += [f"{ms:.3f}" if ms is not None else "", f"{ms / one:.2f}" if ms is not None and one else ""]
            if name != "stock":
                cells.append(f"{ms / stock[k]:.2f}" if ms is not None and stock.get(k) else "")
        out.append("|" + "|".join(f" {cell} " if cell else " " for cell in cells) + "|")
    exact = sorted({key.split()[1] for name in names for key in kernels[name] if key.startswith("max_diff ")}, key=int)
    if exact:
        out += ["", "Each row of a batch against the same row decoded alone (the largest logit difference; the rows "
                    "whose top token differs):", "",
                "| rows | " + " | ".join(f"{KERNEL_SETTINGS[name]}: max diff | top differs" for name in names) + " |",
                "|---|" + "---|---|" * len(names)]
        for b in exact:
            cells = [f"{kernels[name].get(f'max_diff {b}', float('nan')):.4g} | "
                     f"{kernels[name].get(f'top_differs {b}', float('nan')):g}" for name in names]
            out.append(f"| {b} | " + " | ".join(cells) + " |")
    return out + [""]


def render(results: dict[str, Any], *, commit: str, dry_run: bool, overhead: dict[str, Any] | None = None,
           graphs: dict[str, Any] | None = None, kernels: dict[str, Any] | None = None) -> str:
    gpus = results.get("device", {}).get("gpus")
    on_gpu = isinstance(gpus, list) and bool(gpus)
    out: list[str] = []
    out.append("# GPU check results")
    out.append("")
    if dry_run or not on_gpu:
        out.append("> **DRY RUN on the CPU: not GPU results.** This file shows that the check runs and what it "
                   "writes; its numbers are a 2-core CPU's with tiny models. Do not commit it as "
                   "benchmarks/gpu/RESULTS.md.")
        out.append("")
    out.append(f"- date: {results.get('started', time.strftime('%Y-%m-%d'))}")
    out.append(f"- GPU: {_gpu_line(results)}")
    out.append(f"- commit: {commit or 'unknown'}")
    out.append(f"- llama.cpp: {results.get('device', {}).get('system_info', '?')}")
    out.append(f"- check wall time: {results.get('wall_s', '?')} s; skipped: {', '.join(results.get('skipped', [])) or 'none'}; "
               f"errors: {len(results.get('errors', []))}")
    out.append("")
    out.append("Random weights, realistic shapes (make_models.py): what a decode costs depends on the shapes and the "
               "quantization, not on what the weights learned. They give no real acceptance: the target and the "
               "draft share a hidden successor map, which is what they agree on; `self` (the target drafting for "
               "itself) keeps nearly every draft, so it prices a step whose draft is kept; `mtp`'s random head is "
               "never right, so it prices the drafting alone.")
    out.append("")

    curves = target_curves(results)
    ks = (1, 2, 3, 4, 5, 6, 8, 9, 12, 16, 24, 32)
    out.append("## Verification cost: one decode of k tokens, relative to k = 1 (after 64 tokens)")
    out.append("")
    out.append("| model | k=1 ms | layers on GPU | " + " | ".join(f"k={k}" for k in ks) + " |")
    out.append("|---|---|---|" + "---|" * len(ks))
    for label, curve in curves.items():
        off = curve.get("offload", {})
        layers = f"{off.get('offloaded_layers')}/{off.get('offloadable_layers')}" if off.get("offloaded_layers") is not None else "none"
        out.append(f"| {label} | {float(curve['ms']['1']):.2f} | {layers} | {_fmt_ratio_row(curve['ratio'], ks)} |")
    deep = results.get("verify_costs", {}).get("depth_1024")
    if deep:
        out.append(f"| target after 1024 tokens | {float(deep['ms']['1']):.2f} | | {_fmt_ratio_row(deep['ratio'], ks)} |")
    draft = results.get("verify_costs_draft")
    if draft:
        out.append(f"| 0.6B-class draft | {float(draft['ms']['1']):.2f} | | {_fmt_ratio_row(draft['ratio'], ks)} |")
    mtp = results.get("mtp")
    if mtp and "depth_64" in mtp:
        head = mtp["depth_64"]["head_ms"]
        out.append("")
        out.append(f"MTP head (GLM-4.5-Air's NextN block at the 8B width): {float(head['1']):.3f} ms a draft token; "
                   f"{mtp.get('head_vs_target_k1', '?')} of the target's one-token decode, "
                   f"{mtp.get('head_vs_draft_small_k1', '?')} of the draft's.")
    out.append("")

    out.append("## Exactness on this device")
    out.append("")
    out.append("A row's logits decoded alone (as plain decoding does) against the same row inside verification "
               "batches of 2..32 tokens; rows whose top token differs would part greedy speculation from plain.")
    out.append("")
    out.append("| model | flash attn | max difference | logits' std | rows with another top token | verdict |")
    out.append("|---|---|---|---|---|---|")
    exact_rows = dict(results.get("exactness", {}))
    for label, row in results.get("curves", {}).items():
        if "exactness" in row:
            exact_rows[label] = row["exactness"]
    for label, e in exact_rows.items():
        verdict = ("bit-identical" if e["bit_identical"] else
                   "identical up to near-ties" if e["top_token_differs"] == 0 else
                   f"top token differs in {e['top_token_differs']} rows")
        out.append(f"| {label} | {e.get('flash_attn')} | {e['max_diff']:.3g} | {e.get('logit_std', '')} | "
                   f"{e['top_token_differs']} | {verdict} |")
    replies = results.get("exact_replies", {})
    if replies:
        out.append("")
        for label, r in replies.items():
            out.append(f"- greedy replies with {label} (k = {r['draft_len']}, {r['max_tokens']} tokens): "
                       f"{r['identical']} of {r['replies']} token for token the plain reply"
                       + (f"; the others parted at tokens {r['parted_at_token']}" if r["parted_at_token"] else ""))
    out.append("")

    spec = results.get("speculative", {})
    if spec:
        out.append("## Plain vs speculative, tokens/s (alternating in one process, greedy)")
        out.append("")
        out.append("| drafter, length, prompt | plain t/s | speculative t/s | ratio | alpha | tokens/step | same as plain for |")
        out.append("|---|---|---|---|---|---|---|")
        for key, row in spec.items():
            if not isinstance(row, dict) or "plain_tps" not in row:
                if isinstance(row, dict):
                    out.append(f"| {key} | {row.get('skipped') or row.get('error', '')} | | | | | |")
                continue
            out.append(f"| {key} | {row['plain_tps']:.1f} | {row['spec_tps']:.1f} | {row['ratio_median']:.2f} | "
                       f"{row['alpha']:.2f} | {row['tau']:.2f} | {row['tokens_same_as_plain']}/{row['tokens']} tokens |")
        out.append("")

    rows = controller_rows(results)
    if rows:
        out.append("## The controller under these costs (simulate.py)")
        out.append("")
        out.append(f"The real Controller and CostModel on a simulated clock charged from each measured curve and the "
                   f"measured draft step; acceptance drawn at alpha per token ({SIM_STEPS} steps). `lookup` is "
                   f"ngram's kind of drafter (microseconds a proposal).")
        out.append("")
        out.append("| target | drafter | case | speedup | median draft length | plain steps | best fixed length | its speedup |")
        out.append("|---|---|---|---|---|---|---|---|")
        for r in rows:
            out.append(f"| {r['target']} | {r['drafter']} | {r['case']} | {r['speedup']:.2f} | "
                       f"{r['median_draft_len']:.0f} | {r['plain_steps']}/{r['steps']} | "
                       f"{r['best_fixed_draft_len']} | {r['best_fixed_speedup']:.2f} |")
        out.append("")
    if overhead:
        out += overhead_lines(overhead)
    if graphs:
        out += graphs_lines(graphs)
    if kernels:
        out += kernels_lines(kernels)
    if results.get("errors"):
        out.append("## Errors")
        out.append("")
        for err in results["errors"]:
            out.append("```")
            out.append(err.strip()[-1500:])
            out.append("```")
    return "\n".join(out) + "\n"


def _optional(path: Path | None) -> dict[str, Any] | None:
    """A phase's JSON file, or None where it is missing or unreadable (the report goes on without it)."""
    if path is None or not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except ValueError as err:
        print(f"report.py: {path} left out: {err}", file=sys.stderr)
        return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", type=Path)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--commit", default="")
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--step-overhead", type=Path, help="bench_step_overhead.py's --json (left out when missing)")
    p.add_argument("--graphs", type=Path, help="graphs.py's --json (left out when missing)")
    p.add_argument("--kernels", type=Path, help="kernels.py's --json (left out when missing)")
    args = p.parse_args(argv)
    try:
        results = json.loads(args.results.read_text())
    except (OSError, ValueError) as err:
        print(f"report.py: error: cannot read {args.results}: {err}", file=sys.stderr)
        return 2
    overhead, graphs, kernels = _optional(args.step_overhead), _optional(args.graphs), _optional(args.kernels)
    args.out.write_text(render(results, commit=args.commit, dry_run=args.dry_run, overhead=overhead, graphs=graphs,
                               kernels=kernels))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
