"""``localspec bench``'s measurement: plain vs each drafter configuration, alternating, in one process
(the table and chart are in ``localspec.bench.report``).

Every round runs each task once with every configuration, plain included,
back to back (the order rotates each round), so drift in the machine's speed
hits all alike; a configuration's speed is judged by its ratio to the plain
run of the same task and round. Before each run the engine forgets what its
drafters and controllers learned (``Engine.reset_learning``) and the personal
store of past outputs is not used, so no run profits from an earlier run of
the same prompt: each is measured as a first reply in a new session.

Next to the measured ratio stands the one the formula predicts from that
run's own measured acceptance and the machine's measured costs (see
``predicted_speedup``): where they part, the acceptance was not the
independent per-token coin the formula assumes, or the costs moved.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from localspec.policy.estimates import expected_tokens_per_step
from localspec.errors import InvalidOptionError

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib

KINDS = ("grounded", "structured", "free")


@dataclass(frozen=True)
class Task:
    """One prompt of the suite: a user turn (chat template applied when the model has one)."""

    name: str
    prompt: str
    kind: str = "free"
    temperature: float = 0.0
    max_tokens: int = 128


@dataclass(frozen=True)
class Config:
    """A way to decode: ``drafter`` names from the engine (None: plain), ``draft_len`` None = adaptive."""

    label: str
    drafter: str | None
    draft_len: int | None = None


PLAIN = Config("plain", None, 0)


def load_tasks(text: str, source: str) -> list[Task]:
    """Tasks from TOML text (``[[task]]`` tables); errors name ``source`` and what is wrong."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise InvalidOptionError(f"{source}: not valid TOML ({err}); fix the file") from None
    rows = data.get("task")
    if not isinstance(rows, list) or not rows:
        raise InvalidOptionError(f"{source}: no [[task]] tables; each task needs a name and a prompt")
    tasks: list[Task] = []
    for i, row in enumerate(rows, 1):
        where = f"{source}: task {i}"
        unknown = set(row) - {"name", "prompt", "kind", "temperature", "max_tokens"}
        if unknown:
            raise InvalidOptionError(f"{where}: unknown key {sorted(unknown)[0]!r}; "
                                     "use name, prompt, kind, temperature, max_tokens")
        if not isinstance(row.get("name"), str) or not isinstance(row.get("prompt"), str) or not row["prompt"]:
            raise InvalidOptionError(f"{where}: needs a string name and a non-empty string prompt")
        kind = row.get("kind", "free")
        if kind not in KINDS:
            raise InvalidOptionError(f"{where}: kind {kind!r} is not one of {', '.join(KINDS)}")
        temperature, max_tokens = row.get("temperature", 0.0), row.get("max_tokens", 128)
        if not isinstance(temperature, (int, float)) or not 0 <= temperature <= 5:
            raise InvalidOptionError(f"{where}: temperature must be a number in 0..5")
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise InvalidOptionError(f"{where}: max_tokens must be a positive integer")
        tasks.append(Task(row["name"], row["prompt"], kind, float(temperature), max_tokens))
    names = [t.name for t in tasks]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup is not None:
        raise InvalidOptionError(f"{source}: two tasks are named {dup!r}; names must differ")
    return tasks


def builtin_tasks() -> list[Task]:
    text = resources.files("localspec").joinpath("data/bench_tasks.toml").read_text(encoding="utf-8")
    return load_tasks(text, "the built-in prompt suite")


def parse_config(text: str) -> tuple[str, int | None]:
    """``DRAFT[@K]`` as (the --draft text, fixed length K or None for the adaptive controller)."""
    draft, sep, k = text.rpartition("@")
    if not sep or not k.isdigit():
        return text, None
    if not draft:
        raise InvalidOptionError(f"bench configuration {text!r} names no drafter; write DRAFT@K, e.g. ngram@5")
    return draft, int(k)


# --- numbers -------------------------------------------------------------------------------------
def predicted_speedup(*, steps: int, drafting_steps: int, drafted: int, verified: int, alpha: float,
                      draft_ms: float, verify_ms: Callable[[float], float], plain_ms: float,
                      overhead_ms: Callable[[float], float] = lambda k: 0.0) -> float:
    """The speedup over plain decoding that the formula gives for a run's measured behaviour.

    Drafting steps (mean length γ = drafted/drafting_steps, mean verification
    batch b = 1 + verified/drafting_steps) each emit (1 − α^(γ+1)) / (1 − α)
    tokens and cost the measured draft time per step + verify_ms(b) +
    overhead_ms(γ); the remaining steps are plain: one token for ``plain_ms``.
    Plain decoding emits one token per ``plain_ms``.
    """
    if steps <= 0 or plain_ms <= 0:
        return 1.0
    plain_steps = steps - drafting_steps
    tokens, ms = float(plain_steps), plain_steps * plain_ms
    if drafting_steps > 0:
        gamma = drafted / drafting_steps
        batch = 1.0 + verified / drafting_steps
        tokens += drafting_steps * expected_tokens_per_step(alpha, gamma)
        ms += draft_ms + drafting_steps * (verify_ms(batch) + overhead_ms(gamma))
    return tokens / ms * plain_ms


@dataclass(frozen=True)
class RunResult:
    """One generation of one task with one configuration, in one round."""

    task: str
    config: str
    round: int
    tokens: int
    tokens_per_second: float
    ratio: float                 # tokens/s over the plain run of the same task and round
    predicted: float             # the formula's speedup from this run's α and the cost model
    alpha: float                 # conditional acceptance (per position reached)
    tau: float                   # tokens per target pass
    drafted: int
    accepted: int
    steps: int
    draft_ms: float
    verify_ms: float
    python_ms: float
    same_as_plain: bool | None   # greedy tasks: output identical to plain's (None when sampled)
    control: dict[str, Any] | None = None


@dataclass(frozen=True)
class Summary:
    """min–median–max of a configuration's ratios (over rounds, or over every run)."""

    ratio_min: float
    ratio_median: float
    ratio_max: float
    tokens_per_second: float
    predicted: float
    alpha: float
    tau: float
    split: tuple[float, float, float]  # draft / verify / python shares of step time
    runs: int
    draft_ms_per_step: float = 0.0     # drafting time per step (all steps, plain ones count 0)
    accepted: int = 0                  # draft tokens accepted over these runs
    verdict: str = ""                  # against plain: FASTER, SLOWER, NOISE or FEW_RUNS (plain itself: "")


FASTER, SLOWER, NOISE, FEW_RUNS = "faster", "slower", "within noise", "one run"
"""How a configuration compares with plain, as ``Summary.verdict`` says it."""


def verdict(ratios: Sequence[float], accepted: int, plain_noise: float) -> str:
    """Whether ratios to plain show a real difference or only the timing noise.

    Within the noise when nothing drafted was accepted (the steps were plain steps; any difference is
    the machine's), when the ratios' min–max holds 1.0, or when the median ratio is nearer 1.0 than
    plain's own spread between rounds (``plain_noise``: (max − min) / median of plain's tokens/s).
    One run has no spread to judge by.
    """
    if len(ratios) < 2:
        return FEW_RUNS
    median = statistics.median(ratios)
    if accepted == 0 or min(ratios) <= 1.0 <= max(ratios) or abs(median - 1.0) <= plain_noise:
        return NOISE
    return FASTER if median > 1.0 else SLOWER


def plain_noise(plain_runs: Sequence[RunResult]) -> float:
    """How much plain decoding's own speed varied: the largest (max − min) / median of tokens/s over a
    task's rounds (0 with fewer than two rounds)."""
    by_task: dict[str, list[float]] = {}
    for r in plain_runs:
        by_task.setdefault(r.task, []).append(r.tokens_per_second)
    spreads = [(max(v) - min(v)) / statistics.median(v) for v in by_task.values()
               if len(v) > 1 and statistics.median(v) > 0]
    return max(spreads, default=0.0)


def summarise(runs: Sequence[RunResult], noise: float | None = None) -> Summary:
    """min–median–max over ``runs``; with ``noise`` (plain's spread, ``plain_noise``) also the verdict."""
    ratios = [r.ratio for r in runs]
    total = [r.draft_ms + r.verify_ms + r.python_ms for r in runs]
    t = sum(total)
    split = ((sum(r.draft_ms for r in runs) / t, sum(r.verify_ms for r in runs) / t,
              sum(r.python_ms for r in runs) / t) if t > 0 else (0.0, 0.0, 0.0))
    med = statistics.median
    return Summary(min(ratios), med(ratios), max(ratios), med(r.tokens_per_second for r in runs),
                   med(r.predicted for r in runs), med(r.alpha for r in runs), med(r.tau for r in runs),
                   split, len(runs), sum(r.draft_ms for r in runs) / max(1, sum(r.steps for r in runs)),
                   accepted=sum(r.accepted for r in runs),
                   verdict="" if noise is None else verdict(ratios, sum(r.accepted for r in runs), noise))


@dataclass
class BenchResult:
    model: str
    configs: list[Config]
    tasks: list[Task]
    rounds: int
    runs: list[RunResult] = field(default_factory=list)
    costs: dict[str, Any] = field(default_factory=dict)

    def by_task(self) -> dict[str, dict[str, Summary]]:
        out: dict[str, dict[str, Summary]] = {}
        for task in self.tasks:
            noise = plain_noise([r for r in self.runs if r.task == task.name and r.config == PLAIN.label])
            out[task.name] = {c.label: summarise([r for r in self.runs if r.task == task.name and r.config == c.label],
                                                 None if c.label == PLAIN.label else noise)
                              for c in self.configs if any(r.task == task.name and r.config == c.label
                                                           for r in self.runs)}
        return out

    def overall(self, kind: str | None = None) -> dict[str, Summary]:
        """Each configuration over every run (of tasks of ``kind``, or all)."""
        names = {t.name for t in self.tasks if kind is None or t.kind == kind}
        out: dict[str, Summary] = {}
        noise = plain_noise([r for r in self.runs if r.config == PLAIN.label and r.task in names])
        for c in self.configs:
            runs = [r for r in self.runs if r.config == c.label and r.task in names]
            if runs:
                out[c.label] = summarise(runs, None if c.label == PLAIN.label else noise)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "rounds": self.rounds,
            "configs": [asdict(c) for c in self.configs],
            "tasks": [asdict(t) for t in self.tasks],
            "costs": self.costs,
            "by_task": {t: {c: asdict(s) for c, s in row.items()} for t, row in self.by_task().items()},
            "overall": {c: asdict(s) for c, s in self.overall().items()},
            "overall_by_kind": {k: {c: asdict(s) for c, s in self.overall(k).items()}
                                for k in KINDS if any(t.kind == k for t in self.tasks)},
            "runs": [asdict(r) for r in self.runs],
        }


# --- running -------------------------------------------------------------------------------------
def run_bench(engine, tasks: Sequence[Task], configs: Sequence[Config], *, rounds: int = 3,
              chat: bool = True, max_tokens: int | None = None,
              progress: Callable[[str], None] | None = None) -> BenchResult:
    """Measure every configuration on every task, ``rounds`` times, alternating with plain.

    ``engine``: a ``localspec.engine.Engine`` holding every drafter the
    configurations name. ``max_tokens`` overrides each task's own.
    """
    from localspec.engine import GenerateOptions
    from localspec.events import DoneEvent
    from localspec.sampling import SamplingParams

    if rounds < 1:
        raise InvalidOptionError(f"rounds {rounds} is out of range: use at least 1", param="rounds")
    configs = [PLAIN, *[c for c in configs if c.label != PLAIN.label]]
    result = BenchResult(Path(engine.target.path).stem, configs, list(tasks), rounds)
    use_chat = chat and engine.target.chat_template() is not None

    def prompt_tokens(task: Task) -> list[int]:
        if use_chat:
            return engine.chat_tokens([{"role": "user", "content": task.prompt}])
        if chat:  # a base model (no template): a plain question-and-answer frame, so it answers
            return engine.tokenize(f"Question: {task.prompt}\n\nAnswer:\n")
        return engine.tokenize(task.prompt)

    def generate(tokens: list[int], task: Task, config: Config, seed: int) -> DoneEvent:
        engine.reset_learning()
        opts = GenerateOptions(max_tokens=max_tokens or task.max_tokens,
                               sampling=SamplingParams(temperature=task.temperature, seed=seed),
                               draft_len=config.draft_len, speculative=config.drafter is not None,
                               drafter=config.drafter)
        return engine.generate(tokens, opts).run()

    for task in tasks:
        tokens = prompt_tokens(task)
        if progress:
            progress(f"{task.name}: warming up")
        generate(tokens, task, PLAIN, seed=0)  # page cache, allocator, the prompt's first prefill
        for rnd in range(rounds):
            shift = rnd % len(configs)
            order = configs[shift:] + configs[:shift]
            done: dict[str, DoneEvent] = {}
            for config in order:
                if progress:
                    progress(f"{task.name}: round {rnd + 1}/{rounds}, {config.label}")
                done[config.label] = generate(tokens, task, config, seed=1000 * rnd + 17)
            plain = done[PLAIN.label]
            for config in configs:
                result.runs.append(_run_result(engine, task, config, rnd, done[config.label], plain))
    costs = engine.cost_model(measure=False)
    if costs is not None:
        result.costs = costs.to_dict()
    return result


def _run_result(engine, task: Task, config: Config, rnd: int, done, plain) -> RunResult:
    s = done.stats
    plain_tps = plain.stats.tokens_per_second
    ratio = s.tokens_per_second / plain_tps if plain_tps > 0 else math.nan
    predicted = 1.0
    costs = engine.cost_model(measure=False)
    drafting_steps = sum(d.steps for d in s.drafters)
    if config.drafter is not None and costs is not None:
        predicted = predicted_speedup(
            steps=s.steps, drafting_steps=drafting_steps, drafted=s.drafted, verified=s.verified,
            alpha=s.conditional_acceptance, draft_ms=s.draft_ms, verify_ms=costs.verify_ms,
            plain_ms=costs.plain_ms(), overhead_ms=costs.overhead_ms)
    return RunResult(
        task=task.name, config=config.label, round=rnd, tokens=s.tokens, tokens_per_second=s.tokens_per_second,
        ratio=ratio, predicted=predicted, alpha=s.conditional_acceptance, tau=s.tokens_per_step,
        drafted=s.drafted, accepted=s.accepted, steps=s.steps, draft_ms=s.draft_ms, verify_ms=s.verify_ms,
        python_ms=s.python_ms,
        same_as_plain=(done.tokens == plain.tokens) if task.temperature == 0 else None,
        control=asdict(s.control) if s.control is not None else None,
    )


def configs_from_args(drafts: Sequence[str], names: Mapping[str, str]) -> list[Config]:
    """Bench configurations from ``--draft`` values; ``names`` maps each --draft text to engine drafter names."""
    out: list[Config] = []
    for text in drafts:
        draft, k = parse_config(text)
        label = names[draft] + (f"@{k}" if k is not None else "")
        out.append(Config(label, names[draft], k))
    labels = [c.label for c in out]
    dup = next((x for x in labels if labels.count(x) > 1), None)
    if dup is not None:
        raise InvalidOptionError(f"--draft {dup} is given twice; each configuration once")
    return out
