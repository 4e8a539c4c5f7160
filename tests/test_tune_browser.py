"""The Tune tab in a real browser (issue #45; Debian's chromium driven by Playwright) at 1024x768,
on the embedded model: the front grows as trials finish (every message and chart the page showed,
recorded by the page itself), a click on a point of the front runs that trial's settings on the
Run tab, and Stop ends a study within its running trial.

Every wait is for a condition the page or the engine reaches (a message, a control's value, the
engine's lock), never for a time. Screenshots go to $DINFER_VIZ_SHOTS when set, else to the test's
temp folder.
"""

from __future__ import annotations

import os
import re

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import pytest

from .test_run_on_display_browser import SHOTS, page, shot  # noqa: F401 (the page at 1024x768, its screenshots; `page` uses this module's session)

pytestmark = [pytest.mark.browser, pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore:.*(no_silent_downcasting|copy keyword).*")]
WAIT = 300_000  # ms: a bound on a hang, never a pace
# What the page showed, as it showed it: each change of the Tune tab's message or chart, with the
# message and the number of points the chart drew for trials then (dinfer_viz/studies/tuning.py
# tune_figure's traces 1 and 2: the grey trials and the front's; not the default's or the held-out
# ones). The chart is watched too: on a loaded machine it is drawn after the message that announces it.
RECORD_JS = r"""
() => {
  window.__tune = [];
  const msg = document.querySelector('#tune-message');
  const record = () => {
    const traces = document.querySelectorAll('#tune-chart .scatterlayer .trace');
    const trials = [1, 2].reduce((n, i) => n + (traces[i] ? traces[i].querySelectorAll('.point').length : 0), 0);
    window.__tune.push([msg.innerText, trials]);
  };
  new MutationObserver(record).observe(msg, {subtree: true, childList: true, characterData: true});
  new MutationObserver(record).observe(document.querySelector('#tune-chart'), {subtree: true, childList: true});
}
"""


@pytest.fixture(scope="module")
def session(app_in_browser):
    return app_in_browser


def _start(page, trials: int, fix: str = "gen_length=32") -> None:
    page.get_by_role("tab", name="Tune").click()
    page.locator("#tune-message").wait_for(state="attached")
    page.evaluate(RECORD_JS)
    page.locator("#tune-trials input").fill(str(trials))
    page.locator("#tune-prompts input").fill("2")
    page.locator("#tune-fix textarea").fill(fix)
    page.locator("#tune-decoders input").click()  # narrow to three decoders: every trial runs
    for name in ("threshold", "fixed", "factor"):
        page.get_by_role("option", name=name, exact=True).click()
    page.keyboard.press("Escape")
    page.click("#tune-btn")


def test_the_front_grows_and_a_click_runs_its_trial_on_the_run_tab(session, page, tmp_path):
    from playwright.sync_api import expect

    _start(page, 6)
    message = page.locator("#tune-message")
    expect(message).to_contain_text(re.compile(r"done: 6 trials completed"), timeout=WAIT)
    shot(page, tmp_path, "tune-done")
    seen = page.evaluate("window.__tune")
    counts = [int(m[1]) for text, _ in seen if (m := re.match(r"^\s*(?:done: )?(\d+) trials? completed", text))]
    drawn = [n for text, n in seen if n and not text.strip().startswith("done")]
    assert counts == sorted(counts) and len(set(counts)) >= 3, seen  # one frame per finished trial, in order
    assert len(set(drawn)) >= 2, seen  # the chart grew while the study ran (not drawn once at the end)
    rows = page.locator("#tune-table").get_by_role("row")
    assert rows.count() >= 2  # the header and the front's rows
    expect(page.locator("#tune-table")).to_contain_text("gen_length=32")  # each point's settings (those off their defaults)
    expect(page.locator("#tune-csv")).to_be_visible()

    # a click on a point of the front: the Run tab runs that trial with its settings
    page.locator("#tune-chart").scroll_into_view_if_needed()
    box = page.locator("#tune-chart .scatterlayer .trace").nth(2).locator(".point").first.bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    hover = page.locator("#tune-chart .hoverlayer")
    expect(hover).to_contain_text(re.compile(r"trial \d+"))  # the hover names the point's trial (the topmost of points drawn on one spot)
    label = hover.text_content()
    trial = re.search(r"trial (\d+)", label)[1]
    shot(page, tmp_path, "tune-hover")
    cells = [[c.strip() for c in row.get_by_role("gridcell").all_text_contents()] for row in rows.all()]
    settings = next(c[6] for c in cells if c and c[0] == trial)
    assert settings in label  # and its settings
    named = re.search(r"decoder=(\w+)", settings)
    decoder = named[1] if named else "threshold"  # the default decoder is not named
    block = re.search(r"block_length=(\d+)", settings)
    page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    expect(page.locator("#message")).to_contain_text("done", timeout=WAIT)
    expect(page.locator("#prompt textarea")).to_have_value("Q: ?+?=38 A:")
    expect(page.locator("#cfg-decoder input")).to_have_value(decoder)
    expect(page.locator("#cfg-gen_length input").first).to_have_value("32")
    if block:
        expect(page.locator("#cfg-block_length input").first).to_have_value(block[1])
    shot(page, tmp_path, "tune-opened")
    page.get_by_role("tab", name="Tune").click()  # the wide layout, for the eye only
    page.set_viewport_size({"width": 1400, "height": 1000})
    page.screenshot(path=os.path.join(SHOTS or str(tmp_path), "tune-done-1400x1000.png"), full_page=True)


def test_stop_ends_the_study_within_its_trial(session, page, tmp_path):
    from playwright.sync_api import expect

    _start(page, 200, fix="gen_length=64")
    message = page.locator("#tune-message")
    expect(message).to_contain_text(re.compile(r"^\s*[1-9]\d* trials? completed"), timeout=WAIT)  # (its text starts with spaces)
    page.click("#tune-stop")
    expect(message).to_contain_text(re.compile(r"stopped: \d+ trials? completed"), timeout=WAIT)
    assert session.host.lock.acquire(timeout=120)  # the study's engine worker let go
    session.host.lock.release()
    done = int(re.search(r"stopped: (\d+)", message.inner_text())[1])
    assert done < 200
    shot(page, tmp_path, "tune-stopped")
