"""A tiny Llama-architecture GGUF with random weights, SmolLM2's tokenizer and another family's chat
template (Qwen3's, by default): a model whose template renders tools, small enough for a test server.

Random weights write nonsense; under ``tool_choice`` required or a named function the grammar still
makes every reply a well-formed call, which is what the server tests check.
"""

from __future__ import annotations

from pathlib import Path

from tiny_gguf import RandomWeights, gguf_writer

TEMPLATES = Path(__file__).resolve().parents[1] / "data" / "templates"
N_EMBD, N_HEAD, HEAD_DIM, N_LAYER, N_FF = 64, 4, 16, 2, 128


def write_tools_model(path: Path, template: str = "qwen3.jinja", *, seed: int = 0) -> Path:
    """Write the model to ``path`` with ``tests/data/templates/TEMPLATE`` as its chat template."""
    import gguf

    weights = RandomWeights(seed)
    normal, ones = weights.normal, weights.ones
    text = (TEMPLATES / template).read_text()
    with gguf_writer(path, "llama", f"random-{Path(template).stem}-tools", chat_template=text) as (writer, n_vocab):
        writer.add_embedding_length(N_EMBD)
        writer.add_block_count(N_LAYER)
        writer.add_feed_forward_length(N_FF)
        writer.add_head_count(N_HEAD)
        writer.add_head_count_kv(N_HEAD)
        writer.add_rope_dimension_count(HEAD_DIM)
        writer.add_rope_freq_base(10000.0)
        writer.add_layer_norm_rms_eps(1e-5)
        writer.add_file_type(gguf.LlamaFileType.ALL_F32)
        writer.add_tensor("token_embd.weight", normal(n_vocab, N_EMBD, std=1.0))
        writer.add_tensor("output_norm.weight", ones(N_EMBD))
        writer.add_tensor("output.weight", normal(n_vocab, N_EMBD, std=1.0))
        for i in range(N_LAYER):
            p = f"blk.{i}."
            writer.add_tensor(p + "attn_norm.weight", ones(N_EMBD))
            for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
                writer.add_tensor(p + name + ".weight", normal(N_EMBD, N_EMBD, std=N_EMBD ** -0.5))
            writer.add_tensor(p + "ffn_norm.weight", ones(N_EMBD))
            writer.add_tensor(p + "ffn_gate.weight", normal(N_FF, N_EMBD, std=N_EMBD ** -0.5))
            writer.add_tensor(p + "ffn_up.weight", normal(N_FF, N_EMBD, std=N_EMBD ** -0.5))
            writer.add_tensor(p + "ffn_down.weight", normal(N_EMBD, N_FF, std=N_FF ** -0.5))
    return path
