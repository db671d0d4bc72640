"""The llama.cpp backend: the only module that imports ``llama_cpp``.

It speaks llama.cpp's low-level C API through ``llama-cpp-python``'s ctypes
bindings and offers what the engine needs and nothing more:

* ``Model``: load a GGUF (``n_gpu_layers`` for CUDA offload), tokenize and
  detokenize, vocabulary facts, and how (if at all) the cache can be rolled back.
* ``Context``: a KV cache with ``decode`` that asks logits only for chosen
  rows (read back with ``llama_get_logits_ith``; there is never an
  n_ctx x n_vocab buffer), ``rollback_to`` (``llama_memory_seq_rm``) and the
  sequence copy/keep operations that multi-branch verification uses.
* ``MtpContext``: the target's own multi-token-prediction (NextN) layers as a
  second context over the same weights, fed the target's hidden rows.
* ``AssistantContext``: Gemma 4's assistant GGUF, a draft that reads the
  target's own KV cache and hidden rows instead of keeping a cache.

Logits returned by ``Context.logits`` are views on llama.cpp's output buffer:
valid until the next ``decode`` on that context, and read-only by contract.
"""

from __future__ import annotations

import ctypes
import functools
import os
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import llama_cpp
import numpy as np

from localspec.errors import ModelFileError, UnsupportedModelError
from localspec.planner import ROLLBACK_SNAPSHOTS, SNAPSHOT_ARCHITECTURES

_init_lock = threading.Lock()
_initialized = False
# The last lines llama.cpp logged: when a load fails, its reason is in here.
_log_tail: deque[str] = deque(maxlen=40)
_log_echo = bool(os.environ.get("LOCALSPEC_LLAMA_LOG"))


@llama_cpp.llama_log_callback
def _on_log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    line = text.decode("utf-8", errors="replace")
    _log_tail.append(line)
    if _log_echo:
        print(line, end="", flush=True)


# ggml-cpu's tiled K-quant matmul (Q2_K..Q6_K, IQ*) takes over from 8 batch rows on: a verification
# batch would then round differently from a one-token decode (measured on Gemma 3 270M Q4_K_M: logits
# up to 2.2 apart), so greedy speculation could part from plain decoding at near-ties. Off unless the
# user set it; a one-token decode never used it, so plain decoding does not change.
_TILED_MATMUL_ENV = "GGML_CPU_TILED_MM"
# Flash attention on the CPU: the switch scripts/llama.cpp-patches/ adds to ggml (a stock build ignores
# it). Set, a query row is summed the same way alone and in a batch, so flash attention may be on.
_FA_INVARIANT_ENV = "GGML_CPU_FA_BATCH_INVARIANT"
# With it, batches of this many queries or more still take the kernel's tiles (prefill speed); a
# verification batch stays below that (``Context.max_verify_rows``), so every verified row is exact.
_FA_TILES_ENV = "GGML_CPU_FA_TILES_FROM"
FA_TILES_FROM = 256
# llamafile's sgemm (batches of 2+ rows): the switch scripts/llama.cpp-patches/ adds keeps it to the
# kernels that sum a row exactly as a one-token decode's vec_dot does (Q4_0/Q5_0/Q8_0 on x86); the
# others fall back to ggml's own matmul. A stock build with sgemm ignores it and is not batch-invariant.
_SGEMM_INVARIANT_ENV = "GGML_CPU_SGEMM_BATCH_INVARIANT"


def _ensure_init() -> None:
    global _initialized
    with _init_lock:
        if not _initialized:
            os.environ.setdefault(_TILED_MATMUL_ENV, "0")
            os.environ.setdefault(_FA_INVARIANT_ENV, "1")
            os.environ.setdefault(_FA_TILES_ENV, str(FA_TILES_FROM))
            os.environ.setdefault(_SGEMM_INVARIANT_ENV, "1")
            llama_cpp.llama_log_set(_on_log, ctypes.c_void_p(0))
            llama_cpp.llama_backend_init()
            _initialized = True


def _last_error_line() -> str:
    for line in reversed(_log_tail):
        text = line.strip()
        if text and ("error" in text.lower() or "failed" in text.lower()):
            return text
    return ""


def recent_log() -> list[str]:
    """The last lines llama.cpp logged (at most 40; a model load starts afresh), e.g. its
    ``offloaded N/M layers to GPU`` summary right after a ``Model`` is loaded."""
    return list(_log_tail)


def gpu_offload_supported() -> bool:
    """Whether this llama.cpp build can offload layers to a GPU (CUDA, Metal, Vulkan...)."""
    _ensure_init()
    return bool(llama_cpp.llama_supports_gpu_offload())


_GGML_DEVICE_GPU = 1  # enum ggml_backend_dev_type: CPU, GPU, IGPU, ACCEL, META (ggml-backend.h)


@functools.cache
def _device_api() -> tuple[Any, ...] | None:
    """ggml's device functions from the loaded llama.cpp library (llama-cpp-python binds none of them);
    None when this build does not export them."""
    lib = llama_cpp.llama_cpp._lib
    try:
        count, get, kind, describe, memory = (lib.ggml_backend_dev_count, lib.ggml_backend_dev_get,
                                              lib.ggml_backend_dev_type, lib.ggml_backend_dev_description,
                                              lib.ggml_backend_dev_memory)
    except AttributeError:
        return None
    count.argtypes, count.restype = [], ctypes.c_size_t
    get.argtypes, get.restype = [ctypes.c_size_t], ctypes.c_void_p
    kind.argtypes, kind.restype = [ctypes.c_void_p], ctypes.c_int
    describe.argtypes, describe.restype = [ctypes.c_void_p], ctypes.c_char_p
    memory.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)]
    memory.restype = None
    return count, get, kind, describe, memory


def gpu_devices() -> list[tuple[str, int, int]]:
    """``(description, free bytes, total bytes)`` of each dedicated GPU llama.cpp can offload to, in
    its device order; empty on a CPU-only build or when the library lacks ggml's device API."""
    _ensure_init()
    api = _device_api()
    if api is None:
        return []
    count, get, kind, describe, memory = api
    found = []
    for i in range(count()):
        device = get(i)
        if not device or kind(device) != _GGML_DEVICE_GPU:
            continue
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        memory(device, ctypes.byref(free), ctypes.byref(total))
        name = (describe(device) or b"GPU").decode("utf-8", errors="replace")
        found.append((name, free.value, total.value))
    return found


def library_version() -> str:
    """The installed llama-cpp-python's version (it pins the llama.cpp sources it vendors)."""
    return str(getattr(llama_cpp, "__version__", "unknown"))


def system_info() -> str:
    """llama.cpp's one-line description of the compiled backends and CPU features."""
    _ensure_init()
    return llama_cpp.llama_print_system_info().decode("utf-8", errors="replace").strip()


def batch_invariant() -> bool:
    """Whether a position's logits are the same whatever else shares its batch.

    True for a CPU build without llamafile's sgemm, or with it kept to its exact
    kernels by our patch's switch (scripts/setup.sh builds so): with flash
    attention off or batch-invariant (``cpu_flash_attention``), ggml's tiled
    K-quant matmul off and weights repacked only where that is exact
    (``Context``, ``_ensure_init``, ``Model``), greedy speculative decoding is
    then token-identical to plain greedy decoding, not merely equal up to
    near-ties. GPU builds are not assumed to be. ``localspec doctor`` checks it
    for a model by decoding (``selftest``).
    """
    info = system_info()
    sgemm_exact = "LLAMAFILE = 1" not in info or "SGEMM_BATCH_INVARIANT = 1" in info
    return sgemm_exact and not gpu_offload_supported()


def cpu_flash_attention() -> bool:
    """Whether a CPU build's flash attention is batch-invariant, so contexts may turn it on.

    ggml's CPU kernel splits a lone query's cells across threads once 512 are
    cached and tiles 64 or more queries: a one-token decode and a verification
    batch then sum in different orders (measured: logits up to 1.6 apart on
    SmolLM2, 2.4 on Gemma 3). Our build (scripts/setup.sh) carries a switch that
    sums every row in fixed 128-cell chunks merged in order, whatever the batch
    (a lone query's chunks still spread over every thread), reported in the
    system info; a stock build has none, and flash attention stays off there.
    """
    return "FA_BATCH_INVARIANT = 1" in system_info()


# Weight types whose repacked CPU kernels (ggml-cpu's "extra buffer types": a gemv for a lone row, a
# gemm for groups of 4 rows) give the same logits for a row alone and inside a batch; measured here,
# bitwise, over 1..9-row batches (SmolLM2 Q4_0). Stock repacked Q4_K is not (Gemma 3 270M Q4_K_M:
# logits up to 3.3 apart): its x86 gemv rounds differently from its gemm until our patch
# (scripts/llama.cpp-patches/matmul-batch-invariant.patch) makes it sum in the gemm's order; the
# build then says REPACK_Q4_K_INVARIANT, which it does only on x86 with AVX2, where ggml repacks just
# Q4_0, Q4_K, IQ4_NL, MXFP4 and (with AVX-512) Q2_K. Elsewhere any repackable type but Q4_0 (Q2_K,
# Q4_K, Q5_K, Q6_K, Q8_0, IQ4_NL, MXFP4...) is not known to be exact, so a file holding one loads
# without repacking on a CPU build.
_REPACK_EXACT_TYPES = frozenset({2})  # GGML_TYPE_Q4_0
_REPACKABLE_TYPES = frozenset({2, 8, 10, 12, 13, 14, 20, 39, 41})  # Q4_0 Q8_0 Q2_K Q4_K Q5_K Q6_K IQ4_NL MXFP4 Q1_0
_X86_REPACKED_TYPES = frozenset({2, 10, 12, 20, 39})  # Q4_0 Q2_K Q4_K IQ4_NL MXFP4
_X86_REPACK_EXACT_WITH_PATCH = frozenset({2, 12})  # Q4_0 Q4_K


def repack_inexact_types() -> frozenset[int]:
    """The ggml weight types this build may repack in a batch-dependent way (see above)."""
    if "REPACK_Q4_K_INVARIANT = 1" in system_info():
        return _X86_REPACKED_TYPES - _X86_REPACK_EXACT_WITH_PATCH
    return _REPACKABLE_TYPES - _REPACK_EXACT_TYPES


def repack_is_exact(path: str | os.PathLike[str]) -> bool:
    """Whether repacking ``path``'s weights for the CPU keeps decoding batch-invariant.

    Reads the GGUF tensor table (no weights). The token embedding is read row by
    row, never multiplied, so it is never repacked and does not count. An
    unreadable header says False: loading then reports the real problem.
    """
    from localspec.models.gguf_header import read_header

    try:
        tensors = read_header(path).tensors
    except Exception:
        return False
    inexact = repack_inexact_types()
    return not any(t.ggml_type in inexact for t in tensors if t.name != "token_embd.weight")


def default_threads() -> int:
    """Threads for decoding: every core this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


class Model:
    """A loaded GGUF model and its vocabulary."""

    def __init__(self, path: str | os.PathLike[str], *, n_gpu_layers: int = -1,
                 vocab_only: bool = False, use_mmap: bool = True, load_mtp: bool = False,
                 repack: bool | None = None) -> None:
        """``repack``: let ggml-cpu repack the weights into its interleaved layouts (faster CPU matmuls).
        None (the default) repacks on a GPU build, and on a CPU build only where that keeps decoding
        batch-invariant (``repack_is_exact``): exactness first."""
        _ensure_init()
        self.path = Path(path)
        if not self.path.is_file():
            raise ModelFileError(f"model file not found: {self.path}; check the path")
        if repack is None:
            repack = vocab_only or gpu_offload_supported() or repack_is_exact(self.path)
        params = llama_cpp.llama_model_default_params()
        # -1 offloads every layer the build can offload; a CPU-only build ignores it.
        params.n_gpu_layers = n_gpu_layers
        params.vocab_only = vocab_only
        params.use_mmap = use_mmap
        # The MTP (NextN) layers' weights are skipped unless asked for: only --draft mtp uses them.
        params.load_mtp = load_mtp
        self.load_mtp = load_mtp
        params.use_extra_bufts = repack
        self.repack: bool = repack
        """Whether ggml-cpu may repack the weights (see ``__init__``)."""
        _log_tail.clear()
        handle = llama_cpp.llama_model_load_from_file(str(self.path).encode(), params)
        if not handle:
            reason = _last_error_line() or "llama.cpp could not read it"
            raise ModelFileError(
                f"cannot load {self.path.name}: {reason}; the file may be corrupt or of an "
                "architecture this llama.cpp does not support (re-download it or upgrade llama-cpp-python)"
            )
        self._model = handle
        self._vocab = llama_cpp.llama_model_get_vocab(handle)
        self.n_vocab: int = llama_cpp.llama_vocab_n_tokens(self._vocab)
        self.n_ctx_train: int = llama_cpp.llama_model_n_ctx_train(handle)
        self.n_layers: int = llama_cpp.llama_model_n_layer(handle)
        # Multi-token-prediction (NextN) layers after the trunk (<arch>.nextn_predict_layers; 0: none).
        self.n_nextn_layers: int = int(llama_cpp.llama_model_n_layer_nextn(handle))
        self.n_embd_out: int = int(llama_cpp.llama_model_n_embd_out(handle))
        self.bos: int = llama_cpp.llama_vocab_bos(self._vocab)
        self.eos: int = llama_cpp.llama_vocab_eos(self._vocab)
        self.add_bos: bool = bool(llama_cpp.llama_vocab_get_add_bos(self._vocab))
        self.is_recurrent = bool(llama_cpp.llama_model_is_recurrent(handle))
        self.is_hybrid = bool(llama_cpp.llama_model_is_hybrid(handle))
        self.n_swa: int = int(llama_cpp.llama_model_n_swa(handle))
        """Cells a sliding-window layer attends to (0: every layer attends to the whole context)."""
        self.architecture: str = self.metadata("general.architecture") or "unknown"
        self.name: str = self.metadata("general.name") or self.path.stem
        self._pieces: dict[int, bytes] = {}
        self._eog: dict[int, bool] = {}

    # --- facts -------------------------------------------------------------
    @property
    def rollback(self) -> str:
        """How the cache takes back rejected tokens: ``"cache"``, ``"snapshots"`` or ``"none"``.

        ``cache``: an attention-only model keeps an entry per position, so any
        suffix can be dropped. ``snapshots``: a hybrid (or compressed-state)
        architecture that llama.cpp snapshots per token (``SNAPSHOT_ARCHITECTURES``:
        Qwen3.5, LFM2, Nemotron-H...); a context then takes back at most
        ``n_rs_seq`` tokens, and only of its last batch (``Context.max_rollback``).
        ``none``: other recurrent and hybrid models (Mamba, RWKV, Jamba...) keep
        one running state, which this llama.cpp cannot rewind at all.
        """
        if self.architecture in SNAPSHOT_ARCHITECTURES:
            return "snapshots"
        return "none" if self.is_recurrent or self.is_hybrid else "cache"

    @property
    def can_rollback(self) -> bool:
        """Whether rejected draft tokens can be taken back at all (see ``rollback``).

        False: speculative decoding is refused for the model; plain decoding still works.
        """
        return self.rollback != "none"

    def metadata(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(4096)
        n = llama_cpp.llama_model_meta_val_str(self._model, key.encode(), buf, len(buf))
        if n < 0:
            return None
        if n >= len(buf):
            buf = ctypes.create_string_buffer(n + 1)
            llama_cpp.llama_model_meta_val_str(self._model, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", errors="replace")

    def chat_template(self) -> str | None:
        raw = llama_cpp.llama_model_chat_template(self._model, None)
        return raw.decode("utf-8", errors="replace") if raw else None

    def token_text(self, token: int) -> str:
        """The vocabulary entry itself (e.g. ``<|im_end|>``), for templates and diagnostics."""
        raw = llama_cpp.llama_vocab_get_text(self._vocab, token)
        return raw.decode("utf-8", errors="replace") if raw else ""

    def is_eog(self, token: int) -> bool:
        """End of generation: EOS, EOT, ``<|im_end|>`` and the like."""
        hit = self._eog.get(token)
        if hit is None:
            hit = self._eog[token] = bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))
        return hit

    # --- text <-> tokens ---------------------------------------------------
    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids for ``text``. ``add_special`` adds BOS when the model wants it;
        ``parse_special`` turns ``<|im_start|>``-style text into control tokens (chat templates).
        Lone surrogates (undecodable bytes Python carried through) are tokenized as U+FFFD."""
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:
            # Pair what pairs; what cannot be a character becomes U+FFFD, as undecodable input does.
            data = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace").encode("utf-8")
        cap = len(data) + 8
        buf = (llama_cpp.llama_token * cap)()
        n = llama_cpp.llama_tokenize(self._vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            buf = (llama_cpp.llama_token * cap)()
            n = llama_cpp.llama_tokenize(self._vocab, data, len(data), buf, cap, add_special, parse_special)
            if n < 0:
                raise RuntimeError(f"llama_tokenize failed ({n})")
        return list(buf[:n])

    def piece(self, token: int) -> bytes:
        """The bytes a token stands for in generated text (control tokens render as nothing)."""
        cached = self._pieces.get(token)
        if cached is not None:
            return cached
        buf = ctypes.create_string_buffer(64)
        n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, False)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, False)
        out = buf.raw[:n]
        self._pieces[token] = out
        return out

    def ends_line(self, token: int) -> bool:
        """Whether the token's text holds a line break (the next token starts a line)."""
        return b"\n" in self.piece(token)

    def detokenize(self, tokens: Iterable[int]) -> str:
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", errors="replace")

    def close(self) -> None:
        if getattr(self, "_model", None):
            llama_cpp.llama_model_free(self._model)
            self._model = None

    def __del__(self) -> None:  # pragma: no cover - best effort at interpreter exit
        try:
            self.close()
        except Exception:
            pass


def _set_threads(params: Any, n_threads: int | None) -> None:
    """Context params: ``n_threads`` (default: every CPU we may use) for single tokens and batches alike."""
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
    return None if llama_cpp.llama_supports_gpu_offload() or cpu_flash_attention() else False


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


class _OwnedContext:
    """A llama.cpp context and its batch, freed once by ``close`` (or at garbage collection)."""

    _ctx: Any
    _batch: Any

    def _free_batch(self) -> None:
        llama_cpp.llama_batch_free(self._batch)

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
        # Only the rows a caller asks for are ever computed (see decode).
        params.embeddings = False
        ctx = llama_cpp.llama_init_from_model(model._model, params)
        if not ctx:
            reason = _last_error_line() or "out of memory?"
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
        the rows from which batch-invariant CPU flash attention takes its tiles, where it is on."""
        if self.flash_attn is not False and cpu_flash_attention() and not llama_cpp.llama_supports_gpu_offload():
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
        self._n_vocab = model.n_vocab
        self.tokens: list[int] = []
        # Seconds spent inside llama_decode since construction: lets callers split
        # a step into time in llama.cpp and time in Python.
        self.decode_seconds = 0.0
        self.decode_calls = 0
        # Called after every successful decode with (tokens, positions, seq_ids): an MTP drafter
        # copies the target's hidden rows here, before the next decode overwrites them.
        self._decode_listeners: list[DecodeListener] = []
        self._hidden_rows = False

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
        for i in range(n):
            b.token[i] = tokens[i]
            b.pos[i] = positions[i]
            ids = (0,) if seq_ids is None else seq_ids[i]
            b.n_seq_id[i] = len(ids)
            row = b.seq_id[i]
            for j, s in enumerate(ids):
                row[j] = s
            b.logits[i] = (i == n - 1) if outputs is None else bool(outputs[i])
        t0 = time.perf_counter()
        rc = llama_cpp.llama_decode(self._ctx, b)
        self.decode_seconds += time.perf_counter() - t0
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
        return _float_view(llama_cpp.llama_get_logits_ith(self._ctx, row), (self._n_vocab,),
                           f"no logits were requested for row {row}")

    # --- hidden rows for an MTP head -----------------------------------------
    def enable_hidden_rows(self) -> None:
        """Keep the hidden state (the NextN input) of EVERY row of each decode, not only the output rows.

        Costs the last layer's work on rows whose logits nobody asked for; only
        a context serving an MTP drafter turns it on. Read them with ``hidden_rows``.
        """
        api = _nextn_api()
        if api is None:
            raise UnsupportedModelError(mtp_unavailable_reason() or "no NextN API")
        api.set_embeddings_nextn(self._ctx, True, False)
        self._hidden_rows = True

    def hidden_rows(self, n: int) -> np.ndarray:
        """The hidden rows of the last decode's ``n`` batch rows, ``(n, n_embd_out)`` float32, read-only view."""
        api = _nextn_api()
        if not self._hidden_rows or api is None:
            raise RuntimeError("hidden rows were not enabled on this context")
        return _float_view(api.get_embeddings_nextn(self._ctx), (n, self.model.n_embd_out),
                           "llama.cpp returned no hidden rows for the last decode")

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
                "running state); use plain decoding (no --draft)"
            )
        raise UnsupportedModelError(
            f"{self.model.path.name} cannot take back {cut} tokens: its recurrent state keeps snapshots "
            f"of at most the last {self._rollback_room} tokens of its last batch (n_rs_seq={self.n_rs_seq}); "
            "draft fewer tokens (--draft-max)"
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
        n = min(start, len(self.tokens), len(tokens))
        for a, b in zip(self.tokens[n:], tokens[n:]):
            if a != b:
                break
            n += 1
        return n


DecodeListener = Callable[[Sequence[int], Sequence[int], "Sequence[Sequence[int]] | None"], None]


# --- MTP (NextN) ---------------------------------------------------------------
# llama.cpp declares the functions that hand a target's hidden rows to its MTP
# head in src/llama-ext.h, a staging header: libllama exports them with C++
# linkage and llama-cpp-python binds none of them. We bind them here by their
# Itanium-mangled names (what `nm -D --defined-only libllama.so` lists), and
# refuse --draft mtp when a build lacks them.
_NEXTN_SYMBOLS = {
    # void llama_set_embeddings_nextn(llama_context *, bool value, bool masked)
    "set_embeddings_nextn": "_Z26llama_set_embeddings_nextnP13llama_contextbb",
    # float * llama_get_embeddings_nextn(llama_context *)
    "get_embeddings_nextn": "_Z26llama_get_embeddings_nextnP13llama_context",
    # float * llama_get_embeddings_nextn_ith(llama_context *, int32_t i)
    "get_embeddings_nextn_ith": "_Z30llama_get_embeddings_nextn_ithP13llama_contexti",
    # void llama_set_nextn_layer_offset(llama_context *, int32_t offset)
    "set_nextn_layer_offset": "_Z28llama_set_nextn_layer_offsetP13llama_contexti",
    # llama_context * llama_get_ctx_other(llama_context *)
    "get_ctx_other": "_Z19llama_get_ctx_otherP13llama_context",
}
# The public C API the MTP context needs (bound by llama-cpp-python 0.3.36).
_MTP_PUBLIC = ("llama_model_n_layer_nextn", "llama_batch_ext_init", "llama_batch_ext_add_token",
               "llama_batch_ext_set_embd_token", "llama_batch_ext_set_pos", "llama_batch_ext_set_output_logits",
               "llama_process")


class _NextnApi:
    def __init__(self, lib: Any) -> None:
        f = self.set_embeddings_nextn = getattr(lib, _NEXTN_SYMBOLS["set_embeddings_nextn"])
        f.argtypes, f.restype = [ctypes.c_void_p, ctypes.c_bool, ctypes.c_bool], None
        f = self.get_embeddings_nextn = getattr(lib, _NEXTN_SYMBOLS["get_embeddings_nextn"])
        f.argtypes, f.restype = [ctypes.c_void_p], ctypes.POINTER(ctypes.c_float)
        f = self.get_embeddings_nextn_ith = getattr(lib, _NEXTN_SYMBOLS["get_embeddings_nextn_ith"])
        f.argtypes, f.restype = [ctypes.c_void_p, ctypes.c_int32], ctypes.POINTER(ctypes.c_float)
        f = self.set_nextn_layer_offset = getattr(lib, _NEXTN_SYMBOLS["set_nextn_layer_offset"])
        f.argtypes, f.restype = [ctypes.c_void_p, ctypes.c_int32], None
        f = self.get_ctx_other = getattr(lib, _NEXTN_SYMBOLS["get_ctx_other"])
        f.argtypes, f.restype = [ctypes.c_void_p], ctypes.c_void_p


@functools.cache
def _nextn_api() -> _NextnApi | None:
    """The C++-linkage NextN functions from the loaded libllama; None when any is missing."""
    try:
        return _NextnApi(llama_cpp.llama_cpp._lib)
    except AttributeError:
        return None


def mtp_unavailable_reason() -> str | None:
    """Why this llama.cpp build cannot run a model's MTP layers (None: it can)."""
    missing = [name for name in _MTP_PUBLIC if not hasattr(llama_cpp, name)]
    if _nextn_api() is None:
        lib = llama_cpp.llama_cpp._lib
        missing += ["llama_" + name for name, sym in _NEXTN_SYMBOLS.items() if not hasattr(lib, sym)]
    if not missing:
        return None
    return (f"this llama.cpp build lacks the functions that run a model's MTP layers ({', '.join(missing)}); "
            "install llama-cpp-python 0.3.36 or newer (scripts/setup.sh builds it)")


class _ExtBatchContext(_OwnedContext):
    """What MtpContext and AssistantContext share: a llama.cpp context fed through a ``llama_batch_ext``."""

    def _free_batch(self) -> None:
        llama_cpp.llama_batch_ext_free(self._batch)


class MtpContext(_ExtBatchContext):
    """A model's MTP (NextN) layers as a second context over the target's weights.

    Row ``p`` of its cache is built from token ``x_p`` at position ``p`` and
    the target's hidden state ``h_{p-1}`` (the row before): its logits predict
    ``x_{p+1}``, and its own hidden output can stand in for the target's to
    draft one more token. The target's ``Model`` must be loaded with
    ``load_mtp=True``; ``head`` selects which NextN layer runs (0: the first).
    Logits and hidden rows are read by batch row and are views valid until the
    next ``decode``.
    """

    def __init__(self, target: Context, *, n_batch: int = 128, n_threads: int | None = None) -> None:
        model = target.model
        reason = mtp_unavailable_reason()
        if reason is not None:
            raise UnsupportedModelError(reason)
        if model.n_nextn_layers < 1 or not model.load_mtp:
            raise UnsupportedModelError(f"{model.name} was not loaded with its MTP layers")
        api = _nextn_api()
        assert api is not None
        self._api = api
        self.model = model
        self.n_embd = model.n_embd_out
        self.n_heads = model.n_nextn_layers
        params = llama_cpp.llama_context_default_params()
        params.ctx_type = llama_cpp.LLAMA_CONTEXT_TYPE_MTP
        params.ctx_other = target._ctx  # a drafter sharing the target's cache (Gemma 4's assistant) reads it
        params.n_ctx = target.n_ctx
        params.n_batch = n_batch
        params.n_ubatch = n_batch
        params.n_seq_max = 1
        params.kv_unified = True
        _flash_attention(params, target.flash_attn)
        _set_threads(params, n_threads)
        ctx = llama_cpp.llama_init_from_model(model._model, params)
        if not ctx:
            reason = _last_error_line() or "llama.cpp refused the MTP context"
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

    def set_head(self, head: int) -> None:
        """Run NextN layer ``head`` (0 .. n_heads-1) from the next decode on."""
        if not 0 <= head < self.n_heads:
            raise ValueError(f"head {head} out of range 0..{self.n_heads - 1}")
        if head != self.head:
            self._api.set_nextn_layer_offset(self._ctx, head)
            self.head = head

    def decode(self, tokens: Sequence[int], positions: Sequence[int], hidden: np.ndarray,
               outputs: Sequence[bool]) -> None:
        """One forward pass of the head: row i is (``tokens[i]`` at ``positions[i]``, ``hidden[i]``)."""
        n = len(tokens)
        if n == 0:
            return
        if n > self.n_batch:
            raise ValueError(f"batch of {n} tokens exceeds n_batch={self.n_batch}")
        rows = np.ascontiguousarray(hidden, dtype=np.float32).reshape(n, self.n_embd)
        base = rows.ctypes.data
        stride = self.n_embd * 4
        b = self._batch
        llama_cpp.llama_batch_ext_clear(b)
        for i in range(n):
            idx = llama_cpp.llama_batch_ext_add_token(b, 0, int(tokens[i]))
            if idx < 0:
                raise RuntimeError(f"llama_batch_ext_add_token failed ({idx})")
            self._pos[0] = positions[i]
            llama_cpp.llama_batch_ext_set_pos(b, idx, self._pos)
            # The hidden state rides in the token-embedding slot: llama_batch_ext_set_embd_state is a stub
            # that returns false in this llama.cpp; its MTP graphs read the row given with set_embd_token.
            embd = llama_cpp.llama_embd(ctypes.cast(base + i * stride, ctypes.POINTER(ctypes.c_float)),
                                        1, self.n_embd)
            if not llama_cpp.llama_batch_ext_set_embd_token(b, idx, embd):
                raise RuntimeError("llama_batch_ext_set_embd_token refused a hidden row")
            llama_cpp.llama_batch_ext_set_output_logits(b, idx, bool(outputs[i]))
        t0 = time.perf_counter()
        rc = llama_cpp.llama_process(self._ctx, llama_cpp.LLAMA_PROCESS_TYPE_DECODE, b)
        self.decode_seconds += time.perf_counter() - t0
        if rc != 0:
            self.clear()
            if rc == 1:
                raise UnsupportedModelError(
                    f"the MTP context of {self.n_ctx} tokens is full; start a new chat or raise --ctx")
            raise RuntimeError(f"llama_process (MTP) failed with code {rc}")

    def logits(self, row: int) -> np.ndarray:
        return _float_view(llama_cpp.llama_get_logits_ith(self._ctx, row), (self.model.n_vocab,),
                           f"no MTP logits were requested for row {row}")

    def hidden(self, row: int) -> np.ndarray:
        """The head's own hidden output at batch row ``row`` (an output row): the next draft's input."""
        return _float_view(self._api.get_embeddings_nextn_ith(self._ctx, row), (self.n_embd,),
                           f"no MTP hidden row for batch row {row}")

    def rollback_to(self, n: int) -> None:
        """Keep positions [0, n) and drop the rest."""
        llama_cpp.llama_memory_seq_rm(self._mem, 0, n, -1)

    @property
    def n_past(self) -> int:
        """Positions the head's cache holds (0 when empty)."""
        return int(llama_cpp.llama_memory_seq_pos_max(self._mem, 0)) + 1

    def clear(self) -> None:
        llama_cpp.llama_memory_clear(self._mem, True)


# --- Gemma 4 assistant -----------------------------------------------------------
# Gemma 4 ships its draft as a separate "assistant" GGUF (architecture gemma4-assistant,
# src/models/gemma4-assistant.cpp). It has no KV cache of its own: its context is created
# with ctx_other = the target's context, and llama.cpp builds its cache as a view of the
# target's (llama_model::create_memory, `share`): each sliding-window layer attends to the
# target's last sliding-window layer's K/V, each global layer to the target's last layer's,
# over the target's own cells. It embeds tokens with the TARGET's token embedding and reads
# the target's post-norm hidden state (the NextN rows, llama_get_embeddings_nextn).

ASSISTANT_TARGETS = {"gemma4-assistant": "gemma4"}
"""Assistant architectures and the target architecture each drafts for."""


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
        api = _nextn_api()
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
        _log_tail.clear()
        ctx = llama_cpp.llama_init_from_model(assistant._model, params)
        if not ctx:
            reason = _last_error_line() or "llama.cpp refused the assistant context"
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
        t0 = time.perf_counter()
        rc = llama_cpp.llama_process(self._ctx, llama_cpp.LLAMA_PROCESS_TYPE_DECODE, b)
        self.decode_seconds += time.perf_counter() - t0
        self.decode_calls += 1
        if rc == 1:
            return False
        if rc != 0:
            raise RuntimeError(f"llama_process (assistant) failed with code {rc}")
        return True

    def logits(self) -> np.ndarray:
        return _float_view(llama_cpp.llama_get_logits_ith(self._ctx, 0), (self.model.n_vocab,),
                           "the assistant returned no logits")

    def hidden(self) -> np.ndarray:
        return _float_view(self._api.get_embeddings_nextn_ith(self._ctx, 0), (self.n_embd,),
                           "the assistant returned no hidden row")


_FTYPES = {
    "F16": llama_cpp.LLAMA_FTYPE_MOSTLY_F16,
    "Q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0,
    "Q4_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0,
    "Q4_1": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_1,
    "Q5_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q5_0,
    "Q4_K_M": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M,
    "Q6_K": llama_cpp.LLAMA_FTYPE_MOSTLY_Q6_K,
}


def quantize(src: str | os.PathLike[str], dst: str | os.PathLike[str], ftype: str,
             *, n_threads: int | None = None) -> Path:
    """Requantize ``src`` into ``dst`` (written under a temporary name, then renamed)."""
    _ensure_init()
    if ftype not in _FTYPES:
        raise ValueError(f"unknown quantization {ftype!r}; choose one of {', '.join(_FTYPES)}")
    dst = Path(dst)
    tmp = dst.with_name(dst.name + ".partial")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = _FTYPES[ftype]
    params.nthread = n_threads or default_threads()
    params.allow_requantize = True
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), ctypes.byref(params))
    if rc != 0:
        tmp.unlink(missing_ok=True)
        raise ModelFileError(f"quantizing {src} to {ftype} failed (code {rc})")
    os.replace(tmp, dst)
    return dst
