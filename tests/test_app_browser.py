"""The app in a real browser: Debian's chromium driven by Playwright (never a downloaded browser).

In CI (CI set) a missing chromium or playwright is a failure; elsewhere these tests skip, saying why.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from types import SimpleNamespace

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import pytest

from engine import GenerationConfig
from engine.trace import TRACE_VERSION

from .app_support import choose_option, click_run, handmade_trace, launch_app, open_app

SHOTS = os.environ.get("DINFER_VIZ_SHOTS")  # a folder to keep the screenshots in (to look at them)
pytestmark = [pytest.mark.browser, pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore:.*(no_silent_downcasting|copy keyword).*")]


@pytest.fixture(scope="module")
def session(app_in_browser):
    """(page, host, url, browser): a page of this module's own on the shared app."""
    page = app_in_browser.browser.new_page(viewport={"width": 1500, "height": 1000})
    open_app(page, app_in_browser.url)
    yield SimpleNamespace(page=page, host=app_in_browser.host, url=app_in_browser.url, browser=app_in_browser.browser)
    page.close()


def test_run_in_the_browser_renders_grid_and_plots(session, tmp_path):
    from playwright.sync_api import expect

    page, host = session.page, session.host
    page.fill("#prompt textarea", "Q: 23+45=? A:")
    click_run(page)
    expect(page.locator("#message")).to_contain_text("done", timeout=90_000)
    expect(page.locator("#grid .cells .cell").first).to_be_visible()
    assert page.locator("#grid .cells .cell.masked").count() == 0  # the final frame: nothing left masked
    assert page.locator("#grid .cells .cell.prompt").count() >= len("Q: 23+45=? A:")
    expect(page.locator("#stats")).to_contain_text("engine stats")
    with host.lock:  # the page's settings (collected in the browser) are the engine's defaults
        text = host.get(host.default).generate("Q: 23+45=? A:", GenerationConfig()).text
    assert page.locator("#output textarea").input_value() == text
    expect(page.locator("#raster .js-plotly-plot .heatmaplayer image")).to_have_count(1)  # the heatmap was drawn
    expect(page.locator("#iterations .js-plotly-plot .barlayer")).to_have_count(1)
    shot = tmp_path / "app.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 20_000

    with page.expect_download() as download:
        page.click("#download")
    trace = json.loads(open(download.value.path()).read())
    assert trace["version"] == TRACE_VERSION and len(trace["iterations"]) == trace["stats"]["nfe"]


def test_a_loaded_trace_replays_in_the_browser(session, tmp_path):
    from playwright.sync_api import expect

    page = session.page
    file = tmp_path / "trace.json"
    file.write_text(handmade_trace().to_json())
    with page.expect_file_chooser() as chooser:
        page.click("#upload")
    chooser.value.set_files(str(file))
    caption = page.locator("#grid .caption")
    expect(page.locator("#message")).to_contain_text("loaded a trace: handmade, 4 iterations")
    expect(caption).to_contain_text("iteration 4/4")
    page.locator("#scrub input[type=number]").fill("0")
    page.keyboard.press("Enter")
    expect(caption).to_contain_text("iteration 0/4 · before the first forward")
    page.click("#play-btn")
    expect(caption).to_contain_text("iteration 4/4", timeout=10_000)


def test_slider_caption_raster_chart_and_hover_number_iterations_alike(session, tmp_path):
    """Slider at 2: the grid's caption, the raster's and the chart's red line, and the hover of the
    commit made then all say iteration 2 (record 1; 0 is the canvas before the first forward)."""
    from playwright.sync_api import expect

    page = session.page
    open_app(page, session.url)  # a fresh page: the previous test's message is the same as this one's
    file = tmp_path / "trace.json"
    file.write_text(handmade_trace().to_json())
    with page.expect_file_chooser() as chooser:
        page.click("#upload")
    chooser.value.set_files(str(file))
    expect(page.locator("#message")).to_contain_text("loaded a trace: handmade, 4 iterations")
    expect(page.locator("#scrub input[type=number]")).to_have_value("4")
    slider = page.locator("#scrub input[type=range]")
    box = slider.bounding_box()
    slider.click(position={"x": box["width"] / 2, "y": box["height"] / 2})  # the middle of 0..4: a release at 2
    expect(page.locator("#scrub input[type=number]")).to_have_value("2")
    expect(page.locator("#grid .caption")).to_contain_text("iteration 2/4 · block 0 [3, 7) · window forward")
    red = "sel => Array.from(document.querySelector(sel + ' .js-plotly-plot').layout.shapes || []).filter(s => s.line && s.line.color === '#dc2626')"
    page.wait_for_function(f"({red})('#raster').length === 1 && ({red})('#iterations').length === 1")
    assert page.evaluate(f"({red})('#raster')[0].y0") == 2 and page.evaluate(f"({red})('#iterations')[0].x0") == 2
    tip = page.locator("#grid .cells .cell[title^='pos 4 ·']").get_attribute("title")
    assert "committed at iteration 2 (forced top-1" in tip  # position 4 was forced by record 1
    forced = page.evaluate(
        "() => { const d = document.querySelector('#raster .js-plotly-plot')._fullData.find(t => t.name === 'committed now, forced top-1');"
        " return Array.from(d.x).map((x, i) => [x, d.y[i]]); }"
    )
    assert [4, 2] in forced  # the raster's marker of that commit sits on row 2
    # the modebar's camera saves the figure as a PNG at twice its size (the figure's config reached Plotly)
    assert page.evaluate("document.querySelector('#raster .js-plotly-plot')._context.toImageButtonOptions") == {"format": "png", "scale": 2, "filename": "dinfer-viz-raster"}


HOSTILE_TOKENS = {
    "10": "A${Object.assign(window,{pwned:1})}B",
    "11": "<script>window.pwned=2</script>",
    "12": "<img src=x onerror=window.pwned=3>",
    "20": "</div></span>`${window.pwned=4}`",
    "21": "\\${window.pwned=5}",
    "22": "{{constructor.constructor('window.pwned=6')()}}",
}


def test_a_hostile_trace_runs_no_script_and_shows_its_tokens_literally(session, tmp_path):
    """Token strings from a trace file reach the grid's template: none of them may run."""
    from playwright.sync_api import expect

    page = session.page
    trace = handmade_trace()
    trace.tokens.update(HOSTILE_TOKENS)
    trace.model = "<b>bold</b>${window.pwned=7}"
    file = tmp_path / "hostile.json"
    file.write_text(trace.to_json())
    with page.expect_file_chooser() as chooser:
        page.click("#upload")
    chooser.value.set_files(str(file))
    expect(page.locator("#grid .cells .cell").first).to_have_text(HOSTILE_TOKENS["10"])  # the new trace is shown
    cells = page.locator("#grid .cells .cell").all_inner_texts()
    assert page.evaluate("window.pwned") is None
    assert page.locator("#grid script, #grid img").count() == 0
    for text in HOSTILE_TOKENS.values():
        assert text in cells, (text, cells)
    tips = page.locator("#grid .cells .cell").evaluate_all("cells => cells.map(c => c.title)")
    assert any("<script>window.pwned=2</script>" in t for t in tips)


def test_examples_fill_the_prompt_its_expected_answer_and_the_family_note(session):
    from playwright.sync_api import expect

    page = session.page
    page.locator("#examples").get_by_text("Q: 123+45=? A:").click()
    expect(page.locator("#prompt textarea")).to_have_value("Q: 123+45=? A:")
    # arithmetic has one right answer: it fills the expected box, and wrong commits get marked
    expect(page.locator("#expected textarea")).to_have_value(" 123+ 45= 168")
    expect(page.locator("#prompt-note")).to_contain_text("family add")
    # pair-sum has many valid answers: no expected tokens, the verifier judges the answer
    page.locator("#examples").get_by_text("Q: ?+?=120 A:").click()
    expect(page.locator("#expected textarea")).to_have_value("")
    expect(page.locator("#prompt-note")).to_contain_text("family pairsum")
    page.locator("#examples").get_by_text("Hello, how are you?").click()
    expect(page.locator("#prompt-note")).to_contain_text("outside every family")
    # an expected answer the user typed is theirs: another prompt does not replace it
    page.fill("#expected textarea", " my answer")
    page.locator("#examples").get_by_text("Q: 123+45=? A:").click()
    expect(page.locator("#prompt-note")).to_contain_text("family add")
    expect(page.locator("#expected textarea")).to_have_value(" my answer")


def test_an_answer_typed_while_the_suggestion_is_on_its_way_stays(session, tmp_path_factory, monkeypatch):
    """The server answers a prompt change with the box's value as it was then; a user who types an
    expected answer before that answer arrives keeps it (the page decides, on the value it has when
    the suggestion lands). The handler is slowed so the typing surely comes first."""
    from playwright.sync_api import expect

    from dinfer_viz.tabs.run import RunHandlers

    slow = RunHandlers.suggest_expected

    def suggest_slowly(self, *args):
        time.sleep(1.5)
        return slow(self, *args)

    monkeypatch.setattr(RunHandlers, "suggest_expected", suggest_slowly)
    demo, url, _ = launch_app(tmp_path_factory)
    page = session.browser.new_page()
    try:
        open_app(page, url)
        page.fill("#prompt textarea", "Q: 123+45=? A:")
        page.fill("#expected textarea", " my answer")  # before the suggestion arrives
        expect(page.locator("#prompt-note")).to_contain_text("family add")  # it has arrived
        page.wait_for_timeout(300)  # the page's decision follows the answer
        expect(page.locator("#expected textarea")).to_have_value(" my answer")
        # an empty box still takes the suggestion
        page.fill("#expected textarea", "")
        page.fill("#prompt textarea", "Q: 7+58=? A:")
        expect(page.locator("#expected textarea")).to_have_value("   7+ 58=  65")
    finally:
        page.close()
        demo.close()


# One token piece with every attack of HOSTILE_TOKENS and no whitespace, so a cell shows it exactly.
LIVE_HOSTILE = "<img/src=x/onerror=window.pwned=11>${window.pwned=12}<script>window.pwned=13</script>`${window.pwned=14}`{{constructor.constructor('window.pwned=15')()}}"


def test_a_live_run_shows_hostile_token_strings_as_text(session, monkeypatch):
    """The live renderer gets the tokenizer's strings as data: they must show, never run."""
    from playwright.sync_api import expect

    page, host = session.page, session.host
    with host.lock:
        engine = host.get(host.default)
    real, kept = engine.token_strings, {engine.tokenizer.mask_token_id, engine.tokenizer.eos_token_id}
    monkeypatch.setattr(engine, "token_strings", lambda ids: {k: v if int(k) in kept else LIVE_HOSTILE for k, v in real(ids).items()})
    open_app(page, session.url)
    choose_option(page, "#cfg-decoder", "fixed")
    expect(page.locator("#cfg-steps")).to_be_visible()  # the server has the fixed decoder
    for field in ("gen_length", "block_length"):
        page.fill(f"#cfg-{field} input", "16")
    choose_option(page, "#live-speed", "1 iteration / s")  # the live view lasts 16 s, and Pause holds it
    expect(page.locator("#settings-msg")).to_contain_text("settings ok")
    # this Run, clicked as the settings checks' stream closed, once showed nothing: Gradio's client
    # had dropped its stream (dinfer_viz/live/stream_keeper.py, tests/test_stream_keeper.py)
    click_run(page)
    expect(page.locator("#grid .live .caption")).to_contain_text(re.compile(r"iteration [1-9]"))  # live, a forward's frame painted
    page.click("#pause-btn")  # the live view holds while it is read
    expect(page.locator("#message")).to_contain_text("paused at iteration")
    live_cells = page.locator("#grid .live .cells .cell").all_inner_texts()
    assert page.evaluate("window.pwned") is None and page.locator("#grid script, #grid img").count() == 0
    assert LIVE_HOSTILE in live_cells, live_cells  # the prompt's cells, as text
    page.click("#skip-btn")
    expect(page.locator("#message")).to_contain_text("done")
    assert page.evaluate("window.pwned") is None and page.locator("#grid script, #grid img").count() == 0
    final_cells = page.locator("#grid .cells .cell").all_inner_texts()  # the server-side grid, through the template
    assert LIVE_HOSTILE in final_cells
    open_app(page, session.url)  # the next test starts from the default settings


def test_stop_and_a_tab_switch_work_during_a_long_live_run(session):
    """What benchmarks/app_frames.py measures (real mouse clicks during a live run): the Compare
    and Run tabs show while the engine decodes, Stop ends the run before its end, says so, and frees
    the engine. How fast is the benchmark's to print (a test decides from the page's events only)."""
    from benchmarks.app_frames import stopped_run

    figures = stopped_run(session.page, session.url, 448, session.host.lock)
    assert not figures["completed"], figures  # Stop ended the run before its 448th iteration
    assert figures["stop_message_s"] == figures["stop_message_s"], figures  # the page said it stopped (not NaN)
    assert figures["at"].startswith("iteration "), figures  # frames were painted before the Stop
    open_app(session.page, session.url)  # the next test starts from the default settings


# 1000 px: the readout's column is narrowest there (358 px), where Gradio's prose styles broke cells
# anywhere; at 1024x768 and 1400x1000 it happens to be wider, but a longer tracing cell breaks it too.
@pytest.mark.parametrize("width,height", [(1000, 768), (1024, 768), (1400, 1000)])
def test_readout_cells_never_wrap_inside_a_word_or_number(session, width, height):
    """"TP S", "95. 5": each readout cell's text must stay on one line, at a projector's size too
    (a table wider than its column scrolls sideways instead)."""
    from playwright.sync_api import expect

    page = session.page
    if "engine stats" not in (page.locator("#stats").text_content() or ""):
        click_run(page)
        expect(page.locator("#stats")).to_contain_text("engine stats")
    page.set_viewport_size({"width": width, "height": height})
    try:
        lines = page.evaluate(
            "() => Array.from(document.querySelectorAll('#stats table th, #stats table td')).map(c => {"
            " const r = document.createRange(); r.selectNodeContents(c);"
            " return [c.textContent, new Set(Array.from(r.getClientRects()).filter(b => b.width > 0).map(b => Math.round(b.top))).size]; })"
        )
    finally:
        page.set_viewport_size({"width": 1500, "height": 1000})
    assert len(lines) == 16 and all(text.strip() for text, _ in lines)  # 8 headers, 8 figures
    assert all(n == 1 for _, n in lines), lines


@pytest.fixture
def offline_page(session, tmp_path_factory):
    """A page on an app started as `python app.py --no-model` starts it: no model loaded. Closed
    after its test: left open, it kept the session's page behind it (app_support.open_app)."""
    from dinfer_viz.live.host import EngineHost, ModelSpec
    from dinfer_viz.ui import Handlers, build_demo, launch_kwargs

    handlers = Handlers(EngineHost(ModelSpec(str(tmp_path_factory.mktemp("none") / "absent"))), no_model=True)
    demo = build_demo(handlers)
    _, url, _ = demo.launch(server_name="127.0.0.1", server_port=None, prevent_thread_lock=True, quiet=True, **launch_kwargs())
    page = session.browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(url)
    yield SimpleNamespace(page=page, handlers=handlers)
    page.close()
    demo.close()


def test_a_sample_trace_replays_with_no_model(offline_page):
    from playwright.sync_api import expect

    from dinfer_viz.sample_traces import shipped_samples

    page = offline_page.page
    label = next(label for label, path in shipped_samples() if path.endswith("threshold-dual.json"))
    menu = page.locator("#samples input")
    expect(menu).to_be_visible()  # the accordion is open with no model: replay is what the app can do
    menu.fill(label)
    page.keyboard.press("Enter")
    expect(page.locator("#message")).to_contain_text("loaded a trace: tiny-llada", timeout=20_000)
    expect(page.locator("#grid .cells .cell").first).to_be_visible()
    expect(page.locator("#raster .js-plotly-plot .heatmaplayer image")).to_have_count(1)
    expect(page.locator("#grid .caption")).to_contain_text("dual forward")
    assert not offline_page.handlers.host._engines  # replayed with no engine


def _load_handmade(page, tmp_path, trace=None) -> None:
    from playwright.sync_api import expect

    file = tmp_path / "trace.json"
    file.write_text((trace or handmade_trace()).to_json())
    with page.expect_file_chooser() as chooser:
        page.click("#upload")
    chooser.value.set_files(str(file))
    expect(page.locator("#message")).to_contain_text("loaded a trace: handmade, 4 iterations")


def test_a_clicked_cell_pins_its_details_while_scrubbing_and_a_raster_point_too(session, tmp_path):
    """#16 item 1: a grid click pins the position's details beside the grid; scrubbing keeps it
    pinned and refreshes it; a raster point pins its position and moves the view to its iteration."""
    from playwright.sync_api import expect

    page = session.page
    open_app(page, session.url)
    _load_handmade(page, tmp_path)
    details = page.locator("#details")
    expect(details).to_contain_text("Click a cell")
    page.locator("#scrub input[type=number]").fill("3")
    page.keyboard.press("Enter")
    expect(page.locator("#grid .caption")).to_contain_text("iteration 3/4")
    # the first click after typing: it blurs the box, which releases the slider; the click must win that race
    page.locator("#grid .cells .cell[data-p='4']").click()
    expect(details).to_contain_text("Position 4 · iteration 3 of 4")
    page.locator("#scrub input[type=number]").fill("4")
    page.keyboard.press("Enter")
    expect(details).to_contain_text("Position 4 · iteration 4 of 4")
    expect(details).to_contain_text("forced")
    page.locator("#scrub input[type=number]").fill("1")
    page.keyboard.press("Enter")
    expect(page.locator("#grid .caption")).to_contain_text("iteration 1/4")
    expect(details).to_contain_text("Position 4 · iteration 1 of 4")  # still pinned, refreshed
    # a raster point (plotly's click event, as plotly emits it): position 5 at iteration 3
    page.wait_for_function("() => { const p = document.querySelector('#raster .js-plotly-plot'); return p && p.dataset.pick === '1'; }")
    page.evaluate("() => document.querySelector('#raster .js-plotly-plot').emit('plotly_click', {points: [{x: 5, y: 3}]})")
    expect(details).to_contain_text("Position 5 · iteration 3 of 4")
    expect(page.locator("#scrub input[type=number]")).to_have_value("3")
    expect(page.locator("#grid .caption")).to_contain_text("iteration 3/4")
    # the handmade trace ran a vicinity cache: the K/V states are drawn, their rule explained
    expect(page.locator("#cache-states .js-plotly-plot")).to_have_count(1)
    box = details.bounding_box()
    assert box and box["y"] < 1000 and box["height"] > 50


def test_the_details_panel_fits_its_column_at_a_projectors_width(session, tmp_path):
    """At 1024 px the panel's column is about 190 px wide: its labels wrap rather than push the
    values out of sight (the credit decoder's "probability before the credit boost" did, unwrapped)."""
    from playwright.sync_api import expect

    page = session.page
    page.set_viewport_size({"width": 1024, "height": 768})
    try:
        trace = handmade_trace()
        for rec in trace.iterations:  # as the credit decoder records them: the longest label
            rec.extras["raw_confidence"] = rec.extras["credit"]
        open_app(page, session.url)
        _load_handmade(page, tmp_path, trace)
        page.locator("#grid .cells .cell[data-p='7']").click()  # in the last record's block: its extras are listed
        expect(page.locator("#details")).to_contain_text("probability before the credit boost")
        widths = page.evaluate(
            "() => { const d = document.querySelector('#details .pos-details');"
            " return [d.clientWidth, d.querySelector('table').scrollWidth]; }"
        )
        assert widths[1] <= widths[0], widths
    finally:
        page.set_viewport_size({"width": 1500, "height": 1000})


def test_hostile_token_strings_stay_text_in_the_details_panel(session, tmp_path):
    page = session.page
    trace = handmade_trace()
    trace.tokens.update(HOSTILE_TOKENS)
    open_app(page, session.url)
    file = tmp_path / "hostile.json"
    file.write_text(trace.to_json())
    with page.expect_file_chooser() as chooser:
        page.click("#upload")
    chooser.value.set_files(str(file))
    from playwright.sync_api import expect

    expect(page.locator("#grid .cells .cell").first).to_have_text(HOSTILE_TOKENS["10"])
    page.locator("#grid .cells .cell[data-p='5']").click()  # token 22: the Handlebars attack
    expect(page.locator("#details")).to_contain_text(HOSTILE_TOKENS["22"])
    page.locator("#grid .cells .cell[data-p='1']").click()  # token 11: a script tag
    expect(page.locator("#details")).to_contain_text(HOSTILE_TOKENS["11"])
    assert page.evaluate("window.pwned") is None and page.locator("#details script, #details img").count() == 0


def test_at_1024x768_grid_and_raster_share_the_screen_and_no_chip_covers_a_plot(session, tmp_path):
    """A projector: after a run, with the grid scrolled to the top of the screen, the raster starts
    within the same screen; every plot's label sits above its figure, not on it."""
    from playwright.sync_api import expect

    page = session.page
    page.set_viewport_size({"width": 1024, "height": 768})
    try:
        open_app(page, session.url)
        _load_handmade(page, tmp_path)
        expect(page.locator("#raster .js-plotly-plot .heatmaplayer image")).to_have_count(1)
        page.evaluate("document.querySelector('#grid').scrollIntoView({block: 'start'})")
        grid, raster = page.locator("#grid").bounding_box(), page.locator("#raster").bounding_box()
        assert grid["y"] + grid["height"] <= 768 and grid["y"] >= -1, grid
        assert raster["y"] < 768, raster  # both boxes meet the viewport
        page.locator("#details").scroll_into_view_if_needed()
        assert page.locator("#details").bounding_box()["y"] < 768
        for plot in ("raster", "iterations", "cost", "cache-states"):
            gap = page.evaluate(
                f"() => {{ const b = document.querySelector('#{plot}'); const l = b.querySelector(':scope > label[data-testid=block-label]');"
                f" const f = b.querySelector('.js-plotly-plot'); return l && f ? f.getBoundingClientRect().top - l.getBoundingClientRect().bottom : null; }}"
            )
            assert gap is not None and gap >= 0, (plot, gap)
    finally:
        page.set_viewport_size({"width": 1500, "height": 1000})


def test_a_lesson_sets_the_run_tabs_controls_one_step_at_a_time(session):
    from playwright.sync_api import expect

    from dinfer_viz.studies.lessons import LESSONS

    page = session.page
    open_app(page, session.url)
    page.locator("#lessons-box").get_by_text("Lessons").click()
    page.locator("#lesson input").fill(LESSONS[0].name)
    page.keyboard.press("Enter")
    note = page.locator("#lesson-note")
    expect(note).to_contain_text("Step 1 of 4")
    expect(page.locator("#cfg-decoder input")).to_have_value("fixed")
    expect(page.locator("#cfg-threshold")).to_be_hidden()  # the fixed decoder reads no τ
    expect(page.locator("#prompt textarea")).to_have_value(LESSONS[0].prompt)
    page.click("#lesson-next")
    expect(note).to_contain_text("Step 2 of 4")
    expect(page.locator("#cfg-decoder input")).to_have_value("threshold")
    page.click("#lesson-next")
    expect(note).to_contain_text("Step 3 of 4")
    expect(page.locator("#cfg-threshold input[type=number]")).to_have_value("0.7")
    expect(page.locator("#settings-msg")).to_contain_text("settings ok")


def test_compare_side_a_shows_no_tau_for_the_fixed_decoder(session):
    from playwright.sync_api import expect

    page = session.page
    open_app(page, session.url)
    page.get_by_role("tab", name="Compare").click()
    expect(page.locator("#compare-a-decoder input")).to_have_value("fixed")
    expect(page.locator("#compare-a-threshold")).to_be_hidden()
    expect(page.locator("#compare-b-threshold")).to_be_visible()
    expect(page.locator("#compare-b-decoder input")).to_have_value("threshold")
    expect(page.locator("#compare-b-cache input")).to_have_value("none")  # B changes the decoder only
    page.locator("#compare-a-decoder input").fill("threshold")
    page.keyboard.press("Enter")
    expect(page.locator("#compare-a-threshold")).to_be_visible()


def test_compare_marks_wrong_commits_and_the_scrubbed_iteration_and_its_legend_clears_the_axis_titles(session):
    from playwright.sync_api import expect

    page = session.page
    open_app(page, session.url)
    page.fill("#prompt textarea", "Q: 23+45=? A:")
    # the page suggests the right answer for an arithmetic prompt; a wrong one typed before that
    # arrives would be overwritten (a loaded machine did so)
    expect(page.locator("#expected textarea")).to_have_value("  23+ 45=  68")
    page.fill("#expected textarea", " 99+ 99= 999")  # wrong on purpose: the commits that differ are struck out
    # one block of 32 (every side's default block length): a side's own box, typed into while the
    # tab first renders, could lose the value (the flake this test had: "16 must be a multiple of 32")
    page.fill("#cfg-gen_length input", "32")
    page.keyboard.press("Tab")
    page.get_by_role("tab", name="Compare").click()
    expect(page.locator("#compare-a-block_length input")).to_have_value("32")
    page.locator("#compare-passes input[type=number]").fill("1")
    page.keyboard.press("Enter")
    page.click("#compare-btn")
    # the message first: if the comparison fails, the assertion shows what the page said
    expect(page.locator("#compare-message")).to_contain_text("done:", timeout=180_000)
    page.locator("#compare-chart").scroll_into_view_if_needed()
    expect(page.locator("#compare-chart .js-plotly-plot")).to_have_count(1, timeout=30_000)
    expect(page.locator("#grid-a .cells .cell.wrong").first).to_be_visible()
    expect(page.locator("#grid-b .cells .cell.wrong").first).to_be_visible()
    overlap = (
        "() => { const p = document.querySelector('#compare-chart .js-plotly-plot'); const l = p.querySelector('.legend').getBoundingClientRect();"
        " return Array.from(p.querySelectorAll('.g-xtitle, .g-x2title')).map(t => t.getBoundingClientRect()).filter(t => t.height > 0)"
        ".some(t => t.bottom > l.top && t.top < l.bottom && t.right > l.left && t.left < l.right); }"
    )
    assert page.evaluate(overlap) is False
    slider = page.locator("#compare-scrub input[type=range]")
    box = slider.bounding_box()
    slider.click(position={"x": box["width"] / 2, "y": box["height"] / 2})  # a release in the middle of the range
    red = "() => Array.from(document.querySelector('#compare-chart .js-plotly-plot').layout.shapes || []).filter(s => s.line && s.line.color === '#dc2626').map(s => s.x0)"
    page.wait_for_function(f"({red})().length === 1")
    at = int(page.locator("#compare-scrub input[type=number]").input_value())
    assert 0 < at and page.evaluate(red) == [at]
    expect(page.locator("#grid-a .caption")).to_contain_text(f"iteration {at}/")
    page.locator("#compare-scrub input[type=number]").fill("1")  # a typed number moves both runs too
    page.keyboard.press("Enter")
    expect(page.locator("#grid-a .caption")).to_contain_text("iteration 1/")
    expect(page.locator("#grid-b .caption")).to_contain_text("iteration 1/")
    page.wait_for_function(f"JSON.stringify(({red})()) === '[1]'")


def test_the_sweeps_stop_stops_the_sweep(session, tmp_path, monkeypatch):
    """#44 item 1, in the page at a projector's 1024x768: the default sweep (every held-out pair-sum
    prompt at each default value) started, its Stop clicked once the page shows progress; the page
    says stopped, the engine is free (its lock, taken by the test), and the sweep stays stopped."""
    import re

    from playwright.sync_api import expect

    from dinfer_viz.tabs import common

    page, host = session.page, session.host
    # Once the sweep is under way, the engine's forwards wait for its Stop's cancel (the app runs in
    # this process), so the sweep cannot finish before the click lands however fast or loaded the
    # machine is (on a loaded CI machine it once ran all 272 prompts between showing progress and
    # the click); the cancel then stops the waiting forward at its first layer.
    stops: list = []
    made = common.SweepStop
    monkeypatch.setattr(common, "SweepStop", lambda: stops.append(made()) or stops[-1])
    with host.lock:
        model = host.get(host.default).model
    forwards = [0]

    def wait_for_the_stop(module, args):
        forwards[0] += 1
        if forwards[0] > 40 and stops:
            stops[-1].cancel.wait(timeout=300)

    hook = model.register_forward_pre_hook(wait_for_the_stop)
    try:
        page.set_viewport_size({"width": 1024, "height": 768})
        page.get_by_role("tab", name="Threshold sweep").click()
        page.click("#sweep-btn")
        expect(page.locator("#sweep-message")).to_contain_text(re.compile(r"[1-9][0-9]*/[0-9]+ prompts run"), timeout=300_000)
        page.click("#sweep-stop")
        expect(page.locator("#sweep-message")).to_contain_text(re.compile(r"stopped: \d+/\d+ prompts run"), timeout=120_000)
    finally:
        hook.remove()
    assert host.lock.acquire(timeout=120)  # the sweep's engine worker let go
    host.lock.release()
    run, total = map(int, re.search(r"stopped: (\d+)/(\d+) prompts run", page.locator("#sweep-message").inner_text()).groups())
    assert run < total
    page.screenshot(path=str(tmp_path / "sweep-stopped.png"))
    expect(page.locator("#sweep-message")).not_to_contain_text("done")
    page.get_by_role("tab", name="Run").click()


def _lesson(page, name: str, step: int, steps: int) -> None:
    """Choose lesson `name` and go on to its step `step` (1-based) of `steps`."""
    from playwright.sync_api import expect

    page.locator("#lesson input").fill(name)
    page.keyboard.press("Enter")
    expect(page.locator("#lesson-note")).to_contain_text(f"Step 1 of {steps}")
    for k in range(2, step + 1):
        page.click("#lesson-next")
        expect(page.locator("#lesson-note")).to_contain_text(f"Step {k} of {steps}")


def test_a_lesson_chosen_after_another_runs_on_its_own_model(session, tmp_path):
    """#44 item 2, at a projector's 1024x768: lesson 6 left on its tiny-gemma step, then lesson 7,
    whose first step runs on tiny-llada (it ran on tiny-gemma: an empty answer in 16 steps); read
    from the run's own trace, downloaded from the page."""
    from playwright.sync_api import expect

    from dinfer_viz.studies.lessons import BASE_MODEL, LESSONS, UNIFORM_MODEL

    six, seven = (next(l for l in LESSONS if l.name.startswith(f"{n} ")) for n in (6, 7))
    page = session.page
    page.set_viewport_size({"width": 1024, "height": 768})
    try:
        open_app(page, session.url)
        page.get_by_text("Model and system").click()  # the model box's section, closed by default
        page.locator("#lessons-box").get_by_text("Lessons").click()
        _lesson(page, six.name, 2, len(six.steps))
        expect(page.locator("#model-path textarea, #model-path input").first).to_have_value(UNIFORM_MODEL)
        _lesson(page, seven.name, 1, len(seven.steps))
        expect(page.locator("#model-path textarea, #model-path input").first).to_have_value(BASE_MODEL)
        click_run(page)
        expect(page.locator("#message")).to_contain_text("done")
        with page.expect_download() as download:
            page.click("#download")
        trace = json.loads(open(download.value.path()).read())
        assert trace["model"] == BASE_MODEL and trace["kind"] == "masked", (trace["model"], trace["kind"])
        assert trace["config"]["threshold"] == 0.1 and page.locator("#output textarea").input_value().strip()
        page.locator("#grid").scroll_into_view_if_needed()
        page.screenshot(path=str(Path(SHOTS) / "lesson-7-after-6-1024x768.png" if SHOTS else tmp_path / "lesson-7.png"))
    finally:
        page.set_viewport_size({"width": 1500, "height": 1000})


def test_a_slow_playback_says_which_iteration_it_plays_not_that_a_forward_runs(session, monkeypatch):
    """#44 item 4: at one iteration a second the engine finishes long before the page has played
    its run back; the message says so (it read 'generating: a forward is running'), then done.
    The heartbeat comes every 0.2 s here (the app runs in this process), so several fall between
    two played iterations, whatever the machine's speed."""
    from playwright.sync_api import expect

    monkeypatch.setattr("dinfer_viz.live.runner.HEARTBEAT_SECONDS", 0.2)
    page = session.page
    open_app(page, session.url)
    choose_option(page, "#live-speed", "1 iteration / s")
    click_run(page)
    message = page.locator("#message")
    expect(message).to_contain_text(re.compile(r"playing back: iteration \d+ of \d+ \(the engine (has finished|runs ahead)\)"))
    assert "a forward is running" not in message.inner_text()
    expect(message).to_contain_text("done")
