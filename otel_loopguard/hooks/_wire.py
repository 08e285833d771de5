"""One HTTP/1.1 POST on a plain socket: the ``--server`` hook's request to serve's decision API.

A hook process makes one request and exits, so importing ``http.client`` (with ``email``, and
``ssl`` even for ``http://``) cost it more than the request itself. The request is simple: one
POST with a JSON body and ``Connection: close``; the answer is read to its ``Content-Length``,
or its chunks, or the connection's end, never more than the caller's limit. ``https://`` wraps
the socket with :mod:`ssl`'s default context (certificates and host name checked), imported
only then. Standard library only.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from typing import Final

__all__ = ["BadAnswer", "post"]

#: The answer's status line and headers are read up to this many bytes.
MAX_HEAD_BYTES: Final = 64 * 1024


class BadAnswer(ValueError):
    """The server's answer is not HTTP/1.x as this client reads it."""


def post(
    host: str,
    port: int,
    path: str,
    body: bytes,
    headers: Mapping[str, str],
    *,
    timeout: float,
    limit: int,
    tls: bool = False,
) -> tuple[int, bytes]:
    """POST ``body`` to ``path`` at ``host``:``port``; return the status and at most ``limit``
    + 1 bytes of the answer's body (one more than ``limit`` says it was larger). ``timeout``
    bounds the connection and each read. Raises ``OSError`` (``TimeoutError``,
    ``ConnectionRefusedError``, ...) and :class:`BadAnswer`."""
    shown = f"[{host}]" if ":" in host else host
    lines = [
        f"POST {path} HTTP/1.1",
        f"Host: {shown}:{port}",
        f"Content-Length: {len(body)}",
        "Connection: close",
        *(f"{name}: {value}" for name, value in headers.items()),
    ]
    request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
    with socket.create_connection((host, port), timeout=timeout) as plain:
        if tls:
            import ssl  # only https:// pays for it

            with ssl.create_default_context().wrap_socket(plain, server_hostname=host) as sock:
                return _exchange(sock, request, limit)
        return _exchange(plain, request, limit)


def _exchange(sock: socket.socket, request: bytes, limit: int) -> tuple[int, bytes]:
    sock.sendall(request)
    reader = _Reader(sock)
    status, fields = _head(reader)
    if fields.get("transfer-encoding", "").lower() == "chunked":
        return status, _chunks(reader, limit)
    length = fields.get("content-length")
    if length is not None:
        if not length.isdigit():
            raise BadAnswer(f"bad Content-Length {length[:40]!r}")
        return status, reader.take(min(int(length), limit + 1), exact=True)
    return status, reader.take(limit + 1, exact=False)  # to the connection's end


class _Reader:
    """Bytes from the socket, with what was read past the last request kept."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._held = bytearray()
        self._answered = False

    def _more(self) -> bool:
        data = self._sock.recv(65536)
        self._held += data
        self._answered = self._answered or bool(data)
        return bool(data)

    def _closed(self) -> BadAnswer:
        if self._answered:
            return BadAnswer("the connection closed mid-answer")
        return BadAnswer("the connection closed without an answer")

    def line(self, most: int) -> bytes:
        while True:
            end = self._held.find(b"\n")
            if end >= 0:
                found = bytes(self._held[: end + 1])
                del self._held[: end + 1]
                return found
            if len(self._held) > most:
                raise BadAnswer(f"a line longer than {most} bytes")
            if not self._more():
                raise self._closed()

    def take(self, count: int, *, exact: bool) -> bytes:
        while len(self._held) < count:
            if not self._more():
                if exact:
                    raise self._closed()
                break
        found = bytes(self._held[:count])
        del self._held[:count]
        return found


def _head(reader: _Reader) -> tuple[int, dict[str, str]]:
    while True:  # an interim answer (100 Continue) is skipped
        status_line = reader.line(MAX_HEAD_BYTES).decode("latin-1").rstrip("\r\n")
        version, _, rest = status_line.partition(" ")
        code = rest[:3]
        if not version.startswith("HTTP/1.") or not code.isdigit():
            raise BadAnswer(f"not an HTTP answer: {status_line[:60]!r}")
        fields: dict[str, str] = {}
        size = len(status_line)
        while True:
            line = reader.line(MAX_HEAD_BYTES).decode("latin-1").rstrip("\r\n")
            size += len(line)
            if size > MAX_HEAD_BYTES:
                raise BadAnswer(f"headers larger than {MAX_HEAD_BYTES} bytes")
            if not line:
                break
            name, colon, value = line.partition(":")
            if not colon:
                raise BadAnswer(f"a bad header line: {line[:60]!r}")
            fields[name.strip().lower()] = value.strip()
        if not 100 <= int(code) < 200:
            return int(code), fields


def _chunks(reader: _Reader, limit: int) -> bytes:
    body = bytearray()
    while len(body) <= limit:
        size_text = reader.line(1024).split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            raise BadAnswer(f"a bad chunk size {size_text[:20]!r}") from None
        if size < 0:
            raise BadAnswer(f"a bad chunk size {size_text[:20]!r}")
        if size == 0:
            break
        body += reader.take(min(size, limit + 1 - len(body)), exact=True)
        if len(body) > limit:
            break
        reader.take(2, exact=True)  # the chunk's CRLF
    return bytes(body[: limit + 1])
