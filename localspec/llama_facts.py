"""What llama.cpp does that localspec's code relies on, as constants read from its sources.

Each fact names where it was read (the llama.cpp that llama-cpp-python 0.3.36
vendors). They are internal to llama.cpp, not part of its API, so an upgrade
must check each one (docs/upgrading-llama.md); nothing here imports llama.cpp,
so the planner and the registry can use them without loading the library.
"""

from __future__ import annotations

N_UBATCH = 512        # llama.cpp's default physical batch, which sizes the compute buffers
# The draft model's physical batch. It decodes one token at a time (and catches up on the prompt in
# chunks), so a small batch costs it little, while its compute buffer, reserved for a batch that
# wants every row's logits, shrinks 4x: ~230 MiB less for a Qwen3 draft (152k vocabulary).
DRAFT_N_UBATCH = 128
# Recurrent-state snapshots per sequence (llama.cpp's n_rs_seq) a context asks for on a model whose
# architecture llama.cpp can roll back by snapshots (Qwen3.5, LFM2, Nemotron-H...): the most tokens one
# rollback takes back, so the longest draft such a target verifies. The engine's automatic draft length
# stops at 16 as well.
ROLLBACK_SNAPSHOTS = 16
# Architectures whose recurrent state llama.cpp snapshots token by token (``n_rs_seq``), as GGUF names
# them: the list ``llm_arch_supports_rs_rollback`` keeps in the vendored src/llama-arch.cpp (internal C++,
# not exported). For any other architecture llama.cpp silently sets ``n_rs_seq`` to 0; the backend reads
# the value back, so an out-of-date entry here shows up as a context that cannot roll back, never as a
# wrong one.
SNAPSHOT_ARCHITECTURES = frozenset({
    "qwen35", "qwen35moe", "qwen4exp", "deepseek4", "glm5-next", "nemotron_h", "nemotron_h_moe",
    "lfm2", "lfm2moe", "bailingmoe3", "kimi-k3",
})
# Architectures whose every layer is recurrent (llama.cpp's llama_model_is_recurrent).
ALL_RECURRENT = frozenset({"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})
# Target architectures whose graph exposes every layer's input to llama_set_embeddings_layer_inp (they
# set ``res->t_layer_inp[il]``, src/models/*.cpp of the vendored llama.cpp): the targets an EAGLE-3 draft
# can read. On any other, llama.cpp aborts ("layer input tensor is null"), so the pairing refuses it first.
LAYER_TAP_ARCHITECTURES = frozenset({
    "bailingmoe3", "deepseek4", "gemma4", "gpt-oss", "hunyuan_vl", "lfm2", "llama", "mimo2", "minimax-01",
    "minimax-m2", "muse-glimmer", "nanbeige", "nemotron_h", "qwen3", "qwen35", "qwen35moe", "qwen3moe",
    "qwen3next", "qwen4exp",
})
# Draft architectures that read a target's layers (src/models/eagle3.cpp, dflash.cpp): they have no
# use alone, so the registry never runs one as a model or counts it as a size of its family.
FEATURE_DRAFT_ARCHITECTURES = frozenset({"eagle3", "dflash"})
# Assistant architectures (src/models/gemma4-assistant.cpp: a draft that reads its target's KV cache and
# hidden rows) and the target architecture each drafts for.
ASSISTANT_TARGETS = {"gemma4-assistant": "gemma4"}
# The tensor that makes a dflash GGUF a DSpark draft (its Markov head), as llama.cpp tells them apart
# (common/speculative.cpp, src/models/dflash.cpp).
DSPARK_MARKOV_TENSOR = "markov_w1.weight"
# The layers an EAGLE-3 draft reads: llama.cpp's loader requires exactly this many (src/models/eagle3.cpp).
EAGLE3_N_TARGET_LAYERS = 3
# ggml's RPC protocol (ggml/include/ggml-rpc.h, ggml/src/ggml-rpc/): a client's first message is HELLO
# (command 14, "must be always 14"), an 8-byte little-endian size and a 24-byte capabilities field; the
# server answers with a size, then major, minor, patch, a padding byte and its own 24 bytes. The client
# refuses a server whose major differs or whose minor is newer. An rpc-server serves one client at a
# time (it accepts the next connection only when the current one closes) and listens on 50052 by default.
RPC_CMD_HELLO = 14
RPC_CONN_CAPS_SIZE = 24
RPC_PROTO_VERSION = (7, 0, 0)
RPC_DEFAULT_PORT = 50052
# llama.cpp's own limit on devices (llama_max_devices(); tensor_split has this many entries).
MAX_DEVICES = 16
