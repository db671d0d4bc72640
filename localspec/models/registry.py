"""The model registry: names and aliases resolved to typed records.

``ModelSpec`` is one validated entry of ``models.toml`` (``localspec.models.registry_file``
reads the files and builds the records). ``Registry.resolve`` maps what a user typed — a
name, an alias, a size the family does not have, or a path to a ``.gguf`` — to a
``Resolved``. Nothing here reads files or touches the network; ``localspec.models.hub``
puts model files on disk.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from localspec.errors import RegistryError, shown
from localspec.llama_facts import FEATURE_DRAFT_ARCHITECTURES
from localspec.models.pypi_models import PypiChunk

_PARAMS_RE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmbt])", re.IGNORECASE)
# A name of the form PREFIX-SIZE: "qwen3-0.5b", "llama3.2:1b", "gemma3-270m".
_SIZED_NAME_RE = re.compile(r"(?P<prefix>[a-z][a-z0-9.]*?)[-:](?P<size>\d+(?:\.\d+)?[kmbt])")
_UNIT = {"k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}

MTP_DRAFTER = "mtp"  # the target's own multi-token-prediction layers
NGRAM_DRAFTER = "ngram"  # n-gram lookup in the prompt and the output: needs no model


def parse_param_count(text: str) -> float | None:
    """``"14B"`` → 1.4e10, ``"270M"`` → 2.7e8; ``None`` for anything else ("8x7B")."""
    match = _PARAMS_RE.fullmatch(text.strip())
    if match is None:
        return None
    return float(match.group(1)) * _UNIT[match.group(2).lower()]


@dataclass(frozen=True)
class ModelSpec:
    """One registry entry, validated. See the header of models.toml for each field."""

    name: str
    family: str
    params: str
    context: int
    repo: str | None = None
    file: str | None = None
    revision: str = "main"
    sha256: str | None = None
    size: int | None = None
    pypi: tuple[PypiChunk, ...] = ()
    pypi_sha256: str | None = None
    path: Path | None = None
    drafts: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    # What the planner and the app need to know about the file before loading it:
    arch: str | None = None  # the GGUF's general.architecture ("qwen35", "gemma4-assistant"), when known
    mtp_layers: int = 0  # multi-token-prediction layers it carries (<arch>.nextn_predict_layers)
    hybrid: bool = False  # recurrent (or convolutional) layers beside attention: rollback needs state snapshots
    assistant: bool = False  # a draft that reads its target's cache (Gemma 4's assistant): never run alone
    drafter: str | None = None  # "mtp", "ngram" or one of ``drafts``; None: see ``recommended_drafter``
    # The file that defined the entry (the user file if it changed any key): named in errors.
    origin: Path | None = None

    @property
    def n_params(self) -> float | None:
        """The parameter count as a number, when ``params`` is a plain size."""
        return parse_param_count(self.params)

    @property
    def draft_only(self) -> bool:
        """A draft that reads its target (an assistant its cache, EAGLE-3 and DFlash its layers): it is
        never run as a model, has no drafts of its own, and is no size of its family."""
        return self.assistant or self.arch in FEATURE_DRAFT_ARCHITECTURES

    @property
    def recommended_drafter(self) -> str | None:
        """What drafts for this model when the user names nothing: ``drafter`` when the entry
        says, else ``"mtp"`` (its own MTP layers), else its first draft model, else ``"ngram"``.
        ``None`` for a draft that reads its target, which is itself a drafter."""
        if self.draft_only:
            return None
        if self.drafter is not None:
            return self.drafter
        if self.mtp_layers > 0:
            return MTP_DRAFTER
        return self.drafts[0] if self.drafts else NGRAM_DRAFTER

    @property
    def self_drafting(self) -> bool:
        """Whether the model drafts for itself (its MTP layers) by default, needing no second file."""
        return self.recommended_drafter == MTP_DRAFTER


@dataclass(frozen=True)
class Resolved:
    """What ``Registry.resolve`` made of a user's text.

    ``spec`` is the registry entry, or ``None`` when the text was a path. ``path`` is
    the local file when it is known without downloading: the path the user gave, or
    an entry's own ``path``; for hub and PyPI entries ask ``localspec.models.hub``.
    ``notice`` is a one-line remark for stderr when the text was not taken literally.
    """

    text: str
    spec: ModelSpec | None
    path: Path | None
    notice: str | None = None

    @property
    def name(self) -> str:
        """The entry's name, or the file name of a bare path."""
        if self.spec is not None:
            return self.spec.name
        assert self.path is not None
        return self.path.name


class Registry:
    """Validated model entries, in file order, with alias lookup and resolution."""

    def __init__(
        self,
        models: Mapping[str, ModelSpec],
        *,
        default: str | None = None,
        labels: Mapping[str, str] | None = None,
        files: tuple[Path, ...] = (),
    ) -> None:
        self._models = dict(models)
        self._labels = dict(labels or {})
        self._aliases = {alias: spec.name for spec in self._models.values() for alias in spec.aliases}
        self.default_name = default
        self.files = files

    def __iter__(self) -> Iterator[ModelSpec]:
        return iter(self._models.values())

    def __len__(self) -> int:
        return len(self._models)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self._lookup(name.lower()) is not None

    @property
    def default(self) -> ModelSpec | None:
        """The model used when none is named (``default`` in models.toml)."""
        return self._models.get(self.default_name) if self.default_name else None

    def get(self, name: str) -> ModelSpec:
        """The entry called ``name`` (or aliased so), case-insensitively; no fuzzy matching."""
        found = self._lookup(name.strip().lower())
        if found is None:
            raise RegistryError(self._unknown_message(name.strip()))
        return self._models[found]

    def family_label(self, family: str) -> str:
        """How messages name a family: its ``label``, else the family key itself."""
        return self._labels.get(family, family)

    def drafts_for(self, spec: ModelSpec) -> tuple[ModelSpec, ...]:
        """The recommended drafts of ``spec``, best first."""
        return tuple(self._models[name] for name in spec.drafts)

    def family_draft(self, spec: ModelSpec) -> str | None:
        """A draft of ``spec``'s own vocabulary family: its first recommended draft, else the smallest
        smaller model of its family (None: the family has none). What a draft of another family that
        drafts by text is told would likely do better."""
        if spec.drafts:
            return spec.drafts[0]
        smaller = [m for m in self if m.family == spec.family and m.name != spec.name and not m.draft_only
                   and (m.n_params or 0) < (spec.n_params or float("inf"))]
        return min(smaller, key=lambda m: m.n_params or 0).name if smaller else None

    def resolve(self, text: str) -> Resolved:
        """Map a name, an alias or a path to a ``Resolved``.

        In order: text that ends with ``.gguf`` or contains a path separator is a
        path; then a name or alias (case-insensitive); then an existing file; then
        a ``FAMILY-SIZE`` name below the family's smallest size, which becomes the
        smallest model with a notice. Anything else raises ``RegistryError`` naming
        the nearest entries.
        """
        raw = text.strip()
        if not raw:
            raise RegistryError("empty model name; `localspec models` lists the known ones")
        if _looks_like_path(raw):
            return Resolved(raw, None, Path(raw).expanduser())
        name = self._lookup(raw.lower())
        if name is not None:
            spec = self._models[name]
            return Resolved(raw, spec, spec.path)
        if os.path.isfile(Path(raw).expanduser()):  # False, not OSError, for a name too long to be a path
            return Resolved(raw, None, Path(raw).expanduser())
        sized = self._resolve_size(raw)
        if sized is not None:
            return sized
        raise RegistryError(self._unknown_message(raw))

    def _lookup(self, key: str) -> str | None:
        if key in self._models:
            return key
        return self._aliases.get(key)

    def _size_group(self, text: str) -> tuple[float, list[ModelSpec]] | None:
        """For ``PREFIX-SIZE`` text: the requested size and the models of that prefix, smallest first.

        PREFIX is a family ("qwen3", "llama3") or the part of entry names before
        their size ("llama3.2"), so "llama3.2-0.5b" looks among Llama 3.2 models.
        """
        match = _SIZED_NAME_RE.fullmatch(text.lower())
        if match is None:
            return None
        wanted = parse_param_count(match["size"])
        prefix = match["prefix"]
        group = [
            spec
            for spec in self._models.values()
            if spec.n_params is not None
            and not spec.draft_only  # a draft head cannot stand in for a model
            and prefix in (spec.family, _name_prefix(spec.name))
        ]
        if wanted is None or not group:
            return None
        return wanted, sorted(group, key=lambda spec: spec.n_params or 0.0)

    def _resolve_size(self, raw: str) -> Resolved | None:
        """The size rule: below the smallest size means the smallest; one exact size is that model.

        A request for a size smaller than any in the family can only mean "the
        small one" (typically a draft). Between or above known sizes the choice
        matters — memory, speed — so those are errors with suggestions instead.
        """
        found = self._size_group(raw)
        if found is None:
            return None
        wanted, group = found
        smallest = group[0]
        label = self.family_label(smallest.family)
        if wanted < (smallest.n_params or 0.0):
            notice = f"{raw} is not a {label} size; using {smallest.name}, the smallest {label}"
            return Resolved(raw, smallest, smallest.path, notice)
        exact = [spec for spec in group if _same_size(spec.n_params, wanted)]
        if len(exact) == 1:
            spec = exact[0]
            notice = f"{raw} is not a registry name; using {spec.name}, the {spec.params} {label}"
            return Resolved(raw, spec, spec.path, notice)
        return None

    def _suggestions(self, raw: str) -> list[str]:
        found = self._size_group(raw)
        if found is not None:
            # The neighbours in size say more than spelling: "qwen3-15b" → 14b and 32b.
            wanted, group = found
            below = [spec.name for spec in group if (spec.n_params or 0.0) < wanted]
            above = [spec.name for spec in group if (spec.n_params or 0.0) > wanted]
            return below[-1:] + above[:1]
        candidates = list(self._models) + list(self._aliases)
        names: list[str] = []
        for match in difflib.get_close_matches(raw.lower(), candidates, n=5, cutoff=0.6):
            name = self._aliases.get(match, match)
            if name not in names:
                names.append(name)
        return names[:3]

    def _unknown_message(self, raw: str) -> str:
        suggestions = self._suggestions(raw)
        if suggestions:
            return (
                f"unknown model {shown(raw)}; did you mean: {', '.join(suggestions)}? "
                "(`localspec models` lists them all)"
            )
        return (f"unknown model {shown(raw)}; `localspec models` lists the known ones, and a path to a .gguf "
                "file works too")


def _looks_like_path(text: str) -> bool:
    return text.lower().endswith(".gguf") or "/" in text or os.sep in text or text.startswith("~")


def _name_prefix(name: str) -> str:
    match = _SIZED_NAME_RE.fullmatch(name)
    return match["prefix"] if match else name


def _same_size(a: float | None, b: float) -> bool:
    return a is not None and abs(a - b) <= 1e-6 * max(a, b)
