"""The load benchmark's mix (benchmarks/load.py) as a test, small: the mix's first KINDS kinds of
request (streamed and not, completions and chat, four decoders, three cache modes, a regex
constraint, lengths 16 to 64) sent at once to `serve`'s app on uvicorn, each answer equal to its solo run, none
an error. They are at once by the engine's own state, not by timing: the test holds the batcher's
lock (the engine busy) until the batcher counts every request waiting, as tests/test_serve.py does;
under either batcher.
"""

from __future__ import annotations

import threading

import pytest
import torch

from benchmarks.load import MIX, load, solo_text
from engine import Engine
from engine.cli import DEFAULT_MODEL
from engine.serving.app import create_app

from .test_serve import all_queued, running, until

KINDS = 7  # MIX[:7] holds each of those (the rest repeats them with other prompts and lengths)


@pytest.mark.parametrize("batching", ["continuous", "lockstep"])
def test_the_mixs_kinds_of_request_at_once_each_get_their_solo_answer(batching):
    torch.set_num_threads(1)
    engine = Engine(DEFAULT_MODEL)
    solo = [solo_text(engine, body) for body in MIX[:KINDS]]
    app = create_app(engine, batching=batching)
    server = app.state.server
    answers = []
    with running(app) as url:
        with server.batcher.lock:  # the engine busy while every request arrives
            clients = threading.Thread(target=lambda: answers.extend(load(url, clients=KINDS, requests=KINDS)))
            clients.start()
            until(lambda: all_queued(server, KINDS))
        clients.join()
    assert sorted(index for index, _ in answers) == list(range(KINDS))  # each kind once
    for index, answer in answers:
        assert answer.error is None, (MIX[index], answer.error)
        assert answer.text == solo[index], MIX[index]
    assert server.pending == 0
