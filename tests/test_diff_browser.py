"""The Diff & analysis tab in a real browser (issue #36; Debian's chromium driven by Playwright), at
1024x768 and 1400x1000, on the embedded DiffusionGemma (assets/tiny-gemma): the engine's run in
the Run tab, its analysis panel, transformers' own run recorded beside it in the diff view (equal
step for step), then that reference with a planted change uploaded as trace B: the divergence
found at its step and position, highlighted with both sides' candidates.

Every wait is for a condition the page reaches (a message, a caption), never for a time.
Screenshots go to $DINFER_VIZ_SHOTS when set (to look at them), else to the test's temp folder.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import pytest

from .app_support import app_in_chromium, click_run
from .test_run_on_display_browser import page, shot  # noqa: F401 (the page at 1024x768, its screenshots; `page` uses this module's session)

pytestmark = [pytest.mark.browser, pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore:.*(no_silent_downcasting|copy keyword).*")]
WAIT = 300_000  # ms: generous, for a loaded 2-core machine; only ever a wait for a condition
GEMMA = Path(__file__).resolve().parent.parent / "assets" / "tiny-gemma"


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    with app_in_chromium(tmp_path_factory, model=str(GEMMA)) as app:
        yield app


def planted(data: dict) -> tuple[dict, int, int]:
    """The reference trace `data` with its first step's first accepted proposal changed to another
    token, in place: (the trace, the record, the position)."""
    rec = data["iterations"][0]
    p = rec["committed"][0][0]
    w = p - rec["block_range"][0]
    proposal = rec["state"]["proposal"][0]
    proposal[w] = next(t for t in (5, 6, 7) if t != proposal[w])
    return data, 0, p


def test_a_reference_run_beside_the_engines_and_the_analysis_panel(session, page, tmp_path):
    from playwright.sync_api import expect

    click_run(page)
    expect(page.locator("#message")).to_contain_text("done", timeout=WAIT)
    steps = int(page.locator("#scrub input[type=range]").get_attribute("max"))

    page.get_by_role("tab", name="Diff & analysis").click()
    text = page.locator("#analysis-text")
    expect(text).to_contain_text("order correlation", timeout=WAIT)
    expect(text).to_contain_text(f"{steps} steps")
    expect(text).to_contain_text("Approximated")
    for plot in ("#analysis-steps", "#analysis-order"):
        expect(page.locator(f"{plot} .main-svg").first).to_be_visible(timeout=WAIT)
    expect(page.locator("#analysis-order")).to_contain_text("order correlation ρ")
    page.locator("#analysis-box").scroll_into_view_if_needed()
    shot(page, tmp_path, "analysis")

    # transformers' own generate, recorded beside the engine's run: equal step for step
    page.click("#record-reference")
    expect(page.locator("#diff-message")).to_contain_text("recorded transformers", timeout=WAIT)
    summary = page.locator("#diff-summary")
    expect(summary).to_contain_text("transformers reference")
    expect(summary).to_contain_text(f"A {steps}, B {steps} (equal)")
    expect(summary).to_contain_text("none (every aligned canvas is equal)")
    expect(page.locator("#diff-first")).to_contain_text("no divergence")
    assert page.locator("#diff-strip .col.differs").count() == 0
    expect(page.locator("#diff-chart .main-svg").first).to_be_visible(timeout=WAIT)
    page.locator("#diff-summary").scroll_into_view_if_needed()
    shot(page, tmp_path, "reference-diff")

    # the reference with a planted change as trace B, the run on display as A
    with page.expect_download() as download:
        page.click("#reference-download")
    data, record, position = planted(json.loads(Path(download.value.path()).read_text()))
    changed = tmp_path / "planted-reference.json"
    changed.write_text(json.dumps(data))
    page.locator("#diff-file-b input[type=file]").set_input_files(str(changed))
    # Gradio draws the name and its extension apart ("planted-reference" ".json"), and whether the
    # text between them reads as a space depends on how the row wraps
    expect(page.locator("#diff-file-b")).to_contain_text(re.compile(r"planted-reference\s*\.json"), timeout=WAIT)
    page.click("#diff-btn")
    expect(summary).to_contain_text(f"aligned step {record + 1} at position {position}", timeout=WAIT)
    expect(summary).to_contain_text("planted-reference.json")
    card = page.locator("#diff-first")
    expect(card).to_contain_text(f"first divergence: aligned step {record + 1}, position {position}")
    expect(card).to_contain_text("candidates")
    assert card.locator("tr").count() == 3  # a header and one row per side
    outlined = page.locator("#diff-strip .col.first")
    expect(outlined).to_have_attribute("data-pos", str(position))
    page.locator("#diff-summary").scroll_into_view_if_needed()
    shot(page, tmp_path, "planted-diff")

    # the slider steps both runs: the last step, where the canvases agree again or still differ
    scrub = page.locator("#diff-scrub input[type=number]")
    scrub.fill(str(steps))
    scrub.press("Enter")
    expect(page.locator("#diff-caption")).to_contain_text(f"aligned step {steps}/{steps}", timeout=WAIT)
