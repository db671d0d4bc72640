"""What the engine costs a step beyond its decodes: localspec against a raw loop of the same llama.cpp calls.

On a GPU a decode takes a few milliseconds, so every host millisecond between decodes shows in the
speed. On a CPU the same host work can be seen with a tiny model, where a decode takes 0.2-0.4 ms: this
benchmark runs unchanged on both (``--gpu-layers``), one process, greedy, the same model object, and
alternates seven loops round by round so that drift hits each alike:

  raw plain       decode one token, wait for it, read its row, argmax on the host, feed it back
  plain           localspec's Engine, plain decoding (no drafter)
  raw device argmax  raw plain with llama.cpp's greedy backend sampler: the argmax is a node of the
                  decode's graph and no logits are copied to the host (not what localspec does; whether
                  it would pay: on a GPU it saves each row's copy, on the CPU ggml pads the logits first)
  raw ngram's ctx raw plain on the n-gram engine's context (one with 33 sequences, for trees)
  ngram-none      localspec with its n-gram drafter and the controller, on a text where the lookup finds
                  nothing to copy (every step plain: what a lookup that finds nothing costs, asked or not)
  raw self k=4    the target drafting for itself on a second context (every draft kept): a catch-up
                  decode and four one-token draft decodes, one 5-row verification with every row's
                  argmax, the rejected tail cut from both caches
  self k=4        localspec with the same model file as its draft model, draft length fixed at 4

The raw loops are the anchor: nothing of localspec's runs in them (they call llama-cpp-python's
bindings directly) and they run on the engine's own llama.cpp contexts, each raw loop on the engine
it anchors (the engine then decodes its prompt afresh, as the raw loop does). On separate contexts the
same decode took 4% more or less from one process to the next (where llama.cpp's buffers landed), which
swamped what is measured here: what the engine does between decodes. Garbage is collected before each
timed loop. The printed ratios are tokens per second against the raw loop doing the same work, medians
over the rounds, and the extra microseconds localspec spends per step; then each loop's host time (its
time outside llama_decode and the wait for it, ``Context.decode_seconds``) against the raw loop's, and
the ratio the two host times give at the raw loop's decode time (the decodes themselves still differ
by a few percent from round to round on one context, which the first ratio carries and this one not). Issue #39's goals on the CPU
proxy (one thread): plain >= 0.95x raw, ngram-none >= 0.93x raw plain, self k=4 >= 0.90x raw.

Last, raw plain, plain and ngram-none once more with every decode left out (``warm_host``: the row is
rewritten to walk text with nothing to copy): what a step's host work costs with warm caches. On a CPU
each decode sweeps the weights through the caches and the host work after it runs cold, several times
slower (the engine's plain step: 75 us after a 9 MB sweep, 15 us warm, on a 2-core Xeon); while a GPU
decodes, the host's caches mostly stay warm.

    python benchmarks/bench_step_overhead.py MODEL.gguf [--tokens 512] [--rounds 9] [--threads 1]
                                             [--gpu-layers N] [--json OUT.json]

Without a model it writes benchmarks/gpu/make_models.py's tiny random target to a temporary folder
(its successor map walks a long cycle, so the n-gram lookup finds nothing to copy).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROMPT = ("The history of the lighthouse begins in the ancient world, where fires were lit on hills "
          "to guide ships home at night")
GOALS = {"plain": 0.95, "ngram-none": 0.93, "self k=4": 0.90}


def tiny_model(folder: Path) -> Path:
    """make_models.py's tiny random target (written once per folder)."""
    path = folder / "target-tiny.gguf"
    if not path.is_file():
        subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu" / "make_models.py"), str(folder), "--tiny",
                        "--only", "target"], check=True, stdout=subprocess.DEVNULL)
    return path


class RawLoops:
    """The anchor: greedy loops of raw llama.cpp calls on the llama.cpp contexts they are given (the
    engine's own: the same cache, placed where llama.cpp placed it for the engine)."""

    def __init__(self, n_vocab: int) -> None:
        import llama_cpp as L
        import numpy as np

        self.L, self.np = L, np
        self.n_vocab = n_vocab
        self.batch = L.llama_batch_init(512, 0, 1)
        self.decode_seconds = 0.0  # in llama_decode and the wait for it, as Context.decode_seconds counts
        self.no_device: NoDecode | None = None  # ``warm_host``: fill the batch, then this stands in for the decode

    def decode(self, ctx: Any, tokens: list[int], pos0: int, all_rows: bool) -> None:
        b = self.batch
        b.n_tokens = len(tokens)
        for i, tok in enumerate(tokens):
            b.token[i] = tok
            b.pos[i] = pos0 + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = 0
            b.logits[i] = all_rows or i == len(tokens) - 1
        if self.no_device is not None:
            assert self.no_device(ctx, self.L.llama_decode, b)[0] == 0
            return
        t0 = time.perf_counter()
        assert self.L.llama_decode(ctx, b) == 0
        self.L.llama_synchronize(ctx)
        self.decode_seconds += time.perf_counter() - t0

    def argmax(self, ctx: Any, row: int) -> int:
        return int(self.np.ctypeslib.as_array(self.L.llama_get_logits_ith(ctx, row), shape=(self.n_vocab,)).argmax())

    def clear(self, ctx: Any) -> None:
        self.L.llama_memory_clear(self.L.llama_get_memory(ctx), True)

    def plain(self, ctx: Any, prompt: list[int], n: int,
              choose: Callable[[Any], int] | None = None) -> tuple[int, int]:
        """(tokens, steps) of greedy plain decoding after ``prompt`` on ``ctx``; ``choose(ctx)``: the next
        token (default: the host's argmax of the row). The tokens are kept in ``last_tokens``."""
        choose = choose or self.host_choice
        self.clear(ctx)
        self.decode(ctx, prompt[:-1], 0, False)
        tok, pos = prompt[-1], len(prompt) - 1
        out = self.last_tokens = []
        for _ in range(n):
            self.decode(ctx, [tok], pos, False)
            tok = choose(ctx)
            out.append(tok)
            pos += 1
        return n, n

    def host_choice(self, ctx: Any) -> int:
        return self.argmax(ctx, 0)

    def plain_device_argmax(self, ctx: Any, prompt: list[int], n: int) -> tuple[int, int]:
        """``plain`` with llama.cpp's greedy backend sampler on sequence 0: the argmax is a node of the
        decode's graph (on the device, on a GPU), the logits are not copied to the host, and each token is
        read with ``llama_get_sampled_token_ith``. Not what localspec does: whether it would pay."""
        L = self.L
        chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
        L.llama_sampler_chain_add(chain, L.llama_sampler_init_greedy())
        if not L.llama_set_sampler(ctx, 0, chain):
            L.llama_sampler_free(chain)
            raise RuntimeError("llama.cpp did not take the greedy sampler onto the backend")
        try:
            return self.plain(ctx, prompt, n, lambda c: L.llama_get_sampled_token_ith(c, 0))
        finally:
            L.llama_set_sampler(ctx, 0, None)
            L.llama_sampler_free(chain)

    def self_draft(self, target: Any, draft: Any, prompt: list[int], n: int, k: int = 4) -> tuple[int, int]:
        """(tokens, steps) of greedy speculative decoding with the model drafting for itself (the target's
        context ``target``, the draft's ``draft``)."""
        mem_t, mem_d = self.L.llama_get_memory(target), self.L.llama_get_memory(draft)
        self.clear(target)
        self.clear(draft)
        history = list(prompt)
        self.decode(target, history[:-1], 0, False)
        synced = 0  # tokens of history the draft's cache holds
        out = steps = 0
        while out < n:
            last = len(history) - 1  # the unfed token's position
            self.decode(draft, history[synced:], synced, False)
            drafts = [self.argmax(draft, len(history) - synced - 1)]
            for i in range(1, k):
                self.decode(draft, [drafts[-1]], last + i, False)
                drafts.append(self.argmax(draft, 0))
            self.decode(target, [history[-1], *drafts], last, True)
            choices = [self.argmax(target, i) for i in range(k + 1)]
            kept = 0
            while kept < k and drafts[kept] == choices[kept]:
                kept += 1
            history += [*drafts[:kept], choices[kept]]
            self.L.llama_memory_seq_rm(mem_t, 0, len(history) - 1, -1)
            synced = min(last + k, len(history) - 1)
            self.L.llama_memory_seq_rm(mem_d, 0, synced, -1)
            out += kept + 1
            steps += 1
        return out, steps

    def close(self) -> None:
        self.L.llama_batch_free(self.batch)


class NoDecode:
    """Stands in for the decode in ``warm_host`` (``context.synchronized_decode``'s signature): a one-token
    decode does no device work; the row the last real one-token decode left in place is rewritten as a
    one-hot at the fed token's successor on a random cycle through the vocabulary. So a greedy reply walks
    text that never repeats (an n-gram lookup finds nothing to copy, as in ngram-none) with no decode at
    all. A batch of more tokens (a prefill), and the first one-token decode after it on a context, run for
    real: llama.cpp has a one-token row to rewrite only after one."""

    def __init__(self, n_vocab: int, real: Callable[[Any, Any, Any], tuple[int, float]]) -> None:
        import llama_cpp
        import numpy as np

        order = np.random.default_rng(0).permutation(n_vocab)
        successor = np.empty(n_vocab, dtype=np.int64)
        successor[order] = np.roll(order, -1)
        self._np, self._row_of = np, llama_cpp.llama_get_logits_ith
        self._successor = successor.tolist()
        self._n_vocab = n_vocab
        self._real = real
        self._ready: set[int] = set()  # the contexts whose last real decode was a one-token one
        self._rows: dict[int, tuple[Any, list[int]]] = {}  # by row address: its view, its hot token

    def __call__(self, ctx: Any, run: Any, batch: Any) -> tuple[int, float]:
        import ctypes

        key = ctypes.cast(ctx, ctypes.c_void_p).value or 0
        if batch.n_tokens != 1 or key not in self._ready:
            rc, seconds = self._real(ctx, run, batch)
            if batch.n_tokens == 1 and rc == 0:
                self._ready.add(key)
            else:
                self._ready.discard(key)
            return rc, seconds
        address = ctypes.cast(self._row_of(ctx, 0), ctypes.c_void_p).value or 0
        held = self._rows.get(address)
        if held is None:
            view = self._np.frombuffer((ctypes.c_float * self._n_vocab).from_address(address), dtype=self._np.float32)
            view[:] = 0.0
            held = self._rows[address] = (view, [0])
        view, hot = held
        view[hot[0]] = 0.0
        hot[0] = self._successor[batch.token[0]]
        view[hot[0]] = 1.0
        return 0, 0.0


def warm_host(raw: RawLoops, plain: Any, ngram: Any, prompt: list[int], n: int,
              rounds: int) -> dict[str, float] | None:
    """Microseconds a step costs on the host with no decode at all, the raw loop against the engine, plain
    and ngram-none: ``NoDecode`` stands in for each one-token decode, so the host's caches stay warm, as
    they mostly do while a GPU decodes, and the reply walks text with nothing to copy.

    On a CPU each decode sweeps the model's weights through the caches and the host work after it then
    runs on cold caches: with a 9 MB sweep in place of each decode the engine's plain step measured 75 us
    on the host against 15 warm. The loops above carry that; this says what the Python costs on its own.
    ngram-none is left out (None) when its lookup drafted anyway; None in all when a reply ended early."""
    from localspec.backend import context
    from localspec.engine import GenerateOptions

    real = context.synchronized_decode
    no_decode = NoDecode(plain.target.n_vocab, real)
    loops: dict[str, Callable[[], tuple[int, int]]] = {
        "raw plain": lambda: (raw.plain(plain.ctx.handle, prompt, n)[0], 0),
        "plain": lambda: _tokens_drafted(plain.generate(prompt, GenerateOptions(max_tokens=n,
                                                                                speculative=False)).run()),
        "ngram-none": lambda: _tokens_drafted(ngram.generate(prompt, GenerateOptions(max_tokens=n)).run()),
    }
    times: dict[str, list[float]] = {name: [] for name in loops}
    short = False
    drafted = 0
    try:
        context.synchronized_decode = no_decode
        raw.no_device = no_decode
        for _ in range(rounds):
            for name, loop in loops.items():
                gc.collect()
                t0 = time.perf_counter()
                tokens, drafts = loop()
                times[name].append(time.perf_counter() - t0)
                if name == "raw plain":
                    plain.invalidate()  # the raw loop decoded on the engine's context
                short = short or tokens < n
                drafted += drafts  # (only ngram-none can draft)
    finally:
        context.synchronized_decode = real
        raw.no_device = None
        plain.invalidate()
        ngram.invalidate()
    if short:
        return None
    out = {name: statistics.median(t) / n * 1e6 for name, t in times.items()}
    if drafted:
        del out["ngram-none"]
    return out


def _tokens_drafted(done: Any) -> tuple[int, int]:
    """A finished reply's tokens and drafted tokens."""
    return len(done.tokens), done.stats.drafted


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", type=Path, help="a GGUF (default: a tiny random target, written here)")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--gpu-layers", type=int, default=-1, help="layers to offload (-1: all, on a GPU build)")
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--json", type=Path, help="write the results here as JSON")
    args = ap.parse_args(argv)
    os.environ.setdefault("LOCALSPEC_NO_HISTORY", "1")

    from localspec.backend import Model
    from localspec.drafting.specs import DrafterSpec
    from localspec.engine import Engine, GenerateOptions

    path = args.model or tiny_model(Path(tempfile.gettempdir()) / "localspec-bench-tiny")
    n = args.tokens
    target = Model(path, n_gpu_layers=args.gpu_layers)
    draft = Model(path, n_gpu_layers=args.gpu_layers)
    common = dict(n_ctx=args.ctx, n_threads=args.threads, personal_history=False)
    plain = Engine(target, **common)
    ngram = Engine(target, specs=[DrafterSpec("ngram")], **common)
    selfd = Engine(target, draft=draft, **common)
    raw = RawLoops(target.n_vocab)
    prompt = plain.tokenize(PROMPT)

    def decode_seconds(engine: Engine) -> float:
        return sum(c.decode_seconds for c in (engine.ctx, engine.draft_ctx) if c is not None)

    def engine_loop(engine: Engine, opts: GenerateOptions) -> Callable[[], tuple[int, int, Any, float]]:
        def run() -> tuple[int, int, Any, float]:
            before = decode_seconds(engine)
            done = engine.generate(prompt, opts).run()
            return len(done.tokens), done.stats.steps, done.stats, decode_seconds(engine) - before
        return run

    def raw_loop(engine: Engine, loop: Callable[..., tuple[int, int]]) -> Callable[[], tuple[int, int, Any, float]]:
        """``loop`` on ``engine``'s own contexts, which then forget what the engine's mirror says they hold
        (its next generation decodes the prompt afresh, as the raw loop does)."""
        def run() -> tuple[int, int, Any, float]:
            handles = [engine.ctx.handle] + ([engine.draft_ctx.handle] if engine.draft_ctx is not None else [])
            before = raw.decode_seconds
            out = loop(*handles, prompt, n)
            engine.invalidate()
            return (*out, None, raw.decode_seconds - before)
        return run

    plain.invalidate()
    loops: dict[str, Callable[[], tuple[int, int, Any, float]]] = {
        "raw plain": raw_loop(plain, raw.plain),
        "plain": engine_loop(plain, GenerateOptions(max_tokens=n, speculative=False)),
        "raw device argmax": raw_loop(plain, raw.plain_device_argmax),
        "raw ngram's ctx": raw_loop(ngram, raw.plain),
        "ngram-none": engine_loop(ngram, GenerateOptions(max_tokens=n)),
        "raw self k=4": raw_loop(selfd, raw.self_draft),
        "self k=4": engine_loop(selfd, GenerateOptions(max_tokens=n, draft_len=4)),
    }
    for name in sorted(loops, key=lambda name: name.startswith("raw")):  # warm-up: buffers, the controller's
        loops[name]()                                    # cost measurement, caches (engines first: their contexts)
    seconds: dict[str, list[float]] = {name: [] for name in loops}
    cpu: dict[str, list[float]] = {name: [] for name in loops}
    decoding: dict[str, list[float]] = {name: [] for name in loops}  # of each run's seconds, in decodes
    tokens: dict[str, int] = {}
    steps: dict[str, int] = {}
    stats: dict[str, Any] = {}
    chosen: dict[str, list[int]] = {}  # the tokens of the raw loops that differ in where the argmax is taken
    for _ in range(args.rounds):
        for name, run in loops.items():
            gc.collect()  # each loop pays for its own garbage, not for what the loops before it left
            t0, c0 = time.perf_counter(), time.thread_time()
            tokens[name], steps[name], stats[name], in_decodes = run()
            seconds[name].append(time.perf_counter() - t0)
            cpu[name].append(time.thread_time() - c0)
            decoding[name].append(in_decodes)
            if name in ("raw plain", "raw device argmax"):
                chosen[name] = raw.last_tokens
    # Whether the argmax in the graph chose what the host's did (ties aside: ggml's keeps the last maximum).
    same_tokens = chosen["raw plain"] == chosen["raw device argmax"]
    warm = warm_host(raw, plain, ngram, prompt, n, args.rounds)
    raw.close()

    tps = {name: tokens[name] / statistics.median(s) for name, s in seconds.items()}
    # This thread's CPU time: blind to a GPU's work, but on a CPU (one thread) blind to other processes too.
    cpu_tps = {name: tokens[name] / statistics.median(s) for name, s in cpu.items()}
    # Host time: each run's time outside its decodes (llama_decode and the wait for the device), per token.
    # The decodes of two loops differ by a few percent from round to round even on one context; set
    # side by side at the raw loop's decode time, the host times say what the engine costs on its own.
    host = {name: statistics.median((t - d) / tokens[name] for t, d in zip(seconds[name], decoding[name]))
            for name in loops}
    in_decode = {name: statistics.median(d / tokens[name] for d in decoding[name]) for name in loops}
    anchor = {"plain": "raw plain", "ngram-none": "raw ngram's ctx", "self k=4": "raw self k=4"}
    rows = []
    for name, ref in anchor.items():
        # localspec's extra time per step: its time for the run, less the raw loop's for as many tokens
        per_token_raw = 1.0 / tps[ref]
        extra_us = (tokens[name] / tps[name] - tokens[name] * per_token_raw) / max(1, steps[name]) * 1e6
        s = stats[name]
        rows.append({"loop": name, "anchor": ref, "ratio": tps[name] / tps[ref], "goal": GOALS[name],
                     "cpu_ratio": cpu_tps[name] / cpu_tps[ref],
                     "host_us_per_step": host[name] * tokens[name] / max(1, steps[name]) * 1e6,
                     "raw_host_us_per_step": host[ref] * tokens[ref] / max(1, steps[ref]) * 1e6,
                     "host_ratio": (in_decode[ref] + host[ref]) / (in_decode[ref] + host[name]),
                     "extra_us_per_step": extra_us, "steps": steps[name], "tokens": tokens[name],
                     "drafted": s.drafted if s else 0, "accepted": s.accepted if s else 0,
                     "split_ms": {"draft": s.draft_ms, "verify": s.verify_ms, "python": s.python_ms} if s else None})
    print(f"{path.name}: {n} tokens, {args.rounds} rounds, {args.threads} thread(s), gpu layers {args.gpu_layers}")
    for name in loops:
        print(f"  {name:13} {tps[name]:9.1f} tok/s (median; {steps[name]} steps)")
    for row in rows:
        print(f"  {row['loop']:13} {row['ratio']:.3f}x {row['anchor']:13} ({row['extra_us_per_step']:+.0f} us a step; "
              f"goal >= {row['goal']:.2f}x; by this thread's CPU time {row['cpu_ratio']:.3f}x; "
              f"drafted {row['drafted']}, kept {row['accepted']})")
    device = {"ratio": tps["raw device argmax"] / tps["raw plain"], "same_tokens": same_tokens,
              "host_us_per_step": host["raw device argmax"] * 1e6, "raw_host_us_per_step": host["raw plain"] * 1e6}
    print(f"  raw device argmax {device['ratio']:.3f}x raw plain (llama.cpp's greedy sampler in the decode's graph, "
          f"no logits copied to the host; the same tokens: {'yes' if same_tokens else 'NO'}; host "
          f"{device['host_us_per_step']:.1f} us a step against {device['raw_host_us_per_step']:.1f})")
    for row in rows:
        print(f"  {row['loop']:13} host {row['host_us_per_step']:6.1f} us a step against {row['raw_host_us_per_step']:6.1f}"
              f" ({row['host_us_per_step'] - row['raw_host_us_per_step']:+.1f}); at the raw loop's decode time "
              f"{row['host_ratio']:.3f}x")
    if warm is None:
        print("  warm host: not measured (a reply with no decode ended early)")
    else:
        for name in ("plain", "ngram-none"):
            if name in warm:
                print(f"  {name:13} host {warm[name]:6.1f} us a step against {warm['raw plain']:6.1f} with no decode "
                      f"(warm caches, as while a GPU decodes; {warm[name] - warm['raw plain']:+.1f})")
    if args.json:
        args.json.write_text(json.dumps({"model": str(path), "tokens": n, "rounds": args.rounds,
                                         "threads": args.threads, "gpu_layers": args.gpu_layers,
                                         "tokens_per_s": tps, "seconds": seconds, "cpu_seconds": cpu,
                                         "decode_seconds": decoding,
                                         "rows": rows, "device_argmax": device, "warm_host_us_per_step": warm},
                                        indent=1))
    return 0  # (the engines share one target Model: the process's exit frees them)


if __name__ == "__main__":
    sys.exit(main())
