"""The NextN (MTP) functions llama.cpp exports with C++ linkage, bound by their mangled names."""

from __future__ import annotations

import ctypes
import functools
from typing import Any

import llama_cpp

from localspec.backend.build import native_library

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
def nextn_api() -> _NextnApi | None:
    """The C++-linkage NextN functions from the loaded libllama; None when any is missing."""
    try:
        return _NextnApi(native_library())
    except AttributeError:
        return None


def mtp_unavailable_reason() -> str | None:
    """Why this llama.cpp build cannot run a model's MTP layers (None: it can)."""
    missing = [name for name in _MTP_PUBLIC if not hasattr(llama_cpp, name)]
    if nextn_api() is None:
        lib = native_library()
        missing += ["llama_" + name for name, sym in _NEXTN_SYMBOLS.items() if not hasattr(lib, sym)]
    if not missing:
        return None
    return (f"this llama.cpp build lacks the functions that run a model's MTP layers ({', '.join(missing)}); "
            "install llama-cpp-python 0.3.36 or newer (scripts/setup.sh builds it)")
