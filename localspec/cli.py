"""The ``localspec`` command line: parses, dispatches, renders errors once."""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import sys
from typing import NoReturn, Sequence

from localspec.commands.flags import flag_message
from localspec.commands.signals import Terminated
from localspec.commands.streams import check_stdout, repair_text_options
from localspec.errors import LocalspecError

# Subcommand modules, in the order `--help` lists them.
COMMANDS = ("run", "generate", "serve", "bench", "index", "pull", "models", "plan", "doctor")


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line like every other user error, not a usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"localspec: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="localspec",
        description="Exact speculative decoding for local GGUF models on llama.cpp.",
    )
    parser.add_argument("--version", action="version", version=version_line(),
                        help="print localspec's version (and llama-cpp-python's) and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"localspec.commands.{name}").register(sub)
    return parser


def version_line() -> str:
    """``localspec 0.1.0 (llama-cpp-python 0.3.16)``, read from the installed packages' metadata (no
    llama.cpp is loaded)."""
    from importlib import metadata

    from localspec import __version__

    try:
        llama = f" (llama-cpp-python {metadata.version('llama_cpp_python')})"
    except metadata.PackageNotFoundError:
        llama = " (llama-cpp-python not installed)"
    return f"localspec {__version__}{llama}"


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """``parser.parse_args``, but an unknown option is refused by the subcommand it was given to, so its
    line points to that command's --help (and names the option it most likely meant)."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        owner = sub.choices.get(args.command) if sub is not None and args.command else None
        owner = owner or parser
        known = [o for a in owner._actions for o in a.option_strings]
        unknown = next((e.split("=", 1)[0] for e in extra if e.startswith("-")), "")
        close = difflib.get_close_matches(unknown, known, n=1) if unknown else []
        hint = f"; did you mean {close[0]}?" if close else ""
        owner.error(f"unrecognized arguments: {' '.join(extra)}{hint}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    if sys.stderr is None:
        # Closed (2>&-): print(file=None) would write the statistics and warnings into stdout among the
        # text. What was meant for stderr is dropped instead.
        sys.stderr = open(os.devnull, "w")
    parser = build_parser()
    args = parse(parser, argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        check_stdout()
        repair_text_options(args)
        return int(args.func(args) or 0)
    except LocalspecError as err:
        print(f"localspec: error: {flag_message(err)}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("localspec: interrupted", file=sys.stderr)
        return 130
    except Terminated as stop:
        print(f"localspec: stopped by {stop}", file=sys.stderr)
        return stop.exit_code
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
