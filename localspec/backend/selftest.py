"""The child half of ``localspec doctor``: everything that runs llama.cpp, in a process of its own.

Run as ``python -m localspec.backend.selftest [--rpc HOST:PORT,...] [MODEL]``. It prints one JSON object per
line on stdout: first ``{"build": ...}`` (what this llama.cpp was compiled
with, the GPUs it sees), then, with a model, ``{"selftest": ...}`` after a
decode that exercises the paths a real generation takes (on the GPU, every layer
offloaded, where the build sees one), after ``{"rpc": ...}`` when servers are named
(each probed with a bounded handshake, then its devices' memory as llama.cpp reports it): a prompt of at least
``LONG_PROMPT`` tokens in ONE ``llama_decode`` call (the large-batch matmul
kernels, where ggml's AMX path crashed with SIGILL) and a multi-token
verification batch with logits for every row, then a rollback. The same rows
are then decoded one token at a time, as plain decoding does, and compared bit
for bit with the batch's: whether THIS model decodes batch-invariantly here
(a build can be, and a model's weight types still take a kernel that is not).

If llama.cpp kills this process (an illegal instruction, a segfault, an abort),
the parent (``localspec.doctor``) sees the signal and reports it as one line;
whatever this process printed before dying is still read.
"""

from __future__ import annotations

import json
import re
import sys
import time

# At least this many prompt tokens go into one batch: ggml takes its large-batch
# matmul paths (and, on AMX CPUs built with it, the tile kernels) well below that.
LONG_PROMPT = 512
# Past 64 rows (flash attention's tiles), 8 (ggml's tiled K-quant matmul) and 4 (the repacked gemm): every
# batch path a verification takes. After LONG_PROMPT cells, so a lone query takes flash attention's split
# path (upstream; with our switch, many 128-cell chunks spread over the threads).
VERIFY_ROWS = 65
_TEXT = ("Speculative decoding lets a small draft propose several tokens that the target model then checks "
         "in a single batched forward pass; every accepted token saves one sequential step. ")


# Flags in llama.cpp's system line that say how it was built, not what the CPU offers.
_BUILD_FLAGS = ("LLAMAFILE", "OPENMP", "REPACK", "FA_BATCH_INVARIANT", "SGEMM_BATCH_INVARIANT",
                "REPACK_Q4_K_INVARIANT", "SMALL_BATCH_CHUNKS", "USE_GRAPHS", "NO_VMM", "FORCE_MMQ", "FORCE_CUBLAS",
                "NO_PEER_COPY", "BLACKWELL_NATIVE_FP4", "CUDA_BATCH_INVARIANT")


def _int_flag(system: str, name: str) -> int | None:
    """The number llama.cpp's system line gives ``name`` (``NAME = 16``), None where it says nothing."""
    m = re.search(rf"\b{name} = (\d+)", system)
    return int(m.group(1)) if m else None


def build_info() -> dict[str, object]:
    """What the loaded llama.cpp was built with, from its own system line."""
    from localspec import backend

    system = backend.system_info()
    flags = sorted({m.group(1) for m in re.finditer(r"([A-Z][A-Z0-9_]*) = 1\b", system)})
    return {
        "llama_cpp_python": backend.library_version(),
        "patched": backend.patched(),
        "system_info": system,
        "cpu_features": [f for f in flags if f not in _BUILD_FLAGS],
        "amx": any(f.startswith("AMX") for f in flags),
        "llamafile_sgemm": "LLAMAFILE" in flags,
        "sgemm_exact_only": "SGEMM_BATCH_INVARIANT" in flags,
        "repack_q4_k_exact": "REPACK_Q4_K_INVARIANT" in flags,
        # weight types whose batches take a multi-column kernel of our patch ("Q4_1_COLS = 4")
        "multi_column": sorted(m.group(1) for m in re.finditer(r"\b([A-Z0-9]+_[A-Z0-9]+)_COLS = \d+", system)),
        # chunks per thread of a small batch's matmul over many rows (our patch; 0: upstream's chunks)
        "small_batch_chunks": _int_flag(system, "SMALL_BATCH_CHUNKS"),
        # SIMD lanes of our batch-invariant flash attention over an F16 cache (16 AVX-512, 8 AVX2, 0 none)
        "fa_simd": _int_flag(system, "FA_INVARIANT_SIMD"),
        "gpu_offload": backend.gpu_offload_supported(),
        "cuda": "CUDA" in system,
        # compute capabilities ggml-cuda holds machine code for ("CUDA : ARCHS = 890,900"), also without a GPU
        "cuda_archs": (m.group(1).split(",") if (m := re.search(r"CUDA : ARCHS = ([0-9,]+)", system)) else []),
        "batch_invariant": backend.batch_invariant(),
        # our CUDA batch-invariant switch: on or off in this process, None where the build has none
        "cuda_batch_invariant": backend.cuda_batch_invariant(),
        "cpu_flash_attention": backend.cpu_flash_attention(),
        "gpus": [{"name": n, "free": free, "total": total} for n, free, total in backend.gpu_devices()],
    }


def offloaded_layers(log: list[str]) -> tuple[int, int] | None:
    """``(offloaded, offloadable)`` from llama.cpp's ``offloaded N/M layers to GPU`` log line, if any."""
    for line in reversed(log):
        m = re.search(r"offloaded (\d+)/(\d+) layers", line)
        if m:
            return int(m.group(1)), int(m.group(2))
    return None


def decode_test(model_path: str, *, flash_attn: bool | None = None) -> dict[str, object]:
    """Decode a long prompt in one batch, then a verification batch; return what was done.

    ``flash_attn``: as ``Context`` takes it (None: what a generation would use here).
    """
    import numpy as np

    from localspec import backend
    from localspec.backend import Context, Model

    # On the GPU where there is one (every layer, as a generation loads it), else on the CPU.
    gpus = backend.gpu_devices()
    model = Model(model_path, n_gpu_layers=-1 if gpus else 0)
    offloaded = offloaded_layers(backend.recent_log()) if gpus else None
    n_batch = LONG_PROMPT + 64
    ctx = Context(model, n_ctx=2 * n_batch, n_batch=n_batch, n_seq=1, flash_attn=flash_attn)
    try:
        text = _TEXT
        tokens = model.tokenize(text, add_special=True)
        while len(tokens) < LONG_PROMPT:
            text += _TEXT
            tokens = model.tokenize(text, add_special=True)
        tokens = tokens[:LONG_PROMPT]
        t0 = time.perf_counter()
        calls = ctx.decode_calls
        ctx.append(tokens)  # fits n_batch: one llama_decode call
        assert ctx.decode_calls == calls + 1, "the long prompt must go in one batch"
        prefill_s = time.perf_counter() - t0
        first = int(np.argmax(ctx.logits(len(tokens) - 1)))
        pos0 = len(ctx.tokens)
        # Under our CUDA batch-invariant switch, as many as it covers (Context.max_verify_rows: 8).
        n_rows = min(VERIFY_ROWS, ctx.max_verify_rows) if ctx.cuda_batch_invariant else VERIFY_ROWS
        draft = [first] + tokens[1:n_rows]
        ctx.decode(draft, range(pos0, pos0 + len(draft)), outputs=[True] * len(draft))
        rows = [ctx.logits(i) for i in range(len(draft))]
        if not all(np.isfinite(r).all() for r in rows):
            raise RuntimeError("the verification batch produced non-finite logits")
        batch_rows = [r.copy() for r in rows]
        ctx.tokens.extend(draft)
        ctx.rollback_to(pos0)
        diff = 0.0
        argmax_same = 0
        for i, token in enumerate(draft):  # the same rows as plain decoding computes them
            ctx.append([token])
            single = ctx.logits(0)
            diff = max(diff, float(np.max(np.abs(single - batch_rows[i]))))
            argmax_same += int(np.argmax(single)) == int(np.argmax(batch_rows[i]))
        ctx.rollback_to(pos0 + 1)
        return {"ok": True, "prompt_tokens": len(tokens), "one_batch": True, "verify_rows": len(draft),
                "prefill_ms": round(prefill_s * 1e3, 1), "batch_invariant": diff == 0.0,
                "max_logit_diff": diff, "argmax_same_rows": argmax_same, "repack": model.repack,
                "flash_attn": ctx.flash_attn,
                # where it ran: the GPU's name and the layers llama.cpp put on it ("cpu", None: none)
                "device": gpus[0][0] if gpus else "cpu", "offloaded_layers": offloaded,
                "n_layers": model.n_layers}
    finally:
        ctx.close()
        model.close()


def rpc_servers(endpoints: list[str]) -> list[dict[str, object]]:
    """Each RPC server: reachable or why not (a bounded handshake), and its devices as llama.cpp reports them."""
    from localspec.backend import probe, rpc_devices
    from localspec.errors import RemoteDeviceError

    found: list[dict[str, object]] = []
    for endpoint in endpoints:
        try:
            version = probe(endpoint)
            devices = rpc_devices([endpoint])
        except RemoteDeviceError as err:
            found.append({"endpoint": endpoint, "ok": False, "problem": str(err)})
            continue
        found.append({"endpoint": endpoint, "ok": True, "version": ".".join(map(str, version)),
                      "devices": [{"name": d.name, "free": d.free, "total": d.total} for d in devices]})
    return found


def main(argv: list[str]) -> int:
    print(json.dumps({"build": build_info()}), flush=True)
    if argv[:1] == ["--rpc"]:
        print(json.dumps({"rpc": rpc_servers(argv[1].split(","))}), flush=True)
        argv = argv[2:]
    if argv:
        print(json.dumps({"selftest": decode_test(argv[0])}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
