"""Fill in the middle in a real browser (Debian's chromium through Playwright, at a projector's
1024x768): lesson 9 on the embedded model answers the pair-sum freely, then fills a hole of 3
before a pinned ` + 34`, then the same hole on the model trained to fill; the pinned cells show in their own state (by class, at the positions the
run's trace pins) before the first forward and after the last, the legend names them, and a click
on one says it was pinned by the request. What each step did is read from the run's own trace."""

from __future__ import annotations

import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import pytest

from .app_support import choose_lesson, open_app, screenshot
from .test_app_browser import session  # noqa: F401  (a page of this module's own on the shared app)
from .test_speculative_browser import WAIT, _run_step

pytestmark = [pytest.mark.browser, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


def _pinned_positions(page) -> list[int]:
    return sorted(int(p) for p in page.locator("#grid .cells .cell.pinned").evaluate_all("cells => cells.map(c => c.dataset.p)"))


def _scrub(page, number: int, trace: dict) -> None:
    """Show iteration `number` (0: the canvas before the first forward); done when the caption says so."""
    from playwright.sync_api import expect

    page.locator("#scrub input[type=number]").fill(str(number))
    page.keyboard.press("Enter")
    expect(page.locator("#grid .caption")).to_contain_text(f"iteration {number}/{len(trace['iterations'])}", timeout=WAIT)


def test_lesson_9_fills_a_hole_before_pinned_text_and_shows_the_pinned_cells(session, tmp_path):
    from playwright.sync_api import expect

    page = session.page
    page.set_viewport_size({"width": 1024, "height": 768})
    open_app(page, session.url)
    choose_lesson(page, 9)
    free = _run_step(page)
    assert free["pinned"] is None and page.locator("#grid .cells .cell.pinned").count() == 0
    expect(page.locator("#grid .legend").first).not_to_contain_text("pinned by the request")
    page.click("#lesson-next")
    expect(page.locator("#lesson-note")).to_contain_text("Step 2 of 3")
    filled = _run_step(page)
    pinned = filled["pinned"][0]
    start = filled["prompt_lengths"][0]
    assert pinned == list(range(start + 3, start + 8))  # ` + 34` after the hole of 3
    assert _pinned_positions(page) == pinned
    expect(page.locator("#grid .legend").first).to_contain_text("pinned by the request")
    _scrub(page, 0, filled)  # what was asked, before any forward: the hole masked, the end pinned
    assert _pinned_positions(page) == pinned
    assert sorted(int(p) for p in page.locator("#grid .cells .cell.masked").evaluate_all("cells => cells.map(c => c.dataset.p)")) == [start, start + 1, start + 2]
    _scrub(page, len(filled["iterations"]), filled)
    assert _pinned_positions(page) == pinned
    page.locator(f"#grid .cells .cell[data-p='{pinned[0]}']").click()
    expect(page.locator("#details")).to_contain_text("pinned by the request", timeout=WAIT)
    page.locator("#lesson-note").scroll_into_view_if_needed()
    for name, full in (("infill-1024.png", False), ("infill-1024-page.png", True)):
        screenshot(page, tmp_path, name, full)
    # step 3: the same hole on the model trained to fill, whose answer the verifier accepts
    page.click("#lesson-next")
    expect(page.locator("#lesson-note")).to_contain_text("Step 3 of 3")
    trained = _run_step(page)
    assert trained["model"] == "tiny-llada-infill" and trained["pinned"][0] == pinned
    expect(page.locator("#message")).to_contain_text("pairsum verifier: valid")
    assert _pinned_positions(page) == pinned
    page.locator("#message").scroll_into_view_if_needed()  # the verdict above the grid, not the download row
    screenshot(page, tmp_path, "infill-1024-trained.png")
