"""``localspec bench``'s report: the measured result as a terminal table and as an SVG bar chart.

Measuring lives in ``localspec.bench.runner``; this module only reads a ``BenchResult``.
"""

from __future__ import annotations

from pathlib import Path

from localspec.bench.runner import FEW_RUNS, KINDS, NOISE, PLAIN, BenchResult, Summary


def _bar(ratio: float, width: int = 24, top: float = 2.0) -> str:
    """A bar for a ratio on a 0..``top`` scale with a tick at 1.0 (plain)."""
    cells = [" "] * width
    one = round(width / top) - 1
    filled = max(0, min(width, round(ratio / top * width)))
    for i in range(filled):
        cells[i] = "█"
    if cells[one] == " ":
        cells[one] = "│"
    return "".join(cells) + ("▶" if ratio > top else "")


def format_table(result: BenchResult) -> str:
    """The terminal report: per task and overall, one line per configuration."""
    head = (f"{'task':<14}{'config':<18}{'tok/s':>8}  {'× plain min–med–max':<21}{'pred×':>6}"
            f"{'α':>6}{'τ':>6}  {'draft/verify/py %':<18}{'draft ms/step':>13}  vs plain")
    lines = [f"localspec bench · {result.model} · {result.rounds} round(s), alternating with plain", "", head,
             "─" * len(head)]

    def row(label: str, config: str, s: Summary) -> str:
        split = "/".join(f"{100 * x:.0f}" for x in s.split)
        spread = ("1.00" if config == PLAIN.label
                  else f"{s.ratio_min:.2f}–{s.ratio_median:.2f}–{s.ratio_max:.2f}")
        pred = "" if config == PLAIN.label else f"{s.predicted:.2f}"
        acc = "" if config == PLAIN.label else f"{s.alpha:.2f}"
        draft = "" if config == PLAIN.label else f"{s.draft_ms_per_step:.3f}"
        return (f"{label:<14}{config:<18}{s.tokens_per_second:>8.1f}  {spread:<21}{pred:>6}{acc:>6}"
                f"{s.tau:>6.2f}  {split:<18}{draft:>13}  {s.verdict}").rstrip()

    for task, configs in result.by_task().items():
        for i, (config, s) in enumerate(configs.items()):
            lines.append(row(task if i == 0 else "", config, s))
    lines += ["", "overall (every run; the bar is the median ratio, │ marks plain speed):"]
    groups = [(None, "all tasks")] + [(k, f"{k} tasks") for k in KINDS if any(t.kind == k for t in result.tasks)]
    for kind, title in groups:
        summaries = result.overall(kind)
        lines.append(f"  {title}")
        for config, s in summaries.items():
            if config == PLAIN.label:
                continue
            lines.append(f"    {config:<18}{s.ratio_min:.2f}–{s.ratio_median:.2f}–{s.ratio_max:.2f}×  "
                         f"{_bar(s.ratio_median)}  predicted {s.predicted:.2f}×  {_verdict_words(s)}")
    lines += ["", "vs plain: within noise when nothing drafted was accepted, when the min–max ratio holds 1.00, or "
                  "when the median is nearer 1.00 than plain's own spread between rounds"]
    if result.rounds < 2:
        lines.append("one round gives no spread: run --rounds 3 or more to tell a difference from noise")
    differing = [r for r in result.runs if r.same_as_plain is False]
    if differing:
        lines += ["", f"note: {len(differing)} greedy run(s) parted from plain output: llama.cpp's numerics "
                      "differ between batch shapes and cache layouts, so near-ties can resolve differently "
                      "(README: Exactness and floating point); see --json"]
    return "\n".join(lines)


def _verdict_words(s: Summary) -> str:
    if s.verdict == NOISE and s.accepted == 0:
        return f"{NOISE} (no draft token accepted)"
    if s.verdict == FEW_RUNS:
        return "one run: no spread"
    return s.verdict


CHART_MARK = 'data-generator="localspec bench"'
"""Marks an SVG as a chart of ours: ``--chart`` replaces only such a file (or an empty one)."""
CHART_TITLE = "tokens/s relative to plain decoding"
"""In every chart's title, those written before ``CHART_MARK`` included."""


def is_our_chart(head: bytes) -> bool:
    """Whether a file beginning with ``head`` (its first KiB or more) is a chart ``chart_svg`` wrote."""
    text = head.decode("utf-8", errors="replace")
    return text.startswith("<svg") and (CHART_MARK in text or CHART_TITLE in text)


def chart_svg(result: BenchResult) -> str:
    """A bar chart (SVG) of each configuration's median ratio to plain per task, with min–max whiskers."""
    configs = [c.label for c in result.configs if c.label != PLAIN.label]
    table = result.by_task()
    tasks = list(table)
    palette = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#9c755f"]
    bar_w, gap, left, top, height = 14, 18, 60, 40, 240
    group_w = max(1, len(configs)) * bar_w + gap
    width = left + len(tasks) * group_w + 180
    peak = max([1.5] + [s.ratio_max for row in table.values() for c, s in row.items() if c != PLAIN.label])
    scale = height / (peak * 1.1)

    def y(v: float) -> float:
        return top + height - v * scale

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" {CHART_MARK} width="{width}" height="{top + height + 90}" '
           f'font-family="sans-serif" font-size="11">',
           f'<text x="{left}" y="20" font-size="14">{_esc(result.model)}: {CHART_TITLE} '
           f'(median, min–max over {result.rounds} round(s))</text>']
    for v in [x / 2 for x in range(0, int(peak * 1.1 * 2) + 1)]:
        out.append(f'<line x1="{left}" x2="{left + len(tasks) * group_w}" y1="{y(v):.1f}" y2="{y(v):.1f}" '
                   f'stroke="{"#333" if v == 1 else "#ddd"}" stroke-width="{2 if v == 1 else 1}"/>')
        out.append(f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:.1f}×</text>')
    for ti, task in enumerate(tasks):
        x0 = left + ti * group_w + gap / 2
        for ci, config in enumerate(configs):
            s = table[task].get(config)
            if s is None:
                continue
            x = x0 + ci * bar_w
            colour = palette[ci % len(palette)]
            out.append(f'<rect class="bar" data-task="{_esc(task)}" data-config="{_esc(config)}" '
                       f'data-ratio="{s.ratio_median:.4f}" x="{x:.1f}" y="{y(s.ratio_median):.1f}" '
                       f'width="{bar_w - 2}" height="{s.ratio_median * scale:.1f}" fill="{colour}"/>')
            cx = x + (bar_w - 2) / 2
            out.append(f'<line x1="{cx:.1f}" x2="{cx:.1f}" y1="{y(s.ratio_min):.1f}" y2="{y(s.ratio_max):.1f}" '
                       f'stroke="#000"/>')
        out.append(f'<text x="{x0 + len(configs) * bar_w / 2:.1f}" y="{top + height + 16}" text-anchor="end" '
                   f'transform="rotate(-30 {x0 + len(configs) * bar_w / 2:.1f} {top + height + 16})">'
                   f'{_esc(task)}</text>')
    lx = left + len(tasks) * group_w + 20
    for ci, config in enumerate(configs):
        out.append(f'<rect x="{lx}" y="{top + ci * 18}" width="12" height="12" '
                   f'fill="{palette[ci % len(palette)]}"/>')
        out.append(f'<text x="{lx + 18}" y="{top + ci * 18 + 10}">{_esc(config)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def _esc(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def write_chart(result: BenchResult, path: Path) -> None:
    from localspec.paths import atomic_write

    with atomic_write(path) as f:
        f.write(chart_svg(result).encode("utf-8"))
