"""The panels beside the grid at a projector's 1024x768 and a laptop's 1400x1000 (issue #44 items
5 and 6), in a real browser (Debian's chromium driven by Playwright): the details panel of a
threshold run and of a self-speculative run, and the explanation, show every word whole (no label
broken "positio/n"), nothing past the panel's edge, the explanation uncut, and a position's rows
within one screen of the panel's top; a sweep's wrong answer opens on the Run tab with its
message, grid and details panel on the screen (the window kept the sweep tab's scroll).

Every check reads the page's own state (element boxes, scroll positions, text), never a time.
Screenshots go to $DINFER_VIZ_SHOTS when set (to look at them), else to the test's temp folder.
"""

from __future__ import annotations

import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import pytest

# the launched app: the run-on-display tests' fixture
from .app_support import choose_lesson, click_run
from .test_run_on_display_browser import SIZES, open_page, session  # noqa: F401

pytestmark = [pytest.mark.browser, pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore:.*(no_silent_downcasting|copy keyword).*")]
SHOTS = os.environ.get("DINFER_VIZ_SHOTS")
WAIT = 300_000  # ms: generous, for a loaded 2-core machine; only ever a wait for a condition

# every word (a run of letters and digits between spaces and hyphens) laid out on more than one
# line: a word broken inside, as "positio/n" was
BROKEN_WORDS_JS = """(selector) => {
  const out = [];
  for (const root of document.querySelectorAll(selector)) {
    const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
    for (let n = walker.nextNode(); n; n = walker.nextNode()) {
      const re = /[^\\s\\-]+/g; let m;
      while ((m = re.exec(n.textContent))) {
        const r = document.createRange(); r.setStart(n, m.index); r.setEnd(n, m.index + m[0].length);
        const lines = new Set(Array.from(r.getClientRects()).filter(b => b.width > 0).map(b => Math.round(b.top)));
        if (lines.size > 1) out.push(m[0]);
      }
    }
  }
  return out;
}"""
# every element of the panel whose box reaches past the panel's right edge, or that scrolls
# sideways (content wider than its box: a column behind a scroll)
PAST_THE_EDGE_JS = """(selector) => {
  const panel = document.querySelector(selector);
  const right = panel.getBoundingClientRect().right;
  return Array.from(panel.querySelectorAll('*')).flatMap(el => {
    const r = el.getBoundingClientRect();
    const out = [];
    if (r.width > 0 && r.right > right + 1) out.push(`${el.tagName} '${el.textContent.slice(0, 30)}' ends at ${Math.round(r.right)} > ${Math.round(right)}`);
    if (el.scrollWidth > el.clientWidth + 1 && getComputedStyle(el).overflowX !== 'visible') out.push(`${el.tagName}.${el.className} scrolls: ${el.scrollWidth} > ${el.clientWidth}`);
    return out;
  });
}"""
# how far below the panel's top its position rows (the table before the history) end, in px
ROWS_END_JS = """() => {
  const panel = document.querySelector('#details .pos-details');
  const rows = panel.querySelector(':scope > table');
  return rows.getBoundingClientRect().bottom - panel.getBoundingClientRect().top;
}"""


@pytest.fixture(params=SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
def page(session, request):
    return open_page(session, *request.param)


def shot(page, tmp_path, name: str) -> str:
    path = os.path.join(SHOTS, f"{name}-{page.size}.png") if SHOTS else str(tmp_path / f"{name}.png")
    page.screenshot(path=path)
    return path


def fits(page, what: str) -> None:
    """The details panel and the explanation: every word whole, nothing past the panel's edge or
    behind a sideways scroll, the explanation uncut (no box of its own), and the position's rows
    within one screen of the panel's top (its "why" and candidates beside the grid)."""
    details = page.locator("#details .pos-details")
    assert page.evaluate(BROKEN_WORDS_JS, "#details, #explain") == [], what
    assert page.evaluate(PAST_THE_EDGE_JS, "#details .pos-details") == [], what
    explain = page.evaluate("() => { const e = document.querySelector('#explain'); return [e.scrollHeight, e.clientHeight]; }")
    assert explain[0] <= explain[1] + 1, (what, explain)
    assert page.evaluate(ROWS_END_JS) <= page.viewport_size["height"], what
    panel, grid = details.bounding_box(), page.locator("#grid .cells").bounding_box()
    assert panel and grid and panel["x"] >= grid["x"] + grid["width"], (panel, grid)  # beside the grid


def test_a_threshold_runs_details_and_the_explanation_fit(page, tmp_path):
    from playwright.sync_api import expect

    click_run(page)
    expect(page.locator("#message")).to_contain_text("done", timeout=WAIT)
    page.locator("#grid .cells .cell").nth(14).click()
    expect(page.locator("#details .pos-details")).to_contain_text("Position 14")
    expect(page.locator("#details .history")).to_contain_text("confidence")
    fits(page, "threshold run")
    page.locator("#details").scroll_into_view_if_needed()
    shot(page, tmp_path, "details")
    page.locator("#explain").scroll_into_view_if_needed()
    shot(page, tmp_path, "explanation")


def test_a_speculative_runs_details_fit(session, tmp_path):
    """Lesson 8's third step: tiny-llada2, the speculative kind; its drafts table in the panel."""
    from playwright.sync_api import expect

    page = open_page(session, *SIZES[0])
    steps = len(choose_lesson(page, 8).steps)
    page.click("#lesson-next")
    expect(page.locator("#lesson-note")).to_contain_text(f"Step 2 of {steps}")
    page.click("#lesson-next")
    expect(page.locator("#lesson-note")).to_contain_text(f"Step 3 of {steps}")
    click_run(page)
    expect(page.locator("#message")).to_contain_text("done", timeout=WAIT)
    expect(page.locator("#model-status")).to_contain_text("tiny-llada2")
    page.locator("#grid .cells .cell.new").first.click()
    expect(page.locator("#details .history")).to_contain_text("verifier")
    fits(page, "speculative run")
    page.locator("#details").scroll_into_view_if_needed()
    shot(page, tmp_path, "speculative-details")


def test_a_sweeps_wrong_answer_opens_at_the_grid(session, tmp_path):
    from playwright.sync_api import expect

    page = open_page(session, *SIZES[0])
    page.get_by_role("tab", name="Threshold sweep").click()
    page.get_by_label("prompts per set").fill("3")
    page.get_by_label("values", exact=True).fill("0.05, 0.1")
    page.click("#sweep-btn")
    expect(page.locator("#sweep-message")).to_contain_text("done", timeout=WAIT)
    expect(page.locator("#sweep-failure-counts")).to_contain_text("wrong")
    row = page.get_by_role("gridcell").filter(has_text="Q: ").first  # a prompt cell of a wrong answer
    row.scroll_into_view_if_needed()
    assert page.evaluate("() => window.scrollY") > page.viewport_size["height"]  # far down the sweep tab
    row.click()
    expect(page.locator("#message")).to_contain_text("wrong answer from the sweep", timeout=WAIT)
    # pair-sum (the default prompt set) has many right answers: no first wrong commit to pin (#54 item 4)
    expect(page.locator("#message")).to_contain_text("no first wrong commit: pairsum has many right answers")
    # the message at the screen's top, the grid under it and the details panel beside it, on screen
    page.wait_for_function(
        """() => { const top = s => document.querySelector(s).getBoundingClientRect();
          const m = top('#message'), g = top('#grid .cells'), d = top('#details');
          return m.top >= -1 && m.top < 40 && g.bottom <= innerHeight && d.top < innerHeight / 2; }""",
        timeout=WAIT,
    )
    shot(page, tmp_path, "sweep-wrong-answer")
