"""`localspec generate --tools FILE [--tool-choice CHOICE]` as a user runs it: the tools rendered by the
model's own template, a named or required choice enforced, the calls in --json's tool_calls, and each
mistake one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli import assert_clean_error, localspec
from tools_model import write_tools_model

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"enum": ["Oslo", "Lima"]}}, "required": ["city"],
    "additionalProperties": False}}}


@pytest.fixture(scope="module")
def qwen3_tools_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tools_model(tmp_path_factory.mktemp("tools") / "random-qwen3-tools.gguf")


def tools_file(tmp_path: Path, tools: object) -> str:
    path = tmp_path / "tools.json"
    path.write_text(json.dumps(tools) if not isinstance(tools, str) else tools)
    return str(path)


@pytest.mark.parametrize("choice", ["get_weather", "required"])
def test_a_forced_choice_comes_back_as_a_tool_call(qwen3_tools_model: Path, tmp_path: Path, choice: str) -> None:
    proc = localspec("generate", str(qwen3_tools_model), "--tools", tools_file(tmp_path, [WEATHER]), "--tool-choice",
                     choice, "--prompt", "Weather in Oslo?", "--max-tokens", "60", "--temp", "0", "--json",
                     "--quiet", "--gpu-layers", "0")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["text"].startswith("<tool_call>\n")  # Qwen3's own syntax, as the model wrote it
    if choice == "required":  # one call or more in a row: random weights may go on until max_tokens
        assert out["tool_calls"] and out["finish_reason"] in ("stop", "length"), out["text"]
    else:  # a named function is one call, then the end
        assert out["finish_reason"] == "stop" and out["content"] is None and len(out["tool_calls"]) == 1, out
    for call in out["tool_calls"]:
        assert call["type"] == "function" and call["function"]["name"] == "get_weather"
        assert json.loads(call["function"]["arguments"])["city"] in ("Oslo", "Lima")


@pytest.mark.parametrize("tools,choice,needles", [
    ("[{oops", None, ("--tools", "not JSON")),
    ([{"type": "function", "function": {"description": "no name"}}], None,
     ("--tools", "tools[0].function.name is required")),
    ([WEATHER], "get_time", ("--tools", "get_time", "not in tools")),
    ([], None, ("lists no tools",)),
])
def test_a_bad_tools_file_is_one_line(qwen3_tools_model: Path, tmp_path: Path, tools: object, choice: str | None,
                                      needles: tuple[str, ...]) -> None:
    extra = ["--tool-choice", choice] if choice else []
    proc = localspec("generate", str(qwen3_tools_model), "--tools", tools_file(tmp_path, tools), *extra,
                     "--prompt", "x", "--max-tokens", "4")
    assert_clean_error(proc, *needles)


def test_tool_choice_without_tools_and_a_model_without_tools_are_one_line(smollm2_path: Path,
                                                                           tmp_path: Path) -> None:
    assert_clean_error(localspec("generate", str(smollm2_path), "--tool-choice", "required", "--prompt", "x"),
                       "--tool-choice needs --tools")
    proc = localspec("generate", str(smollm2_path), "--tools", tools_file(tmp_path, [WEATHER]), "--prompt", "x",
                     "--max-tokens", "4", "--gpu-layers", "0")
    assert_clean_error(proc, "chat template has no tool format")
