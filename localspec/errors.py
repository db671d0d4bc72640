"""One error hierarchy for everything a user can cause.

Every error carries a single line that says what failed, why, and what to do.
The CLI renders it once (``localspec: error: ...``) and exits with ``exit_code``;
nothing below the CLI prints or exits on its own.
"""

from __future__ import annotations


def shown(text: str, limit: int = 60, *, quote: str = "'") -> str:
    """``text`` for a one-line message, in ``quote``s: control characters escaped, and cut (with its
    length said) when longer than ``limit`` (a prompt passed where a model or a path was expected)."""
    escaped = repr(text)[1:-1] if any(c < " " for c in text) else text
    if len(escaped) <= limit:
        return f"{quote}{escaped}{quote}"
    return f"{quote}{escaped[:limit]}…{quote} ({len(text):,} characters)"


class LocalspecError(Exception):
    """A failure the user can act on. ``str(err)`` is the whole one-line message."""

    exit_code: int = 2


class InvalidOptionError(LocalspecError):
    """An option is out of range or inconsistent with another option.

    ``param``: the parameter at fault as the core names it (``temperature``,
    ``max_tokens``, ``draft_len``), the message's first word when set. The core
    knows no command-line flags: a front end that calls the parameter otherwise
    (the CLI's ``--temp``) renames it with ``named``.
    """

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param

    def named(self, name: str) -> str:
        """The message with its parameter name replaced by ``name`` (a flag, a JSON field) where it names
        the parameter: at the start, and in "PARAM must be" (the rule that follows)."""
        text = str(self)
        if self.param and text.startswith(self.param + " "):
            text = name + text[len(self.param):]
        return text.replace(f": {self.param} must be ", f": {name} must be ") if self.param else text


class ModelFileError(LocalspecError):
    """A model file is missing, is not GGUF, is truncated or cannot be loaded."""


class IncompatibleDraftError(LocalspecError):
    """The draft's vocabulary does not match the target's."""


class ContextOverflowError(LocalspecError):
    """The prompt (plus what must be generated) does not fit in the context window."""


class UnsupportedModelError(LocalspecError):
    """The model cannot do what was asked (e.g. roll back its cache for speculation)."""


class RegistryError(LocalspecError):
    """A model name cannot be resolved, or models.toml is malformed."""


class DownloadError(LocalspecError):
    """A model could not be fetched or verified."""


class EngineStateError(LocalspecError):
    """The engine cannot do this now: it was closed, or it is busy with another generation."""


class OutputPathError(LocalspecError):
    """A path the user asked us to write cannot take the file (a FIFO, a device, a folder, no permission)."""


class StoreError(LocalspecError):
    """A drafting datastore is missing, corrupt, or built for another tokenizer."""


class RemoteDeviceError(LocalspecError):
    """A remote device (a ggml RPC server) cannot be reached, answers wrongly, or went away mid-reply."""
