"""Contexts that draft from the target itself: its MTP (NextN) layers, and Gemma 4's assistant GGUF."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import llama_cpp
import numpy as np

from localspec.backend.build import clear_log, last_error_line
from localspec.backend.context import (
    Context,
    _flash_attention,
    _float_view,
    _OwnedContext,
    _set_threads,
    synchronized_decode,
)
from localspec.backend.model import Model
from localspec.backend.nextn import mtp_unavailable_reason, nextn_api
from localspec.errors import UnsupportedModelError
from localspec.llama_facts import ASSISTANT_TARGETS, DSPARK_MARKOV_TENSOR
from localspec.models.gguf_header import read_header


def _process_decode(ctx: Any, batch: Any) -> int:
    """``llama_process`` of a ``llama_batch_ext`` as a decode (for ``synchronized_decode``)."""
    return llama_cpp.llama_process(ctx, llama_cpp.LLAMA_PROCESS_TYPE_DECODE, batch)


def _process_encode(ctx: Any, batch: Any) -> int:
    """``llama_process`` of a ``llama_batch_ext`` as an encode (for ``synchronized_decode``)."""
    return llama_cpp.llama_process(ctx, llama_cpp.LLAMA_PROCESS_TYPE_ENCODE, batch)


class _ExtBatchContext(_OwnedContext):
    """What MtpContext, AssistantContext and Eagle3Context share: a llama.cpp context fed through a
    ``llama_batch_ext``."""

    _pos: Any
    n_embd: int
    n_batch: int
    n_ctx: int
    decode_seconds: float

    def _free_batch(self) -> None:
        llama_cpp.llama_batch_ext_free(self._batch)


def _beside(target: Context, *, n_batch: int, n_threads: int | None, n_seq: int) -> Any:
    """The parameters of a drafting context with a cache of its own run beside ``target``'s: as long as the
    target's, ``ctx_other`` its context (what the draft borrows or reads from it), ``n_seq`` sequences in one
    unified pool (> 1: a draft tree's nodes, a sequence each), the target's flash attention setting."""
    params = llama_cpp.llama_context_default_params()
    params.ctx_other = target._ctx
    params.n_ctx = target.n_ctx
    params.n_batch = n_batch
    params.n_ubatch = n_batch
    params.n_seq_max = n_seq
    params.kv_unified = True
    _flash_attention(params, target.flash_attn)
    _set_threads(params, n_threads)
    return params


class _CachedDraftContext(_ExtBatchContext):
    """A drafting context with a KV cache of its own in sequence 0 (MTP, EAGLE-3, DFlash)."""

    _mem: Any

    n_seq: int = 1

    def rollback_to(self, n: int) -> None:
        """Keep positions [0, n) and drop the rest."""
        llama_cpp.llama_memory_seq_rm(self._mem, 0, n, -1)

    def copy_seq(self, src: int, dst: int, p0: int = 0, p1: int = -1) -> None:
        """Make positions [p0, p1) of ``src`` visible to ``dst`` as well (no copy of data): a draft tree's
        node decodes on a sequence of its own that shares its parent's cells."""
        llama_cpp.llama_memory_seq_cp(self._mem, src, dst, p0, p1)

    def remove_seq(self, seq_id: int) -> None:
        """Drop every position of ``seq_id`` (cells other sequences share stay)."""
        llama_cpp.llama_memory_seq_rm(self._mem, seq_id, 0, -1)

    def seq_pos_max(self, seq_id: int) -> int:
        """The largest position ``seq_id`` holds in the cache, -1 when it holds none."""
        return int(llama_cpp.llama_memory_seq_pos_max(self._mem, seq_id))

    @property
    def n_past(self) -> int:
        """Positions the cache holds (0 when empty)."""
        return int(llama_cpp.llama_memory_seq_pos_max(self._mem, 0)) + 1

    def clear(self) -> None:
        llama_cpp.llama_memory_clear(self._mem, True)


# Rows before a decode's first output that a graph keeping every row copies back rather than
# decoding them in a pass of their own (a catch-up after a verification is a few rows; a prompt, more).
_MAX_COPIED_ROWS = 32


class _RowDraftContext(_CachedDraftContext):
    """A drafting context fed rows of (token, position, hidden row) that returns logits and a hidden row
    per output row (the MTP head; EAGLE-3's decoder block, whose hidden row is the next step's g).

    Which rows come back: llama.cpp copies the first ``n_outputs`` rows of a graph's logits and
    hidden tensors. Most graphs keep only the output rows in them (``inp_out_ids``), but EAGLE-3's
    decoder keeps every row of the batch, and so does the hidden row of some MTP graphs (GLM-4.5's
    is taken before its rows are picked): asked for the last row of a catch-up, they hand back the
    first. Both kinds agree only when the output rows are a prefix of the batch, so ``decode``
    makes them one, and every row from the first output to the last is an output (``logits`` and
    ``hidden`` still take the row's index in the batch given). The rows before the first output
    are either outputs too (``_keeps_every_row``: the graph computes their logits anyway, so that
    costs only their copy) or decoded on their own first (a graph that skips the output matrix
    for rows that are not outputs: the extra pass is its layers alone).
    """

    _what: str  # for the errors: "MTP", "EAGLE-3"
    _api: Any
    _keeps_every_row = False  # True: the graph computes every row's logits, outputs or not
    _row0 = 0  # the batch row the last decode's outputs start at
    n_heads = 1  # chained heads, one per draft depth (an MTP model's NextN layers); EAGLE-3's decoder is one
    head = 0  # the head that runs

    def set_head(self, head: int) -> None:
        """Run head ``head`` (0 .. n_heads-1; an MTP model's NextN layer) from the next decode on."""
        if not 0 <= head < self.n_heads:
            raise ValueError(f"head {head} out of range 0..{self.n_heads - 1}")
        if head != self.head:
            self._api.set_nextn_layer_offset(self._ctx, head)
            self.head = head

    def decode(self, tokens: Sequence[int], positions: Sequence[int], hidden: np.ndarray,
               outputs: Sequence[bool], seqs: Sequence[int] | None = None) -> None:
        """One forward pass (two when the rows before the first output go first): row i is
        (``tokens[i]`` at ``positions[i]``, ``hidden[i]``), in sequence ``seqs[i]`` (default 0)."""
        n = len(tokens)
        if n > self.n_batch:
            raise ValueError(f"batch of {n} tokens exceeds n_batch={self.n_batch}")
        rows = np.ascontiguousarray(hidden, dtype=np.float32).reshape(n, self.n_embd)
        wanted = [i for i in range(n) if outputs[i]]
        first, last = (wanted[0], wanted[-1]) if wanted else (n, -1)
        self._row0 = 0
        if self._keeps_every_row and first <= _MAX_COPIED_ROWS:
            first = 0
        elif 0 < first < n:
            self._process_rows(tokens[:first], positions[:first], rows[:first], [False] * first,
                               None if seqs is None else seqs[:first])
            self._row0 = first
        start = self._row0
        self._process_rows(tokens[start:], positions[start:], rows[start:],
                           [first <= i <= last for i in range(start, n)], None if seqs is None else seqs[start:])

    def logits(self, row: int) -> np.ndarray:
        return self._logits_row(row - self._row0, lambda: f"no {self._what} logits were requested for row {row}")

    def hidden(self, row: int) -> np.ndarray:
        """The context's own hidden output at batch row ``row`` (an output row): the next draft's input."""
        return _float_view(self._api.get_embeddings_nextn_ith(self._ctx, row - self._row0), (self.n_embd,),
                           f"no {self._what} hidden row for batch row {row}")

    def _process_rows(self, tokens: Sequence[int], positions: Sequence[int], rows: np.ndarray,
                      outputs: Sequence[bool], seqs: Sequence[int] | None = None) -> None:
        """One decode: row i is (``tokens[i]`` at ``positions[i]``, the row ``rows[i]`` of ``n_embd``)."""
        n = len(tokens)
        if n == 0:
            return
        base = rows.ctypes.data
        stride = self.n_embd * 4
        b = self._batch
        llama_cpp.llama_batch_ext_clear(b)
        for i in range(n):
            idx = llama_cpp.llama_batch_ext_add_token(b, 0 if seqs is None else int(seqs[i]), int(tokens[i]))
            if idx < 0:
                raise RuntimeError(f"llama_batch_ext_add_token failed ({idx})")
            self._pos[0] = positions[i]
            llama_cpp.llama_batch_ext_set_pos(b, idx, self._pos)
            # The hidden state rides in the token-embedding slot: llama_batch_ext_set_embd_state is a stub
            # that returns false in this llama.cpp; its MTP and EAGLE-3 graphs read the row given with
            # set_embd_token.
            embd = llama_cpp.llama_embd(ctypes.cast(base + i * stride, ctypes.POINTER(ctypes.c_float)),
                                        1, self.n_embd)
            if not llama_cpp.llama_batch_ext_set_embd_token(b, idx, embd):
                raise RuntimeError("llama_batch_ext_set_embd_token refused a hidden row")
            llama_cpp.llama_batch_ext_set_output_logits(b, idx, bool(outputs[i]))
        rc, seconds = synchronized_decode(self._ctx, _process_decode, b)
        self.decode_seconds += seconds
        if rc != 0:
            llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(self._ctx), True)
            if rc == 1:
                raise UnsupportedModelError(
                    f"the {self._what} context of {self.n_ctx} tokens is full; start a new chat or raise --ctx")
            raise RuntimeError(f"llama_process ({self._what}) failed with code {rc}")


class MtpContext(_RowDraftContext):
    """A model's MTP (NextN) layers as a second context over the target's weights.

    Row ``p`` of its cache is built from token ``x_p`` at position ``p`` and
    the target's hidden state ``h_{p-1}`` (the row before): its logits predict
    ``x_{p+1}``, and its own hidden output can stand in for the target's to
    draft one more token. The target's ``Model`` must be loaded with
    ``load_mtp=True``; ``head`` selects which NextN layer runs (0: the first).
    Logits and hidden rows are read by batch row and are views valid until the
    next ``decode``. ``n_seq`` > 1: sequences for a draft tree's nodes.
    """

    _what = "MTP"

    def __init__(self, target: Context, *, n_batch: int = 128, n_threads: int | None = None,
                 n_seq: int = 1) -> None:
        model = target.model
        reason = mtp_unavailable_reason()
        if reason is not None:
            raise UnsupportedModelError(reason)
        if model.n_nextn_layers < 1 or not model.load_mtp:
            raise UnsupportedModelError(f"{model.name} was not loaded with its MTP layers")
        api = nextn_api()
        assert api is not None
        self._api = api
        self.model = model
        self.n_embd = model.n_embd_out
        self.n_heads = model.n_nextn_layers
        params = _beside(target, n_batch=n_batch, n_threads=n_threads, n_seq=n_seq)
        params.ctx_type = llama_cpp.LLAMA_CONTEXT_TYPE_MTP
        self.n_seq = n_seq
        self.offloaded: bool = target.offloaded
        """As ``Context.offloaded``: the head runs where the target's layers do."""
        self.cpu_threads: int = params.n_threads
        ctx = llama_cpp.llama_init_from_model(model._model, params)
        if not ctx:
            reason = last_error_line() or "llama.cpp refused the MTP context"
            raise UnsupportedModelError(f"cannot create the MTP context of {model.name}: {reason}")
        self._ctx = ctx
        self._mem = llama_cpp.llama_get_memory(ctx)
        # Output rows only: the head's hidden state is read for the rows it drafts from.
        api.set_embeddings_nextn(ctx, True, True)
        self.n_ctx: int = llama_cpp.llama_n_ctx(ctx)
        self.n_batch: int = min(n_batch, llama_cpp.llama_n_batch(ctx))
        self._batch = llama_cpp.llama_batch_ext_init(ctx)
        self._pos = (llama_cpp.llama_pos * 4)()
        self.head = 0
        self.decode_seconds = 0.0





# --- Gemma 4 assistant -----------------------------------------------------------
# Gemma 4 ships its draft as a separate "assistant" GGUF (architecture gemma4-assistant,
# src/models/gemma4-assistant.cpp). It has no KV cache of its own: its context is created
# with ctx_other = the target's context, and llama.cpp builds its cache as a view of the
# target's (llama_model::create_memory, `share`): each sliding-window layer attends to the
# target's last sliding-window layer's K/V, each global layer to the target's last layer's,
# over the target's own cells. It embeds tokens with the TARGET's token embedding and reads
# the target's post-norm hidden state (the NextN rows, llama_get_embeddings_nextn).



class AssistantContext(_ExtBatchContext):
    """A Gemma 4 assistant model run against its target's cache (a draft that needs no cache).

    One decode is one row: token ``x`` at position ``pos`` (where ``x`` sits in the
    history, not yet in the target's cache) with a hidden row ``h`` of the target's
    width. Its queries attend to every target cell of sequence 0 at positions <= ``pos``;
    it writes nothing there, so it never rolls back. ``logits()`` predict the token
    after ``x``; ``hidden()`` is its own projection back to the target's width, the
    ``h`` of the next draft step. Both are views valid until the next ``decode``.

    Created right after the target's context and before that context decodes:
    llama.cpp resets the shared cells' bookkeeping when it builds the view, so the
    target is cleared here to keep its mirror (``Context.tokens``) true. The
    assistant's own memory is never cleared (that would clear the target's cells).
    """

    def __init__(self, assistant: Model, target: Context, *, n_threads: int | None = None) -> None:
        reason = mtp_unavailable_reason()
        if reason is not None:
            raise UnsupportedModelError(reason)
        want = ASSISTANT_TARGETS.get(assistant.architecture)
        if want is None or target.model.architecture != want:
            raise UnsupportedModelError(
                f"{assistant.path.name} ({assistant.architecture}) is not an assistant for "
                f"{target.model.path.name} ({target.model.architecture}); pair it with a {want or 'matching'} target")
        width = int(llama_cpp.llama_model_n_embd(target.model._model))
        if assistant.n_embd_out != width or assistant.n_vocab != target.model.n_vocab:
            raise UnsupportedModelError(
                f"{assistant.path.name} does not fit {target.model.path.name}: it reads hidden rows of "
                f"{assistant.n_embd_out} and {assistant.n_vocab} tokens, the target has {width} and "
                f"{target.model.n_vocab}; use the assistant published for this target's size")
        api = nextn_api()
        assert api is not None
        self._api = api
        self.model = assistant
        self.target = target
        self.n_embd = width
        self.n_layers = assistant.n_nextn_layers
        target.enable_hidden_rows()
        params = llama_cpp.llama_context_default_params()
        params.ctx_type = llama_cpp.LLAMA_CONTEXT_TYPE_MTP
        params.ctx_other = target._ctx
        params.n_ctx = target.n_ctx
        params.n_batch = 1
        params.n_ubatch = 1
        params.n_seq_max = 1  # it reads sequence 0 of the target's unified cell pool
        params.kv_unified = True
        params.n_rs_seq = 0
        # The view reads the target's V cache in the layout llama.cpp fixes at creation from the flash
        # attention setting asked for (transposed only when disabled; "auto" counts as enabled there):
        # ask as the target did, so both layouts agree.
        _flash_attention(params, target.flash_attn)
        _set_threads(params, n_threads)
        clear_log()
        ctx = llama_cpp.llama_init_from_model(assistant._model, params)
        if not ctx:
            reason = last_error_line() or "llama.cpp refused the assistant context"
            raise UnsupportedModelError(f"cannot run {assistant.path.name} against {target.model.path.name}: {reason}")
        self._ctx = ctx
        target.clear()
        # Output rows only: the assistant's hidden row is read for the row it drafts from.
        api.set_embeddings_nextn(ctx, True, True)
        self._batch = llama_cpp.llama_batch_ext_init(ctx)
        self._pos = (llama_cpp.llama_pos * 4)()
        self._row = np.zeros(width, dtype=np.float32)
        self.decode_seconds = 0.0
        self.decode_calls = 0

    def decode(self, token: int, position: int, hidden: np.ndarray) -> bool:
        """Run the assistant on one row; False when the target's cache has no free cell for it (context full)."""
        np.copyto(self._row, np.asarray(hidden, dtype=np.float32).reshape(self.n_embd))
        b = self._batch
        llama_cpp.llama_batch_ext_clear(b)
        idx = llama_cpp.llama_batch_ext_add_token(b, 0, int(token))
        if idx < 0:
            raise RuntimeError(f"llama_batch_ext_add_token failed ({idx})")
        self._pos[0] = position
        llama_cpp.llama_batch_ext_set_pos(b, idx, self._pos)
        # The hidden row rides in the embedding slot beside the token (the graph reads both).
        embd = llama_cpp.llama_embd(ctypes.cast(self._row.ctypes.data, ctypes.POINTER(ctypes.c_float)), 1, self.n_embd)
        if not llama_cpp.llama_batch_ext_set_embd_token(b, idx, embd):
            raise RuntimeError("llama_batch_ext_set_embd_token refused a hidden row")
        llama_cpp.llama_batch_ext_set_output_logits(b, idx, True)
        rc, seconds = synchronized_decode(self._ctx, _process_decode, b)
        self.decode_seconds += seconds
        self.decode_calls += 1
        if rc == 1:
            return False
        if rc != 0:
            raise RuntimeError(f"llama_process (assistant) failed with code {rc}")
        return True

    def logits(self) -> np.ndarray:
        return self._logits_row(0, lambda: "the assistant returned no logits")

    def hidden(self) -> np.ndarray:
        return _float_view(self._api.get_embeddings_nextn_ith(self._ctx, 0), (self.n_embd,),
                           "the assistant returned no hidden row")


class _TapContext(_CachedDraftContext):
    """A draft that reads the target's tapped layer inputs (EAGLE-3, DFlash), in a context of its own beside
    the target's: what building one takes, once for both."""

    model: Model
    target: Context
    layers: tuple[int, ...]

    def _open(self, draft: Model, target: Context, *, what: str, n_batch: int, n_threads: int | None,
              n_seq: int) -> None:
        """Refuse a build that cannot tap the target's layers, read the layers ``draft`` taps (``layers``) and
        create its context (``what``: "EAGLE-3", "DFlash", for the refusals)."""
        from localspec.backend.feature_taps import eagle3_unavailable_reason, tap_api

        reason = eagle3_unavailable_reason()
        if reason is not None:
            article = "an" if what[0] in "AEIOU" else "a"
            raise UnsupportedModelError(reason.replace("an EAGLE-3 draft", f"{article} {what} draft"))
        taps = tap_api()
        assert taps is not None
        self.model = draft
        self.target = target
        n_ids = int(taps.model_target_layer_ids_n(draft._model))
        ids = taps.model_target_layer_ids(draft._model)
        self.layers = tuple(int(ids[i]) for i in range(n_ids))
        # ctx_other: the target's token embedding and output matrix, for a draft that has none.
        params = _beside(target, n_batch=n_batch, n_threads=n_threads, n_seq=n_seq)
        self.n_seq = n_seq
        clear_log()
        ctx = llama_cpp.llama_init_from_model(draft._model, params)
        if not ctx:
            reason = last_error_line() or f"llama.cpp refused the {what} context"
            raise UnsupportedModelError(f"cannot run {draft.path.name} beside {target.model.path.name}: {reason}")
        self._ctx = ctx
        self._mem = llama_cpp.llama_get_memory(ctx)

    def _ready(self, n_batch: int) -> None:
        """What the context's decodes use, once llama.cpp has it set up."""
        self.n_ctx = int(llama_cpp.llama_n_ctx(self._ctx))
        self.n_batch = min(n_batch, int(llama_cpp.llama_n_batch(self._ctx)))
        self._batch = llama_cpp.llama_batch_ext_init(self._ctx)
        self._pos = (llama_cpp.llama_pos * 4)()
        self.decode_seconds = 0.0


# --- EAGLE-3 -----------------------------------------------------------------------
# An EAGLE-3 draft (src/models/eagle3.cpp) is two graphs in one context: the encoder
# (LLAMA_PROCESS_TYPE_ENCODE on embedding rows) projects the target's three tapped layer
# inputs at a position, side by side, to one row g of the draft's width (``fc``); the
# decoder, one transformer block with its own KV cache, reads at position P the token
# x_{P+1} and g_P and predicts x_{P+2}. Both hand back a row through the NextN output
# (``llama_get_embeddings_nextn``): the encoder's g, the decoder's pre-norm state, which
# stands in for g when the draft drafts on from its own output. A draft without its own
# token embedding or output matrix borrows the target's (the context's ``ctx_other``).

class Eagle3Context(_RowDraftContext, _TapContext):
    """An EAGLE-3 draft model run beside its target's context.

    ``encode(features)`` turns rows of the target's tapped layer inputs
    (``Context.layer_features``) into rows g of the draft's width; ``decode``
    runs the decoder block (row i: ``tokens[i]`` at ``positions[i]`` with
    ``g[i]``), ``logits(row)``/``hidden(row)`` read an output row back (views
    valid until the next call). ``layers``: the target layers it reads.
    ``n_seq`` > 1: sequences for a draft tree's nodes (``copy_seq``, ``remove_seq``).
    """

    _what = "EAGLE-3"
    _keeps_every_row = True  # src/models/eagle3.cpp picks no output rows

    def __init__(self, draft: Model, target: Context, *, n_batch: int = 128, n_threads: int | None = None,
                 n_seq: int = 1) -> None:
        self._open(draft, target, what="EAGLE-3", n_batch=n_batch, n_threads=n_threads, n_seq=n_seq)
        api = nextn_api()
        assert api is not None
        self._api = api
        self.n_embd = int(llama_cpp.llama_model_n_embd(draft._model))
        self.n_features = len(self.layers) * int(llama_cpp.llama_model_n_embd(target.model._model))
        # Output rows only: the encoder marks every row as one, the decoder the rows it drafts from.
        api.set_embeddings_nextn(self._ctx, True, True)
        self._ready(n_batch)
        self.encode_seconds = 0.0

    def encode(self, features: np.ndarray) -> np.ndarray:
        """g for each row of ``features`` (``(n, n_features)``): ``(n, n_embd)`` float32, a copy."""
        rows = np.ascontiguousarray(features, dtype=np.float32).reshape(-1, self.n_features)
        out = np.empty((len(rows), self.n_embd), dtype=np.float32)
        stride = self.n_features * 4
        for start in range(0, len(rows), self.n_batch):
            chunk = rows[start:start + self.n_batch]
            base = chunk.ctypes.data
            b = self._batch
            llama_cpp.llama_batch_ext_clear(b)
            # The encoder has no attention: positions are placeholders after what the cache holds
            # (as llama.cpp's draft-eagle3 does), which the batch check accepts.
            pos = self.n_past
            for i in range(len(chunk)):
                embd = llama_cpp.llama_embd(ctypes.cast(base + i * stride, ctypes.POINTER(ctypes.c_float)),
                                            1, self.n_features)
                idx = llama_cpp.llama_batch_ext_add_embd(b, 0, embd)
                if idx < 0:
                    raise RuntimeError(f"llama_batch_ext_add_embd failed ({idx})")
                self._pos[0] = pos + i
                llama_cpp.llama_batch_ext_set_pos(b, idx, self._pos)
                llama_cpp.llama_batch_ext_set_output_embd(b, idx, True)
            rc, seconds = synchronized_decode(self._ctx, _process_encode, b)
            self.encode_seconds += seconds
            if rc != 0:
                raise RuntimeError(f"llama_process (EAGLE-3 encoder) failed with code {rc}")
            out[start:start + len(chunk)] = _float_view(self._api.get_embeddings_nextn(self._ctx),
                                                        (len(chunk), self.n_embd), "the EAGLE-3 encoder returned nothing")
        return out




# --- DFlash ------------------------------------------------------------------------
# A DFlash draft (src/models/dflash.cpp) keeps a KV cache built from the target's features
# rather than from tokens: a batch of embedding rows (the target's tapped layer inputs at a
# position, side by side) is projected (``fc``, then ``enc.output_norm``) and written into
# every layer's K/V at that position. A token batch ``[x_last, MASK * k]`` at the positions
# after the features then attends to that cache and, non-causally, to itself: row i predicts
# the token i places after ``x_last``, all k of them in ONE pass.
#
# DSpark (the same architecture with a Markov head, ``markov_w1``/``markov_w2``) adds to each
# row's logits a bias from the token before it: the anchor ``x_last`` for the first, then the
# argmax of the row before (the graph chains it greedily). Trained "anchor first", its block is
# ``[x_last, MASK * (k - 1)]`` and row i predicts the token i + 1 places on, next-token style,
# so a pass drafts as many tokens as the block has rows; an optional confidence head scores each
# row (the chance it is accepted). The graph keeps every row (it picks no output rows), and
# llama.cpp copies back the first ``n_outputs``: every row of the block is an output.

class DFlashContext(_TapContext):
    """A DFlash (or DSpark) draft model run beside its target's context.

    ``inject(features, positions)`` writes rows of the target's tapped layer inputs
    (``Context.layer_features``) into the draft's cache; ``draft_block(token, position, draft_len)``
    decodes the block that drafts ``k`` tokens after ``token`` at ``position``, and
    ``logits(i)`` (i = 1..k) is the distribution of the token i places after ``token``;
    ``confidence(i)``: a DSpark confidence head's score for it (None without one).
    ``block_size``: the block the draft was trained on; ``max_draft_len``: the most tokens a pass
    drafts (``block_size - 1``; a DSpark trained anchor-first, ``block_size``).
    """

    def __init__(self, draft: Model, target: Context, *, n_batch: int = 128, n_threads: int | None = None) -> None:
        self.block_size = int(draft.metadata("dflash.block_size") or 16)  # llama.cpp's default
        tensors = {t.name for t in read_header(draft.path).tensors}
        self.markov = DSPARK_MARKOV_TENSOR in tensors  # a DSpark draft
        self.anchor_first = self.markov and (draft.metadata("dflash.sample_from_anchor") or "true") == "true"
        self.has_confidence = self.markov and "conf_proj.weight" in tensors
        self.max_draft_len = self.block_size if self.anchor_first else max(1, self.block_size - 1)
        self.mask_token = int(llama_cpp.llama_vocab_mask(llama_cpp.llama_model_get_vocab(draft._model)))
        causal = (draft.metadata("dflash.attention.causal") or "false") == "true"
        self._open(draft, target, what="DFlash", n_batch=n_batch, n_threads=n_threads, n_seq=1)
        self.n_embd = len(self.layers) * int(llama_cpp.llama_model_n_embd(target.model._model))
        llama_cpp.llama_set_causal_attn(self._ctx, causal)  # the block attends to itself both ways
        self._api = nextn_api() if self.has_confidence else None
        if self._api is not None:
            self._api.set_embeddings_nextn(self._ctx, True, True)  # the confidence head's scores
        self._ready(n_batch)

    def inject(self, features: np.ndarray, positions: Sequence[int]) -> None:
        """Write the target's features for ``positions`` into the draft's cache (rows of ``n_embd``)."""
        rows = np.ascontiguousarray(features, dtype=np.float32).reshape(-1, self.n_embd)
        stride = self.n_embd * 4
        for start in range(0, len(rows), self.n_batch):
            chunk = rows[start:start + self.n_batch]
            base = chunk.ctypes.data
            b = self._batch
            llama_cpp.llama_batch_ext_clear(b)
            for i in range(len(chunk)):
                embd = llama_cpp.llama_embd(ctypes.cast(base + i * stride, ctypes.POINTER(ctypes.c_float)),
                                            1, self.n_embd)
                idx = llama_cpp.llama_batch_ext_add_embd(b, 0, embd)
                if idx < 0:
                    raise RuntimeError(f"llama_batch_ext_add_embd failed ({idx})")
                self._pos[0] = positions[start + i]
                llama_cpp.llama_batch_ext_set_pos(b, idx, self._pos)
            self._run(b)

    def draft_block(self, token: int, position: int, draft_len: int) -> None:
        """Decode the block that drafts ``draft_len`` tokens after ``token`` at ``position``:
        ``[token, MASK * draft_len]`` (anchor first: ``[token, MASK * (draft_len - 1)]``), every row an output."""
        if not 1 <= draft_len <= self.max_draft_len:
            raise ValueError(f"a pass drafts 1 to {self.max_draft_len} tokens, not {draft_len}")
        n = draft_len if self.anchor_first else draft_len + 1
        if n > self.n_batch:
            raise ValueError(f"a block of {n} tokens exceeds n_batch={self.n_batch}")
        b = self._batch
        llama_cpp.llama_batch_ext_clear(b)
        for i in range(n):
            idx = llama_cpp.llama_batch_ext_add_token(b, 0, int(token) if i == 0 else self.mask_token)
            if idx < 0:
                raise RuntimeError(f"llama_batch_ext_add_token failed ({idx})")
            self._pos[0] = position + i
            llama_cpp.llama_batch_ext_set_pos(b, idx, self._pos)
            llama_cpp.llama_batch_ext_set_output_logits(b, idx, True)
        self._run(b)

    def _row(self, i: int) -> int:
        """The block row holding draft ``i`` (1..k)."""
        return i - 1 if self.anchor_first else i

    def _run(self, b: Any) -> None:
        rc, seconds = synchronized_decode(self._ctx, _process_decode, b)
        self.decode_seconds += seconds
        if rc != 0:
            self.clear()
            if rc == 1:
                raise UnsupportedModelError(
                    f"the DFlash context of {self.n_ctx} tokens is full; start a new chat or raise --ctx")
            raise RuntimeError(f"llama_process (DFlash) failed with code {rc}")

    def logits(self, i: int) -> np.ndarray:
        """The logits of draft ``i`` (1..draft_len) of the last ``draft_block``."""
        return self._logits_row(self._row(i), lambda: f"no DFlash logits for draft {i}")

    def confidence(self, i: int) -> float | None:
        """A DSpark confidence head's score for draft ``i`` of the last ``draft_block`` (None: no head)."""
        if self._api is None:
            return None
        return float(_float_view(self._api.get_embeddings_nextn_ith(self._ctx, self._row(i)), (1,),
                                 f"no DSpark confidence for draft {i}")[0])

