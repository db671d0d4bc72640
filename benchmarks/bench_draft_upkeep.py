"""What a draft model the controller keeps off costs: chat replies with and without it, as ratios in one run.

The draft is SmolLM2-135M's own Q4_0 requantization drafting for its Q4_1
original: as costly per token as the target, so drafting can only lose and
the controller should leave it alone, prefill and catch-up included. Each
round generates the same chat reply with the plain engine and with the
engine holding the draft (no fixed draft length), alternating which goes
first; it prints per prompt the median ratio of tokens/s (draft engine over
plain) and of time to first token (each reply from an empty cache, as a new
chat: the prompt's prefill included), and what the controller did.

    python benchmarks/bench_draft_upkeep.py [--rounds 5] [--max-tokens 160] [--keep-prefix]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_speculative import default_models  # noqa: E402

QUESTIONS = [
    "Explain how a hash table works.",
    "Write a short story about a lighthouse keeper.",
    "What are the main causes of inflation?",
]


def reply(engine, question: str, opts, *, fresh: bool = True):
    """(done event, seconds to the first token event) for one chat reply.

    ``fresh``: start from an empty cache, as a new chat does, so the first token
    waits for the prompt's prefill. Without it every round after the first finds
    its prompt already cached and the "first token" is a single decode step, in
    which a few tenths of a millisecond of Python (the controller's first full
    plan, the drafters' setup) show as several percent.
    """
    from localspec.events import DoneEvent, TokenEvent

    tokens = engine.chat_tokens([{"role": "user", "content": question}])
    if fresh:
        engine.invalidate()
    t0 = time.perf_counter()
    first = None
    done = None
    for event in engine.generate(tokens, opts):
        if first is None and isinstance(event, TokenEvent):
            first = time.perf_counter() - t0
        if isinstance(event, DoneEvent):
            done = event
    assert done is not None
    return done, first if first is not None else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--ctx", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--questions", type=int, default=len(QUESTIONS))
    parser.add_argument("--keep-prefix", action="store_true",
                        help="reuse the cached prompt between rounds (time to first token is then one decode step)")
    args = parser.parse_args()

    from localspec.backend import Model
    from localspec.engine import Engine, GenerateOptions

    target_path, draft_path = default_models()
    target = Model(target_path)
    plain = Engine(target, n_ctx=args.ctx, n_threads=args.threads)
    spec = Engine(target, draft=Model(draft_path), n_ctx=args.ctx, n_threads=args.threads)
    spec.cost_model()  # measured (or read from the cache) before anything is timed
    plain_opts = GenerateOptions(max_tokens=args.max_tokens, speculative=False)
    spec_opts = GenerateOptions(max_tokens=args.max_tokens)
    all_speed, all_ttft = [], []
    print(f"target {target_path.name}, draft {draft_path.name}, {args.rounds} rounds, max {args.max_tokens} tokens")
    for question in QUESTIONS[: args.questions]:
        reply(plain, question, plain_opts, fresh=not args.keep_prefix)  # warm-up
        speed, ttft, steps, drafted, draft_ms, tokens = [], [], [], [], [], []
        for r in range(args.rounds):
            order = [(plain, plain_opts), (spec, spec_opts)]
            if r % 2:
                order.reverse()
            results = {id(engine): reply(engine, question, opts, fresh=not args.keep_prefix) for engine, opts in order}
            (a, a_first), (b, b_first) = results[id(plain)], results[id(spec)]
            speed.append(b.stats.tokens_per_second / a.stats.tokens_per_second)
            ttft.append(b_first / a_first)
            c = b.stats.control
            steps.append(c.probes + c.draft_steps if c is not None else 0)
            drafted.append(b.stats.drafted)
            draft_ms.append(b.stats.draft_ms)
            tokens.append(len(b.tokens))
            assert a.tokens == b.tokens or not a.tokens, "greedy replies differ"
        all_speed += speed
        all_ttft += ttft
        last = b.stats.control.last_reason if b.stats.control is not None else ""
        print(f"{question[:40]:40s} tokens {statistics.median(tokens):4.0f}  tok/s ratio "
              f"{statistics.median(speed):.3f} (min {min(speed):.3f}, max {max(speed):.3f})  first-token ratio "
              f"{statistics.median(ttft):.3f}  drafting steps {max(steps)}  drafted {max(drafted)}  "
              f"draft ms {max(draft_ms):.1f}\n    last reason: {last}")
    print(f"overall median: tok/s ratio {statistics.median(all_speed):.3f}, "
          f"first-token ratio {statistics.median(all_ttft):.3f}")


if __name__ == "__main__":
    main()
