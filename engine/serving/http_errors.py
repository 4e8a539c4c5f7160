"""The server's refusals: an `HTTPError` the routes raise, and OpenAI's error shape they answer
with (a body, a response, an event of a stream)."""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse

RETRY_AFTER_SECONDS = 1  # what a 503 (busy, or shutting down) tells a client to wait
SHUTTING_DOWN = "the server is shutting down"


class HTTPError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


def error_body(message: str, kind: str = "invalid_request_error") -> dict[str, Any]:
    """OpenAI's error shape, the message on one line and encodable (a request's lone surrogate,
    quoted back in its message, is written as its escape)."""
    safe = " ".join(message.split()).encode("utf-8", "backslashreplace").decode("utf-8")
    return {"error": {"message": safe, "type": kind, "param": None, "code": None}}


def error_response(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    """`error_body` as a response; a 503 says when to retry."""
    headers = {"Retry-After": str(RETRY_AFTER_SECONDS)} if status == 503 else None
    return JSONResponse(error_body(message, kind), status_code=status, headers=headers)
