"""What a GGUF file says about its model, read from the header alone (no weights are loaded).

``read_info`` answers the planner and the CLI: shape, vocabulary, special tokens, chat
template, quantization and where the tensor bytes sit. Token texts are read separately
(``read_tokens``, ``tokenizer_fingerprint``) because a 262k vocabulary is most of a header.
``check_draft_compatible`` applies llama.cpp's own rule for pairing a draft with a target.
The bytes themselves are ``localspec.models.gguf_header``'s: this module only interprets
the keys.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import gguf
import numpy as np

from localspec.errors import IncompatibleDraftError
from localspec.models.gguf_header import HeaderSource, array_length, read_header

_TOKENS, _TOKEN_TYPES = "tokenizer.ggml.tokens", "tokenizer.ggml.token_type"
_LAYER_TENSOR = re.compile(r"blk\.(\d+)\.")
_U32 = struct.Struct("<I")


@dataclass(frozen=True)
class GGUFInfo:
    """A model as its GGUF header describes it. Sizes are bytes; ids are token ids.

    ``bos_id``/``eos_id``/``add_bos``/``add_eos`` are what the file states (None when it
    states nothing; llama.cpp then applies per-tokenizer defaults). ``layer_bytes[i]`` is the
    size of every ``blk.i.*`` tensor; the rest of the weights are ``token_embd_bytes`` (kept
    on the CPU by llama.cpp), ``output_bytes`` (0 when the output projection is tied to the
    token embedding) and ``other_bytes`` (norms and other non-layer tensors).
    ``swa_layers[i]`` is True where layer i caches only a ``sliding_window`` of tokens.
    """

    path: Path
    architecture: str
    name: str
    file_size: int
    n_params: int
    n_layers: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    kv_heads_by_layer: tuple[int, ...]
    head_dim_k: int
    head_dim_v: int
    context_length: int
    n_vocab: int
    vocab_type: str
    tokenizer_pre: str | None
    bos_id: int | None
    eos_id: int | None
    add_bos: bool | None
    add_eos: bool | None
    chat_template: str | None
    file_type: str | None
    bits_per_weight: float
    sliding_window: int | None
    swa_layers: tuple[bool, ...]
    layer_bytes: tuple[int, ...]
    token_embd_bytes: int
    output_bytes: int
    other_bytes: int
    source: BinaryIO | None = field(default=None, compare=False, repr=False)
    # The architecture's own keys with the ``<arch>.`` prefix dropped (e.g. ``ssm.state_size``), for
    # shapes only some architectures have (recurrent states: localspec.models.memory.recurrent_state_bytes).
    hparams: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    # Multi-token-prediction (NextN) blocks among the last ``n_layers`` (<arch>.nextn_predict_layers).
    n_nextn_layers: int = 0
    # Every tensor's name, for parts only some files of an architecture carry (a DSpark draft's Markov head).
    tensor_names: frozenset[str] = field(default_factory=frozenset, compare=False, repr=False)

    @property
    def global_layer_share(self) -> float:
        """The share of the layers that attend to the whole context rather than a ``sliding_window`` (1.0
        without one): what a cell past the window still costs (``localspec.policy.costs.CostModel.past_window``)."""
        if not self.swa_layers:
            return 1.0
        return 1.0 - sum(self.swa_layers) / len(self.swa_layers)

    @property
    def has_mtp(self) -> bool:
        """Whether the file declares NextN layers AND carries their weights (some conversions strip them)."""
        n = self.n_nextn_layers
        return 0 < n <= len(self.layer_bytes) and all(b > 0 for b in self.layer_bytes[-n:])

    @property
    def label(self) -> str:
        """The short name used in messages: the file name without ``.gguf``."""
        return self.path.name.removesuffix(".gguf")

    @property
    def tied_embeddings(self) -> bool:
        """True when the output projection reuses the token embedding."""
        return self.output_bytes == 0

    @property
    def tensor_bytes(self) -> int:
        return sum(self.layer_bytes) + self.token_embd_bytes + self.output_bytes + self.other_bytes


# --- interpreting the metadata -------------------------------------------------------------


def _per_layer(value: Any, n_layers: int) -> tuple[int, ...]:
    """A hyperparameter that is one number or one number per layer, as a per-layer tuple."""
    if isinstance(value, (list, tuple)):
        values = [int(v) for v in value][:n_layers]
        return tuple(values + [values[-1] if values else 0] * (n_layers - len(values)))
    return (int(value),) * n_layers


# Architectures whose llama.cpp loader turns `<arch>.attention.sliding_window` into SWA
# layers, with the default pattern period it uses when the GGUF gives none
# (src/models/<arch>.cpp, load_swa_pattern(ml, N); is_swa(il) = il % N < N - 1).
_SWA_PERIOD = {"gemma2": 2, "gemma3": 6, "cohere2": 4, "gpt-oss": 2, "olmo2": 4}


def _swa_layers(meta: dict[str, Any], arch: str, n_layers: int) -> tuple[int | None, tuple[bool, ...]]:
    window = meta.get(f"{arch}.attention.sliding_window")
    if arch not in _SWA_PERIOD or not isinstance(window, int) or window <= 0:
        return None, (False,) * n_layers
    pattern = meta.get(f"{arch}.attention.sliding_window_pattern", _SWA_PERIOD[arch])
    if isinstance(pattern, list):  # an explicit per-layer flag array wins (load_swa_pattern)
        flags = [bool(v) for v in pattern][:n_layers]
        return window, tuple(flags + [False] * (n_layers - len(flags)))
    period = int(pattern)
    return window, tuple(period == 0 or il % period < period - 1 for il in range(n_layers))


def _file_type_name(value: Any) -> str | None:
    if not isinstance(value, int):
        return None
    try:
        name = gguf.LlamaFileType(value).name
    except ValueError:
        return f"type {value}"
    return None if name == "GUESSED" else name.removeprefix("MOSTLY_").removeprefix("ALL_")


def read_info(source: HeaderSource) -> GGUFInfo:
    """Read a GGUF model's header into a GGUFInfo, without loading weights or token texts.

    ``source`` is a path or a seekable binary file object (read only as far as the header).
    Raises ModelFileError (one line naming the file, the problem and the fix) when the
    path is missing, a directory, unreadable, not GGUF, or truncated. A file's is read once per
    version of it, as ``_read_vocab`` (a launch asks three to five times: 25-65 ms each for the
    test models, more for a large model's tensor table).
    """
    version = _file_version(source)
    if version is None:
        return _parse_info(source)
    return _file_info(*version)


def _file_version(source: HeaderSource) -> tuple[str, str, int, int] | None:
    """A path as given, the file it names, its size and modification time (None: a file object, or
    nothing readable there)."""
    if not isinstance(source, (str, os.PathLike)):
        return None
    path = Path(source).expanduser()
    try:
        st = path.stat()
        real = path.resolve()
    except (OSError, RuntimeError):
        return None  # read_header says what is wrong with it
    return str(path), str(real), st.st_size, st.st_mtime_ns


@functools.lru_cache(maxsize=8)
def _file_info(path: str, real: str, size: int, mtime_ns: int) -> GGUFInfo:
    return _parse_info(path)


def _parse_info(source: HeaderSource) -> GGUFInfo:
    header = read_header(source)
    path, size, meta = header.path, header.file_size, header.metadata
    arch = str(meta.get("general.architecture", "unknown"))

    def hp(key: str, default: Any = None) -> Any:
        return meta.get(f"{arch}.{key}", default)

    n_layers = int(hp("block_count", 0))
    layer_bytes = [0] * n_layers
    token_embd = output = other = 0
    for t in header.tensors:
        m = _LAYER_TENSOR.match(t.name)
        if m:
            il = int(m.group(1))
            layer_bytes.extend([0] * (il + 1 - len(layer_bytes)))
            layer_bytes[il] += t.n_bytes
        elif t.name == "token_embd.weight":
            token_embd = t.n_bytes
        elif t.name == "output.weight":
            output = t.n_bytes
        else:
            other += t.n_bytes
    n_params = sum(t.n_elements for t in header.tensors)
    n_embd = int(hp("embedding_length", 0))
    heads = _per_layer(hp("attention.head_count", 0), n_layers)
    kv_heads = _per_layer(hp("attention.head_count_kv", max(heads, default=0)), n_layers)
    n_head = max(heads, default=0)
    head_dim = n_embd // n_head if n_head else 0
    tokens = meta.get(_TOKENS)
    n_vocab = array_length(tokens) if tokens is not None else int(hp("vocab_size", 0))
    window, swa = _swa_layers(meta, arch, n_layers)

    def opt_int(key: str) -> int | None:
        v = meta.get(key)
        return int(v) if isinstance(v, int) and not isinstance(v, bool) else None

    def opt_bool(key: str) -> bool | None:
        v = meta.get(key)
        return bool(v) if isinstance(v, bool) else None

    tensor_total = sum(layer_bytes) + token_embd + output + other
    return GGUFInfo(
        path=path, architecture=arch, name=str(meta.get("general.name") or path.stem), file_size=size,
        n_params=n_params, n_layers=n_layers, n_embd=n_embd,
        n_ff=max(_per_layer(hp("feed_forward_length", 0), max(n_layers, 1))),
        n_head=n_head, n_head_kv=max(kv_heads, default=0), kv_heads_by_layer=kv_heads,
        head_dim_k=int(hp("attention.key_length", head_dim)), head_dim_v=int(hp("attention.value_length", head_dim)),
        context_length=int(hp("context_length", 0)), n_vocab=n_vocab,
        vocab_type=str(meta.get("tokenizer.ggml.model", "none")),
        tokenizer_pre=meta.get("tokenizer.ggml.pre"),
        bos_id=opt_int("tokenizer.ggml.bos_token_id"), eos_id=opt_int("tokenizer.ggml.eos_token_id"),
        add_bos=opt_bool("tokenizer.ggml.add_bos_token"), add_eos=opt_bool("tokenizer.ggml.add_eos_token"),
        chat_template=meta.get("tokenizer.chat_template"),
        file_type=_file_type_name(meta.get("general.file_type")),
        bits_per_weight=8 * tensor_total / n_params if n_params else 0.0,
        sliding_window=window, swa_layers=swa, layer_bytes=tuple(layer_bytes),
        token_embd_bytes=token_embd, output_bytes=output, other_bytes=other,
        source=None if isinstance(source, (str, os.PathLike)) else source,
        hparams={k[len(arch) + 1:]: v for k, v in meta.items() if k.startswith(arch + ".")},
        n_nextn_layers=int(hp("nextn_predict_layers", 0) or 0),
        tensor_names=frozenset(t.name for t in header.tensors),
    )


# --- vocabulary ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Vocab:
    vocab_type: str
    tokens: tuple[bytes, ...]
    token_types: np.ndarray | None


def _read_vocab(source: HeaderSource) -> _Vocab:
    """The vocabulary of ``source``. A file's is read once per version of it (its size and modification
    time): a launch with a draft of another tokenizer asks for both vocabularies twice, 350 ms each
    for Gemma 3's 262k tokens."""
    version = _file_version(source)
    return _parse_vocab(source) if version is None else _file_vocab(*version[1:])  # by the file, not its name


@functools.lru_cache(maxsize=4)
def _file_vocab(real: str, size: int, mtime_ns: int) -> _Vocab:
    return _parse_vocab(real)


def _parse_vocab(source: HeaderSource) -> _Vocab:
    meta = read_header(source, keep=frozenset({_TOKENS, _TOKEN_TYPES})).metadata
    tokens = meta.get(_TOKENS, [])
    types = meta.get(_TOKEN_TYPES)
    token_types = None if types is None else np.array(types, dtype=np.int32)
    if token_types is not None:
        token_types.flags.writeable = False  # shared by every reader of this file (``_file_vocab``)
    return _Vocab(str(meta.get("tokenizer.ggml.model", "none")), tuple(tokens), token_types)


def read_tokens(source: HeaderSource) -> list[str]:
    """Every token's text by id, as stored in the GGUF (invalid UTF-8 shown as U+FFFD)."""
    return [t.decode("utf-8", errors="replace") for t in _read_vocab(source).tokens]


def tokenizer_fingerprint(source: HeaderSource) -> str:
    """SHA-256 hex over the vocabulary type, every token's bytes and the token types.

    Two files share a fingerprint exactly when they tokenize alike by these fields, so a
    datastore built for one tokenizer can refuse to serve another.
    """
    vocab = _read_vocab(source)
    h = hashlib.sha256(b"localspec-tokenizer-v1\0" + vocab.vocab_type.encode() + b"\0")
    # Length-prefixing each token keeps ["ab", "c"] and ["a", "bc"] apart.
    h.update(b"".join(_U32.pack(len(t)) + t for t in vocab.tokens))
    if vocab.token_types is None:
        h.update(b"\0no-token-types")
    else:
        h.update(b"\0token-types\0" + vocab.token_types.astype("<i4").tobytes())
    return h.hexdigest()


_BYTE_TOKENS = tuple(f"<0x{b:02X}>".encode() for b in range(256))


def text_encoding_problem(source: GGUFInfo | HeaderSource) -> str | None:
    """Why ``source``'s tokenizer cannot encode every text, or None when it can.

    A byte-level BPE vocabulary (``gpt2``, ``gemma4``...) spells any bytes; a SentencePiece or Unigram one
    does when it carries the 256 byte tokens ``<0x00>``..``<0xFF>`` (byte fallback); WordPiece never does.
    Drafting by text needs both sides to encode whatever the other writes (``drafting.by_text``).
    """
    info = _as_info(source)
    vocab = _read_vocab(_origin(info))
    kind = _VOCAB_KINDS.get(vocab.vocab_type, (None,))[0]
    if not vocab.tokens or kind in (None, "NONE"):
        what = ("no tokenizer" if not vocab.tokens or kind == "NONE"
                else f"a tokenizer of unknown type {vocab.vocab_type!r}")
        return f"its GGUF carries {what}, so its tokenizer cannot be loaded"
    if kind in ("BPE", "RWKV"):
        return None
    if kind in ("SPM", "UGM") and set(_BYTE_TOKENS) <= set(vocab.tokens):
        return None
    return (f"its {kind} tokenizer has no byte-level fallback (no <0x00>..<0xFF> tokens), so it cannot encode "
            "every text")


# --- draft compatibility (llama.cpp common/speculative.cpp, common_speculative_are_compatible) ----

_VOCAB_MAX_SIZE_DIFFERENCE = 128  # SPEC_VOCAB_MAX_SIZE_DIFFERENCE
_VOCAB_CHECK_START_TOKEN_ID = 5   # SPEC_VOCAB_CHECK_START_TOKEN_ID: ids below may be renamed specials

# tokenizer.ggml.model -> llama_vocab_type, with the BOS/EOS ids and add-BOS/EOS flags llama.cpp
# assumes when the GGUF states none (src/llama-vocab.cpp, llama_vocab::impl::load).
_VOCAB_KINDS: dict[str, tuple[str, int | None, int | None, bool, bool]] = {
    "llama": ("SPM", 1, 2, True, False),
    "gpt2": ("BPE", 11, 11, False, False),
    "hybriddna": ("BPE", 11, 11, False, False),
    "whitespace": ("BPE", 11, 11, False, False),
    "gemma4": ("BPE", None, None, True, False),
    "bert": ("WPM", 101, None, True, False),
    "t5": ("UGM", None, 1, False, True),
    "rwkv": ("RWKV", None, None, False, False),
    "plamo2": ("PLAMO2", 1, 2, False, False),
    "none": ("NONE", None, None, False, False),
    "no_vocab": ("NONE", None, None, False, False),
}
# BPE pre-tokenizers for which llama.cpp turns add_bos on by default.
_BPE_PRE_ADDS_BOS = {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0",
                     "lfm2", "jina-v5-nano", "tekken", "chameleon"}
_BPE_PRE_NO_BOS = {"chatglm-bpe", "glm4", "glm5"}


def _llama_specials(info: GGUFInfo) -> tuple[str, int | None, int | None, bool, bool]:
    """(vocab kind, bos id, eos id, add_bos, add_eos) as llama.cpp resolves them for ``info``."""
    kind, bos, eos, add_bos, add_eos = _VOCAB_KINDS.get(info.vocab_type, (info.vocab_type, 1, 2, False, False))
    if kind == "BPE" and info.tokenizer_pre in _BPE_PRE_ADDS_BOS:
        add_bos = True
    if kind == "BPE" and info.tokenizer_pre in _BPE_PRE_NO_BOS:
        bos = None
    # Defaults outside the vocabulary are disabled; stated ids outside it are ignored.
    bos = None if bos is not None and bos >= info.n_vocab else bos
    eos = None if eos is not None and eos >= info.n_vocab else eos
    bos = info.bos_id if info.bos_id is not None and info.bos_id < info.n_vocab else bos
    eos = info.eos_id if info.eos_id is not None and info.eos_id < info.n_vocab else eos
    add_bos = info.add_bos if info.add_bos is not None else add_bos
    add_eos = info.add_eos if info.add_eos is not None else add_eos
    if info.vocab_type == "gemma4":
        add_bos = True  # llama.cpp overrides it for Gemma 4
    return kind, bos, eos, add_bos, add_eos


def _as_info(model: GGUFInfo | HeaderSource) -> GGUFInfo:
    return model if isinstance(model, GGUFInfo) else read_info(model)


def _origin(info: GGUFInfo) -> HeaderSource:
    """Where ``info``'s header can be read again."""
    return info.source if info.source is not None else info.path


def _same_file(a: GGUFInfo, b: GGUFInfo) -> bool:
    if a.source is not None or b.source is not None:
        return a.source is b.source
    return a.path.resolve() == b.path.resolve()


def check_draft_compatible(target: GGUFInfo | HeaderSource, draft: GGUFInfo | HeaderSource) -> None:
    """Raise IncompatibleDraftError unless llama.cpp would accept ``draft`` for ``target``.

    The rules, in llama.cpp's order: same vocabulary type; same add-BOS flag and, when BOS
    is added, the same BOS id; likewise for EOS; vocabulary sizes within 128; identical
    token text for every id from 5 up to the smaller vocabulary. The message names the
    rule that failed and both values.
    """
    t, d = _as_info(target), _as_info(draft)

    def fail(problem: str, fix: str = "pick a draft from the same model family") -> IncompatibleDraftError:
        return IncompatibleDraftError(f"draft {d.label} is incompatible with target {t.label}: {problem}; {fix}")

    t_kind, t_bos, t_eos, t_add_bos, t_add_eos = _llama_specials(t)
    d_kind, d_bos, d_eos, d_add_bos, d_add_eos = _llama_specials(d)
    if t_kind != d_kind:
        raise fail(f"vocabulary type differs (target {t.vocab_type!r}, draft {d.vocab_type!r})")
    for what, t_add, d_add, t_id, d_id in (("BOS", t_add_bos, d_add_bos, t_bos, d_bos),
                                           ("EOS", t_add_eos, d_add_eos, t_eos, d_eos)):
        if t_add != d_add:
            raise fail(f"one adds {what} to the prompt and the other does not "
                       f"(target add_{what.lower()}={t_add}, draft add_{what.lower()}={d_add})")
        if t_add and t_id != d_id:
            raise fail(f"{what} token id differs (target {t_id}, draft {d_id})")
    if abs(t.n_vocab - d.n_vocab) > _VOCAB_MAX_SIZE_DIFFERENCE:
        raise fail(f"vocabulary size differs by more than {_VOCAB_MAX_SIZE_DIFFERENCE} "
                   f"(target {t.n_vocab}, draft {d.n_vocab})")
    if _same_file(t, d):
        return  # the same file: its tokens match themselves
    t_tokens, d_tokens = _read_vocab(_origin(t)).tokens, _read_vocab(_origin(d)).tokens
    for i in range(_VOCAB_CHECK_START_TOKEN_ID, min(len(t_tokens), len(d_tokens))):
        if t_tokens[i] != d_tokens[i]:
            t_text = t_tokens[i].decode("utf-8", errors="replace")
            d_text = d_tokens[i].decode("utf-8", errors="replace")
            raise fail(f"token {i} differs (target {t_text!r}, draft {d_text!r})")
