"""`localspec doctor` and the self-test that scripts/setup.sh runs after installing."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest
from patched_build import require_patch

from localspec import doctor
from localspec.backend.selftest import LONG_PROMPT


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "localspec", *args], capture_output=True, text=True,
                          timeout=600, env=env)


def test_a_child_killed_by_a_signal_is_named_with_its_meaning_and_its_output_kept() -> None:
    code = ("import json, os, signal; print(json.dumps({'build': {'x': 1}}), flush=True); "
            "os.kill(os.getpid(), signal.SIGILL)")
    result = doctor.run_child([sys.executable, "-c", code])
    assert not result.ok
    assert result.signal_name == "SIGILL"
    assert result.records == {"build": {"x": 1}}
    line = result.failure()
    assert line.startswith("died with SIGILL (illegal instruction")
    assert "\n" not in line


def test_a_child_that_fails_reports_its_last_error_line() -> None:
    result = doctor.run_child([sys.executable, "-c", "import sys; sys.exit('boom: the reason')"])
    assert result.signal_name is None
    assert result.failure() == "exited with code 1: boom: the reason"


def test_selftest_decodes_a_long_prompt_in_one_batch_on_the_real_build(smollm2_path: Path) -> None:
    result = doctor.selftest(smollm2_path)
    assert result.ok, result.failure()
    test = result.records["selftest"]
    assert test["prompt_tokens"] >= LONG_PROMPT >= 512
    assert test["one_batch"] is True
    assert test["verify_rows"] > 1
    build = result.records["build"]
    # The CPU features are the ISA flags the build's system line reports on, never its build switches.
    assert build["cpu_features"], build["system_info"]
    for feature in build["cpu_features"]:
        assert f"{feature} = 1" in build["system_info"] and feature not in ("LLAMAFILE", "OPENMP", "REPACK")
    if platform.machine() in ("x86_64", "AMD64") and os.environ.get("LOCALSPEC_AMX", "off") != "on":
        # scripts/setup.sh builds without ggml's AMX kernels unless asked (they crash with SIGILL).
        assert build["amx"] is False


@pytest.mark.parametrize("which", ["smollm2", "gemma"])
def test_selftest_finds_each_test_model_batch_invariant(which: str, smollm2_path: Path, gemma_path: Path) -> None:
    # Gemma 3's Q4_K weights took a repacked gemm for batches and ggml's tiled K-quant matmul past
    # 8 rows: logits differed from one-token decodes until the backend turned both off for it.
    result = doctor.selftest(smollm2_path if which == "smollm2" else gemma_path)
    assert result.ok, result.failure()
    test = result.records["selftest"]
    if result.records["build"]["batch_invariant"]:
        assert test["batch_invariant"] is True, test
        assert test["max_logit_diff"] == 0.0


def test_selftest_catches_a_batch_dependent_kernel(gemma_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The user's own setting wins over the backend's default: with ggml's tiled K-quant matmul on,
    # a 9-row batch rounds differently from one-token decodes, and the per-model check must say so.
    monkeypatch.setenv("GGML_CPU_TILED_MM", "1")
    _x86_without_avx2_skip("ggml's tiled K-quant matmul")
    result = doctor.selftest(gemma_path)
    assert result.ok, result.failure()
    test = result.records["selftest"]
    assert test["batch_invariant"] is False and test["max_logit_diff"] > 0


def _decode_in_child(model: Path, env: dict[str, str], flash_attn: bool | None) -> dict:
    """The self-test's decode in a child whose ggml reads ``env`` (once, at its first use)."""
    code = ("import json, sys; from localspec.backend.selftest import decode_test; "
            f"print(json.dumps(decode_test(sys.argv[1], flash_attn={flash_attn!r})))")
    proc = subprocess.run([sys.executable, "-c", code, str(model)], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _flash_attention_decode(model: Path, switch: str, tiles_from: str = "256") -> dict:
    """The self-test's decode with flash attention on, in a child whose ggml reads ``switch`` and
    ``tiles_from`` (once, at its first use)."""
    return _decode_in_child(model, {"GGML_CPU_FA_BATCH_INVARIANT": switch, "GGML_CPU_FA_TILES_FROM": tiles_from},
                            flash_attn=True)


def _cpu_switch_or_skip(flag: str, what: str) -> None:
    """Skip on a GPU build or one made with LOCALSPEC_PATCH=off; fail on a CPU build that should carry
    one of scripts/llama.cpp-patches/' switches and does not."""
    key, _, value = flag.partition(" = ")
    require_patch(key, f"{what} switch", value=value or None)


def _x86_without_avx2_skip(what: str) -> None:
    """Skip on an x86 build without AVX2, where ``what`` has no batch kernels and no batch differs."""
    from localspec import backend

    if platform.machine() in ("x86_64", "AMD64") and "AVX2 = 1" not in backend.system_info():
        pytest.skip(f"an x86 build without AVX2: {what} has no batch kernels here, so nothing differs")


def _switch_off_then_on(decode: Callable[[str], dict]) -> dict:
    """``decode(switch)`` with "0" must differ from one-token decodes and with "1" match them bit for
    bit: the switch is what makes the difference. Returns the switched result."""
    off = decode("0")
    assert off["batch_invariant"] is False and off["max_logit_diff"] > 0, off
    on = decode("1")
    assert on["batch_invariant"] is True and on["max_logit_diff"] == 0.0, on
    return on


def test_flash_attention_on_the_cpu_is_batch_invariant_only_with_the_switch(smollm2_path: Path) -> None:
    # scripts/setup.sh patches ggml (scripts/llama.cpp-patches/): with its switch set, a lone query
    # past 512 cells and a batch of 65 queries are summed as a one-token decode sums them.
    from localspec import backend

    _cpu_switch_or_skip("FA_BATCH_INVARIANT", "flash-attention")
    assert backend.cpu_flash_attention() is True  # the backend sets the switch unless the user did
    switched = _switch_off_then_on(lambda switch: _flash_attention_decode(smollm2_path, switch))
    # Batches from GGML_CPU_FA_TILES_FROM queries on take the tiles again, which are batch-dependent:
    # why a verification batch stays below it (Context.max_verify_rows).
    tiled = _flash_attention_decode(smollm2_path, "1", tiles_from=str(switched["verify_rows"]))
    assert tiled["batch_invariant"] is False and tiled["max_logit_diff"] > 0, tiled


def test_flash_attention_gives_a_row_the_same_bits_from_chunks_spread_over_threads_or_whole_rows(
        tmp_path: Path) -> None:
    # With the switch, a lone query's cells are cut into 128-cell chunks that any thread may take (a
    # decode uses every thread), the chunks' partials kept while they fit in 16 MiB; a batch whose
    # partials would not fit is summed row by row, chunk after chunk. Both must give the same bits.
    from wide_attention_model import HEAD_DIM, N_HEAD, write_wide_attention_model

    from localspec import backend
    from localspec.backend.selftest import VERIFY_ROWS

    _cpu_switch_or_skip("FA_INVARIANT_CHUNK = 128", "flash-attention chunking")
    chunks = -(-(LONG_PROMPT + VERIFY_ROWS) // 128)  # at least: the KV view is padded past its cells

    def partials_bytes(rows: int) -> int:
        return rows * N_HEAD * chunks * (2 + HEAD_DIM) * 4

    assert partials_bytes(1) < 16 << 20 < partials_bytes(VERIFY_ROWS)  # a decode splits, the batch does not
    assert backend.cpu_flash_attention() is True
    model = write_wide_attention_model(tmp_path / "wide.gguf")
    result = _decode_in_child(model, {}, flash_attn=True)
    assert result["flash_attn"] is True and result["verify_rows"] == VERIFY_ROWS
    assert result["batch_invariant"] is True and result["max_logit_diff"] == 0.0, result


def test_flash_attention_takes_rows_together_without_changing_their_bits(tmp_path: Path) -> None:
    # Over an F16 cache the kernel takes a chunk for up to 16 rows that share a KV head at once (each
    # cell's K and V widened once for all of them), sums dot products 16 lanes at a time and values 64
    # dimensions (AVX-512; 32 with AVX2) for up to 4 rows (2) at a time. A head of 72 dimensions is a
    # multiple of neither, so it takes the plain loops, where the test models' 64 and 256 take the
    # SIMD ones (tests/engine/test_kernels.py, tests/engine/test_engine.py); 3 query heads per KV head make a
    # decode's group 3 rows and the 65-token batch's groups of 16 straddle two heads. A row must come
    # out the same bits in each.
    from wide_attention_model import write_wide_attention_model

    from localspec import backend
    from localspec.backend.selftest import VERIFY_ROWS

    _cpu_switch_or_skip("FA_INVARIANT_GROUP = 16", "flash-attention grouping")
    assert backend.cpu_flash_attention() is True
    model = write_wide_attention_model(tmp_path / "gqa72.gguf", n_head=6, n_head_kv=2, head_dim=72)
    result = _decode_in_child(model, {}, flash_attn=True)
    assert result["flash_attn"] is True and result["verify_rows"] == VERIFY_ROWS
    assert result["batch_invariant"] is True and result["max_logit_diff"] == 0.0, result


def test_llamafile_sgemm_is_batch_invariant_only_with_the_switch(smollm2_path: Path) -> None:
    # scripts/setup.sh builds with llamafile's sgemm and patches in a switch that keeps it to the
    # kernels that sum a row as a one-token decode does. With flash attention off, attention's
    # float matmuls take sgemm for a batch: without the switch a 65-row batch rounds differently.
    from localspec import backend

    _cpu_switch_or_skip("SGEMM_BATCH_INVARIANT", "llamafile sgemm")
    _x86_without_avx2_skip("llamafile's sgemm")
    assert backend.batch_invariant() is True  # the backend sets the switch unless the user did
    _switch_off_then_on(lambda switch: _decode_in_child(
        smollm2_path, {"GGML_CPU_SGEMM_BATCH_INVARIANT": switch}, flash_attn=False))


def test_gemma_repacked_q4_k_is_batch_invariant_with_the_patch(gemma_path: Path) -> None:
    # Upstream's repacked Q4_K gemv (one row) rounds differently from its gemm (4-row groups); the
    # patch makes them agree, the build says so, and Gemma 3's Q4_K weights are then repacked.
    from localspec import backend

    if "REPACK_Q4_K_INVARIANT = 1" not in backend.system_info():
        pytest.skip("this llama.cpp build lacks localspec's repacked-Q4_K fix (x86 with AVX2, scripts/setup.sh)")
    assert backend.repack_is_exact(gemma_path) is True
    result = _decode_in_child(gemma_path, {}, flash_attn=None)
    assert result["repack"] is True
    assert result["batch_invariant"] is True and result["max_logit_diff"] == 0.0, result


def test_contexts_turn_cpu_flash_attention_on_only_where_it_is_exact(smollm2_path: Path) -> None:
    from localspec import backend

    if backend.gpu_offload_supported():
        pytest.skip("a GPU build: flash attention is on 'auto' there")
    code = ("import json, sys; from localspec.backend import Context, Model; "
            "ctx = Context(Model(sys.argv[1], n_gpu_layers=0), n_ctx=256); print(json.dumps(ctx.flash_attn))")
    seen = {}
    for switch in ("0", "1"):
        proc = subprocess.run([sys.executable, "-c", code, str(smollm2_path)], capture_output=True, text=True,
                              env={**os.environ, "GGML_CPU_FA_BATCH_INVARIANT": switch}, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        seen[switch] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["0"] is False  # a batch-dependent kernel (as in a stock build): off, for exactness
    patched = "FA_BATCH_INVARIANT" in backend.system_info()
    assert seen["1"] is (None if patched else False)  # None: llama.cpp's "auto", on for these models


def test_doctor_reports_build_folders_model_and_a_passing_selftest(smollm2_path: Path, tmp_path: Path) -> None:
    env = {**os.environ, "LOCALSPEC_CONFIG_DIR": str(tmp_path / "config")}
    proc = _cli("doctor", "--model", str(smollm2_path), env=env)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for label in ("llama.cpp", "CPU features", "special paths", "exactness", "GPU", "config dir", "cache dir",
                  "data dir"):
        assert label in out
    assert f"\nmodel         {smollm2_path}: {smollm2_path}" in out  # the model asked for, not "default model"
    assert f"{tmp_path / 'config'} (not created yet)" in out
    assert "self-test     ok: " in out and "prompt tokens in one batch" in out
    assert "model exact   " in out
    from localspec import backend

    if "SGEMM_BATCH_INVARIANT = 1" in backend.system_info():  # our patched build, sgemm kept exact
        assert "llamafile sgemm (its exact kernels only)" in out
    if "Q8_0_COLS = 4" in backend.system_info():  # our patched build on x86 with AVX-512 VNNI
        assert "Q4_1/Q5_K/Q6_K/Q8_0 batches by columns" in out
    elif "Q4_1_COLS = 4" in backend.system_info():  # our patched build on x86 with AVX2
        assert "Q4_1/Q5_K/Q6_K batches by columns" in out
    if "SMALL_BATCH_CHUNKS = 16" in backend.system_info():  # our patched CPU build, the switch left alone
        assert "small batches in 16 chunks per thread" in out
    lanes = {"FA_INVARIANT_SIMD = 16": "AVX-512", "FA_INVARIANT_SIMD = 8": "AVX2", "FA_INVARIANT_SIMD = 0": "plain loops"}
    for flag, words in lanes.items():
        if flag in backend.system_info() and backend.cpu_flash_attention():
            assert f"flash attn    on (batch-invariant CPU kernel in {words})" in out

    proc = _cli("doctor", "--model", str(smollm2_path), "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)
    assert found["selftest"]["ok"] is True and found["selftest"]["result"]["prompt_tokens"] >= 512
    assert found["folders"]["config"] == str(tmp_path / "config")

    proc = _cli("doctor", "--smoke-only", "--model", str(smollm2_path), env=env)
    assert proc.returncode == 0 and proc.stdout == ""
    assert proc.stderr.startswith("localspec: self-test passed: ")


def test_doctor_says_in_one_line_when_the_selftest_cannot_load_the_model(tmp_path: Path) -> None:
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + os.urandom(256))
    proc = _cli("doctor", "--smoke-only", "--model", str(bad))
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1
    # Read from its header first, as generate reads it: the file's own fault, named, before any child runs.
    assert proc.stderr.startswith(f"localspec: error: no self-test: cannot read model file {bad}: ")


def test_doctor_names_a_truncated_model_with_generates_cause(smollm2_path: Path, tmp_path: Path) -> None:
    """Issue 33: `doctor --model trunc.gguf` called it "default model" and gave a vaguer cause than generate."""
    trunc = tmp_path / "trunc.gguf"
    with smollm2_path.open("rb") as src:
        trunc.write_bytes(src.read(smollm2_path.stat().st_size // 3))
    generate = _cli("generate", str(trunc), "-p", "x")
    cause = generate.stderr.strip().removeprefix("localspec: error: ")
    assert generate.returncode == 2 and f"model file {trunc} is truncated" in cause, generate.stderr
    proc = _cli("doctor", "--model", str(trunc))
    assert proc.returncode == 1
    assert f"\nmodel         {trunc}: cannot be loaded\nself-test     skipped: {cause}\n" in proc.stdout
    assert "default model" not in proc.stdout
    smoke = _cli("doctor", "--smoke-only", "--model", str(trunc))
    assert smoke.returncode == 1 and smoke.stderr == f"localspec: error: no self-test: {cause}\n"
    found = json.loads(_cli("doctor", "--model", str(trunc), "--json").stdout)
    assert found["model"] == found["default_model"] == {"name": str(trunc), "path": str(trunc), "problem": cause}
    assert found["selftest"]["ok"] is False and found["selftest"]["failure"] == cause


def test_a_gpu_self_test_names_the_device_and_what_exactness_holds() -> None:
    """On a GPU the batch-vs-single comparison decides the words: bit-identical, up to near-ties (same top
    token in every row), or not (a row's top token changed)."""
    from localspec.commands import doctor as doctor_cmd

    test = {"batch_invariant": False, "verify_rows": 65, "max_logit_diff": 0.031, "argmax_same_rows": 65,
            "device": "NVIDIA GeForce RTX 4090", "offloaded_layers": [31, 31]}
    assert doctor_cmd._where(test) == " on NVIDIA GeForce RTX 4090 (31/31 layers offloaded)"
    assert doctor_cmd._exact_short(test).endswith("(the same top token in 65/65): exact up to near-ties")
    assert doctor_cmd._model_exactness(test).startswith("up to near-ties: on the GPU")
    test["argmax_same_rows"] = 63
    assert doctor_cmd._exact_short(test).endswith("greedy speculation may part from plain decoding")
    assert doctor_cmd._model_exactness(test).startswith("no: on the GPU")
    assert doctor_cmd._where({"device": "cpu"}) == ""
    assert doctor_cmd._exact_short({"batch_invariant": True}) == "verification rows bit-identical to one-token decodes"


def test_the_exactness_line_on_a_gpu_says_where_the_cuda_switch_stands() -> None:
    from localspec.commands import doctor as doctor_cmd

    assert doctor_cmd._cuda_switch(None) == ""  # a build without our switch: nothing to say
    assert "batch-invariant kernels on" in doctor_cmd._cuda_switch(True)
    assert "at most 8 rows" in doctor_cmd._cuda_switch(True)
    assert "LOCALSPEC_CUDA_BATCH_INVARIANT=1 turns on" in doctor_cmd._cuda_switch(False)
