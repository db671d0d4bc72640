"""ggml's repacked Q4_K kernels, called directly: a row's result is the same bits from the gemv
(a lone row) and from the gemm (groups of 4 rows).

Upstream, the x86 gemv multiplied a whole super block's integer sum by its scales once while the
gemm does it per pair of sub blocks, so the float sums rounded differently (up to 3.3 logits apart
on Gemma 3 270M Q4_K_M). scripts/llama.cpp-patches/20-exact-repack-sgemm.patch makes the gemv sum
in the gemm's order, and localspec then lets Q4_K weights be repacked (``backend.repack_is_exact``).
Random weight blocks and activations of several scales, every gemm path: 4-row groups, 16-row
blocks, column counts that leave an 8-column remainder past the 16-wide AVX-512 tiles.

The same patch gives a batch's Q4_1, Q5_K and Q6_K matmuls (no sgemm kernel exists for them, and they
are not repacked on x86) a kernel that takes each weight row for up to 4 columns at once, each column
summed exactly as the one-column vec_dot sums it: checked on random blocks against that vec_dot, and
through SmolLM2 Q4_1 and Gemma 3's Q6_K layers at every batch width's remainder against one-token
decodes (the matmul's hook is the same for every type).

On x86 with AVX-512 VNNI, Q8_0 weights (both test models' output matrices) take a kernel of their own
for one to four columns, which the one-column vec_dot is too: checked on random blocks against that
vec_dot to the bit and against the exact dot of the values the blocks hold, and end to end by the
batch-width test (every row of a verification batch meets the output matrix).

The patch also cuts a small batch's matmul over many rows (an LM head) into at most 16 chunks per thread
where upstream took thousands: which thread computes a row changes, never how. Checked by the same
logits from 1, 2 and 3 threads and with the switch at 0 (upstream's chunks), 16 and 3, and by the
batch-width test, whose widths cut the rows into different numbers of chunks (a 40-token batch's
columns in three blocks of 16, so fewer chunks along the rows).
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from patched_build import require_patch

from localspec import backend

QK_K = 256
Q8_K_BYTES = 4 + QK_K + 2 * QK_K // 16  # block_q8_K: d, qs, bsums
Q8_KX4_BYTES = 4 * Q8_K_BYTES  # block_q8_Kx4: four rows interleaved
Q4_KX8_BYTES = 8 * 2 + 8 * 2 + 96 + 8 * QK_K // 2  # block_q4_Kx8: d[8], dmin[8], scales, qs
QK8_1 = 32
Q8_1_BYTES = 2 + 2 + QK8_1  # block_q8_1: d, s (d times the sum of qs), qs


def _libggml_cpu() -> ctypes.CDLL:
    spec = importlib.util.find_spec("llama_cpp")
    assert spec is not None and spec.origin is not None
    # where llama_cpp loads its libraries from (LLAMA_CPP_LIB_PATH overrides the package's own)
    lib_dir = Path(os.environ.get("LLAMA_CPP_LIB_PATH") or Path(spec.origin).parent / "lib")
    backend.system_info()  # loads llama.cpp's libraries (libggml-base first), so this one resolves
    return ctypes.CDLL(str(lib_dir / "libggml-cpu.so"))


@pytest.fixture(scope="module")
def ggml_cpu() -> ctypes.CDLL:
    require_patch("REPACK_Q4_K_INVARIANT", "repacked-Q4_K fix", needs=("AVX2",), x86_only=True)
    return _libggml_cpu()


def _q4_kx8_blocks(rng: np.random.Generator, n_cols: int, n_blocks: int) -> ctypes.Array[ctypes.c_char]:
    """Repacked Q4_K weights (8 columns interleaved per block): random scales, mins and nibbles."""
    parts = []
    for _ in range(n_cols // 8 * n_blocks):
        parts += [(rng.random(8) * 0.01).astype(np.float16).tobytes(),
                  (rng.random(8) * 0.01).astype(np.float16).tobytes(),
                  rng.integers(0, 256, 96 + 8 * QK_K // 2, dtype=np.uint8).tobytes()]
    return ctypes.create_string_buffer(b"".join(parts))


def _gemv_rows(lib: ctypes.CDLL, weights, act: np.ndarray, n_cols: int) -> np.ndarray:
    """Each row alone, as a one-token decode computes it: quantize_row_q8_K, then the gemv."""
    n = act.shape[1]
    out = np.zeros((len(act), n_cols), np.float32)
    for r, row in enumerate(act):
        q = ctypes.create_string_buffer(Q8_K_BYTES * (n // QK_K))
        lib.quantize_row_q8_K(row.ctypes.data_as(ctypes.c_void_p), q, ctypes.c_int64(n))
        lib.ggml_gemv_q4_K_8x8_q8_K(ctypes.c_int(n), out[r].ctypes.data_as(ctypes.c_void_p),
                                    ctypes.c_size_t(n_cols), weights, q, ctypes.c_int(1), ctypes.c_int(n_cols))
    return out


def _gemm_rows(lib: ctypes.CDLL, weights, act: np.ndarray, n_cols: int) -> np.ndarray:
    """The rows as one batch: groups of 4 quantized together (ggml_quantize_mat_q8_K_4x8), then the gemm."""
    n_rows, n = act.shape
    per_group = Q8_KX4_BYTES * (n // QK_K)
    q = ctypes.create_string_buffer(per_group * (n_rows // 4))
    for g in range(n_rows // 4):
        group = np.ascontiguousarray(act[4 * g:4 * g + 4])
        lib.ggml_quantize_mat_q8_K_4x8(group.ctypes.data_as(ctypes.c_void_p), ctypes.byref(q, per_group * g),
                                       ctypes.c_int64(n))
    out = np.zeros((n_rows, n_cols), np.float32)
    lib.ggml_gemm_q4_K_8x8_q8_K(ctypes.c_int(n), out.ctypes.data_as(ctypes.c_void_p), ctypes.c_size_t(n_cols),
                                weights, q, ctypes.c_int(n_rows), ctypes.c_int(n_cols))
    return out


@pytest.mark.parametrize("n_rows", [4, 8, 16, 20])
@pytest.mark.parametrize("n_cols", [8, 24, 72])
def test_repacked_q4_k_rows_are_the_same_bits_alone_and_in_a_batch(ggml_cpu, n_rows: int, n_cols: int) -> None:
    rng = np.random.default_rng(n_rows * 100 + n_cols)
    for n in (QK_K, 3 * QK_K, 8 * QK_K):
        weights = _q4_kx8_blocks(rng, n_cols, n // QK_K)
        scales = rng.choice([0.01, 1.0, 300.0], size=(n_rows, 1))
        act = (rng.standard_normal((n_rows, n)) * scales).astype(np.float32)
        alone = _gemv_rows(ggml_cpu, weights, act, n_cols)
        batched = _gemm_rows(ggml_cpu, weights, act, n_cols)
        assert np.isfinite(alone).all() and np.abs(alone).max() > 0
        np.testing.assert_array_equal(alone, batched)


def test_which_weight_files_are_repacked(gemma_path: Path, smollm2_q4_0_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # Gemma 3 Q4_K_M holds Q4_K (repacked on x86) and Q5_0/Q6_K/Q8_0 (not repacked there). With the
    # patched build's flag its repacking is exact; without it, Q4_K (and Q6_K, repacked on ARM) are
    # not known to be, and the file loads unrepacked. SmolLM2 Q4_0 repacks exactly everywhere.
    patched = "CPU : AVX2 = 1 | REPACK_Q4_K_INVARIANT = 1 | REPACK = 1 |"
    stock = "CPU : AVX2 = 1 | REPACK = 1 |"
    monkeypatch.setattr(backend.build, "system_info", lambda: patched)
    assert backend.repack_is_exact(gemma_path) is True
    assert backend.repack_is_exact(smollm2_q4_0_path) is True
    assert 12 not in backend.repack_inexact_types() and 20 in backend.repack_inexact_types()  # Q4_K, IQ4_NL
    monkeypatch.setattr(backend.build, "system_info", lambda: stock)
    assert backend.repack_is_exact(gemma_path) is False
    assert backend.repack_is_exact(smollm2_q4_0_path) is True
    assert backend.repack_is_exact(gemma_path.with_name("no-such-file.gguf")) is False


@pytest.fixture(scope="module")
def quant_cols() -> ctypes.CDLL:
    for kind in QUANT_COLS:
        require_patch(f"{kind.upper()}_COLS", f"multi-column {kind} kernel", needs=("AVX2",), x86_only=True)
    lib = _libggml_cpu()
    lib.ggml_cpu_init()  # fills the FP16 table the kernels read their scales through
    return lib


def _q4_1_row(rng: np.random.Generator, n: int) -> bytes:
    """One Q4_1 weight row: random scales, negative mins, random nibbles."""
    return b"".join(np.float16(rng.random() * 0.02).tobytes() + np.float16(-rng.random() * 0.2).tobytes()
                    + rng.integers(0, 256, QK8_1 // 2, dtype=np.uint8).tobytes() for _ in range(n // QK8_1))


def _q6_k_row(rng: np.random.Generator, n: int) -> bytes:
    """One Q6_K weight row: random low and high bits, signed 8-bit sub-block scales, a random scale."""
    return b"".join(rng.integers(0, 256, QK_K // 2 + QK_K // 4, dtype=np.uint8).tobytes()
                    + rng.integers(-128, 128, QK_K // 16, dtype=np.int8).tobytes()
                    + np.float16(rng.random() * 0.01).tobytes() for _ in range(n // QK_K))


def _q5_k_row(rng: np.random.Generator, n: int) -> bytes:
    """One Q5_K weight row: random scales, random 6-bit sub-block scales and mins, random bits."""
    return b"".join(np.float16(rng.random() * 0.01).tobytes() + np.float16(rng.random() * 0.01).tobytes()
                    + rng.integers(0, 256, 12 + QK_K // 8 + QK_K // 2, dtype=np.uint8).tobytes()
                    for _ in range(n // QK_K))


# weight type: (its row, the activation blocks' size and bytes, the quantizer and the two kernels)
QUANT_COLS = {
    "q4_1": (_q4_1_row, QK8_1, Q8_1_BYTES, "quantize_row_q8_1", "ggml_vec_dot_q4_1_q8_1"),
    "q5_K": (_q5_k_row, QK_K, Q8_K_BYTES, "quantize_row_q8_K", "ggml_vec_dot_q5_K_q8_K"),
    "q6_K": (_q6_k_row, QK_K, Q8_K_BYTES, "quantize_row_q8_K", "ggml_vec_dot_q6_K_q8_K"),
}


@pytest.mark.parametrize("kind", sorted(QUANT_COLS))
@pytest.mark.parametrize("n_cols", [1, 2, 3, 4])
def test_a_weight_row_sums_each_column_as_the_one_column_kernel_does(quant_cols, kind: str, n_cols: int) -> None:
    make_row, block, block_bytes, quantize, vec_dot = QUANT_COLS[kind]
    rng = np.random.default_rng(n_cols)
    for n in (block, 3 * block, 18 * block):
        row_bytes = block_bytes * (n // block)
        for _ in range(6):
            weights = ctypes.create_string_buffer(make_row(rng, n))
            scales = rng.choice([0.01, 1.0, 300.0], size=(n_cols, 1))
            act = (rng.standard_normal((n_cols, n)) * scales).astype(np.float32)
            cols = ctypes.create_string_buffer(row_bytes * n_cols)
            for c, column in enumerate(act):
                getattr(quant_cols, quantize)(column.ctypes.data_as(ctypes.c_void_p), ctypes.byref(cols, c * row_bytes),
                                              ctypes.c_int64(n))
            alone = np.zeros(n_cols, np.float32)
            for c in range(n_cols):
                getattr(quant_cols, vec_dot)(ctypes.c_int(n), ctypes.c_void_p(alone.ctypes.data + 4 * c),
                                             ctypes.c_size_t(0), weights, ctypes.c_size_t(0),
                                             ctypes.byref(cols, c * row_bytes), ctypes.c_size_t(0), ctypes.c_int(1))
            together = np.zeros(2 * n_cols, np.float32)  # written with a stride of 2, as a matmul's columns are
            getattr(quant_cols, vec_dot + "_cols")(ctypes.c_int(n), together.ctypes.data_as(ctypes.c_void_p),
                                                   ctypes.c_size_t(2), weights, cols, ctypes.c_size_t(row_bytes),
                                                   ctypes.c_int(n_cols))
            assert np.isfinite(alone).all() and np.abs(alone).max() > 0
            np.testing.assert_array_equal(together[::2], alone)
            assert not together[1::2].any()


@pytest.mark.parametrize("which", ["smollm2", "gemma"])
def test_batches_of_every_width_give_each_row_its_one_token_bits(quant_cols, which: str, smollm2_path: Path,
                                                                  gemma_path: Path) -> None:
    # The matmul cuts a batch's columns into blocks of 16 and those into groups of up to 4: widths 2
    # to 7 and 17 leave every remainder, and a row's logits must be the bits a one-token decode gives.
    # SmolLM2 is Q4_1 throughout; nine of Gemma 3's FFN down projections are Q6_K. The output matrix's
    # rows go in SMALL_BATCH_CHUNKS chunks per thread, shared among a 40-token batch's three blocks of
    # columns: fewer along the rows than for a 17-token batch, and every row must still agree.
    model = backend.Model(smollm2_path if which == "smollm2" else gemma_path, n_gpu_layers=0)
    ctx = backend.Context(model, n_ctx=512, n_batch=64)
    try:
        prompt = model.tokenize("Rename every variable in this function and keep its comments: def f(a, b):")
        ctx.append(prompt)
        pos0 = len(ctx.tokens)
        draft = (prompt * 3)[1:41]
        alone = []
        for token in draft:
            ctx.append([token])
            alone.append(ctx.logits(0).copy())
        ctx.rollback_to(pos0)
        for width in (2, 3, 4, 5, 6, 7, 17, 40):
            ctx.decode(draft[:width], range(pos0, pos0 + width), outputs=[True] * width)
            for i in range(width):
                np.testing.assert_array_equal(ctx.logits(i), alone[i], err_msg=f"row {i} of a {width}-token batch")
            ctx.remove_seq(0, pos0)
    finally:
        ctx.close()
        model.close()


# A child's ggml reads GGML_CPU_SMALL_BATCH_CHUNKS once: the digest of a prompt's last logits row and of a
# 5-token batch's rows on 1, 2 and 3 threads, and the chunks per thread the build reports.
_DIGEST_CHILD = r"""
import hashlib, json, sys
import numpy as np
from localspec import backend
from localspec.backend.selftest import build_info
model = backend.Model(sys.argv[1], n_gpu_layers=0)
prompt = model.tokenize("Rename every variable in this function and keep its comments: def f(a, b):")
digests = {}
for n_threads in (1, 2, 3):
    ctx = backend.Context(model, n_ctx=256, n_batch=64, n_threads=n_threads)
    ctx.append(prompt)
    rows = [ctx.logits(-1).copy()]
    pos = len(ctx.tokens)
    ctx.decode(prompt[1:6], range(pos, pos + 5), outputs=[True] * 5)
    rows += [ctx.logits(i).copy() for i in range(5)]
    assert np.isfinite(rows).all() and np.abs(rows).max() > 0
    digests[n_threads] = hashlib.sha256(np.stack(rows).tobytes()).hexdigest()
    ctx.close()
print(json.dumps({"chunks": build_info()["small_batch_chunks"], "digests": digests}))
"""


def _logit_digests(model: Path, **env: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", _DIGEST_CHILD, str(model)], capture_output=True, text=True,
                          timeout=600, env={**os.environ, **env})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("which", ["smollm2", "gemma"])
def test_a_decode_gives_the_same_bits_on_any_number_of_threads(which: str, smollm2_path: Path,
                                                                gemma_path: Path) -> None:
    # Threads share out a matmul's rows in chunks whose number follows the thread count (for a batch of
    # fewer than 256 tokens, SMALL_BATCH_CHUNKS per thread): each row must come out alike however cut.
    found = _logit_digests(smollm2_path if which == "smollm2" else gemma_path)
    assert len(set(found["digests"].values())) == 1, found


def test_our_matmul_chunks_and_upstreams_give_the_same_bits(gemma_path: Path) -> None:
    # GGML_CPU_SMALL_BATCH_CHUNKS=0 gives a small batch's matmul upstream's many small chunks again.
    # Only the speed may differ, never a logit.
    require_patch("SMALL_BATCH_CHUNKS", "matmul chunking")
    found = {s: _logit_digests(gemma_path, GGML_CPU_SMALL_BATCH_CHUNKS=s) for s in ("0", "16", "3")}
    assert [found[s]["chunks"] for s in ("0", "16", "3")] == [0, 16, 3]  # the switch was read
    assert len({d for f in found.values() for d in f["digests"].values()}) == 1, found


QK8_0 = 32
Q8_0_BYTES = 2 + QK8_0  # block_q8_0: d, qs


@pytest.fixture(scope="module")
def q8_0_cols() -> ctypes.CDLL:
    require_patch("Q8_0_COLS", "multi-column Q8_0 kernel", needs=("AVX512", "AVX512_VNNI"), x86_only=True)
    lib = _libggml_cpu()
    lib.ggml_cpu_init()
    return lib


def _q8_0_row(rng: np.random.Generator, n: int) -> tuple[bytes, np.ndarray]:
    """A Q8_0 row of ``n`` values (random scales, every byte a quantizer writes) and the values it holds."""
    d = (rng.random(n // QK8_0) * 0.02).astype(np.float16)
    qs = rng.integers(-127, 128, (n // QK8_0, QK8_0), dtype=np.int8)
    return b"".join(s.tobytes() + q.tobytes() for s, q in zip(d, qs)), (d.astype(np.float64)[:, None] * qs).ravel()


@pytest.mark.parametrize("n_cols", [1, 2, 3, 4])
def test_a_q8_0_row_gives_each_column_its_one_column_bits_and_the_exact_dot(q8_0_cols, n_cols: int) -> None:
    # Two blocks go through each 512-bit step and an odd last block apart (1, 3 and 21 blocks), so each
    # column count meets both; the one-column vec_dot (what a lone token takes) must agree to the bit,
    # and every result with the dot of the values the blocks hold.
    rng = np.random.default_rng(10 + n_cols)
    for n in (QK8_0, 2 * QK8_0, 3 * QK8_0, 20 * QK8_0, 21 * QK8_0):
        row_bytes = Q8_0_BYTES * (n // QK8_0)
        for _ in range(6):
            weights, w = _q8_0_row(rng, n)
            columns = [_q8_0_row(rng, n) for _ in range(n_cols)]
            cols = ctypes.create_string_buffer(b"".join(raw for raw, _ in columns))
            exact = np.array([w @ values for _, values in columns])
            alone = np.zeros(n_cols, np.float32)
            for c in range(n_cols):
                q8_0_cols.ggml_vec_dot_q8_0_q8_0(ctypes.c_int(n), ctypes.c_void_p(alone.ctypes.data + 4 * c),
                                                 ctypes.c_size_t(0), ctypes.c_char_p(weights), ctypes.c_size_t(0),
                                                 ctypes.byref(cols, c * row_bytes), ctypes.c_size_t(0), ctypes.c_int(1))
            together = np.zeros(2 * n_cols, np.float32)  # written with a stride of 2, as a matmul's columns are
            q8_0_cols.ggml_vec_dot_q8_0_q8_0_cols(ctypes.c_int(n), together.ctypes.data_as(ctypes.c_void_p),
                                                  ctypes.c_size_t(2), ctypes.c_char_p(weights), cols,
                                                  ctypes.c_size_t(row_bytes), ctypes.c_int(n_cols))
            np.testing.assert_array_equal(together[::2], alone)
            assert not together[1::2].any()
            np.testing.assert_allclose(alone, exact, rtol=1e-5, atol=1e-5 * np.abs(exact).max())
