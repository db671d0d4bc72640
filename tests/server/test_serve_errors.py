"""Every way a request can be wrong, against the real server: OpenAI's error shape, the right status,
the field named, and never a traceback in a response or on the server's console."""

from __future__ import annotations

import socket
import time

import openai
import pytest
from served import Answer, Served

pytestmark = pytest.mark.timeout(180)

HELLO = [{"role": "user", "content": "Hi"}]


def assert_error(answer: Answer, status: int, *, param: str | None = None, code: str | None = None) -> str:
    """The answer is OpenAI's error shape with ``status``; its message."""
    assert answer.status == status, answer.body
    assert answer.headers["content-type"].startswith("application/json")
    error = answer.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param and (code is None or error["code"] == code), error
    assert error["message"] and "Traceback" not in error["message"]
    return error["message"]


def chat(server: Served, **fields: object) -> Answer:
    return server.request("POST", "/v1/chat/completions", {"messages": HELLO, "max_tokens": 2, **fields})


def test_malformed_json(server: Served) -> None:
    for body in (b'{"messages": [', b"\xff\xfe not json", b'{"messages": [], "temperature": NaN}', b""):
        assert_error(server.request("POST", "/v1/chat/completions", body), 400, code="invalid_json")


def test_wrong_types_and_ranges_name_the_field(server: Served) -> None:
    assert_error(chat(server, temperature="hot"), 400, param="temperature", code="invalid_type")
    assert_error(chat(server, max_tokens=-1), 400, param="max_tokens", code="invalid_value")
    assert_error(server.request("POST", "/v1/completions", {"prompt": {"text": "x"}}), 400, param="prompt")
    assert_error(server.request("POST", "/v1/chat/completions", [1, 2]), 400, code="invalid_type")


@pytest.mark.parametrize("fields,param,needle", [
    ({"n": 2}, "n", "not supported"),
    # SmolLM2's template renders no tools: offering them is refused, naming the model, whatever the choice.
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools", "chat template has no tool format"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required"}, "tools",
     "chat template has no tool format"),
])
def test_the_official_client_hears_what_is_refused(server: Served, fields: dict, param: str, needle: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        server.client().chat.completions.create(model=server.model_id, messages=HELLO, max_tokens=2,  # type: ignore
                                                **fields)
    assert caught.value.status_code == 400 and caught.value.param == param
    assert needle in caught.value.message, caught.value.message
    if param == "tools":
        assert f'model "{server.model_id}"' in caught.value.message  # the model is named as it is served


def test_an_unknown_model_is_404_and_names_the_served_one(server: Served) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        server.client().chat.completions.create(model="gpt-4o", messages=HELLO, max_tokens=2)  # type: ignore
    assert caught.value.param == "model" and server.model_id in caught.value.message
    assert_error(server.request("GET", "/v1/models/gpt-4o"), 404, param="model", code="model_not_found")


def test_a_prompt_over_the_context_says_the_numbers(server: Served) -> None:
    message = assert_error(server.request("POST", "/v1/completions", {"prompt": "word " * 1100, "max_tokens": 2}),
                           400, param="prompt", code="context_length_exceeded")
    assert "1024" in message and "tokens" in message
    long_chat = [{"role": "user", "content": "word " * 1100}]
    assert_error(server.request("POST", "/v1/chat/completions", {"messages": long_chat}), 400, param="messages",
                 code="context_length_exceeded")


def raw(server: Served, head: bytes, body: bytes = b"", timeout: float = 30) -> bytes:
    """Bytes on a socket as a client sends them, and the server's answer (status line and headers)."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=timeout) as sock:
        sock.sendall(head + body)
        answer = b""
        while b"\r\n\r\n" not in answer:
            piece = sock.recv(65536)
            if not piece:
                break
            answer += piece
        return answer


def test_a_body_over_the_limit_is_413(server: Served) -> None:
    auth = f"Authorization: Bearer {server.api_key}\r\n".encode()
    # Declared too large: refused before a byte of it is read.
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + auth
            + b"Content-Length: 50000000\r\n\r\n")
    assert raw(server, head, b'{"messages": ').startswith(b"HTTP/1.1 413")
    # Sent in chunks without a length: refused once the bytes read pass the limit.
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + auth
            + b"Transfer-Encoding: chunked\r\n\r\n")
    piece = b"x" * (1 << 20)
    chunk = f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
    assert raw(server, head, chunk * 5 + b"0\r\n\r\n").startswith(b"HTTP/1.1 413")


def test_the_api_key_is_required(server: Served) -> None:
    for key in (None, "sk-wrong"):
        answer = server.request("POST", "/v1/chat/completions", {"messages": HELLO}, key=key)
        assert_error(answer, 401, code="invalid_api_key")
        assert answer.headers["www-authenticate"] == "Bearer"
        assert server.request("GET", "/metrics", key=key).status == 401
        assert server.request("GET", "/v1/models", key=key).status == 401
    with pytest.raises(openai.AuthenticationError):
        server.client(api_key="sk-wrong").models.list()


def test_the_key_scheme_is_case_insensitive_and_spaces_are_allowed(server: Served) -> None:
    """RFC 7235: the scheme is case-insensitive, and clients (curl scripts) send extra spaces."""
    for header in (f"bearer {server.api_key}", f"BEARER {server.api_key}", f"Bearer  {server.api_key}",
                   f"Bearer {server.api_key} ", f"Bearer\t{server.api_key}"):
        assert server.request("GET", "/v1/models", key=None, headers={"Authorization": header}).status == 200, header
    for header in (f"Basic {server.api_key}", f"Bearer{server.api_key}", server.api_key or "", "Bearer",
                   f"Bearer {server.api_key}x", f"Bearer x{server.api_key}"):
        assert server.request("GET", "/v1/models", key=None, headers={"Authorization": header}).status == 401, header


def test_unknown_routes_and_methods(server: Served) -> None:
    assert_error(server.request("GET", "/v1/chat/completions"), 405, code="method_not_allowed")
    assert_error(server.request("POST", "/v1/embeddings", {"input": "x"}), 404, code="not_found")
    # A path that looks like a file is a route like any other: nothing is read from disk.
    assert_error(server.request("GET", "/../../etc/passwd"), 404, code="not_found")


def test_a_trailing_slash_is_the_same_route(server: Served) -> None:
    """Issue 41: POST /v1/chat/completions/ got a bare 307 (a redirect not every client follows with its body)."""
    answer = server.request("POST", "/v1/chat/completions/", {"messages": HELLO, "max_tokens": 2})
    assert answer.status == 200 and answer.json()["object"] == "chat.completion", answer.body
    assert server.request("GET", "/v1/models/").json()["data"][0]["id"] == server.model_id
    assert_error(server.request("POST", "/v1/embeddings/", {"input": "x"}), 404, code="not_found")
    assert_error(server.request("GET", "/v1/chat/completions/"), 405, code="method_not_allowed")


def test_a_client_that_hangs_up_is_counted_apart(server: Served) -> None:
    """Issue 41: a client that hung up was counted as a 503 (waiting for a whole reply) or a 400 (sending
    its body); it is neither the server's refusal nor the client's mistake."""
    from served import metric, wait_until

    endpoint = "/v1/chat/completions"
    before = {code: metric(server, "llamacpp:requests_total", endpoint=endpoint, code=code)
              for code in ("400", "499", "503")}
    # The reply must still be running when its client leaves: SmolLM2's <|im_end|> (2) and <|endoftext|> (0)
    # are banned, so it runs to max_tokens (seconds), where its own short answer took 0.7 s on a quiet CPU.
    body = ('{"messages": [{"role": "user", "content": "Count to a thousand."}], "max_tokens": 900, '
            '"temperature": 0, "logit_bias": {"0": -100, "2": -100}}').encode()
    head = (f"POST {endpoint} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {server.api_key}\r\n").encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:  # waits for a whole reply
        sock.sendall(head + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        time.sleep(1.0)
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:  # leaves mid-body
        sock.sendall(head + f"Content-Length: {len(body)}\r\n\r\n".encode() + body[:10])
        time.sleep(0.5)
    posts = lambda: "".join(line for line in server.lines if "GET /metrics" not in line)[-3000:]  # noqa: E731
    assert wait_until(lambda: metric(server, "llamacpp:requests_total", endpoint=endpoint, code="499")
                      == before["499"] + 2), posts()
    for code in ("400", "503"):
        assert metric(server, "llamacpp:requests_total", endpoint=endpoint, code=code) == before[code], posts()
    assert f"POST {endpoint} 499" in server.stderr()


def test_no_traceback_reached_the_console(server: Served) -> None:
    assert "Traceback" not in server.stderr()
    assert all(line.startswith("localspec: ") for line in server.stderr().splitlines() if line.strip())
