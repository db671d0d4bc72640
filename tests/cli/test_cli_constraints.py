"""`localspec generate --grammar FILE` and `--json-schema FILE` as a user runs them."""

from __future__ import annotations

import json

import pytest
from cli import assert_clean_error, localspec

SCHEMA = {"type": "object", "properties": {"colour": {"type": "string", "enum": ["red", "green", "blue"]}},
          "required": ["colour"]}


def test_a_json_schema_file_constrains_the_output(smollm2_path, tmp_path):
    schema = tmp_path / "colour.json"
    schema.write_text(json.dumps(SCHEMA))
    proc = localspec("generate", str(smollm2_path), "--draft", "ngram", "--draft-max", "3", "--json-schema",
                     str(schema), "--prompt", "Name a colour as JSON:", "--max-tokens", "40", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["finish_reason"] == "stop"
    assert json.loads(out["text"])["colour"] in ("red", "green", "blue")


def test_a_grammar_file_constrains_the_output(smollm2_path, tmp_path):
    grammar = tmp_path / "yesno.gbnf"
    grammar.write_text('root ::= " " ("yes" | "no")\n')
    proc = localspec("generate", str(smollm2_path), "--grammar", str(grammar), "--prompt", "Is water wet? Answer:",
                     "--max-tokens", "8", "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() in ("yes", "no")


@pytest.mark.parametrize("flag, content, needles", [
    ("--grammar", 'root ::= "a', ("--grammar does not parse", "unexpected end of input")),
    ("--json-schema", '{"not": {}}', ("--json-schema cannot be turned into a grammar",)),
    ("--json-schema", "{nope", ("--json-schema is not JSON",)),
    ("--grammar", None, ("--grammar", "cannot read it")),
])
def test_a_bad_grammar_or_schema_file_is_one_line(smollm2_path, tmp_path, flag, content, needles):
    path = tmp_path / "constraint.txt"
    if content is not None:
        path.write_text(content)
    proc = localspec("generate", str(smollm2_path), flag, str(path), "--prompt", "Hi", "--max-tokens", "4")
    assert_clean_error(proc, *needles)
