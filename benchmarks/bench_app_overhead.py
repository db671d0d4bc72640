"""What the chat app costs a reply's speed: tokens/s in ``localspec run``'s app against the engine alone.

The app draws on its own thread (Textual's), ten times a second while a reply streams; the reply decodes
on a worker thread. Both run Python, and CPython runs one thread's Python at a time: the worker gives the
interpreter up inside every llama.cpp call and must get it back when the call returns. While the app
draws, it waits, by default up to the interpreter's switch interval (5 ms) each time. On a CPU decode of a
few hundred microseconds that hides in the decode's own time; on a GPU, where a decode is a few
milliseconds of waiting for the device, it is what the reply loses.

To see it without a GPU, each decode is followed by a wait of ``--device-ms`` outside the interpreter
(``time.sleep``, as a GPU's synchronize waits), on make_models.py's tiny random target: a GPU-like step
on this CPU. Plain decoding, greedy, one thread; the app runs headless through Textual's Pilot (real
terminals cost more: the writes). Loops alternate round by round; medians.

    python benchmarks/bench_app_overhead.py [--tokens 768] [--rounds 3] [--device-ms 4]
                                            [--switch-interval-ms X]

``--switch-interval-ms`` runs the app at that interval instead of the app's own (``SWITCH_INTERVAL_S``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests" / "support"))
os.environ.setdefault("LOCALSPEC_NO_HISTORY", "1")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=768)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--device-ms", type=float, default=4.0, help="a wait outside the interpreter after each decode")
    ap.add_argument("--switch-interval-ms", type=float, help="the app's switch interval (default: the app's own)")
    args = ap.parse_args(argv)

    import localspec.backend.context as context
    import localspec_tui.app as app_module
    from bench_step_overhead import PROMPT, tiny_model
    from localspec.backend import Model
    from localspec.engine import Engine, GenerateOptions
    from localspec_tui.app import LocalspecApp
    from tui_support import send, wait_until

    if args.device_ms > 0:
        decode, wait_s = context.synchronized_decode, args.device_ms / 1e3

        def gpu_like(ctx, run, batch):  # type: ignore[no-untyped-def]
            rc, seconds = decode(ctx, run, batch)
            time.sleep(wait_s)  # (the interpreter is free meanwhile, as in a GPU's synchronize)
            return rc, seconds + wait_s

        context.synchronized_decode = gpu_like
    if args.switch_interval_ms is not None:
        app_module.SWITCH_INTERVAL_S = args.switch_interval_ms / 1e3

    model = tiny_model(Path(tempfile.gettempdir()) / "localspec-bench-tiny")
    engine = Engine(Model(model), n_ctx=args.tokens + 256, n_threads=1, personal_history=False)
    opts = GenerateOptions(max_tokens=args.tokens, speculative=False)
    prompt = engine.chat_tokens([{"role": "user", "content": PROMPT}])

    def bare() -> float:
        stats = engine.generate(prompt, opts).run().stats
        return stats.tokens / stats.elapsed_s

    async def in_app(history: Path) -> float:
        app = LocalspecApp(engine, opts, history_dir=history, measure_on_start=False)
        async with app.run_test(size=(120, 40)) as pilot:
            await send(pilot, PROMPT)
            await wait_until(pilot, lambda: app.last_done is not None and not app.reply_running, what="the reply")
            assert app.last_done is not None
            stats = app.last_done.stats
            intervals.append(app.pace.interval_s)
            return stats.tokens / stats.elapsed_s

    intervals: list[float] = []  # the app's update interval at each reply's end
    bare()  # warm-up
    rates: dict[str, list[float]] = {"engine": [], "app": []}
    for _ in range(args.rounds):
        rates["engine"].append(bare())
        with tempfile.TemporaryDirectory() as history:
            rates["app"].append(asyncio.run(in_app(Path(history))))
    engine_rate, app_rate = statistics.median(rates["engine"]), statistics.median(rates["app"])
    interval = app_module.SWITCH_INTERVAL_S * 1e3
    print(f"device wait {args.device_ms:g} ms a decode, {args.tokens} tokens, app switch interval {interval:g} ms")
    print(f"  engine alone  {engine_rate:7.1f} tok/s (median of {args.rounds})")
    print(f"  in the app    {app_rate:7.1f} tok/s  {app_rate / engine_rate:.3f}x the engine alone; its updates "
          f"every {1e3 * statistics.median(intervals):.0f} ms at the reply's end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
