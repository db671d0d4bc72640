"""A tiny Llama-architecture GGUF with random weights, SmolLM2's tokenizer and another family's chat
template (Qwen3's, by default): a model whose template renders tools, small enough for a test server.

Random weights write nonsense; under ``tool_choice`` required or a named function the grammar still
makes every reply a well-formed call, which is what the server tests check.
"""

from __future__ import annotations

from pathlib import Path

from tiny_gguf import RandomWeights, add_llama, gguf_writer

TEMPLATES = Path(__file__).resolve().parents[1] / "data" / "templates"
N_EMBD, N_HEAD, HEAD_DIM, N_LAYER, N_FF = 64, 4, 16, 2, 128


def write_tools_model(path: Path, template: str = "qwen3.jinja", *, seed: int = 0) -> Path:
    """Write the model to ``path`` with ``tests/data/templates/TEMPLATE`` as its chat template."""
    text = (TEMPLATES / template).read_text()
    with gguf_writer(path, "llama", f"random-{Path(template).stem}-tools", chat_template=text) as (writer, n_vocab):
        add_llama(writer, RandomWeights(seed), n_vocab, n_embd=N_EMBD, n_layer=N_LAYER, n_ff=N_FF, n_head=N_HEAD,
                  n_head_kv=N_HEAD, head_dim=HEAD_DIM)
    return path
