"""localspec ``--draft mtp`` (or an EAGLE-3 or DFlash draft) against llama.cpp's own ``draft-mtp``
(``draft-eagle3``, ``draft-dflash``): the same model files, machine and llama.cpp sources.

llama.cpp runs a model's MTP (NextN) layers as a drafter with
``llama-speculative-simple --spec-type draft-mtp`` (``common/speculative.cpp``,
``common_speculative_impl_draft_mtp``): its head drafts its top token up to
``--spec-draft-n-max`` times (default 3), and the target keeps each draft only
where its own sample matches it. localspec drafts from the head's distribution
and, at temperature > 0, accepts by exact rejection sampling.

Real MTP weights cannot be downloaded here, so the model is a random-weight
GLM-4.5-style ``glm4moe`` written by ``tests/support/mtp_model.py`` (its head built to
agree with its trunk often), made wide and deep enough that a decode is not all
overhead: 16 trunk layers of width 512 with an FFN of 8192, f32, about 1 GB,
where one head decode (a layer and the 49k-token output matrix) costs about a
tenth of the trunk's. It is written once into ~/.cache/localspec/bench-models/.
Acceptance on it says how the two rules compare on one synthetic head, nothing
about a trained head.

``--draft-kind eagle3``, ``dflash`` or ``dspark`` does the same for a draft that reads the
target's layers: the tiny random-weight llama target (width 64, 4 layers) and the
``eagle3``, ``dflash`` or ``dspark`` draft of ``tests/support/eagle3_model.py``, built to agree
with it often, against ``llama-speculative-simple -md DRAFT --spec-type
draft-eagle3`` (``draft-dflash``, ``draft-dspark``). At width 64 a decode is almost all fixed
overhead, so tokens/s there compares the two runners' per-step overheads and
the acceptance the two rules reach with the same q; nothing about trained drafts.
A DFlash block of 4 drafts at most 3 tokens.

Measured, each round running every system once per prompt in rotating order
(medians over rounds):

* greedy: tokens/s of plain decoding (localspec vs ``llama-completion``) and
  with MTP (localspec adaptive and at a fixed draft length, llama.cpp's
  ``draft-mtp`` at a few ``--spec-draft-n-max``), acceptance rate, tokens per
  step, and whether the output is the plain output;
* at ``--temperature`` (0.7 by default, a fixed seed per round, top-k 40, no
  other filter, in both): the same, localspec's rejection sampling against
  llama.cpp's match rule, at each draft length.

Times: localspec's is the wall time of the generation after the prompt's
prefill, Python included; ``llama-speculative-simple`` prints the wall time of
its decode loop; ``llama-completion`` the sum of its eval and sampler times.
One decode thread by default: on a machine whose cores are busy, a second
thread spinning at llama.cpp's barrier slows every system many times over.
llama.cpp's tools run with flash attention at their default (auto: on here)
unless ``--llama-fa`` names other settings (``auto,off`` runs both); localspec
keeps it off on the CPU.

    python benchmarks/bench_mtp_vs_llamacpp.py [--draft-kind mtp|eagle3|dflash|dspark] [--rounds 4] \\
        [--max-tokens 128] [--threads 1] [--draft-n-max 1,3,5] [--llama-fa auto] [--temperature 0.7] \\
        [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "support"))
import bench_vs_llamacpp as base  # noqa: E402  (the tool build and run records)
import prompts  # noqa: E402

TOOLS = ("llama-completion", "llama-speculative-simple")
DRAFT_N_MAX = (1, 3, 5)  # 3 is llama.cpp's default
KINDS = ("mtp", "eagle3", "dflash", "dspark")
LLAMA_DEFAULT_N_MAX = 3
PROMPTS = ("code-rename", "extract-actions")
TOP_K = 40

# The synthetic model: (width, trunk layers, FFN width), a head that agrees with its trunk (mix).
MODEL_DIMS = (512, 16, 8192)
MODEL_MIX = 0.05


def bench_model_path(dims: tuple[int, int, int] = MODEL_DIMS) -> Path:
    """The synthetic glm4moe MTP model with ``dims``, written on first use (about 1 GB at the default)."""
    import mtp_model

    n_embd, n_trunk, n_ff = dims
    path = (Path.home() / ".cache" / "localspec" / "bench-models"
            / f"glm4moe-mtp-{n_embd}x{n_trunk}-ff{n_ff}-mix{MODEL_MIX}.gguf")
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    print(f"writing the synthetic MTP model {path.name} (once)", file=sys.stderr)
    trunk_ff = mtp_model.N_FF  # the writer's trunk FFN width is a module constant
    mtp_model.N_FF = n_ff
    try:
        return mtp_model.write_mtp_model(path, n_embd=n_embd, n_trunk=n_trunk, mix=MODEL_MIX)
    finally:
        mtp_model.N_FF = trunk_ff


def feature_draft_paths(kind: str) -> tuple[Path, Path]:
    """The tiny llama target and its ``kind`` ("eagle3", "dflash" or "dspark") draft, written on first use."""
    import eagle3_model

    folder = Path.home() / ".cache" / "localspec" / "bench-models"
    folder.mkdir(parents=True, exist_ok=True)
    target, draft = folder / "llama-tiny-mix0.3.gguf", folder / f"{kind}-tiny-agree.gguf"
    if not target.is_file():
        eagle3_model.write_llama_target(target, mix=0.3)
    if not draft.is_file():
        if kind == "eagle3":
            eagle3_model.write_eagle3_draft(draft, agree=True)
        else:  # a DSpark draft: the DFlash one with a Markov head, trained anchor first
            eagle3_model.write_dflash_draft(draft, agree=True, markov_rank=8 if kind == "dspark" else 0)
    return target, draft


# --- llama.cpp -------------------------------------------------------------------------------------
def llama_sampling_args(temperature: float, seed: int) -> list[str]:
    """llama.cpp's sampler set to localspec's: temperature and top-k only (its top-p and min-p off)."""
    if temperature == 0:
        return ["--temp", "0"]
    return ["--temp", str(temperature), "--top-k", str(TOP_K), "--top-p", "1.0", "--min-p", "0.0",
            "--seed", str(seed)]


def run_speculative_simple(tool: Path, model: Path, draft: Path | None, kind: str, prompt_file: Path, n: int,
                           threads: int, n_max: int, temperature: float, seed: int,
                           flash_attn: str) -> tuple[int, float, str, dict]:
    """``llama-speculative-simple --spec-type draft-KIND`` (``-md draft`` for a draft file): (tokens,
    decode seconds, stdout, draft stats).

    It counts a step as one verification: accepted drafts plus the target's own token, so the
    steps are the tokens less the accepted drafts.
    """
    proc = subprocess.run(
        [str(tool), "-m", str(model), "-f", str(prompt_file), "-n", str(n), "-t", str(threads), "-c", "4096",
         "-fa", flash_attn, *(["-md", str(draft)] if draft is not None else []), "--spec-type", f"draft-{kind}",
         "--spec-draft-n-max", str(n_max), *llama_sampling_args(temperature, seed)],
        # A sampled token may be part of a character: its bytes are not valid UTF-8 on their own.
        capture_output=True, text=True, errors="replace", stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise RuntimeError(f"llama-speculative-simple failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    out = proc.stdout + proc.stderr
    tokens = int(base._number(r"decoded\s+(\d+) tokens in", out))
    seconds = base._number(r"decoded\s+\d+ tokens in\s+([\d.]+) seconds", out)
    drafted = int(base._number(r"n_drafted\s*=\s*(\d+)", out))
    accepted = int(base._number(r"n_accept\s*=\s*(\d+)", out))
    return tokens, seconds, proc.stdout, {"drafted": drafted, "accepted": accepted, "steps": tokens - accepted}


def run_completion(tool: Path, model: Path, prompt_file: Path, n: int, threads: int,
                   flash_attn: str) -> tuple[int, float, str, dict]:
    """Plain greedy ``llama-completion`` (``bench_vs_llamacpp.run_completion``) with ``-fa flash_attn``."""
    return base.run_completion(tool, model, prompt_file, n, threads, ["-fa", flash_attn])


# --- localspec -------------------------------------------------------------------------------------
def run_localspec(engine, text: str, n: int, *, kind: str | None, draft_len: int | None, temperature: float,
                  seed: int) -> tuple[int, float, str, dict]:
    """One reply; ``kind`` None: plain decoding, else speculation with the engine's one drafter."""
    from localspec.engine import GenerateOptions
    from localspec.sampling import SamplingParams

    engine.reset_learning()
    sampling = (SamplingParams() if temperature == 0
                else SamplingParams(temperature=temperature, top_k=TOP_K, seed=seed))
    tokens = engine.target.tokenize(text, add_special=True, parse_special=True)
    opts = GenerateOptions(max_tokens=n, sampling=sampling, speculative=kind is not None,
                           drafter="mtp" if kind == "mtp" else None, draft_len=draft_len)
    done = engine.generate(tokens, opts).run()
    s = done.stats
    return s.tokens, s.elapsed_s, done.text, {"drafted": s.drafted, "accepted": s.accepted, "steps": s.steps}


# --- the rounds ------------------------------------------------------------------------------------
def _fa(mode: str) -> str:
    """A llama.cpp system's name suffix for its flash-attention mode (none for its default, auto)."""
    return "" if mode == "auto" else f" fa-{mode}"


def greedy_systems(kind: str, n_maxes: list[int], fa_modes: list[str]) -> list[str]:
    return ["localspec plain", *[f"llama-completion{_fa(m)}" for m in fa_modes], f"localspec {kind}",
            *sampled_systems(kind, n_maxes, fa_modes)]


def sampled_systems(kind: str, n_maxes: list[int], fa_modes: list[str]) -> list[str]:
    return [*[f"localspec {kind} γ{k}" for k in n_maxes],
            *[f"draft-{kind}@{k}{_fa(m)}" for m in fa_modes for k in n_maxes]]


def run_system(system: str, engines: dict, tools: dict[str, Path], model: Path, draft: Path | None, text: str,
               prompt_file: Path, args, temperature: float, seed: int) -> tuple[int, float, str, dict]:
    if system == "localspec plain":
        return run_localspec(engines["plain"], text, args.max_tokens, kind=None, draft_len=None,
                             temperature=temperature, seed=seed)
    if system.startswith("localspec "):
        draft_len = int(system.split("γ")[1]) if "γ" in system else None
        return run_localspec(engines["spec"], text, args.max_tokens, kind=args.draft_kind, draft_len=draft_len,
                             temperature=temperature, seed=seed)
    flash_attn = system.split(" fa-")[1] if " fa-" in system else "auto"
    if system.startswith("llama-completion"):
        return run_completion(tools["llama-completion"], model, prompt_file, args.max_tokens, args.threads,
                              flash_attn)
    n_max = int(system.split("@")[1].split()[0])
    return run_speculative_simple(tools["llama-speculative-simple"], model, draft, args.draft_kind, prompt_file,
                                  args.max_tokens, args.threads, n_max, temperature, seed, flash_attn)


def bench(model: Path, draft: Path | None, tools: dict[str, Path], args) -> list[base.Run]:
    from localspec.drafting.specs import parse_draft
    from localspec.engine import Engine

    # Plain decoding from a target loaded without its head (or draft), as a user without --draft has it;
    # both map the same file, so the weights are in memory once.
    spec_args = {"specs": parse_draft("mtp")} if draft is None else {"draft": draft}
    engines = {"plain": Engine.load(model, n_ctx=4096, n_threads=args.threads, personal_history=False),
               "spec": Engine.load(model, **spec_args, n_ctx=4096, n_threads=args.threads, personal_history=False)}
    for engine in engines.values():
        engine.cost_model()  # measured (or loaded) once, before anything is timed
    kind = args.draft_kind
    phases = [(0.0, greedy_systems(kind, args.draft_n_max, args.llama_fa))]
    if args.temperature > 0:
        phases.append((args.temperature, sampled_systems(kind, args.draft_n_max, args.llama_fa)))
    runs: list[base.Run] = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for name in args.prompts:
                text = prompts.prompt_text(engines["plain"], prompts.PROMPTS[name])
                prompt_file = Path(tmp) / f"{name}.txt"
                # llama.cpp's -f drops one trailing newline from the file; the extra one keeps the prompt whole.
                prompt_file.write_text(text + "\n", encoding="utf-8")
                run_localspec(engines["spec"], text, 8, kind=kind, draft_len=None, temperature=0, seed=0)  # warm up
                for temperature, systems in phases:
                    for rnd in range(args.rounds):
                        shift = rnd % len(systems)
                        seed = args.seed + rnd
                        for system in systems[shift:] + systems[:shift]:
                            print(f"{name} · T={temperature} · round {rnd + 1}/{args.rounds} · {system}",
                                  file=sys.stderr)
                            n, sec, out, extra = run_system(system, engines, tools, model, draft, text,
                                                            prompt_file, args, temperature, seed)
                            extra["temperature"] = temperature
                            runs.append(base.Run(kind, name, system, rnd, n, sec, out, extra))
                        if args.json:  # after each round, so a run cut short keeps what it measured
                            write_json(args.json, runs)
    finally:
        for engine in engines.values():
            engine.close()
    return runs


def write_json(path: Path, runs: list[base.Run]) -> None:
    path.write_text(json.dumps([{**asdict(r), "tokens_per_second": r.tokens_per_second} for r in runs], indent=1))


# --- reporting -------------------------------------------------------------------------------------
def _pick(runs: list[base.Run], temperature: float, system: str, prompt: str | None = None) -> list[base.Run]:
    return [r for r in runs if r.extra["temperature"] == temperature and r.system == system
            and (prompt is None or r.prompt == prompt)]


def _same_as_plain(runs: list[base.Run], run: base.Run) -> bool:
    """Greedy output is localspec's plain output (llama.cpp's tools print the prompt or more tokens around it)."""
    plain = [r.text for r in runs if r.system == "localspec plain" and r.prompt == run.prompt
             and r.extra["temperature"] == 0]
    return bool(plain) and plain[0] in run.text


def _ratio(runs: list[base.Run], temperature: float, a: str, b: str) -> float:
    """Median over (prompt, round) of a's tokens/s over b's, measured in the same round."""
    out = []
    for ra in _pick(runs, temperature, a):
        rb = [r for r in _pick(runs, temperature, b, ra.prompt) if r.round == ra.round]
        if rb and rb[0].tokens_per_second > 0:
            out.append(ra.tokens_per_second / rb[0].tokens_per_second)
    return base._median(out)


def _row(runs: list[base.Run], temperature: float, system: str, kind: str) -> list[str]:
    """tok/s, [× own plain, output = plain when greedy,] acceptance (accepted/drafted), tokens per step."""
    mine = _pick(runs, temperature, system)
    drafted = sum(r.extra.get("drafted", 0) for r in mine)
    accepted = sum(r.extra.get("accepted", 0) for r in mine)
    steps = sum(r.extra.get("steps", 0) for r in mine)
    cells = [system, f"{base._median(r.tokens_per_second for r in mine):.1f}"]
    if temperature == 0:
        own_plain = (f"llama-completion{system[system.index(' fa-'):] if ' fa-' in system else ''}"
                     if system.startswith("draft-") else "localspec plain")
        cells.append(f"{_ratio(runs, 0.0, system, own_plain):.2f}×" if system.startswith(("draft", f"localspec {kind}"))
                     else "—")
        cells.append("(reference)" if system == "localspec plain"
                     else f"{sum(_same_as_plain(runs, r) for r in mine)}/{len(mine)}")
    cells.append(f"{accepted / drafted:.0%} ({accepted}/{drafted})" if drafted else "—")
    cells.append(f"{sum(r.tokens for r in mine) / steps:.2f}" if steps else "—")
    return cells


def report(runs: list[base.Run], args) -> str:
    """Per temperature, a row per system (medians over prompts and rounds; acceptance pooled), then ratios."""
    lines = []
    kind = args.draft_kind
    for temperature, systems in ((0.0, greedy_systems(kind, args.draft_n_max, args.llama_fa)),
                                 (args.temperature, sampled_systems(kind, args.draft_n_max, args.llama_fa))):
        if not any(r.extra["temperature"] == temperature for r in runs):
            continue
        if temperature == 0:
            lines += ["## greedy", "",
                      "| system | tok/s | × own plain | output = plain | acceptance | tokens/step |",
                      "|---|---|---|---|---|---|"]
        else:
            lines += [f"## temperature {temperature}, top-k {TOP_K}", "",
                      "| system | tok/s | acceptance | tokens/step |", "|---|---|---|---|"]
        lines += ["| " + " | ".join(_row(runs, temperature, s, kind)) + " |" for s in systems
                  if _pick(runs, temperature, s)]
        lines.append("")
        if temperature == 0:
            for m in args.llama_fa:
                line = (f"plain: localspec {_ratio(runs, 0.0, 'localspec plain', f'llama-completion{_fa(m)}'):.2f}× "
                        f"llama-completion{_fa(m)}")
                if LLAMA_DEFAULT_N_MAX in args.draft_n_max:
                    default = f"draft-{kind}@{LLAMA_DEFAULT_N_MAX}{_fa(m)}"
                    line += (f"; adaptive {kind}: localspec {_ratio(runs, 0.0, f'localspec {kind}', default):.2f}× "
                             f"{default}")
                lines.append(line)
        lines += ["same draft length, tok/s: " + ", ".join(
            f"localspec γ{k} {_ratio(runs, temperature, f'localspec {kind} γ{k}', f'draft-{kind}@{k}{_fa(m)}'):.2f}× "
            f"draft-{kind}@{k}{_fa(m)}" for m in args.llama_fa for k in args.draft_n_max), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--llama-src", type=Path, default=Path(os.environ.get("LOCALSPEC_LLAMA_SRC", base.DEFAULT_SRC)),
                   help="llama.cpp sources (the sdist's vendor/llama.cpp)")
    p.add_argument("--draft-kind", choices=KINDS, default="mtp",
                   help="mtp: the synthetic MTP model drafts for itself; eagle3, dflash, dspark: a tiny target and "
                        "its synthetic draft of that kind (see the module notes)")
    p.add_argument("--prompts", default=",".join(PROMPTS), help="comma list of: " + ", ".join(prompts.PROMPTS))
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=1, help="decode threads (default 1; see the module notes)")
    p.add_argument("--draft-n-max", default=",".join(map(str, DRAFT_N_MAX)),
                   help="draft lengths: llama.cpp's --spec-draft-n-max and localspec's fixed draft length")
    p.add_argument("--llama-fa", default="auto",
                   help="llama.cpp's flash attention (-fa) settings to run, comma list of auto, on, off "
                        "(auto, its default, is on for these models; localspec keeps it off on the CPU)")
    p.add_argument("--temperature", type=float, default=0.7, help="the sampled comparison's temperature (0: skip it)")
    p.add_argument("--seed", type=int, default=42, help="the first round's seed; each round adds one")
    p.add_argument("--dims", default=",".join(map(str, MODEL_DIMS)),
                   help="the synthetic model's width, trunk layers and FFN width")
    p.add_argument("--jobs", type=int, default=2, help="parallel compile jobs when building the tools")
    p.add_argument("--json", type=Path, default=None, help="write every run as JSON here")
    args = p.parse_args(argv)
    args.prompts = [x for x in args.prompts.split(",") if x]
    args.draft_n_max = [int(x) for x in args.draft_n_max.split(",") if x]
    args.llama_fa = [x for x in args.llama_fa.split(",") if x]
    if not args.llama_fa or any(m not in ("auto", "on", "off") for m in args.llama_fa):
        print("bench_mtp_vs_llamacpp: --llama-fa is a comma list of auto, on, off", file=sys.stderr)
        return 2
    unknown = [x for x in args.prompts if x not in prompts.PROMPTS]
    if unknown:
        print(f"bench_mtp_vs_llamacpp: unknown prompt {unknown[0]!r}; choose from {', '.join(prompts.PROMPTS)}",
              file=sys.stderr)
        return 2
    dims = tuple(int(x) for x in args.dims.split(","))
    if len(dims) != 3 or dims[0] % 16:
        print("bench_mtp_vs_llamacpp: --dims is WIDTH,LAYERS,FFN with WIDTH a multiple of 16", file=sys.stderr)
        return 2

    tools = base.ensure_tools(args.llama_src, args.jobs, TOOLS)
    if isinstance(tools, str):
        print(f"bench_mtp_vs_llamacpp: skipped: {tools}")
        return 0
    most = {"dflash": 3, "dspark": 4}.get(args.draft_kind)  # the synthetic block of 4: DSpark drafts from its anchor
    if most is not None and max(args.draft_n_max) > most:
        print(f"bench_mtp_vs_llamacpp: the synthetic {args.draft_kind} block drafts at most {most} tokens; pass "
              f"--draft-n-max 1,{most}", file=sys.stderr)
        return 2
    if args.draft_kind == "mtp":
        model, draft = bench_model_path(dims), None  # type: ignore[arg-type]
    else:
        model, draft = feature_draft_paths(args.draft_kind)
    t0 = time.time()
    runs = bench(model, draft, tools, args)
    kind = args.draft_kind
    print(f"# localspec --draft {kind} vs llama.cpp draft-{kind} · {(draft or model).name} · {args.rounds} rounds, alternating · "
          f"{args.max_tokens} tokens · prompts {', '.join(args.prompts)} · {args.threads} thread(s) · "
          f"{time.time() - t0:.0f} s\n")
    print(report(runs, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
