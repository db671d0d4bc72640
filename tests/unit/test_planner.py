"""GPU memory planning, checked against byte counts worked out by hand, and the `plan` command."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from localspec.errors import InvalidOptionError
from localspec.models.gguf_info import GGUFInfo, read_info
from model_shapes import LLAMA_1B, LLAMA_70B, QWEN3_06B, QWEN3_14B, synthetic
from localspec.commands.flags import parse_size
from localspec.commands.plan import format_plan
from localspec.models.memory import GIB, compute_buffer_bytes, kv_cache_bytes, place
from localspec.models.planner import plan


# --- hand-checked byte counts -------------------------------------------------------------------


def test_qwen3_14b_with_0_6b_draft_fits_fully_at_40960() -> None:
    p = plan(QWEN3_14B, QWEN3_06B, vram_bytes=24 * GIB)
    assert p.n_ctx == p.requested_ctx == 40960  # the target's training context, a multiple of 256
    t, d = p.target, p.draft
    assert d is not None
    # KV per cell: layers x (K + V) x n_head_kv x head_dim x 2 bytes (f16).
    # target 40 x 2 x 8 x 128 x 2 = 163,840 B/cell; x 40960 cells = 6,710,886,400 B (6.25 GiB)
    assert t.kv_gpu_bytes == 6_710_886_400
    # draft  28 x 2 x 8 x 128 x 2 = 114,688 B/cell; x 40960 cells = 4,697,620,480 B (4.375 GiB)
    assert d.kv_gpu_bytes == 4_697_620_480
    # GPU weights: everything but the token embedding, which llama.cpp keeps on the CPU.
    # target 40 x 180,000,000 + output 638,131,200 + norms 1,000,000 = 7,839,131,200
    assert (t.weights_gpu_bytes, t.weights_cpu_bytes) == (7_839_131_200, 437_575_680)
    # draft 28 x 16,711,680 + a GPU copy of the tied embedding 165,306,368 = 633,233,408
    assert (d.weights_gpu_bytes, d.weights_cpu_bytes) == (633_233_408, 165_306_368)
    # Compute: the logits stage is largest: 4 B x n_ubatch tokens x (n_vocab + n_embd) + 4 MiB, with
    # n_ubatch 512 for the target and 128 for the draft (DRAFT_N_UBATCH).
    # target 2048 x (151936 + 5120) = 321,650,688 + 4,194,304 = 325,844,992
    # draft   512 x (151936 + 1024) =  78,315,520 + 4,194,304 =  82,509,824
    assert (t.compute_bytes, d.compute_bytes) == (325_844_992, 82_509_824)
    # Sum: 7,839,131,200 + 6,710,886,400 + 325,844,992 + 633,233,408 + 4,697,620,480 + 317,456,384
    assert p.gpu_bytes == 20_289_226_304  # 18.9 GiB of the 23 GiB left after the 1 GiB reserve
    assert (t.n_gpu_layers, d.n_gpu_layers) == (-1, -1) and t.full_offload
    assert p.notes == () and p.advice == ()  # Q8_0, 4% of the target, same training context


def test_context_shrinks_to_fit_16_gib() -> None:
    p = plan(QWEN3_14B, QWEN3_06B, vram_bytes=16 * GIB)
    # Independent of context: weights 7,839,131,200 + 633,233,408 and compute 325,844,992 + 82,509,824
    # = 8,880,719,424. Usable: 15 GiB = 16,106,127,360, leaving 7,225,407,936 for the KV caches at
    # 163,840 + 114,688 = 278,528 B per cell: 25,941.5 cells, on llama.cpp's 256 grid 101 x 256 = 25,856.
    assert p.n_ctx == 25_856
    assert p.target.kv_gpu_bytes + p.draft.kv_gpu_bytes == 25_856 * 278_528  # 7,201,619,968
    assert p.target.full_offload and p.draft.full_offload
    assert p.notes[0].startswith("context reduced from 40960 to 25856 so both models fit on the GPU")
    assert plan(QWEN3_14B, QWEN3_06B, vram_bytes=16 * GIB, n_ctx=26_112).n_ctx == 25_856  # one step more fails


def test_70b_target_is_partially_offloaded() -> None:
    p = plan(LLAMA_70B, LLAMA_1B, vram_bytes=24 * GIB)
    assert (p.requested_ctx, p.n_ctx) == (8192, 4096)  # even the floor does not fit everything
    d, t = p.draft, p.target
    assert d is not None and d.full_offload
    # Draft at 4096 cells: weights 16 x 60,000,000 + tied copy 279,085,056 = 1,239,085,056;
    # KV 16 x 4096 x (2 x 8 x 64 x 2 = 2048 B) = 134,217,728; compute (n_ubatch 128) 512 x (128256 + 2048)
    # + 4 MiB = 70,909,952; total 1,444,212,736.
    assert d.gpu_bytes == 1_444_212_736
    # Target with the output layer and k layers: output 860,000,000 + norms 2,000,000 + compute
    # 2048 x (128256 + 8192) + 4 MiB = 283,639,808 -> 1,145,639,808, plus per layer 500,000,000 +
    # KV 4096 x (2 x 8 x 128 x 2 = 4096 B) = 516,777,216. Left after the draft: 24,696,061,952 -
    # 1,444,212,736 = 23,251,849,216; (23,251,849,216 - 1,145,639,808) / 516,777,216 = 42.8 -> 42.
    assert (t.gpu_layers, t.output_on_gpu, t.n_gpu_layers) == (42, True, 43)
    assert t.gpu_bytes == 1_145_639_808 + 42 * 516_777_216
    assert t.kv_cpu_bytes == 38 * 4096 * 4096
    assert t.weights_cpu_bytes == 590_000_000 + 38 * 500_000_000
    notes = "\n".join(p.notes)
    assert "context reduced from 8192 to the 4096-token floor" in notes
    assert "draft kept fully on the GPU first" in notes
    assert "partial offload of the target: 42/80 layers and the output layer on the GPU (n_gpu_layers=43)" in notes
    table = format_plan(p)
    assert "42/80 +out" in table and " 43 " in table


def test_nothing_of_the_target_fits() -> None:
    p = plan(LLAMA_70B, LLAMA_1B, vram_bytes=2 * GIB)  # 1 GiB usable: less than the draft alone
    assert (p.target.gpu_layers, p.target.output_on_gpu, p.target.n_gpu_layers) == (0, False, 0)
    assert p.target.gpu_bytes == 0
    # Draft: output layer (the tied embedding copy) 279,085,056 + compute 70,909,952 = 349,995,008;
    # per layer 60,000,000 + KV 4096 x 2048 = 68,388,608; (1,073,741,824 - 349,995,008) / 68,388,608 = 10.6 -> 10.
    assert (p.draft.gpu_layers, p.draft.n_gpu_layers) == (10, 11)
    assert any("runs entirely on the CPU" in n for n in p.notes)


def test_quantized_kv_cache() -> None:
    # q8_0 rows: 1024 elements -> 32 blocks x 34 B = 1088 B; target 40 x 2 x 1088 = 87,040 B per cell.
    assert kv_cache_bytes(QWEN3_14B, 40960, "q8_0") == 87_040 * 40960
    assert plan(QWEN3_14B, QWEN3_06B, kv_type="Q8_0").kv_type == "q8_0"


def test_compute_without_flash_attention_grows_with_context() -> None:
    """Without flash attention a ubatch's KQ scores (F32, 512 rows x n_ctx cells x n_head) are held whole,
    so the buffer grows with the context; with it nothing does. The planner counts them: a 16 GiB card
    that holds the 14B with all 40k cells under flash attention holds fewer cells without it."""
    scores = 4 * 512 * 40960 * QWEN3_14B.n_head
    assert compute_buffer_bytes(QWEN3_14B, 40960, flash_attn=False) >= scores
    assert compute_buffer_bytes(QWEN3_14B, 4096, flash_attn=False) < scores / 8
    assert compute_buffer_bytes(QWEN3_14B, 40960) == compute_buffer_bytes(QWEN3_14B, 4096) < scores / 8
    with_fa = plan(QWEN3_14B, n_ctx=40960, vram_bytes=16 * GIB)
    without = plan(QWEN3_14B, n_ctx=40960, vram_bytes=16 * GIB, flash_attn=False)
    assert with_fa.n_ctx == 40960 and without.n_ctx < 40960
    assert without.target.gpu_layers == with_fa.target.gpu_layers  # the context gave way, not the layers


def test_advice_for_a_poor_draft() -> None:
    q4 = dataclasses.replace(QWEN3_06B, file_type="Q4_K_M", bits_per_weight=4.85, context_length=4096)
    p = plan(QWEN3_14B, q4, n_ctx=8192)
    assert any("4.8 bits per weight (Q4_K_M, below 8)" in a and "Q8_0" in a for a in p.advice)
    assert any("trained on contexts up to 4096 tokens, shorter than the chosen 8192" in a for a in p.advice)
    big = dataclasses.replace(QWEN3_06B, n_params=4_000_000_000)
    assert any("27% of the target's" in a for a in plan(QWEN3_14B, big).advice)


def test_invalid_options() -> None:
    with pytest.raises(InvalidOptionError, match="unknown KV cache type 'q3'"):
        plan(QWEN3_14B, kv_type="q3")
    with pytest.raises(InvalidOptionError, match="leaves nothing after the 1.00 GiB reserve"):
        plan(QWEN3_14B, vram_bytes=GIB)
    with pytest.raises(InvalidOptionError, match="too small"):
        plan(QWEN3_14B, n_ctx=8)
    with pytest.raises(InvalidOptionError, match="a q8_0 KV cache needs flash attention"):
        plan(QWEN3_14B, kv_type="q8_0", flash_attn=False)


# --- the real models' metadata ------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2(smollm2_path: Path) -> GGUFInfo:
    return read_info(smollm2_path)


@pytest.fixture(scope="module")
def gemma(gemma_path: Path) -> GGUFInfo:
    return read_info(gemma_path)


def test_smollm2_drafting_for_itself(smollm2: GGUFInfo) -> None:
    p = plan(smollm2, smollm2)
    assert p.n_ctx == 8192 and p.target.n_gpu_layers == p.draft.n_gpu_layers == -1
    # 30 layers x 2 x 3 KV heads x 64 x 2 B = 23,040 B/cell x 8192 = 188,743,680 (llama.cpp logs 90 MiB at 4096).
    assert p.target.kv_gpu_bytes == 188_743_680 and kv_cache_bytes(smollm2, 4096) == 90 << 20
    # Tied embedding: the GPU holds every tensor (the output copy), the CPU the embedding itself.
    assert p.target.weights_gpu_bytes == smollm2.tensor_bytes
    assert p.target.weights_cpu_bytes == smollm2.token_embd_bytes
    # llama.cpp logs a 98.25 MiB compute buffer: 2048 x (49152 + 576) + 4 MiB = 101.1 MiB.
    assert p.target.compute_bytes == 2048 * (49152 + 576) + (4 << 20)
    assert any("100% of the target" in a for a in p.advice)


def test_gemma_sliding_window_cache(gemma: GGUFInfo) -> None:
    # llama.cpp's default swa_full caches every cell in all 18 layers: 1 KV head x 256 x 2 x 2 B =
    # 1024 B/cell, so 18 x 4096 x 1024 = 72 MiB at 4096 (what llama.cpp logs: 12 + 60 MiB).
    assert kv_cache_bytes(gemma, 4096) == 72 << 20
    # Without it the 15 window layers keep pad256(512 + 512) = 1024 cells: 3 x 32768 x 1024 + 15 x 1024 x 1024.
    assert kv_cache_bytes(gemma, 32768, swa_full=False) == 100_663_296 + 15_728_640
    p = plan(gemma, None)
    assert p.n_ctx == 32768 and p.target.kv_gpu_bytes == 18 * 32768 * 1024
    assert len(p.notes) == 1 and "15 of 18 layers use a 512-token sliding window" in p.notes[0]
    assert "(swa_full off would save 0.45 GiB)" in p.notes[0]
    lean = plan(gemma, None, swa_full=False)
    assert lean.target.kv_gpu_bytes == 116_391_936 and "caches only 1024 cells" in lean.notes[0]


def test_partial_placement_of_a_real_model(gemma: GGUFInfo) -> None:
    # The last layers go first: 3 layers on the GPU are 15, 16 and 17 (17 is a global layer).
    placed = place(gemma, 32768, 3, True)
    assert placed.n_gpu_layers == 4
    assert placed.kv_gpu_bytes == kv_cache_bytes(gemma, 32768, layers=range(15, 18))
    assert placed.weights_gpu_bytes == sum(gemma.layer_bytes[15:]) + gemma.token_embd_bytes + gemma.other_bytes


# --- sizes ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "size"), [
    ("24GiB", 24 * GIB), ("24G", 24 * GIB), ("24", 24 * GIB), ("24gib", 24 * GIB), (" 24 GiB ", 24 * GIB),
    ("24000MB", 24_000_000_000), ("24GB", 24_000_000_000), ("512MiB", 512 << 20), ("1.5G", 3 * GIB // 2),
    ("1T", 1 << 40), ("4096b", 4096),
])
def test_parse_size(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "lots", "24XB", "-1", "24 G B", "0", "0.0000001b"])
def test_parse_size_rejects_junk(text: str) -> None:
    with pytest.raises(InvalidOptionError, match=r"^--vram '.*' (is not a size|must be more than zero)"):
        parse_size(text)


@pytest.fixture(scope="module")
def tiny_recurrent(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The tiny random LFM2 (hybrid) and Mamba (recurrent) the engine tests use."""
    from hybrid_model import write_lfm2
    from mamba_model import write_mamba

    folder = tmp_path_factory.mktemp("recurrent")
    return write_lfm2(folder / "lfm2-tiny.gguf"), write_mamba(folder / "mamba-tiny.gguf")


def test_recurrent_state_from_gguf_metadata(tiny_recurrent: tuple[Path, Path]) -> None:
    from localspec.models.memory import recurrent_layers, recurrent_state_bytes

    lfm2, mamba = (read_info(p) for p in tiny_recurrent)
    # LFM2: conv, conv, attention, conv, attention, conv; a conv layer keeps n_embd x (l_cache - 1) floats.
    assert recurrent_layers(lfm2) == (True, True, False, True, False, True)
    assert recurrent_state_bytes(lfm2) == 4 * 4 * 64 * (3 - 1)
    # Only the two attention layers have a KV cache: 256 cells x K and V of 2 heads x 16 dims in f16.
    assert kv_cache_bytes(lfm2, 256) == 2 * 256 * 2 * (2 * 16 * 2)
    # Mamba: every layer; (d_conv - 1) x d_inner conv floats and d_state x d_inner state floats.
    assert recurrent_layers(mamba) == (True, True)
    assert recurrent_state_bytes(mamba) == 4 * 2 * (3 * 128 + 16 * 128)
    assert kv_cache_bytes(mamba, 256) == 0
    assert recurrent_state_bytes(dataclasses.replace(lfm2, hparams={})) == 0  # no recurrent keys: a transformer


def test_snapshots_are_in_the_plan(tiny_recurrent: tuple[Path, Path]) -> None:
    lfm2 = read_info(tiny_recurrent[0])
    p = plan(lfm2, lfm2, n_ctx=1024)
    one = 4 * 4 * 64 * 2
    # The target keeps its state and 16 snapshots of it; the draft two copies (it drafts on a second sequence).
    assert p.target.state_copies == 17 and p.target.state_gpu_bytes == 17 * one and p.target.state_cpu_bytes == 0
    assert p.draft is not None and p.draft.state_copies == 2 and p.draft.state_gpu_bytes == 2 * one
    assert p.target.gpu_bytes == (p.target.weights_gpu_bytes + p.target.kv_gpu_bytes + p.target.compute_bytes
                                  + 17 * one)
    assert any("16 snapshots" in note and "caps the draft length" in note for note in p.notes)
    # Offloading no layer leaves the state on the CPU with its layers.
    cpu = place(lfm2, 1024, 0, False, state_copies=17)
    assert cpu.state_gpu_bytes == 0 and cpu.state_cpu_bytes == 17 * one


def test_qwen35_like_hybrid_state_and_kv(tiny_recurrent: tuple[Path, Path]) -> None:
    """A Qwen3.5-shaped hybrid (no file at hand): every fourth layer attends, the rest run a gated delta net."""
    from localspec.models.memory import recurrent_layers, recurrent_state_bytes

    base = synthetic("qwen35-like", n_layers=48, n_embd=5120, n_head=24, n_head_kv=4, head_dim=256, n_ff=17408,
                     n_vocab=248320, context_length=262144, layer_bytes=300_000_000, token_embd_bytes=700_000_000,
                     output_bytes=700_000_000, other_bytes=1_000_000, n_params=27_000_000_000, file_type="Q4_K_M")
    info = dataclasses.replace(base, architecture="qwen35", hparams={
        "full_attention_interval": 4, "ssm.conv_kernel": 4, "ssm.inner_size": 6144, "ssm.state_size": 128,
        "ssm.group_count": 16, "ssm.time_step_rank": 48})
    layers = recurrent_layers(info)
    assert sum(layers) == 36 and not layers[3] and layers[4]
    per_layer = 4 * (3 * (6144 + 2 * 16 * 128) + 128 * 6144)
    assert recurrent_state_bytes(info) == 36 * per_layer
    assert kv_cache_bytes(info, 4096) == 12 * 4096 * 2 * (4 * 256 * 2)
    p = plan(info, n_ctx=4096, vram_bytes=48 * GIB)
    assert p.target.state_gpu_bytes == 17 * 36 * per_layer  # about 2 GiB for the snapshots


def test_the_target_rows_a_drafter_keeps_are_counted_in_system_ram() -> None:
    """An EAGLE-3 or DFlash draft keeps the target's tapped layer inputs for its next catch-up (an MTP
    head the hidden rows): one row a position, each len(target_layers) x the target's width in float32,
    at most DRAFT_ROWS_MAX_BYTES. The plan counts them in system RAM and says so."""
    from localspec.models.memory import DRAFT_ROWS_MAX_BYTES, draft_rows_bytes

    eagle3 = dataclasses.replace(QWEN3_06B, architecture="eagle3", hparams={"target_layers": [2, 20, 37]})
    dflash = dataclasses.replace(QWEN3_06B, architecture="dflash", hparams={"target_layers": [1, 9, 17, 25, 33]})
    width = QWEN3_14B.n_embd * 4  # one layer's input at one position, float32
    assert draft_rows_bytes(QWEN3_14B, eagle3, 1024, mtp=False) == 1024 * 3 * width
    assert draft_rows_bytes(QWEN3_14B, dflash, 512, mtp=False) == 512 * 5 * width
    assert draft_rows_bytes(QWEN3_14B, eagle3, 40960, mtp=False) == DRAFT_ROWS_MAX_BYTES  # the cap
    assert draft_rows_bytes(QWEN3_14B, None, 1024, mtp=True) == 1024 * width  # the MTP head's hidden rows
    assert draft_rows_bytes(QWEN3_14B, QWEN3_06B, 1024, mtp=False) == 0  # a draft model reads none

    p = plan(QWEN3_14B, eagle3, vram_bytes=24 * GIB, n_ctx=1024)
    assert p.draft_rows_bytes == 1024 * 3 * width
    assert any(n.startswith(f"the drafter keeps up to {p.draft_rows_bytes / GIB:.2f} GiB of the target's rows")
               for n in p.notes), p.notes
    ram = sum(m.weights_cpu_bytes + m.kv_cpu_bytes + m.state_cpu_bytes for m in (p.target, p.draft) if m)
    shown = [line for line in format_plan(p).splitlines() if line.startswith("system RAM:")]
    assert shown == [f"system RAM: {(ram + p.draft_rows_bytes) / GIB:.2f} GiB (weights left on the CPU, including "
                     "token embeddings, and their KV cache, and the target's rows the drafter keeps "
                     f"({p.draft_rows_bytes / GIB:.2f} GiB))"]
    assert plan(QWEN3_14B, QWEN3_06B, vram_bytes=24 * GIB, n_ctx=1024).draft_rows_bytes == 0
