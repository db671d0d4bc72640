"""Tokens/s with the target local vs over loopback RPC, plain vs speculative, side by side in one run.

Two rpc-server processes (llama.cpp's tools/rpc, built with our patches by llama_tools.py, one
thread each) on loopback ports hold every layer of the target, half each; the draft (n-gram lookup,
or a draft model on this CPU) stays local. The same target runs on this CPU with one thread too:
a layer split is a pipeline, so one server computes at a time and both placements compute on one
thread; what differs is the hop each target pass pays (a graph sent, results copied back).

Every round runs each configuration once per prompt, the order rotating from round to round; the
table gives medians (and min–max) of tokens/s after the prompt's prefill, and each speculative
configuration's speedup over plain decoding in the same placement. Speculation pays the hop once
per γ drafted tokens instead of once per token, so its speedup should be larger over RPC.

    .venv/bin/python benchmarks/bench_rpc.py [--rounds 3] [--max-tokens 48] [--draft-len 4] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import llama_tools  # noqa: E402

PROMPTS = {
    "rewrite": ("Repeat the following list exactly, one item per line:\n"
                + "\n".join(f"- item {i}: the {c} box holds {i * 3} apples" for i, c in
                            enumerate(["red", "blue", "green", "yellow", "black", "white"], 1)) + "\n"),
    "story": "Once upon a time, in a small village by the sea, there lived",
}
CONFIGS = ("plain", "ngram", "draft model")


@dataclass
class Run:
    placement: str
    config: str
    prompt: str
    round: int
    tokens: int
    seconds: float
    accepted: int
    drafted: int

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def run_one(engine, placement: str, config: str, prompt: str, rnd: int, args) -> Run:
    from localspec.engine import GenerateOptions

    if config == "plain":
        opts = GenerateOptions(max_tokens=args.max_tokens, speculative=False)
    else:
        drafter = "ngram" if config == "ngram" else next(n for n in engine.drafter_names() if n not in ("ngram",)
                                                          and "," not in n)
        opts = GenerateOptions(max_tokens=args.max_tokens, draft_len=args.draft_len, drafter=drafter)
    done = list(engine.generate(PROMPTS[prompt], opts))[-1]
    s = done.stats
    return Run(placement, config, prompt, rnd, s.tokens, s.elapsed_s, s.accepted, s.drafted)


def report(runs: list[Run]) -> str:
    def tps(placement: str, config: str) -> list[float]:
        return [r.tokens_per_second for r in runs if r.placement == placement and r.config == config]

    lines = ["| target | drafting | tok/s median (min–max) | vs plain, same target | accepted/drafted |",
             "|---|---|---|---|---|"]
    for placement in ("local", "rpc"):
        plain = statistics.median(tps(placement, "plain"))
        for config in CONFIGS:
            values = tps(placement, config)
            med = statistics.median(values)
            mine = [r for r in runs if r.placement == placement and r.config == config]
            acc = (f"{sum(r.accepted for r in mine)}/{sum(r.drafted for r in mine)}" if config != "plain" else "–")
            where = "this CPU" if placement == "local" else "2 rpc-servers (loopback)"
            lines.append(f"| {where} | {config} | {med:.2f} ({min(values):.2f}–{max(values):.2f}) | "
                         f"{med / plain:.2f}× | {acc} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--draft-len", type=int, default=4)
    p.add_argument("--target", type=Path, default=None, help="target GGUF (default: SmolLM2-135M Q4_1 from the cache)")
    p.add_argument("--draft", type=Path, default=None, help="draft GGUF (default: SmolLM2-135M Q4_0 from the cache)")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)

    from importlib.metadata import version

    from localspec.backend import cpu_switches, rpc_devices
    from localspec.engine import Engine, GenerateOptions
    from localspec.drafting.specs import DrafterSpec
    from localspec.models.split import DeviceSplit
    from localspec.paths import cache_dir

    models = cache_dir() / "models"
    target = args.target or models / "SmolLM2-135M-Instruct.Q4_1.gguf"
    draft = args.draft or models / "SmolLM2-135M-Instruct.Q4_0.gguf"
    for path in (target, draft):
        if not path.is_file():
            sys.exit(f"bench_rpc: {path} not found; run the test suite once (it fetches the test models) or pass it")
    src = llama_tools.llama_sources(version("llama-cpp-python"))
    built = src if isinstance(src, str) else llama_tools.ensure_tools(
        src, 2, [llama_tools.RPC_SERVER], patches=llama_tools.our_patches())
    if isinstance(built, str):
        sys.exit(f"bench_rpc: {built}")
    logs = Path(tempfile.mkdtemp(prefix="bench-rpc-"))
    servers = [llama_tools.RpcServer(built[llama_tools.RPC_SERVER], logs, cpu_switches()) for _ in range(2)]
    engines = {}
    try:
        split = DeviceSplit(tuple(rpc_devices([s.endpoint for s in servers])), (0.5, 0.5))
        common = dict(specs=[DrafterSpec("ngram")], n_ctx=1024, n_threads=1, draft_n_gpu_layers=0,
                      personal_history=False)
        engines["local"] = Engine.load(target, draft, n_gpu_layers=0, **common)
        engines["rpc"] = Engine.load(target, draft, n_gpu_layers=-1, split=split, draft_split=DeviceSplit(()),
                                     **common)
        for engine in engines.values():  # warm-up: first allocations, the servers' graph caches
            list(engine.generate("Hello", GenerateOptions(max_tokens=4)))
        order = [(pl, cf, pr) for pl in engines for cf in CONFIGS for pr in PROMPTS]
        runs: list[Run] = []
        for rnd in range(args.rounds):
            shift = rnd * 5 % len(order)
            for placement, config, prompt in order[shift:] + order[:shift]:
                runs.append(run_one(engines[placement], placement, config, prompt, rnd, args))
                r = runs[-1]
                print(f"round {rnd} {placement:5} {config:11} {prompt:8} {r.tokens_per_second:6.2f} tok/s",
                      file=sys.stderr, flush=True)
    finally:
        for engine in engines.values():
            engine.close()
        for server in servers:
            server.stop()
    print(f"{platform.node()} · {platform.processor() or platform.machine()} · llama-cpp-python "
          f"{version('llama-cpp-python')} · {args.rounds} rounds × {len(PROMPTS)} prompts, {args.max_tokens} tokens, "
          f"γ = {args.draft_len}")
    print(report(runs))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in runs], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
