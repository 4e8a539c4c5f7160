"""#43 item 1: a constraint's automaton is built in a child process with a deadline and a memory
bound (engine/constraints/bounded.py), so no request can hold the process it is in, whatever
outlines-core does with it; the same bound answers the Python API, the CLI, the app's page and the
server, each in one line, and leaves no process behind.

PATHOLOGICAL passes every bound read off its structure (its repetition counts are small) and
determinizes to 2^25 states: outlines-core builds it for minutes and gigabytes. Which bound ends
it is decided by the bounds each test sets (a small memory bound and a long deadline, or the
reverse), and "while it builds" by the engine's own count of builds under way, never by a timing.
"""

from __future__ import annotations

import re
import threading
import time

import httpx
import pytest

from engine import Engine, EngineError, GenerationConfig
from engine.__main__ import main as cli_main
from engine.constraints import bounded, vocabulary
from engine.constraints.spec import structural_bound

from .app_support import random_char_model

PATHOLOGICAL = "(a|b)*a(a|b){24}"
BOUNDS = re.compile(r"took longer than \d+ s of CPU time and was stopped|needed more than [\d.]+ GiB of memory and was stopped")


@pytest.fixture(scope="module")
def engine(tmp_path_factory) -> Engine:
    return Engine(random_char_model(tmp_path_factory.mktemp("char-model")))


def builds(marker: str = "(a|b)*a") -> list[str]:
    """The pathological builds under way (a server's start-up build of json_object's grammar may be
    under way beside them); each is listed until its child has been killed and reaped."""
    return [what for what in bounded.building() if marker in what]


def test_the_pathological_regex_gets_past_the_structural_bound():
    assert structural_bound(PATHOLOGICAL) < 100  # so only the build's own bounds can stop it


@pytest.fixture(autouse=True)
def own_slots(monkeypatch):
    """Build slots of each test's own: a build another test of this process left running (a
    server's or the page's, on its thread, to its 120 s deadline) takes none of them, so the bound
    a test sets is what ends its build, not a wait for a slot (seen in two fresh-clone CI runs)."""
    monkeypatch.setattr(bounded, "_slots", threading.BoundedSemaphore(bounded.MAX_BUILDS))


@pytest.fixture(autouse=True)
def no_start_up_build_outlives_its_test():
    """A server's start-up build of json_object's grammar (its thread, "constraint-warm") ends with
    the test that started the server: it runs under that test's bounds (20 s in one), and a later
    test's start-up build of the same grammar waits for it rather than build twice, so its failure
    there became the later test's "the start-up build failed" (a fresh-clone CI run under load)."""
    before = set(threading.enumerate())  # another module's (its own bounds): not this test's to wait for
    yield
    for warm in [t for t in threading.enumerate() if t.name == "constraint-warm" and t not in before]:
        warm.join(timeout=540)  # a bound on a hang, not a pace: the build's own deadline ends it first
        assert not warm.is_alive(), "a server's start-up build never ended"


def test_a_build_past_its_memory_bound_is_stopped_in_one_line(monkeypatch):
    monkeypatch.setattr(bounded, "MEMORY_BYTES", 256 << 20)
    monkeypatch.setattr(bounded, "DEADLINE_S", 600.0)  # far beyond what 256 MiB lasts: memory ends it
    with pytest.raises(EngineError, match=r"needed more than 0.25 GiB of memory and was stopped") as caught:
        GenerationConfig(regex=PATHOLOGICAL).validate()
    assert "\n" not in str(caught.value) and not builds()


def test_a_build_past_its_deadline_is_killed_in_one_line(monkeypatch):
    monkeypatch.setattr(bounded, "DEADLINE_S", 1.0)  # the 2 GiB the build may use last far longer
    with pytest.raises(EngineError, match=r"took longer than 1 s of CPU time and was stopped") as caught:
        GenerationConfig(regex=PATHOLOGICAL + "c").validate()
    assert "\n" not in str(caught.value) and not builds()


def idle_for(seconds: float) -> str:
    """A build that takes wall time and no CPU (run in a bounded child)."""
    time.sleep(seconds)
    return "slept"


def test_the_deadline_counts_the_builds_cpu_time_and_the_wall_bound_only_a_hang(monkeypatch):
    """A build's own CPU time is what its deadline bounds, so a machine busy with other work (a
    build's wall time stretched) fails no build: one idle past the deadline in wall time still
    answers. The wall bound ends a build that never finishes, in one line of its own."""
    monkeypatch.setattr(bounded, "DEADLINE_S", 1.0)
    assert bounded.run_bounded("an idle build", idle_for, 2.5) == "slept"  # 2.5 s of wall, no CPU
    monkeypatch.setattr(bounded, "WALL_BOUND_S", 1.0)
    with pytest.raises(EngineError, match=r"^a hung build: compiling its automaton took longer than 1 s and was stopped; the machine is busy") as caught:
        bounded.run_bounded("a hung build", idle_for, 60.0)
    # its child killed and reaped (another module's server may still be building json_object's grammar)
    assert "\n" not in str(caught.value) and "a hung build" not in bounded.building()


def test_the_builds_answers_are_the_ones_outlines_core_gives(engine):
    """Errors cross the process as the same one line; an automaton comes back whole and cached
    per vocabulary, and a second request for it builds nothing."""
    with pytest.raises(EngineError, match=r"invalid regex '\(\[a'"):
        GenerationConfig(regex="([a").validate()
    with pytest.raises(EngineError, match="matches no text"):
        GenerationConfig(regex="a{0}b{0}[^\\x00-\\U0010FFFF]").validate()
    automaton = engine.vocabulary.automaton("[0-9]{2}")
    assert automaton.shortest() == 2 and engine.vocabulary.automaton("[0-9]{2}") is automaton
    out = engine.generate("Q: 1+1=? A:", GenerationConfig(regex="[0-9]{2}", gen_length=8, block_length=8))
    assert re.fullmatch("[0-9]{2}", out.texts[0])


def test_the_cli_answers_the_bound_in_one_line(engine, monkeypatch, capsys):
    monkeypatch.setattr(bounded, "DEADLINE_S", 1.0)
    code = cli_main(["generate", "--model", engine.path, "--prompt", "Q", "--regex", PATHOLOGICAL + "d", "--gen-length", "8", "--block-length", "8"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("error:") and BOUNDS.search(err) and "\n" not in err and not builds()


def test_the_page_answers_the_bound_in_one_line(engine, monkeypatch):
    from dinfer_viz.live.host import EngineHost, ModelSpec
    from dinfer_viz.settings import CONSTRAINT, CONSTRAINT_TEXT
    from dinfer_viz.tabs.run import RUN_VIEW
    from dinfer_viz.ui import Handlers

    monkeypatch.setattr(bounded, "DEADLINE_S", 1.0)
    handlers = Handlers(EngineHost(ModelSpec(engine.path)), fps=1000, plot_hz=1000)
    frames = list(handlers.run("Q", {"config": {"gen_length": 8, "block_length": 8, CONSTRAINT: "regex", CONSTRAINT_TEXT: PATHOLOGICAL + "e"}}))
    message = str(frames[-1][RUN_VIEW.index("message")])
    assert BOUNDS.search(message) and "internal error" not in message and not builds()


def test_the_server_answers_others_while_one_constraint_builds_and_ends_it_in_one_line(engine, monkeypatch):
    """While the pathological build is under way (the engine's count of builds, observed before and
    after), GET /v1/models is answered; the constrained request then ends at its bound with a 400."""
    from .test_constraints_serve import serve

    # 5 s of the build's own CPU: long past an answer to GET /models (milliseconds), and every
    # second of it is a second of CPU the suite waits for (it was 20)
    monkeypatch.setattr(bounded, "DEADLINE_S", 5.0)
    for client in serve(engine):
        http = httpx.Client(base_url=str(client.base_url), timeout=600)
        reply: dict = {}
        body = {"model": client.model, "prompt": "Q", "max_tokens": 8, "gen_length": 8, "block_length": 8, "structured_outputs": {"regex": PATHOLOGICAL + "f"}}
        slow = threading.Thread(target=lambda: reply.update(r=http.post("/completions", json=body)))
        slow.start()
        while not builds():  # until its build is under way (its child started)
            assert slow.is_alive(), "the request ended before its build was seen"
            time.sleep(0.05)
        asked = time.monotonic()
        models = http.get("/models")
        answered = time.monotonic() - asked
        still = builds()
        slow.join()
        assert models.status_code == 200 and still  # answered while the build went on
        print(f"GET /v1/models while a constraint built: answered in {answered * 1000:.0f} ms")  # printed, never asserted
        message = reply["r"].json()["error"]["message"]
        assert reply["r"].status_code == 400 and BOUNDS.search(message) and "\n" not in message
    assert not builds()


def test_the_server_builds_json_objects_grammar_at_start_so_no_request_waits_for_it(engine, monkeypatch):
    """json_object's generic grammar (12-30 s of outlines-core here) is built in the background as
    the server starts: once built, a json_object request starts no build of its own."""
    from engine.constraints.spec import JSON_OBJECT, ConstraintSpec

    from .test_constraints_serve import serve

    regex = ConstraintSpec("json_schema", JSON_OBJECT).regex()
    calls = []
    real = bounded.run_bounded
    for client in serve(engine):
        for warm in [t for t in threading.enumerate() if t.name == "constraint-warm"]:  # none: it has ended
            warm.join(timeout=540)  # a bound on a hang, not a pace (below the test's own 600 s)
            assert not warm.is_alive(), "the start-up build never ended"
        assert regex in engine.vocabulary._compiled, "the start-up build failed"  # built with no request made
        counted = lambda *args: calls.append(args[0]) or real(*args)  # noqa: E731 (every build still runs)
        monkeypatch.setattr(bounded, "run_bounded", counted)
        monkeypatch.setattr(vocabulary, "run_bounded", counted)
        http = httpx.Client(base_url=str(client.base_url), timeout=600)
        body = {"model": client.model, "prompt": "Q", "max_tokens": 32, "gen_length": 32, "block_length": 32, "response_format": {"type": "json_object"}}
        reply = http.post("/completions", json=body)
        assert reply.status_code == 200 and calls == [], (reply.text, calls)

