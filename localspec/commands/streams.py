"""The command's text streams: the prompt from stdin, text options that are not UTF-8, and stdout that
is closed or cannot be written."""

from __future__ import annotations

import argparse
import os
import sys

from localspec.errors import InvalidOptionError, LocalspecError

def read_prompt(args: argparse.Namespace) -> str:
    """``--prompt``, else all of stdin (bytes that are not UTF-8 replaced, with one warning)."""
    if args.prompt is not None:
        return args.prompt
    if sys.stdin is None or sys.stdin.isatty():
        raise InvalidOptionError("no prompt: pass --prompt TEXT or pipe the prompt on stdin")
    buffer = getattr(sys.stdin, "buffer", None)
    data = buffer.read() if buffer is not None else sys.stdin.read().encode("utf-8", "surrogateescape")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        warn_invalid_utf8("stdin")
        return data.decode("utf-8", "replace")


# --- user text that is not UTF-8 ------------------------------------------------------------------
TEXT_OPTIONS = {"prompt": "--prompt", "system": "--system", "stop": "--stop"}
"""The options that carry text for the model (not paths), by argparse dest."""


def warn_invalid_utf8(*inputs: str) -> None:
    """One line that names every input whose invalid UTF-8 bytes were replaced."""
    verb = "is" if len(inputs) == 1 else "are"
    print(f"localspec: warning: {' and '.join(inputs)} {verb} not valid UTF-8; the invalid bytes were replaced "
          "with U+FFFD (\ufffd)", file=sys.stderr)


def repair_text_options(args: argparse.Namespace) -> None:
    """Make the text options of ``args`` valid Unicode in place, with one warning naming those that were not.

    Called once at the CLI edge, so that nothing below it sees a string llama.cpp cannot take.
    """
    from localspec.history import valid_text

    bad: list[str] = []
    for dest, flag in TEXT_OPTIONS.items():
        value = getattr(args, dest, None)
        if isinstance(value, str):
            fixed, changed = valid_text(value)
        elif isinstance(value, list) and all(isinstance(v, str) for v in value):
            pairs = [valid_text(v) for v in value]
            fixed, changed = [v for v, _ in pairs], any(c for _, c in pairs)
        else:
            continue
        if changed:
            setattr(args, dest, fixed)
            bad.append(flag)
    if bad:
        warn_invalid_utf8(*bad)


# --- stdout ---------------------------------------------------------------------------------------
class OutputError(LocalspecError):
    """Standard output is closed or cannot be written (a full disk, a vanished terminal)."""

    exit_code = 1


def check_stdout() -> None:
    """Refuse to start a command whose output has nowhere to go (``>&-`` leaves ``sys.stdout`` None)."""
    if sys.stdout is None:
        raise OutputError("standard output is closed (>&-); redirect it instead, e.g. > out.txt or > /dev/null")


def write_out(text: str, *, flush: bool = False) -> None:
    """Write ``text`` to stdout; a failed write (e.g. ENOSPC on ``> /dev/full``) is one OutputError.

    A closed pipe (``| head``) stays a BrokenPipeError: the reader has what it wanted.
    """
    try:
        sys.stdout.write(text)
        if flush:
            sys.stdout.flush()
    except BrokenPipeError:
        raise
    except OSError as err:
        discard_stdout()
        reason = err.strerror or str(err)
        raise OutputError(f"cannot write the output to standard output: {reason}") from None


def discard_stdout() -> None:
    """Point file descriptor 1 at /dev/null, so that the exit's final flush of what is still
    buffered cannot fail a second time (with Python's "Exception ignored" noise)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (AttributeError, OSError, ValueError):
        pass
