"""What ``--draft`` names: a draft model, ``mtp``, ``ngram``, ``lookahead``, ``forced``, ``rest:STORE``, or a
comma list.

Parsing is pure; the engine turns specs into drafters.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from localspec.errors import InvalidOptionError

MODEL_FREE = ("ngram", "lookahead")
NO_DRAFTER = ("off", "none")
"""Words for "no drafter": alone they mean plain decoding; they cannot be one entry of a list."""
MTP = "mtp"
"""The target's own multi-token-prediction (NextN) layers: no second model, but not free either."""
FORCED = "forced"
"""The text a generation's grammar forces (``drafting.forced``): offers nothing without a grammar."""


@dataclass(frozen=True)
class DrafterSpec:
    """One drafter: ``kind`` is ``model``, ``mtp``, ``ngram``, ``lookahead``, ``forced`` or ``rest``; ``arg`` its
    model or store.

    A ``model`` is a draft model or Gemma 4's assistant GGUF; which one is read from the file's
    architecture when it loads (``engine.Engine.load``), not from the name.
    """

    kind: str
    arg: str | None = None

    @property
    def name(self) -> str:
        """The name stats and token provenance use."""
        if self.kind == "model":
            return "draft"
        if self.kind == "rest":
            return f"rest:{Path(self.arg or '').stem}"
        return self.kind


def parse_draft(text: str | None) -> list[DrafterSpec]:
    """``"ngram,rest:docs.lsstore,qwen3-0.6b"`` -> specs, in the order given."""
    if text is None or not text.strip():
        return []
    specs: list[DrafterSpec] = []
    parts = [p.strip() for p in text.split(",")]
    off = next((p for p in parts if p.lower() in NO_DRAFTER), None)
    if off is not None and len(parts) > 1:
        rest = ",".join(p for p in parts if p.lower() not in NO_DRAFTER) or "ngram"
        raise InvalidOptionError(f"--draft {text}: {off} means no drafter and cannot be combined with others; "
                                 f"give --draft {off} alone, or --draft {rest}")
    for part in parts:
        if not part:
            raise InvalidOptionError(f"--draft {text!r} has an empty entry; separate drafters with single commas")
        low = part.lower()
        if low in MODEL_FREE or low in (MTP, FORCED):
            specs.append(DrafterSpec(low))
        elif low.startswith("rest:"):
            store = part[5:]
            if not store:
                raise InvalidOptionError("--draft rest: needs a store path, e.g. rest:notes.lsstore "
                                         "(build one with `localspec index`)")
            specs.append(DrafterSpec("rest", store))
        elif low == "rest":
            raise InvalidOptionError("--draft rest needs a store: rest:STORE (build one with `localspec index`)")
        else:
            specs.append(DrafterSpec("model", part))
    models = [s for s in specs if s.kind == "model"]
    if len(models) > 1:
        raise InvalidOptionError(
            f"--draft names {len(models)} draft models ({', '.join(s.arg or '' for s in models)}); use at most one"
        )
    names = [s.name for s in specs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise InvalidOptionError(f"--draft names {', '.join(dupes)} twice; list each drafter once")
    return specs
