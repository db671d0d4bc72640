"""Commands that meet the Hub through names: `plan` reads only a header, `run`/`generate` check every
name before they download, and `generate NAME` pulls on first use — all against the loopback fake hub.

Like test_hub.py, each command runs in a fresh interpreter (huggingface_hub reads HF_ENDPOINT and
HF_HUB_OFFLINE at import) with the caches and config confined to ``tmp_path``.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from hubserver import FakeHub, cli_env, run_localspec

TARGET_REPO, DRAFT_REPO = "localspec-test/smol-target-GGUF", "localspec-test/smol-draft-GGUF"
COMMANDS = ("run", "generate", "plan", "pull")
MiB = 1 << 20


def write_registry(tmp: Path, filename: str) -> None:
    """A user models.toml naming the served SmolLM2 file twice: smol-target and smol-draft."""
    config = tmp / "config"
    config.mkdir(exist_ok=True)
    entries = [
        f'[models.{name}]\nfamily = "smoltest"\nparams = "135M"\ncontext = 8192\nrepo = "{repo}"\n'
        f'file = "{filename}"\n'
        for name, repo in (("smol-target", TARGET_REPO), ("smol-draft", DRAFT_REPO))
    ]
    (config / "models.toml").write_text("version = 1\n\n" + "\n".join(entries))


@pytest.fixture
def smol_hub(tmp_path: Path, smollm2_path: Path) -> Iterator[FakeHub]:
    """The real SmolLM2 file served as both registry entries, neither of them downloaded."""
    with FakeHub() as server:
        data = smollm2_path.read_bytes()
        server.add(TARGET_REPO, smollm2_path.name, data)
        server.add(DRAFT_REPO, smollm2_path.name, data)
        write_registry(tmp_path, smollm2_path.name)
        yield server


def localspec(tmp: Path, server: FakeHub | None, *args: str, timeout: float = 60,
              **env: str) -> subprocess.CompletedProcess[str]:
    return run_localspec(list(args), cli_env(tmp, server.endpoint if server else None, **env),
                         commands=COMMANDS, timeout=timeout)


def hub_blobs(tmp: Path) -> list[Path]:
    """Every blob or partial download in the HF cache."""
    return sorted(p for p in (tmp / "hf" / "hub").rglob("blobs/*"))


# --------------------------------------------------------------------------- plan by name


def test_plan_by_name_reads_only_the_header_with_range_requests(tmp_path: Path, smol_hub: FakeHub,
                                                                 smollm2_path: Path) -> None:
    by_name = localspec(tmp_path, smol_hub, "plan", "smol-target", "--draft", "smol-draft", "--vram", "8GiB",
                        "--ctx", "4k", "--json")
    assert by_name.returncode == 0, by_name.stderr
    assert "smol-target is not downloaded; reading only its GGUF header from the Hub" in by_name.stderr
    gets = [s for s in smol_hub.seen if s.method == "GET"]
    assert gets and all(s.port == "cdn" and s.range_start is not None and s.range_end is not None for s in gets)
    assert {s.method for s in smol_hub.seen} == {"HEAD", "GET"}
    # The header is 1.7 MB of a 98 MB file: each model costs two 1 MiB-aligned ranges, and the
    # draft check reads both vocabularies again from what was already fetched.
    fetched = sum(s.range_end - s.range_start + 1 for s in gets)  # type: ignore[operator]
    assert len(gets) == 4 and fetched == 4 * MiB
    assert hub_blobs(tmp_path) == []

    by_path = localspec(tmp_path, None, "plan", str(smollm2_path), "--draft", str(smollm2_path), "--vram", "8GiB",
                        "--ctx", "4k", "--json")
    assert by_path.returncode == 0, by_path.stderr
    assert json.loads(by_name.stdout) == json.loads(by_path.stdout)


def test_plan_uses_a_downloaded_copy_without_the_network(tmp_path: Path, smol_hub: FakeHub) -> None:
    pulled = localspec(tmp_path, smol_hub, "pull", "--no-progress", "smol-target")
    assert pulled.returncode == 0, pulled.stderr
    smol_hub.clear()
    planned = localspec(tmp_path, smol_hub, "plan", "smol-target", "--json")
    assert planned.returncode == 0, planned.stderr
    assert json.loads(planned.stdout)["target"]["label"] == "SmolLM2-135M-Instruct.Q4_1"
    assert smol_hub.seen == [] and "reading only its GGUF header" not in planned.stderr


def test_plan_offline_names_the_fix_in_one_line(tmp_path: Path, smol_hub: FakeHub) -> None:
    for args, env in ((["--offline"], {}), ([], {"HF_HUB_OFFLINE": "1"})):
        result = localspec(tmp_path, smol_hub, "plan", "smol-target", *args, **env)
        assert result.returncode == 2 and result.stdout == ""
        assert result.stderr == (
            "localspec: error: smol-target is not downloaded and offline mode is on; reading its header needs "
            "the network: run `localspec pull smol-target` with network access\n"
        )
    assert smol_hub.seen == []


def test_plan_resolves_size_names_and_refuses_unknown_ones(tmp_path: Path) -> None:
    # qwen3-0.5b is below every Qwen3 size: the smallest Qwen3, with the same notice `run` prints,
    # then (offline) the error for a model that is not downloaded.
    noticed = localspec(tmp_path, None, "plan", "qwen3-14b", "--draft", "qwen3-0.5b", "--offline")
    assert noticed.returncode == 2 and noticed.stdout == ""
    assert noticed.stderr.splitlines() == [
        "localspec: qwen3-0.5b is not a Qwen3 size; using qwen3-0.6b, the smallest Qwen3",
        "localspec: error: qwen3-14b is not downloaded and offline mode is on; reading its header needs the "
        "network: run `localspec pull qwen3-14b` with network access",
    ]
    unknown = localspec(tmp_path, None, "plan", "qwen3-14b", "--draft", "qwen3-0.6", "--offline")
    assert unknown.returncode == 2
    assert unknown.stderr.startswith("localspec: error: unknown model 'qwen3-0.6'; did you mean")


# --------------------------------------------------------------------------- names before downloads


@pytest.mark.parametrize("command", ["run", "generate"])
def test_a_misspelled_draft_fails_before_the_target_is_downloaded(tmp_path: Path, smol_hub: FakeHub,
                                                                   command: str) -> None:
    prompt = ["-p", "hi"] if command == "generate" else []
    result = localspec(tmp_path, smol_hub, command, "smol-target", "--draft", "smol-draf", *prompt)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("localspec: error: unknown model 'smol-draf'; did you mean: smol-draft")
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert smol_hub.seen == [] and hub_blobs(tmp_path) == []


@pytest.mark.parametrize("draft", ["ngram,rest:nowhere.lsstore", "smol-draft,lookahed"])
def test_every_draft_entry_is_checked_before_a_download(tmp_path: Path, smol_hub: FakeHub, draft: str) -> None:
    result = localspec(tmp_path, smol_hub, "generate", "smol-target", "--draft", draft, "-p", "hi")
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert result.stderr.startswith("localspec: error: ")
    assert smol_hub.seen == [] and hub_blobs(tmp_path) == []


# --------------------------------------------------------------------------- on-demand pulls
def test_generate_pulls_a_named_model_on_first_use(tmp_path: Path, smol_hub: FakeHub, smollm2_path: Path) -> None:
    args = ("generate", "smol-target", "-p", "The capital of France is", "--max-tokens", "4", "--json",
            "--threads", "1", "--ctx", "512")
    first = localspec(tmp_path, smol_hub, *args, timeout=300)
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["tokens"] == 4
    bodies = smol_hub.body_gets()
    assert len(bodies) == 1 and bodies[0].range_start is None  # one whole download, from the CDN
    blobs = hub_blobs(tmp_path)
    assert len(blobs) == 1 and blobs[0].stat().st_size == smollm2_path.stat().st_size

    smol_hub.clear()
    second = localspec(tmp_path, smol_hub, *args, timeout=300)
    assert second.returncode == 0, second.stderr
    assert json.loads(second.stdout)["token_ids"] == json.loads(first.stdout)["token_ids"]
    assert smol_hub.seen == []  # on disk: no network at all


def test_hf_home_pointing_at_a_file_is_named_with_the_fix(tmp_path: Path, smol_hub: FakeHub) -> None:
    """Issue 33: HF_HOME at a file gave "downloading … failed: Not a directory", naming neither."""
    notes = tmp_path / "notes.txt"
    notes.write_text("not a folder\n")
    env = cli_env(tmp_path, smol_hub.endpoint)
    del env["HF_HUB_CACHE"]
    env["HF_HOME"] = str(notes)
    proc = run_localspec(["pull", "smol-target"], env, commands=COMMANDS)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == (f"localspec: error: cannot download smol-target: the Hugging Face cache {notes / 'hub'} "
                           f"(from HF_HOME={notes}) cannot be made: its folder {notes} is a file, not a folder; "
                           "point HF_HOME at a folder (or unset it)\n")
    assert notes.read_text() == "not a folder\n"


def test_pull_stopped_by_sigterm_says_so_and_leaves_no_empty_partial(tmp_path: Path, smol_hub: FakeHub) -> None:
    """Issue 33: `pull` interrupted by SIGTERM left a 0-byte `.incomplete` and no line."""
    import signal
    import sys
    import time

    from hubserver import REPO_ROOT

    smol_hub.stall_bodies_s = 8.0  # the body's headers come, then nothing: the partial file stays empty
    code = ("import sys\nimport localspec.cli as cli\n"
            f"cli.COMMANDS = {COMMANDS!r}\nsys.exit(cli.main(sys.argv[1:]))")
    proc = subprocess.Popen([sys.executable, "-c", code, "pull", "smol-target", "--no-progress"],
                            env=cli_env(tmp_path, smol_hub.endpoint), cwd=REPO_ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    blobs = tmp_path / "hf" / "hub" / f"models--{TARGET_REPO.replace('/', '--')}" / "blobs"
    deadline = time.monotonic() + 30
    while not list(blobs.glob("*.incomplete")) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    partials = list(blobs.glob("*.incomplete"))
    assert partials and partials[0].stat().st_size == 0, "the download never started"
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM
    assert err == "localspec: stopped by SIGTERM\n" and out == ""
    assert list(blobs.glob("*.incomplete")) == []


def test_a_copy_cut_short_is_found_by_its_header_when_the_registry_knows_no_size(tmp_path: Path,
                                                                                 smol_hub: FakeHub) -> None:
    first = localspec(tmp_path, smol_hub, "pull", "smol-target", "--no-progress")
    assert first.returncode == 0, first.stderr
    blob = Path(first.stdout.strip()).resolve()
    size = blob.stat().st_size
    with blob.open("r+b") as f:
        f.truncate(size // 2)
    offline = localspec(tmp_path, None, "pull", "smol-target", "--offline")
    assert offline.returncode == 2 and "on disk" not in offline.stderr
    assert f"is not usable: model file {blob} is truncated: it has {size // 2:,} bytes" in offline.stderr
    listed = json.loads(run_localspec(["models", "--json"], cli_env(tmp_path)).stdout)
    record = next(r for r in listed if r["name"] == "smol-target")
    assert record["on_disk"] is False and "truncated" in record["problem"]


def test_pull_of_a_path_checks_that_it_is_a_whole_gguf(tmp_path: Path, smollm2_path: Path) -> None:
    """Issue 41: `pull` of a truncated or non-GGUF path exited 0 and printed it as sound."""
    from cli import one_error_line
    from cli import localspec as run

    truncated = tmp_path / "cut.gguf"
    with open(smollm2_path, "rb") as f:
        truncated.write_bytes(f.read(3_000_000))
    text = tmp_path / "notes.gguf"
    text.write_text("hello, not a model\n")
    for path, needle in ((truncated, "is truncated"), (text, "is not a GGUF model file")):
        proc = run("pull", str(path), timeout=60)
        assert proc.stdout == ""
        assert needle in one_error_line(proc) and str(path) in one_error_line(proc)
    sound = run("pull", str(smollm2_path), timeout=60)
    assert sound.returncode == 0 and sound.stdout.strip() == str(smollm2_path), sound.stderr
