"""Decoding that follows the load along a tuned front (engine/serving/front.py, docs/serving.md §7):
the controller's rule on synthetic latencies, the front file's checks, `tune --front-out` writing
what `serve --front` reads, and a real server whose controller is fed so that every answer is
over its target: each next request runs the next point, reports it and counts it in /metrics, and
gets the tokens the engine gives that point's settings alone. Nothing reads a clock: the
controller's steps are decided by the answers' count, not their times."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from engine import Engine, GenerationConfig
from engine.__main__ import main
from engine.cli import DEFAULT_MODEL
from engine.errors import EngineError
from engine.models import model_skeleton
from engine.serving.app import create_app
from engine.serving.front import Front, FrontFollower, LoadFollower, p95, read_front

from .test_serve import LIMITS, running
from .test_serve_metrics import parsed, value

TARGET = 1.0  # seconds: synthetic latencies are set against it
POINTS = [{"threshold": 0.95, "block_length": 8}, {"threshold": 0.5, "block_length": 8}]  # the embedded model runs both


def test_p95_is_a_value_by_nearest_rank():
    assert p95([3.0]) == 3.0
    assert p95([1.0] * 19 + [9.0]) == 1.0  # one slow answer in 20 is the 5% the p95 leaves out
    assert p95([1.0] * 18 + [9.0, 9.0]) == 9.0


def test_over_the_target_steps_toward_the_fastest_point_once_per_window():
    follow = LoadFollower(3, TARGET, window=4, least=2)
    assert follow.observe(5.0, waiting=3) == 0  # one answer is not enough to judge
    assert follow.observe(5.0, waiting=3) == 1
    assert follow.latencies == []  # the next step is judged on the new point's own answers
    assert follow.observe(5.0, waiting=3) == 1
    assert follow.observe(5.0, waiting=3) == 2
    assert [follow.observe(5.0, waiting=3) for _ in range(4)] == [2] * 4  # the fastest point is the last


def test_back_toward_accuracy_only_a_margin_below_the_target_and_with_nothing_waiting():
    follow = LoadFollower(2, TARGET, window=4, least=2, margin=0.2, point=1)
    assert [follow.observe(0.9, waiting=0) for _ in range(4)] == [1] * 4  # under the target, within the margin: stays
    assert [follow.observe(0.1, waiting=1) for _ in range(4)] == [1] * 4  # fast, but rows wait: stays
    assert follow.observe(0.1, waiting=0) == 0  # fast and nothing waiting: back
    follow = LoadFollower(2, TARGET, window=3, least=2, margin=0.2, point=1)
    assert follow.observe(0.9, waiting=0) == 1
    assert follow.observe(0.1, waiting=0) == 1  # p95 of (0.9, 0.1) is 0.9: within the margin
    assert follow.observe(0.1, waiting=0) == 0  # the latest two are fast


def test_after_a_burst_the_latest_answers_bring_it_back_not_the_whole_window():
    """A window counts answers, not seconds: the burst's slow answers still fill most of it when the
    load has gone, and the step back is judged on the latest `least` answers."""
    follow = LoadFollower(3, TARGET, window=20, least=5, point=2)
    assert [follow.observe(5.0, waiting=4) for _ in range(15)] == [2] * 15  # the fastest point: no further
    assert [follow.observe(0.1, waiting=0) for _ in range(5)] == [2, 2, 2, 2, 1]


@pytest.mark.parametrize("bad", [dict(points=0), dict(target_s=0.0), dict(least=5, window=4), dict(margin=1.0)])
def test_a_controller_of_no_sense_is_refused(bad):
    with pytest.raises(EngineError):
        LoadFollower(**{"points": 2, "target_s": TARGET, **bad})


def write(path, data) -> str:
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


@pytest.mark.parametrize("data, words", [
    ("{not json", "is not JSON"),
    ({"front": []}, "holds no front"),
    ({"front": [{"accuracy": 1.0}]}, "holds no front"),
    ({"front": [{"config": {"threshold": 0.9}}, {"config": {"decoder": "sideways"}}]}, "--front point 1"),
    ({"front": [{"config": {"threshold": 7}}]}, "--front point 0"),
    ({"front": [{"config": {"decoder": "wino", "cache": "dual"}}]}, "--front point 0"),
])
def test_a_front_the_model_does_not_run_is_refused_in_one_line(data, words, tmp_path):
    with pytest.raises(EngineError) as refused:
        read_front(write(tmp_path / "front.json", data), model_skeleton(DEFAULT_MODEL))
    assert words in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize("argv, words", [
    (["--front", "{file}"], "--front and --target-p95-ms go together"),
    (["--target-p95-ms", "100"], "--front and --target-p95-ms go together"),
    (["--front", "{file}", "--target-p95-ms", "0"], "--target-p95-ms must be a positive number"),
    (["--front", "{bad}", "--target-p95-ms", "100"], "--front point 0"),
    (["--front", "/dev/zero", "--target-p95-ms", "100"], "is not a regular file"),
])
def test_serve_refuses_a_bad_front_in_one_line_and_exit_2(argv, words, tmp_path, capsys):
    good = write(tmp_path / "good.json", {"front": [{"config": p} for p in POINTS]})
    bad = write(tmp_path / "bad.json", {"front": [{"config": {"threshold": -1}}]})
    argv = [a.format(file=good, bad=bad) for a in argv]
    assert main(["serve", "--port", "1", *argv]) == 2  # refused before the port (1: a privileged one, never bound) or the model
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1 and "Traceback" not in err


def test_tune_writes_the_front_serve_reads_most_accurate_first(tmp_path, capsys):
    out = tmp_path / "front.json"
    argv = ["tune", "--storage", f"sqlite:///{tmp_path}/t.db", "--trials", "3", "--prompts", "1", "--fix", "gen_length=32", "--fix", "cache=none",
            "--decoders", "threshold,fixed", "--json", "--front-out", str(out)]
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    written = json.loads(out.read_text())
    assert written["front"] == result["front"] and written["study"] == result["study"]
    tpf = [p["tpf"] for p in written["front"]]
    assert tpf == sorted(tpf)  # fewest tokens per forward (the most accurate) first
    front = read_front(str(out), model_skeleton(DEFAULT_MODEL))
    assert front.settings == [{k: v for k, v in p["config"].items() if k != "gen_length"} for p in written["front"]]


def test_tune_refuses_a_front_out_in_no_folder_before_the_study(tmp_path, capsys):
    argv = ["tune", "--storage", f"sqlite:///{tmp_path}/t.db", "--trials", "1", "--prompts", "1", "--front-out", str(tmp_path / "no" / "front.json")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--front-out" in err and err.count("\n") == 1 and not (tmp_path / "t.db").exists()


@pytest.fixture(scope="module")
def following() -> Iterator[tuple[Engine, str, FrontFollower]]:
    """A server following a front of two points, its controller judging on each answer (least 1)
    against a target every answer exceeds: after each answer, new requests get the next point."""
    engine = Engine(DEFAULT_MODEL)
    front = FrontFollower(Front(POINTS, [{}, {}]), LoadFollower(2, 1e-9, window=4, least=1))
    app = create_app(engine, LIMITS, traces=None, front=front)
    with running(app) as url:
        yield engine, url, front


def ask(url: str, **body: object) -> dict:
    """A completion whose canvas the request sets (a setting no point sets: it still follows the front)."""
    response = httpx.post(url + "/completions", json={"prompt": "Q: 14+5=? A:", "max_tokens": 32, "gen_length": 32, **body}, timeout=600)
    assert response.status_code == 200, response.text
    return response.json()


def test_each_new_request_runs_the_point_the_answers_so_far_moved_to(following):
    engine, url, front = following
    metrics_url = url.removesuffix("/v1") + "/metrics"
    before = parsed(httpx.get(metrics_url).text)
    assert front.follower.point == 0
    answers = [ask(url), ask(url), ask(url, threshold=0.7)]  # the third sets its own threshold
    used = [a["choices"][0] for a in answers]
    assert [c["front_point"] for c in used] == [0, 1, None]
    assert used[0]["front_settings"] == POINTS[0] and used[1]["front_settings"] == POINTS[1] and "front_settings" not in used[2]
    for answer, settings in zip(answers, [POINTS[0], POINTS[1], {"threshold": 0.7}]):  # each the engine's own run of its settings
        alone = engine.generate("Q: 14+5=? A:", GenerationConfig(gen_length=32, use_chat_template=False, **settings))
        assert answer["choices"][0]["text"] == alone.text
        assert answer["usage"]["forwards"] == alone.output.stats.nfe
    assert answers[0]["usage"]["forwards"] > answers[1]["usage"]["forwards"]  # the faster point ran fewer forwards
    after = parsed(httpx.get(metrics_url).text)
    counts = {p: value(after, "dinfer_front_point_answers_total", point=p) - value(before, "dinfer_front_point_answers_total", point=p) for p in ("0", "1", "own")}
    assert counts == {"0": 1, "1": 1, "own": 1}


def test_a_streamed_answer_reports_its_point_in_its_rows_last_chunk(following):
    engine, url, front = following
    point = front.follower.point
    body = {"prompt": "Q: 9+9=? A:", "max_tokens": 32, "gen_length": 32, "stream": True}
    with httpx.stream("POST", url + "/completions", json=body, timeout=600) as response:
        events = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]
    last = events[-1]["choices"][0]
    assert last["finish_reason"] is not None and last["front_point"] == point and last["front_settings"] == POINTS[point]
