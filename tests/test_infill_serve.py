"""Fill in the middle through the server (docs/serving.md, OpenAI's `suffix`): the completion is
the hole's text, the hole is `max_tokens` long, a template is an extension field, and a model that
cannot see text after its block answers 400 in one line."""

from __future__ import annotations

import httpx
import openai

from engine import Engine
from engine.serving.app import create_app
from engine.serving.limits import RequestLimits
from engine.serving.traces import TraceStore

from .app_support import EMBEDDED_MODEL
from .test_serve import running

PROMPT = "Q: ?+?=38 A:"


def test_the_suffix_is_pinned_after_a_hole_of_max_tokens_and_left_out_of_the_text():
    app = create_app(Engine(str(EMBEDDED_MODEL)), RequestLimits(), max_batch=2, max_pending=4, traces=TraceStore(max_traces=2))
    with running(app) as url:
        client = openai.OpenAI(base_url=url, api_key="none", max_retries=0)
        done = client.completions.create(model="tiny-llada", prompt=PROMPT, suffix=" + 22", max_tokens=3, extra_body={"block_length": 3})
        with httpx.Client(base_url=url, timeout=120) as http:
            template = http.post("/completions", json={"prompt": PROMPT, "template": " {{hole:2}} + {{hole:2}}", "block_length": 2})
            refused = http.post("/completions", json={"prompt": PROMPT, "suffix": " + 22", "max_tokens": 3, "kind": "chain"})
    choice = done.choices[0]
    assert "+ 22" not in choice.text and len(choice.text) <= 3 and done.usage.completion_tokens <= 3
    assert template.status_code == 200 and " + " not in template.json()["choices"][0]["text"]
    assert refused.status_code == 400 and refused.json()["error"]["message"].startswith("chain diffusion fills no holes")


def test_a_block_causal_model_refuses_a_suffix_in_one_line():
    app = create_app(Engine("tiny-llada2"), RequestLimits(), max_batch=1, max_pending=2, traces=TraceStore(max_traces=1))
    with running(app) as url, httpx.Client(base_url=url, timeout=120) as http:
        refused = http.post("/completions", json={"prompt": PROMPT, "suffix": " + 22", "max_tokens": 8, "block_length": 8})
    message = refused.json()["error"]["message"]
    assert refused.status_code == 400 and message.startswith("this model's attention is block-causal") and "\n" not in message
