"""Subcommands of the ``localspec`` CLI.

Each module here exposes ``register(subparsers) -> None``; the parser it adds
sets ``func=handler`` where ``handler(args) -> int`` returns the exit code.
Handlers raise ``LocalspecError`` for anything a user caused; ``localspec.cli``
renders it once. Handlers write results to stdout and diagnostics to stderr.
"""
