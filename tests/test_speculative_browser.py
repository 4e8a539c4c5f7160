"""Self-speculative decoding in a real browser (Debian's chromium through Playwright, at a
projector's 1024x768): lesson 8 on the embedded block-diffusion model `tiny-llada2` steps from
block length 1 to the speculative kind; the run shows its drafts, accepted tokens and corrections,
its details panel says why a drafted token was kept or replaced, and its answer is step 1's.
What each step did is read from the run's own trace (downloaded from the page)."""

from __future__ import annotations

import json
import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import pytest

from .app_support import choose_lesson, click_run, open_app, screenshot
from .test_app_browser import session  # noqa: F401  (a page of this module's own on the shared app)

pytestmark = [pytest.mark.browser, pytest.mark.filterwarnings("ignore::DeprecationWarning")]
WAIT = 300_000  # ms: a bound on a condition on a loaded machine, never a pace


def _run_step(page) -> dict:
    """Run the lesson's current step; its trace, downloaded from the page. The step's own "done":
    the message holds the last run's until this run's first frame, and shows a progress line over
    it while the event is pending, so the wait reads the message's own text once nothing is
    pending (the steps' runs end in different iteration counts, so their messages differ)."""
    said = "() => document.querySelector('#message [data-testid=markdown]').textContent.trim()"
    before = page.evaluate(said)
    click_run(page)
    page.wait_for_function(
        "([before]) => { const m = document.querySelector('#message [data-testid=markdown-wrapper]');"
        " const t = m.textContent.trim(); return !m.classList.contains('pending') && t !== before && t.includes('done'); }",
        arg=[before], timeout=WAIT,
    )
    with page.expect_download() as download:
        page.click("#download")
    return json.loads(open(download.value.path()).read())


def test_lesson_8_runs_the_speculative_kind_and_shows_its_drafts(session, tmp_path):
    from playwright.sync_api import expect

    page = session.page
    page.set_viewport_size({"width": 1024, "height": 768})
    open_app(page, session.url)
    steps = len(choose_lesson(page, 8).steps)
    autoregressive = _run_step(page)
    for step in (2, 3):  # a click while the last one's step is on its way is dropped (Gradio's trigger_mode "once")
        page.click("#lesson-next")
        expect(page.locator("#lesson-note")).to_contain_text(f"Step {step} of {steps}")
    page.get_by_text("Diffusion kind", exact=True).click()  # the settings section, closed by default
    expect(page.locator("#cfg-kind input")).to_have_value("speculative")
    trace = _run_step(page)
    assert trace["kind"] == "speculative" and trace["final"] == autoregressive["final"]  # the block-length-1 answer
    assert trace["stats"]["nfe"] < autoregressive["stats"]["nfe"]  # in fewer forwards
    # the readout counts the engine's forwards (a draft and a verify per verified step), not the steps
    nfe, tokens = trace["stats"]["nfe"], trace["stats"]["tokens"]
    assert nfe == sum(r["forwards"] for r in trace["iterations"]) == sum(1 + r["state"]["verified"][0] for r in trace["iterations"])
    cells = [c.strip() for c in page.locator("#stats td").all_inner_texts()]
    assert str(nfe) in cells and f"{tokens / nfe:.2f}" in cells, cells
    expect(page.locator("#explain")).to_contain_text("verif")
    # scrub to a step that corrected a draft, if one did, else to the first; its cells say which is which
    steps = trace["iterations"]
    chosen = next((i for i, r in enumerate(steps) if r["state"]["corrected"][0] is not None), 0)
    page.locator("#scrub input[type=number]").fill(str(chosen + 1))
    page.keyboard.press("Enter")
    expect(page.locator("#grid .cells .cell.new").first).to_be_visible(timeout=WAIT)
    rec = steps[chosen]
    position = rec["state"]["corrected"][0] if rec["state"]["corrected"][0] is not None else rec["committed"][0][0]
    page.locator(f"#grid .cells .cell[data-p='{position}']").click()
    expect(page.locator("#details")).to_contain_text("verifier", timeout=WAIT)
    page.locator("#grid").scroll_into_view_if_needed()
    for name, full in (("speculative-1024.png", False), ("speculative-1024-page.png", True)):
        screenshot(page, tmp_path, name, full)



def test_lesson_8_on_a_model_that_cannot_verify_says_so_and_the_page_stays_usable(session):
    """Issue 55: lesson 8's speculative step with the model box switched to tiny-llada (full
    attention: it cannot verify) once left the page without a usable model box. The page says why
    Run is off in one line, the model box still takes text, and either way back (the lesson's model,
    or the masked kind on the new one) turns Run on again and runs."""
    from playwright.sync_api import expect

    from .app_support import choose_option

    page = session.page
    page.set_viewport_size({"width": 1024, "height": 768})
    open_app(page, session.url)
    steps = len(choose_lesson(page, 8).steps)
    for step in (2, 3):
        page.click("#lesson-next")
        expect(page.locator("#lesson-note")).to_contain_text(f"Step {step} of {steps}")
    page.get_by_text("Model and system", exact=True).click()  # closed by default
    model = page.locator("#model-path textarea")
    expect(model).to_have_value("tiny-llada2")
    run, said = page.locator("#run-btn"), page.locator("#settings-msg [data-testid=markdown]")  # its text, not the pending timer
    for name, usable in (("tiny-llada", False), ("tiny-llada2", True), ("tiny-llada", False)):
        model.fill(name)
        model.press("Tab")  # the settings check runs on the box's change
        if usable:
            expect(said).to_contain_text("settings ok")
            expect(run).to_be_enabled()
        else:
            expect(said).to_contain_text("kind 'speculative' cannot run on this model")
            expect(run).to_be_disabled()
            assert len(said.inner_text().strip().splitlines()) == 1
    page.get_by_text("Diffusion kind", exact=True).click()
    choose_option(page, "#cfg-kind", "masked")
    expect(said).to_contain_text("settings ok")
    _run_step(page)
    expect(page.locator("#stats")).to_contain_text("tiny-llada")
