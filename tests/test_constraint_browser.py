"""A constrained run in a real browser (Debian's chromium through Playwright, as
tests/test_app_browser.py): the Structured output control refuses an invalid regex before Run (one
line, Run disabled), then a run under the pair-sum regex at τ 0.1 marks the cells where the
constraint removed the model's top-1 (the legend names the mark), a click on one pins the details
panel's account (what the model wanted, with what probability, the tokens allowed and the mass
removed), and the raster names its markers; at a projector's 1024x768 and at 1400x1000. Which
cells are marked is read from the run's own trace (downloaded from the page), never assumed."""

from __future__ import annotations

import json
import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import pytest

from dinfer_viz.studies.lessons import PAIR_SUM_REGEX, STRUCTURE_LESSON_PROMPT

from .app_support import choose_option, click_run, open_app
from .test_app_browser import session  # noqa: F401  (a page of this module's own on the shared app)
from .test_revision_browser import SHOTS

pytestmark = [pytest.mark.browser, pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore:.*(no_silent_downcasting|copy keyword).*")]


def test_a_constrained_run_marks_the_removed_top1_and_the_details_say_what_the_model_wanted(session, tmp_path):
    from playwright.sync_api import expect

    page = session.page
    page.set_viewport_size({"width": 1400, "height": 1000})
    open_app(page, session.url)
    page.fill("#prompt textarea", STRUCTURE_LESSON_PROMPT)
    threshold = page.locator("#cfg-threshold input[type=number]")
    threshold.fill("0.1")
    threshold.press("Enter")
    choose_option(page, "#cfg-constraint", "regex")
    box = page.locator("#cfg-constraint_text textarea")
    box.fill("<b>(")  # invalid: one escaped line, Run disabled
    message = page.locator("#settings-msg")
    expect(message).to_contain_text("invalid regex")
    expect(page.locator("#run-btn")).to_be_disabled()
    assert message.locator("b").count() == 0 and "<b>(" in message.inner_text()
    box.fill(PAIR_SUM_REGEX)
    expect(message).to_contain_text("held to regex")
    expect(page.locator("#run-btn")).to_be_enabled()
    assert "[1-9][0-9]) \\+(" in message.inner_text()  # shown as typed (no Markdown ate its characters)
    click_run(page)
    expect(page.locator("#message")).to_contain_text("done", timeout=120_000)

    with page.expect_download() as download:
        page.click("#download")
    trace = json.loads(open(download.value.path()).read())
    assert trace["config"]["regex"] == PAIR_SUM_REGEX
    last = trace["iterations"][-1]
    cut = {}  # position -> (record index, its constraint numbers) of every committed cell whose top-1 was removed
    for index, rec in enumerate(trace["iterations"]):
        s = rec["block_range"][0]
        c = rec["constraint"]
        for p in rec["committed"][0]:
            if c and c["top1_removed"][0] and c["top1_removed"][0][p - s]:
                cut[p] = (index, {k: c[k][0][p - s] for k in ("allowed", "removed", "model_top1", "model_probability")})
    assert cut, "the constraint removed no top-1 on the lesson's prompt"
    cells = page.locator("#grid .cells .cell.cut")
    expect(cells).to_have_count(len(cut))
    assert sorted(int(p) for p in cells.evaluate_all("cs => cs.map(c => c.dataset.p)")) == sorted(cut)
    dot = cells.first.evaluate("c => getComputedStyle(c, '::before').backgroundColor")
    assert dot == "rgb(8, 145, 178)"  # the mark's dot (cells.CONSTRAINT_COLOUR), beside the state's own colour
    expect(page.locator("#grid .legend .cell.cut")).to_contain_text("constraint removed the model's top-1")
    expect(page.locator("#grid .caption")).to_contain_text("constraint removed")
    assert last["constraint"] is not None

    p = min(cut)
    index, numbers = cut[p]
    cell = page.locator(f"#grid .cells .cell.cut[data-p='{p}']")
    cell.click()
    details = page.locator("#details")
    expect(details).to_contain_text(f"Position {p} ·")
    expect(details).to_contain_text("the model wanted")
    wanted = trace["tokens"][str(numbers["model_top1"])]
    expect(details).to_contain_text(f"with probability {numbers['model_probability']:.3f}")
    expect(details).to_contain_text(f"{numbers['allowed']} token{'s' * (numbers['allowed'] != 1)} allowed here")
    expect(details).to_contain_text(f"{numbers['removed']:.3f} of the probability mass removed")
    expect(details).to_contain_text("the constraint removed it")
    assert repr(wanted)[1:-1] in details.inner_text() or wanted in details.inner_text()
    marks = page.evaluate("() => document.querySelector('#raster .js-plotly-plot')._fullData.map(t => t.name)")
    assert "constraint removed the top-1 (size: mass removed)" in marks
    if SHOTS:
        page.screenshot(path=os.path.join(SHOTS, "constraint-full.png"), full_page=True)
    for width, height in ((1400, 1000), (1024, 768)):
        page.set_viewport_size({"width": width, "height": height})
        cell.scroll_into_view_if_needed()
        shot = os.path.join(SHOTS, f"constraint-{width}.png") if SHOTS else str(tmp_path / f"constraint-{width}.png")
        page.screenshot(path=shot)
        assert os.path.getsize(shot) > 20_000
        box_cell, panel = cell.bounding_box(), details.bounding_box()
        assert box_cell and panel and box_cell["width"] > 0 and panel["x"] > box_cell["x"]  # the details stay beside the grid
    page.set_viewport_size({"width": 1400, "height": 1000})
