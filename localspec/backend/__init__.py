"""The llama.cpp backend: the only package that imports ``llama_cpp``.

It speaks llama.cpp's low-level C API through ``llama-cpp-python``'s ctypes
bindings and offers what the engine needs and nothing more, one module a job:

* ``build``: what the installed build is (its switches, devices, log tail,
  whether a row decodes the same alone and in a batch);
* ``model``: ``Model``, a loaded GGUF (``n_gpu_layers`` for CUDA offload), its
  vocabulary and how (if at all) its cache can be rolled back; ``quantize``;
* ``context``: ``Context``, a KV cache with ``decode`` that asks logits only for
  chosen rows (``llama_get_logits_ith``; never an n_ctx x n_vocab buffer),
  ``rollback_to`` (``llama_memory_seq_rm``) and the sequence copy/keep
  operations that multi-branch verification uses;
* ``devices``: the devices layers go to: local GPUs, and remote ggml RPC
  servers (probed with a bounded handshake before ggml's client, which aborts
  on a dead server, touches them); a ``models.split.DeviceSplit`` says
  which a model uses and in what shares;
* ``nextn``: the NextN functions libllama exports with C++ linkage, bound by
  their mangled names;
* ``draft_contexts``: ``MtpContext`` (the target's own MTP layers as a second
  context over its weights) and ``AssistantContext`` (Gemma 4's assistant GGUF,
  which reads the target's KV cache and hidden rows instead of keeping one) and
  ``Eagle3Context`` (an EAGLE-3 draft: an encoder over the target's tapped layer
  inputs and one decoder block) and ``DFlashContext`` (a DFlash draft: the target's
  features injected into its cache, a block of drafts from one pass);
* ``grammar``: ``Grammar``, a GBNF grammar compiled by llama.cpp's grammar
  sampler over a model's vocabulary, its states (mask a row, allow, accept,
  clone), and ``schema_grammar``, llama.cpp's JSON-schema converter;
* ``feature_taps``: the layer-input taps an EAGLE-3 draft reads, bound by their
  mangled names like the NextN functions.

Logits returned by ``Context.logits`` are views on llama.cpp's output buffer:
valid until the next ``decode`` on that context, and read-only by contract.
The names below are the package's public face; import them from here.
"""

from localspec.backend.build import (
                                     batch_invariant,
                                     cpu_flash_attention,
                                     cpu_switches,
                                     cuda_batch_invariant,
                                     default_threads,
                                     gpu_devices,
                                     gpu_offload_supported,
                                     library_version,
                                     patched,
                                     recent_log,
                                     repack_inexact_types,
                                     repack_is_exact,
                                     system_info,
                                     usable_cpus,
)
from localspec.backend.context import Context, DecodeListener
from localspec.backend.draft_contexts import (
                                     ASSISTANT_TARGETS,
                                     AssistantContext,
                                     DFlashContext,
                                     Eagle3Context,
                                     MtpContext,
)
from localspec.backend.devices import local_gpus, on_fatal, parse_endpoints, probe, rpc_devices
from localspec.backend.grammar import Grammar, GrammarState, schema_grammar
from localspec.backend.model import Model, model_params, quantize
from localspec.backend.feature_taps import eagle3_unavailable_reason
from localspec.backend.nextn import mtp_unavailable_reason

__all__ = [
    "ASSISTANT_TARGETS", "AssistantContext", "Context", "DFlashContext", "DecodeListener",
    "Eagle3Context", "Grammar", "GrammarState", "Model", "MtpContext", "batch_invariant", "cpu_switches", "cuda_batch_invariant",
    "cpu_flash_attention", "local_gpus", "model_params", "on_fatal", "parse_endpoints", "probe", "rpc_devices", "default_threads", "usable_cpus", "gpu_devices", "gpu_offload_supported", "library_version",
    "eagle3_unavailable_reason", "mtp_unavailable_reason", "patched", "quantize", "recent_log", "repack_inexact_types",
    "repack_is_exact", "system_info",
]
