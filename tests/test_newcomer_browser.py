"""Issue #54 item 6 in a real browser (Debian's chromium through Playwright): Run's click replaces
the previous run's verdict at once, and the open lesson list covers neither Run nor lesson 8.

The run's handler waits at a gate the test holds shut, so "at once" means "before the server has
answered anything", decided from the page's state, never from a time."""

from __future__ import annotations

import os
import threading

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import pytest

from dinfer_viz.studies.lessons import LESSONS
from dinfer_viz.tabs.run import RunHandlers
from dinfer_viz.tabs.run_page import CLICKED

from .app_support import chromium, click_run, launch_app, open_app

pytestmark = [pytest.mark.browser, pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore:.*(no_silent_downcasting|copy keyword).*")]


@pytest.fixture(scope="module")
def gated(tmp_path_factory):
    """(browser, url, gate): the app, whose runs start only while `gate` is set (it is, but for
    the test that shuts it), and a chromium."""
    gate = threading.Event()
    gate.set()
    original = RunHandlers.run

    def run(self, *args, **kwargs):
        if not gate.wait(300):
            raise TimeoutError("the test never opened the gate")
        yield from original(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(RunHandlers, "run", run)
        demo, url, _ = launch_app(tmp_path_factory)
    try:
        with chromium() as browser:
            yield browser, url, gate
    finally:
        gate.set()
        demo.close()


def test_runs_click_replaces_the_previous_runs_verdict_before_the_server_answers(gated):
    from playwright.sync_api import expect

    browser, url, gate = gated
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        open_app(page, url)
        page.fill("#prompt textarea", "Q: 7+58=? A:")
        click_run(page)
        message = page.locator("#message")
        expect(message).to_contain_text("verifier")  # the first run's verdict
        gate.clear()
        click_run(page)
        expect(message).to_contain_text(CLICKED)  # the server has answered nothing: the gate is shut
        assert "verifier" not in message.inner_text()  # (the message box also holds Gradio's progress line)
        gate.set()
        expect(message).to_contain_text("verifier")
    finally:
        gate.set()
        page.close()


@pytest.mark.parametrize("size", [(1024, 768), (1400, 1000)])
def test_the_open_lesson_list_covers_neither_run_nor_its_last_lesson(gated, size):
    from playwright.sync_api import expect

    browser, url, _ = gated
    page = browser.new_page(viewport={"width": size[0], "height": size[1]})
    try:
        open_app(page, url)
        page.click("#lessons-box button")
        page.locator("#lesson input").click()
        options = page.get_by_role("option")
        expect(options).to_have_count(len(LESSONS))
        listbox = page.locator("ul[role=listbox]").bounding_box()
        run = page.locator("#run-btn").bounding_box()
        overlap = not (listbox["y"] >= run["y"] + run["height"] or run["y"] >= listbox["y"] + listbox["height"])
        assert not overlap, (listbox, run)
        last = options.nth(len(LESSONS) - 1).bounding_box()
        # the last lesson whole, inside the list and the window: no scroll hides it
        assert listbox["y"] <= last["y"] and last["y"] + last["height"] <= listbox["y"] + listbox["height"] + 0.5 <= size[1] + 0.5, (listbox, last)
        assert 0 <= listbox["y"]
    finally:
        page.close()
