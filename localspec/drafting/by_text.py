"""A draft model of another tokenizer, drafting by text.

A draft whose vocabulary differs from the target's (``pairing.check_files`` says which rule failed) cannot
propose target token ids directly. It proposes *text*: localspec turns the target's history into text,
encodes that with the draft's own tokenizer, lets the draft continue it greedily, and re-encodes the
continuation with the target's tokenizer ("universal assisted decoding", llama.cpp PR #12635; the
string-level exact match of Timor et al., ICML 2025). The target then verifies those target tokens as it
verifies any deterministic proposal (``Proposal.probs`` is None).

Exactness. The proposal is a deterministic function of the history (greedy draft, fixed tokenizers), drawn
before the target's verification draws anything, so it is a deterministic guess, q one-hot at the guessed
token x. Greedy verification keeps x only while it equals the target's argmax: the output is plain greedy
decoding's, token for token. Sampled verification (``acceptance.accept_sampled``) keeps x with probability
p(x) and otherwise draws from p with x taken out, renormalised; for every token z the output is z with
probability
    z = x:  p(x)
    z != x: (1 - p(x)) * p(z) / (1 - p(x)) = p(z)
so each emitted token is distributed exactly as p given the history, whatever x was; by induction over
positions, so is the whole sequence. (With q one-hot the best guess is the one p most likely keeps: the
draft's argmax, whatever the temperature, which is why this drafter never samples.) Nothing here depends on
the two vocabularies overlapping: a re-encoded token that the target would rarely choose is merely rejected.

Token boundaries. The draft's last token may end inside what the target encodes as one longer token
(the draft says "hel", the target's vocabulary has "hello"), so the last re-encoded target token is
dropped unless the draft ended its text (an end-of-generation token). Text is cut where its UTF-8 is
incomplete (a byte-level draft may stop inside a character), and wherever the target's tokens do not spell
the draft's bytes back (a character the target can only encode as its unknown token).

The draft's cache holds the history in the draft's own tokens. Before each proposal the history's text is
encoded afresh in the draft's tokenizer and the cache is rolled back to the longest common prefix of ids,
then the rest is decoded (the catch-up ``behind`` reports, which the controller charges like any other).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from localspec.drafting.base import DrafterBase, Proposal, top_probability
from localspec.sampling import argmax

if TYPE_CHECKING:
    from localspec.backend import Context, Model

TEXT_PAIR = "another tokenizer, drafting by text"
SAME_VOCAB = "same vocabulary"
TEXT_PAIR_COST = ("each step re-encodes the text both ways and the draft drafts a token more than it proposes; "
                  "a draft of the target's own family drafts ids directly and usually accepts more")


def complete_utf8(data: bytes) -> bytes:
    """The longest prefix of ``data`` that is whole UTF-8 characters (cut before the first byte that is not)."""
    try:
        data.decode("utf-8")
        return data
    except UnicodeDecodeError as err:
        return data[: err.start]


def spelled_prefix(tokens: Sequence[int], pieces: Sequence[bytes], text: bytes, unknown: int) -> int:
    """How many leading ``tokens`` (their bytes ``pieces``) spell ``text`` back exactly, none being ``unknown``."""
    at = 0
    for n, (tok, piece) in enumerate(zip(tokens, pieces)):
        if tok == unknown or not piece or text[at: at + len(piece)] != piece:
            return n
        at += len(piece)
    return len(tokens)


def cut_at_boundary(n_tokens: int, text_ended: bool) -> int:
    """How many re-encoded target tokens to propose: all when the draft ended its text, else all but the
    last (which may be the prefix of a longer target token)."""
    return n_tokens if text_ended else max(0, n_tokens - 1)


class TextDrafter(DrafterBase):
    """Drafts with a GGUF model whose vocabulary differs from the target's: by text, re-encoded.

    ``ctx`` is the draft's context (its own tokens); ``target`` the target model, whose tokenizer encodes
    the draft's text. ``p_min``: stop where the draft's top probability falls below it.
    """

    follows_each_step = False  # a step it had no part in changes nothing here (see Drafter)

    def __init__(self, ctx: Context, target: Model, *, p_min: float = 0.0, name: str = "draft") -> None:
        self.ctx = ctx
        self.draft = ctx.model
        self.target = target
        self.p_min = p_min
        self.name = name
        self._encoded: tuple[tuple[int, ...], list[int] | None] | None = None  # (history, draft ids) cache
        self._unknown = self._unknown_id(target)
        self.text_cuts = 0
        """Proposals cut because the target's tokens did not spell the draft's text back (stats)."""

    @staticmethod
    def _unknown_id(model: Model) -> int:
        ids = [i for i in range(min(model.n_vocab, 8)) if model.token_text(i) in ("<unk>", "[UNK]")]
        return ids[0] if ids else -1

    # --- the history in the draft's tokens -------------------------------------------------------
    def _draft_ids(self, history: Sequence[int]) -> list[int] | None:
        """``history`` re-encoded in the draft's tokenizer (None: its text ends inside a character)."""
        key = tuple(history)
        if self._encoded is not None and self._encoded[0] == key:
            return self._encoded[1]
        data = b"".join(self.target.piece(t) for t in history)
        whole = complete_utf8(data)
        ids = self.draft.tokenize(whole.decode("utf-8"), add_special=True) if whole == data else None
        self._encoded = (key, ids)
        return ids

    def _kept(self, ids: Sequence[int]) -> int:
        # The last token is always decoded again: its logits start the draft.
        return self.ctx.keepable(min(self.ctx.common_prefix(ids), len(ids) - 1))

    def behind(self, history: Sequence[int]) -> int:
        ids = self._draft_ids(history)
        return 0 if not ids else len(ids) - self._kept(ids)

    # --- proposing ---------------------------------------------------------------------------------
    def propose(self, history: Sequence[int], draft_len: int) -> Proposal:
        ids = self._draft_ids(history)
        # The draft's tokens may outnumber the target's: where they would overflow its context, draft nothing.
        if not ids or draft_len <= 0 or len(ids) + self._most_drafted(draft_len) > self.ctx.n_ctx:
            return Proposal((), None, self.name)
        n = self._kept(ids)
        self.ctx.rollback_to(n)
        self.ctx.append(ids[n:])
        text, ended = self._draft_text(draft_len)
        return Proposal(self.reencode(text, ended)[:draft_len], None, self.name)

    def _draft_text(self, draft_len: int) -> tuple[bytes, bool]:
        """The draft's greedy continuation as bytes, long enough for ``draft_len`` target tokens and one to
        drop; True with it when the draft ended its text."""
        out, most = b"", self._most_drafted(draft_len)
        for i in range(most):
            logits = self.ctx.logits(-1)
            if self.p_min > 0.0 and top_probability(logits) < self.p_min:
                return out, False
            tok = argmax(logits)
            if self.draft.is_eog(tok):
                return out, True
            out += self.draft.piece(tok)
            if len(self._target_tokens(complete_utf8(out))) > draft_len:
                return out, False
            if i + 1 < most:
                self.ctx.append([tok])
        return out, False

    @staticmethod
    def _most_drafted(draft_len: int) -> int:
        """The most draft tokens one proposal decodes: a target token spans at most a few draft tokens in
        practice, and the cap bounds a runaway."""
        return 2 * draft_len + 2

    def _target_tokens(self, text: bytes) -> list[int]:
        return self.target.tokenize(text.decode("utf-8"), add_special=False) if text else []

    def reencode(self, text: bytes, ended: bool) -> tuple[int, ...]:
        """The draft's ``text`` as target tokens that spell it exactly, the boundary cut (``cut_at_boundary``)."""
        whole = complete_utf8(text)
        tokens = self._target_tokens(whole)
        spelled = spelled_prefix(tokens, [self.target.piece(t) for t in tokens], whole, self._unknown)
        if spelled < len(tokens):
            self.text_cuts += 1
            return tuple(tokens[:spelled])  # the token after them spells something else: cut there
        return tuple(tokens[: cut_at_boundary(len(tokens), ended and whole == text)])

    def accepted(self, history: Sequence[int], n_accepted: int) -> None:
        # Nothing to do eagerly: the next propose() re-encodes the history and keeps the common prefix.
        pass

    def reset(self) -> None:
        self._encoded = None
