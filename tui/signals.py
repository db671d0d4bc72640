"""The process signals that end the chat app, and a guard around Textual's own suspend/resume handlers.

SIGTERM, SIGHUP and SIGINT are taken through the asyncio loop (their callback runs on the UI thread,
between messages, never in the middle of other code); the app saves the reply in flight and exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from typing import Any, Callable

EXIT_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
"""Signals that end the app the way ctrl+q does (the reply in flight saved first); exit status 128 + signal."""


class ExitSignals:
    """While installed, each of ``EXIT_SIGNALS`` calls ``on_signal(signum)`` on the running loop."""

    def __init__(self, on_signal: Callable[[int], None]) -> None:
        self.on_signal = on_signal
        self._caught: list[int] = []
        self._textual: list[tuple[int, Any]] = []  # Textual's SIGTSTP/SIGCONT handlers, as found

    def install(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in EXIT_SIGNALS:
            try:
                loop.add_signal_handler(sig, self.on_signal, sig)
            except (NotImplementedError, RuntimeError, ValueError):  # no signals here (Windows, a thread)
                continue
            self._caught.append(sig)
        self._resume_only_after_suspend()

    def release(self) -> None:
        """Give every signal back as it was (safe to call twice)."""
        with contextlib.suppress(RuntimeError, ValueError):
            loop = asyncio.get_running_loop()
            for sig in self._caught:
                loop.remove_signal_handler(sig)
        self._caught.clear()
        with contextlib.suppress(ValueError):
            for sig, handler in self._textual:
                signal.signal(sig, handler)
        self._textual.clear()

    def _resume_only_after_suspend(self) -> None:
        """Let Textual's SIGCONT handler run only after its own SIGTSTP (``kill -TSTP``, then ``fg``).

        Textual restarts its terminal mode on every SIGCONT, and the kernel sends one with the
        SIGHUP of a closed terminal: that restart, run in the middle of the app's shutdown, could
        deadlock Textual's output thread and leave the process hanging after its terminal was gone.
        """
        on_stop, on_continue = signal.getsignal(signal.SIGTSTP), signal.getsignal(signal.SIGCONT)
        if not (callable(on_stop) and callable(on_continue)):  # headless: Textual installed none
            return
        suspended = False

        def stop(signum: int, frame: Any) -> None:
            nonlocal suspended
            suspended = True
            on_stop(signum, frame)

        def resume(signum: int, frame: Any) -> None:
            nonlocal suspended
            if suspended:
                suspended = False
                on_continue(signum, frame)

        signal.signal(signal.SIGTSTP, stop)
        signal.signal(signal.SIGCONT, resume)
        self._textual = [(signal.SIGTSTP, on_stop), (signal.SIGCONT, on_continue)]
