"""The engine slot on a stand-in engine (no model): one generation at a time, a bounded line, the
engine freed only when its worker is done, a reader that leaves cancelling its generation."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Iterator

import pytest

from localspec.events import DoneEvent, Event, GenerationStats, StepEvent, TokenEvent
from localspec.server.slot import Busy, EngineSlot

pytestmark = pytest.mark.timeout(60)


class FakeGeneration:
    """Yields a token and a step every ``step_s`` seconds, up to ``tokens``; ``cancel`` ends it after
    the current step, as Generation does. ``threads`` records where it ran."""

    def __init__(self, tokens: int = 3, step_s: float = 0.01, fail: bool = False) -> None:
        self.tokens, self.step_s, self.fail = tokens, step_s, fail
        self.cancelled = False
        self.cached_tokens = 0
        self.threads: set[str] = set()
        self.finished = threading.Event()

    def cancel(self) -> None:
        self.cancelled = True

    def __iter__(self) -> Iterator[Event]:
        self.threads.add(threading.current_thread().name)
        made = 0
        try:
            while made < self.tokens and not self.cancelled:
                time.sleep(self.step_s)
                if self.fail:
                    raise RuntimeError("the stand-in failed")
                made += 1
                yield TokenEvent(made, "x")
                yield StepEvent(made, None, 0, 0, 1, 0.0, self.step_s * 1e3, 0.0)
            yield DoneEvent("cancelled" if self.cancelled else "length", "x" * made, tuple(range(made)),
                            GenerationStats(tokens=made))
        finally:
            self.finished.set()


def prepare(gen: FakeGeneration) -> Any:
    return lambda engine: gen


async def read_all(run: Any) -> list[Event]:
    async with run:
        return [event async for event in run.events()]


def test_one_at_a_time_and_a_bounded_line() -> None:
    async def go() -> None:
        slot = EngineSlot(object(), queue=1)  # type: ignore[arg-type]
        first = FakeGeneration(tokens=20, step_s=0.02)
        run = await slot.open(prepare(first))
        reading = asyncio.ensure_future(read_all(run))
        second = asyncio.ensure_future(slot.open(prepare(FakeGeneration())))
        await asyncio.sleep(0.05)
        assert slot.waiting == 1 and not second.done()  # in line
        with pytest.raises(Busy, match="line of 1"):
            await slot.open(prepare(FakeGeneration()))  # the line is full: refused at once
        events = await reading
        assert isinstance(events[-1], DoneEvent) and events[-1].finish_reason == "length"
        assert first.finished.is_set()
        run2 = await asyncio.wait_for(second, 5)  # the engine went to the one in line
        assert (await read_all(run2))[-1].finish_reason == "length"  # type: ignore[union-attr]
        assert first.threads and all(name.startswith("localspec-engine") for name in first.threads)
        slot.shutdown()

    asyncio.run(go())


def test_a_reader_that_leaves_cancels_and_the_next_starts_once_the_worker_is_done() -> None:
    async def go() -> None:
        slot = EngineSlot(object(), queue=4)  # type: ignore[arg-type]
        long = FakeGeneration(tokens=10_000, step_s=0.01)
        run = await slot.open(prepare(long))
        async with run:
            async for event in run.events():
                if isinstance(event, TokenEvent):
                    break  # the client left
        assert long.cancelled
        nxt = await asyncio.wait_for(slot.open(prepare(FakeGeneration())), 5)
        assert long.finished.is_set()  # not a moment before the worker let go of the engine
        assert (await read_all(nxt))[-1].finish_reason == "length"  # type: ignore[union-attr]
        slot.shutdown()

    asyncio.run(go())


def test_a_run_never_read_and_a_failing_prepare_free_the_engine() -> None:
    async def go() -> None:
        slot = EngineSlot(object(), queue=0)  # type: ignore[arg-type]
        run = await slot.open(prepare(FakeGeneration()))
        async with run:
            pass  # e.g. the response could not even start
        assert not slot.generating

        def broken(engine: object) -> Any:
            raise ValueError("bad prompt")

        with pytest.raises(ValueError, match="bad prompt"):
            await slot.open(broken)
        run = await asyncio.wait_for(slot.open(prepare(FakeGeneration())), 5)  # free again
        assert (await read_all(run))[-1].finish_reason == "length"  # type: ignore[union-attr]
        slot.shutdown()

    asyncio.run(go())


def test_a_failing_generation_reaches_its_reader_and_frees_the_engine() -> None:
    async def go() -> None:
        slot = EngineSlot(object())  # type: ignore[arg-type]
        run = await slot.open(prepare(FakeGeneration(fail=True)))
        with pytest.raises(RuntimeError, match="stand-in failed"):
            await read_all(run)
        run = await asyncio.wait_for(slot.open(prepare(FakeGeneration())), 5)
        assert (await read_all(run))[-1].finish_reason == "length"  # type: ignore[union-attr]
        slot.shutdown()

    asyncio.run(go())


def test_stop_cancels_the_running_generation_and_refuses_the_rest() -> None:
    async def go() -> None:
        seen: list[Event] = []
        slot = EngineSlot(object(), observe=lambda gen, event: seen.append(event))  # type: ignore[arg-type]
        long = FakeGeneration(tokens=10_000, step_s=0.01)
        run = await slot.open(prepare(long))
        reading = asyncio.ensure_future(read_all(run))
        await asyncio.sleep(0.05)
        slot.stop()
        events = await asyncio.wait_for(reading, 5)
        assert events[-1].finish_reason == "cancelled"  # type: ignore[union-attr]
        assert seen == events  # the observer (the metrics) saw every event, on the worker
        with pytest.raises(Busy, match="stopping"):
            await slot.open(prepare(FakeGeneration()))
        slot.shutdown()

    asyncio.run(go())


def test_a_client_asking_one_request_after_another_is_never_busy() -> None:
    """Issue 41: with no line (--queue 0) a strictly sequential client got 503s: the engine was freed in
    a callback that ran after the reply had gone out, so the next request found it still taken."""
    async def go() -> None:
        slot = EngineSlot(object(), queue=0)  # type: ignore[arg-type]
        for _ in range(40):
            run = await slot.open(prepare(FakeGeneration(tokens=2, step_s=0.0)))
            assert (await read_all(run))[-1].finish_reason == "length"  # type: ignore[union-attr]
            assert not slot.generating  # free the moment the reader has the last event
        slot.shutdown()

    asyncio.run(go())


def test_a_client_that_hung_up_and_asks_again_waits_for_its_cancelled_generation() -> None:
    """With no line, the request after a hang-up waits the one step the cancelled generation takes;
    a third request is still refused."""
    async def go() -> None:
        slot = EngineSlot(object(), queue=0)  # type: ignore[arg-type]
        long = FakeGeneration(tokens=10_000, step_s=0.05)
        run = await slot.open(prepare(long))
        async for event in run.events():
            if isinstance(event, TokenEvent):
                break
        with pytest.raises(Busy):  # still wanted by its reader: no room
            await slot.open(prepare(FakeGeneration()))
        run.close()  # the client hung up: cancelled, ends within a step
        again = asyncio.ensure_future(slot.open(prepare(FakeGeneration())))
        await asyncio.sleep(0)
        with pytest.raises(Busy):
            await slot.open(prepare(FakeGeneration()))
        nxt = await asyncio.wait_for(again, 5)
        assert long.finished.is_set()
        assert (await read_all(nxt))[-1].finish_reason == "length"  # type: ignore[union-attr]
        slot.shutdown()

    asyncio.run(go())
