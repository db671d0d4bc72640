"""The target-feature taps EAGLE-3 drafts read, bound by their mangled names (``src/llama-ext.h``).

An EAGLE-3 draft reads the inputs of three of the target's layers at every
position. llama.cpp hands them over through functions of its staging header,
exported with C++ linkage and not bound by llama-cpp-python (as the NextN
functions in ``nextn.py``): ``llama_set_embeddings_layer_inp`` turns on the copy
of layer ``lid``'s input for every row of each decode, and
``llama_get_embeddings_layer_inp`` reads it back (``n_tokens x n_embd``); the
draft model names its layers with ``llama_model_target_layer_ids[_n]``.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any


from localspec.backend.build import native_library
from localspec.backend.nextn import mtp_unavailable_reason

_TAP_SYMBOLS = {
    # void llama_set_embeddings_layer_inp(llama_context *, uint32_t lid, bool value)
    "set_embeddings_layer_inp": "_Z30llama_set_embeddings_layer_inpP13llama_contextjb",
    # float * llama_get_embeddings_layer_inp(llama_context *, uint32_t lid)
    "get_embeddings_layer_inp": "_Z30llama_get_embeddings_layer_inpP13llama_contextj",
    # const int32_t * llama_model_target_layer_ids(const llama_model *)
    "model_target_layer_ids": "_Z28llama_model_target_layer_idsPK11llama_model",
    # uint32_t llama_model_target_layer_ids_n(const llama_model *)
    "model_target_layer_ids_n": "_Z30llama_model_target_layer_ids_nPK11llama_model",
}


class _TapApi:
    def __init__(self, lib: Any) -> None:
        f = self.set_embeddings_layer_inp = getattr(lib, _TAP_SYMBOLS["set_embeddings_layer_inp"])
        f.argtypes, f.restype = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_bool], None
        f = self.get_embeddings_layer_inp = getattr(lib, _TAP_SYMBOLS["get_embeddings_layer_inp"])
        f.argtypes, f.restype = [ctypes.c_void_p, ctypes.c_uint32], ctypes.POINTER(ctypes.c_float)
        f = self.model_target_layer_ids = getattr(lib, _TAP_SYMBOLS["model_target_layer_ids"])
        f.argtypes, f.restype = [ctypes.c_void_p], ctypes.POINTER(ctypes.c_int32)
        f = self.model_target_layer_ids_n = getattr(lib, _TAP_SYMBOLS["model_target_layer_ids_n"])
        f.argtypes, f.restype = [ctypes.c_void_p], ctypes.c_uint32


@functools.cache
def tap_api() -> _TapApi | None:
    """The C++-linkage feature-tap functions from the loaded libllama; None when any is missing."""
    try:
        return _TapApi(native_library())
    except AttributeError:
        return None


def eagle3_unavailable_reason() -> str | None:
    """Why this llama.cpp build cannot run an EAGLE-3 draft (None: it can)."""
    reason = mtp_unavailable_reason()  # the NextN calls carry the draft's own hidden rows
    missing = []
    if tap_api() is None:
        lib = native_library()
        missing = ["llama_" + name for name, sym in _TAP_SYMBOLS.items() if not hasattr(lib, sym)]
    if reason is None and not missing:
        return None
    if missing:
        return (f"this llama.cpp build lacks the functions that hand a target's layers to an EAGLE-3 draft "
                f"({', '.join(missing)}); install llama-cpp-python 0.3.36 or newer (scripts/setup.sh builds it)")
    return reason
