"""Every refusal of a request's settings is the client's error, a 400 with its one line (issue #55
item 3): on a block-causal model (the embedded tiny-llada2) the refusals its attention makes, a
bidirectional cache mode, unaligned blocks, a shadow-block decoder, came from inside the run and
were answered as a failed run (a 500, or a stream's error event after a 200). They are made while
the request is checked (engine/cache.py: `check_attention`), before any row is queued.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest
import torch

from engine import Engine
from engine.serving.app import create_app
from engine.serving.limits import RequestLimits

BLOCK_CAUSAL = Path(__file__).resolve().parent.parent / "assets" / "tiny-llada2"
PROMPT = "Q: 12+34=? A:"
REFUSED = {  # a setting the model refuses -> the line it refuses it with
    "cache dual": ({"cache": "dual"}, "cache 'dual' does not apply to a block-causal model; use 'prefix' (exact) or 'none'"),
    "cache vicinity": ({"cache": "vicinity"}, "cache 'vicinity' does not apply to a block-causal model; use 'prefix' (exact) or 'none'"),
    "align_blocks off": ({"align_blocks": False}, "a block-causal model decodes whole aligned blocks: align_blocks must stay on"),
    "decoder wino": ({"decoder": "wino"}, "decoder 'wino' does not support the LLaDA2MoeModelLM family: its forward does not take the shadow block"),
}


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    from fastapi.testclient import TestClient

    torch.set_num_threads(1)
    app = create_app(Engine(str(BLOCK_CAUSAL)), RequestLimits(max_gen_length=64))
    with TestClient(app) as http:
        yield http, app.state.server


@pytest.mark.parametrize("sent", ["json", "stream, provisional"])
@pytest.mark.parametrize("case", list(REFUSED))
def test_a_setting_the_block_causal_model_refuses_is_a_400_in_its_one_line(client, case, sent):
    http, server = client
    settings, line = REFUSED[case]
    streamed = sent != "json"
    body = {"gen_length": 8, "block_length": 8, "stream": streamed, "provisional": streamed, **settings}
    for path, prompt in (("/v1/completions", {"prompt": PROMPT}), ("/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPT}]})):
        reply = http.post(path, json={**body, **prompt})
        assert reply.status_code == 400, (path, reply.status_code, reply.text)
        message = reply.json()["error"]["message"]
        assert message.startswith(line) and "\n" not in message, message
        assert reply.json()["error"]["type"] == "invalid_request_error"
    assert server.pending == 0
