"""``Context``: one KV cache over a model, decoded in batches with logits for chosen rows only.

Rows are read back with ``llama_get_logits_ith`` (never an n_ctx x n_vocab buffer);
``rollback_to`` is ``llama_memory_seq_rm``; sequences are copied and kept for
multi-branch verification.
"""

from __future__ import annotations

import ctypes
import os
import time
from typing import Any, Callable, Sequence

import llama_cpp
import numpy as np

from localspec.backend.build import (
    _FA_TILES_ENV,
    CUDA_INVARIANT_ROWS,
    cpu_flash_attention,
    cuda_batch_invariant,
    default_threads,
    gpu_offload_supported,
    last_error_line,
    native_library,
)
from localspec.backend.model import Model
from localspec.backend.nextn import mtp_unavailable_reason, nextn_api
from localspec.errors import ModelFileError, UnsupportedModelError
from localspec.llama_facts import ROLLBACK_SNAPSHOTS
from localspec.token_ids import common_prefix


def _set_threads(params: Any, n_threads: int | None) -> None:
    """Context params: ``n_threads`` (default: ``default_threads()``, a thread per physical core) for single tokens and batches alike."""
    threads = n_threads or default_threads()
    params.n_threads = threads
    params.n_threads_batch = threads
    params.no_perf = True


def _fa_tiles_from() -> int:
    """Rows from which our build's batch-invariant flash attention takes tiles (its ``GGML_CPU_FA_TILES_FROM``)."""
    try:
        rows = int(os.environ.get(_FA_TILES_ENV, ""))
    except ValueError:
        rows = 0
    return rows if rows > 0 else 2**31


def _default_flash_attention() -> bool | None:
    """Flash attention for a context not told otherwise: None ("auto") with a GPU build or where the CPU
    kernel is batch-invariant (``cpu_flash_attention``), else False, so verification stays exact."""
    return None if gpu_offload_supported() or cpu_flash_attention() else False


def _flash_attention(params: Any, flash_attn: bool | None) -> None:
    params.flash_attn_type = (llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO if flash_attn is None else
                              llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn else
                              llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED)


def _float_view(ptr: Any, shape: tuple[int, ...], missing: str) -> np.ndarray:
    """A read-only float32 view of llama.cpp's buffer at ``ptr``; ``missing``: the error when it is NULL."""
    if not ptr:
        raise RuntimeError(missing)
    view = np.ctypeslib.as_array(ptr, shape=shape)
    view.flags.writeable = False
    return view


def _address_function(name: str) -> Any:
    """libllama's ``name(ctx, int32) -> float *`` returning the address as an int (0 for NULL): a binding of
    our own (``CDLL[name]`` is a new function object, so llama-cpp-python's binding keeps its types)."""
    fn = native_library()[name]
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_int32], ctypes.c_void_p
    return fn


class RowViews:
    """Rows of one of llama.cpp's output buffers (logits, hidden rows) as read-only float32 views, each
    view made once per address and kept.

    Why: a decode step reads a row or two, and making a numpy view of a ctypes pointer costs ~10 us, as
    much as the step's own Python work on a fast device. llama.cpp hands out row pointers into a buffer
    it reuses from decode to decode, so the same few addresses come back and a view of one stays valid:
    whenever ``row_address`` returns an address, ``width`` floats there are llama.cpp's row (a view
    aliases the buffer, as the row pointer does; valid until the next decode, as before). The cache is
    bounded: a buffer that moved leaves its old addresses behind, and past ``MAX_VIEWS`` they are
    dropped.
    """

    MAX_VIEWS = 4096

    def __init__(self, row_address: Any, width: int) -> None:
        self._address = row_address
        self._width = width
        self._views: dict[int, np.ndarray] = {}

    def __call__(self, ctx: Any, row: int) -> np.ndarray | None:
        """Row ``row``'s view; None where llama.cpp has no such row."""
        addr = self._address(ctx, row)
        view = self._views.get(addr)  # type: ignore[arg-type]
        if view is None:
            if not addr:
                return None
            if len(self._views) >= self.MAX_VIEWS:
                self._views.clear()
            # The read-only view's base is a writeable one over the same floats, so an argmax (numpy's
            # wants a writeable array) reads it without a copy (``sampling.argmax``).
            view = np.frombuffer((ctypes.c_float * self._width).from_address(addr), dtype=np.float32).view()
            view.flags.writeable = False
            self._views[addr] = view
        return view


_logits_address: Any = None


def logits_rows(width: int) -> RowViews:
    """``RowViews`` over ``llama_get_logits_ith`` for a vocabulary of ``width`` tokens."""
    global _logits_address
    if _logits_address is None:
        _logits_address = _address_function("llama_get_logits_ith")
    return RowViews(_logits_address, width)


def synchronized_decode(ctx: Any, run: Callable[[Any, Any], int], batch: Any) -> tuple[int, float]:
    """``run(ctx, batch)`` (``llama_decode``, ``llama_process``), then wait until the device has finished
    it: (its return code, the seconds from the call to the end of the work).

    On an asynchronous backend (CUDA) the call returns once the work is queued; without the wait the
    time would land wherever the rows are first read (the acceptance rule's Python, on a GPU), and every
    split of a step into drafting, verifying and the rest (the dashboard's, the controller's costs, the
    server's timings) would be wrong. On the CPU the call is synchronous and the wait costs nothing.
    """
    t0 = time.perf_counter()
    rc = run(ctx, batch)
    if rc == 0:
        llama_cpp.llama_synchronize(ctx)
    return rc, time.perf_counter() - t0


class _OwnedContext:
    """A llama.cpp context and its batch, freed once by ``close`` (or at garbage collection)."""

    _ctx: Any
    _batch: Any

    model: Model
    _rows: RowViews | None = None

    @property
    def handle(self) -> Any:
        """The llama.cpp context itself (``benchmarks/bench_step_overhead.py`` runs raw llama.cpp calls on
        the engine's own cache, so that where llama.cpp placed it weighs alike on both sides). Whoever
        decodes with it must ``clear`` this context afterwards: its mirror of the cache no longer holds."""
        return self._ctx

    def _free_batch(self) -> None:
        llama_cpp.llama_batch_free(self._batch)

    def _logits_row(self, row: int, missing: Callable[[], str]) -> np.ndarray:
        """The logits of batch row ``row`` of the last decode (``missing``: the error where there are none)."""
        if self._rows is None:
            self._rows = logits_rows(self.model.n_vocab)
        view = self._rows(self._ctx, row)
        if view is None:
            raise RuntimeError(missing())
        return view

    def close(self) -> None:
        if getattr(self, "_ctx", None):
            self._free_batch()
            llama_cpp.llama_free(self._ctx)
            self._ctx = None

    def __del__(self) -> None:  # pragma: no cover
        try:
            self.close()
        except Exception:
            pass


class Context(_OwnedContext):
    """One KV cache over a model, with up to ``n_seq`` parallel sequences.

    ``tokens`` mirrors what sequence 0 holds, position by position, so callers
    can find the prefix they share with a new request and keep it.

    ``n_rs_seq``: recurrent-state snapshots per sequence, on a model whose
    ``rollback`` is ``"snapshots"`` (default ``ROLLBACK_SNAPSHOTS``; 0 on any other).
    """

    def __init__(self, model: Model, *, n_ctx: int, n_batch: int = 512, n_seq: int = 1,
                 n_threads: int | None = None, flash_attn: bool | None = None,
                 n_rs_seq: int | None = None) -> None:
        self.model = model
        params = llama_cpp.llama_context_default_params()
        # llama.cpp rounds n_ctx up to a multiple of 256 but clamps n_batch to the n_ctx it was given:
        # ask for the rounded size, or a tiny n_ctx leaves fewer batch rows than sequences (an abort).
        params.n_ctx = -(-n_ctx // 256) * 256
        params.n_batch = n_batch
        params.n_ubatch = min(n_batch, 512)
        params.n_seq_max = n_seq
        if n_rs_seq is None:
            n_rs_seq = ROLLBACK_SNAPSHOTS if model.rollback == "snapshots" else 0
        params.n_rs_seq = n_rs_seq
        # Candidate branches are extra sequences over ONE cell pool: each sees the
        # shared history through seq_cp without copying, and keeps the full window.
        params.kv_unified = True
        # Flash attention: "auto" with a GPU build (it saves memory and time) and on a CPU build
        # whose kernel is batch-invariant; off on any other CPU build (``cpu_flash_attention``).
        self.flash_attn = _default_flash_attention() if flash_attn is None else flash_attn
        """The flash attention setting asked for (None: llama.cpp's "auto"); contexts reading this one's cache ask the same."""
        _flash_attention(params, self.flash_attn)
        _set_threads(params, n_threads)
        self.n_threads = n_threads
        """The thread count asked for (None: the backend default)."""
        self.cpu_threads: int = params.n_threads
        """The threads llama.cpp decodes with on the CPU (``n_threads``, or the default it stands for)."""
        # Only the rows a caller asks for are ever computed (see decode).
        params.embeddings = False
        ctx = llama_cpp.llama_init_from_model(model._model, params)
        if not ctx:
            reason = last_error_line() or "out of memory?"
            raise ModelFileError(
                f"cannot create a context of {n_ctx} tokens for {model.path.name}: {reason}; "
                "try a smaller --ctx"
            )
        self._ctx = ctx
        self._mem = llama_cpp.llama_get_memory(ctx)
        # llama.cpp may round n_ctx up and clamp n_batch to it: use what it chose.
        self.n_ctx: int = llama_cpp.llama_n_ctx(ctx)
        self.n_batch: int = min(n_batch, llama_cpp.llama_n_batch(ctx))
        self.max_verify_rows: int = self.n_batch
        """The most rows one verification batch may hold and still match one-token decodes: fewer than
        the rows from which batch-invariant CPU flash attention takes its tiles, where it is on; on a GPU
        under our CUDA batch-invariant switch, the rows its kernels cover (``cuda_batch_invariant``)."""
        on_gpu = gpu_offload_supported()
        self.offloaded: bool = model.split is not None or (on_gpu and model.n_gpu_layers != 0)
        """Whether decodes run (in part) on a device other than this CPU: a GPU, or RPC servers."""
        self.cuda_batch_invariant = on_gpu and bool(cuda_batch_invariant())
        """Whether this context decodes under our CUDA batch-invariant switch (verification rows: at most 8)."""
        if self.cuda_batch_invariant:
            self.max_verify_rows = min(self.n_batch, CUDA_INVARIANT_ROWS)
        elif self.flash_attn is not False and cpu_flash_attention() and not on_gpu:
            self.max_verify_rows = min(self.n_batch, _fa_tiles_from() - 1)
        self.n_seq = n_seq
        # What llama.cpp granted: it sets n_rs_seq to 0 for an architecture it cannot snapshot.
        self.n_rs_seq: int = int(llama_cpp.llama_n_rs_seq(ctx))
        self.max_rollback: int | None = None if model.rollback == "cache" else self.n_rs_seq
        """The most tokens one rollback may take back: None (any suffix) for an attention-only
        model, ``n_rs_seq`` for a snapshot model, 0 for one that cannot roll back."""
        # Tokens of sequence 0 the next rollback may take back (contexts with a recurrent state):
        # see _note_batch.
        self._rollback_room = 0
        self._batch = llama_cpp.llama_batch_init(n_batch, 0, n_seq)
        # The batch's arrays as numpy views, so a batch of many tokens is written in a few vector
        # assignments instead of a ctypes call per field; every row starts in sequence 0 alone, and
        # ``_custom_rows`` says how many leading rows a branching batch may have given other sequences.
        b = self._batch
        self._b_token = np.ctypeslib.as_array(b.token, shape=(n_batch,))
        self._b_pos = np.ctypeslib.as_array(b.pos, shape=(n_batch,))
        self._b_nseq = np.ctypeslib.as_array(b.n_seq_id, shape=(n_batch,))
        self._b_out = np.ctypeslib.as_array(b.logits, shape=(n_batch,))
        self._b_nseq[:] = 1
        for i in range(n_batch):
            b.seq_id[i][0] = 0
        self._custom_rows = 0
        self._iota = np.arange(n_batch, dtype=np.int32)
        self._n_vocab = model.n_vocab
        self._rows = logits_rows(model.n_vocab)
        self.tokens: list[int] = []
        # Seconds of decoding since construction, each decode timed until the device finished it
        # (``synchronized_decode``): lets callers split a step into time in llama.cpp and time in Python.
        self.decode_seconds = 0.0
        self.decode_calls = 0
        # Called after every successful decode with (tokens, positions, seq_ids): an MTP drafter
        # copies the target's hidden rows here, before the next decode overwrites them.
        self._decode_listeners: list[DecodeListener] = []
        self._hidden_rows = False
        self._layer_taps: tuple[int, ...] = ()

    # --- decoding ----------------------------------------------------------
    def decode(self, tokens: Sequence[int], positions: Sequence[int],
               seq_ids: Sequence[Sequence[int]] | None = None,
               outputs: Sequence[bool] | None = None) -> None:
        """Run one forward pass over a batch of at most ``n_batch`` tokens.

        ``positions[i]`` is where ``tokens[i]`` sits in its sequence(s);
        ``seq_ids[i]`` lists the sequences it belongs to (default: sequence 0),
        so tokens shared by several branches are computed once; ``outputs[i]``
        asks for the logits of row i (default: the last row only). Read them
        with ``logits(i)``. Does not touch ``tokens``; see ``append``.
        """
        n = len(tokens)
        if n == 0:
            return
        if n > self.n_batch:
            raise ValueError(f"batch of {n} tokens exceeds n_batch={self.n_batch}")
        b = self._batch
        b.n_tokens = n
        if n == 1:  # a plain step or a draft token: three fields
            b.token[0] = tokens[0]
            b.pos[0] = positions[0]
            b.logits[0] = True if outputs is None else bool(outputs[0])
        else:
            self._b_token[:n] = tokens
            if isinstance(positions, range) and positions.step == 1:
                np.add(self._iota[:n], positions.start, out=self._b_pos[:n])
            else:
                self._b_pos[:n] = positions
            if outputs is None:
                self._b_out[:n] = 0
                self._b_out[n - 1] = 1
            else:
                self._b_out[:n] = outputs
        if seq_ids is not None:
            self._set_sequences(n, seq_ids)
        elif self._custom_rows:
            self._reset_sequences()
        rc, seconds = synchronized_decode(self._ctx, llama_cpp.llama_decode, b)
        self.decode_seconds += seconds
        self.decode_calls += 1
        if rc != 0:
            # 1: no KV slot (context full); <0: hard error. Either way the cache
            # may hold part of the batch, so our mirror can no longer be trusted.
            self.clear()
            if rc == 1:
                raise UnsupportedModelError(
                    f"the context of {self.n_ctx} tokens is full; start a new chat or raise --ctx"
                )
            raise RuntimeError(f"llama_decode failed with code {rc}")
        if self.max_rollback is not None:
            self._note_batch(seq_ids)

        for listener in self._decode_listeners:
            listener(tokens, positions, seq_ids)

    def _set_sequences(self, n: int, seq_ids: Sequence[Sequence[int]]) -> None:
        """Row i of the next batch belongs to the sequences ``seq_ids[i]``."""
        b = self._batch
        for i in range(n):
            ids = seq_ids[i]
            b.n_seq_id[i] = len(ids)
            row = b.seq_id[i]
            for j, s in enumerate(ids):
                row[j] = s
        self._custom_rows = max(self._custom_rows, n)

    def _reset_sequences(self) -> None:
        """Every row back in sequence 0 alone (after a branching batch)."""
        b = self._batch
        self._b_nseq[: self._custom_rows] = 1
        for i in range(self._custom_rows):
            b.seq_id[i][0] = 0
        self._custom_rows = 0

    def _note_batch(self, seq_ids: Sequence[Sequence[int]] | None) -> None:
        """Record how far sequence 0 may be rolled back after this batch.

        llama.cpp writes snapshot s (the state s tokens back) only while
        decoding a batch that holds those tokens: after a batch of m tokens,
        snapshots 1..min(m - 1, n_rs_seq) are valid, the others hold older
        states. ``llama_memory_seq_rm`` checks only ``n_rs_seq``, so a rollback
        past the batch's first token, or over several one-token decodes, would
        succeed and leave a wrong state; ``rollback_to`` refuses it instead.
        """
        n0 = self._batch.n_tokens if seq_ids is None else sum(1 for ids in seq_ids if 0 in ids)
        if n0:
            self._rollback_room = min(self.n_rs_seq, n0 - 1)

    def logits(self, row: int) -> np.ndarray:
        """Logits of batch row ``row`` from the last decode: a read-only float32 view."""
        view = self._rows(self._ctx, row)  # (``_logits_row``'s work, a call shorter: it runs every row)
        if view is None:
            raise RuntimeError(f"no logits were requested for row {row}")
        return view

    # --- hidden rows for an MTP head -----------------------------------------
    def enable_hidden_rows(self) -> None:
        """Keep the hidden state (the NextN input) of EVERY row of each decode, not only the output rows.

        Costs the last layer's work on rows whose logits nobody asked for; only
        a context serving an MTP drafter turns it on. Read them with ``hidden_rows``.
        """
        api = nextn_api()
        if api is None:
            raise UnsupportedModelError(mtp_unavailable_reason() or "no NextN API")
        api.set_embeddings_nextn(self._ctx, True, False)
        self._hidden_rows = True

    def hidden_rows(self, n: int) -> np.ndarray:
        """The hidden rows of the last decode's ``n`` batch rows, ``(n, n_embd_out)`` float32, read-only view."""
        api = nextn_api()
        if not self._hidden_rows or api is None:
            raise RuntimeError("hidden rows were not enabled on this context")
        return _float_view(api.get_embeddings_nextn(self._ctx), (n, self.model.n_embd_out),
                           "llama.cpp returned no hidden rows for the last decode")

    # --- layer inputs for an EAGLE-3 draft ---------------------------------------
    def enable_layer_taps(self, layers: Sequence[int]) -> None:
        """Keep the input of each layer in ``layers`` for EVERY row of each decode (an EAGLE-3 draft's
        features). Read them with ``layer_features``. The caller checks the ids against ``n_layers``
        and the architecture (``localspec.llama_facts.LAYER_TAP_ARCHITECTURES``): llama.cpp aborts on
        a layer its graph does not expose."""
        from localspec.backend.feature_taps import eagle3_unavailable_reason, tap_api

        api = tap_api()
        if api is None:
            raise UnsupportedModelError(eagle3_unavailable_reason() or "no feature-tap API")
        for lid in layers:
            api.set_embeddings_layer_inp(self._ctx, int(lid), True)
        self._layer_taps = tuple(int(i) for i in layers)

    def layer_features(self, n: int) -> np.ndarray:
        """The tapped layers' inputs for the last decode's ``n`` batch rows, side by side in the order the
        taps were given: ``(n, len(taps) * n_embd)`` float32 (a copy)."""
        from localspec.backend.feature_taps import tap_api

        api = tap_api()
        if not self._layer_taps or api is None:
            raise RuntimeError("layer taps were not enabled on this context")
        width = int(llama_cpp.llama_model_n_embd(self.model._model))
        return np.concatenate([_float_view(api.get_embeddings_layer_inp(self._ctx, lid), (n, width),
                                           f"llama.cpp returned no input for layer {lid}")
                               for lid in self._layer_taps], axis=1)

    def add_decode_listener(self, listener: "DecodeListener") -> None:
        """Call ``listener(tokens, positions, seq_ids)`` after every successful decode (seq_ids None: all 0)."""
        self._decode_listeners.append(listener)

    def remove_decode_listener(self, listener: "DecodeListener") -> None:
        if listener in self._decode_listeners:
            self._decode_listeners.remove(listener)

    def append(self, tokens: Sequence[int], *, outputs: str = "last") -> None:
        """Decode ``tokens`` at the end of sequence 0, in chunks of ``n_batch``.

        ``outputs`` is ``"last"`` (logits of the final token, row ``len(chunk)-1``
        of the final chunk) or ``"all"`` (only allowed when one chunk suffices).
        """
        if not tokens:
            return
        if len(self.tokens) + len(tokens) > self.n_ctx:
            raise UnsupportedModelError(
                f"{len(self.tokens) + len(tokens)} tokens do not fit in the context of {self.n_ctx}; raise --ctx"
            )
        if outputs == "all" and len(tokens) > self.n_batch:
            raise ValueError("outputs='all' needs the tokens to fit in one batch")
        start = 0
        while start < len(tokens):
            chunk = tokens[start:start + self.n_batch]
            pos0 = len(self.tokens)
            out = None if outputs == "last" else [True] * len(chunk)
            self.decode(chunk, range(pos0, pos0 + len(chunk)), None, out)
            self.tokens.extend(chunk)
            start += len(chunk)

    def scratch(self, n_ctx: int, n_batch: int = 64) -> "Context":
        """A second, small context over the same model weights, with this one's threads and attention
        settings: for timing a decode at another depth side by side with this one (close it after)."""
        return Context(self.model, n_ctx=n_ctx, n_batch=n_batch, n_threads=self.n_threads,
                       flash_attn=self.flash_attn)

    # --- cache surgery -----------------------------------------------------
    def rollback_to(self, n: int, seq_id: int = 0) -> None:
        """Keep the first ``n`` positions of ``seq_id`` and drop the rest.

        With a recurrent state (``max_rollback`` not None) sequence 0 can be cut
        back only as far as ``keepable`` says, or to 0; anything else raises.
        """
        if n >= len(self.tokens) and seq_id == 0:
            return
        if seq_id == 0 and 0 < n < len(self.tokens) and self.keepable(n) != n:
            self._refuse_rollback(len(self.tokens) - n)
        ok = llama_cpp.llama_memory_seq_rm(self._mem, seq_id, n, -1)
        if not ok:
            self._refuse_rollback(len(self.tokens) - n)
        if seq_id == 0:
            del self.tokens[n:]
            # A snapshot is used once: the next rollback waits for the next batch.
            self._rollback_room = 0

    def keepable(self, n: int) -> int:
        """How much of the first ``n`` positions of sequence 0 survives cutting the cache back now.

        ``n`` itself when ``rollback_to(n)`` can keep them (always, for an
        attention-only model); 0 when a recurrent state cannot be rewound that
        far (clearing it always works, and the caller decodes from the start).
        """
        cut = len(self.tokens) - n
        if n <= 0 or cut <= 0 or self.max_rollback is None or cut <= self._rollback_room:
            return max(n, 0)
        return 0

    def _refuse_rollback(self, cut: int) -> None:
        if not self.n_rs_seq:
            raise UnsupportedModelError(
                f"{self.model.path.name} cannot roll back its cache ({self.model.architecture} keeps one "
                "running state); decode it plainly, without a drafter"
            )
        raise UnsupportedModelError(
            f"{self.model.path.name} cannot take back {cut} tokens: its recurrent state keeps snapshots "
            f"of at most the last {self._rollback_room} tokens of its last batch (n_rs_seq={self.n_rs_seq}); "
            "draft fewer tokens at once"
        )

    def remove_seq(self, seq_id: int, p0: int = 0, p1: int = -1) -> None:
        """Drop positions [p0, p1) of ``seq_id`` (p1 = -1: to the end)."""
        llama_cpp.llama_memory_seq_rm(self._mem, seq_id, p0, p1)

    def copy_seq(self, src: int, dst: int, p0: int = 0, p1: int = -1) -> None:
        """Make positions [p0, p1) of ``src`` visible to ``dst`` as well (no copy of data)."""
        llama_cpp.llama_memory_seq_cp(self._mem, src, dst, p0, p1)

    def seq_pos_max(self, seq_id: int) -> int:
        """The largest position ``seq_id`` holds in the cache, -1 when it holds none."""
        return int(llama_cpp.llama_memory_seq_pos_max(self._mem, seq_id))

    def clear(self) -> None:
        llama_cpp.llama_memory_clear(self._mem, True)
        self.tokens.clear()
        self._rollback_room = 0

    def common_prefix(self, tokens: Sequence[int], start: int = 0) -> int:
        """How many leading ``tokens`` the cache already holds.

        The first ``start`` positions are taken as known to match (callers that
        only ever extend a history need not compare it again).
        """
        return common_prefix(self.tokens, tokens, start)


DecodeListener = Callable[[Sequence[int], Sequence[int], "Sequence[Sequence[int]] | None"], None]
