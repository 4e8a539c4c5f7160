"""Issue #38, items 3 and 4: every app call bounded and stoppable, and limits that apply as stated
(the server's trace store, public mode's system options, the download folder removed at exit, a
bind failure in one line). Decided by events (a lock acquired, a store's length), never timings."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
import uvicorn
from fastapi.testclient import TestClient

import app
from dinfer_viz.live.host import EngineHost, ModelSpec
from dinfer_viz.live.system import offered_options
from dinfer_viz.studies.sweep_study import MAX_PER_SET, MAX_SWEEP_RUNS, MAX_VALUES, PUBLIC_MAX_SWEEP_RUNS
from dinfer_viz.tabs.sweep import SWEEP_VIEW
from dinfer_viz.ui import Handlers
from engine import Engine, EngineError
from engine.cli import DEFAULT_MODEL
from engine.serving.app import create_app
from engine.serving.traces import TraceStore

SETTINGS = {"config": {"gen_length": 16, "block_length": 16}}
HANG_GUARD = 600.0  # seconds: only a broken build waits this long


@pytest.fixture(scope="module")
def handlers() -> Handlers:
    return Handlers(EngineHost(ModelSpec(DEFAULT_MODEL)), fps=1000, plot_hz=1000)


def sweep_message(h: Handlers, per_set: object = 1, values: str = "0.9", passes: object = 1, also: str = "", sets: list[str] | None = None) -> str:
    frames = list(h.sweep(SETTINGS, ["add"] if sets is None else sets, per_set, "threshold", values, "", also, passes))
    return dict(zip(SWEEP_VIEW, frames[-1]))["message"]


def load_message(h: Handlers, **options: object) -> str:
    """The Load button's last line, each system option off unless given."""
    values = [options.get(o.name, o.declared.off) for o in offered_options()]
    return list(h.load_model(DEFAULT_MODEL, "cpu", "auto", *values))[-1]


# ---- item 3: a sweep is bounded before it queues, and a running one stops ---------------------------
@pytest.mark.parametrize(
    "per_set,values,passes,also,fragment",
    [
        (10**9, "0.9", 1, "", f"prompts per set must be from 1 to {MAX_PER_SET}"),
        (float("inf"), "0.9", 1, "", "prompts per set must be a whole number"),
        ("many", "0.9", 1, "", "prompts per set must be a whole number"),
        (1, " ".join(["0.9"] * (MAX_VALUES + 1)), 1, "", f"a sweep takes at most {MAX_VALUES}"),
        (1, "0.9", 10**9, "", "passes must be a whole number from 1 to"),
        (MAX_PER_SET, " ".join(["0.5"] * MAX_VALUES), 5, "tiny-llada-td", f"this server runs at most {MAX_SWEEP_RUNS:,}"),
    ],
)
def test_an_unbounded_sweep_is_refused_in_one_line_and_the_next_load_answers(handlers, per_set, values, passes, also, fragment):
    message = sweep_message(handlers, per_set, values, passes, also, sets=["add", "sub"])
    assert fragment in message and "\n" not in message, message
    assert load_message(handlers).startswith("loaded")  # the engine was never taken


def test_public_visitors_get_the_smaller_sweep_bound():
    public = Handlers(EngineHost(ModelSpec(DEFAULT_MODEL), allowed={}))
    runs = 300 * 11  # over the public bound, under the private one
    assert PUBLIC_MAX_SWEEP_RUNS < runs < MAX_SWEEP_RUNS
    message = sweep_message(public, 300, " ".join(["0.9"] * 11))
    assert f"this server runs at most {PUBLIC_MAX_SWEEP_RUNS:,}" in message


def test_a_running_sweep_stops_when_closed_and_frees_the_engine(handlers):
    """Gradio's Stop closes the handler's generator; the sweep then cancels its run, the worker
    lets the engine go, and a load (which takes the engine lock) answers."""
    frames = handlers.sweep(SETTINGS, ["add", "sub"], MAX_PER_SET, "threshold", "0.5 0.7 0.9", "", "", 1)
    for frame in frames:
        if "prompts run" in dict(zip(SWEEP_VIEW, frame))["message"]:
            break  # the sweep is under way, holding the engine
    else:
        pytest.fail("the sweep ended before it was stopped")
    frames.close()
    assert handlers.host.lock.acquire(timeout=HANG_GUARD)
    handlers.host.lock.release()
    assert load_message(handlers).startswith("loaded")


# ---- item 4: the server's trace store takes its flags ----------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_max_traces_20_keeps_20(monkeypatch):
    """`python -m engine serve --max-traces 20 --max-trace-mb 1`: 25 rows later, the store holds
    the newest 20 and the oldest 5 are gone (the app is driven in-process instead of by uvicorn)."""
    from engine.__main__ import main

    seen: dict = {}

    def drive(self: uvicorn.Server, sockets: list[socket.socket] | None = None) -> None:
        with TestClient(self.config.app) as client:
            ids = []
            for rows in (16, 9):
                body = {"prompt": [f"Q: {i}+1=? A:" for i in range(rows)], "max_tokens": 8, "gen_length": 8, "block_length": 8}
                reply = client.post("/v1/completions", json=body)
                assert reply.status_code == 200, reply.text
                ids += [choice["trace_id"] for choice in reply.json()["choices"]]
            seen["status"] = [client.get(f"/v1/traces/{t}").status_code for t in ids]
            seen["store"] = self.config.app.state.server.traces

    monkeypatch.setattr(uvicorn.Server, "run", drive)
    assert main(["serve", "--max-traces", "20", "--max-trace-mb", "1", "--port", str(free_port())]) == 0
    store = seen["store"]
    assert len(store) == 20 and (store.max_traces, store.max_bytes) == (20, 1 << 20)
    assert seen["status"] == [404] * 5 + [200] * 20


def test_an_empty_store_given_to_the_app_is_the_one_it_uses():
    """The bug: `traces or TraceStore()` took an empty (falsy) store for none and built the default."""
    engine = Engine(DEFAULT_MODEL)
    one = TraceStore(max_traces=1, max_bytes=1)
    assert create_app(engine, traces=one).state.server.traces is one


# ---- item 4: public mode's allow-list covers system options ----------------------------------------
@pytest.mark.parametrize("option,value", [("tp_size", 2), ("compile", True)])
def test_public_visitors_start_no_worker_processes_or_compilation(option, value):
    public = Handlers(EngineHost(ModelSpec(DEFAULT_MODEL), allowed={}))
    model = {"path": DEFAULT_MODEL, option: value}
    with pytest.raises(EngineError, match=f"does not offer it to visitors .*--allow-system {option}"):
        public.parse({"model": model})
    allowed = Handlers(EngineHost(ModelSpec(DEFAULT_MODEL), allowed={}), allow_system=[option])
    assert dict(allowed.parse({"model": model})[0].options) == {option: value}
    private = Handlers(EngineHost(ModelSpec(DEFAULT_MODEL)))  # the app's own user: every option the machine can
    assert dict(private.parse({"model": model})[0].options) == {option: value}


def test_the_load_button_refuses_them_in_one_line_before_any_process_starts():
    public = Handlers(EngineHost(ModelSpec(DEFAULT_MODEL), allowed={}))
    message = load_message(public, tp_size=2)
    assert "does not offer it to visitors" in message and "\n" not in message
    assert not public.host.is_loaded(ModelSpec(DEFAULT_MODEL, options=(("tp_size", 2),)))


# ---- item 4: app.py's download folder and its bind failure -----------------------------------------
def test_the_download_folder_is_removed_when_the_app_stops(monkeypatch):
    """Whatever ends the launch (Ctrl+C here), the folder the handlers wrote to is gone after."""
    import dinfer_viz.ui

    written: list[Path] = []

    class Demo:
        def __init__(self, handlers: Handlers) -> None:
            self.handlers = handlers

        def launch(self, **kwargs: object) -> None:
            written.append(Path(self.handlers.write_file("trace", ".json", "{}")))
            raise KeyboardInterrupt

    monkeypatch.setattr(dinfer_viz.ui, "build_demo", Demo)
    with pytest.raises(KeyboardInterrupt):
        app.main(["--no-model", "--port", str(free_port())])
    assert written and not written[0].exists() and not written[0].parent.exists()


def test_app_with_an_address_it_cannot_bind_says_so_in_one_line_and_exits(capsys):
    """The real program: one line on stderr and status 2, at once (it used to retry forever). An
    address of TEST-NET-1 (never this machine's) through the program; a name that never resolves
    through the same main() in this process (the refusal comes before the app builds anything)."""
    host = "192.0.2.1"
    done = subprocess.run([sys.executable, "app.py", "--host", host, "--no-model"], cwd=Path(app.__file__).parent, capture_output=True, text=True, timeout=HANG_GUARD)
    assert done.returncode == 2
    assert done.stderr.startswith(f"error: cannot listen on {host}") and done.stderr.count("\n") == 1, done.stderr
    assert app.main(["--host", "no-such-host.invalid", "--no-model"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot listen on no-such-host.invalid") and err.count("\n") == 1, err
