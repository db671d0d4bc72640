"""`localspec bench`: the numbers (pure, hand-computed) and the command on the real SmolLM2."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from localspec.backend import batch_invariant
from localspec.bench.runner import (
    PLAIN,
    BenchResult,
    Config,
    RunResult,
    Task,
    _run_result,
    builtin_tasks,
    configs_from_args,
    load_tasks,
    parse_config,
    predicted_speedup,
    summarise,
)
from localspec.bench.report import chart_svg, format_table
from localspec.policy.estimates import expected_tokens_per_step as expected_tokens
from localspec.errors import InvalidOptionError
from localspec.events import DoneEvent, GenerationStats


# --- pure ------------------------------------------------------------------------------------------
def test_expected_tokens_formula():
    assert expected_tokens(0.5, 3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.0, 7) == 1.0


def test_predicted_speedup_by_hand():
    # 10 steps, all drafting 4 tokens (batch 5) at α = 0.5: each emits 1.9375 tokens.
    # Each costs 2 ms of drafting + verify(5) = 3 ms; plain costs 1 ms per token.
    p = predicted_speedup(steps=10, drafting_steps=10, drafted=40, verified=40, alpha=0.5, draft_ms=20.0,
                          verify_ms=lambda b: {5.0: 3.0}[b], plain_ms=1.0)
    assert p == pytest.approx(1.9375 / 5.0)
    # Half the steps plain: (5 * 1.9375 + 5) tokens in (5 * 5 + 5 * 1) ms.
    p = predicted_speedup(steps=10, drafting_steps=5, drafted=20, verified=20, alpha=0.5, draft_ms=10.0,
                          verify_ms=lambda b: 3.0, plain_ms=1.0)
    assert p == pytest.approx((5 * 1.9375 + 5) / 30)
    # Never drafted: exactly plain; overhead is charged per drafting step.
    assert predicted_speedup(steps=7, drafting_steps=0, drafted=0, verified=0, alpha=0.0, draft_ms=0.0,
                             verify_ms=lambda b: 9.0, plain_ms=2.0) == 1.0
    p = predicted_speedup(steps=1, drafting_steps=1, drafted=2, verified=6, alpha=1.0, draft_ms=0.0,
                          verify_ms=lambda b: b, plain_ms=1.0, overhead_ms=lambda k: 0.5 * k)
    assert p == pytest.approx(3.0 / (7.0 + 1.0))  # a tree: batch 1 + 6 nodes


def test_parse_config_and_labels():
    assert parse_config("ngram") == ("ngram", None)
    assert parse_config("ngram@5") == ("ngram", 5)
    assert parse_config("me@host.gguf") == ("me@host.gguf", None)
    with pytest.raises(InvalidOptionError, match="names no drafter"):
        parse_config("@4")
    configs = configs_from_args(["ngram", "x.gguf@3", "ngram,x.gguf"], {"ngram": "ngram", "x.gguf": "draft",
                                                                         "ngram,x.gguf": "ngram,draft"})
    assert configs == [Config("ngram", "ngram", None), Config("draft@3", "draft", 3),
                       Config("ngram,draft", "ngram,draft", None)]
    with pytest.raises(InvalidOptionError, match="twice"):
        configs_from_args(["ngram", "ngram"], {"ngram": "ngram"})


def test_builtin_suite_covers_the_kinds_of_work():
    tasks = builtin_tasks()
    names = {t.name for t in tasks}
    assert {"chat", "code-rewrite", "extraction", "summary", "structured", "creative"} <= names
    assert {t.kind for t in tasks} == {"grounded", "structured", "free"}
    assert any(t.temperature == 1.0 for t in tasks)


@pytest.mark.parametrize("text,needle", [
    ("[[task]]\nname = 'a'\n", "non-empty string prompt"),
    ("x = 1\n", "no [[task]]"),
    ("[[task]]\nname = 'a'\nprompt = 'p'\nkind = 'odd'\n", "kind 'odd'"),
    ("[[task]]\nname = 'a'\nprompt = 'p'\ncolour = 1\n", "unknown key 'colour'"),
    ("[[task]]\nname = 'a'\nprompt = 'p'\n[[task]]\nname = 'a'\nprompt = 'q'\n", "two tasks are named 'a'"),
    ("[[task]\n", "not valid TOML"),
    ("[[task]]\nname = 'a'\nprompt = 'p'\nmax_tokens = 0\n", "max_tokens"),
])
def test_task_files_are_checked(text, needle):
    with pytest.raises(InvalidOptionError, match="mine.toml") as err:
        load_tasks(text, "mine.toml")
    assert needle in str(err.value)


def run_result(task: str, config: str, rnd: int, ratio: float, **kw) -> RunResult:
    base = dict(tokens=10, tokens_per_second=10 * ratio, predicted=ratio, alpha=0.5, tau=1.5, drafted=4,
                accepted=2, steps=8, draft_ms=1.0, verify_ms=8.0, python_ms=1.0, same_as_plain=True)
    base.update(kw)
    return RunResult(task, config, rnd, ratio=ratio, **base)


def fake_result() -> BenchResult:
    tasks = [Task("a", "p", "grounded"), Task("b", "q", "free")]
    configs = [PLAIN, Config("ngram", "ngram")]
    result = BenchResult("m", configs, tasks, rounds=3)
    for task, ratios in (("a", [1.2, 1.5, 1.3]), ("b", [0.9, 1.0, 0.95])):
        for rnd, r in enumerate(ratios):
            result.runs.append(run_result(task, "plain", rnd, 1.0))
            result.runs.append(run_result(task, "ngram", rnd, r))
    return result


def test_summaries_are_min_median_max_over_runs():
    result = fake_result()
    s = result.by_task()["a"]["ngram"]
    assert (s.ratio_min, s.ratio_median, s.ratio_max, s.runs) == (1.2, 1.3, 1.5, 3)
    assert s.split == pytest.approx((0.1, 0.8, 0.1))
    assert s.draft_ms_per_step == pytest.approx(3 * 1.0 / (3 * 8))
    overall = result.overall()["ngram"]
    assert (overall.ratio_min, overall.ratio_median, overall.ratio_max) == (0.9, pytest.approx(1.1), 1.5)
    assert result.overall("grounded")["ngram"].ratio_median == 1.3
    assert summarise([run_result("a", "x", 0, 2.0, draft_ms=0, verify_ms=0, python_ms=0)]).split == (0, 0, 0)
    table = format_table(result)
    assert "1.20–1.30–1.50" in table and "grounded tasks" in table and "free tasks" in table
    data = result.to_dict()
    assert data["overall_by_kind"]["grounded"]["ngram"]["ratio_median"] == 1.3
    assert len(data["runs"]) == 12


class _NoCosts:
    def cost_model(self, measure: bool = True):
        return None


def _done(tokens: tuple[int, ...], tokens_per_second: float) -> DoneEvent:
    stats = GenerationStats(tokens=len(tokens), steps=len(tokens), elapsed_s=len(tokens) / tokens_per_second)
    return DoneEvent("length", "", tokens, stats)


def test_run_result_compares_greedy_output_with_plain():
    greedy, sampled, ngram = Task("g", "p"), Task("s", "p", temperature=1.0), Config("ngram", "ngram")
    plain = _done((1, 2, 3, 4), 10.0)
    same = _run_result(_NoCosts(), greedy, ngram, 0, _done((1, 2, 3, 4), 15.0), plain)
    assert same.same_as_plain is True and same.ratio == pytest.approx(1.5)
    parted = _run_result(_NoCosts(), greedy, ngram, 0, _done((1, 2, 9, 4), 15.0), plain)
    assert parted.same_as_plain is False
    shorter = _run_result(_NoCosts(), greedy, ngram, 0, _done((1, 2, 3), 15.0), plain)
    assert shorter.same_as_plain is False
    # Sampled runs are not expected to match plain's tokens: no verdict.
    assert _run_result(_NoCosts(), sampled, ngram, 0, _done((1, 2, 9, 4), 15.0), plain).same_as_plain is None
    table = format_table(BenchResult("m", [PLAIN, ngram], [greedy], 1, [
        _run_result(_NoCosts(), greedy, PLAIN, 0, plain, plain), parted]))
    assert "1 greedy run(s) parted from plain output" in table


def test_chart_has_one_bar_per_task_and_configuration():
    svg = ET.fromstring(chart_svg(fake_result()))
    bars = [e for e in svg.iter() if e.get("class") == "bar"]
    assert [(b.get("data-task"), b.get("data-config")) for b in bars] == [("a", "ngram"), ("b", "ngram")]
    assert float(bars[0].get("data-ratio")) == pytest.approx(1.3)
    # Taller bar for the larger ratio (SVG y grows downwards).
    assert float(bars[0].get("height")) > float(bars[1].get("height"))


# --- the command on the real model ---------------------------------------------------------------
def localspec(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "localspec", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def test_bench_compares_configurations_with_plain(smollm2_path, smollm2_q4_0_path, tmp_path):
    chart = tmp_path / "bench.svg"
    proc = localspec("bench", str(smollm2_path), "--draft", "ngram", "--draft", f"{smollm2_q4_0_path}@3",
                     "--tasks", "extraction", "--prompt", "List the days of the week.", "--rounds", "2",
                     "--max-tokens", "24", "--threads", "1", "--ctx", "1024", "--json", "--chart", str(chart))
    assert proc.returncode == 0, proc.stderr
    invariant = batch_invariant()
    out = json.loads(proc.stdout)
    assert [c["label"] for c in out["configs"]] == ["plain", "ngram", "draft@3"]
    assert [t["name"] for t in out["tasks"]] == ["extraction", "prompt-1"]
    runs = out["runs"]
    assert len(runs) == 2 * 3 * 2  # tasks x configurations x rounds
    for r in runs:
        plain = next(p for p in runs if p["config"] == "plain" and p["task"] == r["task"]
                     and p["round"] == r["round"])
        assert r["ratio"] == pytest.approx(r["tokens_per_second"] / plain["tokens_per_second"])
        if invariant:  # this build gives every position the same logits whatever the batch: exact
            assert r["same_as_plain"] is True, r
        if r["config"] == "draft@3":
            assert r["drafted"] > 0 and 0 < r["control"]["mean_draft_len"] <= 3
            assert r["predicted"] > 0
    for task in ("extraction", "prompt-1"):
        for config in ("ngram", "draft@3"):
            ratios = [r["tokens_per_second"] / p["tokens_per_second"]
                      for r in runs if r["task"] == task and r["config"] == config
                      for p in runs if p["task"] == task and p["config"] == "plain" and p["round"] == r["round"]]
            assert out["by_task"][task][config]["ratio_median"] == pytest.approx(statistics.median(ratios))
        plain_tps = [p["tokens_per_second"] for p in runs if p["task"] == task and p["config"] == "plain"]
        assert min(plain_tps) > 0
        assert out["by_task"][task]["plain"]["tokens_per_second"] == pytest.approx(statistics.median(plain_tps))
    assert out["costs"]["verify_ms"]  # the machine's measured cost curve
    assert "extraction: round 2/2" in proc.stderr
    bars = [e for e in ET.parse(chart).getroot().iter() if e.get("class") == "bar"]
    assert len(bars) == 2 * 2


@pytest.mark.parametrize("args,needle", [
    ((), "--draft"),
    (("--draft", "ngram", "--tasks", "nope"), "no task named 'nope'"),
    (("--draft", "ngram", "--rounds", "0"), "--rounds"),
    (("--draft", "ngram", "--tasks-file", "/nonexistent.toml"), "cannot read --tasks-file"),
])
def test_bench_errors_are_one_line(smollm2_path, args, needle):
    proc = localspec("bench", str(smollm2_path), *args, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("localspec: error: ") and needle in lines[0], proc.stderr


def test_a_speedup_with_nothing_accepted_is_reported_as_noise():
    """Issue 33: ngram at 1.34× with α 0.00 was presented as a win."""
    tasks = [Task("a", "p", "grounded")]
    result = BenchResult("m", [PLAIN, Config("ngram", "ngram")], tasks, rounds=3)
    for rnd, r in enumerate([1.30, 1.34, 1.40]):
        result.runs.append(run_result("a", "plain", rnd, 1.0))
        result.runs.append(run_result("a", "ngram", rnd, r, alpha=0.0, accepted=0))
    s = result.by_task()["a"]["ngram"]
    assert s.verdict == "within noise" and s.accepted == 0
    table = format_table(result)
    assert "1.30–1.34–1.40" in table and "within noise (no draft token accepted)" in table
    assert result.to_dict()["overall"]["ngram"]["verdict"] == "within noise"
    assert result.to_dict()["overall"]["plain"]["verdict"] == ""


@pytest.mark.parametrize("ratios,plain_tps,expected", [
    ([1.2, 1.5, 1.3], [10.0, 10.0, 10.0], "faster"),      # every round faster, plain steady
    ([0.7, 0.8, 0.75], [10.0, 10.0, 10.0], "slower"),
    ([0.9, 1.2, 1.1], [10.0, 10.0, 10.0], "within noise"),  # min–max holds 1.0
    ([1.1, 1.12, 1.15], [8.0, 10.0, 12.0], "within noise"),  # plain itself varied by 40 %
    ([1.5], [10.0], "one run"),
])
def test_verdict_against_plain(ratios, plain_tps, expected):
    result = BenchResult("m", [PLAIN, Config("ngram", "ngram")], [Task("a", "p")], rounds=len(ratios))
    for rnd, (r, tps) in enumerate(zip(ratios, plain_tps)):
        result.runs.append(run_result("a", "plain", rnd, 1.0, tokens_per_second=tps))
        result.runs.append(run_result("a", "ngram", rnd, r))
    assert result.by_task()["a"]["ngram"].verdict == expected
    assert result.overall()["ngram"].verdict == expected


def test_a_chart_path_that_cannot_take_a_file_is_refused_before_the_run(smollm2_path, tmp_path):
    """Issue 33: --chart /dev/full (or a FIFO) was replaced by an SVG; a folder gave a traceback after the run."""
    fifo = tmp_path / "chart.svg"
    os.mkfifo(fifo)
    for chart, needle in ((Path("/dev/full"), "is a device"), (fifo, "is a FIFO"), (tmp_path, "is a folder"),
                          (tmp_path / "no" / "c.svg", "does not exist")):
        proc = localspec("bench", str(smollm2_path), "--draft", "ngram", "--chart", str(chart), timeout=60)
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        assert proc.returncode == 2 and len(lines) == 1, proc.stderr
        assert lines[0].startswith(f"localspec: error: --chart {chart}") and needle in lines[0], lines[0]
        assert "measuring" not in proc.stderr  # refused before anything was measured
    assert Path("/dev/full").is_char_device() and fifo.is_fifo()


def test_a_chart_that_fails_after_the_run_comes_after_the_results(smollm2_path, tmp_path, monkeypatch, capsys):
    from localspec import cli
    from localspec.bench import report

    def full_disk(result, path):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(report, "write_chart", full_disk)
    code = cli.main(["bench", str(smollm2_path), "--draft", "ngram", "--tasks", "extraction", "--rounds", "1",
                     "--max-tokens", "8", "--threads", "1", "--ctx", "512", "--quiet",
                     "--chart", str(tmp_path / "c.svg")])
    out, err = capsys.readouterr()
    assert code == 2
    assert "localspec bench ·" in out and "extraction" in out  # the table was printed first
    assert err.strip() == (f"localspec: error: --chart {tmp_path / 'c.svg'}: the chart could not be written "
                           "(No space left on device); the results above are complete")


def test_a_chart_never_replaces_a_file_that_is_not_a_chart_of_ours(smollm2_path, tmp_path):
    """Issue 41: --chart MODEL.gguf (or a REST store) was replaced by an SVG with no word; --chart x.png got SVG."""
    model = tmp_path / "model.svg"
    model.write_bytes(b"GGUF\x03\x00\x00\x00" + bytes(64))
    store = tmp_path / "notes.svg"
    store.write_text("<svg><text>a drawing of the user's own</text></svg>")
    for chart, needle in ((model, "is not a chart written by localspec bench"),
                          (store, "is not a chart written by localspec bench"),
                          (tmp_path / "x.png", "name the file FILE.svg")):
        before = chart.read_bytes() if chart.exists() else None
        proc = localspec("bench", str(smollm2_path), "--draft", "ngram", "--chart", str(chart), timeout=60)
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        assert proc.returncode == 2 and len(lines) == 1, proc.stderr
        assert lines[0].startswith(f"localspec: error: --chart {chart}") and needle in lines[0], lines[0]
        assert "measuring" not in proc.stderr  # refused before anything was measured
        assert (chart.read_bytes() if chart.exists() else None) == before


def test_a_chart_of_ours_or_an_empty_file_may_be_replaced(tmp_path):
    from localspec.commands.bench import chart_path

    old = tmp_path / "old.svg"  # a chart from before the mark: known by its title
    old.write_text('<svg xmlns="http://www.w3.org/2000/svg" width="9" height="9" font-family="sans-serif">\n'
                   '<text x="60" y="20">m: tokens/s relative to plain decoding (median)</text></svg>')
    new = tmp_path / "new.svg"
    new.write_text(chart_svg(fake_result()))
    empty = tmp_path / "empty.SVG"
    empty.touch()
    for path in (old, new, empty, tmp_path / "fresh.svg"):
        assert chart_path(path) == path


@pytest.mark.parametrize("stdout", ["file", "pipe"])
def test_chart_to_dev_stdout_is_refused_before_the_run(smollm2_path, tmp_path, stdout):
    """--chart /dev/stdout mixed the chart into the table (stdout a file) or failed after the run (a pipe)."""
    out = tmp_path / "table.txt"
    with open(out, "wb") as f:
        proc = subprocess.run([sys.executable, "-m", "localspec", "bench", str(smollm2_path), "--draft", "ngram",
                               "--chart", "/dev/stdout"], stdout=f if stdout == "file" else subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, timeout=60,
                              env={**os.environ, "LOCALSPEC_NO_HISTORY": "1"})
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    needle = "the file standard output goes to" if stdout == "file" else "is a FIFO"
    assert lines[0].startswith("localspec: error: --chart /dev/stdout") and needle in lines[0], lines[0]
    assert "measuring" not in proc.stderr


def test_an_empty_chart_name_is_refused_as_empty(tmp_path):
    """`--chart ""` was refused as "--chart . is a folder"."""
    from localspec.commands.bench import chart_path

    for empty in ("", "  "):
        with pytest.raises(InvalidOptionError, match="--chart is empty; name the file to write"):
            chart_path(empty)
