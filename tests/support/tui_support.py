"""Helpers shared by the TUI tests: this module holds no tests of its own."""

from __future__ import annotations

import html
import re
import shlex
import subprocess
import sys
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

from textual.content import Content
from textual.pilot import Pilot
from textual.widget import Widget
from textual.widgets import Static

from localspec_tui.widgets import MessageBox

REPO = Path(__file__).resolve().parents[2]


async def wait_until(pilot: Pilot, predicate: Callable[[], bool], *, timeout_s: float = 300.0,
                     what: str = "the condition", every_s: float = 0.05) -> None:
    """Let the app run until ``predicate()`` holds; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        await pilot.pause(every_s)


async def send(pilot: Pilot, text: str) -> None:
    """Type ``text`` into the prompt (set at once: per-key typing only slows the tests) and press Enter."""
    prompt = pilot.app.query_one("#prompt", MessageBox)
    prompt.focus()
    prompt.value = text
    await pilot.press("enter")


def shown_text(widget: Widget) -> str:
    """The plain text a Static currently shows."""
    assert isinstance(widget, Static)
    content = widget.content
    return content.plain if isinstance(content, Content) else str(content)


def svg_text(svg: str) -> str:
    """The visible text of a Textual SVG screenshot, one screen row per line."""
    rows: dict[str, list[str]] = {}
    for cls, y, body in re.findall(r'<text class="([^"]*)"[^>]*? y="([0-9.]+)"[^>]*>(.*?)</text>', svg, flags=re.S):
        if not cls.endswith("-title"):  # the window title drawn above the screen
            rows.setdefault(y, []).append(html.unescape(body).replace("\xa0", " "))
    lines = ("".join(parts).rstrip() for _, parts in sorted(rows.items(), key=lambda kv: float(kv[0])))
    return "\n".join(line for line in lines if line)


def stub_engine(drafters: tuple[str, ...] = ("draft",)) -> SimpleNamespace:
    """Enough of an Engine for UI tests that never generate."""
    return SimpleNamespace(
        drafter_names=lambda: list(drafters),
        n_ctx=4096,
        target=SimpleNamespace(name="Target", path=Path("target-Q4.gguf")),
        draft=SimpleNamespace(name="Draft", path=Path("draft-Q4_0.gguf")) if drafters else None,
    )


# --- a real terminal ------------------------------------------------------------
def localspec_command() -> list[str]:
    """How a user starts localspec."""
    return [sys.executable, "-m", "localspec"]


class Tmux:
    """A detached tmux session running one command; the pane stays open after it exits.

    ``args`` are appended to ``command`` unquoted, for the shell to expand (``$(printf '\\377')``).
    With ``pid_file``, the command's process id is written there (the shell execs the command).
    """

    def __init__(self, command: list[str], env: dict[str, str], *, args: str = "",
                 pid_file: Path | None = None) -> None:
        # A private server (-L): another tmux user's clients or options cannot resize this window.
        self.name = f"localspec-test-{uuid.uuid4().hex[:8]}"
        self.tmux = ["tmux", "-L", self.name, "-f", "/dev/null"]
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        run = f"env {exports} {shlex.join(command)} {args}"
        if pid_file is not None:
            run = f"sh -c {shlex.quote(f'echo $$ > {shlex.quote(str(pid_file))}; exec {run}')}"
        shell = f"cd {shlex.quote(str(REPO))} && {run}; echo EXIT=$?; sleep 600"
        subprocess.run([*self.tmux, "new-session", "-d", "-s", self.name, "-x", "150", "-y", "45", shell],
                       check=True)

    def screen(self) -> str:
        return subprocess.run([*self.tmux, "capture-pane", "-p", "-t", self.name], capture_output=True,
                              text=True, check=True).stdout

    def keys(self, *keys: str) -> None:
        subprocess.run([*self.tmux, "send-keys", "-t", self.name, *keys], check=True)

    def wait_for(self, *patterns: str, timeout_s: float = 300.0) -> str:
        """The screen once every regular expression in ``patterns`` matches it."""
        deadline = time.monotonic() + timeout_s
        while True:
            screen = self.screen()
            if all(re.search(p, screen) for p in patterns):
                return screen
            if time.monotonic() > deadline:
                raise AssertionError(f"never saw {patterns} on screen:\n{screen}")
            time.sleep(0.5)

    def close(self) -> None:
        """Close the terminal: what still runs in it gets SIGHUP, as when a terminal window is closed."""
        subprocess.run([*self.tmux, "kill-server"], capture_output=True)


def wait_for_exit(pid: int, timeout_s: float = 60.0) -> None:
    """Wait until process ``pid`` (not our child) is gone."""
    deadline = time.monotonic() + timeout_s
    proc = Path(f"/proc/{pid}")
    while proc.exists():
        try:
            if "State:\tZ" in (proc / "status").read_text():  # ended, not yet reaped by its parent
                return
        except FileNotFoundError:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"process {pid} still runs {timeout_s:.0f} s after it was told to stop")
        time.sleep(0.2)
