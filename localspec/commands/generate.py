"""``localspec generate``: one prompt in, text out (streamed, or one JSON object)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from typing import TYPE_CHECKING

from localspec.commands.flags import (
    add_model_options,
    add_sampling_options,
    check_engine_options,
    generate_options,
    parse_ctx,
)
from localspec.commands.loading import load_engine
from localspec.commands.refs import check_registry_pair, resolve_draft_refs, resolve_ref
from localspec.commands.signals import Terminated, stop_on_signals
from localspec.commands.streams import read_prompt, write_out
from localspec.errors import InvalidOptionError
from localspec.events import DoneEvent, GenerationStats, PrefillEvent, TokenEvent, TokenLogprob


if TYPE_CHECKING:
    from localspec.engine import Engine, GenerateOptions
    from localspec.tools import Tool, ToolCallReader


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "generate",
        help="generate text for one prompt (non-interactive)",
        description="Generate a continuation of one prompt. The text streams to stdout and the "
                    "statistics go to stderr; --json prints one JSON object on stdout instead. Ctrl-C, "
                    "SIGTERM and SIGHUP stop it with what was generated so far and its statistics.",
    )
    add_model_options(p, model_required=False)
    p.add_argument("--prompt", "-p", default=None, metavar="TEXT", help="the prompt (default: read stdin)")
    p.add_argument("--chat", action="store_true",
                   help="wrap the prompt as one user turn in the model's own chat template")
    p.add_argument("--system", default=None, metavar="TEXT",
                   help="system prompt, before the prompt in the chat template (implies --chat)")
    p.add_argument("--json", action="store_true", help="print one JSON object with text, finish_reason, stats")
    p.add_argument("--quiet", "-q", action="store_true", help="no statistics on stderr")
    p.add_argument("--grammar", default=None, metavar="FILE",
                   help="constrain the output by the GBNF grammar in FILE (llama.cpp's grammar syntax)")
    p.add_argument("--json-schema", default=None, metavar="FILE",
                   help="constrain the output to JSON valid under the JSON Schema in FILE")
    p.add_argument("--tools", default=None, metavar="FILE",
                   help="offer the functions in FILE (a JSON list of OpenAI tool objects) through the model's chat "
                        "template (implies --chat); with --json the calls come back as tool_calls")
    p.add_argument("--tool-choice", default=None, metavar="CHOICE",
                   help="with --tools: auto (the default: the model chooses), required, or a function's name; "
                        "required and a name are enforced by a grammar")
    p.add_argument("--logprobs", type=int, default=None, metavar="N",
                   help="with --json: each token's log-probability under the target and its N most probable "
                        "alternatives (0..20), the same with speculation on or off")
    add_sampling_options(p)
    p.set_defaults(func=run)


def format_stats(stats: GenerationStats, finish_reason: str, pair: str | None = None) -> str:
    """Two human lines: speed and acceptance, then where the time went. ``pair``: how the draft model
    drafts, named beside its acceptance when it is not by shared token ids (``drafting.by_text``)."""
    line = (f"{stats.tokens} tokens in {stats.elapsed_s:.2f} s ({stats.tokens_per_second:.1f} tok/s), "
            f"{stats.steps} steps, finish: {finish_reason}")
    if stats.n_ctx:
        # The last token is emitted before it is decoded: prompt + tokens may be one past a full context.
        used = min(stats.prompt_tokens + stats.tokens, stats.n_ctx)
        line += (f"; the context of {stats.n_ctx} tokens is full" if finish_reason == "context"
                 else f"; context {used} of {stats.n_ctx} tokens used")
    if stats.drafted:
        line += "\n" + acceptance_line(stats) + (f"; draft model: {pair}" if pair else "")
    c = stats.control
    if c is not None:
        line += (f"\ncontroller: {c.draft_steps} drafting steps (mean draft_len {c.mean_draft_len:.1f}), {c.plain_steps} plain, "
                 f"{c.probes} probes; drafting steps expected {c.expected_gain:.2f}× plain, measured "
                 f"{c.measured_gain:.2f}×; last decision: {c.last_reason}")
    total = stats.draft_ms + stats.verify_ms + stats.python_ms
    if total > 0:
        line += (f"\ntime: prefill {stats.prefill_ms:.0f} ms; steps {total:.0f} ms = draft "
                 f"{100 * stats.draft_ms / total:.0f}% / verify {100 * stats.verify_ms / total:.0f}% / "
                 f"python {100 * stats.python_ms / total:.0f}%")
    return line


def acceptance_line(stats: GenerationStats) -> str:
    """How the drafts fared, one name per quantity (the JSON keys in parentheses):

    * kept: accepted / drafted tokens (``acceptance_rate``); it counts the tokens after a rejection
      too, which were never in play, so it reads lower than α;
    * α: the chance a draft token is accepted when every token before it was (``conditional_acceptance``),
      the α of τ = (1 − α^(γ+1)) / (1 − α) and of the ceiling 1 / (1 − α);
    * α by position: the same, position by position (``position_acceptance``).
    No infinity is shown: at α = 1 there is no ceiling.
    """
    alpha = stats.conditional_acceptance
    ceiling = f"ceiling 1/(1−α) = {1 / (1 - alpha):.2f}" if alpha < 1 else "no ceiling (α = 1)"
    return (f"drafts: {stats.accepted} of {stats.drafted} drafted tokens kept ({stats.acceptance_rate:.0%}); "
            f"α {alpha:.2f} (a token kept when every token before it was); τ {stats.tokens_per_step:.2f} "
            f"tokens/step ({ceiling}); α by position: " + " ".join(f"{a:.2f}" for a in stats.position_acceptance))


def result_json(done: DoneEvent, logprobs: list[TokenLogprob] | None = None,
                reader: "ToolCallReader | None" = None) -> dict:
    """The --json object; ``logprobs`` (with --logprobs): one entry per token, its id, log-probability and
    alternatives as ``[id, logprob]`` pairs (``-inf`` written as null); ``reader`` (with --tools): the
    reply read as ``content`` (null when it is only calls) and ``tool_calls`` in OpenAI's shape."""
    stats = done.stats.to_dict()
    out = {
        "text": done.text,
        "finish_reason": done.finish_reason,
        "tokens": len(done.tokens),
        "token_ids": list(done.tokens),
        "stats": stats,
    }
    if reader is not None:
        content, calls = reader.whole(done.text)
        out["content"] = content
        out["tool_calls"] = [c.as_openai() for c in calls]
    if logprobs is not None:
        out["logprobs"] = [{"token": lp.token, "logprob": _number(lp.logprob),
                            "top": [[t, _number(v)] for t, v in lp.top]} for lp in logprobs]
    return out


def _number(logprob: float) -> float | None:
    return None if logprob == float("-inf") else logprob


def context_notice(asked: str | None, used: int) -> str | None:
    """The line that says ``--ctx`` got a different context than it asked for (None: it did not)."""
    want = parse_ctx(asked)
    if want is None or want == used:
        return None
    return (f"--ctx {asked} runs with a context of {used} tokens: llama.cpp sizes its context in "
            f"multiples of 256 tokens")


def constrained(opts: "GenerateOptions", args: argparse.Namespace) -> "GenerateOptions":
    """``opts`` with the grammar or JSON schema the files of ``--grammar`` / ``--json-schema`` hold,
    checked before any model is touched (whether a grammar parses is the engine's check)."""
    import dataclasses

    grammar = _read_option_file(args.grammar, "--grammar") if args.grammar is not None else None
    schema = _read_option_file(args.json_schema, "--json-schema") if args.json_schema is not None else None
    if grammar is None and schema is None:
        return opts
    opts = dataclasses.replace(opts, grammar=grammar, json_schema=schema)
    opts.validate()  # both given, a schema that is not JSON or that the converter cannot express
    return opts


def read_tools(args: argparse.Namespace) -> "tuple[tuple[Tool, ...], str, str | None]":
    """``--tools FILE`` and ``--tool-choice`` as (tools, choice, name), checked as the server checks them,
    before any model is touched; ((), "none", None) without --tools."""
    from localspec.server.schema import RequestError, parse_tool_choice, parse_tools

    if args.tools is None:
        if args.tool_choice is not None:
            raise InvalidOptionError("--tool-choice needs --tools FILE (the functions to choose from)")
        return (), "none", None
    text = _read_option_file(args.tools, "--tools")
    try:
        tools = parse_tools(json.loads(text))
        if not tools:
            raise InvalidOptionError(f"--tools {args.tools} lists no tools; give at least one")
        choice = args.tool_choice or "auto"
        wanted = choice if choice in ("auto", "none", "required") else {"type": "function",
                                                                         "function": {"name": choice}}
        choice, name = parse_tool_choice(wanted, tools)
    except json.JSONDecodeError as err:
        raise InvalidOptionError(f"--tools {args.tools}: not JSON ({err}); give a JSON list of tools like "
                                 '[{"type": "function", "function": {"name": "get_weather"}}]') from None
    except RequestError as err:
        raise InvalidOptionError(f"--tools {args.tools}: {err}") from None
    if choice in ("required", "function") and (args.grammar is not None or args.json_schema is not None):
        raise InvalidOptionError("--tool-choice required or a name is enforced by a grammar of its own; "
                                 "leave out --grammar and --json-schema")
    return tools, choice, name


def tool_prompt(engine: "Engine", messages: list[dict], opts: "GenerateOptions", tools: "tuple[Tool, ...]",
                choice: str, name: str | None) -> "tuple[list[int], GenerateOptions, ToolCallReader | None]":
    """The prompt with ``tools`` rendered by the model's template, the options with the grammar a
    required or named choice needs, and the reader of the calls (None without tools, or with choice none)."""
    import dataclasses

    from localspec.tools import ToolCallReader, tool_format, tools_grammar

    if not tools or choice == "none":
        return engine.chat_tokens(messages), opts, None
    fmt = tool_format(engine.target.chat_template())
    if fmt is None:
        raise InvalidOptionError(f"--tools: {engine.target.name}'s chat template has no tool format, so the model "
                                 "cannot be offered tools; use a model whose template renders them (Qwen2.5, "
                                 "Qwen3, Llama 3.1 and later)")
    forced = tools if choice == "required" else tuple(t for t in tools if t.name == name) if name else ()
    if forced:
        opts = dataclasses.replace(opts, grammar=tools_grammar(fmt, forced, parallel=choice == "required"))
    tokens = engine.chat_tokens(messages, tools=[t.as_openai() for t in tools])
    return tokens, opts, ToolCallReader(fmt, [t.name for t in tools])


def _read_option_file(path: str, flag: str) -> str:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except (OSError, UnicodeDecodeError) as err:
        why = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise InvalidOptionError(f"{flag} {path}: cannot read it ({why}); give a readable text file") from None


def run(args: argparse.Namespace) -> int:
    stop_on_signals()
    check_engine_options(args)
    if args.logprobs is not None and not args.json:
        raise InvalidOptionError("--logprobs needs --json: the log-probabilities are written in its object")
    opts = constrained(generate_options(args), args)
    tools, choice, name = read_tools(args)
    # Every name and the prompt are checked before anything is downloaded.
    target_ref = resolve_ref(args.model)
    drafts = resolve_draft_refs(args.draft)
    check_registry_pair(target_ref, drafts.model)
    prompt = read_prompt(args)
    engine, _ = load_engine(args, target_ref, drafts)
    notice = context_notice(args.ctx, engine.n_ctx)
    if notice:
        print(f"localspec: {notice}", file=sys.stderr)
    # A system prompt is a chat turn: it implies --chat rather than being dropped; so do tools.
    reader = None
    if args.chat or args.system is not None or tools:
        messages = ([{"role": "system", "content": args.system}] if args.system else [])
        messages.append({"role": "user", "content": prompt})
        tokens, opts, reader = tool_prompt(engine, messages, opts, tools, choice, name)
    else:
        tokens = engine.tokenize(prompt)
    # Someone watching (stderr a terminal) sees the reply start at once, plain, while the costs are
    # measured, and is told so; a script gets the same reply after the measurement, as deterministic as
    # before. A fixed draft length (--draft-max) drafts from the first step, which needs the costs first.
    watched = sys.stderr is not None and sys.stderr.isatty()
    engine.measure_in_background = opts.draft_len is None and watched
    try:
        code = _generate(args, engine, tokens, opts, reader)
    except BaseException:
        # A background measurement still decoding must stop before the interpreter frees the model
        # under it (a SIGTERM'd reply exited with SIGSEGV otherwise).
        engine.close()
        raise
    if engine.measuring_in_background:
        # The reply is out; waiting for the measurement to stop held a one-shot command several seconds
        # past it. Abandon it instead: end the process here, before the interpreter could free the models
        # under the measuring thread. What it measured is not kept; a later run measures again (the app,
        # `bench` and a script's `generate` measure to the end).
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError, AttributeError):
                stream.flush()
        os._exit(code)
    engine.close()
    return code


def _generate(args: argparse.Namespace, engine: "Engine", tokens: list[int], opts: "GenerateOptions",
              reader: "ToolCallReader | None" = None) -> int:
    """Stream one reply of ``engine`` for ``tokens`` and print its result (with ``reader``: its tool calls
    too, in --json); the exit code."""
    gen = engine.generate(tokens, opts)
    if gen.measuring_costs and not args.quiet:
        print("localspec: measuring this machine's decode costs (once per model, build and thread count); "
              "decoding plain until they are known, then speculating", file=sys.stderr, flush=True)
    done: DoneEvent | None = None
    logprobs: list[TokenLogprob] = []
    code = 0
    stopped_by = ""  # the signal that stopped the reply, if one did
    try:
        progress = not args.quiet and sys.stderr is not None and sys.stderr.isatty()
        for event in gen:
            if isinstance(event, TokenEvent):
                if event.logprob is not None:
                    logprobs.append(event.logprob)
                if not args.json and event.text:
                    write_out(event.text, flush=True)
            elif isinstance(event, PrefillEvent) and progress:
                # one line, rewritten in place, gone once the prompt is read
                end = "\r\x1b[K" if event.done >= event.total else ""
                print(f"\rlocalspec: reading the prompt: {event.done}/{event.total} tokens", end=end,
                      file=sys.stderr, flush=True)
            elif isinstance(event, DoneEvent):
                done = event
    except KeyboardInterrupt:
        done = gen.interrupted()
        code = 130
    except Terminated as stop:
        done = gen.interrupted()
        code = stop.exit_code
        stopped_by = str(stop)
    assert done is not None
    # The result first: after SIGHUP the terminal (stderr) may be gone while stdout is a file.
    if args.json:
        result = result_json(done, logprobs if opts.logprobs is not None else None, reader)
        write_out(json.dumps(result, ensure_ascii=False) + "\n", flush=True)
    else:
        write_out("\n", flush=True)
    if stopped_by:
        with contextlib.suppress(OSError):
            print(f"localspec: stopped by {stopped_by}", file=sys.stderr, flush=True)
    for warning in gen.warnings:
        print(f"localspec: warning: {warning}", file=sys.stderr)
    if not args.quiet:
        from localspec.drafting.by_text import TEXT_PAIR

        pair = TEXT_PAIR if engine.draft_by_text else None
        print(format_stats(done.stats, done.finish_reason, pair), file=sys.stderr)
    return code
