"""The app in a real browser: Debian's chromium driven by Playwright (never a downloaded browser).

In CI (CI set) a missing chromium or playwright is a failure; elsewhere these tests skip, saying why.
"""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import pytest

from engine import GenerationConfig

from .app_support import BROWSER_ARGS, CHROMIUM, require_browser, handmade_trace, launch_app

pytestmark = [pytest.mark.browser, pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore:.*(no_silent_downcasting|copy keyword).*")]


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    """(page, host, url): a browser page on the app, the app's engine host, and its address."""
    require_browser()
    from playwright.sync_api import sync_playwright

    demo, url, host = launch_app(tmp_path_factory, fps=20, plot_hz=3)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
        page = browser.new_page(viewport={"width": 1500, "height": 1000}, accept_downloads=True)
        page.goto(url)
        yield SimpleNamespace(page=page, host=host, url=url)
        browser.close()
    demo.close()


def test_run_in_the_browser_renders_grid_and_plots(session, tmp_path):
    from playwright.sync_api import expect

    page, host = session.page, session.host
    page.fill("#prompt textarea", "Q: 23+45=? A:")
    page.click("#run-btn")
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
    assert trace["version"] == 1 and len(trace["iterations"]) == trace["stats"]["nfe"]


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
    page.locator("#scrub input[type=number]").fill("1")
    page.keyboard.press("Enter")
    expect(caption).to_contain_text("iteration 2/4 · block 0 [3, 7) · window forward")
    page.click("#play-btn")
    expect(caption).to_contain_text("iteration 4/4", timeout=10_000)


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
    page.goto(session.url)
    page.locator("#cfg-decoder input").fill("fixed")
    page.keyboard.press("Enter")
    for field in ("gen_length", "block_length"):
        page.fill(f"#cfg-{field} input", "16")
    page.locator("#live-speed input").fill("5 iterations / s")  # the live view lasts about 3 s
    page.keyboard.press("Enter")
    page.click("#run-btn")
    expect(page.locator("#grid .live .cells .cell.old").first).to_be_visible(timeout=60_000)  # live, a commit painted
    live_cells = page.locator("#grid .live .cells .cell").all_inner_texts()
    assert page.evaluate("window.pwned") is None and page.locator("#grid script, #grid img").count() == 0
    assert LIVE_HOSTILE in live_cells, live_cells  # the prompt's cells, as text
    expect(page.locator("#message")).to_contain_text("done", timeout=60_000)
    assert page.evaluate("window.pwned") is None and page.locator("#grid script, #grid img").count() == 0
    final_cells = page.locator("#grid .cells .cell").all_inner_texts()  # the server-side grid, through the template
    assert LIVE_HOSTILE in final_cells
    page.goto(session.url)  # the next test starts from the default settings


def test_stop_and_a_tab_switch_answer_quickly_during_a_long_live_run(session):
    """What benchmarks/app_frames.py measures (real mouse clicks, times from the click events), with
    bounds generous enough for a loaded machine; the benchmark prints the real figures."""
    from benchmarks.app_frames import stopped_run

    figures = stopped_run(session.page, session.url, 448, session.host.lock)
    assert not figures["completed"], figures  # Stop ended the run before its 448th iteration
    assert figures["stop_message_s"] < 3 and figures["stop_free_s"] < 3, figures
    assert figures["compare_ms"] < 2000 and figures["run_ms"] < 2000, figures
