"""``localspec bench``: is speculation worth it here? Plain vs drafter configurations, measured as ratios."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from localspec.commands.flags import add_model_options, check_engine_options
from localspec.commands.loading import guard_remote_devices, load_settings
from localspec.commands.refs import (
    check_registry_pair,
    fetch_models,
    pair_notice,
    reference,
    resolve_draft_refs,
    resolve_ref,
)
from localspec.errors import InvalidOptionError, OutputPathError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench",
        help="measure plain vs speculative decoding on a prompt suite",
        description="Run plain decoding and each --draft configuration on the same prompts in one process, "
                    "alternating, and report per task and overall: tokens/s and the ratio to plain "
                    "(min–median–max over rounds), the speedup the formula predicts from the measured "
                    "acceptance and costs, α, τ and where the step time went. Every run starts without "
                    "learned drafting state and without the personal store, like a first reply.",
        epilog="Example: localspec bench MODEL --draft ngram --draft DRAFT.gguf --draft DRAFT.gguf@5 "
               "--chart bench.svg",
    )
    add_model_options(p, model_required=False, draft_configs=True)
    p.add_argument("--tasks", default=None, metavar="NAMES",
                   help="comma-separated task names from the suite (default: all); see --list-tasks")
    p.add_argument("--tasks-file", type=Path, default=None, metavar="FILE",
                   help="your own prompts: a TOML file of [[task]] tables (name, prompt; optional kind, "
                        "temperature, max_tokens), instead of the built-in suite")
    p.add_argument("--prompt", action="append", default=[], metavar="TEXT",
                   help="a prompt of your own as one more task (repeatable)")
    p.add_argument("--list-tasks", action="store_true", help="list the built-in tasks and exit")
    p.add_argument("--rounds", type=int, default=3, metavar="N", help="alternating rounds per task (default 3)")
    p.add_argument("--max-tokens", type=int, default=None, metavar="N",
                   help="tokens per run for every task (default: each task's own, 128–192)")
    p.add_argument("--no-chat", action="store_true",
                   help="feed prompts as they are (default: one user turn in the chat template, or a "
                        "Question:/Answer: frame for a model without one)")
    p.add_argument("--json", action="store_true", help="print the full result as JSON on stdout")
    p.add_argument("--chart", default=None, metavar="FILE.svg",
                   help="also write a bar chart of the ratios (SVG, opens in any browser)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress on stderr")
    p.set_defaults(func=run)


def select_tasks(args: argparse.Namespace):
    from localspec.bench.runner import Task, builtin_tasks, load_tasks

    if args.tasks_file is not None:
        try:
            text = args.tasks_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise InvalidOptionError(f"cannot read --tasks-file {args.tasks_file}: {err}") from None
        tasks = load_tasks(text, str(args.tasks_file))
    else:
        tasks = builtin_tasks() if not args.prompt or args.tasks else []
    if args.tasks:
        wanted = [n.strip() for n in args.tasks.split(",") if n.strip()]
        known = {t.name: t for t in tasks}
        missing = [n for n in wanted if n not in known]
        if missing:
            raise InvalidOptionError(f"no task named {missing[0]!r}; tasks: {', '.join(known)}")
        tasks = [known[n] for n in wanted]
    for i, text in enumerate(args.prompt, 1):
        if not text.strip():
            raise InvalidOptionError("--prompt is empty; give the text of a prompt")
        tasks.append(Task(f"prompt-{i}", text))
    return tasks


def run(args: argparse.Namespace) -> int:
    from localspec.bench.runner import builtin_tasks, configs_from_args, run_bench
    from localspec.bench.report import format_table, write_chart

    if args.list_tasks:
        for t in builtin_tasks():
            print(f"{t.name:<14} {t.kind:<11} T={t.temperature:g}  max {t.max_tokens} tokens")
        return 0
    check_engine_options(args)
    if args.rounds < 1:
        raise InvalidOptionError(f"--rounds {args.rounds} is out of range: use at least 1")
    if args.max_tokens is not None and args.max_tokens < 1:
        raise InvalidOptionError(f"--max-tokens {args.max_tokens} is out of range: use at least 1")
    # The chart's file is checked before the run, so a run is never measured only to be lost.
    chart = chart_path(args.chart)
    tasks = select_tasks(args)
    if not args.draft:
        raise InvalidOptionError("nothing to compare: give at least one --draft configuration "
                                 "(e.g. --draft ngram)")

    from localspec.bench.runner import parse_config
    from localspec.drafting.specs import parse_draft

    # Every name is checked before anything is downloaded.
    target_ref = resolve_ref(args.model)
    draft_ref = None
    specs = {}
    names: dict[str, str] = {}
    for text in args.draft:
        draft, _ = parse_config(text)
        refs = resolve_draft_refs(draft)
        if refs.model is None and not refs.specs:
            raise InvalidOptionError(f"--draft {text}: bench measures plain decoding anyway; "
                                     "give the drafters to compare it with (e.g. --draft ngram)")
        if refs.model is not None:
            if draft_ref is not None and reference(refs.model) != reference(draft_ref):
                raise InvalidOptionError("bench compares one draft model at a time; "
                                         f"got {draft_ref.name} and {refs.model.name}")
            draft_ref = refs.model
            check_registry_pair(target_ref, draft_ref)
        for spec in refs.specs:
            specs[spec.name] = spec
        names[draft] = ",".join(s.name for s in parse_draft(draft))
    configs = configs_from_args(args.draft, names)
    target, draft_path = fetch_models(target_ref, draft_ref, offline=args.offline)
    settings = load_settings(args, target, draft_path)
    guard_remote_devices(args)
    if settings.message and not args.quiet:
        print(f"localspec bench: {settings.message}", file=sys.stderr)

    from localspec.engine import Engine

    engine = Engine.load(target, draft_path, specs=list(specs.values()), n_ctx=settings.n_ctx,
                         n_threads=args.threads, n_gpu_layers=settings.n_gpu_layers,
                         draft_n_gpu_layers=settings.draft_n_gpu_layers,
                         split=settings.split, draft_split=settings.draft_split, personal_history=False)
    if (notice := pair_notice(engine, target_ref, draft_ref)) and not args.quiet:
        print(f"localspec bench: {notice}", file=sys.stderr)
    progress = None if args.quiet else (lambda msg: print(f"localspec bench: {msg}", file=sys.stderr, flush=True))
    if progress:
        progress("measuring verification costs (cached per model, build and thread count)")
    engine.cost_model()
    result = run_bench(engine, tasks, configs, rounds=args.rounds, chat=not args.no_chat,
                       max_tokens=args.max_tokens, progress=progress)
    # The results first: if the chart cannot be written after all (the disk filled during the run),
    # what was measured is already on stdout when the error is raised.
    if args.json:
        json.dump(result.to_dict(), sys.stdout, ensure_ascii=False, indent=1)
        sys.stdout.write("\n")
    else:
        print(format_table(result))
    if chart is not None:
        sys.stdout.flush()
        try:
            write_chart(result, chart)
        except OSError as err:
            raise OutputPathError(f"--chart {args.chart}: the chart could not be written "
                                  f"({err.strerror or err}); the results above are complete") from None
        if not args.json:
            print(f"\nchart written to {args.chart}")
    return 0


CHART_HEAD_BYTES = 4096
"""How much of an existing ``--chart`` file is read to tell whether it is a chart of ours."""


def chart_path(given: str | Path | None) -> Path | None:
    """The file ``--chart`` writes (through a symlink), refused in one line when it cannot take one: a
    path that is no regular file (``paths.output_path``), a name that does not end in .svg (the chart is
    SVG; a .png holding SVG opens nowhere), or a file that exists and is not a chart of ours (a model, a
    store: replaced with no word before), unless it is empty."""
    from localspec.bench.report import is_our_chart
    from localspec.errors import shown
    from localspec.paths import output_path

    if given is None:
        return None
    if not str(given).strip():  # Path("") is ".", which would be refused as a folder
        raise InvalidOptionError("--chart is empty; name the file to write, e.g. --chart bench.svg")
    path = Path(given)
    name = f"--chart {shown(str(path), 120, quote='')}"
    real = output_path(path, name=name)
    if path.suffix.lower() != ".svg":
        raise InvalidOptionError(f"{name}: the chart is an SVG image; name the file FILE.svg "
                                 "(a browser opens it, and converters make a PNG of it)")
    if real.exists():  # a regular file by now: reading its head cannot block
        try:
            with open(real, "rb") as f:
                head = f.read(CHART_HEAD_BYTES)
        except OSError as err:
            raise OutputPathError(f"{name} cannot be read: {err.strerror or err}") from None
        if head and not is_our_chart(head):
            raise OutputPathError(f"{name} exists and is not a chart written by localspec bench; "
                                  "choose another name or delete it first")
    return real
