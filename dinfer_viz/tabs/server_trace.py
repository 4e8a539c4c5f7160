"""Open a trace from `python -m engine serve` by its id: every response of the server carries a trace
id (docs/serving.md, "Traces"), and the Run tab replays it as it replays a downloaded trace file.

A private app only: a public app fetches no address a visitor types (it would make the server a
proxy into its own network). The response is bounded in bytes and time; the server's own error
message is shown escaped.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import gradio as gr

from engine import EngineError

from ..drawing.cells import inert_markdown
from .common import error_text, guarded, outputs
from .run import RunHandlers

TRACE_ID = re.compile(r"trace-[0-9a-f]{16}")  # engine/serving/traces.py: TraceStore.new
TRACE_ID_EXAMPLE = "trace-0123456789abcdef"  # what the box shows empty and its refusal quotes
DEFAULT_SERVER = "http://127.0.0.1:8000"
MAX_TRACE_BYTES = 64 << 20  # the server's default trace store holds at most this much in all
TIMEOUT_SECONDS = 30


def trace_url(server: str, trace_id: str) -> str:
    """The trace's address on the server (`http://host:port`, with or without /v1); EngineError for
    anything but an http(s) address and an id of the server's form."""
    trace_id = trace_id.strip()
    if not TRACE_ID.fullmatch(trace_id):
        raise EngineError(f"{trace_id[:40]!r} is not a trace id (the server's look like {TRACE_ID_EXAMPLE})")
    parts = urllib.parse.urlsplit(server.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise EngineError(f"{server.strip()[:80]!r} is not a server address (like {DEFAULT_SERVER})")
    path = parts.path.rstrip("/").removesuffix("/v1")
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, f"{path}/v1/traces/{trace_id}", "", ""))


def fetch_trace(server: str, trace_id: str) -> str:
    """The trace's JSON text from the server; EngineError with the server's one-line reason."""
    url = trace_url(server, trace_id)
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_SECONDS) as reply:
            body = reply.read(MAX_TRACE_BYTES + 1)
    except urllib.error.HTTPError as exc:
        try:
            reason = json.loads(exc.read(4096))["error"]["message"]
        except (ValueError, KeyError, TypeError):
            reason = f"HTTP {exc.code}"
        raise EngineError(f"the server has no such trace: {reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise EngineError(f"cannot reach {server.strip()[:80]}: {getattr(exc, 'reason', exc)}") from None
    if len(body) > MAX_TRACE_BYTES:
        raise EngineError(f"the trace is over {MAX_TRACE_BYTES >> 20} MB; this app opens at most that")
    return body.decode("utf-8", errors="replace")


@guarded(lambda h: h.loaded_slots)
def open_server_trace(h: RunHandlers, server: str, trace_id: str) -> tuple:
    """The Run tab's view of the server's trace and the boxes it fills (RunHandlers.load_trace's
    `loaded_slots`), or its message."""
    if h.host.public:
        return outputs(h.loaded_slots, {"message": error_text("this public app opens no server traces (it fetches no address a visitor types)")})
    try:
        text = fetch_trace(server or "", trace_id or "")
    except EngineError as exc:
        return outputs(h.loaded_slots, {"message": error_text(inert_markdown(str(exc)))})
    return h.load_trace(h.write_file(trace_id.strip(), ".json", text), source="a server trace")


def add_box(parts: dict[str, Any]) -> None:
    """The server address, the trace id and the button, under the Run tab's trace buttons."""
    with gr.Accordion("Open a trace from python -m engine serve (by its id)", open=False, elem_id="server-trace-box"):
        with gr.Row():
            parts["trace_server"] = gr.Textbox(DEFAULT_SERVER, label="server", elem_id="trace-server", scale=2)
            parts["trace_id"] = gr.Textbox("", label="trace id (a response's trace_id)", placeholder=TRACE_ID_EXAMPLE, elem_id="trace-id", scale=2)
            parts["trace_open"] = gr.Button("Open", elem_id="trace-open", scale=0, min_width=80)


def wire(h: RunHandlers, parts: dict[str, Any], view: list[Any]) -> None:
    """`view`: the components of `h.loaded_slots`."""
    parts["trace_open"].click(
        lambda server, trace_id: open_server_trace(h, server, trace_id), [parts["trace_server"], parts["trace_id"]], view, api_name="load_server_trace"
    )
