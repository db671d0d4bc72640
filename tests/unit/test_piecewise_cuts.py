"""Cutting a chat at its end-of-turn markers (localspec.piecewise): where a cut is certain, and what a
turn tokenizes. The ids themselves are held to llama.cpp's on real vocabularies in
tests/engine/test_piecewise.py."""

from __future__ import annotations

from localspec.piecewise import PiecewiseTokenizer, SpecialTexts, TokenMemo

END, START = "<|im_end|>", "<|im_start|>"


def specials(*extra: str) -> SpecialTexts:
    return SpecialTexts([END, START, *extra], [END])


def test_a_marker_with_nothing_over_it_stands_alone() -> None:
    text = f"{START}user\nhi{END}\n{START}assistant\n"
    start = text.index(END)
    assert specials().stands_alone(text, start, start + len(END))
    # touching another special text is not overlapping it
    touching = f"hi{END}{START}"
    assert specials().stands_alone(touching, 2, 2 + len(END))


def test_a_special_text_over_the_marker_takes_its_cut_away() -> None:
    text = f"{START}user\nhi{END}\nnext"
    start = text.index(END)
    end = start + len(END)
    for overlapping in (f"{END}\n", f"i{END}", "end|>\nn", "|>\n", "hi<|", END[2:6]):
        assert overlapping in text
        assert not specials(overlapping).stands_alone(text, start, end), overlapping
    assert specials("\nnext", "user\nhi").stands_alone(text, start, end)  # beside it, not over it


def test_markers_that_hold_whitespace_at_an_end_are_never_cut_after() -> None:
    assert SpecialTexts([END, " <x>", "<y>\n"], [END, " <x>", "<y>\n", ""]).markers == (END,)


class Recorder:
    """A tokenizer that gives each character's code point (special texts as one id) and records its calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, bool]] = []

    def __call__(self, text: str, add_special: bool, parse_special: bool = True) -> list[int]:
        assert parse_special
        self.calls.append((text, add_special))
        ids = [-1] if add_special else []
        i = 0
        while i < len(text):
            for special in (END, START):
                if text.startswith(special, i):
                    ids.append(-2 if special == END else -3)
                    i += len(special)
                    break
            else:
                ids.append(ord(text[i]))
                i += 1
        return ids


def chat(*contents: str, prompt: bool = True) -> str:
    turns = "".join(f"{START}{'user' if i % 2 == 0 else 'assistant'}\n{c}{END}\n" for i, c in enumerate(contents))
    return turns + (f"{START}assistant\n" if prompt else "")


def test_a_turn_tokenizes_only_the_pieces_it_has_not_seen() -> None:
    tok = Recorder()
    pieces = PiecewiseTokenizer(TokenMemo(tok), specials())
    first = chat("one", "two")
    assert pieces.tokenize(first, True) == tok(first, True)
    tok.calls.clear()
    later = chat("one", "two", "three")
    assert pieces.tokenize(later, True) == tok(later, True)
    seen = tok.calls[:-1]  # (the last call is the check above)
    # the new message alone: every other piece (the assistant's opening too) was remembered
    assert seen == [(f"\n{START}user\nthree{END}", False)]
    tok.calls.clear()
    pieces.tokenize(later, False)  # BOS is asked of the first piece only, remembered apart
    assert tok.calls == [(f"{START}user\none{END}", False)]
    assert pieces.cuts(later) == [i + len(END) for i in range(len(later)) if later.startswith(END, i)]


def test_a_text_without_a_cut_is_tokenized_whole_and_a_marker_at_its_end_ends_the_last_piece() -> None:
    tok = Recorder()
    pieces = PiecewiseTokenizer(TokenMemo(tok), specials())
    assert pieces.tokenize("no markers here", True) == tok("no markers here", True)
    tok.calls.clear()
    ended = chat("a", "b", prompt=False).rstrip("\n")
    assert pieces.tokenize(ended, False) == tok(ended, False)
    assert [call for call, _ in tok.calls[:-1]] == [f"{START}user\na{END}", f"\n{START}assistant\nb{END}"]


def test_a_text_with_a_lone_surrogate_is_tokenized_whole() -> None:
    """The backend pairs or replaces lone surrogates before it looks for special texts: not cut here."""
    tok = Recorder()
    text = chat("\ud83d", "b")
    assert PiecewiseTokenizer(TokenMemo(tok), specials()).tokenize(text, False) == tok(text, False)
    assert tok.calls == [(text, False)] * 2


def test_what_is_remembered_is_bounded_by_tokens_the_least_recently_used_first() -> None:
    tok = Recorder()
    pieces = PiecewiseTokenizer(TokenMemo(tok, held=50), specials())
    pieces.tokenize(chat("x" * 30), False)  # pieces of 37 and 12 ids
    pieces.tokenize(chat("y" * 30), False)  # 37 more: over the bound, the x piece goes (the opening was used)
    tok.calls.clear()
    pieces.tokenize(chat("x" * 30), False)
    assert [text for text, _ in tok.calls] == [f"{START}user\n{'x' * 30}{END}"]
