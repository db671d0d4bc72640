"""What a failed download means, in one line: the Hub client's exceptions as ``DownloadError``.

huggingface_hub wraps the real reason (a DNS failure, a timeout, a gated repository,
a full disk) in its own exceptions, sometimes several deep. ``hub_error`` walks the
chain and names the cause and the fix; anything that is not a download failure comes
back unchanged, so a bug still surfaces with its traceback. ``human_size`` writes
sizes the way these messages and ``localspec models`` show them.
"""

from __future__ import annotations

import errno
import re
from pathlib import Path

import httpx2
from huggingface_hub import constants
from huggingface_hub.errors import (
    EntryNotFoundError,
    FileMetadataError,
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from localspec.errors import DownloadError
from localspec.models.rangefile import server_name
from localspec.models.registry import ModelSpec

_DNS_FAILURES = (
    "name or service not known",
    "nodename nor servname",
    "temporary failure in name resolution",
    "no address associated",
    "getaddrinfo failed",
)
# A full quota reads like a full disk to the user; EDQUOT does not exist everywhere.
_DISK_FULL = tuple(getattr(errno, name) for name in ("ENOSPC", "EDQUOT") if hasattr(errno, name))


def hub_error(err: BaseException, spec: ModelSpec, *, cache: Path) -> BaseException:
    """The ``DownloadError`` for a failure of the Hub client, or ``err`` itself if it is not one.

    ``cache`` is the folder downloads go to, named when the disk is full or not writable.
    """
    host = server_name(constants.ENDPOINT)
    name = spec.name
    chain = _chain(err)
    if any(isinstance(e, OfflineModeIsEnabled) for e in chain):
        return offline_error(spec)
    for e in chain:
        if isinstance(e, GatedRepoError):
            return DownloadError(
                f"{spec.repo} is gated on the Hub: accept its license at {constants.ENDPOINT}/{spec.repo} and log "
                "in with `hf auth login`, or use another model"
            )
        if isinstance(e, RepositoryNotFoundError):
            return DownloadError(
                f"repository {spec.repo} was not found on {host} (or it is private); check `repo` for {name} "
                f"in {spec.origin}"
            )
        if isinstance(e, RevisionNotFoundError):
            return DownloadError(
                f"revision {spec.revision} does not exist in {spec.repo}; check `revision` for {name} "
                f"in {spec.origin}"
            )
        if isinstance(e, EntryNotFoundError) and not isinstance(e, LocalEntryNotFoundError):
            return DownloadError(
                f"{spec.file} is not in {spec.repo} at {spec.revision}; check `file` for {name} in {spec.origin}"
            )
        if isinstance(e, FileMetadataError):
            return DownloadError(
                f"{host} does not answer like a Hugging Face Hub; check HF_ENDPOINT and your proxy settings"
            )
        if isinstance(e, HfHubHTTPError) and e.response is not None:
            status = e.response.status_code
            if status in (401, 403):
                return DownloadError(
                    f"{host} refused access to {spec.repo} (HTTP {status}); log in with `hf auth login` "
                    "if the repository needs it"
                )
            if status == 429:
                return DownloadError(f"{host} is rate-limiting downloads (HTTP 429); try again in a few minutes")
            return DownloadError(
                f"{host} answered HTTP {status} for {spec.repo}/{spec.file}; the Hub may be having trouble — "
                "try again later"
            )
        if isinstance(e, httpx2.ConnectError):
            if any(marker in str(e).lower() for marker in _DNS_FAILURES):
                return DownloadError(
                    f"cannot resolve {host} (DNS lookup failed); check your network connection or HF_ENDPOINT, "
                    "or set HF_HUB_OFFLINE=1 to use only downloaded models"
                )
            return DownloadError(
                f"cannot reach {host} ({_reason(e)}); check your network connection or HF_ENDPOINT, "
                "or set HF_HUB_OFFLINE=1 to use only downloaded models"
            )
        if isinstance(e, httpx2.TimeoutException):
            return DownloadError(
                f"{host} did not answer in time while fetching {name}; check your connection and try again "
                "(HF_HUB_DOWNLOAD_TIMEOUT and HF_HUB_ETAG_TIMEOUT raise the limits)"
            )
        if isinstance(e, (httpx2.RemoteProtocolError, httpx2.ReadError, httpx2.NetworkError)):
            return DownloadError(
                f"the connection to {host} broke while downloading {name} and did not recover; run "
                f"`localspec pull {name}` again (the download starts over)"
            )
        if isinstance(e, OSError) and not isinstance(e, (HfHubHTTPError, LocalEntryNotFoundError)):
            return os_error(e, spec, cache, setting="HF_HUB_CACHE")
    if any(isinstance(e, LocalEntryNotFoundError) for e in chain):
        return DownloadError(
            f"{name} is not downloaded and {host} could not be reached; check your network connection "
            "or HF_ENDPOINT"
        )
    return err  # not a download failure: a bug, let it surface with its traceback


def offline_error(spec: ModelSpec) -> DownloadError:
    """A model that is not on disk while the network is off limits."""
    return DownloadError(
        f"{spec.name} is not downloaded and offline mode is on; run `localspec pull {spec.name}` with network access"
    )


def os_error(err: OSError, spec: ModelSpec, directory: Path, *, setting: str) -> DownloadError:
    """A filesystem failure while writing ``spec`` under ``directory``; ``setting`` moves that directory."""
    if err.errno in _DISK_FULL:
        need = f" ({human_size(spec.size)})" if spec.size else ""
        return DownloadError(
            f"no space left on the disk holding {directory} while downloading {spec.name}{need}; "
            f"free some space or set {setting} to a larger disk"
        )
    if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return DownloadError(f"cannot write to {directory} ({err.strerror}); set {setting} to a writable directory")
    if "Consistency check failed" in str(err):
        return DownloadError(
            f"the download of {spec.name} came out the wrong size (the connection was cut short); "
            f"run `localspec pull {spec.name}` again"
        )
    return DownloadError(f"downloading {spec.name} failed: {err.strerror or err}")


def _chain(err: BaseException) -> list[BaseException]:
    """``err`` and its causes, outermost first (the client wraps the real reason)."""
    seen: list[BaseException] = []
    current: BaseException | None = err
    while current is not None and all(current is not e for e in seen):
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def _reason(err: BaseException) -> str:
    text = str(err).strip()
    match = re.search(r"\[Errno -?\d+\]\s*(.+)", text)
    return (match.group(1) if match else text or type(err).__name__).strip().lower()


def human_size(size: int | None) -> str:
    """``9001752960`` → ``"9.0 GB"`` (decimal units, as disks are sold); ``None`` → ``"?"``."""
    if size is None:
        return "?"
    value = float(size)
    for unit in ("B", "kB", "MB"):
        if value < 1000:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} GB"
