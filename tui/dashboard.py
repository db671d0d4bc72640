"""The live speculation dashboard: acceptance, tokens per step, speed, where the time goes.

Every number shown is derived from one ``GenerationStats`` (the engine's
own running totals) plus the measured plain speed, through the public
properties below — tests read the same properties the text is made from.
"""

from __future__ import annotations

import math
from collections import deque

from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.content import Content
from textual.reactive import reactive
from textual.widgets import Label, Sparkline, Static

from localspec.policy.estimates import expected_tokens_per_step
from localspec.events import GenerationStats

BAR_WIDTH = 20
SPEED_SAMPLES = 90
SPLIT_STYLES = ("#5fb3f5", "#f2c14e", "#e06c75")  # draft / verify / python


def tokens_per_step_ceiling(alpha: float) -> float:
    """1 / (1 − α): the expected tokens per step with unlimited γ (inf when α = 1)."""
    return math.inf if alpha >= 1.0 else 1.0 / (1.0 - alpha)


def bar(fraction: float, width: int = BAR_WIDTH) -> str:
    """A horizontal bar of ``width`` cells, ``fraction`` of them full (eighth-cell resolution)."""
    fraction = min(1.0, max(0.0, fraction))
    eighths = round(fraction * width * 8)
    full, part = divmod(eighths, 8)
    partial = " ▏▎▍▌▋▊▉"[part] if part else ""
    return ("█" * full + partial).ljust(width, "·")


def _fmt(x: float) -> str:
    return "∞" if math.isinf(x) else f"{x:.2f}"


class Dashboard(VerticalScroll):
    """Live statistics of the current (or last) reply.

    Set ``stats`` (via ``show_stats``), ``plain_tok_s``, ``drafter`` and
    ``draft_len``; the text re-renders from the properties ``alpha``,
    ``reached_alpha``, ``tau``, ``ceiling``, ``expected_tau``, ``tokens_per_second``,
    ``speedup`` and ``time_split``.
    """

    stats: reactive[GenerationStats] = reactive(GenerationStats, init=False)
    plain_tok_s: reactive[float] = reactive(0.0, init=False)
    drafter: reactive[str] = reactive("off", init=False)
    draft_len: reactive[int] = reactive(5, init=False)

    def __init__(self, *, legend: Content | None = None, id: str | None = None) -> None:
        super().__init__(id=id)
        self.legend = legend or Content("")
        self.speed_samples: deque[float] = deque(maxlen=SPEED_SAMPLES)
        self._last_point: tuple[int, float] | None = None  # (tokens, elapsed_s) of the previous update
        self._shown: dict[str, object] = {}  # each part's last content, by id (see _show)

    def compose(self) -> ComposeResult:
        # The headline (speedup) first, so a short terminal still shows it.
        yield Static(id="dash-drafter")
        yield Label("Speed (tokens/s)", classes="dash-title")
        yield Static(id="dash-speed")
        yield Sparkline([], id="dash-sparkline")
        yield Label("Acceptance", classes="dash-title")
        yield Static(id="dash-acceptance")
        yield Label("Acceptance by draft position", classes="dash-title")
        yield Static(id="dash-positions")
        yield Label("Time per step", classes="dash-title")
        yield Static(id="dash-split")
        yield Label("Drafters", classes="dash-title")
        yield Static(id="dash-drafters")
        yield Label("Controller", classes="dash-title")
        yield Static(id="dash-control")

    def on_mount(self) -> None:
        self._render_all()

    # --- inputs ------------------------------------------------------------
    def begin_reply(self) -> None:
        """A new generation starts: its first speed sample is measured from zero."""
        self._last_point = (0, 0.0)

    def show_stats(self, stats: GenerationStats) -> None:
        """Show ``stats`` and add the speed since the previous update to the sparkline."""
        if self._last_point is not None:
            tokens, elapsed = self._last_point
            # Only windows with new tokens: the final re-show of the same totals is not a stall.
            if stats.elapsed_s > elapsed and stats.tokens > tokens:
                self.speed_samples.append((stats.tokens - tokens) / (stats.elapsed_s - elapsed))
            self._last_point = (stats.tokens, stats.elapsed_s)
        self.stats = stats
        self._render_all()  # also when stats compare equal: a new speed sample arrived

    # --- numbers (what the text shows) ------------------------------------
    @property
    def alpha(self) -> float:
        """Accepted / drafted over the reply: the engine's ``acceptance_rate``."""
        return self.stats.acceptance_rate

    @property
    def reached_alpha(self) -> float:
        """Acceptance at the draft positions actually reached (each earlier token accepted).

        This is the per-token α that the τ formulas assume; plain accepted/drafted
        also counts the tokens after a rejection, which are never judged.
        """
        reached = sum(self.stats.position_drafted)
        return sum(self.stats.position_accepted) / reached if reached else 0.0

    @property
    def tau(self) -> float:
        """Tokens per target forward pass: the engine's ``tokens_per_step``."""
        return self.stats.tokens_per_step

    @property
    def ceiling(self) -> float:
        return tokens_per_step_ceiling(self.reached_alpha)

    @property
    def gamma(self) -> int:
        """The draft length: fixed by --draft-max, else the controller's average so far."""
        if self.draft_len > 0:
            return self.draft_len
        drafting_steps = sum(d.steps for d in self.stats.drafters)
        return max(1, round(self.stats.drafted / drafting_steps)) if drafting_steps else 1

    @property
    def expected_tau(self) -> float:
        return expected_tokens_per_step(self.reached_alpha, self.gamma)

    @property
    def tokens_per_second(self) -> float:
        return self.stats.tokens_per_second

    @property
    def speedup(self) -> float | None:
        """The reply's speedup over plain decoding, as ``GenerationStats.speedup`` defines it (against the
        controller's plain-step estimate, learned from this machine's plain steps as the reply runs). Without
        a controller (drafting off), tokens/s over the plain speed measured at start; None until known.

        Not tokens/s over a baseline measured once: one taken while the machine was busy read 1.0 tok/s
        where it was 107, and the dashboard said 0.17× while the controller measured 0.66×."""
        if self.stats.speedup is not None:
            return self.stats.speedup
        if self.plain_tok_s <= 0 or self.stats.tokens == 0:
            return None
        return self.tokens_per_second / self.plain_tok_s

    @property
    def plain_speed(self) -> float:
        """Plain decoding's tokens/s the speedup is measured against (0: not known yet)."""
        s = self.stats
        if s.plain_estimate_ms > 0:
            return 1000.0 * s.tokens / s.plain_estimate_ms
        return self.plain_tok_s

    @property
    def time_split(self) -> tuple[float, float, float]:
        """Fractions of step time spent drafting, verifying and in Python (zeros before any step)."""
        s = self.stats
        total = s.draft_ms + s.verify_ms + s.python_ms
        if total <= 0:
            return (0.0, 0.0, 0.0)
        return (s.draft_ms / total, s.verify_ms / total, s.python_ms / total)

    # --- rendering ---------------------------------------------------------
    def watch_plain_tok_s(self) -> None:
        self._render_all()

    def watch_drafter(self) -> None:
        self._render_all()

    def watch_draft_len(self) -> None:
        self._render_all()

    def _render_all(self) -> None:
        if not self.query("#dash-acceptance"):  # not composed yet: on_mount renders
            return
        s = self.stats
        gamma = ("" if self.drafter == "off" else
                 f"  γ {self.draft_len}" if self.draft_len > 0 else f"  γ auto (≈{self.gamma})")
        self._show("dash-drafter", Content.assemble("drafter ", (self.drafter, "bold"), gamma, "\n", self.legend))
        self._show("dash-acceptance", "\n".join([
            f"α accepted      {self.alpha:5.2f}  {s.accepted}/{s.drafted} drafted",
            f"α reached       {self.reached_alpha:5.2f}  "
            f"{sum(s.position_accepted)}/{sum(s.position_drafted)} judged",
            f"τ tokens/step   {self.tau:5.2f}  {s.tokens} tokens / {s.steps} steps",
            f"ceiling 1/(1−α) {_fmt(self.ceiling):>5}",
            f"expected τ γ={self.gamma:<2} {self.expected_tau:5.2f}" if self.drafter != "off"
            else "expected τ      (drafting off)",
        ]))
        rows = [f"{i + 1:>2} {bar(a)} {a:4.2f} ({n})"
                for i, (a, n) in enumerate(zip(s.position_acceptance, s.position_drafted, strict=True))]
        self._show("dash-positions", "\n".join(rows) or "no drafts yet")
        self.query_one("#dash-sparkline", Sparkline).data = list(self.speed_samples)
        speedup = self.speedup
        plain = f"{self.plain_speed:.1f}" if self.plain_speed > 0 else "…"
        self._show("dash-speed", Content.assemble(
            ("speedup ", "bold"), ("…" if speedup is None else f"{speedup:.2f}×", "bold"),
            f" over plain decoding\nreply {self.tokens_per_second:.1f} tok/s · plain {plain} tok/s",
        ))
        self._show("dash-split", self._split_content())
        drafters = [f"{d.name:<10} α {d.acceptance_rate:4.2f}  {d.accepted}/{d.drafted} in {d.steps} steps"
                    for d in s.drafters]
        self._show("dash-drafters", "\n".join(drafters) or "none used")
        self._show("dash-control", self.control_text)

    def _show(self, part: str, content: str | Content) -> None:
        """Update part ``part`` only when what it shows changed: each update costs the app a render of
        that part on the UI thread, the thread the reply's decoding shares the interpreter with."""
        key = content if isinstance(content, str) else (content.plain, tuple(content.spans))
        if self._shown.get(part) != key:
            self._shown[part] = key
            self.query_one(f"#{part}", Static).update(content)

    @property
    def control_text(self) -> str:
        """What the adaptive controller decided this reply and why (empty of numbers when off)."""
        c = self.stats.control
        if c is None:
            return "off (plain decoding)" if self.drafter == "off" else "waiting for a reply"
        return "\n".join([
            f"steps  draft {c.draft_steps} · plain {c.plain_steps} · probes {c.probes}",
            f"length {c.mean_draft_len:.1f} tokens drafted a step (mean)",
            f"drafting steps  expected {c.expected_gain:4.2f}× · measured {c.measured_gain:4.2f}×",
            f"why    {c.last_reason or '…'}",
        ])

    def _split_content(self) -> Content:
        fractions = self.time_split
        cells = [round(f * BAR_WIDTH) for f in fractions]
        cells[1] = max(0, BAR_WIDTH - cells[0] - cells[2]) if any(fractions) else 0
        parts: list[str | tuple[str, str]] = [("█" * n, style) for n, style in zip(cells, SPLIT_STYLES, strict=True)]
        if not any(fractions):
            parts = ["·" * BAR_WIDTH]
        names = ("draft", "verify", "python")
        parts.append("\n")
        for i, (name, f, style) in enumerate(zip(names, fractions, SPLIT_STYLES, strict=True)):
            parts.extend([("■ ", style), f"{name} {100 * f:.0f}%", " " if i < 2 else ""])
        parts.append(f"\nprefill {self.stats.prefill_ms:.0f} ms")
        return Content.assemble(*parts)
