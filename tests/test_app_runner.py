"""The runner: frames throttled by time (first and last always), cancel on close, the shared lock."""

from __future__ import annotations

import time

import pytest

from dinfer_viz.host import EngineHost, ModelSpec
from dinfer_viz.runner import FrameClock, run_live
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


def test_frames_are_throttled_and_the_last_is_the_engine_result(host):
    config = GenerationConfig(gen_length=24, block_length=24, decoder="fixed", align_blocks=False)  # exactly 24 iterations
    t0 = time.perf_counter()
    frames = list(run_live(host, host.default, PROMPT, config, fps=8, plot_hz=1))
    seconds = time.perf_counter() - t0
    assert frames[0].stage == "running" and frames[0].shown == 0  # the canvas before decoding
    assert frames[-1].stage == "done" and frames[-1].timeline.finished and frames[-1].plots
    assert frames[-1].shown == 24 == frames[-1].timeline.trace.stats["nfe"]
    assert len(frames) <= 2 + 8 * seconds + 1  # first + last + at most fps per second
    assert all(f.shown <= g.shown for f, g in zip(frames, frames[1:]))
    with host.lock:
        text = host.get(host.default).generate(PROMPT, config).text
    assert frames[-1].text == text


def test_closing_the_stream_cancels_the_engine_within_an_iteration(host):
    n = 448  # one block of 448 iterations (the embedded model's canvas is at most 512)
    config = GenerationConfig(gen_length=n, block_length=n, decoder="fixed", align_blocks=False)
    stream = run_live(host, host.default, PROMPT, config, fps=1000, plot_hz=1)
    frames = [next(stream) for _ in range(4)]
    records = frames[-1].timeline.records
    per_iteration = sum(r.seconds for r in records) / len(records)
    t0 = time.perf_counter()
    stream.close()  # what Gradio does on Stop: GeneratorExit at the yield, `finally` sets cancel
    assert host.lock.acquire(timeout=60)  # the worker holds the lock until the engine returns
    freed = time.perf_counter() - t0
    host.lock.release()
    rest_of_run = (n - len(records)) * per_iteration
    assert freed < min(2.0 + 20 * per_iteration, 0.5 * rest_of_run)  # stopped early, not run to the end


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
