"""The ``localspec`` command line: parses, dispatches, renders errors once."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import NoReturn, Sequence

from localspec.commands.common import Terminated, check_stdout, flag_message, repair_text_options
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
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"localspec.commands.{name}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    if sys.stderr is None:
        # Closed (2>&-): print(file=None) would write the statistics and warnings into stdout among the
        # text. What was meant for stderr is dropped instead.
        sys.stderr = open(os.devnull, "w")
    parser = build_parser()
    args = parser.parse_args(argv)
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
