"""Lines a careless user met that were unclear or misleading (issue 41), each run as a user runs it: one
error line that says what is wrong and what to do, and never advice that would overwrite a model."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

from localspec import cli
from tests.support.cli import assert_clean_error, localspec, one_error_line


def test_a_folder_as_a_rest_store_is_called_a_folder(smollm2_path: Path, tmp_path: Path) -> None:
    proc = localspec("generate", str(smollm2_path), "-p", "hi", "--draft", f"rest:{tmp_path}")
    assert_clean_error(proc, str(tmp_path), "is a folder, not a store", f"localspec index {tmp_path}")
    assert "not found" not in proc.stderr


@pytest.mark.parametrize("command", [("generate", "{model}", "-p", "hi", "--draft", "rest:{model}"),
                                     ("index", "--verify", "{model}")])
def test_a_model_given_as_a_store_is_never_advised_to_be_overwritten(command: tuple[str, ...],
                                                                     smollm2_path: Path) -> None:
    """The advice was `localspec index ... -o MODEL.gguf`: rebuilding the store onto the model's own file."""
    proc = localspec(*(part.format(model=smollm2_path) for part in command))
    line = one_error_line(proc)
    assert "is a GGUF model, not a localspec store" in line and "localspec index" in line, line
    assert f"-o {smollm2_path}" not in line and "NOTES.lsstore" in line


def test_plan_takes_the_drafters_that_need_no_model(smollm2_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`plan --draft ngram` said "unknown model"."""
    assert cli.main(["plan", str(smollm2_path), "--draft", "ngram", "--json"]) == 0
    captured = capsys.readouterr()
    assert '"draft": null' in captured.out
    assert captured.err == ("localspec: --draft ngram: no draft model to place; the plan is the target's alone\n")
    assert cli.main(["plan", str(smollm2_path), "--draft", "ngrm"]) == 2
    assert "did you mean 'ngram'" in capsys.readouterr().err


def http_answering(listener: socket.socket) -> None:
    """What uvicorn (h11) does with bytes that are no HTTP request: a 400 at once, then it hangs up."""
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        with conn:
            conn.recv(1024)
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain\r\nconnection: close\r\n"
                         b"content-length: 11\r\n\r\nInvalid HTTP request received.")


def test_an_http_server_at_the_rpc_port_is_named_as_such(smollm2_path: Path) -> None:
    """It reported a handshake of 3543824036068086856 bytes (the first eight bytes of "HTTP/1.1")."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        threading.Thread(target=http_answering, args=(listener,), daemon=True).start()
        endpoint = f"127.0.0.1:{listener.getsockname()[1]}"
        proc = localspec("generate", str(smollm2_path), "-p", "hi", "--rpc", endpoint, "--gpu-layers", "10")
    line = one_error_line(proc)
    assert f"{endpoint} is no rpc-server: a web server (HTTP) answered" in line, line
    assert "bytes" not in line and "50052" in line


@pytest.mark.parametrize("args,needles", [
    (("--rpc", "[::1]:1"), ("--rpc '[::1]:1' is an IPv6 address", "IPv4")),
    (("--rpc", ""), ("--rpc is empty",)),
    (("--rpc", " "), ("--rpc is empty",)),
    (("--draft", ""), ("--draft is empty", "off")),
])
def test_empty_and_unusable_device_options_are_refused_not_ignored(args: tuple[str, ...], needles: tuple[str, ...],
                                                                   smollm2_path: Path) -> None:
    for command in (("generate", str(smollm2_path), "-p", "hi"), ("plan", str(smollm2_path))):
        assert_clean_error(localspec(*command, *args), *needles)


def test_several_vram_sizes_on_a_cpu_build_are_one_line(smollm2_path: Path) -> None:
    """It printed a warning that --vram does nothing, then an error about 0 GPUs."""
    from localspec.backend import gpu_offload_supported

    if gpu_offload_supported():
        pytest.skip("this llama.cpp build can offload to a GPU")
    proc = localspec("generate", str(smollm2_path), "-p", "hi", "--vram", "24GiB,24GiB")
    assert_clean_error(proc, "--vram 24GiB,24GiB gives one size per GPU", "CPU only", "leave --vram out")
    assert "warning" not in proc.stderr


@pytest.mark.parametrize("argv,help_of,hint", [
    (["generate", "-p", "hi", "--tmep", "0.5"], "localspec generate", "did you mean --temp?"),
    (["serve", "--qeue", "0"], "localspec serve", "did you mean --queue?"),
    (["index", "--verfy", "x"], "localspec index", "did you mean --verify?"),
    (["--bogus"], "localspec", ""),
])
def test_an_unknown_option_points_to_its_commands_help(argv: list[str], help_of: str, hint: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(argv)
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("localspec: error: unrecognized arguments: ")
    assert err.endswith(f"(see `{help_of} --help`)\n") and hint in err, err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib import metadata

    import localspec

    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == (f"localspec {localspec.__version__} "
                                       f"(llama-cpp-python {metadata.version('llama_cpp_python')})\n")
