"""What the installed llama.cpp build is: its log, its switches, its devices, its exactness.

Everything here describes the library, not a model: the one-time initialisation
(with the switches our patches add, set before the first decode), the log tail
a failed load explains itself with, the GPUs it sees, and whether a row's logits
come out the same alone and inside a batch on this build.
"""

from __future__ import annotations

import ctypes
import functools
import os
import threading
from collections import deque
from pathlib import Path
from typing import Any, Callable

import llama_cpp

_init_lock = threading.Lock()
_initialized = False
# The last lines llama.cpp logged: when a load fails, its reason is in here.
_log_tail: deque[str] = deque(maxlen=40)
_log_echo = bool(os.environ.get("LOCALSPEC_LLAMA_LOG"))


@llama_cpp.llama_log_callback
def _on_log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    line = text.decode("utf-8", errors="replace")
    if line.strip(". \n"):  # a load's progress dots would push its placement summary out of the tail
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


_SWITCH_DEFAULTS = {_TILED_MATMUL_ENV: "0", _FA_INVARIANT_ENV: "1", _FA_TILES_ENV: str(FA_TILES_FROM),
                    _SGEMM_INVARIANT_ENV: "1"}


def cpu_switches() -> dict[str, str]:
    """The ggml-cpu switches this process decodes with (our defaults, or what the user set): what an
    rpc-server built with our patches needs in its environment for its layers to be the same bits."""
    return {name: os.environ.get(name, default) for name, default in _SWITCH_DEFAULTS.items()}


def ensure_init() -> None:
    global _initialized
    with _init_lock:
        if not _initialized:
            for name, default in _SWITCH_DEFAULTS.items():
                os.environ.setdefault(name, default)
            llama_cpp.llama_log_set(_on_log, ctypes.c_void_p(0))
            llama_cpp.llama_backend_init()
            _initialized = True


def last_error_line() -> str:
    for line in reversed(_log_tail):
        text = line.strip()
        if text and ("error" in text.lower() or "failed" in text.lower()):
            return text
    return ""


def clear_log() -> None:
    """Forget what llama.cpp logged so far: a load's failure reason is then its own."""
    _log_tail.clear()


def recent_log() -> list[str]:
    """The last lines llama.cpp logged (at most 40; a model load starts afresh), e.g. its
    ``offloaded N/M layers to GPU`` summary right after a ``Model`` is loaded."""
    return list(_log_tail)


_GGML_DEVICE_GPU, _GGML_DEVICE_IGPU = 1, 2  # enum ggml_backend_dev_type: CPU, GPU, IGPU, ACCEL, META (ggml-backend.h)


def gpu_offload_supported() -> bool:
    """Whether this llama.cpp build can offload layers to a GPU of this machine (CUDA, Metal, Vulkan...).

    Not ``llama_supports_gpu_offload()``: that says yes for any build with the RPC backend in
    (src/llama.cpp), whose layers stay on this CPU unless remote servers are named (``devices``)."""
    ensure_init()
    api = _device_api()
    if api is None:
        return bool(llama_cpp.llama_supports_gpu_offload())
    count, get, kind, _, _ = api
    return any(kind(get(i)) in (_GGML_DEVICE_GPU, _GGML_DEVICE_IGPU) for i in range(count()))


@functools.cache
def _device_api() -> tuple[Any, ...] | None:
    """ggml's device functions from the loaded llama.cpp library (llama-cpp-python binds none of them);
    None when this build does not export them."""
    lib = native_library()
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
    ensure_init()
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


@functools.cache
def native_library() -> ctypes.CDLL:
    """The libllama that llama-cpp-python loaded, opened again by its path (the loader hands back the
    same library): for the functions the bindings do not wrap (ggml's device API, the NextN calls)."""
    folder = Path(llama_cpp.__file__).resolve().parent / "lib"
    for name in ("libllama.so", "libllama.dylib", "llama.dll"):
        if (folder / name).exists():
            return ctypes.CDLL(str(folder / name))
    raise RuntimeError(f"llama-cpp-python's libllama is not in {folder}; reinstall it (scripts/setup.sh)")


def system_flags() -> dict[str, str]:
    """llama.cpp's system line as ``{flag: value}`` ("AVX2 = 1 | LLAMAFILE = 1 | ..."): the build's
    switches and features, our patches' among them ("FA_BATCH_INVARIANT", "SGEMM_BATCH_INVARIANT",
    "REPACK_Q4_K_INVARIANT", "SMALL_BATCH_CHUNKS", "*_COLS": the patches' own interface, read here
    and by the self-test only)."""
    flags: dict[str, str] = {}
    for part in system_info().replace("\n", "|").split("|"):
        key, sep, value = part.partition("=")
        key = key.split(":")[-1].strip()
        if sep and key:
            flags[key] = value.strip()
    return flags


def patched() -> bool:
    """Whether this llama.cpp carries localspec's patches (scripts/llama.cpp-patches/: both switches)."""
    flags = system_flags()
    return "FA_BATCH_INVARIANT" in flags and "SGEMM_BATCH_INVARIANT" in flags


def library_version() -> str:
    """The installed llama-cpp-python's version (it pins the llama.cpp sources it vendors)."""
    return str(getattr(llama_cpp, "__version__", "unknown"))


def system_info() -> str:
    """llama.cpp's one-line description of the compiled backends and CPU features."""
    ensure_init()
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
    flags = system_flags()
    sgemm_exact = flags.get("LLAMAFILE") != "1" or flags.get("SGEMM_BATCH_INVARIANT") == "1"
    return sgemm_exact and not gpu_offload_supported()


# CUDA builds from scripts/setup.sh carry a switch (scripts/llama.cpp-patches/cuda/70-cuda-batch-invariant-
# switch.patch) under which ggml-cuda sums each query of a batch of up to CUDA_INVARIANT_ROWS as it sums a lone
# query: the user sets LOCALSPEC_CUDA_BATCH_INVARIANT=1 before starting (ggml reads it once per process) and
# the build reports it among its CUDA features. Read from the sources, unmeasured on a GPU (docs/gpu.md): the
# self-test measures it per model.
CUDA_INVARIANT_ROWS = 8  # ggml-cuda's MMVQ_MAX_BATCH_SIZE: larger batches take MMQ's tiles


def cuda_batch_invariant() -> bool | None:
    """Whether this process's CUDA kernels run under our batch-invariant switch (see above);
    None where the build has no such switch (a CPU build, a stock one, or a CUDA build before it)."""
    value = system_flags().get("CUDA_BATCH_INVARIANT")
    return None if value is None else value == "1"


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
    return system_flags().get("FA_BATCH_INVARIANT") == "1"


# Weight types whose repacked CPU kernels (ggml-cpu's "extra buffer types": a gemv for a lone row, a
# gemm for groups of 4 rows) give the same logits for a row alone and inside a batch; measured here,
# bitwise, over 1..9-row batches (SmolLM2 Q4_0). Stock repacked Q4_K is not (Gemma 3 270M Q4_K_M:
# logits up to 3.3 apart): its x86 gemv rounds differently from its gemm until our patch
# (scripts/llama.cpp-patches/20-exact-repack-sgemm.patch) makes it sum in the gemm's order; the
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
    if system_flags().get("REPACK_Q4_K_INVARIANT") == "1":
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


def usable_cpus() -> int:
    """The CPUs (hardware threads) this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def default_threads() -> int:
    """Threads for decoding: one per physical core among the CPUs this process may use, performance
    cores only on a hybrid CPU (Intel's P- and E-cores).

    A core's second hardware thread (SMT, Hyper-Threading) shares its vector units and caches, and
    ggml's threads meet at a barrier after every operation, so the pair waits for the slower of the
    two, as every thread waits for one on a slower efficiency core: llama.cpp's own tools
    (``common_cpu_get_num_math``) count the performance cores' physical cores, and llama-cpp-python
    defaults to half the CPUs. Where the topology cannot be read (not Linux, no sysfs), every usable CPU."""
    try:
        cpus = os.sched_getaffinity(0)
    except AttributeError:  # not on Linux
        return usable_cpus()
    return physical_cores(math_cpus(cpus, _performance_cpus()), _thread_siblings)


def math_cpus(cpus: "set[int] | frozenset[int]", performance: "set[int] | None") -> "set[int] | frozenset[int]":
    """Of ``cpus``, those on performance cores (``performance``: a hybrid CPU's, None where all cores are
    alike); all of them when none is (a process pinned to efficiency cores still decodes)."""
    if not performance:
        return cpus
    return (set(cpus) & performance) or cpus


def physical_cores(cpus: "set[int] | frozenset[int]", siblings: "Callable[[int], str | None]") -> int:
    """How many physical cores ``cpus`` cover: ``siblings(cpu)`` names the hardware threads sharing ``cpu``'s
    core (sysfs ``thread_siblings_list``, e.g. ``"0,8"``), None when unknown (then the CPU counts alone)."""
    return max(1, len({siblings(cpu) or f"cpu {cpu}" for cpu in cpus}))


def cpu_list(text: str) -> set[int]:
    """A sysfs CPU list (``"0-7,16,18-19"``) as a set; ValueError when it is not one."""
    out: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        first, _, last = part.partition("-")
        out.update(range(int(first), int(last or first) + 1))
    return out


def _thread_siblings(cpu: int) -> str | None:
    try:
        return Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list").read_text().strip() or None
    except OSError:
        return None


def _performance_cpus(root: Path = Path("/sys/devices")) -> set[int] | None:
    """A hybrid CPU's performance-core CPUs, from the kernel's two PMUs (``cpu_core`` and ``cpu_atom``
    exist only on hybrid Intel CPUs); None elsewhere or when unreadable."""
    try:
        performance = cpu_list((root / "cpu_core" / "cpus").read_text())
        efficiency = cpu_list((root / "cpu_atom" / "cpus").read_text())
    except (OSError, ValueError):
        return None
    return performance if performance and efficiency else None
