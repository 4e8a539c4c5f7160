"""Constraints under load (issue 60), decided from events, never from a clock: a constrained row
busy on the host holds no other row's forwards; requests whose checks build a constraint take
turns between clients on threads of their own, so a plain request is checked and answered while
eight builds are held; a cancel or a disconnect
reaches a constrained run held inside its constraint's work; `RunHooks(max_tokens)` bounds the
canvas through the Engine."""

from __future__ import annotations

import asyncio
import threading

import httpx
import pytest
import torch

from engine import Engine, GenerationConfig, RunHooks
from engine.cli import DEFAULT_MODEL
from engine.constraints import CanvasConstraint, bounded
from engine.constraints import spec as constraint_spec
from engine.errors import EngineError
from engine.serving.app import create_app
from engine.serving.batcher import BatchRequest
from engine.serving.fair import FairPool
from engine.serving.scheduler import ContinuousBatcher
from engine.serving.traces import CANCELLED, TraceStore

from .test_serve import LIMITS, running, until
from .test_serve_continuous import Collect
from .test_serve_metrics import parsed, value

PAIR = r"(  [0-9]| [1-9][0-9]) \+(  [0-9]| [1-9][0-9])"
BASE = dict(gen_length=32, block_length=8, use_chat_template=False)


@pytest.fixture(scope="module")
def engine() -> Engine:
    torch.set_num_threads(1)
    return Engine(DEFAULT_MODEL)


def ended(url: str) -> dict[str, float]:
    """/metrics' requests by how they ended, scraped from the server at `url` (its /v1 address)."""
    counted = parsed(httpx.get(url.removesuffix("/v1") + "/metrics", timeout=600).text)
    return {status: value(counted, "dinfer_requests_total", status=status) for status in ("ok", "failed", "cancelled", "refused")}


class Held:
    """CanvasConstraint.restrict held at its calls until `release` is set: `entered` says a
    constrained row is inside its constraint's work; `calls` counts the calls."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.entered, self.release, self.calls = threading.Event(), threading.Event(), 0
        restrict = CanvasConstraint.restrict

        def held(constraint, *args, **kwargs):
            self.calls += 1
            self.entered.set()
            assert self.release.wait(600)
            return restrict(constraint, *args, **kwargs)

        monkeypatch.setattr(CanvasConstraint, "restrict", held)


def test_a_constrained_row_busy_on_the_host_holds_no_other_rows_forwards(engine, monkeypatch):
    """The scheduler ran a forward only once every running row asked for one: a row inside a slow
    constraint check held every other row. A plain request now finishes while the constrained
    row is still held, and both get their solo answers."""
    engine.vocabulary.automaton(PAIR)  # built before the hold: the hold is the row's step, not its build
    batcher = ContinuousBatcher(threading.Lock(), lambda members: engine, 8)
    constrained_config, plain_config = GenerationConfig(**BASE, regex=PAIR), GenerationConfig(**BASE, threshold=0.9)
    alone = [engine.generate("Q: 12+7=? A:", constrained_config).text, engine.generate("Q: 5-5=? A:", plain_config).text]
    held = Held(monkeypatch)
    constrained, plain = Collect(), Collect()
    batcher.submit(BatchRequest("Q: 12+7=? A:", constrained_config, threading.Event(), constrained, None))
    assert held.entered.wait(600)
    batcher.submit(BatchRequest("Q: 5-5=? A:", plain_config, threading.Event(), plain, None))
    assert plain.done.wait(600) and plain.error is None
    assert not constrained.done.is_set() and batcher.running == 1  # finished while the constrained row is held
    held.release.set()
    assert constrained.done.wait(600) and constrained.error is None
    assert [constrained.result.text, plain.result.text] == alone


def test_the_fair_pool_takes_clients_in_turn():
    """Client a's three jobs and then b's one, on one thread: b's runs second, not fourth."""
    pool, order, gate = FairPool(1, "test-fair"), [], threading.Event()

    def job(name: str) -> str:
        gate.wait(600)
        order.append(name)
        return name

    async def main() -> list[str]:
        first = asyncio.ensure_future(pool.run("a", job, "a1"))
        await asyncio.sleep(0)
        until(lambda: pool.waiting == 0)  # a1 runs (held at the gate); the rest queue behind it
        rest = [asyncio.ensure_future(pool.run(c, job, n)) for c, n in (("a", "a2"), ("a", "a3"), ("b", "b1"))]
        await asyncio.sleep(0)
        gate.set()
        return list(await asyncio.gather(first, *rest))

    assert asyncio.run(main()) == ["a1", "a2", "a3", "b1"]
    assert order == ["a1", "a2", "b1", "a3"]


def test_a_plain_request_is_answered_while_eight_constraints_build(engine, monkeypatch):
    """Eight requests whose regexes are slow to build (their builds held), from one client: a
    plain request sent meanwhile is checked and answered (it waited on a thread a build held), and
    the eight then get their answers."""
    release, entered = threading.Event(), []
    count = constraint_spec._byte_states

    def slow(regex: str) -> int:
        entered.append(regex)
        assert release.wait(600)
        return count(regex)

    monkeypatch.setattr(constraint_spec, "_byte_states", slow)
    app = create_app(engine, LIMITS)
    with running(app) as url, httpx.Client(base_url=url, timeout=600) as http:
        body = {"prompt": "Q: 1+1=? A:", **BASE}
        regexes = [f"[a-c]{{2,{n}}}" for n in range(3, 11)]
        threads = [threading.Thread(target=http.post, args=("/completions",), kwargs={"json": {**body, "regex": r}}) for r in regexes]
        for t in threads:
            t.start()
        mine = lambda: [r for r in entered if r in regexes]  # noqa: E731 (the server's own warm-up builds json_object's too)
        until(lambda: len(mine()) == bounded.MAX_BUILDS and app.state.server.builds.waiting == len(regexes) - bounded.MAX_BUILDS)
        plain = http.post("/completions", json=body)
        assert plain.status_code == 200 and plain.json()["choices"][0]["text"] == engine.generate("Q: 1+1=? A:", GenerationConfig(**BASE)).text
        assert len(mine()) == bounded.MAX_BUILDS  # the builds were all still held
        release.set()
        for t in threads:
            t.join()
        until(lambda: app.state.server.pending == 0)
        assert sorted(set(mine())) == sorted(regexes)  # each checked (its count not kept by this stand-in: more than once)


@pytest.mark.parametrize("how", ["disconnect", "stop"])
def test_a_cancel_reaches_a_constrained_run_held_in_its_constraints_work(engine, monkeypatch, how):
    """A constrained stream held inside `restrict`; the client leaves (or the server stops); once
    the hold opens, the run ends at once: its held step is the last (no further restrict), its
    trace is cancelled and /metrics counts it cancelled."""
    engine.vocabulary.automaton(PAIR)
    held = Held(monkeypatch)
    app = create_app(engine, LIMITS, traces=TraceStore(max_traces=8))
    server = app.state.server
    with running(app) as url, httpx.Client(base_url=url, timeout=600) as http:
        body = {"prompt": "Q: 12+7=? A:", **BASE, "regex": PAIR, "stream": True}
        with http.stream("POST", "/completions", json=body) as reply:
            trace_id = reply.headers["x-trace-ids"]
            assert held.entered.wait(600)
            if how == "stop":
                server.stop()
        if how == "disconnect":
            until(lambda: server.traces.get(trace_id).status == CANCELLED)  # the server saw it leave
        calls = held.calls
        held.release.set()
        until(lambda: server.pending == 0)
        assert held.calls == calls  # no step after the held one
        assert server.traces.get(trace_id).status == CANCELLED
        until(lambda: ended(url)["cancelled"] == 1)
        assert ended(url) == {"ok": 0, "failed": 0, "cancelled": 1, "refused": 0}


def test_run_hooks_max_tokens_bounds_the_canvas_through_the_engine(engine):
    """RunHooks.max_tokens was checked and then replaced by the engine's own limit: now the smaller applies."""
    config = GenerationConfig(**BASE)
    with pytest.raises(EngineError, match=r"exceeds .*\(20\)"):
        engine.generate("Q: 1+1=? A:", config, RunHooks(max_tokens=20))
    assert engine.generate("Q: 1+1=? A:", config, RunHooks(max_tokens=64)).text == engine.generate("Q: 1+1=? A:", config).text
