"""The checks every front end shares for the options a user passes: the CLI's flags and the Python
API's keywords go through the same functions, so both refuse the same values with the same line.

Each failure is one ``InvalidOptionError`` whose ``param`` is the core's name for the option
(``n_ctx``, ``max_tokens``); the CLI renames it to its flag (``commands.flags.FLAGS``).
"""

from __future__ import annotations

import numbers

from localspec.errors import InvalidOptionError

MIN_CTX = 16
"""The smallest context a model is loaded with: a few tokens of prompt and of reply."""


def is_real(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def out_of_range(param: str, value: object, rule: str, advice: str) -> InvalidOptionError:
    """``param VALUE is out of range|is not a number|is not an integer: param must be RULE; ADVICE``
    (a value that is not a number is quoted as Python writes it: ``'4'`` is a string, not 4)."""
    problem = "is out of range" if is_real(value) else "is not a number"
    if rule.startswith("an integer") and is_real(value) and not is_int(value):
        problem = "is not an integer"
    shown = value if is_real(value) else repr(value)
    return InvalidOptionError(f"{param} {shown} {problem}: {param} must be {rule}; {advice}", param=param)


def check_load_options(*, n_ctx: object = None, n_threads: object = None, n_gpu_layers: object = None) -> None:
    """The context, threads and offload a model is loaded with (None: not given, the default).

    n_ctx an integer >= MIN_CTX; n_threads an integer >= 1; n_gpu_layers an integer >= -1 (-1: all).
    """
    checks = ((n_ctx, "n_ctx", MIN_CTX, f"is too small: use at least {MIN_CTX} tokens", "a token count such as 4096"),
              (n_threads, "n_threads", 1, "is out of range: use at least 1", "a number of threads, or None for all"),
              (n_gpu_layers, "n_gpu_layers", -1, "is out of range: use -1 (all layers), 0 (none) or a number of layers",
               "-1 (all layers), 0 (none) or a number of layers"))
    for value, param, low, too_low, want in checks:
        if value is None:
            continue
        if not is_int(value):
            raise InvalidOptionError(f"{param} {value!r} is not an integer: give {want}", param=param)
        if value < low:  # type: ignore[operator]
            raise InvalidOptionError(f"{param} {value} {too_low}", param=param)
