"""The page follows the run it shows (issue #32 item 7, #34 item 3), in a real browser (Debian's
chromium driven by Playwright): Stop keeps a readable, scrubbable run marked stopped; a failed Run
leaves no stale run; a hidden setting leaves the settings; a loaded trace fills the boxes; the
header names the shown run's model; playback pauses, resumes and skips apart from the engine.

Every wait is for a condition the page or the engine reaches (a caption, a message, the engine's
lock), never for a time. Screenshots go to $DINFER_VIZ_SHOTS when set (to look at them), else to
the test's temp folder.
"""

from __future__ import annotations

import json
import os
import re

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import pytest

from .app_support import choose_option, click_run, fill_model, handmade_trace, open_app

pytestmark = [pytest.mark.browser, pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore:.*(no_silent_downcasting|copy keyword).*")]
SHOTS = os.environ.get("DINFER_VIZ_SHOTS")
SIZES = [(1024, 768), (1400, 1000)]
WAIT = 300_000  # ms: generous, for a loaded 2-core machine; only ever a wait for a condition
CAPTION = re.compile(r"iteration (\d+)/(\d+)")


@pytest.fixture(scope="module")
def session(app_in_browser):
    return app_in_browser


def open_page(session, width: int, height: int):
    """The module's one page (opened by its first test, kept on `session`), at `width`x`height`
    and loaded afresh: a new Gradio session with nothing of the previous test's. Loading the app
    again in the page it was in costs chromium half of a new page's load (1.5 against 3.1 CPU
    seconds, measured: each new page starts a renderer process)."""
    page = getattr(session, "page", None)
    if page is None or page.is_closed():
        page = session.page = session.browser.new_page()
    page.set_viewport_size({"width": width, "height": height})
    open_app(page, session.url)
    page.size = f"{width}x{height}"
    return page


@pytest.fixture
def page(session):
    """The page at the projector's 1024x768: for what the page does, which no size changes (each
    run is the same engine run at either size; the layouts are test_projector_browser.py's)."""
    return open_page(session, *SIZES[0])


def shot(page, tmp_path, name: str) -> str:
    path = os.path.join(SHOTS, f"{name}-{page.size}.png") if SHOTS else str(tmp_path / f"{name}.png")
    page.screenshot(path=path, full_page=True)
    return path


def caption(page) -> tuple[int, int]:
    found = CAPTION.search(page.locator("#grid .caption").text_content() or "")
    assert found, page.locator("#grid .caption").text_content()
    return int(found[1]), int(found[2])


def wait_caption(page, condition: str) -> None:
    """Until the grid's caption 'iteration n/N' satisfies `condition` (JS over n and N)."""
    page.wait_for_function(
        "() => { const m = /iteration (\\d+)\\/(\\d+)/.exec(document.querySelector('#grid .caption')?.textContent || '');"
        f" if (!m) return false; const n = +m[1], N = +m[2]; return {condition}; }}",
        timeout=WAIT,
    )


def set_number(page, field: str, value: int) -> None:
    box = page.locator(f"#cfg-{field} input")
    box.fill(str(value))
    box.press("Tab")


def settle(page, field: str, value) -> None:
    """Until the settings the page would send hold `value` for `field` (the control's change
    reached Gradio's store): the browser-side collection Run uses, evaluated in the page."""
    page.wait_for_function(
        "([f, v]) => { const el = document.querySelector('#cfg-' + f + ' input'); return el && String(el.value) === String(v); }", arg=[field, value], timeout=WAIT
    )


def long_fixed_run(page, length: int = 256) -> None:
    """A run long enough to be stopped while the engine decodes: the fixed decoder, one block."""
    choose_option(page, "#cfg-decoder", "fixed")
    page.wait_for_selector("#cfg-steps", state="visible", timeout=WAIT)  # the server has the fixed decoder
    for field in ("gen_length", "block_length"):
        set_number(page, field, length)
    page.locator("#cfg-align_blocks input").uncheck()
    settle(page, "gen_length", length)
    page.wait_for_function("() => /settings ok/.test(document.querySelector('#settings-msg')?.textContent || '')", timeout=WAIT)


def engine_free(host) -> None:
    assert host.lock.acquire(timeout=WAIT / 1000)  # the engine's worker holds it until the engine returns
    host.lock.release()


def upload(page, path) -> None:
    with page.expect_file_chooser() as chooser:
        page.click("#upload")
    chooser.value.set_files(str(path))


def old_trace_file(tmp_path, **config) -> str:
    """The hand-made trace as a version-2 file (upgraded on load), with `config` over its settings."""
    data = handmade_trace().to_dict()
    data.update(version=2, config={**data["config"], **config})
    data.pop("kind"), data.pop("capabilities")
    for record in data["iterations"]:
        record.pop("active"), record.pop("final_until")
    file = tmp_path / "trace.json"
    file.write_text(json.dumps(data))
    return str(file)


def test_stop_keeps_a_readable_scrubbable_run_marked_stopped(session, page, tmp_path):
    from playwright.sync_api import expect

    long_fixed_run(page)
    click_run(page)
    wait_caption(page, "n >= 4")  # the live grid: the engine is decoding
    # while live, the slider follows the live run (its length so far), never the previous run's
    live_max = int(page.locator("#scrub input[type=range]").get_attribute("max"))
    assert live_max <= caption(page)[1] and live_max >= 1
    page.click("#stop-btn")
    expect(page.locator("#stats")).to_contain_text("stopped at iteration", timeout=WAIT)
    engine_free(session.host)
    k = int(re.search(r"stopped at iteration (\d+)", page.locator("#stats").text_content())[1])
    assert 4 <= k < 256
    expect(page.locator("#message")).to_contain_text(f"stopped at iteration {k}")
    expect(page.locator("#model-status")).to_contain_text(f"stopped at iteration {k}")
    expect(page.locator("#model-status")).to_contain_text("tiny-llada")
    assert caption(page) == (k, k)
    assert page.locator("#output textarea").input_value().strip()  # what the run had: k positions committed
    assert page.locator("#grid .cells .cell.masked").count() > 0  # a stopped run: positions still masked
    scrub = page.locator("#scrub input[type=number]")
    expect(scrub).to_have_value(str(k))
    assert int(page.locator("#scrub input[type=range]").get_attribute("max")) == k
    scrub.fill("2")
    scrub.press("Enter")
    wait_caption(page, f"n === 2 && N === {k}")  # scrubbing redraws the stopped run, not an earlier one
    path = shot(page, tmp_path, "stopped-run")
    assert os.path.getsize(path) > 20_000


def test_a_failed_run_leaves_no_stale_run(page, tmp_path):
    from playwright.sync_api import expect

    upload(page, old_trace_file(tmp_path))
    expect(page.locator("#message")).to_contain_text("loaded a trace: handmade, 4 iterations", timeout=WAIT)
    assert page.locator("#grid .cells .cell").count() == 11
    # the trace named its model ("handmade", no folder): back to the embedded one, then a constraint
    # the settings check passes and the run refuses (a character the tokenizer cannot write)
    page.get_by_text("Model and system").first.click()
    fill_model(page, "tiny-llada")
    page.fill("#prompt textarea", "Q: 1+1=? A:")
    choose_option(page, "#cfg-constraint", "regex")
    page.locator("#cfg-constraint_text textarea").fill("€")
    page.wait_for_function("() => /held to regex/.test(document.querySelector('#settings-msg')?.textContent || '')", timeout=WAIT)
    click_run(page)
    expect(page.locator("#message")).to_contain_text("cannot write", timeout=WAIT)  # refused by the run, for the constraint
    expect(page.locator("#grid .cells .cell")).to_have_count(0)
    expect(page.locator("#stats")).to_contain_text("no run shown")
    assert page.locator("#output textarea").input_value() == ""
    assert page.locator("#scrub input[type=range]").is_disabled()
    assert "handmade" not in page.locator("#model-status").text_content()
    shot(page, tmp_path, "failed-run")


def test_a_hidden_staleness_setting_leaves_the_settings(page, tmp_path):
    from playwright.sync_api import expect

    choose_option(page, "#cfg-cache", "dual")
    page.locator("#cfg-measure_staleness input").check()
    choose_option(page, "#cfg-cache", "none")
    expect(page.locator("#cfg-measure_staleness")).to_be_hidden(timeout=WAIT)
    set_number(page, "gen_length", 16)
    set_number(page, "block_length", 16)
    settle(page, "block_length", 16)
    click_run(page)
    expect(page.locator("#message")).to_contain_text("done", timeout=WAIT)
    with page.expect_download() as download:
        page.click("#download")
    config = json.loads(open(download.value.path()).read())["config"]
    assert config["cache"] == "none" and config["measure_staleness"] is False  # the engine never got it
    choose_option(page, "#cfg-cache", "dual")  # shown again, the control still holds what the user set
    expect(page.locator("#cfg-measure_staleness input")).to_be_checked(timeout=WAIT)


def test_a_loaded_trace_fills_the_prompt_model_settings_and_header(page, tmp_path):
    from playwright.sync_api import expect

    upload(page, old_trace_file(tmp_path, threshold=0.42, cache="vicinity"))
    expect(page.locator("#message")).to_contain_text("loaded a trace: handmade", timeout=WAIT)
    expect(page.locator("#prompt textarea")).to_have_value("ABC", timeout=WAIT)  # the trace's prompt tokens
    page.get_by_text("Model and system").first.click()  # the model box sits in its accordion
    expect(page.locator("#model-path textarea, #model-path input").first).to_have_value("handmade")
    expect(page.locator("#cfg-cache input")).to_have_value("vicinity")
    expect(page.locator("#cfg-threshold input[type=number]")).to_have_value("0.42")
    expect(page.locator("#model-status")).to_contain_text("run shown: handmade · loaded from a trace file: 4 iterations")
    shot(page, tmp_path, "loaded-trace")


def test_the_header_names_the_model_of_the_run_shown(session, page, tmp_path):
    from playwright.sync_api import expect

    page.get_by_text("Model and system").first.click()
    fill_model(page, "tiny-llada-td")
    set_number(page, "gen_length", 16)
    set_number(page, "block_length", 16)
    settle(page, "block_length", 16)
    click_run(page)
    expect(page.locator("#message")).to_contain_text("done", timeout=WAIT)
    expect(page.locator("#model-status")).to_contain_text("tiny-llada-td")
    expect(page.locator("#model-status")).to_contain_text("finished")
    assert "default model" not in page.locator("#model-status").text_content()


def test_playback_pauses_resumes_and_skips_apart_from_the_engine(session, page, tmp_path):
    """At 1 iteration / s the engine finishes at once and the page plays the run back: Pause holds
    the view though the engine is free, Play resumes it, End skips to the finished run; Stop
    during a playback keeps the whole run the engine made."""
    from playwright.sync_api import expect

    choose_option(page, "#live-speed", "1 iteration / s")
    # 96 iterations at 1 / s: a playback that outlasts every click below on any machine
    long_fixed_run(page, 96)
    click_run(page)
    wait_caption(page, "n >= 1")
    page.click("#pause-btn")
    expect(page.locator("#message")).to_contain_text("paused at iteration", timeout=WAIT)
    k = int(re.search(r"paused at iteration (\d+)", page.locator("#message").text_content())[1])
    engine_free(session.host)  # the engine is done: only the playback is held
    wait_caption(page, f"n === {k}")
    assert caption(page)[0] == k and "done" not in page.locator("#message").text_content()
    shot(page, tmp_path, "paused-playback")
    page.click("#play-btn")  # resume
    wait_caption(page, f"n > {k}")
    page.click("#skip-btn")  # to the end
    expect(page.locator("#message")).to_contain_text("done", timeout=WAIT)
    n, total = caption(page)
    assert n == total and total > k
    expect(page.locator("#model-status")).to_contain_text("finished")

    click_run(page)  # again at 1 iteration / s, and Stop while it plays back
    expect(page.locator("#model-status")).to_contain_text("live", timeout=WAIT)  # the new run is on display, not the last one
    wait_caption(page, "n >= 1")
    page.click("#pause-btn")
    expect(page.locator("#message")).to_contain_text("paused at iteration", timeout=WAIT)
    engine_free(session.host)
    page.click("#stop-btn")
    expect(page.locator("#message")).to_contain_text("the engine had finished", timeout=WAIT)
    expect(page.locator("#stats")).to_contain_text("engine stats")  # the whole run: its footer's figures
    assert int(page.locator("#scrub input[type=range]").get_attribute("max")) == total
