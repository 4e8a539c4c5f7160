"""The example kind (examples/margin_kind.py, loaded by path) on the Run tab in a real browser
(Debian's chromium through Playwright, at a projector's 1024x768): the page lists it with the
engine's kinds, shows its own `margin` control and no decoder section, runs it, draws its canvas
with the masked view, and its readout shows the engine's NFE and TPF (read from the run's own
trace, downloaded from the page)."""

from __future__ import annotations

import json
import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import pytest

from .app_support import app_in_chromium, choose_option, click_run, open_app, screenshot
from .test_example_kind import load_example

pytestmark = [pytest.mark.browser, pytest.mark.filterwarnings("ignore::DeprecationWarning")]
WAIT = 300_000  # ms: a bound on a condition on a loaded machine, never a pace


@pytest.fixture(scope="module")
def app_with_the_example(tmp_path_factory):
    """The app on the embedded tiny-llada, built with the example kind registered (as
    $DINFER_VIZ_KINDS registers it before the page is built); the registry restored after."""
    from engine.kinds import KINDS

    saved = dict(KINDS)
    kind = load_example()
    KINDS[kind.name] = kind
    try:
        with app_in_chromium(tmp_path_factory, model="tiny-llada") as app:
            yield app
    finally:
        KINDS.clear()
        KINDS.update(saved)


def test_the_run_tab_runs_the_example_kind_and_reads_its_forwards(app_with_the_example, tmp_path):
    from playwright.sync_api import expect

    page = app_with_the_example.browser.new_page(viewport={"width": 1024, "height": 768})
    open_app(page, app_with_the_example.url)
    page.fill("#prompt textarea", "Q: ?+?=38 A:")
    page.get_by_text("Diffusion kind", exact=True).click()  # the settings section, closed by default
    choose_option(page, "#cfg-kind", "margin")
    margin = page.locator("[id='cfg-kind_options.margin']")
    expect(margin).to_be_visible(timeout=WAIT)
    expect(page.locator("#cfg-decoder")).to_be_hidden(timeout=WAIT)  # a kind that takes no decoder
    margin.locator("input[type=number]").fill("0.3")
    margin.locator("input[type=number]").press("Enter")
    expect(page.locator("#run-btn")).to_be_enabled(timeout=WAIT)
    click_run(page)
    expect(page.locator("#message")).to_contain_text("done", timeout=WAIT)
    with page.expect_download() as download:
        page.click("#download")
    trace = json.loads(open(download.value.path()).read())
    assert trace["kind"] == "margin" and trace["config"]["kind_options"] == {"margin": 0.3}
    nfe, tokens = trace["stats"]["nfe"], trace["stats"]["tokens"]
    assert nfe == sum(r["forwards"] for r in trace["iterations"])
    stats = page.locator("#stats")
    expect(stats).to_contain_text(f"{tokens / nfe:.2f}", timeout=WAIT)
    cells = [c.strip() for c in stats.locator("td").all_inner_texts()]
    assert str(nfe) in cells and f"{tokens / nfe:.2f}" in cells, cells
    expect(page.locator("#explain")).to_contain_text("The margin kind (no decoder)", timeout=WAIT)  # not the page's decoder's paragraph
    expect(page.locator("#grid .cells .cell").first).to_be_visible()
    assert page.locator("#grid .cells .cell.masked").count() == 0
    screenshot(page, tmp_path, "example-kind-1024.png", full=True)
    page.close()
