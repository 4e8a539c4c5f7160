"""One count of forwards (docs/counting.md §2): the same run's NFE and TPF on every path that shows
them, for every discovered kind, on the first embedded model that runs it. The engine counts each
model call where it happens (engine/run.py `metered`) and stamps the next record with it; every
reader sums those. Parametrised by the kind registry, so a new kind is checked with no edit here."""

from __future__ import annotations

import json
import queue
import threading
from functools import cache

import httpx
import pytest
import torch

from dinfer_viz.panes import readouts
from dinfer_viz.live.batching import RunBatcher
from dinfer_viz.live.events import Finished
from dinfer_viz.live.host import EngineHost, ModelSpec
from dinfer_viz.reading.timeline import Timeline
from dinfer_viz.views import view_for
from dinfer_viz.views.base import KindView
from engine import Engine, GenerationConfig, Trace
from engine.hooks import RunHooks
from engine.kinds import KINDS, ModelTraits, kind_named
from engine.models.loader import embedded_models
from engine.serving.app import create_app
from engine.serving.batcher import Batcher, BatchRequest
from engine.serving.limits import RequestLimits

from .test_serve import running

PROMPTS = {"masked": "Q: ?+?=38 A:", "uniform": "Q: ?+?=38 A:", "speculative": "Q: ?+?=110 A:"}
# two blocks (two canvases of the uniform-state model, which fixes its own block length: two encoder forwards)
SETTINGS = {"gen_length": 16, "block_length": 8}
OWN_BLOCK = {"uniform": {"gen_length": 32}}


@cache
def engine_of(name: str) -> Engine:
    torch.set_num_threads(1)
    return Engine(name)


def model_for(kind: str) -> str:
    """The first embedded model that runs `kind` (its own kind first)."""
    names = sorted(embedded_models(), key=lambda n: n != {"masked": "tiny-llada", "uniform": "tiny-gemma", "speculative": "tiny-llada2"}.get(kind))
    for name in names:
        if kind_named(kind).refuses(ModelTraits.of(engine_of(name).model)) is None:
            return name
    pytest.skip(f"no embedded model runs kind {kind}")


def settings_for(kind: str) -> dict[str, int]:
    return OWN_BLOCK.get(kind, SETTINGS)


def config_for(kind: str) -> GenerationConfig:
    return GenerationConfig(kind=kind, use_chat_template=False, **settings_for(kind))


class Sink:
    """The lockstep batcher's news for one request."""

    def __init__(self) -> None:
        self.done: "queue.SimpleQueue[object]" = queue.SimpleQueue()

    def waiting(self) -> None: ...
    def started(self, header: Trace, batch: int) -> None: ...
    def record(self, record: object) -> None: ...
    def batched(self, rows: int) -> None: ...

    def finished(self, result: object) -> None:
        self.done.put(result)

    def failed(self, message: str) -> None:
        self.done.put(RuntimeError(message))


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_path_shows_the_engines_count_of_forwards(kind):
    check_every_path(kind, config_for(kind))


def check_every_path(kind: str, config: GenerationConfig) -> None:
    """The engine's NFE and TPF of one run of `config` on every path that shows them (the test above;
    tests/test_example_kind.py runs it for the example kind loaded by path)."""
    name = model_for(kind)
    engine, prompt = engine_of(name), PROMPTS.get(kind, PROMPTS["masked"])
    solo = engine.generate(prompt, config, RunHooks(trace=True)).output
    nfe, tokens = solo.stats.nfe, solo.stats.tokens
    assert nfe >= 1 and tokens >= 1

    # the trace: its footer, its records, and the same after a round trip through its file form
    assert solo.trace.stats["nfe"] == nfe == sum(rec.forwards for rec in solo.trace.iterations)
    loaded = Trace.from_json(solo.trace.to_json())
    assert sum(rec.forwards for rec in loaded.iterations) == nfe

    # the lockstep batcher (`serve --batching lockstep`, and the app's batcher below): a row's solo count
    sink = Sink()
    Batcher(threading.Lock(), lambda members: engine).submit(BatchRequest(prompt, config, threading.Event(), sink, None))
    batched = sink.done.get(timeout=600)
    assert not isinstance(batched, Exception), batched
    assert batched.output.stats.nfe == nfe and batched.output.trace.stats["nfe"] == nfe
    assert sum(rec.forwards for rec in batched.output.trace.iterations) == nfe

    # the app: its batcher's run, the Run tab's readout (live and finished) and the cost panel's count
    events = RunBatcher(EngineHost(ModelSpec(name))).submit(ModelSpec(name), prompt, config, threading.Event())
    result = None
    while result is None:
        event = events.get(timeout=600)
        assert not isinstance(event, Exception)
        result = event.value if isinstance(event, Finished) else None
        assert type(event).__name__ != "Failed", event
    trace = result.output.trace
    assert result.output.stats.nfe == nfe and trace.stats["nfe"] == nfe
    timeline = Timeline(trace)
    tpf = f"{tokens / nfe:.2f}"
    assert f"| {tpf} | {nfe} |" in readouts.readout(timeline)
    live = Timeline(Trace.from_dict({**json.loads(trace.to_json()), "iterations": []}))
    for rec in trace.iterations:
        live.add(rec)
    assert f"NFE {nfe} " in readouts.live_line(live, live.iterations, 1.0)
    assert f"TPF {tpf}" in readouts.live_line(live, live.iterations, 1.0)
    view = view_for(timeline)
    if type(view).forward_costs is not KindView.forward_costs:  # a kind that counts its forwards in the cost panel's title
        assert f"NFE {nfe}:" in view.forward_costs(timeline)[0]


def test_a_router_step_that_skips_its_verify_counts_one_forward():
    """`verify=router` (docs/algorithms.md §10.4): a step whose verify the router skipped ran one
    forward, and every path counts it so; the run skips at least one."""
    config = config_for("speculative").replace(kind_options={"verify": "router"})
    check_every_path("speculative", config)
    out = engine_of(model_for("speculative")).generate(PROMPTS["speculative"], config, RunHooks(trace=True)).output
    assert any(rec.forward == "draft" and rec.forwards == 1 for rec in out.trace.iterations)
    assert all(rec.forwards == 1 + rec.state["verified"][0] for rec in out.trace.iterations)
    assert check_server_usage("speculative", "continuous", kind_options={"verify": "router"})["usage"]["forwards"] == out.stats.nfe


@pytest.mark.parametrize("batching", ["continuous", "lockstep"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_the_servers_usage_counts_the_engines_forwards(kind, batching):
    check_server_usage(kind, batching)


def check_server_usage(kind: str, batching: str, **fields: object) -> dict:
    """The server's `usage.forwards` for a request of `kind` (with `fields`) equals the engine's
    NFE for the same settings; returns the answer."""
    name = model_for(kind)
    engine, prompt = engine_of(name), PROMPTS.get(kind, PROMPTS["masked"])
    nfe = engine.generate(prompt, config_for(kind).replace(**fields)).output.stats.nfe
    app = create_app(engine, RequestLimits(), max_batch=4, max_pending=8, batching=batching)
    with running(app) as url:
        settings = settings_for(kind)
        # the canvas as given: without gen_length it would be at least the model's answer length (docs/serving.md §1)
        body = {"model": engine.name, "prompt": prompt, "max_tokens": settings["gen_length"], **settings, "kind": kind, **fields}
        answer = httpx.post(f"{url}/completions", json=body, timeout=600)
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["forwards"] == nfe
    return answer.json()


def test_a_speculative_stream_carries_its_draft_as_provisional_text():
    """The kind's own answer to "what does the run hold now" (StepState.current) is what a stream
    with `provisional: true` sends after the final text: on a prompt whose step corrects its draft
    mid-block, the rest of that draft arrives as provisional text and never as final text."""
    engine = engine_of("tiny-llada2")
    app = create_app(engine, RequestLimits(), max_batch=4, max_pending=8)
    body = {"model": engine.name, "prompt": "Q: rhymes with shore? A:", "max_tokens": 32, "block_length": 8, "kind": "speculative", "stream": True, "provisional": True}
    with running(app) as url, httpx.stream("POST", f"{url}/completions", json=body, timeout=600) as answer:
        chunks = [json.loads(line[6:]) for line in answer.iter_lines() if line.startswith("data: {")]
    choices = [c["choices"][0] for c in chunks if c.get("choices")]
    text = "".join(c.get("text") or "" for c in choices)
    assert text == engine.generate(body["prompt"], GenerationConfig(kind="speculative", gen_length=32, block_length=8, use_chat_template=False)).texts[0]
    assert any(c.get("provisional") for c in choices), choices
