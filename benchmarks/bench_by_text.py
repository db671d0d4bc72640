"""Drafting by text (issue 43): a draft of another tokenizer against plain decoding, on this machine.

For each direction (Gemma 3 270M target with SmolLM2-135M drafting, and the reverse): greedy replies to a
few prompts, plain and speculative with a fixed draft length (the controller is left out, so what is
measured is the mechanism), on one thread. Prints acceptance, tokens per step, the wall-time ratio
against plain in the same run, and whether the output was identical. Numbers only; no assertion on time.

With ``--llama-src DIR`` (a llama.cpp checkout new enough to translate tokens between an incompatible
draft and its target: PR #12635's universal assisted decoding, in ``common/speculative.cpp``) the same
pairs also run through that llama.cpp's ``llama-speculative-simple`` (greedy, the same fixed draft length,
no minimum draft probability, one thread), against its own plain decoding (``llama-bench``'s tg at one
thread): acceptance, tokens per step, its decode time against its plain, and whether its text is the one
that llama.cpp's own plain greedy decoding gives (``llama-simple``; llama.cpp's plain text is not always
ours, its build and version being others). The tools are built once (several minutes) with
benchmarks/llama_tools.py.

    .venv/bin/python benchmarks/bench_by_text.py [--draft-len 4] [--max-tokens 64] [--rounds 3]
        [--llama-src /path/to/llama.cpp]
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from localspec.backend import Context, Model
from localspec.drafting.by_text import TextDrafter
from localspec.sampling import Sampler, SamplingParams
from localspec.speculative import speculative_step

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llama_tools import ensure_tools  # noqa: E402

MODELS = Path.home() / ".cache" / "localspec" / "models"
GEMMA, SMOLLM2 = MODELS / "gemma-3-270m-q4_k_m.gguf", MODELS / "SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPTS = ["The capital of France is Paris. The capital of Germany is",
           "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
           "Once upon a time, in a small village by the sea,"]


def run(target: Model, draft: Model | None, prompt: list[int], max_tokens: int, draft_len: int):
    tctx = Context(target, n_ctx=512, n_threads=1)
    dctx = Context(draft, n_ctx=512, n_threads=1) if draft is not None else None
    drafter = TextDrafter(dctx, target) if dctx is not None else None
    sampler = Sampler(SamplingParams(temperature=0.0))
    try:
        tctx.append(prompt[:-1])
        history, steps, drafted, accepted = list(prompt), 0, 0, 0
        t0 = time.perf_counter()
        while len(history) - len(prompt) < max_tokens:
            step = speculative_step(tctx, history, drafter, sampler, draft_len if drafter else 0)
            steps, drafted, accepted = steps + 1, drafted + step.drafted, accepted + step.accepted
        return history[len(prompt):len(prompt) + max_tokens], time.perf_counter() - t0, steps, drafted, accepted
    finally:
        tctx.close()
        if dctx is not None:
            dctx.close()


def llama_plain_ms(tools: dict[str, Path], model: Path, max_tokens: int) -> float:
    """llama.cpp's own plain decoding on one thread: ``llama-bench``'s tg, in ms a token."""
    out = subprocess.run([str(tools["llama-bench"]), "-m", str(model), "-p", "0", "-n", str(max_tokens), "-t", "1",
                          "-r", "3", "-o", "csv"], capture_output=True, text=True, check=True).stdout
    rows = [line.split(",") for line in out.splitlines()]
    header = [c.strip('"') for c in rows[0]]
    speed = float(rows[-1][header.index("avg_ts")].strip('"'))
    return 1e3 / speed


def llama_plain_text(tools: dict[str, Path], model: Path, prompt: str, max_tokens: int) -> str:
    """llama.cpp's own greedy reply (``llama-simple``), the prompt included."""
    return subprocess.run([str(tools["llama-simple"]), "-m", str(model), "-n", str(max_tokens), prompt],
                          capture_output=True, text=True, check=True).stdout


def same_reply(a: str, b: str) -> bool:
    """Whether two printed replies (the prompt before them, a beginning of sequence maybe shown) agree as far
    as the shorter goes: one runner may print a few tokens more than the other."""
    a, b = (t.strip().removeprefix("<bos>").strip() for t in (a, b))
    return a.startswith(b) or b.startswith(a)


def llama_uad(tools: dict[str, Path], target: Path, draft: Path, prompt: str, max_tokens: int, draft_len: int
              ) -> tuple[str, float, int, int, int]:
    """One greedy reply by ``llama-speculative-simple`` with a draft of another vocabulary: (what it printed, decode
    seconds, tokens emitted, drafted, accepted); it says when it translates tokens."""
    done = subprocess.run([str(tools["llama-speculative-simple"]), "-m", str(target), "-md", str(draft),
                           "-p", prompt, "-n", str(max_tokens), "-t", "1", "-td", "1", "-c", "512", "-cd", "512",
                           "--draft-max", str(draft_len), "--draft-min", "0", "--draft-p-min", "0",
                           "--temp", "0", "--top-k", "1", "--sampling-seq", "k", "-s", "1"],
                          capture_output=True, text=True)
    log = done.stdout + done.stderr
    if done.returncode != 0 or "tokens will be translated" not in log:
        raise SystemExit(f"llama-speculative-simple did not draft by translation (exit {done.returncode}):\n"
                         f"{log[-1500:]}")
    def number(name: str) -> float:
        return float(re.search(rf"{name}\s*=\s*([\d.]+)", log).group(1))
    decoded = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds", log)
    return done.stdout, float(decoded.group(2)), int(decoded.group(1)), int(number("n_drafted")), int(number("n_accept"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draft-len", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3, help="rounds, plain and drafting alternating; medians")
    ap.add_argument("--llama-src", type=Path, help="a llama.cpp with universal assisted decoding (see above)")
    args = ap.parse_args()
    tools = None
    if args.llama_src is not None:
        tools = ensure_tools(args.llama_src.resolve(), 2, ["llama-speculative-simple", "llama-bench", "llama-simple"])
        if isinstance(tools, str):
            raise SystemExit(tools)
    gemma, smollm2 = Model(GEMMA), Model(SMOLLM2)
    rows = []
    for target, draft in ((gemma, smollm2), (smollm2, gemma)):
        ratios, uad_ratios = [], []
        steps = drafted = accepted = emitted = 0
        uad = [0, 0, 0, 0]  # emitted, steps' worth (tokens - accepted), drafted, accepted
        same = uad_same = True
        for _ in range(args.rounds):
            plain_s = spec_s = uad_s = 0.0
            uad_tokens = 0
            for text in PROMPTS:
                prompt = target.tokenize(text)
                want, s0, *_ = run(target, None, prompt, args.max_tokens, 0)
                got, s1, n, d, a = run(target, draft, prompt, args.max_tokens, args.draft_len)
                plain_s, spec_s = plain_s + s0, spec_s + s1
                steps, drafted, accepted, emitted = steps + n, drafted + d, accepted + a, emitted + len(got)
                same = same and got == want
                if tools is not None:
                    u_text, u_s, u_n, u_d, u_a = llama_uad(tools, target.path, draft.path, text, args.max_tokens,
                                                           args.draft_len)
                    uad_s, uad_tokens = uad_s + u_s, uad_tokens + u_n
                    uad = [uad[0] + u_n, uad[1] + (u_n - u_a), uad[2] + u_d, uad[3] + u_a]
                    uad_same = uad_same and same_reply(u_text, llama_plain_text(tools, target.path, text,
                                                                                 args.max_tokens))
            ratios.append(spec_s / plain_s)
            if tools is not None:
                uad_ratios.append(uad_s / (uad_tokens * llama_plain_ms(tools, target.path, args.max_tokens) / 1e3))
        rows.append((f"| localspec | {target.name} | {draft.name} | {accepted / max(drafted, 1):.2f} | "
                     f"{emitted / steps:.2f} | {statistics.median(ratios):.2f}× | {'yes' if same else 'NO'} |"))
        if tools is not None:
            rows.append((f"| llama.cpp UAD | {target.name} | {draft.name} | {uad[3] / max(uad[2], 1):.2f} | "
                         f"{uad[0] / max(uad[1], 1):.2f} | {statistics.median(uad_ratios):.2f}× | "
                         f"{'yes' if uad_same else 'NO'} |"))
    print("| runner | target | draft | acceptance | tokens/step | time ÷ its own plain (lower is faster) | "
          "identical to its own plain |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
