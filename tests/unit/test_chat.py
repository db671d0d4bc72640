"""Chat templates: the model's own Jinja, rendered in a sandbox (pure), and on the real SmolLM2."""

from __future__ import annotations

import pytest

from localspec.chat import Message, render_chat
from localspec.errors import UnsupportedModelError

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def test_messages_render_in_the_template_order() -> None:
    text = render_chat(CHATML, [Message("system", "Be brief."), {"role": "user", "content": "Hi"}])
    assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                    "<|im_start|>assistant\n")


def test_the_generation_prompt_is_optional() -> None:
    text = render_chat(CHATML, [Message("user", "Hi")], add_generation_prompt=False)
    assert text.endswith("<|im_end|>\n")


def test_bos_and_eos_reach_the_template() -> None:
    text = render_chat("{{ bos_token }}{{ messages[0]['content'] }}{{ eos_token }}", [Message("user", "x")],
                       bos_token="<s>", eos_token="</s>")
    assert text == "<s>x</s>"


def test_a_model_without_a_template_is_a_clear_error() -> None:
    with pytest.raises(UnsupportedModelError, match="no chat template.*without --chat"):
        render_chat(None, [Message("user", "Hi")], model_name="base.gguf")


def test_raise_exception_in_a_template_is_reported() -> None:
    template = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first message must be user') }}{% endif %}"
    with pytest.raises(UnsupportedModelError, match="chat template of m.gguf failed: first message must be user"):
        render_chat(template, [Message("system", "x")], model_name="m.gguf")


def test_a_template_is_compiled_once_and_a_broken_one_fails_every_time(monkeypatch) -> None:
    """A chat renders its template every turn, and compiling is most of the work (30 ms for Qwen3's)."""
    from localspec import chat

    compiled: list[str] = []
    compile_ = chat._env.from_string
    monkeypatch.setattr(chat._env, "from_string", lambda source: (compiled.append(source), compile_(source))[1])
    template = CHATML + "{# compiled once #}"
    first = render_chat(template, [Message("user", "Hi")])
    assert render_chat(template, [Message("user", "Hi"), Message("assistant", "Yo")]).startswith(first)
    assert compiled == [template]
    for _ in range(2):
        with pytest.raises(UnsupportedModelError, match="chat template of m.gguf failed"):
            render_chat("{% for %}", [Message("user", "Hi")], model_name="m.gguf")


@pytest.mark.parametrize("template", [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",         # reach Python's object graph
    "{{ messages.append({'role': 'x', 'content': 'y'}) }}",   # mutate what it was given
    "{{ cycler.__init__.__globals__ }}",                     # reach module globals
])
def test_the_sandbox_refuses_escapes(template: str) -> None:
    with pytest.raises(UnsupportedModelError, match="chat template of evil.gguf failed"):
        render_chat(template, [Message("user", "Hi")], model_name="evil.gguf")


def test_the_real_smollm2_template(smollm2_path) -> None:
    from localspec.backend import Model

    model = Model(smollm2_path)
    try:
        text = render_chat(model.chat_template(), [Message("system", "Be brief."), Message("user", "Hi")])
        assert "<|im_start|>system\nBe brief.<|im_end|>" in text
        assert text.rstrip().endswith("<|im_start|>assistant")
        ids = model.tokenize(text, add_special=False, parse_special=True)
        # Parsed as the special token, not spelt out as text.
        start = model.tokenize("<|im_start|>", add_special=False, parse_special=True)
        assert len(start) == 1 and ids[0] == start[0]
    finally:
        model.close()
