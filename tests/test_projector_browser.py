"""The page at a projector's size and a laptop's (issue #34 item 6), in a real browser (Debian's
chromium driven by Playwright), at 1024x768 and 1400x1000: Compare's tables fit their columns
with no hidden scroll and A's and B's grids line up; the details panel shows everything with no
scroll of its own; a lesson's step sentence sits above the grid; the sweep table's columns all
show and the runs' analyses draw against the swept value; no figure's legend, axis title or point
label covers another (an exported PNG is Plotly's rendering of the same layout at twice the size).

Every wait is for a condition the page reaches, never for a time. Screenshots go to
$DINFER_VIZ_SHOTS when set (to look at them), else to the test's temp folder.
"""

from __future__ import annotations

import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import pytest

from .app_support import click_run

# the launched app: the run-on-display tests' fixture
from .test_run_on_display_browser import SIZES, open_page, session  # noqa: F401

pytestmark = [pytest.mark.browser, pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore:.*(no_silent_downcasting|copy keyword).*")]
SHOTS = os.environ.get("DINFER_VIZ_SHOTS")
WAIT = 300_000  # ms: generous, for a loaded 2-core machine; only ever a wait for a condition


@pytest.fixture(params=SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
def page(session, request):
    """The page at each size: these tests are about layout."""
    return open_page(session, *request.param)


# every pair of text boxes of a figure that must stay apart: its legend, axis titles, tick labels,
# colour bar and point labels (a box of zero size is not drawn)
OVERLAPS_JS = """(selector) => {
  const plot = document.querySelector(selector + ' .js-plotly-plot');
  if (!plot) return ['no plot'];
  const boxes = [];
  const add = (kind, el) => { const r = el.getBoundingClientRect(); if (r.width > 0 && r.height > 0) boxes.push({kind, r, text: el.textContent}); };
  plot.querySelectorAll('.legend').forEach(el => add('legend', el));
  plot.querySelectorAll('.g-xtitle text, .g-x2title text, .g-ytitle text, .g-y2title text, .g-y3title text').forEach(el => add('title', el));
  plot.querySelectorAll('.xtick text, .x2tick text').forEach(el => add('tick', el));
  plot.querySelectorAll('.textpoint text').forEach(el => add('label', el));
  plot.querySelectorAll('.colorbar').forEach(el => add('colorbar', el));
  const hit = (a, b) => a.left < b.right - 1 && b.left < a.right - 1 && a.top < b.bottom - 1 && b.top < a.bottom - 1;
  const out = [];
  for (let i = 0; i < boxes.length; i++) for (let j = i + 1; j < boxes.length; j++) {
    const a = boxes[i], b = boxes[j];
    if (a.kind === 'tick' && b.kind === 'tick') continue;  // plotly spaces its own ticks
    if (hit(a.r, b.r)) out.push(`${a.kind} '${a.text.slice(0, 30)}' over ${b.kind} '${b.text.slice(0, 30)}'`);
  }
  return out;
}"""
# a box that scrolls sideways: content wider than the box, with an overflow that hides it
HIDDEN_SCROLL_JS = """(selector) => Array.from(document.querySelectorAll(selector)).flatMap(root => [root, ...root.querySelectorAll('*')])
  .filter(el => el.scrollWidth > el.clientWidth + 1 && ['auto', 'scroll', 'hidden'].includes(getComputedStyle(el).overflowX))
  .map(el => `${el.tagName}.${el.className}: ${el.scrollWidth} > ${el.clientWidth}`)"""


def shot(page, tmp_path, name: str, full: bool = False) -> str:
    path = os.path.join(SHOTS, f"{name}-{page.size}.png") if SHOTS else str(tmp_path / f"{name}.png")
    page.screenshot(path=path, full_page=full)
    return path


def box(page, selector: str) -> dict:
    found = page.locator(selector).first.bounding_box()
    assert found, f"{selector} is not on the page"
    return found


def no_overlaps(page, *plots: str) -> None:
    for selector in plots:
        page.locator(f"{selector} .js-plotly-plot").first.wait_for(timeout=WAIT)
        assert page.evaluate(OVERLAPS_JS, selector) == [], selector


def test_the_run_tab_details_lesson_and_figures(page, tmp_path):
    from playwright.sync_api import expect

    from dinfer_viz.studies.lessons import LESSONS

    click_run(page)
    expect(page.locator("#message")).to_contain_text("done", timeout=WAIT)
    page.locator("#grid .cells .cell").nth(14).click()
    details = page.locator("#details .pos-details")
    expect(details).to_contain_text("Position 14")
    # everything the panel says shows: it grows, with no scroll of its own
    assert page.evaluate("() => { const d = document.querySelector('#details .pos-details'); return d.scrollHeight <= d.clientHeight + 1; }")
    expect(details).to_contain_text("why")
    page.locator("#grid").scroll_into_view_if_needed()
    shot(page, tmp_path, "run-details")
    page.locator("#raster").scroll_into_view_if_needed()
    page.locator("#raster .js-plotly-plot").wait_for(timeout=WAIT)
    shot(page, tmp_path, "run-figures")
    no_overlaps(page, "#raster", "#iterations", "#cost")
    # a lesson's step: its sentence above the grid, both on one screen
    page.locator("#lessons-box").get_by_text("Lessons").click()
    page.locator("#lesson input").fill(LESSONS[0].name)
    page.keyboard.press("Enter")
    expect(page.locator("#lesson-note")).to_contain_text("Step 1 of 4")
    page.locator("#lesson-note").scroll_into_view_if_needed()
    note, grid = box(page, "#lesson-note"), box(page, "#grid .cells")
    assert note["y"] + note["height"] <= grid["y"], (note, grid)
    assert grid["y"] - note["y"] < page.viewport_size["height"] / 2  # the sentence and the grid on one screen
    shot(page, tmp_path, "lesson-step")


def test_compare_tables_fit_and_the_grids_line_up(page, tmp_path):
    from playwright.sync_api import expect

    page.get_by_role("tab", name="Compare").click()
    page.click("#compare-btn")
    expect(page.locator("#compare-message")).to_contain_text("done:", timeout=WAIT)
    page.locator("#stats-a").scroll_into_view_if_needed()
    shot(page, tmp_path, "compare")
    assert page.evaluate(HIDDEN_SCROLL_JS, "#stats-a, #stats-b") == []
    for side in "ab":  # the table fills its column and every header shows
        table, column = box(page, f"#stats-{side} table"), box(page, f"#stats-{side}")
        assert table["x"] + table["width"] <= column["x"] + column["width"] + 1
    a, b = box(page, "#grid-a .cells"), box(page, "#grid-b .cells")
    assert abs(a["y"] - b["y"]) <= 2, (a, b)  # A's (fixed decoder: more settings) and B's grids start level
    no_overlaps(page, "#compare-chart")


def test_the_sweep_table_shows_every_column_and_its_labels_stay_apart(page, tmp_path):
    from playwright.sync_api import expect

    page.get_by_role("tab", name="Threshold sweep").click()
    page.locator("#sweep-btn").wait_for()
    per_set = page.get_by_label("prompts per set")
    per_set.fill("3")
    values = page.get_by_label("values", exact=True)
    values.fill("0.05, 0.1, 0.3, 0.5, 0.7, 0.9, 0.95")
    page.click("#sweep-btn")
    expect(page.locator("#sweep-message")).to_contain_text("done", timeout=WAIT)
    assert page.evaluate(HIDDEN_SCROLL_JS, "#sweep-table") == []
    headers = page.locator("#sweep-table thead th")
    table = box(page, "#sweep-table")
    for k in range(headers.count()):
        cell = headers.nth(k).bounding_box()
        assert cell and cell["x"] + cell["width"] <= table["x"] + table["width"] + 1, headers.nth(k).text_content()
    no_overlaps(page, "#sweep-chart")
    # the runs' analyses against the swept value (issue #36 item 3): ρ overall and within blocks,
    # KL area and converged drawn with their points, no title, tick or legend over another
    analysis = page.locator("#sweep-analysis-chart")
    analysis.scroll_into_view_if_needed()
    no_overlaps(page, "#sweep-analysis-chart")
    drawn = analysis.locator(".scatterlayer .trace")  # ρ overall, ρ within blocks, KL area, converged
    assert drawn.count() == 4
    # every value's KL area and share converged drawn; ρ where a value's runs have one (a block
    # finalised in one step has none, so ρ within blocks may be missing at a low threshold)
    assert [drawn.nth(k).locator(".points path").count() for k in (2, 3)] == [7, 7]
    assert drawn.nth(0).locator(".points path").count() >= 1
    assert analysis.locator(".g-ytitle, .g-y2title, .g-y3title").count() == 3
    shot(page, tmp_path, "sweep-analysis")
    shot(page, tmp_path, "sweep", full=True)
    expect(page.locator("#sweep-failure-counts")).to_contain_text("wrong")
    # the wrong answers of one value: the filter lists its rows only, and a click opens one of them
    page.locator("#sweep-failures-at input").click()
    option = page.get_by_role("option").filter(has_text="τ=0.1 ·")
    option.click()
    first = page.locator("#sweep-failures tbody tr td:first-child")
    expect(first.first).to_have_text("0.1", timeout=WAIT)
    assert set(first.all_text_contents()) == {"0.1"}
    page.get_by_role("gridcell").filter(has_text="Q: ?+?=").first.click()  # a prompt cell of the table listed
    expect(page.locator("#message")).to_contain_text("threshold = 0.1", timeout=WAIT)

