"""GGUF metadata of models we do not have on disk (a 14B, a 70B and their drafts), for the planner's tests."""

from __future__ import annotations

from pathlib import Path

from localspec.models.gguf_info import GGUFInfo


def synthetic(label: str, *, n_layers: int, n_embd: int, n_head: int, n_head_kv: int, head_dim: int, n_ff: int,
              n_vocab: int, context_length: int, layer_bytes: int, token_embd_bytes: int, output_bytes: int,
              other_bytes: int, n_params: int, file_type: str) -> GGUFInfo:
    """A GGUFInfo for a model we do not have on disk, shaped like its real GGUF."""
    tensor_bytes = n_layers * layer_bytes + token_embd_bytes + output_bytes + other_bytes
    return GGUFInfo(
        path=Path(f"/models/{label}.gguf"), architecture="qwen3", name=label, file_size=tensor_bytes + 8_000_000,
        n_params=n_params, n_layers=n_layers, n_embd=n_embd, n_ff=n_ff, n_head=n_head, n_head_kv=n_head_kv,
        kv_heads_by_layer=(n_head_kv,) * n_layers, head_dim_k=head_dim, head_dim_v=head_dim,
        context_length=context_length, n_vocab=n_vocab, vocab_type="gpt2", tokenizer_pre="qwen2", bos_id=None,
        eos_id=151645, add_bos=False, add_eos=False, chat_template=None, file_type=file_type,
        bits_per_weight=8 * tensor_bytes / n_params, sliding_window=None, swa_layers=(False,) * n_layers,
        layer_bytes=(layer_bytes,) * n_layers, token_embd_bytes=token_embd_bytes, output_bytes=output_bytes,
        other_bytes=other_bytes,
    )


# Qwen3-14B-class target at Q4_K_M: 151936 x 5120 = 777,912,320 embedding weights;
# token_embd Q4_K (4.5 bits): 437,575,680 B; output Q6_K (6.5625 bits): 638,131,200 B;
# 40 layers of 180,000,000 B and 1,000,000 B of norms: 8,276,706,880 B in all (~8.3 GB).
QWEN3_14B = synthetic("qwen3-14b-q4_k_m", n_layers=40, n_embd=5120, n_head=40, n_head_kv=8, head_dim=128,
                      n_ff=17408, n_vocab=151936, context_length=40960, layer_bytes=180_000_000,
                      token_embd_bytes=437_575_680, output_bytes=638_131_200, other_bytes=1_000_000,
                      n_params=14_768_307_200, file_type="Q4_K_M")
# Qwen3-0.6B-class draft at Q8_0 (34 bytes per 32 weights), output tied to the embedding:
# per layer q 1024x2048 + k 1024x1024 + v 1024x1024 + o 2048x1024 + ffn 3 x 1024x3072 = 15,728,640 weights
# -> 16,711,680 B; embedding 151936 x 1024 = 155,582,464 weights -> 165,306,368 B.
QWEN3_06B = synthetic("qwen3-0.6b-q8_0", n_layers=28, n_embd=1024, n_head=16, n_head_kv=8, head_dim=128,
                      n_ff=3072, n_vocab=151936, context_length=40960, layer_bytes=16_711_680,
                      token_embd_bytes=165_306_368, output_bytes=0, other_bytes=0,
                      n_params=28 * 15_728_640 + 155_582_464, file_type="Q8_0")
# Llama-3-70B-class target (~42 GB at Q4_K_M) and a Llama-3.2-1B-class draft (Q8_0, tied).
LLAMA_70B = synthetic("llama-70b-q4_k_m", n_layers=80, n_embd=8192, n_head=64, n_head_kv=8, head_dim=128,
                      n_ff=28672, n_vocab=128256, context_length=8192, layer_bytes=500_000_000,
                      token_embd_bytes=590_000_000, output_bytes=860_000_000, other_bytes=2_000_000,
                      n_params=70_553_706_496, file_type="Q4_K_M")
LLAMA_1B = synthetic("llama-1b-q8_0", n_layers=16, n_embd=2048, n_head=32, n_head_kv=8, head_dim=64,
                     n_ff=8192, n_vocab=128256, context_length=131072, layer_bytes=60_000_000,
                     token_embd_bytes=279_085_056, output_bytes=0, other_bytes=0,
                     n_params=1_235_814_400, file_type="Q8_0")
