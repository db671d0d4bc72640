"""The Python API's options checked as the command line checks its flags (issue 41): one validation
(``localspec.validation``), so a wrong type or value is one InvalidOptionError naming the parameter,
never Python's own TypeError, and what the CLI refuses the API refuses too. No model is read: every
check runs before a file is opened."""

from __future__ import annotations

import pytest

import localspec
from localspec import GenerateOptions, cli
from localspec.api import options
from localspec.commands.flags import FLAGS, flag_message, generate_options
from localspec.errors import InvalidOptionError


@pytest.mark.parametrize("kw,param", [
    ({"n_ctx": "4096"}, "n_ctx"), ({"n_ctx": 4096.0}, "n_ctx"), ({"n_ctx": True}, "n_ctx"), ({"n_ctx": 8}, "n_ctx"),
    ({"n_threads": 0}, "n_threads"), ({"n_threads": -2}, "n_threads"), ({"n_threads": "4"}, "n_threads"),
    ({"n_gpu_layers": "all"}, "n_gpu_layers"), ({"n_gpu_layers": -5}, "n_gpu_layers"),
    ({"offline": "yes"}, "offline"),
])
def test_load_refuses_wrong_types_and_values_before_any_file(kw: dict, param: str) -> None:
    with pytest.raises(InvalidOptionError) as caught:
        localspec.load("/nonexistent/model.gguf", **kw)  # the file is never looked at
    assert caught.value.param == param and str(caught.value).startswith(param + " "), str(caught.value)


@pytest.mark.parametrize("flag,value,param,api_value", [
    ("--ctx", "8", "n_ctx", 8), ("--threads", "0", "n_threads", 0), ("--threads", "-2", "n_threads", -2),
    ("--gpu-layers", "-5", "n_gpu_layers", -5),
])
def test_the_cli_and_the_api_refuse_the_same_values_in_the_same_words(flag: str, value: str, param: str,
                                                                      api_value: int, capsys) -> None:
    with pytest.raises(InvalidOptionError) as caught:
        localspec.load("/nonexistent/model.gguf", **{param: api_value})
    assert FLAGS[param] == flag
    assert cli.main(["generate", "-p", "hi", flag, value]) == 2
    assert capsys.readouterr().err == f"localspec: error: {flag_message(caught.value)}\n"


@pytest.mark.parametrize("kw,param", [
    ({"max_tokens": "4"}, "max_tokens"), ({"max_tokens": 0}, "max_tokens"), ({"max_tokens": 2.5}, "max_tokens"),
    ({"temperature": "0.7"}, "temperature"), ({"stop": 5}, "stop"), ({"stop": ["ok", 3]}, "stop"),
    ({"stop": [""]}, "stop"), ({"draft_len": "3"}, "draft_len"), ({"draft_len": 99}, "draft_len"),
    ({"p_min": "0.5"}, "p_min"), ({"speculative": "no"}, "speculative"), ({"seed": 1.5}, "seed"),
])
def test_generation_options_of_a_wrong_type_name_the_parameter(kw: dict, param: str) -> None:
    with pytest.raises(InvalidOptionError) as caught:
        options(**kw)
    assert caught.value.param == param, str(caught.value)
    assert "\n" not in str(caught.value)


def test_stop_none_is_no_stop_string_and_one_string_is_one() -> None:
    assert options(stop=None).stop == () and GenerateOptions(stop=None).stop == ()  # type: ignore[arg-type]
    assert options(stop="end").stop == ("end",) and options(stop=["a", "b"]).stop == ("a", "b")


def test_a_message_quotes_a_string_as_a_string() -> None:
    with pytest.raises(InvalidOptionError, match=r"^max_tokens '4' is not a number"):
        options(max_tokens="4")


def test_the_cli_and_the_api_ask_the_same_generation_by_default() -> None:
    """Given nothing, `localspec generate`, ``localspec.options()`` and ``GenerateOptions()`` ask for the same
    generation: the same sampling and stopping, and the draft length left to the adaptive controller
    (``draft_len`` None), not fixed by one front end."""
    from_cli = generate_options(cli.build_parser().parse_args(["generate", "-p", "hi"]))
    assert from_cli == options() == GenerateOptions()
    assert GenerateOptions().draft_len is None
