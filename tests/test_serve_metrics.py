"""The server's /metrics (engine/serving/metrics.py) and provisional streaming
(engine/serving/streaming.py: RowText.provisional), on `serve`'s app on uvicorn with the embedded
model: scraped and parsed with prometheus_client's own parser after real requests; a stream with
`provisional: true` read with the `openai` client and as raw server-sent events."""

from __future__ import annotations

import json
import threading

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine.constraints import CanvasConstraint
from engine.errors import EngineError
from engine.serving.app import create_app

from .test_serve import LIMITS, PROMPTS, SETTINGS, Served, complete, running, served, solo, until  # noqa: F401 (served: the fixture)


def parsed(text: str) -> dict[str, dict[tuple, float]]:
    """Every sample of a Prometheus text: name -> {labels as sorted pairs: value}."""
    samples: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def scrape(served: Served) -> dict[str, dict[tuple, float]]:
    response = httpx.get(served.url.removesuffix("/v1") + "/metrics", timeout=60)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    return parsed(response.text)


def value(samples: dict[str, dict[tuple, float]], name: str, **labels: str) -> float:
    return samples.get(name, {}).get(tuple(sorted(labels.items())), 0.0)


def test_metrics_count_requests_forwards_tokens_and_times(served):
    before = scrape(served)
    answers = [complete(served, p, stream) for p, stream in ((PROMPTS[0], False), (PROMPTS[1], True))]
    refused = httpx.post(served.url + "/completions", json={"prompt": PROMPTS[0], "threshold": 2}, timeout=60)
    assert refused.status_code == 400
    after = scrape(served)
    alone = [solo(served.engine, p) for p in PROMPTS[:2]]
    assert [text for text, _ in answers] == [a.text for a in alone]
    grew = lambda name, **labels: value(after, name, **labels) - value(before, name, **labels)  # noqa: E731
    assert grew("dinfer_requests_total", status="ok") == 2 and grew("dinfer_requests_total", status="refused") == 1
    assert grew("dinfer_requests_total", status="failed") == 0
    forwards = sum(a.output.stats.nfe for a in alone)
    # alone, one after the other: each forward decoded one row
    assert grew("dinfer_forwards_total") == forwards
    assert grew("dinfer_rows_per_forward_count") == forwards and grew("dinfer_rows_per_forward_sum") == forwards
    assert grew("dinfer_forwards_per_row_count") == 2 and grew("dinfer_forwards_per_row_sum") == forwards
    assert grew("dinfer_generated_tokens_total") == sum(len(a.output.token_ids[0]) for a in alone)
    assert grew("dinfer_request_latency_seconds_count") == 2 and grew("dinfer_time_to_first_token_seconds_count") == 2
    assert value(after, "dinfer_time_to_first_token_seconds_sum") <= value(after, "dinfer_request_latency_seconds_sum")
    assert value(after, "dinfer_queue_depth") == 0 and value(after, "dinfer_running_rows") == 0


def test_two_apps_keep_their_own_metrics(served):
    before = value(scrape(served), "dinfer_requests_total", status="ok")
    other = create_app(served.engine).state.server.metrics
    other.requests.labels("ok").inc()
    assert value(parsed(other.scrape().decode()), "dinfer_requests_total", status="ok") == 1
    assert value(scrape(served), "dinfer_requests_total", status="ok") == before


def sse_chunks(served: Served, body: dict) -> list[dict]:
    with httpx.stream("POST", served.url + "/completions", json=body, timeout=600) as response:
        assert response.status_code == 200
        events = [line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def test_a_provisional_stream_shows_the_draft_and_ends_with_the_plain_text(served):
    prompt = PROMPTS[4]
    plain, _ = complete(served, prompt, stream=False)
    body = {"prompt": prompt, "max_tokens": 32, "stream": True, "provisional": True, **SETTINGS}
    chunks = sse_chunks(served, body)
    choices = [c["choices"][0] for c in chunks if c["choices"]]
    assert "".join(c["text"] for c in choices) == plain
    drafts = [c["provisional"] for c in choices[1:]]  # the first chunk (the row's start) has none
    assert all(isinstance(d, str) for d in drafts) and drafts[-1] == "" and choices[-1]["finish_reason"] == "stop"
    # the draft ran ahead of the final text: a record left open positions the model had guesses for
    assert any(drafts[:-1])
    # the openai client reads the extension as an extra field of each choice
    stream = served.client.completions.create(model=served.engine.name, prompt=prompt, max_tokens=32, stream=True, extra_body={"provisional": True, **SETTINGS})
    got = list(stream)
    assert "".join(c.choices[0].text for c in got if c.choices) == plain
    assert any(c.choices[0].model_extra.get("provisional") for c in got if c.choices)
    plain_chunks = sse_chunks(served, {**body, "provisional": False})
    assert all("provisional" not in c["choices"][0] for c in plain_chunks if c["choices"])


def test_provisional_needs_a_stream(served):
    response = httpx.post(served.url + "/completions", json={"prompt": PROMPTS[0], "provisional": True}, timeout=60)
    assert response.status_code == 400 and "stream" in response.json()["error"]["message"]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
@pytest.mark.parametrize("ending", ["ok", "refused", "failed", "cancelled"])
def test_every_request_is_counted_once_by_how_it_ended(served, monkeypatch, ending, stream):
    """Issue 60 item 4: a dropped stream was not counted at all and a dropped plain request counted
    as failed. One request per ending, streamed or not, on an app of its own: exactly one count,
    under its ending. Failed: the constraint's step raises; cancelled: the run is held in its
    constraint's step (an event) while the client leaves."""
    from .test_constraints_load import PAIR, Held, ended

    served.engine.vocabulary.automaton(PAIR)
    if ending == "failed":
        def broken(*args, **kwargs):
            raise EngineError("the test's failure")

        monkeypatch.setattr(CanvasConstraint, "restrict", broken)
    held = Held(monkeypatch) if ending == "cancelled" else None
    app = create_app(served.engine, LIMITS)
    body = {"prompt": PROMPTS[0], **SETTINGS, "regex": PAIR, "stream": stream, **({"threshold": 2} if ending == "refused" else {})}
    with running(app) as url:
        if held is None:
            reply = httpx.post(url + "/completions", json=body, timeout=600)
            assert reply.status_code == {"ok": 200, "refused": 400, "failed": 200 if stream else 500}[ending]
        elif stream:
            with httpx.stream("POST", url + "/completions", json=body, timeout=600):
                assert held.entered.wait(600)  # the run is inside its step; the client leaves
        else:
            leaving = threading.Thread(target=lambda: pytest.raises(httpx.ReadTimeout, httpx.post, url + "/completions", json=body, timeout=httpx.Timeout(600, read=1)))
            leaving.start()
            assert held.entered.wait(600)
            leaving.join()  # the client gave up waiting for the answer (its read timeout) and left
        if held is not None:
            until(lambda: all(entry.status != "running" for entry in app.state.server.traces._entries.values()))
            held.release.set()
        until(lambda: app.state.server.pending == 0 and sum(ended(url).values()) >= 1)
        assert ended(url) == {status: float(status == ending) for status in ("ok", "failed", "cancelled", "refused")}
