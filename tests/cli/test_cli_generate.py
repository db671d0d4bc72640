"""`localspec generate` as a user runs it: a real process, real models, stdout vs stderr."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from cli import assert_clean_error, localspec


def test_json_output_parses_and_is_consistent(smollm2_path, smollm2_q4_0_path):
    proc = localspec("generate", str(smollm2_path), "--draft", str(smollm2_q4_0_path), "--draft-max", "4",
                     "--prompt", "The three primary colours are", "--max-tokens", "48", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    for key in ("text", "finish_reason", "tokens", "stats"):
        assert key in out
    s = out["stats"]
    for key in ("drafted", "accepted", "acceptance_rate", "steps", "tokens_per_step", "tokens_per_second",
                "draft_ms", "verify_ms", "python_ms"):
        assert key in s
    assert out["tokens"] == s["tokens"] == len(out["token_ids"])
    assert 0 <= s["accepted"] <= s["drafted"]
    assert s["acceptance_rate"] == pytest.approx(s["accepted"] / s["drafted"])
    assert s["tokens_per_step"] == pytest.approx(s["tokens"] / s["steps"])
    assert s["steps"] <= s["tokens"] + 1
    assert out["finish_reason"] in ("length", "stop")
    assert out["tokens"] <= 48
    assert s["tokens_per_second"] > 0
    # What the controller decided: every step is a drafting, plain or probe step; k was fixed at 4.
    c = s["control"]
    assert c["draft_steps"] + c["plain_steps"] + c["probes"] == s["steps"]
    assert 0 < c["mean_draft_len"] <= 4 and "draft length fixed at 4" in c["last_reason"]  # shorter near max-tokens
    assert c["expected_gain"] > 0 and c["measured_gain"] > 0


def test_text_streams_to_stdout_and_stats_to_stderr(smollm2_path):
    proc = localspec("generate", str(smollm2_path), "--max-tokens", "16", stdin="Hello, my name is")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip()
    assert "tok/s" in proc.stderr and "tok/s" not in proc.stdout


def test_chat_mode_uses_the_template(smollm2_path):
    from localspec.backend import Model
    from localspec.chat import Message, render_chat

    proc = localspec("generate", str(smollm2_path), "--chat", "--system", "Be brief.", "--prompt", "Say hello.",
                     "--max-tokens", "24", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert "<|im_start|>" not in out["text"]
    assert out["finish_reason"] in ("stop", "length")
    # The prompt the model saw is the template's rendering, special tokens parsed.
    model = Model(smollm2_path)
    try:
        text = render_chat(model.chat_template(), [Message("system", "Be brief."), Message("user", "Say hello.")])
        want = model.tokenize(text, add_special=True, parse_special=True)
        bare = model.tokenize("Say hello.", add_special=True)
    finally:
        model.close()
    assert out["stats"]["prompt_tokens"] == len(want) > len(bare) + 6


def test_missing_model_file(tmp_path):
    assert_clean_error(localspec("generate", str(tmp_path / "nope.gguf"), "-p", "x"), "not found")


def test_file_that_is_not_gguf(tmp_path):
    bogus = tmp_path / "notes.gguf"
    bogus.write_text("these are my notes, not a model\n")
    assert_clean_error(localspec("generate", str(bogus), "-p", "x"), "gguf")


def test_truncated_gguf(tmp_path, smollm2_path):
    cut = tmp_path / "cut.gguf"
    with smollm2_path.open("rb") as src:
        cut.write_bytes(src.read(smollm2_path.stat().st_size // 2))
    assert_clean_error(localspec("generate", str(cut), "-p", "x"), "truncated")


def test_a_draft_of_another_tokenizer_drafts_by_text(smollm2_path, gemma_path):
    """Issue 43: no refusal, one notice line on stderr, the reply on stdout."""
    proc = localspec("generate", str(smollm2_path), "--draft", str(gemma_path), "-p", "The capital of France is",
                     "--max-tokens", "8", "--draft-max", "3")
    assert proc.returncode == 0, proc.stderr
    notices = [ln for ln in proc.stderr.splitlines() if "drafts by text" in ln]
    # The models as the user named them (here their files), not their GGUF general.name.
    assert len(notices) == 1 and notices[0].startswith(
        f"localspec: draft {gemma_path.name} has another tokenizer than {smollm2_path.name}: it drafts by text")
    assert proc.stdout.strip()
    assert "; draft model: another tokenizer, drafting by text" in proc.stderr  # the stats name the pair kind


def test_prompt_longer_than_context(smollm2_path):
    proc = localspec("generate", str(smollm2_path), "--ctx", "256", "-p", "word " * 400)
    assert_clean_error(proc, "context")


@pytest.mark.parametrize("option,value,name", [
    ("--temp", "-1", "temp"), ("--top-p", "1.5", "top-p"), ("--top-k", "-3", "top-k"),
    ("--min-p", "1.0", "min-p"), ("--max-tokens", "0", "max-tokens"), ("--draft-max", "-2", "draft-max"),
    ("--ctx", "4", "ctx"), ("--temp", "nan", "temp"), ("--seed", "-1", "seed"), ("--p-min", "1.0", "draft-p-min"),
    ("--draft-p-min", "-0.1", "draft-p-min"), ("--draft-p-min", "nan", "draft-p-min"),
    # Malformed values are argparse's to refuse, still in one line.
    ("--top-k", "1.5", "top-k"), ("--temp", "abc", "temp"), ("--max-tokens", "many", "max-tokens"),
])
def test_out_of_range_options(smollm2_path, option, value, name):
    assert_clean_error(localspec("generate", str(smollm2_path), "-p", "x", option, value), name)


# Runs ``python -m localspec`` with Ctrl-C raising KeyboardInterrupt even where this test itself was started
# with SIGINT ignored (a background job of a non-interactive shell, nohup): Python keeps an inherited
# SIG_IGN, and the child would then ignore the interrupt as its parent does.
_WITH_CTRL_C = ("import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
                "runpy.run_module('localspec', run_name='__main__', alter_sys=True)")


def test_ctrl_c_stops_cleanly_and_prints_stats(smollm2_path, smollm2_q4_0_path):
    proc = subprocess.Popen(
        [sys.executable, "-c", _WITH_CTRL_C, "generate", str(smollm2_path), "--draft", str(smollm2_q4_0_path),
         "--max-tokens", "4000", "--ctx", "4096", "-p", "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11,"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.stdout is not None
    # Wait until text is streaming, then interrupt.
    deadline = time.time() + 120
    seen = ""
    while len(seen) < 40 and time.time() < deadline:
        char = proc.stdout.read(1)
        assert char, "the generation ended before it could be interrupted"
        seen += char
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()  # whatever happened, no generation is left running
    assert proc.returncode == 130
    assert "Traceback" not in err
    assert "finish: interrupted" in err
    assert "tok/s" in err
