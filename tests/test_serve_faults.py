"""`python -m engine serve` against slow and lying clients at the connection level (engine/serving/
command.py: `header_deadline_protocol`, the uvicorn protocol `serve` runs): a client that sends its
headers slowly or never finishes them is answered 408 and dropped once the header deadline passes,
one that sends nothing is closed, and neither holds a connection slot afterwards.

Each outcome is read from the socket (the server's answer, then its close), never from a timing:
the deadline is the server's clock, and the test only waits, with a bound on a hang, for the close.
"""

from __future__ import annotations

import json
import socket
from typing import Iterator

import httpx
import pytest
import torch

from engine import Engine
from engine.__main__ import main
from engine.cli import DEFAULT_MODEL
from engine.serving.app import create_app

from .test_serve import running

HANG_GUARD_S = 600  # a bound on a hang (the deadline is 0.5 s), not a speed


@pytest.fixture(scope="module")
def engine() -> Engine:
    torch.set_num_threads(1)
    return Engine(DEFAULT_MODEL)


@pytest.fixture(scope="module")
def strict(engine) -> Iterator[tuple[str, int]]:
    """A server with a 0.5 s header deadline and room for two connections: (host, port)."""
    with running(create_app(engine), header_seconds=0.5, max_connections=2) as url:
        yield httpx.URL(url).host, httpx.URL(url).port


def _until_closed(client: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    client.settimeout(HANG_GUARD_S)
    answer = b""
    while chunk := client.recv(4096):
        answer += chunk
    return answer


def _status_and_message(answer: bytes) -> tuple[str, str]:
    head, _, body = answer.partition(b"\r\n\r\n")
    return head.split(b"\r\n")[0].decode(), json.loads(body)["error"]["message"]


@pytest.mark.parametrize("sent", [b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le", b"G"], ids=["half-headers", "one-byte"])
def test_headers_that_never_finish_are_408_and_the_connection_dropped(strict, sent):
    with socket.create_connection(strict) as client:
        client.sendall(sent)
        status, message = _status_and_message(_until_closed(client))
    assert status == "HTTP/1.1 408 Request Timeout"
    assert message == "the request headers did not arrive within 0.5 s"


def test_a_connection_that_sends_nothing_is_closed_without_an_answer(strict):
    with socket.create_connection(strict) as client:
        assert _until_closed(client) == b""


def test_slow_headers_after_a_kept_alive_request_are_dropped_too(strict):
    """The deadline starts again at each response: the next request on the connection must come
    whole within it, whatever bytes trickle in (each would restart uvicorn's idle timer)."""
    with socket.create_connection(strict) as client:
        client.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        first = b""
        while b"tiny-llada" not in first:
            first += client.recv(4096)
        assert first.startswith(b"HTTP/1.1 200")
        client.sendall(b"GET /v1/mod")
        status, message = _status_and_message(_until_closed(client))
    assert status.startswith("HTTP/1.1 408") and "did not arrive within 0.5 s" in message


def test_dropped_slow_clients_hold_no_connection_slot(strict):
    """Two stalled connections fill the server's two slots; once both are dropped a request is
    answered (with them still open, uvicorn would answer it 503)."""
    stalled = [socket.create_connection(strict) for _ in range(2)]
    try:
        for client in stalled:
            client.sendall(b"GET /v1/models HTTP/1.1\r\nHo")
        for client in stalled:
            assert _status_and_message(_until_closed(client))[0].startswith("HTTP/1.1 408")
    finally:
        for client in stalled:
            client.close()
    host, port = strict
    reply = httpx.get(f"http://{host}:{port}/v1/models", timeout=HANG_GUARD_S)
    assert reply.status_code == 200, reply.text


def test_a_header_timeout_that_is_not_a_positive_number_is_one_line(capsys):
    for value in ("0", "-1", "nan", "inf"):
        assert main(["serve", "--header-timeout", value]) == 2
        err = capsys.readouterr().err
        assert "--header-timeout must be a positive number of seconds" in err and err.count("\n") == 1, err
