"""Structured output through `python -m engine serve`'s app on a real uvicorn server, driven by the
`openai` client: every answer under a JSON schema parses and validates, on a random model and the
embedded one, with every masked decoder; vLLM's `structured_outputs`; a bad constraint is a 400 in
one line. The server is started as tests/test_serve.py starts it.
"""

from __future__ import annotations

import json
import socket
import threading
from typing import Iterator

import httpx
import jsonschema
import openai
import pytest
import uvicorn

from engine import Engine, save_model
from engine.cli import DEFAULT_MODEL
from engine.kinds import kind_decoders
from engine.serving.app import create_app
from engine.serving.limits import RequestLimits
from engine.serving.traces import TraceStore
from tinymodel.tokenizer import save_tokenizer, special_ids

from .conftest import tiny_llada

SCHEMA = {
    "type": "object",
    "properties": {"n": {"type": "integer"}, "tag": {"type": "string", "maxLength": 3}, "ok": {"type": "boolean"}},
    "required": ["n", "tag", "ok"],
    "additionalProperties": False,
}
LIMITS = RequestLimits(max_prompt_chars=200, max_gen_length=64, max_body_bytes=8192, max_prompts=4)


class Client(openai.OpenAI):
    """The `openai` client with the served model's name (the server answers 404 for another)."""

    def __init__(self, url: str, model: str) -> None:
        super().__init__(base_url=url, api_key="unused", max_retries=0, timeout=600)
        self.model = model


def serve(engine: Engine) -> Iterator[Client]:
    app = create_app(engine, LIMITS, max_batch=8, max_pending=32, traces=TraceStore(max_traces=64))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    yield Client(f"http://127.0.0.1:{sock.getsockname()[1]}/v1", engine.name)
    server.should_exit = True
    thread.join(timeout=600)
    sock.close()


@pytest.fixture(scope="module", params=["random", "embedded"])
def client(request, tmp_path_factory) -> Iterator[Client]:
    if request.param == "random":
        folder = tmp_path_factory.mktemp("random-llada")
        save_model(tiny_llada(seed=5, vocab_size=99, embedding_size=99, **special_ids()), folder)
        save_tokenizer(folder)
    else:
        folder = DEFAULT_MODEL
    yield from serve(Engine(folder))


@pytest.mark.parametrize("decoder", kind_decoders("masked"))
def test_every_answer_under_a_json_schema_parses_and_validates(client, decoder):
    extra = {"decoder": decoder, "threshold": 0.3, "gen_length": 64, "block_length": 32}
    if decoder in ("fixed", "remdm"):
        extra["steps"] = 32
    response_format = {"type": "json_schema", "json_schema": {"name": "reading", "schema": SCHEMA}}
    prompts = ["Q: 48+57=? A:", "Q: ?+?=38 A:"]
    done = client.completions.create(model=client.model, prompt=prompts, max_tokens=64, extra_body={**extra, "response_format": response_format})
    chat = client.chat.completions.create(model=client.model, messages=[{"role": "user", "content": "Q: 7+5=? A:"}], max_tokens=64, response_format=response_format, extra_body={**extra, "use_chat_template": False})
    for text in [c.text for c in done.choices] + [chat.choices[0].message.content]:
        jsonschema.validate(json.loads(text), SCHEMA)


def test_json_object_and_vllms_structured_outputs(client):
    obj = client.completions.create(model=client.model, prompt="Q: 1+1=? A:", max_tokens=32, extra_body={"response_format": {"type": "json_object"}, "threshold": 0.5})
    assert isinstance(json.loads(obj.choices[0].text), dict)
    choice = client.completions.create(model=client.model, prompt="Q: rhymes with cat? A:", max_tokens=32, extra_body={"structured_outputs": {"choice": [" hat", " bat"]}})
    assert choice.choices[0].text in (" hat", " bat")
    regex = client.completions.create(model=client.model, prompt="Q: ?+?=38 A:", max_tokens=32, extra_body={"structured_outputs": {"regex": "( [1-9][0-9]|  [0-9]) \\+( [1-9][0-9]|  [0-9])"}, "threshold": 0.1})
    assert len(regex.choices[0].text) == 8


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"structured_outputs": {"regex": "("}}, "invalid regex"),
        ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": 3}}}}, "not a valid JSON Schema"),
        ({"structured_outputs": {"grammar": "root ::= x"}}, "structured_outputs takes one of"),
        ({"structured_outputs": {"choice": ["y" * 200]}}, "needs at least 200 tokens"),
        ({"response_format": {"type": "json_object"}, "regex": "a"}, "give the answer's constraint once"),
    ],
)
def test_a_bad_constraint_is_a_400_in_one_line(client, extra, message):
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=client.model, prompt="Q: 1+1=? A:", max_tokens=32, extra_body=extra)
    text = caught.value.body["message"] if isinstance(caught.value.body, dict) else str(caught.value)
    assert message in text and "\n" not in text


def test_a_constraint_being_checked_never_holds_the_other_clients(monkeypatch):
    """#43 item 1: a request's checks (a constraint's automaton can take seconds) ran on the event
    loop, and nothing else was answered meanwhile. They run in a thread now: while one request's
    check is held (a gate, not a timing), GET /v1/models answers; and a regex whose repetitions
    multiply past the bound is refused at once, in one line, without being built."""
    from engine.serving.app import Server

    entered, release = threading.Event(), threading.Event()
    checked = Server._checked

    def held(self, body, chat):
        entered.set()
        release.wait(600)
        return checked(self, body, chat)

    monkeypatch.setattr(Server, "_checked", held)
    for client in serve(Engine(DEFAULT_MODEL)):
        http = httpx.Client(base_url=str(client.base_url), timeout=600)
        body = {"model": client.model, "prompt": "Q: 1+1=? A:", "max_tokens": 8, "gen_length": 8, "block_length": 8}
        slow = threading.Thread(target=lambda: http.post("/completions", json=body))
        slow.start()
        assert entered.wait(600)
        assert http.get("/models").status_code == 200  # answered while the other request's check is held
        release.set()
        slow.join()
        monkeypatch.setattr(Server, "_checked", checked)
        refused = http.post("/completions", json={**body, "structured_outputs": {"regex": "(a{1000}){1000}"}})
        assert refused.status_code == 400 and "would need about 1,000,000 states" in refused.json()["error"]["message"]
