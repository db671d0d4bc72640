"""Streaming text: no half characters, stop strings held back and cut exactly."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from localspec.textstream import StopMatcher, TokenReleaser, Utf8Stream


def test_utf8_stream_holds_partial_characters():
    s = Utf8Stream()
    data = "é€😀".encode()
    out = [s.push(data[i:i + 1]) for i in range(len(data))]
    assert "".join(out) == "é€😀"
    assert "\ufffd" not in "".join(out)
    assert out[0] == ""  # first byte of é alone is not a character yet


@given(st.text(), st.lists(st.integers(min_value=1, max_value=5), max_size=50))
def test_utf8_stream_reassembles_any_split(text, cuts):
    assert streamed(text.encode(), cuts) == text


def streamed(data: bytes, cuts: list[int]) -> str:
    """``data`` pushed through a Utf8Stream in pieces of the sizes ``cuts`` (the rest last), then flushed."""
    s, pos, out = Utf8Stream(), 0, []
    for c in cuts:
        out.append(s.push(data[pos:pos + c]))
        pos += c
    out.append(s.push(data[pos:]))
    out.append(s.flush())
    return "".join(out)


@given(st.binary(max_size=40), st.lists(st.integers(min_value=1, max_value=5), max_size=20))
def test_utf8_stream_decodes_any_bytes_as_one_decode_would(data, cuts):
    """Invalid bytes too, split anywhere (whole pieces take a shortcut past the incremental decoder)."""
    assert streamed(data, cuts) == data.decode("utf-8", errors="replace")


def test_stop_matcher_holds_possible_prefix_then_releases():
    m = StopMatcher(["\nUser:"])
    assert m.push("Hello") == ("Hello", False)
    assert m.push("\nUs") == ("", False)
    assert m.push("e") == ("", False)
    assert m.push("d it") == ("\nUsed it", False)


def test_stop_matcher_cuts_at_the_stop():
    m = StopMatcher(["STOP", "END"])
    assert m.push("abc ST") == ("abc ", False)
    assert m.push("OP and more") == ("", True)
    m2 = StopMatcher(["END"])
    assert m2.push("xENDy") == ("x", True)


@given(st.text(alphabet="abS", max_size=30), st.lists(st.integers(1, 4), max_size=30))
def test_stop_matcher_equals_find_on_the_whole_text(text, cuts):
    stop = "bSa"
    m, pos, out, stopped = StopMatcher([stop]), 0, [], False
    for c in [*cuts, len(text)]:
        if stopped or pos >= len(text):
            break
        piece, stopped = m.push(text[pos:pos + c])
        out.append(piece)
        pos += c
    if not stopped:
        out.append(m.flush())
    expected = text[: text.find(stop)] if stop in text else text
    assert "".join(out) == expected


def test_token_releaser_keeps_provenance_and_cuts_the_straddling_token():
    r = TokenReleaser(["</s>"])
    out = []
    out += r.push(1, b"Hi", "draft")
    out += r.push(2, b" there<", None)
    out += r.push(3, b"/s> junk", "draft")
    assert r.stopped
    out += r.push(4, b"more", None)  # ignored after the stop
    assert out == [(1, "Hi", "draft"), (2, " there", None)]


def test_token_releaser_finish_releases_held_text_and_partial_utf8():
    r = TokenReleaser(["xyz"])
    out = r.push(1, b"ab x", None) + r.push(2, "é".encode()[:1], "d")
    assert out == []  # "x" may start "xyz", so token 1 is held whole
    out += r.finish()
    assert "".join(t for _, t, _ in out) == "ab x\ufffd"
    assert [tok for tok, _, _ in out] == [1, 2]
