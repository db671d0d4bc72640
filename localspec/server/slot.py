"""The one engine behind the server: one generation at a time, a bounded line of waiters.

The engine is not thread-safe and holds one KV cache, so the server is single-user on purpose:
every call into it (tokenizing, generating) runs on one worker thread, never on the event loop,
while an asyncio lock is held. Requests that arrive during a generation wait in line, at most
``queue`` of them; the next one is refused at once (``Busy``, a 503) rather than left to time out.
Nothing here imports a web framework: the app drives it, tests can too.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, AsyncIterator, Callable

from localspec.events import Event

if TYPE_CHECKING:
    from localspec.engine import Engine
    from localspec.generation import Generation

Observer = Callable[["Generation", Event], None]
"""Called on the engine's thread with each event of each generation (the metrics)."""


class Busy(Exception):
    """No place in line (or the server is stopping): the request is refused with 503."""


class _End:
    """The worker's last word on a run: None, or what its generation raised."""

    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error


class EngineSlot:
    """The engine, its worker thread, its lock and its line.

    ``open`` waits for the engine and prepares a generation; the returned ``Run`` streams it.
    The engine is free again when the worker is done with the run's generation, whether its
    reader stayed to the end or left early (``Run.close`` cancels it: it stops within one step).
    """

    def __init__(self, engine: "Engine", *, queue: int = 4, observe: Observer | None = None) -> None:
        if queue < 0:
            raise ValueError("queue must be >= 0")
        self.engine = engine
        self.queue = queue
        self._observe = observe
        self._lock = asyncio.Lock()
        self._waiting = 0
        self._current: Run | None = None
        self._closing = False
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="localspec-engine")

    @property
    def waiting(self) -> int:
        """Requests in line for the engine."""
        return self._waiting

    @property
    def generating(self) -> bool:
        return self._current is not None

    async def open(self, prepare: Callable[["Engine"], "Generation"]) -> "Run":
        """Take the engine (waiting in line when it is busy), then ``prepare(engine)`` on its thread.

        Raises Busy when ``queue`` requests already wait or the server is stopping; whatever
        ``prepare`` raises (the engine is then free again at once).
        """
        if self._closing:
            raise Busy("the server is stopping")
        # A generation already cancelled (its client left) ends within one step: one more request may
        # wait for it whatever the line's length, so that a client who hung up and asks again is served.
        room = self.queue + (1 if self._current is not None and self._current.ending else 0)
        if (self._lock.locked() or self._waiting) and self._waiting >= room:
            raise Busy(f"the model is busy and its line of {self.queue} waiting request(s) is full; retry shortly")
        self._waiting += 1
        try:
            await self._lock.acquire()
        finally:
            self._waiting -= 1
        loop = asyncio.get_running_loop()
        try:
            if self._closing:
                raise Busy("the server is stopping")
            generation = await loop.run_in_executor(self._worker, prepare, self.engine)
        except BaseException:
            self._lock.release()
            raise
        self._current = Run(self, generation, loop)
        return self._current

    def stop(self) -> None:
        """The server is stopping: refuse new requests, cancel the running generation (within one step)."""
        self._closing = True
        if self._current is not None:
            self._current.cancel()

    def shutdown(self) -> None:
        """Wait for the worker thread to finish (after ``stop``); the engine is then the caller's to close."""
        self.stop()
        self._worker.shutdown(wait=True)

    def _release(self, run: "Run") -> None:
        if self._current is run:
            self._current = None
        self._lock.release()


class Run:
    """One request's generation on the engine: its events are read once, through ``events()``.

    Use it as ``async with run:``; leaving the block, early or not, cancels what is still running,
    and the slot is released when the worker thread is done (not before: the next generation must
    not start on a cache still being written).
    """

    def __init__(self, slot: EngineSlot, generation: "Generation", loop: asyncio.AbstractEventLoop) -> None:
        self.generation = generation
        self._slot = slot
        self._loop = loop
        self._queue: asyncio.Queue[Event | _End] = asyncio.Queue()
        self._task: asyncio.Future[None] | None = None
        self._released = False
        self.ending = False  # cancelled: it stops within one step

    async def __aenter__(self) -> "Run":
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def cancel(self) -> None:
        """Ask the generation to stop after its current step (any thread may call this)."""
        self.ending = True
        self.generation.cancel()

    async def events(self) -> AsyncIterator[Event]:
        """The generation's events as the worker produces them; re-raises what the generation raised."""
        if self._task is not None:
            raise RuntimeError("a run's events are read once")
        self._task = self._loop.run_in_executor(self._slot._worker, self._pump)
        self._task.add_done_callback(lambda _: self._release())
        while True:
            item = await self._queue.get()
            if isinstance(item, _End):
                # Free the engine before the reader answers: the done callback above runs a loop turn
                # later, after a reply already sent, and a client's next request found the engine
                # taken (a 503 with --queue 0). _End is the worker's last act, so this wait is short.
                await asyncio.shield(self._task)
                self._release()
                if item.error is not None:
                    raise item.error
                return
            yield item

    def close(self) -> None:
        """Done reading: cancel a generation still running; release at once one never started."""
        if self._task is None:
            self._release()
        elif not self._task.done():
            self.cancel()

    def _release(self) -> None:
        if not self._released:
            self._released = True
            self._slot._release(self)

    def _pump(self) -> None:
        """On the engine's thread: iterate the generation, hand each event to the loop."""
        error: BaseException | None = None
        try:
            for event in self.generation:
                if self._slot._observe is not None:
                    self._slot._observe(self.generation, event)
                self._put(event)
        except Exception as err:  # handed to the reader, who answers it; the engine invalidated its cache
            error = err
        finally:
            self._put(_End(error))

    def _put(self, item: Event | _End) -> None:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the loop has closed: nobody is reading any more
            pass
