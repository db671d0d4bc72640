"""SIGTERM and SIGHUP turned into ``Terminated``, so a command stops as on Ctrl-C."""

from __future__ import annotations

import signal
from types import FrameType

class Terminated(BaseException):
    """SIGTERM or SIGHUP arrived: a command stops as on Ctrl-C and exits with 128 + the signal's number.

    A BaseException, like KeyboardInterrupt, so that no ``except Exception`` on the way swallows it.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def stop_on_signals() -> None:
    """Turn SIGTERM and SIGHUP into ``Terminated`` (raised where the main thread is, between two
    calls into llama.cpp), so a command can stop as on Ctrl-C. A second SIGTERM kills at once; further
    SIGHUPs are ignored, since a hangup comes twice (the terminal's to the foreground group, then the
    shell's to its jobs) and the second one killed the command before it wrote its result."""

    def handler(signum: int, frame: FrameType | None) -> None:
        signal.signal(signum, signal.SIG_IGN if signum == signal.SIGHUP else signal.SIG_DFL)
        raise Terminated(signum)

    for signum in STOP_SIGNALS:
        signal.signal(signum, handler)
