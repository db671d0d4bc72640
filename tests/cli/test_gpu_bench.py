"""benchmarks/gpu: the committed tokenizer, the random-weight models, and the check's CPU dry run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

GPU_DIR = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu"
sys.path.insert(0, str(GPU_DIR))

import make_models  # noqa: E402
import tokenizer as tokenizer_file  # noqa: E402

TEXTS = [
    "Once upon a time, in a small village by the sea,",
    "def quicksort(items):\n    return sorted(items)  # naïve ünïcode 😀",
    "  leading spaces, 12345 digits,\ttabs and\nnewlines",
]


def test_tokenizer_file_is_small_and_complete() -> None:
    assert tokenizer_file.TOKENIZER_FILE.stat().st_size < 1_500_000
    tok = tokenizer_file.load()
    assert tok["model"] == "gpt2" and len(tok["tokens"]) == len(tok["token_type"]) == 49152
    assert tok["merges"] and "chat_template" in tok and tok["license"] == "apache-2.0"


@pytest.mark.parametrize("qtype", ["Q4_0", "Q8_0", "Q4_K", "Q6_K"])
def test_random_blocks_have_zero_mean_and_the_asked_std(qtype: str) -> None:
    import gguf

    blocks = make_models.random_blocks(np.random.default_rng(0), 64, 1024, qtype, 0.25)
    weights = gguf.dequantize(blocks, getattr(gguf.GGMLQuantizationType, qtype))
    assert weights.shape == (64, 1024)
    assert abs(float(weights.mean())) < 0.01
    assert float(weights.std()) == pytest.approx(0.25, rel=0.05)


def test_mtp_model_loads_its_nextn_layer(tiny_models: Path) -> None:
    from localspec.backend import Model
    from localspec.models.gguf_info import read_info

    info = read_info(tiny_models / "mtp-tiny.gguf")
    assert info.architecture == "glm4moe" and info.n_nextn_layers == 1 and info.has_mtp
    model = Model(tiny_models / "mtp-tiny.gguf", load_mtp=True)
    assert (model.n_layers, model.n_nextn_layers) == (make_models.MTP_SHAPES["tiny"].trunk.n_layer, 1)
    model.close()


def test_successor_never_leads_to_control_tokens() -> None:
    types = tokenizer_file.load()["token_type"]
    succ = make_models.successor(types, 1234)
    normal = np.flatnonzero(np.asarray(types) == 1)
    assert sorted(succ[normal].tolist()) == normal.tolist()  # a permutation of the ordinary tokens
    assert all(types[s] == 1 for s in succ)


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("gpu-models")
    make_models.main([str(out), "--tiny"])
    return out


def test_written_tokenizer_tokenizes_like_smollm2(tiny_models: Path, smollm2_path: Path) -> None:
    from localspec.backend import Model

    ours = Model(tiny_models / "target-tiny.gguf", vocab_only=True)
    real = Model(smollm2_path, vocab_only=True)
    for text in TEXTS:
        assert ours.tokenize(text) == real.tokenize(text)
        assert ours.detokenize(ours.tokenize(text)) == text
    chat = "<|im_start|>user\nHi<|im_end|>\n"
    assert ours.tokenize(chat, parse_special=True) == real.tokenize(chat, parse_special=True)
    assert (ours.bos, ours.eos, ours.n_vocab) == (real.bos, real.eos, real.n_vocab)
    assert ours.chat_template() == real.chat_template()


def test_tiny_random_model_decodes_finite_varied_logits(tiny_models: Path) -> None:
    from localspec.backend import Context, Model

    model = Model(tiny_models / "target-tiny.gguf")
    assert model.n_layers == make_models.SHAPES["tiny"].n_layer
    ctx = Context(model, n_ctx=256, n_threads=2)
    prompt = model.tokenize(TEXTS[0])
    ctx.append(prompt[:-1])
    last, out = prompt[-1], []
    for _ in range(32):
        ctx.decode([last], [len(ctx.tokens)])
        ctx.tokens.append(last)
        logits = np.array(ctx.logits(0))
        assert np.isfinite(logits).all() and logits.std() > 0.1
        last = int(logits.argmax())
        out.append(last)
    # The successor walk: no short loop, and mostly the hidden successor.
    assert len(set(out)) > 24
    succ = make_models.successor(tokenizer_file.load()["token_type"], 1234)
    follows = sum(succ[a] == b for a, b in zip(out, out[1:]))
    assert follows >= 0.5 * (len(out) - 1)


def test_check_runs_on_the_cpu(tiny_models: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import check

    # check.main sets these for its own run; set them here so the test's end puts the environment back.
    monkeypatch.setenv("LOCALSPEC_NO_HISTORY", "1")
    monkeypatch.setenv("LOCALSPEC_CACHE_DIR", str(tmp_path / "cache"))

    out = tmp_path / "results.json"
    rc = check.main([str(tiny_models), "--tiny", "--out", str(out), "--max-tokens", "12", "--rounds", "1",
                     "--cost-budget-s", "0.2", "--ctx", "1100", "--exact-n", "2", "--exact-tokens", "12",
                     "--curve-models", "tiny-k:Q4_K_M"])
    results = json.loads(out.read_text())
    assert rc == 0, results["errors"]
    assert results["offload_target"]["verdict"]
    assert set(results["verify_costs"]["depth_64"]["ms"]) == {str(k) for k in range(1, 33)}
    # Exactness: batches of 2..32 against one-token decodes (bit-identical on this CPU build), replies too.
    assert set(results["exactness"]["target"]["by_batch"]) == {str(b) for b in range(2, 33)}
    assert results["exactness"]["target"]["top_token_differs"] == 0
    assert results["exact_replies"]["draft-small"]["replies"] == 2
    # A curve-only model written while the check ran, measured, then deleted.
    assert set(results["curves"]["tiny-k Q4_K_M"]["depth_64"]["ms"]) == {str(k) for k in range(1, 33)}
    assert not list(tiny_models.glob("curve-*.gguf"))
    import report

    md = report.render(results, commit="abc", dry_run=True)
    assert "DRY RUN on the CPU" in md and "| tiny-k Q4_K_M |" in md and "## Exactness on this device" in md
    rows = results["speculative"]
    assert {"ngram k=8 echo", "draft-small auto free", "self k=4 free"} <= set(rows)
    assert rows["self k=4 free"]["alpha"] > 0.5  # the target agrees with itself
    # The MTP head's step cost, next to the draft's and the target's one-token decodes.
    mtp = results["mtp"]
    assert mtp["n_nextn_layers"] == 1
    assert set(mtp["depth_64"]["head_ms"]) == {"1", "2", "3", "4", "5"}
    assert all(ms > 0 for ms in mtp["depth_1024"]["head_ms"].values())
    assert mtp["head_vs_draft_small_k1"] > 0 and mtp["head_vs_target_k1"] > 0
