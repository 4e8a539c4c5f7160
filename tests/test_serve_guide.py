"""The serving guide's examples answer right (issue 54 item 3): `max_tokens` caps an answer and
never changes it. The server keeps the canvas at least the model's answer length (its card's:
engine/models/card.py) and cuts the text at `max_tokens` with `finish_reason: "length"`, streamed
or not, provisional text included.

The examples are read from docs/serving.md (every `client.completions.create(...)` call in its
Python blocks), so the guide and this test cannot drift; they are sent through the real server
(uvicorn on a loopback port, the embedded model) and judged by the task families' verifiers.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Iterator

import httpx
import pytest
import torch

from engine import Engine, EngineError
from engine.cli import DEFAULT_MODEL
from engine.models.card import answer_length
from engine.models.loader import embedded_models
from engine.serving.app import create_app
from engine.serving.limits import RequestLimits
from engine.serving.schema import parse_request
from tinymodel.tasks import get_task, parse_prompt

from .test_serve import running

GUIDE = Path(__file__).resolve().parent.parent / "docs" / "serving.md"


def guide_requests() -> list[dict]:
    """The body of every `client.completions.create(...)` call in the guide's Python blocks: its
    keywords, `extra_body`'s fields among them."""
    bodies = []
    for block in re.findall(r"```python\n(.*?)```", GUIDE.read_text(encoding="utf-8"), re.S):
        for node in ast.walk(ast.parse(block)):
            if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("completions.create"):
                keywords = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
                bodies.append({**{k: v for k, v in keywords.items() if k != "extra_body"}, **keywords.get("extra_body", {})})
    return bodies


EXAMPLES = guide_requests()


def test_the_guide_shows_both_sums_the_issue_names():
    assert {body["prompt"] for body in EXAMPLES} >= {"Q: 14+5=? A:", "Q: 48+57=? A:"}, EXAMPLES


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    torch.set_num_threads(1)
    engine = Engine(DEFAULT_MODEL)
    assert engine.answer_length == 48  # assets/tiny-llada/README.md
    with running(create_app(engine, RequestLimits(), max_batch=4, max_pending=16)) as address:
        yield address


def post(url: str, body: dict) -> dict:
    reply = httpx.post(url + "/completions", json=body, timeout=600)
    assert reply.status_code == 200, reply.text
    return reply.json()


def streamed(url: str, body: dict) -> tuple[str, str, list[str], dict]:
    """(text, finish reason, each chunk's text so far + provisional, usage) of a provisional stream."""
    text, reason, drafts, usage = "", "", [], {}
    stream = {**body, "stream": True, "provisional": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", url + "/completions", json=stream, timeout=600) as reply:
        for line in reply.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: "):])
            assert "error" not in chunk, chunk
            usage = chunk.get("usage") or usage
            for choice in chunk["choices"]:
                text += choice["text"]
                reason = choice["finish_reason"] or reason
                drafts.append(text + choice.get("provisional", ""))
    return text, reason, drafts, usage


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda body: body["prompt"])
def test_the_guides_example_answers_right_at_max_tokens_16_and_32(url, example):
    family = parse_prompt(example["prompt"])
    texts = set()
    for max_tokens in (16, 32):
        body = {**example, "max_tokens": max_tokens}
        out = post(url, body)
        choice, usage = out["choices"][0], out["usage"]
        assert get_task(family.task).check(family, choice["text"]), (max_tokens, choice["text"])
        assert choice["finish_reason"] == "stop" and usage["completion_tokens"] == len(choice["text"])  # one character a token
        text, reason, _, stream_usage = streamed(url, body)
        assert (text, reason, stream_usage["completion_tokens"]) == (choice["text"], "stop", usage["completion_tokens"])
        texts.add(choice["text"])
    assert len(texts) == 1, texts  # max_tokens capped the answer; it did not change it


def test_a_max_tokens_shorter_than_the_answer_cuts_it_streamed_or_not(url):
    """The same answer cut after 6 tokens: `finish_reason: "length"`, usage counting the 6, and no
    streamed chunk, provisional text included, showing more than 6."""
    example = next(body for body in EXAMPLES if body["prompt"] == "Q: 14+5=? A:")
    whole = post(url, {**example, "max_tokens": 32})["choices"][0]["text"]
    out = post(url, {**example, "max_tokens": 6})
    assert out["choices"][0]["text"] == whole[:6] and out["choices"][0]["finish_reason"] == "length"
    assert out["usage"]["completion_tokens"] == 6
    assert out["usage"]["forwards"] == post(url, {**example, "max_tokens": 32})["usage"]["forwards"]  # the same canvas decoded
    text, reason, drafts, usage = streamed(url, {**example, "max_tokens": 6})
    assert (text, reason, usage["completion_tokens"]) == (whole[:6], "length", 6)
    assert drafts and all(len(draft) <= 6 for draft in drafts), drafts


@pytest.mark.parametrize(
    "fields,answer,canvas",
    [
        ({"max_tokens": 16, "block_length": 8}, 48, 48),  # below the answer length: the answer length's canvas
        ({"max_tokens": 50, "block_length": 8}, 48, 56),  # above it: whole blocks holding max_tokens
        ({"max_tokens": 16, "block_length": 32}, 48, 64),
        ({"block_length": 8}, 48, 48),  # no max_tokens: the answer length's canvas
        ({"max_tokens": 16, "gen_length": 16, "block_length": 8}, 48, 16),  # gen_length given: the canvas as given
        ({"max_tokens": 16, "block_length": 8}, None, 16),  # a card without one: max_tokens in whole blocks
        ({"max_tokens": 16, "block_length": 8}, 2000, 1024),  # the server's --max-gen-length bounds the answer length
    ],
)
def test_the_canvas_holds_max_tokens_and_the_models_answer_length(fields, answer, canvas):
    parsed = parse_request({"prompt": "Q: 14+5=? A:", **fields}, False, RequestLimits(), answer)
    assert parsed.config.gen_length == canvas
    assert parsed.max_tokens == fields.get("max_tokens", canvas)


def test_every_embedded_models_card_gives_its_answer_length():
    assert {name: answer_length(folder) for name, folder in embedded_models().items()} == {
        "tiny-gemma": 16, "tiny-llada": 48, "tiny-llada-edit": 48, "tiny-llada-infill": 48, "tiny-llada-td": 64, "tiny-llada2": 40,
    }


@pytest.mark.parametrize("card", ["---\nanswer_length: -3\n---\n# m\n", "---\nanswer_length: [48\n---\n# m\n", "---\nanswer_length: 4.5\n---\n"])
def test_a_card_whose_answer_length_cannot_be_read_is_refused_in_one_line(tmp_path, card):
    (tmp_path / "README.md").write_text(card)
    with pytest.raises(EngineError, match=r"^model card .*README.md: ") as refused:
        answer_length(tmp_path)
    assert "\n" not in str(refused.value)


def test_a_card_without_metadata_or_without_the_field_gives_none(tmp_path):
    assert answer_length(tmp_path) is None
    (tmp_path / "README.md").write_text("# a model\n")
    assert answer_length(tmp_path) is None
    (tmp_path / "README.md").write_text("---\nlicense: mit\n---\n# a model\n")
    assert answer_length(tmp_path) is None
