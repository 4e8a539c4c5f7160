"""A uniform-state run in a real browser (Debian's chromium through Playwright, as
tests/test_app_browser.py): the tiny DiffusionGemma typed into the model box runs its sampler from
the Run tab, and the page shows noise turning into text: the grid's noise / accepted cells and the
legend of that kind of run, the raster's entropies with the bound, the details panel's step table,
at a laptop's 1400 px and a projector's 1024x768; then Compare sets the masked model against it on
one slider. What each step did is read from the run's own trace (downloaded from the page), never
from a count the weights decide."""

from __future__ import annotations

import json
import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import pytest

from .app_support import click_run, fill_model, open_app, screenshot
from .test_app_browser import session  # noqa: F401  (a page of this module's own on the shared app)

pytestmark = [pytest.mark.browser, pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore:.*(no_silent_downcasting|copy keyword).*")]
PROMPT = "Q: 7+5=? A:"


def test_a_uniform_run_shows_noise_turning_into_text(session, tiny_gemma_folder, tmp_path):
    from playwright.sync_api import expect

    page = session.page
    page.set_viewport_size({"width": 1400, "height": 1000})
    open_app(page, session.url)
    page.get_by_text("Model and system").click()
    fill_model(page, str(tiny_gemma_folder))
    page.fill("#prompt textarea", PROMPT)
    for field, value in (("gen_length", "16"), ("block_length", "16")):
        page.fill(f"#cfg-{field} input", value)
    click_run(page)
    expect(page.locator("#message")).to_contain_text("done", timeout=120_000)
    expect(page.locator("#stats")).to_contain_text("uniform-state model")
    expect(page.locator("#explain")).to_contain_text("entropy")  # the sampler that ran, not the threshold decoder chosen
    with page.expect_download() as download:
        page.click("#download")
    trace = json.loads(open(download.value.path()).read())
    assert trace["config"]["decoder"] == "uniform" and trace["block_length"] == 8  # fitted to the checkpoint's canvas
    index = next(i for i, rec in enumerate(trace["iterations"]) if rec["state"]["output"] is None and rec["state"]["renoised"][0])
    rec = trace["iterations"][index]

    number = page.locator("#scrub input[type=number]")
    number.fill(str(index + 1))  # the page numbers iterations 1..N
    number.press("Enter")
    expect(page.locator("#grid .caption")).to_contain_text(f"iteration {index + 1}/")
    expect(page.locator("#grid .caption")).to_contain_text(f"accepted {len(rec['committed'][0])} (entropy bound")
    assert page.locator("#grid .cells .cell.accepted").count() == len(rec["committed"][0])
    assert page.locator("#grid .cells .cell.noise").count() == len(rec["state"]["renoised"][0])
    expect(page.locator("#grid .legend .cell.noise")).to_contain_text("noise")
    assert page.locator("#grid .legend .cell.new").count() == 0  # a masked run's states are not in this legend
    colour_bar = page.evaluate("() => document.querySelector('#raster .js-plotly-plot')._fullData.find(t => t.type === 'heatmap').colorbar.title.text")
    assert "entropy" in colour_bar
    names = page.evaluate("() => document.querySelector('#raster .js-plotly-plot')._fullData.map(t => t.name || '')")
    assert any("bound" in n for n in names)  # the accepted markers, named with the bound

    cell = page.locator(f"#grid .cells .cell[data-p='{rec['state']['renoised'][0][0]}']")
    cell.click()
    details = page.locator("#details")
    expect(details).to_contain_text("entropy")
    expect(details).to_contain_text("bound")
    for width, height in ((1400, 1000), (1024, 768)):
        page.set_viewport_size({"width": width, "height": height})
        cell.scroll_into_view_if_needed()
        screenshot(page, tmp_path, f"uniform-{width}.png")
        box, panel = cell.bounding_box(), details.bounding_box()
        assert box and panel and box["width"] > 0 and panel["width"] > 0
    page.locator("#raster").scroll_into_view_if_needed()
    screenshot(page, tmp_path, "uniform-raster-1024.png")
    page.set_viewport_size({"width": 1400, "height": 1000})


def test_compare_sets_a_masked_model_against_a_uniform_one_on_one_slider(session, tiny_gemma_folder, tmp_path):
    from playwright.sync_api import expect

    page = session.page
    page.set_viewport_size({"width": 1024, "height": 768})
    open_app(page, session.url)
    page.fill("#prompt textarea", PROMPT)
    for field in ("gen_length", "block_length"):
        page.fill(f"#cfg-{field} input", "16")
    page.get_by_role("tab", name="Compare").click()
    model_b = page.locator("#compare-model-b input")
    model_b.fill(str(tiny_gemma_folder))
    model_b.press("Enter")
    page.fill("#compare-passes input[type=number]", "1")
    page.click("#compare-btn")
    expect(page.locator("#compare-message")).to_contain_text("done:", timeout=180_000)
    expect(page.locator("#compare-title-b")).to_contain_text("uniform")
    expect(page.locator("#compare-title-a")).to_contain_text("masked")
    # polled, not counted once: in one CI run a count taken as "done:" showed found no committed
    # cell in A's grid (not reproduced on this machine under load; if the grid never gets them,
    # this still fails, after the wait)
    expect(page.locator("#grid-b .cells .cell.output")).not_to_have_count(0)
    expect(page.locator("#grid-a .cells .cell.old, #grid-a .cells .cell.new, #grid-a .cells .cell.forced")).not_to_have_count(0)
    scrub = page.locator("#compare-scrub input[type=number]")
    scrub.fill("1")
    scrub.press("Enter")
    expect(page.locator("#grid-b .caption")).to_contain_text("iteration 1/")
    expect(page.locator("#grid-a .caption")).to_contain_text("iteration 1/")
    page.locator("#grid-a").scroll_into_view_if_needed()
    screenshot(page, tmp_path, "uniform-compare-1024.png")
    page.set_viewport_size({"width": 1400, "height": 1000})
