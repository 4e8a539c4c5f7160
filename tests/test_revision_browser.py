"""A revision in a real browser (Debian's chromium through Playwright, as tests/test_app_browser.py):
a run of the edit decoder, its controls filled by a published preset, shows an edited cell (the old
token struck through beside the new), the legend's entry and the details panel's revision line, at
a laptop's 1280 px and a projector's 1024 px. The iteration shown is the first that revised, read
from the run's own trace (downloaded from the page), never from a count the weights decide."""

from __future__ import annotations

import json
import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import pytest

from dinfer_viz.panes.grid import CELL_COLOURS

from .app_support import choose_option, click_run, open_app
from .test_app_browser import session  # noqa: F401  (a page of this module's own on the shared app)

pytestmark = [pytest.mark.browser, pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore:.*(no_silent_downcasting|copy keyword).*")]
SHOTS = os.environ.get("DINFER_VIZ_SHOTS")  # a folder to keep the screenshots in (to look at them)


def test_an_edit_run_shows_the_struck_token_the_legend_and_the_rules_numbers(session, tmp_path):
    from playwright.sync_api import expect

    page = session.page
    page.set_viewport_size({"width": 1280, "height": 900})
    open_app(page, session.url)
    page.fill("#prompt textarea", "Q: 12+35=? A:")
    choose_option(page, "#cfg-decoder", "edit")
    expect(page.locator("#decoder-preset")).to_be_visible()
    expect(page.locator("#explain")).to_contain_text("Published default sets")
    choose_option(page, "#decoder-preset", "diffusers")  # 0.7 / 0.5 / 16
    expect(page.locator("#cfg-threshold input[type=number]")).to_have_value("0.7")
    expect(page.locator("[id='cfg-decoder_options.edit_threshold'] input[type=number]")).to_have_value("0.5")
    threshold = page.locator("#cfg-threshold input[type=number]")
    threshold.fill("0.3")  # the base model at 0.3 commits wrong tokens, which the edits take back
    threshold.press("Enter")
    expect(page.locator("#settings-msg")).to_contain_text("settings ok")
    click_run(page)
    expect(page.locator("#message")).to_contain_text("done", timeout=120_000)

    with page.expect_download() as download:
        page.click("#download")
    trace = json.loads(open(download.value.path()).read())
    assert trace["config"]["decoder"] == "edit" and trace["config"]["decoder_options"]["edit_threshold"] == 0.5
    first = next((i, rec["revisions"][0]) for i, rec in enumerate(trace["iterations"]) if rec["revisions"][0])
    index, revisions = first
    edit = next(r for r in revisions if r["kind"] == "edit")

    number = page.locator("#scrub input[type=number]")
    number.fill(str(index + 1))  # the page numbers iterations 1..N
    number.press("Enter")
    expect(page.locator("#grid .caption")).to_contain_text(f"iteration {index + 1}/")
    cell = page.locator(f"#grid .cells .cell.edited[data-p='{edit['position']}']")
    expect(cell).to_have_count(1)
    expect(cell.locator("s.was")).to_have_text(trace["tokens"][str(edit["old"])].replace(" ", "·") if trace["tokens"][str(edit["old"])] != "<|endoftext|>" else "∎")
    assert page.locator("#grid .cells .cell.edited").count() == sum(r["kind"] == "edit" for r in revisions)
    expect(page.locator("#grid .legend .cell.edited")).to_contain_text("edited now")
    expect(page.locator("#grid .legend .cell.remasked")).to_contain_text("remasked now")
    struck = cell.locator("s.was").evaluate("s => getComputedStyle(s).textDecorationLine")
    assert "line-through" in struck

    cell.click()
    details = page.locator("#details")
    expect(details).to_contain_text(f"Position {edit['position']} · iteration {index + 1}")
    expect(details).to_contain_text(f"iteration {index + 1}: edited")
    expect(details).to_contain_text(f"> edit threshold 0.5")
    expect(page.locator("#iterations .js-plotly-plot .barlayer")).to_have_count(1)
    bars = page.evaluate("() => document.querySelector('#iterations .js-plotly-plot')._fullData.filter(t => t.type === 'bar').map(t => t.name)")
    assert bars[-2:] == ["edited", "remasked"]  # stacked on the commits
    marks = page.evaluate("() => document.querySelector('#raster .js-plotly-plot')._fullData.map(t => t.name)")
    assert CELL_COLOURS["edited"][1] in marks  # the raster's edit markers, named in its legend
    if SHOTS:  # the figures too, to look at
        page.screenshot(path=os.path.join(SHOTS, "revision-full.png"), full_page=True)
    for width in (1280, 1024):
        page.set_viewport_size({"width": width, "height": 900})
        cell.scroll_into_view_if_needed()
        shot = (os.path.join(SHOTS, f"revision-{width}.png") if SHOTS else str(tmp_path / f"revision-{width}.png"))
        page.screenshot(path=shot)
        assert os.path.getsize(shot) > 20_000
        box, panel = cell.bounding_box(), details.bounding_box()
        assert box and panel and box["width"] > 0 and panel["x"] > box["x"]  # the details stay beside the grid
    page.set_viewport_size({"width": 1280, "height": 900})


def test_the_live_grid_strikes_the_old_token_while_the_run_streams(session):
    """The same run played back live at 1 iteration a second: the renderer (grid.GRID_JS) applies
    each streamed revision, an edited cell holding the old token in an <s> beside the new one."""
    from playwright.sync_api import expect

    page = session.page
    open_app(page, session.url)
    page.fill("#prompt textarea", "Q: 12+35=? A:")
    choose_option(page, "#cfg-decoder", "edit")
    threshold = page.locator("#cfg-threshold input[type=number]")
    threshold.fill("0.3")
    threshold.press("Enter")
    expect(page.locator("#settings-msg")).to_contain_text("settings ok")
    choose_option(page, "#live-speed", "1 iteration / s")
    click_run(page)
    live = page.locator("#grid .live .cells .cell.edited")
    expect(live.first).to_be_visible(timeout=60_000)
    assert live.first.locator("s.was").count() == 1
    expect(page.locator("#grid .live .caption")).to_contain_text("edited")
    page.click("#stop-btn")

