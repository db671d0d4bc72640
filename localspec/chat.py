"""Chat templates: the model's own Jinja template, rendered in a sandbox.

A GGUF carries its chat template (``tokenizer.chat_template``) as Jinja
source written by whoever published the model. It is rendered in jinja2's
immutable sandbox, so a template can format messages but cannot reach into
Python objects or mutate anything.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Iterable, Mapping

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from localspec.errors import UnsupportedModelError


@dataclass(frozen=True)
class Message:
    role: str
    content: str

    def as_dict(self) -> dict[str, str]:
        return {"role": self.role, "content": self.content}


def _raise(message: str) -> None:
    raise TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


_env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
_env.globals.update(raise_exception=_raise, strftime_now=_strftime_now)


def render_chat(template: str | None, messages: Iterable[Message | Mapping[str, str]], *,
                bos_token: str = "", eos_token: str = "", add_generation_prompt: bool = True,
                model_name: str = "the model") -> str:
    """The prompt text for ``messages`` in the model's own format.

    The result may contain special-token text (``<|im_start|>``); tokenize it
    with special tokens parsed.
    """
    if not template:
        raise UnsupportedModelError(
            f"{model_name} has no chat template in its GGUF metadata; run without --chat and write the prompt yourself"
        )
    msgs = [m.as_dict() if isinstance(m, Message) else dict(m) for m in messages]
    try:
        return _env.from_string(template).render(
            messages=msgs, bos_token=bos_token, eos_token=eos_token,
            add_generation_prompt=add_generation_prompt,
        )
    except TemplateError as err:
        raise UnsupportedModelError(f"the chat template of {model_name} failed: {err}") from None
