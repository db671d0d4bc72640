"""The small tokenizer the GPU check's random models share (SmolLM2's, Apache-2.0).

``tokenizer.json.gz`` next to this file holds only the ``tokenizer.ggml.*``
metadata of SmolLM2-135M-Instruct (a GPT-2 style BPE with 49152 tokens, its
merges, special ids and chat template): no weights. It travels with the
repository so a machine without network can write GGUF models that real
llama.cpp tokenizes exactly as it tokenizes SmolLM2.

    python benchmarks/gpu/tokenizer.py SmolLM2-135M-Instruct.Q4_1.gguf   # re-extract
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path
from typing import Any

TOKENIZER_FILE = Path(__file__).with_name("tokenizer.json.gz")

# GGUF key (after "tokenizer.ggml.") -> our JSON key; scalars first, then arrays.
_SCALARS = ("model", "pre", "bos_token_id", "eos_token_id", "unknown_token_id", "padding_token_id",
            "add_bos_token", "add_space_prefix")
_ARRAYS = ("tokens", "token_type", "merges")


def extract(src: str | Path, dst: Path = TOKENIZER_FILE) -> dict[str, Any]:
    """Copy the tokenizer metadata of GGUF ``src`` into ``dst`` (gzip'd JSON)."""
    import gguf

    reader = gguf.GGUFReader(str(src))
    out: dict[str, Any] = {"source": Path(src).name,
                           "license": _field(reader, "general.license") or "unknown"}
    for key in _SCALARS + _ARRAYS:
        value = _field(reader, f"tokenizer.ggml.{key}")
        if value is not None:
            out[key] = value
    template = _field(reader, "tokenizer.chat_template")
    if template is not None:
        out["chat_template"] = template
    if "tokens" not in out or "model" not in out:
        raise ValueError(f"{src} has no tokenizer.ggml.tokens/model: not a GGUF with an embedded tokenizer")
    raw = json.dumps(out, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    # mtime=0: the same tokenizer always gives the same bytes (a clean git diff).
    with open(dst, "wb") as fh, gzip.GzipFile(fileobj=fh, mode="wb", compresslevel=9, mtime=0) as gz:
        gz.write(raw)
    return out


def _field(reader: Any, key: str) -> Any:
    field = reader.fields.get(key)
    if field is None:
        return None
    value = field.contents()
    return value


def load(path: Path = TOKENIZER_FILE) -> dict[str, Any]:
    """The tokenizer metadata as written by ``extract``."""
    with gzip.open(path, "rb") as fh:
        return json.loads(fh.read().decode("utf-8"))


def add_to_writer(writer: Any, tok: dict[str, Any]) -> None:
    """Write ``tok`` into a ``gguf.GGUFWriter`` as the model's tokenizer."""
    writer.add_tokenizer_model(tok["model"])
    if "pre" in tok:
        writer.add_tokenizer_pre(tok["pre"])
    writer.add_token_list(tok["tokens"])
    writer.add_token_types(tok["token_type"])
    if "merges" in tok:
        writer.add_token_merges(tok["merges"])
    for key, add in (("bos_token_id", writer.add_bos_token_id), ("eos_token_id", writer.add_eos_token_id),
                     ("unknown_token_id", writer.add_unk_token_id), ("padding_token_id", writer.add_pad_token_id),
                     ("add_bos_token", writer.add_add_bos_token), ("add_space_prefix", writer.add_add_space_prefix)):
        if key in tok:
            add(tok[key])
    if "chat_template" in tok:
        writer.add_chat_template(tok["chat_template"])


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    info = extract(sys.argv[1])
    print(f"{TOKENIZER_FILE}: {len(info['tokens'])} tokens, {len(info.get('merges', []))} merges, "
          f"{TOKENIZER_FILE.stat().st_size / 1e6:.2f} MB")
