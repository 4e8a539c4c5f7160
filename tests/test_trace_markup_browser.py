"""#43 item 2 in a real browser (Debian's chromium driven by Playwright): a trace whose every string
field (found by walking docs/trace.schema.json: tests/markup_support.py) carries a tag, a script, a
link, a Markdown link and image and an autolink, all naming a beacon address. Loaded in the Run
tab and played through every iteration with a position's details pinned, loaded as both sides of
the Diff tab and its analysis, and a trace refused for a marked-up kind: chromium sends no request
to the beacon and the page holds no element the markup names.

(The Compare tab loads no trace: it runs the model on both sides.) Every wait is for a condition
the page reaches, never for a time. Screenshots go to $DINFER_VIZ_SHOTS when set, else to the
test's temp folder.
"""

from __future__ import annotations

import json
import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import pytest

from .markup_support import BEACON, INJECTED, LINKING, MARKUP, marked_trace
from .test_run_on_display_browser import WAIT, open_page, shot, upload

pytestmark = [pytest.mark.browser, pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore:.*(no_silent_downcasting|copy keyword).*")]


@pytest.fixture(scope="module")
def session(app_in_browser):
    return app_in_browser


def injected(page) -> list[str]:
    """The elements the markup would have made, and every attribute that links or fetches the beacon."""
    return [selector for selector in INJECTED if page.locator(selector).count()] + page.evaluate(LINKING)


def test_a_trace_whose_every_string_carries_markup_injects_nothing(session, tmp_path):
    from playwright.sync_api import expect

    page = open_page(session, 1024, 768)
    beacons: list[str] = []
    page.on("request", lambda request: beacons.append(request.url) if request.url.startswith(BEACON) else None)
    trace = tmp_path / "markup.json"
    trace.write_text(json.dumps(marked_trace()))

    upload(page, trace)
    expect(page.locator("#message")).to_contain_text("loaded a trace: handmade", timeout=WAIT)
    expect(page.locator("#message")).to_contain_text("beacon.invalid")  # the model's name, shown as text
    caption = page.locator("#grid .caption")
    expect(caption).to_contain_text("iteration 4/4", timeout=WAIT)
    page.locator("#grid .cells .cell[data-p='8']").click()  # a position's details pinned: its revision's rule, its tokens
    expect(page.locator("#details")).to_contain_text("beacon.invalid", timeout=WAIT)
    scrub = page.locator("#scrub input[type=number]")
    for step in range(5):
        scrub.fill(str(step))
        scrub.press("Enter")
        expect(caption).to_contain_text(f"iteration {step}/4", timeout=WAIT)
        assert not injected(page), (step, injected(page))
    page.click("#play-btn")
    expect(caption).to_contain_text("iteration 4/4", timeout=WAIT)
    shot(page, tmp_path, "markup-run")
    assert not injected(page)

    page.get_by_role("tab", name="Diff & analysis").click()
    expect(page.locator("#analysis-text")).to_contain_text("order correlation", timeout=WAIT)
    page.locator("#diff-file-a input[type=file]").set_input_files(str(trace))
    page.locator("#diff-file-b input[type=file]").set_input_files(str(trace))
    expect(page.locator("#diff-file-b")).to_contain_text("markup", timeout=WAIT)
    page.click("#diff-btn")
    expect(page.locator("#diff-summary")).to_contain_text("none (every aligned canvas is equal)", timeout=WAIT)
    shot(page, tmp_path, "markup-diff")
    assert not injected(page)

    refused = tmp_path / "markup-kind.json"
    refused.write_text(json.dumps({**marked_trace(), "kind": MARKUP}))
    page.get_by_role("tab", name="Run").click()
    upload(page, refused)
    expect(page.locator("#message")).to_contain_text("kind", timeout=WAIT)
    shot(page, tmp_path, "markup-refused")
    assert not injected(page) and not beacons, beacons
    page.close()
