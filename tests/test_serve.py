"""`python -m engine serve`'s app (engine/serving/) on a real uvicorn server on a free loopback port,
the embedded model on the CPU, driven by the `openai` client package and raw HTTP (httpx).

Concurrency is decided by the engine's own state, never by timing: the test holds the batcher's
lock (the engine busy) while the clients' requests arrive, and lets it go once the batcher counts
them all waiting (`all_queued`; the server runs continuous batching, `lockstep` the other); a disconnect is held mid-run by the turnstile decoder's gate files
(tests/turnstile_decoder.py) and observed through the trace store's status.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterator

import httpx
import openai
import pytest
import torch
import uvicorn

from benchmarks.serve import children as _children
from engine import Engine, GenerationConfig, Trace
from engine.cli import DEFAULT_MODEL
from engine.hooks import RunHooks
from engine.serving.app import Server, create_app
from engine.serving.command import server_config
from engine.serving.limits import RequestLimits
from engine.serving.scheduler import ContinuousBatcher
from engine.serving.streaming import RowText
from engine.serving.traces import TraceStore
from engine.trace import EDIT, IterationRecord, Revision

from .conftest import assert_processes_end

# 16 prompts of several lengths and families (each length's prompts batch together)
PROMPTS = [
    "Q: 14+5=? A:", "Q: 7-65=? A:", "Q: ?+?=57 A:", "Q: ?+?=12 A:", "Q: 123+45=? A:", "Q: 300-12=? A:",
    "Q: 9+9=? A:", "Q: ?+?=83 A:", "Q: rhymes with cat? A:", "Q: rhymes with dog? A:", "Q: 52+48=? A:",
    "Q: 61-7=? A:", "Q: ?+?=140 A:", "Q: 5-5=? A:", "Q: 999+1=? A:", "Q: 40-99=? A:",
]
SETTINGS = {"gen_length": 32, "block_length": 8, "threshold": 0.9}
CONFIG = GenerationConfig(**SETTINGS, use_chat_template=False)  # a completion's prompt is raw text
LIMITS = RequestLimits(max_prompt_chars=200, max_gen_length=64, max_body_bytes=4096, max_prompts=4)


def until(predicate: Callable[[], bool]) -> None:
    """Wait for a state the server reaches by itself (a hang guard, not a timing)."""
    deadline = time.monotonic() + 600
    while not predicate():
        assert time.monotonic() < deadline, "the server never reached the state"
        time.sleep(0.01)


class Served:
    def __init__(self, engine: Engine, app_server: Server, url: str) -> None:
        self.engine, self.server, self.url = engine, app_server, url
        self.client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=600)
        self.http = httpx.Client(base_url=url, timeout=600)


@contextlib.contextmanager
def running(app, **config: float) -> Iterator[str]:
    """`app` on uvicorn in a thread on a free loopback port, configured as `serve` runs it
    (`server_config`, `config` its keywords); yields its /v1 address."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)  # listening before uvicorn starts: clients connect at once and wait in the backlog
    server = uvicorn.Server(server_config(app, **config))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    server.should_exit = True
    thread.join(timeout=600)
    sock.close()


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    torch.set_num_threads(1)
    engine = Engine(DEFAULT_MODEL)
    app = create_app(engine, LIMITS, max_batch=16, max_pending=32, traces=TraceStore(max_traces=64))
    with running(app) as url:
        yield Served(engine, app.state.server, url)


def solo(engine: Engine, prompt: str, config: GenerationConfig = CONFIG):
    return engine.generate(prompt, config, hooks=RunHooks(trace=True))


def complete(served: Served, prompt: str, stream: bool, **extra: object) -> tuple[str, dict]:
    """(text, the last choice's extras and the usage) through the openai client."""
    body = {**SETTINGS, **extra}
    if not stream:
        out = served.client.completions.create(model=served.engine.name, prompt=prompt, max_tokens=32, extra_body=body)
        choice = out.choices[0]
        return choice.text, {**choice.model_extra, "finish_reason": choice.finish_reason, "usage": out.usage.model_dump()}
    text, last = "", {}
    chunks = served.client.completions.create(
        model=served.engine.name, prompt=prompt, max_tokens=32, stream=True, stream_options={"include_usage": True}, extra_body=body
    )
    for chunk in chunks:
        for choice in chunk.choices:
            text += choice.text
            last.update({k: v for k, v in {**choice.model_extra, "finish_reason": choice.finish_reason}.items() if v is not None})
        if chunk.usage is not None:
            last["usage"] = chunk.usage.model_dump()
    return text, last


def test_models_and_one_completion_equal_the_engine(served):
    assert [m.id for m in served.client.models.list().data] == [served.engine.name]
    alone = solo(served.engine, PROMPTS[0])
    for stream in (False, True):
        text, extra = complete(served, PROMPTS[0], stream)
        assert text == alone.text
        usage = extra["usage"]
        assert usage["prompt_tokens"] == len(served.engine.encode(PROMPTS[0], False))
        assert usage["completion_tokens"] == len(alone.output.token_ids[0])
        assert usage["forwards"] == alone.output.stats.nfe
        assert extra["finish_reason"] == "stop" and extra["batch"] == 1


@pytest.fixture(scope="module")
def lockstep(served: Served) -> Iterator[Served]:
    """The same engine behind the lockstep batcher (`serve --batching lockstep`)."""
    app = create_app(served.engine, LIMITS, max_batch=16, max_pending=32, traces=TraceStore(max_traces=64), batching="lockstep")
    with running(app) as url:
        yield Served(served.engine, app.state.server, url)


def all_queued(server: Server, rows: int) -> bool:
    """Every one of `rows` rows has reached the batcher: waiting for the lockstep one, waiting on a
    forward for the continuous one (engine/serving/scheduler.py)."""
    batcher = server.batcher
    if isinstance(batcher, ContinuousBatcher):
        return batcher.running == rows and batcher.scheduler.rows_at_forward == rows
    return batcher.waiting == rows


@pytest.mark.parametrize("batching", ["continuous", "lockstep"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_sixteen_concurrent_clients_get_their_solo_tokens(request, batching, stream):
    served = request.getfixturevalue("served" if batching == "continuous" else "lockstep")
    alone = {p: solo(served.engine, p) for p in PROMPTS}
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        with served.server.batcher.lock:  # the engine is busy while the 16 requests arrive
            futures = [pool.submit(complete, served, p, stream) for p in PROMPTS]
            until(lambda: all_queued(served.server, len(PROMPTS)))
        results = [f.result() for f in futures]
    lengths = [len(served.engine.encode(p, False)) for p in PROMPTS]
    for prompt, length, (text, extra) in zip(PROMPTS, lengths, results):
        assert text == alone[prompt].text, prompt
        assert extra["usage"]["forwards"] == alone[prompt].output.stats.nfe, prompt
        if batching == "lockstep":  # the batch is every waiting request whose prompt encodes to this one's length
            assert extra["batch"] == lengths.count(length), prompt
        else:  # the first row's first forward ran alone (the others were still arriving), the next took all 16
            assert extra["batch"] == len(PROMPTS), prompt
    assert max(extra["batch"] for _, extra in results) >= 4  # they really were batched
    assert served.server.pending == 0


@pytest.mark.parametrize("batching", ["continuous", "lockstep"])
def test_a_request_is_validated_once_when_parsed_and_once_when_fitted_never_per_row(request, batching, monkeypatch):
    """The server fits the config to the model once (its checks before any forward) and its rows
    run that config as it is (`BatchRequest.fitted`): four rows, two validations in all (it was
    one plus two per row)."""
    served = request.getfixturevalue("served" if batching == "continuous" else "lockstep")
    alone = [solo(served.engine, p).text for p in PROMPTS[:4]]
    calls = []
    validate = GenerationConfig.validate
    monkeypatch.setattr(GenerationConfig, "validate", lambda self: (calls.append(self), validate(self))[1])
    out = served.client.completions.create(model=served.engine.name, prompt=PROMPTS[:4], max_tokens=32, extra_body=SETTINGS)
    assert [c.text for c in out.choices] == alone
    assert len(calls) == 2


def test_chat_completion_streamed_and_not(served):
    message = [{"role": "user", "content": PROMPTS[2]}]
    # the embedded model has no chat template: the message is the prompt as it is
    alone = solo(served.engine, PROMPTS[2], CONFIG.replace(use_chat_template=True))
    out = served.client.chat.completions.create(model=served.engine.name, messages=message, max_tokens=32, extra_body=SETTINGS)
    assert out.choices[0].message.content == alone.text and out.choices[0].message.role == "assistant"
    chunks = list(served.client.chat.completions.create(model=served.engine.name, messages=message, max_tokens=32, stream=True, extra_body=SETTINGS))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == alone.text
    several = served.http.post("/chat/completions", json={"messages": message * 2, **SETTINGS})
    assert several.status_code == 400 and "chat template" in several.json()["error"]["message"]


def test_stop_strings_and_max_tokens_cut_the_text_alike_streamed_or_not(served):
    alone = solo(served.engine, PROMPTS[4]).text  # '  123+  45=  168'-like: it holds '='
    assert "=" in alone
    for stream in (False, True):
        text, extra = complete(served, PROMPTS[4], stream, stop=["="])
        assert text == alone[: alone.index("=")] and extra["finish_reason"] == "stop"
    short = served.client.completions.create(model=served.engine.name, prompt=PROMPTS[4], max_tokens=3, extra_body={"block_length": 8})
    ids = solo(served.engine, PROMPTS[4], GenerationConfig(gen_length=8, block_length=8, use_chat_template=False)).output.token_ids[0]
    assert short.choices[0].text == served.engine.decode(ids[:3]) and short.usage.completion_tokens == 3
    assert short.choices[0].finish_reason == "length"


def test_the_trace_of_a_response_is_served_by_id(served):
    out = served.client.completions.create(model=served.engine.name, prompt=PROMPTS[1], max_tokens=32, extra_body=SETTINGS)
    trace_id = out.choices[0].model_extra["trace_id"]
    reply = served.http.get(f"/traces/{trace_id}")
    assert reply.status_code == 200
    trace, alone = Trace.from_dict(reply.json()), solo(served.engine, PROMPTS[1]).output.trace
    assert [(r.block, r.committed, r.top1) for r in trace.iterations] == [(r.block, r.committed, r.top1) for r in alone.iterations]
    assert trace.final == alone.final
    missing = served.http.get("/traces/trace-0000")
    assert missing.status_code == 404 and "\n" not in missing.json()["error"]["message"]


def test_a_client_that_disconnects_mid_stream_frees_its_slot(served, gate_decoders, tmp_path):
    """The run waits at the turnstile's first gate; the client reads its first chunk (the run has
    started) and leaves; once the server has marked the row cancelled, every gate opens: the engine
    stops at its next cancel check (the row never completes: no trace), the row's slot is free, and
    the next request gets its solo text."""
    body = {"prompt": PROMPTS[0], "decoder": "turnstile", "decoder_options": {"gates": str(tmp_path)}, "gen_length": 16, "block_length": 16, "stream": True}
    with served.http.stream("POST", "/completions", json=body) as reply:
        assert reply.status_code == 200
        first = json.loads(next(reply.iter_lines()).removeprefix("data: "))
        trace_id = first["choices"][0]["trace_id"]
    until(lambda: served.http.get(f"/traces/{trace_id}").status_code == 410)  # the server saw it leave
    for gate in range(1, 17):
        Path(tmp_path, str(gate)).touch()
    text, _ = complete(served, PROMPTS[3], stream=False)  # waits for the engine: the cancelled run ended
    assert text == solo(served.engine, PROMPTS[3]).text
    until(lambda: served.server.pending == 0)
    gone = served.http.get(f"/traces/{trace_id}")
    assert gone.status_code == 410 and "cancelled" in gone.json()["error"]["message"]


@pytest.mark.parametrize(
    "body, status, fragment",
    [
        ({"prompt": "Q: 1+1=? A:", "threshold": 2}, 400, "threshold must be in (0, 1]"),
        ({"prompt": "Q: 1+1=? A:", "decoder": "nope"}, 400, "unknown decoder 'nope'"),
        ({"prompt": "Q: 1+1=? A:", "gen_length": 30, "block_length": 8}, 400, "multiple of block_length"),
        ({"prompt": "Q: 1+1=? A:", "cache": "everything"}, 400, "unknown cache mode"),
        ({"prompt": "Q: 1+1=? A:", "colour": "red"}, 400, "unknown field(s): colour"),
        ({"prompt": "Q: 1+1=? A:", "n": 2}, 400, "n=2 is not supported"),
        ({"prompt": "Q: 1+1=? A:", "logprobs": 1}, 400, "logprobs=1 is not supported"),
        ({"prompt": "Q: 1+1=? A:", "stream": "yes"}, 400, "stream must be true or false"),
        ({"prompt": "Q: 1+1=? A:", "max_tokens": 0}, 400, "max_tokens must be a positive integer"),
        ({"prompt": [1, 2, 3]}, 400, "prompt must be a string"),
        ({"prompt": "   "}, 400, "empty prompt"),
        ({"prompt": "Q: 1+1=? A:", "model": "gpt-4"}, 404, "is not served here"),
        ({"prompt": "Q: 1+1=? A:", "temperature": -1}, 400, "temperature must be >= 0"),
        ({"prompt": "x" * 201}, 413, "at most 200"),
        ({"prompt": "Q: 1+1=? A:", "gen_length": 128}, 413, "above this server's limit of 64"),
        ({"prompt": ["Q: 1+1=? A:"] * 5}, 400, "at most 4 prompts"),
        ({"prompt": "Q: 1+1=? A:", "gen_length": 64, "block_length": 64, "stop": ["x"] * 17}, 400, "stop takes at most"),
    ],
)
def test_bad_or_oversize_requests_get_one_line_4xx(served, body, status, fragment):
    reply = served.http.post("/completions", json=body)
    assert reply.status_code == status, reply.text
    message = reply.json()["error"]["message"]
    assert fragment in message and "\n" not in message
    assert served.server.pending == 0


def test_an_oversize_or_broken_body_is_refused_before_parsing(served):
    big = served.http.post("/completions", content=b"{" + b" " * 5000 + b"}", headers={"content-type": "application/json"})
    assert big.status_code == 413 and "at most 4096" in big.json()["error"]["message"]
    broken = served.http.post("/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert broken.status_code == 400 and "not JSON" in broken.json()["error"]["message"]
    with pytest.raises(openai.BadRequestError, match="unknown decoder"):
        served.client.completions.create(model=served.engine.name, prompt="Q: 1+1=? A:", extra_body={"decoder": "nope"})


@pytest.mark.parametrize(
    "body, status, fragment",
    [
        (b'{"prompt": "hi", "\\ud800": 1}', 400, "unknown field(s): \\ud800"),
        (b'{"prompt": "hi", "decoder": "\\udfff"}', 400, "unknown decoder '\\udfff'"),
        (b'{"prompt": "hi", "model": "\\ud800"}', 404, "is not served here"),
        (b'{"prompt": "Q: \\ud800 A:"}', 400, "a lone surrogate"),
        (b'{"prompt": "hi", "seed": 1' + b"0" * 5000 + b"}", 400, "Exceeds the limit (4300 digits)"),
        (b"[" * 4000, 400, "maximum recursion depth"),
        (b'{"prompt": "hi", "max_tokens": 1' + b"0" * 400 + b"}", 413, "above this server's limit"),
        (b'{"prompt": "hi", "max_tokens": -1}', 400, "max_tokens must be a positive integer"),
        (b'{"prompt": "hi", "threshold": NaN}', 400, "threshold must be a finite number"),
        (b'{"prompt": "hi", "decoder": "uniform"}', 400, "this model is masked diffusion"),
        (b'{"prompt": "hi", "decoder": "edit", "decoder_options": {"max_post_edit_steps": -1}}', 400, "max_post_edit_steps must be in [0, 256]"),
        (b'{"prompt": "hi", "cache": "vicinity", "warmup": 1000000000}', 400, "warmup must be at most"),
        (b'{"prompt": "hi", "stream": true, "unroll": true, "max_unroll": 1e300}', 400, "max_unroll must be an integer"),
    ],
    ids=lambda value: repr(value)[:40] if isinstance(value, bytes) else None,
)
def test_bodies_that_python_cannot_take_get_one_line_4xx_never_500(served, body, status, fragment):
    """What the JSON parser, Python's numbers and strings or the tokenizer reject is the client's
    input: a 4xx in OpenAI's shape (a lone surrogate quoted back as its escape), never a 500.
    (The server's default body limit, 1 MiB: a 5000-digit number fits.)"""
    from fastapi.testclient import TestClient

    app = create_app(served.engine, RequestLimits(max_gen_length=64))
    reply = TestClient(app).post("/v1/completions", content=body, headers={"content-type": "application/json"})
    assert reply.status_code == status, reply.text
    message = reply.json()["error"]["message"]
    assert fragment in message and "\n" not in message, message
    assert app.state.server.pending == 0


def test_a_body_that_never_arrives_is_408_and_holds_nothing(served):
    """A client that sends fewer bytes than its Content-Length says: the server answers 408 once
    the body's time is up (the server's clock, whatever the machine's speed), not at its whole timeout."""
    app = create_app(served.engine, RequestLimits(body_seconds=0.5))
    with running(app) as url:
        with socket.create_connection((httpx.URL(url).host, httpx.URL(url).port)) as client:
            client.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"prompt\"")
            answer = b""
            while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
                chunk = client.recv(4096)
                if not chunk:
                    break
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 408"), answer
        assert b"did not arrive within 0.5 s" in answer
        assert app.state.server.pending == 0


def test_a_stop_ends_a_stream_with_an_error_event_and_answers_new_requests_503_with_retry_after(served, gate_decoders, tmp_path):
    """SIGINT/SIGTERM call `Server.stop` (engine/serving/command.py): the run held at the
    turnstile's first gate is cancelled; once the gates open it ends at its next cancel check and
    its stream ends with an error event and [DONE]; a request meanwhile is refused with Retry-After."""
    app = create_app(served.engine, LIMITS)
    with running(app) as url, httpx.Client(base_url=url, timeout=600) as http:
        body = {"prompt": PROMPTS[0], "decoder": "turnstile", "decoder_options": {"gates": str(tmp_path)}, "gen_length": 16, "block_length": 16, "stream": True}
        with http.stream("POST", "/completions", json=body) as reply:
            lines = reply.iter_lines()
            assert json.loads(next(lines).removeprefix("data: "))["choices"][0]["trace_id"]  # the run has started
            app.state.server.stop()
            refused = http.post("/completions", json={"prompt": PROMPTS[1], **SETTINGS})
            assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
            assert "shutting down" in refused.json()["error"]["message"]
            for gate in range(1, 17):
                Path(tmp_path, str(gate)).touch()
            rest = [line for line in lines if line]
        assert json.loads(rest[-2].removeprefix("data: "))["error"]["message"] == "the server is shutting down"
        assert rest[-1] == "data: [DONE]"
        until(lambda: app.state.server.pending == 0)


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port)).close()
    except ConnectionRefusedError:
        return True
    return False


def test_sigint_to_the_server_ends_its_stream_with_an_error_event_and_leaves_no_process(tmp_path):
    """`python -m engine serve --tp 2` (two worker processes) gets SIGINT while a stream is held at
    the turnstile's first gate: the stream ends with the shutdown's error event and [DONE] once the
    gates open, the server exits 0, and neither worker outlives it. The time from the signal to the
    exit is printed (benchmarks/RESULTS.md), never asserted."""
    import os
    import signal
    import subprocess
    import sys

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "DINFER_VIZ_DECODERS": str(Path(__file__).with_name("turnstile_decoder.py"))}
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.Popen([sys.executable, "-m", "engine", "serve", "--port", str(port), "--tp", "2"], cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert "serving" in proc.stdout.readline(), proc.stderr.read()[-2000:]
        workers = _children(proc.pid)
        assert len(workers) >= 2, workers
        body = {"prompt": PROMPTS[0], "decoder": "turnstile", "decoder_options": {"gates": str(tmp_path)}, "gen_length": 16, "block_length": 16, "stream": True}
        with httpx.Client(base_url=f"http://127.0.0.1:{port}/v1", timeout=600) as http, http.stream("POST", "/completions", json=body) as reply:
            lines = reply.iter_lines()
            assert json.loads(next(lines).removeprefix("data: "))["choices"][0]["trace_id"]
            signalled = time.monotonic()
            proc.send_signal(signal.SIGINT)
            until(lambda: _refused(port))  # the server has handled the signal: it stopped listening (its stop() ran first)
            for gate in range(1, 17):
                Path(tmp_path, str(gate)).touch()
            rest = [line for line in lines if line]
        assert json.loads(rest[-2].removeprefix("data: "))["error"]["message"] == "the server is shutting down"
        assert rest[-1] == "data: [DONE]"
        assert proc.wait(timeout=600) == 0, proc.stderr.read()[-2000:]
        print(f"SIGINT to exit: {time.monotonic() - signalled:.2f} s")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert_processes_end(workers, 600, "the server")


def test_the_trace_store_is_bounded_and_prunes_the_oldest():
    store = TraceStore(max_traces=2, max_bytes=10_000)
    ids = [store.new() for _ in range(3)]
    assert store.get(ids[0]) is None and store.get(ids[2]).status == "running" and len(store) == 2
    trace = Trace(model="m", initial=[[1, 2]], prompt_lengths=[1])
    store.done(ids[1], trace)
    assert store.get(ids[1]).json == trace.to_json() and store.bytes == len(trace.to_json())
    tight = TraceStore(max_traces=8, max_bytes=len(trace.to_json()) + 1)
    first, second = tight.new(), tight.new()
    tight.done(first, trace)
    tight.done(second, trace)  # over the byte budget: the oldest goes
    assert tight.get(first) is None and tight.get(second).status == "done"


def test_a_stream_sends_a_revised_block_only_once_the_loop_has_left_it():
    """Records written by hand in the trace's own schema (engine/trace.py: Revision), each with the
    `final_until` the loop gives (engine/kinds/masked.py): a committed token edited later in its
    block must never have been sent; a decoder that never revises streams each commit at once."""
    vocab = {10: "a", 11: "b", 12: "c", 13: "X"}
    decode = lambda ids: "".join(vocab[i] for i in ids)  # noqa: E731
    header = Trace(mask_id=1, eos_ids=[0], prompt_lengths=[1], initial=[[5, 1, 1, 1, 1]], config={})

    def rec(block: int, rng: list[int], committed: list[int], top1: list[int], revisions: list | None, final_until: int) -> IterationRecord:
        return IterationRecord(
            block, block, rng, "full", [], 0.9, [committed], [[]], [top1], [[1.0] * len(top1)], 0.0, revisions=revisions, active=[True], final_until=[final_until]
        )

    edit = Revision(position=1, old=13, new=10, kind=EDIT, rule="p(new) > edit threshold", score=0.9, bound=0.5).to_dict()
    revising = RowText(header, decode, max_tokens=8, stops=[])
    assert revising.update(rec(0, [1, 3], [1, 2], [13, 11], [[]], 1)) == ""  # block 0 still open: 'Xb' may change
    assert revising.update(rec(0, [1, 3], [], [10, 11], [[edit]], 1)) == ""
    assert revising.update(rec(1, [3, 5], [3], [12, 12], [[]], 3)) == "ab"  # the loop left block 0
    assert revising.finish([5, 10, 11, 12, 0]) == ("c", "stop", 3)
    plain = RowText(header, decode, max_tokens=8, stops=["bc"])
    assert plain.update(rec(0, [1, 3], [1, 2], [10, 11], None, 3)) == "a"  # 'b' could start the stop string
    assert plain.update(rec(1, [3, 5], [3], [12, 12], None, 4)) == ""  # 'abc': the stop string; 'a' was sent
    assert plain.finish([5, 10, 11, 12, 0]) == ("", "stop", 3)


def test_lm_eval_scores_the_embedded_model_through_the_server(served, monkeypatch):
    """lm-eval-harness's local-completions model against the server, on the shipped task
    (benchmarks/lm_eval_tasks: held-out prompts of the five families, their verifiers): every
    document's answer is the engine's solo answer and the score is the verifiers' rate on those."""
    lm_eval = pytest.importorskip("lm_eval")  # a test-only requirement (requirements.txt)
    from lm_eval.tasks import TaskManager

    from tinymodel.tasks import get_task, parse_prompt

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.chdir(Path(__file__).resolve().parent.parent)  # the task's data_files are relative to the root
    tasks = TaskManager(include_path="benchmarks/lm_eval_tasks", include_defaults=False)
    args = f"model={served.engine.name},base_url={served.url}/completions,tokenizer_backend=none,tokenized_requests=False,num_concurrent=8,max_retries=1"
    results = lm_eval.simple_evaluate(model="local-completions", model_args=args, tasks=["tiny_families"], task_manager=tasks, gen_kwargs="block_length=8")
    samples = results["samples"]["tiny_families"]
    docs = [json.loads(line) for line in Path("benchmarks/lm_eval_tasks/tiny_families.jsonl").read_text().splitlines()]
    assert len(samples) == len(docs) > 50
    from engine.serving.limits import RequestLimits
    from engine.serving.schema import canvas_length

    # what lm-eval sent: max_tokens 32, so the canvas is the server's rule's (the card's answer length)
    config = GenerationConfig(gen_length=canvas_length(32, 8, served.engine.answer_length, RequestLimits()), block_length=8, seed=1234, use_chat_template=False)
    valid = []
    for sample in samples:
        doc = sample["doc"]
        answer = solo(served.engine, doc["prompt"], config).text.split("\n")[0]  # lm-eval's `until`
        assert sample["resps"][0][0] == answer, doc
        valid.append(get_task(doc["task"]).check(parse_prompt(doc["prompt"]), answer))
    assert results["results"]["tiny_families"]["valid,none"] == pytest.approx(sum(valid) / len(valid))
    assert 0 < sum(valid) < len(valid)  # the model answers some and misses some: the metric discriminates


def test_the_app_opens_a_trace_from_the_server_by_id(served):
    """The debugger's loader (dinfer_viz/tabs/server_trace.py): the Run tab's view of the server's trace,
    as when its file is loaded; a wrong id or address, or a public app, is one escaped line."""
    from dinfer_viz.live.host import EngineHost, ModelSpec
    from dinfer_viz.tabs.server_trace import open_server_trace
    from dinfer_viz.tabs.run import RUN_VIEW
    from dinfer_viz.ui import Handlers

    out = served.client.completions.create(model=served.engine.name, prompt=PROMPTS[5], max_tokens=32, extra_body=SETTINGS)
    trace_id = out.choices[0].model_extra["trace_id"]
    handlers = Handlers(EngineHost(ModelSpec(DEFAULT_MODEL)))  # no model loaded: a trace needs none
    server = served.url.removesuffix("/v1")
    view = dict(zip(RUN_VIEW, open_server_trace(handlers, server, trace_id)))
    assert str(view["message"]).startswith("loaded a trace: tiny-llada")
    assert view["state"] is not None and view["text"] == out.choices[0].text
    for address, trace, fragment in [
        (server, "trace-0123456789abcdef", "the server has no such trace: no trace"),
        (server, "<b>x</b>", "is not a trace id"),
        ("file:///etc/passwd", trace_id, "is not a server address"),
    ]:
        message = str(dict(zip(RUN_VIEW, open_server_trace(handlers, address, trace)))["message"])
        assert fragment in message and "\n" not in message and "<b>" not in message, message
    public = Handlers(EngineHost(ModelSpec(DEFAULT_MODEL), allowed={}))
    assert "public app opens no server traces" in str(dict(zip(RUN_VIEW, open_server_trace(public, server, trace_id)))["message"])


def test_the_serve_command_refuses_bad_flags_and_a_busy_port_in_one_line(capsys):
    """Before the model loads: exit 2 and one line on stderr (engine/cli.py's rule)."""
    from engine.__main__ import main

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        cases = [
            (["--max-batch", "0"], "--max-batch 0"), (["--port", str(port)], f"cannot listen on 127.0.0.1:{port}"), (["--tp", "0"], "must be >= 1"),
            (["--port", "70000"], "--port must be in 1..65535"), (["--threads", "100000"], "this machine's CPUs"), (["--max-connections", "0"], "--max-connections 0"),
        ]
        for flags, fragment in cases:
            assert main(["serve", *flags]) == 2
            err = capsys.readouterr().err
            assert fragment in err and err.count("\n") == 1, err


def test_the_serve_commands_connections_send_without_waiting_for_acks():
    """`engine serve`'s listening socket is named TCP, so asyncio (uvicorn's loop) sets TCP_NODELAY
    on each connection it accepts: without it a kept-alive client's every answer waited for the
    client's delayed ACK between its two writes (40 ms a request, GET /models too)."""
    import asyncio

    from engine.serving.command import listen

    nodelay = []

    async def exchange() -> None:
        async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nodelay.append(writer.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(accepted, sock=listen("127.0.0.1", 0))
        async with server:
            reader, writer = await asyncio.open_connection(*server.sockets[0].getsockname()[:2])
            await reader.read()  # closed once accepted
            writer.close()

    asyncio.run(exchange())
    assert nodelay and nodelay[0] != 0


def test_a_uniform_state_stream_sends_a_canvas_only_once_it_wrote_its_output(tiny_gemma_folder):
    """A uniform-state run accepts proposals that later steps replace: nothing of a canvas may be
    sent before its output record, and what is sent is a prefix of the final text (a real run of
    the tiny DiffusionGemma, its records fed to the stream as the server feeds them)."""
    engine = Engine(str(tiny_gemma_folder))
    config = GenerationConfig(decoder="uniform", block_length=8, gen_length=24, seed=2, decoder_options={"max_denoising_steps": 6})
    out = engine.generate_ids([engine.encode("Q: 7+5=? A:", False)], config, RunHooks(trace=True))
    trace = out.trace
    decode = lambda ids: engine.tokenizer.decode(ids)  # noqa: E731
    row = RowText(trace, decode, max_tokens=64, stops=[])
    sent = ""
    for rec in trace.iterations:
        delta = row.update(rec)
        if rec.state["output"] is None:
            assert delta == ""  # the canvas is still being judged
        sent += delta
    rest, _, _ = row.finish(trace.final[0])
    assert sent and sent + rest == decode(out.token_ids[0])  # some text streamed before the end, and all of it stays
