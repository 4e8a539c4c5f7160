"""The runner: frames paced by time and by what the page painted (first and last always), the
playback speed, cancel on close, the shared lock. Every check reads the engine's events (records,
frame numbers), never how fast this machine is."""

from __future__ import annotations

import pytest

from dinfer_viz.live.host import EngineHost, ModelSpec
from dinfer_viz.live.runner import MAX_UNPAINTED, REPORT_GRACE_SECONDS, FrameClock, PagePacer, Playback, acknowledge, run_live
from engine import GenerationConfig

from .app_support import app_model

PROMPT = "Q: 48+57=? A:"


@pytest.fixture(scope="module")
def host(tmp_path_factory) -> EngineHost:
    host = EngineHost(ModelSpec(app_model(tmp_path_factory)))
    host.preload()
    return host


def test_frame_clock_limits_rates():
    clock = FrameClock(fps=10, plot_hz=2)
    assert clock.tick(0.0) == (True, True)
    assert clock.tick(0.05) == (False, False)  # too soon for a frame
    assert clock.tick(0.1) == (True, False)  # a frame, but plots wait for 0.5 s
    assert clock.wait(0.15) == pytest.approx(0.05)
    assert clock.tick(0.5) == (True, True)
    assert clock.tick(0.51, force=True) == (True, True)  # the final frame always goes
    for _ in range(50):  # frames with plots keep taking 0.2 s of UI time: at a 25% budget, one per 0.8 s
        clock.spent(0.2, plots=True)
        clock.spent(0.05, plots=False)
    assert clock.plot_interval == pytest.approx(0.8) and clock.frame_interval == pytest.approx(0.2)
    assert clock.tick(0.6) == (False, False) and clock.tick(0.72) == (True, False) and clock.tick(1.32) == (True, True)
    clock.spent(30.0, plots=False)  # one pathological frame: smoothed, and the gap is capped
    assert clock.frame_interval == clock.MAX_FRAME_GAP


def test_frame_clock_holds_plots_back_without_spending_their_turn():
    clock = FrameClock(fps=10, plot_hz=2)
    assert clock.tick(0.0) == (True, True)
    assert clock.tick(1.0, plots_allowed=False) == (True, False)  # the page is still painting
    assert clock.tick(1.1) == (True, True)  # the plots' turn was kept


def test_runs_of_one_batch_share_the_frame_rate_and_the_servers_budget():
    clock = FrameClock(fps=20, plot_hz=4)
    clock.share(4)  # four sessions' runs in one engine batch: together, one run's frames
    assert clock.frame_interval == pytest.approx(0.2) and clock.plot_interval == pytest.approx(1.0)
    for _ in range(50):
        clock.spent(0.05, plots=False)  # at a quarter of the 25% budget: one frame per 0.8 s
    assert clock.frame_interval == pytest.approx(0.8)


def test_page_pacer_keeps_the_page_at_most_one_frame_behind():
    pacer = PagePacer()
    assert pacer.send(0, True, 0.0) == (0, -1)  # the canvas: the page holds nothing
    assert pacer.may_send(0.0)  # no report yet (an API client never sends one): the clock alone decides
    pacer.painted(0, 0.1)
    assert pacer.send(3, False, 0.2) == (1, 0)  # the changes since frame 0, which showed no record
    assert pacer.may_send(0.0) and pacer.send(5, False, 0.3) == (2, 0)  # the page is one frame behind
    assert not pacer.may_send(0.0) and MAX_UNPAINTED == 2  # frames 1 and 2 in flight: wait
    pacer.painted(1, 0.4)
    assert pacer.may_send(0.0) and pacer.send(7, False, 0.5) == (3, 3)  # the changes since frame 1 (3 records)
    pacer.painted(99, 0.6)  # never beyond what was sent
    assert pacer.latest == 1
    pacer.painted(-1, 0.7)  # the page lost its grid: the next frame carries everything
    assert pacer.may_send(0.0) and pacer.send(9, False, 0.8) == (4, -1)


def test_a_lost_report_costs_the_grace_period_not_the_live_view():
    """A page that stops reporting (a failed request, a hidden tab) gets one whole frame after
    REPORT_GRACE_SECONDS of silence, then one per such interval; a report resumes the pacing."""
    pacer = PagePacer()
    pacer.send(0, True, 0.0)
    pacer.painted(0, 1.0)
    pacer.send(2, False, 1.0)
    pacer.send(4, False, 1.1)  # frames 1 and 2 in flight: their reports never come
    silent = 1.0 + REPORT_GRACE_SECONDS
    assert not pacer.may_send(silent - 0.01) and pacer.may_send(silent)
    assert pacer.send(6, False, silent) == (3, -1)  # the page's state is unknown: everything
    assert not pacer.may_send(silent + 1.0) and pacer.may_send(silent + REPORT_GRACE_SECONDS)
    pacer.painted(3, silent + 1.5)  # it reports again: paced as before, deltas since frame 3
    assert pacer.may_send(silent + 1.6) and pacer.send(8, False, silent + 1.6) == (4, 6)


def test_page_pacer_gives_plots_a_quarter_of_the_page():
    pacer = PagePacer()
    pacer.send(0, True, 0.0)
    pacer.painted(0, 1.0)  # a frame with plots took the page a second
    pacer.send(1, False, 1.0)
    assert not pacer.plots_allowed(1.5)  # frame 1 is not painted yet
    pacer.painted(1, 1.5)
    assert not pacer.plots_allowed(3.9) and pacer.plots_allowed(4.0)  # 1 s of plots, then 3 s without


def test_playback_shows_the_records_at_its_speed_and_never_more_than_arrived():
    assert Playback(0).shown(17, 0.0) == 17  # as fast as the engine
    slow = Playback(2)
    assert slow.shown(10, 0.0) == 0
    assert slow.shown(10, 1.0) == 2
    assert slow.shown(3, 5.0) == 3  # the engine is slower than the playback: follow it
    assert slow.shown(10, 5.5) == 4
    assert slow.wait(10) == pytest.approx(0.5)  # the next record shows in half a second
    assert Playback(0).wait(10) == float("inf") and slow.wait(4) == float("inf")  # nothing to wait for


def test_frames_show_the_engine_records_in_order_and_the_last_is_the_engine_result(host):
    config = GenerationConfig(gen_length=24, block_length=24, decoder="fixed", align_blocks=False)  # exactly 24 iterations
    frames = list(run_live(host, host.default, PROMPT, config, fps=8, plot_hz=1))
    live = [f for f in frames if f.stage == "running"]
    assert live[0].shown == 0 and live[0].plots and live[0].number == 0  # the canvas before decoding
    assert [f.number for f in live] == list(range(len(live)))
    assert all(f.shown < g.shown for f, g in zip(live, live[1:]))  # a frame goes only with news
    assert all(f.since == -1 for f in live)  # no page reported: every frame carries everything
    assert frames[-1].stage == "done" and frames[-1].timeline.finished and frames[-1].plots
    assert frames[-1].shown == 24 == frames[-1].timeline.trace.stats["nfe"]
    with host.lock:
        text = host.get(host.default).generate(PROMPT, config).text
    assert frames[-1].text == text


def test_a_page_that_stops_painting_gets_no_more_frames_until_the_end(host, monkeypatch):
    # the grace frame after REPORT_GRACE_SECONDS of silence is test_a_lost_report_costs_the_grace_period_not_the_live_view's (on the pacer's
    # own clock); here the run may take any time on a loaded machine and still send no backlog
    monkeypatch.setattr("dinfer_viz.live.runner.REPORT_GRACE_SECONDS", float("inf"))
    config = GenerationConfig(gen_length=64, block_length=64, decoder="fixed", align_blocks=False)
    stream = run_live(host, host.default, PROMPT, config, fps=1000, plot_hz=1000)
    first = next(stream)
    acknowledge(first.run, first.number)  # the page painted the canvas, then nothing more
    rest = list(stream)
    live = [f for f in rest if f.stage == "running"]
    assert len(live) <= MAX_UNPAINTED  # whatever the engine's speed: no backlog
    assert all(f.since == 0 for f in live)  # the changes since the canvas the page holds
    assert all(f.stage == "busy" and not f.message for f in rest[len(live) : -1])  # heartbeats: nothing to show
    assert rest[-1].stage == "done" and rest[-1].shown == 64


def test_a_page_that_paints_every_frame_gets_the_changes_since_the_last_one(host):
    config = GenerationConfig(gen_length=32, block_length=32, decoder="fixed", align_blocks=False)
    painted: list[int] = []
    for frame in run_live(host, host.default, PROMPT, config, fps=1000, plot_hz=1000):
        if frame.stage != "running":
            continue
        assert frame.since == (painted[-1] if painted else -1)
        acknowledge(frame.run, frame.number)
        painted.append(frame.shown)
    assert painted[0] == 0 and painted == sorted(set(painted))


def test_a_slow_playback_ends_with_the_result(host):
    config = GenerationConfig(gen_length=8, block_length=8, decoder="fixed", align_blocks=False)
    frames = list(run_live(host, host.default, PROMPT, config, fps=1000, plot_hz=1, speed=20))
    live = [f.shown for f in frames if f.stage == "running"]
    assert live == sorted(set(live)) and frames[-1].stage == "done" and frames[-1].shown == 8


def test_closing_the_stream_cancels_the_engine_before_the_run_ends(host):
    n = 448  # one block of 448 iterations (the embedded model's canvas is at most 512)
    config = GenerationConfig(gen_length=n, block_length=n, decoder="fixed", align_blocks=False)
    with host.lock:
        layer = host.get(host.default).model.layer_modules()[0]
    forwards: list[int] = []
    handle = layer.register_forward_pre_hook(lambda *args: forwards.append(1))
    try:
        stream = run_live(host, host.default, PROMPT, config, fps=1000, plot_hz=1)
        frames = [next(stream) for _ in range(4)]
        assert frames[-1].stage == "running" and frames[-1].shown < n
        stream.close()  # what Gradio does on Stop: GeneratorExit at the yield, `finally` sets cancel
        assert host.lock.acquire(timeout=120)  # the worker holds the lock until the engine returns
        host.lock.release()
    finally:
        handle.remove()
    assert len(forwards) < n  # the engine stopped before its last iteration


def test_a_busy_engine_makes_the_run_wait(host):
    config = GenerationConfig(gen_length=8, block_length=8)
    host.lock.acquire()
    stream = run_live(host, host.default, PROMPT, config)
    try:
        assert next(stream).stage == "waiting"
    finally:
        host.lock.release()
    assert [f.stage for f in stream][-1] == "done"


def test_an_engine_error_ends_the_stream_with_its_message(host):
    config = GenerationConfig(gen_length=8, block_length=8)
    frames = list(run_live(host, host.default, "   ", config))
    assert frames[-1].stage == "error" and "empty prompt" in frames[-1].message
    assert not host.lock.locked()


def test_host_keeps_the_default_and_one_other(host):
    default = host.default
    f32, bf16 = ModelSpec(default.path, dtype="float32"), ModelSpec(default.path, dtype="bfloat16")
    with host.lock:
        first = host.get(default)
        host.get(f32)
        host.get(bf16)  # evicts f32, never the default
        assert host.get(default) is first
    assert host.is_loaded(bf16) and not host.is_loaded(f32)


def test_a_heartbeat_during_a_slow_playback_says_it_is_playing_back(host):
    """#44 item 4: a slow playback of a run the engine finished long ago said "a forward is
    running" at every heartbeat. The heartbeat's words come from the run's own state: records made
    beyond those shown mean a playback, and a finished engine says so."""
    import queue

    from dinfer_viz.live.runner import FrameClock, LiveRun, Playback
    from dinfer_viz.reading.timeline import Timeline
    from engine import RunHooks

    with host.lock:
        result = host.get(host.default).generate(PROMPT, GenerationConfig(gen_length=8, block_length=8, decoder="fixed"), RunHooks(trace=True))
    live = LiveRun(queue.SimpleQueue(), FrameClock(20, 3), Playback(1.0), 0.0)
    live.timeline, live.shown, live.status = Timeline(result.output.trace), 3, "generating: a forward is running"
    made = live.timeline.iterations
    assert live._busy_message(3) == f"playing back: iteration 3 of {made} (the engine runs ahead)"
    live.result = result
    assert live._busy_message(3) == f"playing back: iteration 3 of {made} (the engine has finished)"
    assert live._busy_message(4) == ""  # the page is still painting the frame that is due
    live.shown = made
    live.result = None
    assert live._busy_message(made) == "generating: a forward is running"  # nothing to play back: the engine's own status
    live.playback.pause()
    assert live._busy_message(made) == ""
