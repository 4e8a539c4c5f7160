"""The app through its Gradio API (gradio_client), against a server launched by the fixture."""

from __future__ import annotations

import csv
import json
import os
import threading
import time
from types import SimpleNamespace

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import pytest
from gradio_client import Client, handle_file
from gradio_client.exceptions import AppError
from gradio_client.utils import Status

from dinfer_viz.tabs.compare import COMPARE_VIEW
from dinfer_viz.tabs.run import RUN_VIEW
from dinfer_viz.ui import Handlers
from dinfer_viz.live.host import EngineHost, ModelSpec
from engine import GenerationConfig, RunHooks, Trace

from .app_support import handmade_trace, launch_app

# gradio's queue calls a pandas option that pandas 3 deprecates: noise, not ours
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore:.*(no_silent_downcasting|copy keyword).*")
API_RUN = [name for name in RUN_VIEW if name != "state"]  # gr.State is not part of the API
PROMPT = "Q: 48+57=? A:"
SMALL = {"gen_length": 32, "block_length": 8, "threshold": 0.9}


def out(result, name):
    return result[API_RUN.index(name)]


def readout_cells(markdown: str) -> list[str]:
    """The data row of the readout table: TPS, TPF, NFE, forwards/s, seconds, tokens, overhead, wall."""
    return [c.strip() for c in markdown.split("\n")[2].strip("|").split("|")]


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    demo, url, host = launch_app(tmp_path_factory, fps=100)  # fast frames: a short run still streams several
    yield SimpleNamespace(url=url, host=host)
    demo.close()


def direct(app, prompt, config):
    """The same generation straight through the engine, for comparison."""
    with app.host.lock:
        return app.host.get(app.host.default).generate(prompt, config, hooks=RunHooks(trace=True))


def live_frames(frames: list) -> list[dict]:
    """The live grid frames of a streamed /run (heartbeats and plot-only frames skip the grid)."""
    grids = [out(f, "grid") for f in frames]
    return [g["live"] for g in grids if isinstance(g, dict) and "live" in g]


def test_run_streams_live_frames_and_ends_with_the_engine_text(app):
    client = Client(app.url, verbose=False)
    job = client.submit(PROMPT, {"config": SMALL}, "", api_name="/run")
    result = job.result(timeout=120)
    expected = direct(app, PROMPT, GenerationConfig(**SMALL))
    stats, trace = expected.output.stats, expected.output.trace
    assert out(result, "text") == expected.text
    assert out(result, "message").startswith("done")
    assert f"| {stats.tpf:.2f} | {stats.nfe} |" in out(result, "readout") and "engine stats" in out(result, "readout")
    assert out(result, "scrub")["maximum"] == out(result, "scrub")["value"] == len(trace.iterations)  # 0 = before the first forward
    grid = out(result, "grid")
    covered = sum(int(c["t"][2:]) if c["t"].startswith("∎×") else 1 for c in grid["cells"])  # early-stop fill runs are one cell
    assert covered == trace.canvas_length and grid["caption"].startswith(f"iteration {stats.nfe}/{stats.nfe}")
    assert json.loads(out(result, "raster")["plot"])["data"][0]["type"] == "heatmap"
    # Live frames, however many this machine had time for: the first is the canvas before decoding;
    # an API client never reports a painted frame, so each carries the canvas and every commit so far,
    # in the engine's order.
    live = live_frames(job.outputs())
    first = live[0]
    assert first["at"] == -1 and first["frame"] == 0 and first["commits"] == []
    generated = [kind for p, _, kind, _ in first["canvas"] if p >= trace.prompt_lengths[0]]
    assert generated and set(generated) == {"masked"}
    order = [(p, i) for i, rec in enumerate(trace.iterations) for p in rec.committed[0]]
    for frame in live:
        assert frame["canvas"] == first["canvas"] and frame["caption"].startswith(("before", f"iteration {frame['at'] + 1}/"))
        assert [(c[0], c[2]) for c in frame["commits"]] == order[: len(frame["commits"])]
        assert all(c[2] <= frame["at"] for c in frame["commits"]) and f"NFE {frame['at'] + 1} " in frame["stats"]
    assert [f["frame"] for f in live] == list(range(len(live)))


def test_invalid_setting_returns_the_message_and_the_session_goes_on(app):
    client = Client(app.url, verbose=False)
    bad = client.predict(PROMPT, {"config": {"gen_length": 10, "block_length": 3}}, "", api_name="/run")
    assert "gen_length (10) must be a multiple of block_length (3)" in out(bad, "message")
    unknown = client.predict(PROMPT, {"config": {"nonsense": 1}}, "", api_name="/run")
    assert "unknown generation setting" in out(unknown, "message")
    missing = client.predict(PROMPT, {"model": {"path": "/no/such/model"}}, "", api_name="/run")
    assert "model folder not found" in out(missing, "message")
    good = client.predict(PROMPT, {"config": {"gen_length": 8, "block_length": 8}}, "", api_name="/run")
    assert out(good, "message").startswith("done")


def test_stop_cancels_the_engine_and_frees_it(app):
    client = Client(app.url, verbose=False)
    n = 448  # one block of 448 iterations
    with app.host.lock:
        layer = app.host.get(app.host.default).model.layer_modules()[0]
    forwards: list[int] = []
    handle = layer.register_forward_pre_hook(lambda *args: forwards.append(1))
    try:
        job = client.submit(PROMPT, {"config": {"gen_length": n, "block_length": n, "decoder": "fixed", "align_blocks": False}}, "", api_name="/run")
        deadline = time.time() + 120
        while not any(f["at"] >= 3 for f in live_frames(job.outputs())) and time.time() < deadline:
            time.sleep(0.02)
        assert 3 <= live_frames(job.outputs())[-1]["at"] < n - 1  # the engine is decoding
        assert job.cancel()
        assert app.host.lock.acquire(timeout=120)  # the worker holds the lock until the engine returns
        app.host.lock.release()
    finally:
        handle.remove()
    assert len(forwards) < n  # stopped before its last iteration
    deadline = time.time() + 120  # a bound for a loaded machine, not a measurement
    while job.status().code != Status.CANCELLED and time.time() < deadline:
        time.sleep(0.05)
    assert job.status().code == Status.CANCELLED
    after = client.predict(PROMPT, {"config": {"gen_length": 8, "block_length": 8}}, "", api_name="/run")
    assert out(after, "message").startswith("done")


def test_a_slow_live_speed_plays_the_run_back_and_ends_with_the_same_result(app):
    client = Client(app.url, verbose=False)
    config = {"config": {"gen_length": 8, "block_length": 8, "decoder": "fixed", "align_blocks": False}}
    job = client.submit(PROMPT, config, "", 20, api_name="/run")  # 20 iterations a second
    result = job.result(timeout=120)
    shown = [f["at"] for f in live_frames(job.outputs())]
    assert shown == sorted(set(shown)) and out(result, "text") == direct(app, PROMPT, GenerationConfig(**config["config"])).text
    with pytest.raises(AppError, match="not in the list of choices"):  # not one of the offered speeds
        client.predict(PROMPT, config, "", 7, api_name="/run")


def test_trace_download_and_upload_round_trip(app):
    client = Client(app.url, verbose=False)
    result = client.predict(PROMPT, {"config": SMALL}, "", api_name="/run")
    path = out(result, "download")
    trace = Trace.from_json(open(path).read())
    assert trace.model and trace.tokens and len(trace.iterations) == trace.stats["nfe"]
    loaded = client.predict(handle_file(path), api_name="/load_trace")
    assert out(loaded, "message").startswith("loaded a trace")
    assert readout_cells(out(loaded, "readout"))[:7] == readout_cells(out(result, "readout"))[:7]  # all but the UI wall time
    assert out(loaded, "grid") == out(result, "grid")
    replay = client.predict(1, api_name="/replay")  # the session now holds the loaded trace
    assert out(replay, "grid")["caption"].startswith(f"iteration 1/{trace.stats['nfe']}")
    before = client.predict(0, api_name="/replay")
    assert out(before, "grid")["caption"].startswith(f"iteration 0/{trace.stats['nfe']} · before the first forward")


def test_a_trace_loads_and_replays_with_no_model(tmp_path):
    handlers = Handlers(EngineHost(ModelSpec(str(tmp_path / "absent"))))
    handlers.host.preload()
    assert "model folder not found" in handlers.model_status()
    file = tmp_path / "t.json"
    file.write_text(handmade_trace().to_json())
    view = dict(zip(RUN_VIEW, handlers.load_trace(str(file))))
    assert view["message"].startswith("loaded a trace") and len(view["grid"]["cells"]) == 11
    replay = dict(zip(RUN_VIEW, handlers.replay(2, view["state"])))
    assert replay["grid"]["caption"].startswith("iteration 2/4")
    bad = tmp_path / "bad.json"
    bad.write_text('{"version": 99}')
    assert "cannot load this trace" in dict(zip(RUN_VIEW, handlers.load_trace(str(bad))))["message"]


def test_two_sessions_at_once_get_their_own_runs(app):
    prompts = ["Q: 12+34=? A:", "Q: 90-45=? A:"]
    results: dict[int, tuple] = {}

    def session(k: int) -> None:
        client = Client(app.url, verbose=False)
        results[k] = client.predict(prompts[k], {"config": SMALL}, "", api_name="/run")
        results[k + 10] = client.predict(0, api_name="/replay")  # every run has an iteration 0: its canvas before the first forward

    threads = [threading.Thread(target=session, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    for k, prompt in enumerate(prompts):
        assert out(results[k], "text") == direct(app, prompt, GenerationConfig(**SMALL)).text
        prompt_cells = "".join(c["t"] for c in out(results[k + 10], "grid")["cells"] if "prompt" in c["k"].split())
        assert prompt.replace(" ", "·") in prompt_cells  # each session replays its own run


def test_runs_of_sessions_waiting_for_a_busy_engine_join_one_batch_through_the_api(app):
    """Through Gradio's queue, not only the handler: /run calls of three sessions that arrive while
    the engine is busy all wait in the RunBatcher at once (a one-at-a-time queue would hand it one),
    then run as one batch, each with its solo text."""
    prompts = [f"Q: ?+?={n} A:" for n in (57, 12, 83)]  # one prompt length: one batch
    clients = [Client(app.url, verbose=False) for _ in prompts]

    def messages(job) -> list[str]:
        return [str(out(f, "message") or "") for f in job.outputs()]

    with app.host.lock:  # the engine is busy
        jobs = [c.submit(p, {"config": SMALL}, "", api_name="/run") for c, p in zip(clients, prompts)]
        deadline = time.time() + 180  # a bound for a loaded machine, not a measurement
        while not all(any(m.startswith("waiting") for m in messages(j)) for j in jobs) and time.time() < deadline:
            time.sleep(0.05)
        assert all(any(m.startswith("waiting") for m in messages(j)) for j in jobs), [messages(j) for j in jobs]
    results = [j.result(timeout=180) for j in jobs]
    for job, prompt, result in zip(jobs, prompts, results):
        assert any("batched with 2 other sessions' runs" in m for m in messages(job)), messages(job)
        assert out(result, "text") == direct(app, prompt, GenerationConfig(**SMALL)).text


def test_compare_runs_both_settings(app):
    client = Client(app.url, verbose=False)
    a = {"config": {**SMALL, "decoder": "fixed"}}
    b = {"config": {**SMALL, "cache": "dual"}}
    job = client.submit(PROMPT, a, b, "", 2, api_name="/compare")  # two passes a side
    result = job.result(timeout=180)
    message = result[7]
    assert message.startswith("done") and "A: fixed" in message and "B: threshold" in message and "median of 2 passes" in message
    plot = json.loads(result[6]["plot"])
    assert plot["data"][0]["type"] == "scatter" and plot["config"]["toImageButtonOptions"]["format"] == "png"  # the modebar's download
    rows = list(csv.DictReader(open(result[COMPARE_VIEW.index("csv") - 1])))  # gr.State is not part of the API
    expected = {side: direct(app, PROMPT, GenerationConfig(**cfg["config"])) for side, cfg in (("A", a), ("B", b))}
    assert [r["run"] for r in rows] == ["A", "B"] and [r["passes"] for r in rows] == ["2", "2"]
    for r in rows:
        assert r["text"] == expected[r["run"]].text and int(r["nfe"]) == expected[r["run"]].output.stats.nfe
    assert "median of 2 passes" in result[1] and "median of 2 passes" in result[4]  # both readouts say so
    try:  # out of the slider's range: Gradio refuses it, or the handler says so in the page
        refused = client.predict(PROMPT, a, b, "", 9, api_name="/compare")[7]
    except AppError as exc:
        refused = str(exc)
    assert "9" in refused and ("maximum" in refused or "passes must be" in refused)


def test_sweep_reports_accuracy_and_tpf_per_value_and_downloads_csv(app):
    client = Client(app.url, verbose=False)
    chart, table, failures, message, csv, *_ = client.predict(  # later outputs: the wrong-answer counts and filter
        {"config": {"gen_length": 32, "block_length": 16}}, ["add"], 2, "threshold", "0.5, 0.9", "Q: ?+?=57 A:", api_name="/sweep"
    )
    assert message.startswith("done: 6 prompts")  # two held-out prompts and the user's own, at two values
    assert [row[0] for row in table["data"]] == [0.5, 0.9]
    assert all(row[1].endswith("%") and 0 <= float(row[1][:-1]) <= 100 and row[2] >= 1.0 and row[4] == 3 for row in table["data"])
    wrong = round(sum((1 - float(row[1][:-1]) / 100) * row[4] for row in table["data"]))
    assert len(failures["data"]) == wrong
    lines = open(csv).read().splitlines()
    assert lines[0].startswith("threshold,accuracy,correct,prompts") and [line.split(",")[0] for line in lines[1:]] == ["0.5", "0.9"]
    bad = client.predict({}, ["add"], 2, "threshold", "0.5, 7", "", api_name="/sweep")
    assert "threshold must be in (0, 1]" in bad[3]
    stranger = client.predict({}, ["add"], 2, "threshold", "0.9", "Hello there", api_name="/sweep")
    assert "in no task family" in stranger[3]


def test_the_run_exports_as_a_gif_with_one_frame_per_iteration_and_iteration_0(app):
    from PIL import Image

    client = Client(app.url, verbose=False)
    result = client.predict(PROMPT, {"config": SMALL}, "", api_name="/run")
    iterations = out(result, "scrub")["maximum"]
    path, message = client.predict(api_name="/export_gif")
    with Image.open(path) as gif:
        assert gif.format == "GIF" and gif.n_frames == iterations + 1  # the canvas before the first forward, then each iteration
    assert message.startswith(f"animation of {iterations} iterations")
    fresh = Client(app.url, verbose=False)  # a session with nothing to export gets a message, not an error
    assert "nothing to export" in fresh.predict(api_name="/export_gif")[1]
