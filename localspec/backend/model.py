"""``Model``: a loaded GGUF, its vocabulary and how its cache can be rolled back; ``quantize``."""

from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path
from typing import Iterable

import llama_cpp

from localspec.backend.build import (
    clear_log,
    default_threads,
    ensure_init,
    gpu_offload_supported,
    last_error_line,
    repack_is_exact,
)
from localspec.errors import InvalidOptionError, ModelFileError
from localspec.llama_facts import MAX_DEVICES, SNAPSHOT_ARCHITECTURES
from localspec.backend.devices import bound_connections
from localspec.models.split import DeviceSplit


_SPLIT_MODES = {"none": llama_cpp.LLAMA_SPLIT_MODE_NONE, "layer": llama_cpp.LLAMA_SPLIT_MODE_LAYER,
                "row": llama_cpp.LLAMA_SPLIT_MODE_ROW}  # by the names of models.split.SPLIT_MODES


def model_params(*, n_gpu_layers: int = -1, vocab_only: bool = False, use_mmap: bool = True,
                 load_mtp: bool = False, repack: bool = True, split: DeviceSplit | None = None
                 ) -> tuple[llama_cpp.llama_model_params, tuple]:
    """llama.cpp's model parameters for these choices, and the ctypes arrays they point into (keep them
    alive until the model is loaded)."""
    params = llama_cpp.llama_model_default_params()
    # -1 offloads every layer the build can offload; a CPU-only build ignores it.
    params.n_gpu_layers = n_gpu_layers
    params.vocab_only = vocab_only
    params.use_mmap = use_mmap
    # The MTP (NextN) layers' weights are skipped unless asked for: only --draft mtp uses them.
    params.load_mtp = load_mtp
    params.use_extra_bufts = repack
    keep: tuple = ()
    if split is not None:
        if split.mode not in _SPLIT_MODES:
            raise InvalidOptionError(f"split_mode {split.mode!r} is none of {', '.join(_SPLIT_MODES)}",
                                     param="split_mode")
        if not all(d.handle for d in split.devices):
            raise ValueError("a DeviceSplit to load with needs the backend's devices (local_gpus, rpc_devices)")
        devices = (ctypes.c_void_p * (len(split.devices) + 1))(*(d.handle for d in split.devices), None)
        shares = (ctypes.c_float * MAX_DEVICES)(*split.shares[:MAX_DEVICES])
        params.devices = ctypes.cast(devices, ctypes.c_void_p)
        params.split_mode = _SPLIT_MODES[split.mode]
        params.main_gpu = split.main_gpu
        if split.shares:
            params.tensor_split = shares
        keep = (devices, shares)
    return params, keep


_PieceBuffer = ctypes.c_char * 64  # a token's text: the longest seen are a few dozen bytes


class Model:
    """A loaded GGUF model and its vocabulary."""

    def __init__(self, path: str | os.PathLike[str], *, n_gpu_layers: int = -1,
                 vocab_only: bool = False, use_mmap: bool = True, load_mtp: bool = False,
                 repack: bool | None = None, split: DeviceSplit | None = None) -> None:
        """``repack``: let ggml-cpu repack the weights into its interleaved layouts (faster CPU matmuls).
        None (the default) repacks on a GPU build, and on a CPU build only where that keeps decoding
        batch-invariant (``repack_is_exact``): exactness first. ``split``: the devices the offloaded
        layers go to and in what shares (None: every local GPU, as llama.cpp chooses)."""
        ensure_init()
        self.path = Path(path)
        if not self.path.is_file():
            raise ModelFileError(f"model file not found: {self.path}; check the path")
        if repack is None:
            repack = vocab_only or gpu_offload_supported() or repack_is_exact(self.path)
        params, keep = model_params(n_gpu_layers=n_gpu_layers, vocab_only=vocab_only, use_mmap=use_mmap,
                                    load_mtp=load_mtp, repack=repack, split=split)
        self.load_mtp = load_mtp
        self.n_gpu_layers = n_gpu_layers
        """The layers asked to be offloaded (-1: all, 0: none)."""
        self.repack: bool = repack
        """Whether ggml-cpu may repack the weights (see ``__init__``)."""
        self.split = split
        clear_log()
        handle = llama_cpp.llama_model_load_from_file(str(self.path).encode(), params)
        del keep  # llama.cpp copied the device list and the shares while loading
        remote = [d.description for d in split.devices if d.remote] if split is not None else []
        if handle and remote:
            bound_connections(remote)  # a hung server ends the reply instead of stalling it
        if not handle:
            reason = last_error_line() or "llama.cpp could not read it"
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
        self._ends_line: dict[int, bool] = {}

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

    def partition_texts(self) -> tuple[list[str], list[str]] | None:
        """What llama.cpp's tokenizer cuts a text at before tokenizing the stretches between (the texts of
        control, user-defined and unknown tokens), and which of them end a turn and strip nothing after
        them (for ``localspec.piecewise``). None where cutting a text is not known to be exact: a vocabulary
        other than SentencePiece or byte-level BPE, one that adds EOS, or a special text not UTF-8."""
        kind = llama_cpp.llama_vocab_type(self._vocab)
        if kind not in (llama_cpp.LLAMA_VOCAB_TYPE_SPM, llama_cpp.LLAMA_VOCAB_TYPE_BPE) or \
                llama_cpp.llama_vocab_get_add_eos(self._vocab):
            return None
        cuts = llama_cpp.LLAMA_TOKEN_ATTR_CONTROL | llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED | \
            llama_cpp.LLAMA_TOKEN_ATTR_UNKNOWN
        attr, text, vocab = llama_cpp.llama_vocab_get_attr, llama_cpp.llama_vocab_get_text, self._vocab
        texts, markers = [], []
        for token in range(self.n_vocab):
            flags = attr(vocab, token)
            if flags & cuts:
                try:
                    spelled = (text(vocab, token) or b"").decode("utf-8")
                except UnicodeDecodeError:
                    return None
                texts.append(spelled)
                if not flags & llama_cpp.LLAMA_TOKEN_ATTR_RSTRIP and self.is_eog(token):
                    markers.append(spelled)
        return texts, markers

    def piece(self, token: int) -> bytes:
        """The bytes a token stands for in generated text (control tokens render as nothing)."""
        cached = self._pieces.get(token)
        if cached is not None:
            return cached
        buf = _PieceBuffer()  # (the array type called directly: create_string_buffer is Python, audited)
        n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, False)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, False)
        out = buf.raw[:n]
        self._pieces[token] = out
        return out

    def ends_line(self, token: int) -> bool:
        """Whether the token's text holds a line break (the next token starts a line). Remembered per token:
        the controller asks it of every drafted token it prices, ~45 times a step while a lookup drafts."""
        hit = self._ends_line.get(token)
        if hit is None:
            hit = self._ends_line[token] = b"\n" in self.piece(token)
        return hit

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
    ensure_init()
    if ftype not in _FTYPES:
        raise ValueError(f"unknown quantization {ftype!r}; choose one of {', '.join(_FTYPES)}")
    dst = Path(dst)
    # A name of its own: two processes quantizing the same file at once (two test workers) never write
    # into one partial file; the last rename wins, and each renames a whole file.
    tmp = dst.with_name(f"{dst.name}.{os.getpid()}.{threading.get_ident()}.partial")
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
