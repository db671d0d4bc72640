"""``Grammar``: a GBNF grammar compiled by llama.cpp over a model's vocabulary, and its states.

llama.cpp's grammar sampler (``llama_sampler_init_grammar``) holds the parse state after the tokens
it accepted; ``apply`` sets the logit of every token the state rules out to ``-inf`` (end-of-generation
tokens only while the grammar is complete), ``accept`` advances it, ``clone`` copies it. A
``GrammarState`` wraps one such sampler; the core (``localspec.constraints``) keeps the state after the
kept tokens and clones it along a drafted path, so a speculative path's states are dropped, not undone.

Two of llama.cpp's failure modes never reach C: accepting a token the state rules out throws a C++
exception (and an end-of-generation token aborts) through the C API, which ends the process, so
``accept`` checks the token first and refuses it with ``ValueError``; and a grammar that does not parse
makes ``init`` return NULL after printing why to stderr, which is read back for the one-line error.
"""

from __future__ import annotations

import ctypes
import os
import tempfile
import threading

import numpy as np

import llama_cpp

from localspec.backend.build import clear_log, last_error_line
from localspec.backend.model import Model
from localspec.errors import InvalidOptionError, shown

# llama_token_data {int32 id; float logit; float p}, as an array numpy fills and llama.cpp reads.
_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])
_STDERR_LOCK = threading.Lock()


class Grammar:
    """A GBNF grammar over ``model``'s vocabulary (``root`` its start symbol).

    Raises ``InvalidOptionError`` (param ``grammar``) with llama.cpp's own reason when it does not parse
    (a syntax error, an undefined rule, left recursion, no ``root``)."""

    def __init__(self, model: Model, text: str, root: str = "root") -> None:
        self.model = model
        self.text = text
        self.n_vocab = model.n_vocab
        self._data = np.zeros(self.n_vocab, dtype=_TOKEN_DATA)
        self._data["id"] = np.arange(self.n_vocab, dtype=np.int32)
        self._one = np.zeros(1, dtype=_TOKEN_DATA)
        self._array = llama_cpp.llama_token_data_array(
            data=self._data.ctypes.data_as(llama_cpp.llama_token_data_p), size=self.n_vocab, selected=-1, sorted=False)
        self._one_array = llama_cpp.llama_token_data_array(
            data=self._one.ctypes.data_as(llama_cpp.llama_token_data_p), size=1, selected=-1, sorted=False)
        if not text.strip():
            raise InvalidOptionError("grammar is empty: pass a GBNF grammar with a root rule", param="grammar")
        clear_log()
        smpl, printed = _capturing_stderr(lambda: llama_cpp.llama_sampler_init_grammar(
            model._vocab, text.encode("utf-8"), root.encode("utf-8")))
        if not smpl:
            raise InvalidOptionError(f"grammar does not parse: {_reason(printed)}; check its GBNF syntax "
                                     "(llama.cpp's grammars/README.md)", param="grammar")
        self._initial = GrammarState(self, smpl)
        self._byte_tokens: tuple[np.ndarray, bytes] | None = None

    def byte_tokens(self) -> tuple[np.ndarray, bytes]:
        """The vocabulary's tokens that stand for one printable ASCII byte, a tab or a line break, one a
        byte, and those bytes, in order; the model's end-of-generation token last, without a byte. What
        ``GrammarState.forced_bytes`` asks the grammar about (built once, by tokenizing each byte)."""
        if self._byte_tokens is None:
            ids: list[int] = []
            chars = bytearray()
            for code in (9, 10, *range(32, 127)):
                toks = self.model.tokenize(chr(code), add_special=False)
                if len(toks) == 1 and self.model.piece(toks[0]) == bytes((code,)):
                    ids.append(toks[0])
                    chars.append(code)
            if self.model.eos >= 0:
                ids.append(self.model.eos)
            self._byte_tokens = (np.array(ids, dtype=np.int32), bytes(chars))
        return self._byte_tokens

    def start(self) -> "GrammarState":
        """A fresh state: nothing accepted yet (the caller frees it, or lets it go)."""
        return self._initial.clone()


class GrammarState:
    """The grammar's parse state after some tokens: what it allows next, and the state after one more."""

    __slots__ = ("grammar", "_smpl")

    def __init__(self, grammar: Grammar, smpl: llama_cpp.llama_sampler_p) -> None:
        self.grammar = grammar
        self._smpl = smpl

    def clone(self) -> "GrammarState":
        return GrammarState(self.grammar, llama_cpp.llama_sampler_clone(self._smpl))

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """``logits`` (never modified) with every token this state rules out at ``-inf``: a new float32 array."""
        g = self.grammar
        data = g._data
        data["logit"] = logits
        g._array.size, g._array.selected, g._array.sorted = g.n_vocab, -1, False
        llama_cpp.llama_sampler_apply(self._smpl, ctypes.byref(g._array))
        return data["logit"].copy()

    def allowed(self, tokens: np.ndarray) -> np.ndarray:
        """Which of ``tokens`` (ids in the vocabulary) may come next, as a bool array: one ``apply`` over
        just these candidates, so a few cost microseconds where the whole vocabulary costs milliseconds."""
        g = self.grammar
        n = len(tokens)
        data = g._data[:n] if n > 1 else g._one
        data["id"] = tokens
        data["logit"] = 0.0
        array = g._array if n > 1 else g._one_array
        array.size, array.selected, array.sorted = n, -1, False
        try:
            llama_cpp.llama_sampler_apply(self._smpl, ctypes.byref(array))
            return np.isfinite(data["logit"])
        finally:
            if n > 1:
                g._data["id"][:n] = np.arange(n, dtype=np.int32)  # ``mask`` expects id i at index i

    def allows(self, token: int) -> bool:
        """Whether ``token`` may come next."""
        if not 0 <= token < self.grammar.n_vocab:
            return False
        return bool(self.allowed(np.array([token], dtype=np.int32))[0])

    def forced_bytes(self, max_bytes: int) -> tuple[bytes, bytes]:
        """The text this state forces, up to ``max_bytes`` bytes, and the bytes that may follow it: while
        exactly one of the grammar's ``byte_tokens`` may come next (and the end of generation may not),
        that byte, then the next after it; then the ``byte_tokens``' bytes allowed after the text (the
        one forced byte when ``max_bytes`` stopped it). A guess about the text for a drafter, never a
        rule: it sees only the one-byte tokens of printable ASCII, so where another byte could also come
        next it may name one that is not forced. One ``apply`` over about a hundred candidates a byte;
        the state is left as it was."""
        ids, chars = self.grammar.byte_tokens()
        out = bytearray()
        state: GrammarState = self
        try:
            while True:
                hits = np.flatnonzero(state.allowed(ids))
                # a choice, nothing, or the end may come: the text ends here
                if len(out) >= max_bytes or hits.size != 1 or hits[0] >= len(chars):
                    return bytes(out), bytes(chars[i] for i in hits if i < len(chars))
                if state is self:
                    state = self.clone()
                llama_cpp.llama_sampler_accept(state._smpl, int(ids[hits[0]]))  # allowed: just checked
                out.append(chars[hits[0]])
        finally:
            if state is not self:
                state.free()

    def accept(self, token: int) -> None:
        """Advance past ``token``; ``ValueError`` when this state rules it out (llama.cpp would abort)."""
        if not self.allows(token):
            raise ValueError(f"the grammar rules out token {token} here")
        llama_cpp.llama_sampler_accept(self._smpl, token)

    def free(self) -> None:
        if self._smpl:
            llama_cpp.llama_sampler_free(self._smpl)
            self._smpl = None

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self.free()
        except Exception:
            pass


def _capturing_stderr(call):  # noqa: ANN001, ANN202
    """``call()``'s result and what it printed to the process's stderr (llama.cpp's grammar parser
    prints its reason there, not to its log)."""
    with _STDERR_LOCK, tempfile.TemporaryFile() as tmp:
        saved = os.dup(2)
        try:
            os.dup2(tmp.fileno(), 2)
            result = call()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        tmp.seek(0)
        return result, tmp.read().decode("utf-8", "replace")


def _reason(printed: str) -> str:
    """One line from what the parser printed and logged: its first error line, else the log's."""
    for line in printed.splitlines():
        text = line.strip()
        if "error" in text.lower() or "expecting" in text or "unexpected" in text or "undefined" in text:
            text = text.split(": ", 1)[1] if text.startswith("parse: ") else text
            return shown(text, 160, quote="")
    logged = last_error_line()
    return shown(logged, 160, quote="") if logged else "llama.cpp could not compile it"


def schema_grammar(schema: dict) -> str:
    """The GBNF for JSON that validates against ``schema``, by llama.cpp's JSON-schema converter (the
    Python port llama-cpp-python ships, ``llama_cpp.llama_grammar``). ``InvalidOptionError`` (param
    ``json_schema``) naming what it cannot express (``not``, a pattern without ``^...$``, a remote
    ``$ref``, an unknown type)."""
    import json

    from llama_cpp.llama_grammar import json_schema_to_gbnf

    try:
        return json_schema_to_gbnf(json.dumps(schema))
    except (AssertionError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as err:
        why = shown(str(err) or type(err).__name__, 160, quote="")
        raise InvalidOptionError(f"json_schema cannot be turned into a grammar: {why}; use the JSON Schema "
                                 "features llama.cpp's converter supports (types, properties, required, enum, "
                                 "const, anyOf/oneOf, items, local $ref, patterns anchored ^...$)",
                                 param="json_schema") from None
