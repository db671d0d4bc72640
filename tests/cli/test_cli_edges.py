"""The edges of `localspec generate` a careless user finds (issue 9 §2, §5, §6): text that is not UTF-8,
stdout closed or full, SIGTERM/SIGHUP, and options that used to say one thing and do another.

Every test runs the real CLI in a subprocess on the real SmolLM2, as a user would.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


def localspec(*args: str | bytes, stdin: bytes | None = None, timeout: float = 300,
              **popen: object) -> subprocess.CompletedProcess:
    """Run the CLI; argv and stdin are bytes as a shell would pass them, stdout/stderr decoded leniently."""
    if "stdout" not in popen:
        popen["stdout"] = subprocess.PIPE
    proc = subprocess.run([sys.executable, "-m", "localspec", *args], input=stdin, stderr=subprocess.PIPE,
                          timeout=timeout, env=ENV, **popen)  # type: ignore[call-overload]
    proc.stdout = proc.stdout.decode("utf-8", "replace") if proc.stdout is not None else ""
    proc.stderr = proc.stderr.decode("utf-8", "replace")
    return proc


def stderr_lines(proc: subprocess.CompletedProcess) -> list[str]:
    return [ln for ln in proc.stderr.splitlines() if ln.strip()]


def assert_one_error_line(proc: subprocess.CompletedProcess, code: int, *needles: str) -> str:
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr
    lines = stderr_lines(proc)
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("localspec: error: "), lines[0]
    for needle in needles:
        assert needle.lower() in lines[0].lower(), lines[0]
    return lines[0]


def utf8_warnings(proc: subprocess.CompletedProcess) -> list[str]:
    return [ln for ln in stderr_lines(proc) if "not valid UTF-8" in ln]


# --- text that is not UTF-8 (§2) -----------------------------------------------------------------
def test_invalid_utf8_in_argv_is_replaced_and_said_once(smollm2_path: Path) -> None:
    bad = localspec("generate", str(smollm2_path), b"-p", b"Say hello \xff", b"--system", b"Be brief \xfe\xfe",
                    b"--stop", b"\xc3(", "--max-tokens", "6", "--json")
    assert bad.returncode == 0, bad.stderr
    assert "Traceback" not in bad.stderr
    warnings = utf8_warnings(bad)
    assert len(warnings) == 1, bad.stderr
    assert "--prompt" in warnings[0] and "--system" in warnings[0] and "--stop" in warnings[0]
    # The model saw exactly the text with U+FFFD where the bytes were invalid.
    good = localspec("generate", str(smollm2_path), "-p", "Say hello \ufffd", "--system", "Be brief \ufffd\ufffd",
                     "--stop", "\ufffd(", "--max-tokens", "6", "--json")
    assert good.returncode == 0 and not utf8_warnings(good), good.stderr
    got, want = json.loads(bad.stdout), json.loads(good.stdout)
    assert got["token_ids"] == want["token_ids"]
    assert got["stats"]["prompt_tokens"] == want["stats"]["prompt_tokens"]


def test_invalid_utf8_on_stdin_is_replaced_and_said_once(smollm2_path: Path) -> None:
    bad = localspec("generate", str(smollm2_path), "--max-tokens", "6", "--json", stdin=b"Once upon a \xff\xfe time")
    assert bad.returncode == 0, bad.stderr
    assert "Traceback" not in bad.stderr
    warnings = utf8_warnings(bad)
    assert len(warnings) == 1 and "stdin" in warnings[0], bad.stderr
    good = localspec("generate", str(smollm2_path), "--max-tokens", "6", "--json",
                     stdin="Once upon a \ufffd\ufffd time".encode())
    assert not utf8_warnings(good), good.stderr
    assert json.loads(bad.stdout)["token_ids"] == json.loads(good.stdout)["token_ids"]
    assert json.loads(bad.stdout)["stats"]["prompt_tokens"] == json.loads(good.stdout)["stats"]["prompt_tokens"]


@pytest.mark.parametrize("argv", [["run", "--system", "Be brief \udcff"],
                                  ["bench", "--prompt", "ok", "--prompt", "x \udcfe\udcff y"],
                                  ["generate", "--stop", "fine", "--stop", "\udcc3("]])
def test_every_command_repairs_its_text_options(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """What argparse hands over for invalid bytes in argv (lone surrogates) is repaired at the CLI edge for
    every command that takes text, `run --system` included (the app died on it)."""
    from localspec import cli
    from localspec.commands.streams import repair_text_options

    args = cli.build_parser().parse_args(argv)
    repair_text_options(args)
    flag, text = argv[-2], argv[-1]
    value = getattr(args, flag.lstrip("-"))
    repaired = value[-1] if isinstance(value, list) else value
    want = text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    assert repaired == want and "\ufffd" in want
    repaired.encode("utf-8")  # would raise on a lone surrogate
    if isinstance(value, list):
        assert value[0] in ("ok", "fine")  # valid text is left alone
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not valid UTF-8" in err[0] and flag in err[0], err


def test_tokenize_takes_lone_surrogates(smollm2_path: Path) -> None:
    """The Python API never raises on a str with lone surrogates: they tokenize as U+FFFD."""
    from localspec.backend import Model

    model = Model(smollm2_path)
    try:
        assert model.tokenize("a \udcff b") == model.tokenize("a \ufffd b")
        assert model.tokenize("lone \ud800 high") == model.tokenize("lone \ufffd high")
        assert model.tokenize("pair \ud83d\ude00") == model.tokenize("pair \U0001F600")  # a pair is a character
    finally:
        model.close()


# --- output edges (§5) ---------------------------------------------------------------------------
@pytest.mark.parametrize("mode", [[], ["--json"]])
def test_stdout_closed_is_one_line(smollm2_path: Path, mode: list[str]) -> None:
    proc = localspec("generate", str(smollm2_path), "-p", "Hello", "--max-tokens", "4", *mode,
                     stdout=None, preexec_fn=lambda: os.close(1))
    assert_one_error_line(proc, 1, "standard output is closed")


@pytest.mark.parametrize("mode", [[], ["--json"]])
def test_stdout_full_is_one_line(smollm2_path: Path, mode: list[str]) -> None:
    with open("/dev/full", "wb") as full:
        proc = localspec("generate", str(smollm2_path), "-p", "Hello", "--max-tokens", "4", *mode, stdout=full)
    assert_one_error_line(proc, 1, "cannot write", "no space left")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_stop_like_ctrl_c(smollm2_path: Path, sig: signal.Signals) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "localspec", "generate", str(smollm2_path), "--draft", "ngram", "--max-tokens",
         "4000", "--ctx", "4096", "-p", "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11,"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    assert proc.stdout is not None
    deadline = time.time() + 120
    seen = ""
    while len(seen) < 30 and time.time() < deadline:
        char = proc.stdout.read(1)
        assert char, "the generation ended before it could be stopped"
        seen += char
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, err
    assert "Traceback" not in err
    assert f"stopped by {sig.name}" in err
    assert "finish: interrupted" in err and "tok/s" in err
    # What was generated before the signal is all on stdout, ended by a newline.
    streamed = seen + out
    assert streamed.endswith("\n") and streamed.startswith(seen)
    tokens = int(err.split("tokens in")[0].split()[-1])
    assert 0 < tokens < 4000


# --- options that said one thing and did another (§6) -----------------------------------------------
def test_ctx_reports_the_context_llama_cpp_really_uses(smollm2_path: Path) -> None:
    proc = localspec("generate", str(smollm2_path), "--ctx", "17", "--draft", "ngram", "-p", "Hi",
                     "--max-tokens", "4", "--json")
    assert proc.returncode == 0, proc.stderr  # model-free drafters on a 17-token ask used to abort llama.cpp
    out = json.loads(proc.stdout)
    assert out["stats"]["n_ctx"] == 256
    notices = [ln for ln in stderr_lines(proc) if "--ctx 17" in ln]
    assert len(notices) == 1 and "256" in notices[0], proc.stderr
    # Asked what it gets: no notice; the stats line says how much of the context was used.
    exact = localspec("generate", str(smollm2_path), "--ctx", "512", "-p", "Hi", "--max-tokens", "4")
    assert exact.returncode == 0, exact.stderr
    assert "--ctx" not in exact.stderr
    assert "of 512 tokens used" in exact.stderr


def test_a_tiny_context_with_many_sequences_loads(smollm2_path: Path) -> None:
    """The engine's ngram/lookahead context holds 33 sequences: llama.cpp used to clamp its batch to
    the unpadded 17 tokens and abort (GGML_ASSERT) reserving 33 outputs. Run in a child: an abort kills."""
    code = ("from localspec.engine import Engine; from localspec.drafting.specs import DrafterSpec\n"
            f"e = Engine.load({str(smollm2_path)!r}, specs=[DrafterSpec('lookahead')], n_ctx=17)\n"
            "print(e.n_ctx, e.ctx.n_batch)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["256", "256"]


@pytest.mark.parametrize("draft,hint", [("ngrma", "'ngram'"), ("lookahed", "'lookahead'"),
                                        ("rset:notes.lsstore", "'rest:notes.lsstore'")])
def test_a_misspelt_drafter_gets_a_suggestion(smollm2_path: Path, draft: str, hint: str) -> None:
    proc = localspec("generate", str(smollm2_path), "--draft", draft, "-p", "x")
    assert_one_error_line(proc, 2, f"did you mean {hint}")
    bench = localspec("bench", str(smollm2_path), "--draft", f"{draft}@4", "--prompt", "x")
    assert_one_error_line(bench, 2, f"did you mean {hint}")


def test_a_misspelt_model_still_gets_model_names(smollm2_path: Path) -> None:
    proc = localspec("generate", str(smollm2_path), "--draft", "qwen3-0.6c", "-p", "x")
    assert_one_error_line(proc, 2, "unknown model", "qwen3-0.6b")


@pytest.mark.parametrize("model", [("Rewrite this module.\n\nimport csv\n" * 400), "see https://x.org/" + "a" * 5000])
def test_a_prompt_given_as_the_model_is_one_short_line(model: str) -> None:
    """A prompt passed where MODEL goes (no -p): once too long for a file name, looking it up as a path
    raised ENAMETOOLONG with a traceback; now one line, the text cut to its start and its length."""
    proc = localspec("generate", model, "--offline")
    line = assert_one_error_line(proc, 2, f"({len(model.strip()):,} characters)")
    assert len(line) < 250 and ("unknown model 'Rewrite this module.\\n\\nimport csv" in line
                                or "model file not found: see https://x.org/aaa" in line), line


def test_paths_too_long_to_look_up_are_one_short_line(smollm2_path: Path, tmp_path: Path) -> None:
    long = "a" * 5000
    (tmp_path / "in.txt").write_text("some text\n")
    rest = localspec("generate", str(smollm2_path), "-p", "x", "--draft", f"rest:{long}")
    assert len(assert_one_error_line(rest, 2, "REST store not found: aaa", "(5,000 characters)")) < 250
    out = localspec("index", "--model", str(smollm2_path), "-o", str(tmp_path / f"{long}.lsstore"),
                    str(tmp_path / "in.txt"))
    assert len(assert_one_error_line(out, 2, "is not a usable path", "characters)")) < 250
    src = localspec("index", "--model", str(smollm2_path), "-o", str(tmp_path / "o.lsstore"), str(tmp_path / long))
    assert len(assert_one_error_line(src, 2, "no such file or folder", "characters)")) < 250


@pytest.mark.parametrize("word", ["off", "OFF", "none"])
def test_generate_draft_off_is_plain_decoding(smollm2_path: Path, word: str) -> None:
    proc = localspec("generate", str(smollm2_path), "--draft", word, "-p", "The sky is", "--max-tokens", "8", "--json")
    assert proc.returncode == 0, proc.stderr
    stats = json.loads(proc.stdout)["stats"]
    assert stats["drafted"] == 0 and stats["control"] is None and stats["steps"] == stats["tokens"]


def test_bench_refuses_draft_off(smollm2_path: Path) -> None:
    proc = localspec("bench", str(smollm2_path), "--draft", "off", "--prompt", "x")
    assert_one_error_line(proc, 2, "plain decoding", "--draft ngram")


def test_system_implies_chat(smollm2_path: Path) -> None:
    common = ["generate", str(smollm2_path), "-p", "Say hello.", "--max-tokens", "12", "--json"]
    implied = localspec(*common, "--system", "Be brief.")
    chat = localspec(*common, "--system", "Be brief.", "--chat")
    raw = localspec(*common)
    for proc in (implied, chat, raw):
        assert proc.returncode == 0, proc.stderr
    got, want, bare = (json.loads(p.stdout) for p in (implied, chat, raw))
    assert got["token_ids"] == want["token_ids"]
    assert got["stats"]["prompt_tokens"] == want["stats"]["prompt_tokens"] > bare["stats"]["prompt_tokens"] + 6


def test_threads_beyond_the_cpus_warns(smollm2_path: Path) -> None:
    from localspec.backend import default_threads, usable_cpus

    many = usable_cpus() + 1
    proc = localspec("generate", str(smollm2_path), "--threads", str(many), "-p", "Hi", "--max-tokens", "2")
    assert proc.returncode == 0, proc.stderr
    warnings = [ln for ln in stderr_lines(proc) if ln.startswith("localspec: warning: --threads")]
    assert len(warnings) == 1 and f"{usable_cpus()} CPUs" in warnings[0], proc.stderr
    assert f"leave --threads out to use {default_threads()}, one per physical core" in warnings[0]
    # As many threads as CPUs (a core's second hardware thread included) is the user's to choose: no warning.
    fits = localspec("generate", str(smollm2_path), "--threads", str(usable_cpus()), "-p", "Hi",
                     "--max-tokens", "2")
    assert fits.returncode == 0 and "--threads" not in fits.stderr, fits.stderr
    assert_one_error_line(localspec("generate", str(smollm2_path), "--threads", "0", "-p", "Hi"), 2, "--threads 0")


# --- --draft-p-min, once --p-min beside --min-p (issue 10 §4) --------------------------------------
def test_draft_p_min_reaches_the_drafter_and_p_min_still_works(smollm2_path: Path, smollm2_q4_0_path: Path) -> None:
    common = ["generate", str(smollm2_path), "--draft", str(smollm2_q4_0_path), "--draft-max", "8",
              # a text to continue, not an instruction: on an AVX-512 CPU SmolLM2 answers "Write a long story
              # about a dragon." with its end token at once, and nothing is drafted with or without the flag
              "-p", "Once upon a time, in a land far away, there lived a dragon", "--max-tokens", "40", "--json"]
    runs = {flag: localspec(*common, *flag) for flag in
            [(), ("--draft-p-min", "0.9"), ("--p-min", "0.9")]}
    for proc in runs.values():
        assert proc.returncode == 0, proc.stderr
    drafted = {flag: json.loads(p.stdout)["stats"]["drafted"] for flag, p in runs.items()}
    assert drafted[("--draft-p-min", "0.9")] < drafted[()]
    assert drafted[("--p-min", "0.9")] == drafted[("--draft-p-min", "0.9")]
    bad = localspec("generate", str(smollm2_path), "-p", "x", "--p-min", "1.5")
    assert_one_error_line(bad, 2, "--draft-p-min 1.5")


def test_stderr_closed_keeps_the_statistics_out_of_stdout(smollm2_path: Path) -> None:
    """Issue 33: `generate -p Hi 2>&-` wrote the statistics into stdout among the text."""
    proc = subprocess.run([sys.executable, "-m", "localspec", "generate", str(smollm2_path), "-p", "Hi",
                           "--max-tokens", "6", "--threads", "1"], stdout=subprocess.PIPE, timeout=300, env=ENV,
                          preexec_fn=lambda: os.close(2))
    assert proc.returncode == 0
    out = proc.stdout.decode("utf-8", "replace")
    with_stderr = localspec("generate", str(smollm2_path), "-p", "Hi", "--max-tokens", "6", "--threads", "1")
    assert out == with_stderr.stdout and "tokens in" in with_stderr.stderr
    assert "tokens in" not in out and "localspec:" not in out


def test_off_in_a_list_of_drafters_is_one_clear_line(smollm2_path: Path) -> None:
    proc = localspec("generate", str(smollm2_path), "--draft", "off,ngram", "-p", "x")
    line = assert_one_error_line(proc, 2, "off means no drafter and cannot be combined with others")
    assert "did you mean" not in line


def test_a_generation_that_fills_the_context_says_so(smollm2_path: Path) -> None:
    """Issue 33: --max-tokens 300 --ctx 256 reported "context 257 of 256 tokens used"."""
    proc = localspec("generate", str(smollm2_path), "-p", "Count: 1, 2, 3,", "--max-tokens", "300", "--ctx", "256",
                     "--draft", "off", "--threads", "1")
    assert proc.returncode == 0, proc.stderr
    assert "finish: context; the context of 256 tokens is full" in proc.stderr and "257" not in proc.stderr


@pytest.mark.parametrize("command", [["generate", "-p", "x"], ["bench"], ["run"]])
def test_a_draft_head_of_another_family_is_refused_before_any_download(command: list[str], tmp_path: Path) -> None:
    """Issue 33: `generate smollm2-135m --draft qwen3-0.6b` asked to pull (offline) or began a 640 MB download.
    Since issue 43 a draft model of another family drafts by text; a DFlash head, which reads its target's
    layers, still cannot, and is refused before anything is fetched."""
    empty_hf = tmp_path / "hf"
    argv = [command[0], "smollm2-135m", "--draft", "qwen3-4b-dflash", *command[1:]]
    proc = subprocess.run([sys.executable, "-m", "localspec", *argv], capture_output=True, text=True, timeout=120,
                          env={**ENV, "HF_HOME": str(empty_hf), "HF_HUB_OFFLINE": "0"}, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert lines == ["localspec: error: qwen3-4b-dflash cannot draft for smollm2-135m: it reads its target's layers, "
                     "which needs the target's own vocabulary, and theirs differ (Qwen3 and SmolLM2 in `localspec "
                     "models`); use --draft ngram, which needs no model"], proc.stderr  # no smaller SmolLM2 is registered
    assert not empty_hf.exists()  # nothing was fetched, not even a header


def test_an_absurd_ctx_is_refused_before_anything_is_allocated(smollm2_path: Path) -> None:
    """Issue 41: --ctx 999999999999 grew the process to 14 GB over 50 s before std::bad_alloc came back."""
    proc = localspec("generate", str(smollm2_path), "--ctx", "999999999999", "--prompt", "hi", timeout=120)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("localspec: error: --ctx 999999999999 is too large: the KV cache and compute "
                               "buffers of "), lines[0]
    assert "of system RAM" in lines[0] and "the largest context that fits is " in lines[0]


def test_a_one_shot_generate_does_not_wait_for_the_background_measurement(smollm2_path: Path,
                                                                          smollm2_q4_0_path: Path,
                                                                          tmp_path: Path) -> None:
    """Issue 41: the first `generate` with a draft on an empty cost cache was held at its end by the
    measurement in the background. Here the measurement never ends: the reply must still come back, whole."""
    prelude = "\n".join([
        "import sys, threading",
        "import localspec.policy.measure as measure",
        "sys.stderr.isatty = lambda: True  # watched: the measurement runs in the background",
        "def never_ends(*args, **kwargs):",
        "    threading.Event().wait()",
        "measure.load_or_measure = never_ends",
        "import localspec.cli as cli",
        "sys.exit(cli.main(sys.argv[1:]))",
    ])
    proc = subprocess.run([sys.executable, "-c", prelude, "generate", str(smollm2_path), "--draft",
                           str(smollm2_q4_0_path), "--prompt", "Count to five.", "--max-tokens", "8",
                           "--threads", "1", "--json"],
                          capture_output=True, text=True, timeout=240,
                          env={**ENV, "LOCALSPEC_CACHE_DIR": str(tmp_path / "cache"), "LOCALSPEC_NO_HISTORY": "1"})
    assert proc.returncode == 0, proc.stderr
    assert "measuring this machine's decode costs" in proc.stderr
    result = json.loads(proc.stdout)
    assert result["finish_reason"] in ("length", "stop") and result["text"]
