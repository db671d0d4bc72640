"""events.per_step: the one-call __init__ keeps every dataclass property the events and decisions rely on."""

from __future__ import annotations

import dataclasses
import inspect
import pickle

import pytest

from localspec.events import StepEvent, TokenEvent, per_step


@per_step
@dataclasses.dataclass(frozen=True)
class Point:
    x: int
    y: int = 2
    label: str | None = None


def test_per_step_keeps_signature_defaults_equality_and_hash() -> None:
    assert list(inspect.signature(Point).parameters) == ["x", "y", "label"]
    assert Point(1) == Point(1, 2, None) == Point(x=1, label=None)
    assert Point(1, 3) != Point(1)
    assert hash(Point(1, label="a")) == hash(Point(1, 2, "a"))
    assert repr(Point(5)) == "Point(x=5, y=2, label=None)"
    with pytest.raises(TypeError):
        Point()  # type: ignore[call-arg]  # a field without a default stays required
    with pytest.raises(TypeError):
        Point(1, z=3)  # type: ignore[call-arg]


def test_per_step_stays_frozen_and_replaceable_and_picklable() -> None:
    p = Point(1, label="a")
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.x = 2  # type: ignore[misc]
    assert dataclasses.replace(p, y=7) == Point(1, 7, "a")
    assert pickle.loads(pickle.dumps(p)) == p
    assert dataclasses.asdict(p) == {"x": 1, "y": 2, "label": "a"}


def test_the_events_are_built_through_it() -> None:
    assert TokenEvent.__init__.__qualname__ == "TokenEvent.__init__"
    assert StepEvent.__init__.__qualname__ == "StepEvent.__init__"
    fields = [f.name for f in dataclasses.fields(TokenEvent)]
    assert list(inspect.signature(TokenEvent).parameters) == fields
