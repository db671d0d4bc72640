"""Reading ``models.toml``: the shipped file merged with the user's, validated into a ``Registry``.

The header of the shipped ``models.toml`` documents the format. Every problem is one
``RegistryError`` line that names the file and, where it can be found, the line:
malformed TOML, unknown keys (with the nearest known one), bad values, missing
sources, drafts that are not in the registry or belong to another family, drafting
facts that contradict each other (``drafter = "mtp"`` without MTP layers, an assistant
with drafts of its own or as the default model), and a directory where a file should be.
"""

from __future__ import annotations

import difflib
import errno
import os
import re
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 needs the backport
    import tomli as tomllib

from localspec.errors import RegistryError
from localspec.models.pypi_models import PypiChunk
from localspec.models.registry import MTP_DRAFTER, NGRAM_DRAFTER, ModelSpec, Registry

FORMAT_VERSION = 1
REGISTRY_FILENAME = "models.toml"

_TOP_KEYS = ("version", "default", "families", "models")
_FAMILY_KEYS = ("label",)
_STR_KEYS = ("family", "params", "repo", "file", "revision", "sha256", "pypi_sha256", "path", "drafter", "arch")
_INT_KEYS = ("context", "size", "mtp_layers")
_BOOL_KEYS = ("hybrid", "assistant")
_LIST_KEYS = ("drafts", "aliases")
_STR_OR_LIST_KEYS = ("pypi", "pypi_path")
_MODEL_KEYS = _STR_KEYS + _INT_KEYS + _BOOL_KEYS + _LIST_KEYS + _STR_OR_LIST_KEYS
_REQUIRED_KEYS = ("family", "params", "context")
# Keys that describe one particular file: when a user file moves an entry to another
# file, the shipped checksum and size no longer apply.
_HUB_IDENTITY = ("repo", "file", "revision")
_PYPI_IDENTITY = ("pypi", "pypi_path")

_NAME_RE = re.compile(r"[a-z0-9][a-z0-9._:-]*")
_FAMILY_RE = re.compile(r"[a-z0-9][a-z0-9._-]*")
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
_REPO_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
_TOML_POSITION_RE = re.compile(r"\s*\(at line (\d+), column (\d+)\)$")


# --------------------------------------------------------------------------- locations


def shipped_registry_path() -> Path:
    """The models.toml that ships with localspec.

    An installed wheel carries it as package data, ``localspec/data/models.toml``;
    a source checkout has it at the top of the repository, next to ``localspec/``.
    """
    package = Path(__file__).resolve().parent.parent  # localspec/
    candidates = (package / "data" / REGISTRY_FILENAME, package.parent / REGISTRY_FILENAME)
    for candidate in candidates:
        if candidate.is_file():
            # In a checkout data/models.toml links to the top-level file: name the one to edit.
            return candidate.resolve()
    raise RegistryError(
        f"the shipped {REGISTRY_FILENAME} is missing (looked at {candidates[0]} and {candidates[1]}); "
        "reinstall localspec"
    )


def user_config_dir() -> Path:
    """``$LOCALSPEC_CONFIG_DIR``, else ``$XDG_CONFIG_HOME/localspec``, else ``~/.config/localspec``."""
    override = os.environ.get("LOCALSPEC_CONFIG_DIR")
    if override:
        return Path(override).expanduser()
    xdg = os.environ.get("XDG_CONFIG_HOME")
    # The XDG spec says a relative value is invalid and must be ignored.
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".config"
    return base / "localspec"


def user_registry_path() -> Path:
    """Where a user's own models.toml lives (it need not exist)."""
    return user_config_dir() / REGISTRY_FILENAME


def load_registry(user_file: Path | None = None, *, shipped_file: Path | None = None) -> Registry:
    """Load the shipped registry merged with the user's file, validated as a whole.

    ``user_file`` defaults to ``user_registry_path()``, where a missing file is
    simply no additions (a file passed explicitly must exist). A user entry with a
    shipped name overrides it key by key, lists included (see the header of
    models.toml); other entries are added. Raises
    ``RegistryError`` naming the file, and the line where it can be found, for
    malformed TOML and for schema errors.
    """
    shipped = shipped_file or shipped_registry_path()
    sources = [_read(shipped)]
    if user_file is not None:
        # A file named explicitly must exist; the default location is optional.
        sources.append(_read(user_file))
    elif os.path.lexists(user_registry_path()):
        # Anything there is read, so a directory, a dangling symlink or a symlink loop in its place
        # fails instead of being skipped.
        sources.append(_read(user_registry_path()))
    return _build(sources)


# --------------------------------------------------------------------------- parsing


@dataclass
class _Source:
    """One parsed file, its text kept so errors can point at lines."""

    path: Path
    text: str
    data: dict[str, Any]


@dataclass
class _Entry:
    """An entry while files are merged: each key remembers the file it came from."""

    name: str
    values: dict[str, Any] = field(default_factory=dict)
    origins: dict[str, _Source] = field(default_factory=dict)
    owner: _Source | None = None  # the last file that touched the entry


def _read(path: Path) -> _Source:
    if path.is_symlink() and not path.exists():
        try:
            os.stat(path)
            problem = "a symlink that cannot be followed"
        except OSError as err:
            problem = ("a symlink loop" if err.errno == errno.ELOOP
                       else f"a symlink to {os.readlink(path)}, which does not exist")
        raise RegistryError(
            f"{path} is {problem}, not a {REGISTRY_FILENAME} file; point it at your file or remove it "
            f"(`localspec models --help` says where it is read from)")
    if path.is_dir():
        raise RegistryError(
            f"{path} is a directory, not a {REGISTRY_FILENAME} file; move it out of the way and write "
            f"your entries into a file at that path (`localspec models --help` says where it is read from)"
        )
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as err:
        raise RegistryError(f"cannot read {path}: {err.strerror or err}") from None
    except UnicodeDecodeError as err:
        raise RegistryError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        message = str(err)
        position = _TOML_POSITION_RE.search(message)
        if position is not None:
            line, column = position.groups()
            raise RegistryError(
                f"{path}:{line}:{column}: malformed TOML: {message[: position.start()]}"
            ) from None
        raise RegistryError(f"{path}: malformed TOML: {message}") from None
    return _Source(path, text, data)


def _table(name: str) -> str:
    """How the entry's table header is written in TOML (quoted when the name has a dot)."""
    return f'[models."{name}"]' if "." in name else f"[models.{name}]"


def _line_of(source: _Source, name: str | None, key: str | None) -> int | None:
    """The 1-based line of ``[models.NAME]``, of ``key`` inside that table, or of a top-level ``key``."""
    lines = source.text.splitlines()
    start, stop = 0, len(lines)
    if name is not None:
        quoted = re.escape(name)
        # "[.]" also finds an unquoted dotted name: [models.qwen2.5-7b] when looking for "qwen2".
        header = re.compile(rf"""\s*\[\s*models\s*\.\s*(?:"{quoted}"|'{quoted}'|{quoted})\s*[\].]""")
        found = next((number for number, line in enumerate(lines) if header.match(line)), None)
        if found is None:
            return None
        if key is None:
            return found + 1
        start = found + 1
        stop = next((n for n in range(start, len(lines)) if lines[n].lstrip().startswith("[")), len(lines))
    if key is None:
        return None
    escaped = re.escape(key)
    key_line = re.compile(rf"""\s*(?:\[\s*)?(?:{escaped}|"{escaped}")\s*[=.\]]""")
    for number in range(start, stop):
        if key_line.match(lines[number]):
            return number + 1
    # The key was not written in that table (a required key is missing): point at the header.
    return start if name is not None else None


def _fail(source: _Source, problem: str, *, name: str | None = None, key: str | None = None) -> RegistryError:
    line = _line_of(source, name, key) if (name or key) else None
    where = f"{source.path}:{line}" if line else str(source.path)
    subject = f" {_table(name)}" if name else ""
    return RegistryError(f"{where}:{subject} {problem}")


def _did_you_mean(word: str, options: tuple[str, ...]) -> str:
    close = difflib.get_close_matches(word, options, n=1)
    return f" (did you mean '{close[0]}'?)" if close else f"; known keys: {', '.join(options)}"


def _check_top(source: _Source) -> None:
    data = source.data
    for key in data:
        if key not in _TOP_KEYS:
            raise _fail(source, f"unknown top-level key '{key}'{_did_you_mean(key, _TOP_KEYS)}", key=key)
    version = data.get("version", FORMAT_VERSION)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise _fail(source, f"'version' must be a positive integer, not {version!r}", key="version")
    if version > FORMAT_VERSION:
        raise _fail(
            source,
            f"format version {version} is newer than this localspec understands ({FORMAT_VERSION}); "
            "upgrade localspec",
            key="version",
        )
    if "default" in data and not isinstance(data["default"], str):
        raise _fail(source, "'default' must be a model name (a string)", key="default")
    families = data.get("families", {})
    if not isinstance(families, dict):
        raise _fail(source, "'families' must be a table of [families.NAME] tables", key="families")
    for family, table in families.items():
        if not isinstance(table, dict):
            raise _fail(source, f"families.{family} must be a table", key="families")
        for key, value in table.items():
            if key not in _FAMILY_KEYS:
                raise _fail(source, f"families.{family}: unknown key '{key}'; known keys: label", key=key)
            if not isinstance(value, str):
                raise _fail(source, f"families.{family}.label must be a string", key=key)
    if not isinstance(data.get("models", {}), dict):
        raise _fail(source, "'models' must be a table of [models.NAME] tables", key="models")


def _check_entry(source: _Source, name: str, table: Any) -> dict[str, Any]:
    """Check one ``[models.NAME]`` table on its own: key names, types and formats."""
    if not isinstance(table, dict):
        raise _fail(source, f"models.{name} must be a table", key=name)
    if not _NAME_RE.fullmatch(name):
        raise _fail(
            source, "a model name is lowercase letters, digits and . _ : - (starting with a letter or digit)",
            name=name,
        )
    values: dict[str, Any] = {}
    for key, value in table.items():
        if isinstance(value, dict):
            # [models.qwen2.5-7b] parses as models → "qwen2" → {"5-7b": ...}.
            dotted = f"{name}.{key}"
            raise _fail(
                source,
                f"has a sub-table '{key}'; a name with a dot must be quoted: [models.\"{dotted}\"]",
                name=name,
            )
        if key not in _MODEL_KEYS:
            raise _fail(source, f"unknown key '{key}'{_did_you_mean(key, _MODEL_KEYS)}", name=name, key=key)
        values[key] = _check_value(source, name, key, value)
    return values


def _check_value(source: _Source, name: str, key: str, value: Any) -> Any:
    def bad(expected: str) -> RegistryError:
        return _fail(source, f"'{key}' must be {expected}, not {value!r}", name=name, key=key)

    if key in _STR_KEYS:
        if not isinstance(value, str) or not value.strip():
            raise bad("a non-empty string")
        value = value.strip()
        if key in ("sha256", "pypi_sha256"):
            value = value.lower()
            if not _SHA256_RE.fullmatch(value):
                raise bad("64 hexadecimal digits")
        elif key == "family" and not _FAMILY_RE.fullmatch(value):
            raise bad("a lowercase word such as qwen3")
        elif key == "arch" and not _FAMILY_RE.fullmatch(value):
            raise bad("a GGUF architecture name such as qwen35 (its general.architecture)")
        elif key == "repo" and not _REPO_RE.fullmatch(value):
            raise bad('a Hugging Face repository "owner/name"')
        elif key == "file" and not value.lower().endswith(".gguf"):
            raise bad("the name of a .gguf file")
        elif key == "drafter":
            value = value.lower()
        return value
    if key in _INT_KEYS:
        if not isinstance(value, int) or isinstance(value, bool) or value < (1 if key == "context" else 0):
            raise bad("a positive integer" if key == "context" else "a non-negative integer")
        return value
    if key in _BOOL_KEYS:
        if not isinstance(value, bool):
            raise bad("true or false")
        return value
    if key in _LIST_KEYS:
        if not isinstance(value, list) or not all(isinstance(item, str) and item.strip() for item in value):
            raise bad("a list of names")
        items = [item.strip().lower() for item in value]
        for item in items:
            if key == "aliases" and (not _NAME_RE.fullmatch(item) or item.endswith(".gguf")):
                raise _fail(
                    source, f"alias {item!r} is not a valid name (lowercase letters, digits and . _ : -)",
                    name=name, key=key,
                )
        return items
    # pypi / pypi_path: one string or a list of them.
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(item, str) and item.strip() for item in items):
        raise bad("a string or a list of strings")
    items = [item.strip() for item in items]
    if key == "pypi":
        for item in items:
            if "==" not in item:
                raise _fail(
                    source, f"'pypi' requirement {item!r} must pin a version (package==version)",
                    name=name, key=key,
                )
    return items


def _merge(sources: list[_Source]) -> tuple[dict[str, _Entry], dict[str, str], tuple[str, _Source] | None]:
    entries: dict[str, _Entry] = {}
    labels: dict[str, str] = {}
    default: tuple[str, _Source] | None = None
    for source in sources:
        _check_top(source)
        for family, table in source.data.get("families", {}).items():
            if "label" in table:
                labels[family] = table["label"]
        if "default" in source.data:
            default = (source.data["default"].strip().lower(), source)
        for name, table in source.data.get("models", {}).items():
            values = _check_entry(source, name, table)
            entry = entries.setdefault(name, _Entry(name))
            if entry.owner is not None:
                _drop_stale_identity(entry, values)
            for key, value in values.items():
                entry.values[key] = value
                entry.origins[key] = source
            entry.owner = source
    return entries, labels, default


def _drop_stale_identity(entry: _Entry, override: dict[str, Any]) -> None:
    """An override that points an entry at another file drops what described the old file.

    Its checksum and size, and its MTP layers: conversions of one model differ in whether
    they keep them, so the new file has none until the override says so.
    """
    if any(key in override and override[key] != entry.values.get(key) for key in _HUB_IDENTITY):
        for key in ("sha256", "size", "mtp_layers"):
            if key not in override:
                entry.values.pop(key, None)
    if any(key in override and override[key] != entry.values.get(key) for key in _PYPI_IDENTITY):
        if "pypi_sha256" not in override:
            entry.values.pop("pypi_sha256", None)


def _spec(entry: _Entry) -> ModelSpec:
    """Check an entry's keys together and build its record."""
    owner = entry.owner
    assert owner is not None
    values = entry.values
    for key in _REQUIRED_KEYS:
        if key not in values:
            raise _fail(owner, f"missing required key '{key}'", name=entry.name)
    if ("repo" in values) != ("file" in values):
        present, missing = ("repo", "file") if "repo" in values else ("file", "repo")
        raise _fail(entry.origins[present], f"'{present}' needs '{missing}' too", name=entry.name, key=present)
    requirements, members = values.get("pypi", []), values.get("pypi_path", [])
    if len(requirements) != len(members):
        raise _fail(
            entry.origins.get("pypi_path", owner),
            f"'pypi' names {len(requirements)} package(s) but 'pypi_path' has {len(members)} path(s); "
            "give one path per package",
            name=entry.name,
            key="pypi_path",
        )
    if "repo" not in values and not requirements and "path" not in values:
        raise _fail(
            owner, "needs a source: repo and file (Hugging Face), pypi and pypi_path, or path",
            name=entry.name,
        )
    path = None
    if "path" in values:
        path = Path(values["path"]).expanduser()
        if not path.is_absolute():
            # Relative to the file that says it, not to wherever localspec runs.
            path = entry.origins["path"].path.parent / path
    return ModelSpec(
        name=entry.name,
        family=values["family"],
        params=values["params"],
        context=values["context"],
        repo=values.get("repo"),
        file=values.get("file"),
        revision=values.get("revision", "main"),
        sha256=values.get("sha256"),
        size=values.get("size"),
        pypi=tuple(PypiChunk(req, member) for req, member in zip(requirements, members)),
        pypi_sha256=values.get("pypi_sha256"),
        path=path,
        drafts=tuple(values.get("drafts", ())),
        aliases=tuple(values.get("aliases", ())),
        mtp_layers=values.get("mtp_layers", 0),
        arch=values.get("arch"),
        hybrid=values.get("hybrid", False),
        assistant=values.get("assistant", False),
        drafter=values.get("drafter"),
        origin=owner.path,
    )


def _check_references(entries: dict[str, _Entry], specs: dict[str, ModelSpec]) -> None:
    """Drafts exist and share the family; aliases are unique; nothing shadows a name."""
    claimed: dict[str, str] = {}
    for name, spec in specs.items():
        entry = entries[name]
        for alias in spec.aliases:
            source = entry.origins["aliases"]
            if alias in specs and alias != name:
                raise _fail(source, f"alias '{alias}' is already the name of a model", name=name, key="aliases")
            if alias in claimed and claimed[alias] != name:
                raise _fail(
                    source, f"alias '{alias}' is also an alias of {claimed[alias]}", name=name, key="aliases"
                )
            claimed[alias] = name
    for name, spec in specs.items():
        entry = entries[name]
        for draft in spec.drafts:
            source = entry.origins["drafts"]
            target = specs.get(draft) or specs.get(claimed.get(draft, ""))
            if target is None:
                close = difflib.get_close_matches(draft, list(specs), n=1)
                hint = f" (did you mean '{close[0]}'?)" if close else ""
                raise _fail(source, f"draft '{draft}' is not a model in the registry{hint}", name=name, key="drafts")
            if target.name == name:
                raise _fail(source, "a model cannot be its own recommended draft", name=name, key="drafts")
            if target.family != spec.family:
                raise _fail(
                    source,
                    f"draft '{draft}' is family {target.family}, not {spec.family}: "
                    "a draft must share its target's vocabulary family",
                    name=name,
                    key="drafts",
                )
        _check_drafter(entry, spec, claimed)


def _draft_kind(spec: ModelSpec) -> str:
    """What a draft that cannot run alone is, for a message: "an assistant", "a dflash draft"."""
    return "an assistant" if spec.assistant else f"a {spec.arch} draft"


def _check_drafter(entry: _Entry, spec: ModelSpec, aliases: dict[str, str]) -> None:
    """The drafting facts of one entry agree with each other."""
    name = entry.name
    if spec.draft_only:
        kind = _draft_kind(spec)
        for key in ("drafts", "drafter", "mtp_layers"):
            if key in entry.values and entry.values[key]:
                raise _fail(
                    entry.origins[key],
                    f"{kind} drafts for its target and cannot have '{key}' of its own; "
                    "list it in the target's 'drafts' instead",
                    name=name,
                    key=key,
                )
    if spec.drafter is None:
        return
    source = entry.origins["drafter"]
    if spec.drafter == MTP_DRAFTER and spec.mtp_layers == 0:
        raise _fail(
            source,
            "drafter 'mtp' needs MTP layers: set 'mtp_layers' to the GGUF's <arch>.nextn_predict_layers, "
            "or choose 'ngram' or one of 'drafts'",
            name=name,
            key="drafter",
        )
    known = (MTP_DRAFTER, NGRAM_DRAFTER, *spec.drafts)
    if spec.drafter not in known and aliases.get(spec.drafter) not in spec.drafts:
        raise _fail(
            source,
            f"drafter '{spec.drafter}' must be 'mtp', 'ngram' or one of this entry's 'drafts' ({', '.join(known)})",
            name=name,
            key="drafter",
        )


def _build(sources: list[_Source]) -> Registry:
    entries, labels, default = _merge(sources)
    specs = {name: _spec(entry) for name, entry in entries.items()}
    _check_references(entries, specs)
    # Draft lists may use aliases; store canonical names so callers need not resolve again.
    aliases = {alias: spec.name for spec in specs.values() for alias in spec.aliases}
    specs = {
        name: _canonical(spec, tuple(aliases.get(d, d) for d in spec.drafts), aliases) for name, spec in specs.items()
    }
    default_name = None
    if default is not None:
        wanted, source = default
        default_name = wanted if wanted in specs else aliases.get(wanted)
        if default_name is None:
            raise _fail(source, f"default model '{wanted}' is not in the registry", key="default")
        if specs[default_name].draft_only:
            raise _fail(
                source, f"default model '{wanted}' is {_draft_kind(specs[default_name])}, which only drafts for its "
                "target", key="default")
    return Registry(specs, default=default_name, labels=labels, files=tuple(s.path for s in sources))


def _canonical(spec: ModelSpec, drafts: tuple[str, ...], aliases: dict[str, str]) -> ModelSpec:
    """``spec`` with its drafts and drafter named by canonical names rather than aliases."""
    drafter = aliases.get(spec.drafter, spec.drafter) if spec.drafter else None
    if drafts == spec.drafts and drafter == spec.drafter:
        return spec
    return replace(spec, drafts=drafts, drafter=drafter)
