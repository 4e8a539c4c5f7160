"""The Tune tab's handlers without a browser (issue #45 item 3; the page itself:
tests/test_tune_browser.py): a study streams one frame per finished trial with the front so far,
a clicked trial puts its settings on the Run tab's controls, Stop ends the study within its running
trial, and a study over the sweep's bounds (public mode's too) is refused in one line. Decided by
the frames the handler yields, never by timing."""

from __future__ import annotations

import os
import re
import threading
from types import SimpleNamespace

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import pytest

from dinfer_viz.live.host import EngineHost, ModelSpec
from dinfer_viz.settings import all_controls
from dinfer_viz.tabs.tune import TUNE_VIEW
from dinfer_viz.studies.tuning import PUBLIC_MAX_TUNE_SECONDS, PUBLIC_MAX_TUNE_TRIALS, TuneState, check_budget
from dinfer_viz.ui import Handlers
from engine import EngineError

from .app_support import app_model

COUNT = re.compile(r"^(?:done: |stopped: )?(\d+) trials? completed")


@pytest.fixture(scope="module")
def handlers(tmp_path_factory) -> Handlers:
    return Handlers(EngineHost(ModelSpec(app_model(tmp_path_factory))))


def _frames(handlers, trials: int, request=None, fix: str = "gen_length=32") -> object:
    return handlers.tune({"config": {}}, "", ["pairsum"], 1, trials, 300, 0, ["threshold", "fixed"], fix, "", request=request)


def test_a_study_streams_each_trial_and_its_front_then_a_csv_and_a_trial_opens_on_the_run_tab(handlers):
    frames = [dict(zip(TUNE_VIEW, f)) for f in _frames(handlers, 4)]
    counts = [int(m[1]) for f in frames if isinstance(f["message"], str) and (m := COUNT.match(f["message"]))]
    assert counts == sorted(counts) and counts[-1] == 4 and len(set(counts)) == 4  # a frame for each finished trial
    last = frames[-1]
    state: TuneState = last["state"]
    assert last["message"].startswith("done: 4 trials completed") and state.done and state.front
    assert all(state.point(n).held_out is not None for n in state.front)  # each front point judged held-out
    assert state.default is not None and state.default.prompts == 1
    csv = open(last["csv"], encoding="utf-8").read().splitlines()
    assert csv[0].startswith("trial,accuracy,tpf") and len(csv) == 1 + len(state.front)
    assert len(last["table"]) == len(state.front)
    chart = last["chart"]
    assert [len(t.x) for t in chart.data][2] == len(state.front) and all("trial" in h for h in chart.data[2].hovertext)

    number = state.front[0]
    opened = handlers.open_trial(state, "Q: ?+?=38 A:", SimpleNamespace(index=number))
    message, prompt, expected = opened[:3]
    # pair-sum has many right answers: the page fills the expected box with none of them (#54 item 4)
    assert message == f"trial {number} opened on the Run tab with its settings" and prompt == "Q: ?+?=38 A:" and expected == ""
    assert handlers.open_trial(state, "Q: 7+58=? A:", SimpleNamespace(index=number))[2] == "   7+ 58=  65"  # arithmetic: its one answer
    controls = dict(zip([c.field for c in all_controls()], opened[5:]))
    config = state.point(number).config
    assert controls["gen_length"] == 32 and controls["decoder"] == config.get("decoder", "threshold")
    refused = handlers.open_trial(state, "Q: ?+?=38 A:", SimpleNamespace(index=999))
    assert "no completed trial 999" in refused[0]


def test_stop_ends_the_study_within_its_running_trial(handlers):
    request = SimpleNamespace(session_hash="tune-stop")
    frames = _frames(handlers, 200, request, fix="gen_length=64")
    seen: list[str] = []
    for frame in frames:  # Stop as soon as the page shows the first finished trial
        seen.append(dict(zip(TUNE_VIEW, frame))["message"])
        if isinstance(seen[-1], str) and COUNT.match(seen[-1]):
            break
    stopper = threading.Thread(target=handlers.stop_quietly, args=(None, None, request))
    stopper.start()  # it waits for the stream's last frame, which the loop below takes
    seen += [dict(zip(TUNE_VIEW, f))["message"] for f in frames]
    stopper.join()
    assert seen[-1].startswith("stopped: ") and int(COUNT.match(seen[-1])[1]) < 200
    assert handlers.host.lock.acquire(timeout=120)  # the study's engine worker let go
    handlers.host.lock.release()


def test_a_study_over_the_bounds_is_refused_in_one_line(handlers):
    public = EngineHost(ModelSpec("/never-loaded"), allowed={})
    for host, trials, seconds, prompts, words in (
        (public, PUBLIC_MAX_TUNE_TRIALS + 1, 60, 1, "trials must be from 1 to 60"),
        (public, 10, PUBLIC_MAX_TUNE_SECONDS + 1, 1, "at most 600 seconds"),
        (public, 60, 600, 30, "could run the engine"),  # 60 x 30 + 61 x 30 > public mode's 3,000 runs
        (handlers.host, 0, 60, 1, "trials must be from 1"),
    ):
        with pytest.raises(EngineError, match=words) as caught:
            check_budget(host, trials, seconds, prompts, prompts)
        assert "\n" not in str(caught.value)
    frames = [dict(zip(TUNE_VIEW, f)) for f in handlers.tune({"config": {}}, "", [], 1, 4, 60)]
    assert len(frames) == 1 and "choose at least one task family" in frames[0]["message"]


def test_the_tabs_refusals_are_the_commands_lines_escaped(handlers):
    for seed, fix, words in ((0, "<img src=x onerror=alert(1)>=1", "no setting"), (-1, "gen_length=32", "the seed must be from 0"), (2**70, "gen_length=32", "the seed must be from 0")):
        frames = [dict(zip(TUNE_VIEW, f)) for f in handlers.tune({"config": {}}, "", ["pairsum"], 1, 2, 60, seed, [], fix, "")]
        message = frames[0]["message"]
        assert len(frames) == 1 and words in message and "<img" not in message and "\n" not in message
