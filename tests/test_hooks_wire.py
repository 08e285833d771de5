"""The ``--server`` hook's POST on a plain socket (:mod:`otel_loopguard.hooks._wire`), against a
real listening socket that answers with scripted bytes: each way HTTP/1.1 frames an answer, the
limit, and answers that are not HTTP."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from otel_loopguard.hooks._wire import BadAnswer, post


class Scripted:
    """Accepts one connection, keeps the request, sends ``answer`` and closes."""

    def __init__(self, answer: bytes) -> None:
        self.answer = answer
        self.request = b""
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        connection, _ = self._listener.accept()
        with connection:
            connection.settimeout(5)
            while b"\r\n\r\n" not in self.request:
                self.request += connection.recv(65536)
            head, _, body = self.request.partition(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0])
            while len(body) < length:
                body += connection.recv(65536)
                self.request = head + b"\r\n\r\n" + body
            connection.sendall(self.answer)

    def close(self) -> None:
        self._thread.join(5)
        self._listener.close()


@pytest.fixture
def script() -> Iterator[list[Scripted]]:
    made: list[Scripted] = []
    yield made
    for server in made:
        server.close()


def ask(made: list[Scripted], answer: bytes, limit: int = 1000) -> tuple[int, bytes]:
    server = Scripted(answer)
    made.append(server)
    return post(
        "127.0.0.1",
        server.port,
        "/v1/decisions/before",
        b'{"a": 1}',
        {"Authorization": "Bearer t"},
        timeout=5,
        limit=limit,
    )


def test_the_request_is_one_post_with_its_body_and_headers(script: list[Scripted]) -> None:
    ask(script, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
    head, _, body = script[0].request.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /v1/decisions/before HTTP/1.1"
    assert f"Host: 127.0.0.1:{script[0].port}" in lines
    assert "Content-Length: 8" in lines and "Connection: close" in lines
    assert "Authorization: Bearer t" in lines
    assert body == b'{"a": 1}'


def test_content_length(script: list[Scripted]) -> None:
    answer = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
    assert ask(script, answer) == (200, b"{}")


def test_chunks(script: list[Scripted]) -> None:
    answer = b'HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n{"a\r\n4;x=y\r\n": 1\r\n1\r\n}\r\n0\r\n\r\n'
    assert ask(script, answer) == (201, b'{"a": 1}')


def test_to_the_connection_s_end(script: list[Scripted]) -> None:
    assert ask(script, b"HTTP/1.0 503 Busy\r\n\r\nretry later") == (503, b"retry later")


def test_an_interim_answer_is_skipped(script: list[Scripted]) -> None:
    answer = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"
    assert ask(script, answer) == (200, b"{}")


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n" + b"x" * 50,
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n32\r\n"
        + b"x" * 50
        + b"\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n\r\n" + b"x" * 50,
    ],
    ids=["length", "chunked", "to-end"],
)
def test_never_more_than_one_byte_past_the_limit(script: list[Scripted], answer: bytes) -> None:
    assert ask(script, answer, limit=10) == (200, b"x" * 11)


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        (b"", "the connection closed without an answer"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n{}", "the connection closed mid-answer"),
        (b"SSH-2.0-OpenSSH_9.6\r\n", "not an HTTP answer"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "bad Content-Length"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "bad chunk size"),
        (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "bad header line"),
    ],
    ids=["nothing", "short", "not-http", "bad-length", "bad-chunk", "bad-header"],
)
def test_what_is_not_an_http_answer(script: list[Scripted], answer: bytes, said: str) -> None:
    with pytest.raises(BadAnswer, match=said):
        ask(script, answer)


def test_no_server_is_a_refused_connection() -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
    with pytest.raises(ConnectionRefusedError):
        post("127.0.0.1", port, "/", b"", {}, timeout=5, limit=10)


def test_a_silent_server_is_a_timeout() -> None:
    with socket.create_server(("127.0.0.1", 0)) as silent, pytest.raises(TimeoutError):
        post("127.0.0.1", silent.getsockname()[1], "/", b"{}", {}, timeout=0.3, limit=10)
