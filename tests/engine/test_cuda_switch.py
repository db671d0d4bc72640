"""Our CUDA batch-invariant switch as localspec reads it (scripts/llama.cpp-patches/cuda/70-cuda-batch-
invariant-switch.patch): the build names it among its CUDA features; under it a context on a GPU keeps a
verification batch within the 8 rows the switched kernels cover, and the self-test compares that many rows.
The kernels themselves run on a GPU only (benchmarks/gpu/kernels.py, in the GPU command); here the real CPU
build and model run, with the build's report of a GPU and of the switch stood in for."""

from __future__ import annotations

from pathlib import Path

import pytest

from localspec.backend import build, selftest
from localspec.backend import context as context_module

CUDA_LINE = ("CPU : SSE3 = 1 | AVX2 = 1 | LLAMAFILE = 1 | CUDA : ARCHS = 900 | USE_GRAPHS = 1 | "
             "CUDA_BATCH_INVARIANT = {} | ")


def test_the_switch_is_read_from_the_builds_cuda_features(monkeypatch: pytest.MonkeyPatch) -> None:
    assert build.cuda_batch_invariant() is None  # this machine's build: no CUDA, so no such switch
    monkeypatch.setattr(build, "system_info", lambda: CUDA_LINE.format(1))
    assert build.cuda_batch_invariant() is True
    monkeypatch.setattr(build, "system_info", lambda: CUDA_LINE.format(0))
    assert build.cuda_batch_invariant() is False
    monkeypatch.setattr(build, "system_info", lambda: CUDA_LINE.replace("CUDA_BATCH_INVARIANT = {} | ", ""))
    assert build.cuda_batch_invariant() is None  # a CUDA build from before the patch
    assert "CUDA_BATCH_INVARIANT" not in selftest.build_info()["cpu_features"]


def test_on_a_gpu_under_the_switch_a_verification_holds_at_most_8_rows(smollm2_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from localspec.backend import Context, Model

    monkeypatch.setattr(context_module, "gpu_offload_supported", lambda: True)
    model = Model(smollm2_path, n_gpu_layers=0)
    try:
        for on, rows in ((True, build.CUDA_INVARIANT_ROWS), (False, 512), (None, 512)):
            monkeypatch.setattr(context_module, "cuda_batch_invariant", lambda on=on: on)
            ctx = Context(model, n_ctx=1024, n_batch=512, n_seq=1)
            try:
                assert ctx.max_verify_rows == rows and ctx.cuda_batch_invariant is bool(on), on
            finally:
                ctx.close()
    finally:
        model.close()
    assert build.CUDA_INVARIANT_ROWS == 8


def test_the_self_test_compares_as_many_rows_as_a_verification_may_hold(smollm2_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(context_module, "gpu_offload_supported", lambda: True)
    monkeypatch.setattr(context_module, "cuda_batch_invariant", lambda: True)
    assert selftest.decode_test(str(smollm2_path))["verify_rows"] == build.CUDA_INVARIANT_ROWS
    monkeypatch.setattr(context_module, "cuda_batch_invariant", lambda: None)
    assert selftest.decode_test(str(smollm2_path))["verify_rows"] == selftest.VERIFY_ROWS


def test_under_the_switch_the_controller_plans_no_more_than_a_verification_holds(smollm2_path: Path,
                                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from localspec.backend import Model
    from localspec.drafting.specs import DrafterSpec
    from localspec.engine import Engine

    monkeypatch.setattr(context_module, "gpu_offload_supported", lambda: True)
    monkeypatch.setattr(context_module, "cuda_batch_invariant", lambda: True)
    target, draft = Model(smollm2_path, n_gpu_layers=0), Model(smollm2_path, n_gpu_layers=0)
    engine = Engine(target, draft=draft, specs=[DrafterSpec("ngram")], n_ctx=1024, personal_history=False)
    try:
        assert engine.draft_len_limit == build.CUDA_INVARIANT_ROWS - 1  # the last token's row and 7 drafts
        assert engine.tree_nodes_limit == build.CUDA_INVARIANT_ROWS - 1  # (a draft model grows trees)
    finally:
        engine.close()
    monkeypatch.setattr(context_module, "cuda_batch_invariant", lambda: False)
    target, draft = Model(smollm2_path, n_gpu_layers=0), Model(smollm2_path, n_gpu_layers=0)  # (closed with it)
    engine = Engine(target, draft=draft, n_ctx=1024, personal_history=False)
    try:
        assert engine.draft_len_limit is None and engine.tree_nodes_limit > build.CUDA_INVARIANT_ROWS
    finally:
        engine.close()
