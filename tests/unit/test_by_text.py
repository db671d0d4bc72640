"""Drafting by text (drafting/by_text.py): the boundary rules on hand-built bytes and token spellings."""

from __future__ import annotations

from localspec.drafting.by_text import complete_utf8, cut_at_boundary, spelled_prefix


def test_text_is_cut_before_an_incomplete_character():
    assert complete_utf8("héllo".encode()) == "héllo".encode()
    assert complete_utf8("日本".encode()[:-1]) == "日".encode()  # the draft stopped inside a character
    assert complete_utf8(b"ab\xff cd") == b"ab"  # a byte that begins no character
    assert complete_utf8(b"") == b""


def test_tokens_count_only_while_they_spell_the_text_back():
    text = b"hello world"
    assert spelled_prefix([7, 8], [b"hello", b" world"], text, unknown=0) == 2
    assert spelled_prefix([7, 0, 8], [b"hello", b"", b"world"], b"hello?world", unknown=0) == 1  # <unk>
    assert spelled_prefix([7, 9], [b"hello", b" there"], text, unknown=0) == 1  # spells something else
    assert spelled_prefix([7, 5], [b"hello", b""], text, unknown=-1) == 1  # a token that spells nothing


def test_the_last_token_is_dropped_unless_the_draft_ended_its_text():
    assert cut_at_boundary(4, text_ended=False) == 3  # "hel" may be the start of the target's "hello"
    assert cut_at_boundary(4, text_ended=True) == 4
    assert cut_at_boundary(0, text_ended=False) == 0
