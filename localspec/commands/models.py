"""``localspec models``: the registry as one table (or JSON with ``--json``).

Columns: name, vocabulary family, parameter count, file size, the drafter used when
none is named ("mtp (self)" for a model that drafts with its own MTP layers), the
recommended draft models, what the file is beyond a plain transformer ("hybrid":
recurrent layers beside attention; "mtp": it carries MTP layers; "assistant": a
draft that only runs beside its target; "eagle3", "dflash": a draft that reads its target's
layers) and whether a copy is on disk. Looking for
copies touches no network.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from localspec.llama_facts import FEATURE_DRAFT_ARCHITECTURES
from localspec.models import hub
from localspec.models.hub_errors import human_size
from localspec.models.registry import ModelSpec, Registry
from localspec.models.registry_file import load_registry

_COLUMNS = ("NAME", "FAMILY", "PARAMS", "SIZE", "DRAFTER", "DRAFTS", "TRAITS", "ON DISK")


def register(subparsers: Any) -> None:
    """Add the ``models`` subcommand."""
    parser = subparsers.add_parser(
        "models",
        help="list the models localspec knows",
        description="List the registry: shipped models.toml plus your own "
        "(~/.config/localspec/models.toml, or $LOCALSPEC_CONFIG_DIR/models.toml). Every command takes a model "
        "as a name or alias listed here, or as a path to a GGUF file.",
    )
    parser.add_argument("--json", action="store_true", help="print a JSON array instead of a table")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    registry = load_registry()
    if args.json:
        json.dump([_record(registry, spec) for spec in registry], sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render_table(registry))
    return 0


def render_table(registry: Registry) -> str:
    """The registry as aligned text columns, one model per line, header first."""
    rows = [_COLUMNS]
    for spec in registry:
        on_disk = _on_disk(hub.local_copy(spec))
        drafter = spec.recommended_drafter or "-"
        drafter = f"{drafter} (self)" if spec.self_drafting else drafter
        rows.append(
            (spec.name, spec.family, spec.params, human_size(spec.size), drafter, ", ".join(spec.drafts) or "-",
             ", ".join(traits(spec)) or "-", on_disk)
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    return "\n".join(lines) + "\n"


def _on_disk(copy: hub.LocalCopy | None) -> str:
    """ON DISK: "yes" for a sound copy, "damaged" for one that is short or does not match (`localspec pull
    NAME` says why and fetches it again), "-" for none."""
    if copy is None:
        return "-"
    return "yes" if copy.usable else "damaged"


def traits(spec: ModelSpec) -> list[str]:
    """What the model's file is beyond a plain transformer, as short words for the table."""
    words = []
    if spec.hybrid:
        words.append("hybrid")
    if spec.mtp_layers:
        words.append("mtp")
    if spec.assistant:
        words.append("assistant")
    if spec.arch in FEATURE_DRAFT_ARCHITECTURES:
        words.append(spec.arch)  # a draft that reads its target's layers: EAGLE-3, or DFlash's block
    return words


def _record(registry: Registry, spec: ModelSpec) -> dict[str, Any]:
    copy = hub.local_copy(spec)
    local = copy.path if copy is not None and copy.usable else None
    return {
        "name": spec.name,
        "family": spec.family,
        "params": spec.params,
        "context": spec.context,
        "size": spec.size,
        "repo": spec.repo,
        "file": spec.file,
        "revision": spec.revision,
        "sha256": spec.sha256,
        "pypi": [{"requirement": c.requirement, "path": c.member} for c in spec.pypi],
        "arch": spec.arch,
        "drafts": list(spec.drafts),
        "drafter": spec.recommended_drafter,
        "self_drafting": spec.self_drafting,
        "mtp_layers": spec.mtp_layers,
        "hybrid": spec.hybrid,
        "assistant": spec.assistant,
        "aliases": list(spec.aliases),
        "on_disk": local is not None,  # a sound copy: its size (and sha256 where known) checked
        "path": str(local) if local is not None else None,
        "problem": copy.problem if copy is not None and copy.problem else None,
        "damaged_path": str(copy.path) if copy is not None and copy.problem else None,
        "default": spec.name == registry.default_name,
        "origin": str(spec.origin) if spec.origin else None,
    }
