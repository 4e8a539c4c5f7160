"""#34 items 1 and 4 and #38 item 2 in chromium, at a projector's 1024x768 and at 1400x1000: the
model's real limit before Run (Run disabled with the engine's reason, the hint recomputed with the
prompt), the edit decoder's own options under the decoder, Compare's B offering them, and a trace
whose model name, prompt and tokens hold Markdown and HTML shown as text (no element, link, image
or request it names)."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import pytest

from dinfer_viz.settings import PLUGIN_SECTION, sections

from .app_support import choose_option, handmade_trace, open_app

pytestmark = [pytest.mark.browser, pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore:.*(no_silent_downcasting|copy keyword).*")]
SHOTS = os.environ.get("DINFER_VIZ_SHOTS")  # a folder to keep the screenshots in (to look at them)
SIZES = [(1024, 768), (1400, 1000)]
# Markup of every kind a Markdown component would render; the address is one nothing listens on,
# and the test counts the page's requests to it
TRAP = "127.0.0.1:9"
MARKUP = f"**bold** _em_ [link](http://{TRAP}/l) ![img](http://{TRAP}/i.png) <img src=http://{TRAP}/h.png> <form><input name=pw></form> http://{TRAP}/bare `code` ~~del~~"


@pytest.fixture(scope="module")
def session(app_in_browser):
    page = app_in_browser.browser.new_page(viewport={"width": 1400, "height": 1000})
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    open_app(page, app_in_browser.url)
    yield SimpleNamespace(page=page, url=app_in_browser.url, requests=requests)
    page.close()


def _shot(page, name: str, tmp_path: Path, at: str) -> None:
    """The screen around `at` (the element the shot is about)."""
    page.locator(at).first.scroll_into_view_if_needed()
    folder = Path(SHOTS) if SHOTS else tmp_path
    folder.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(folder / name), full_page=False)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_the_models_limit_is_known_before_run_and_the_edit_options_sit_with_the_decoder(session, size, tmp_path):
    from playwright.sync_api import expect

    page = session.page
    page.set_viewport_size({"width": size[0], "height": size[1]})
    open_app(page, session.url)
    expect(page.locator("#prompt")).to_contain_text("for this prompt")  # the hint counts the prompt's tokens
    length = page.locator("#cfg-gen_length input")
    length.fill("1024")
    length.press("Enter")
    expect(page.locator("#settings-msg")).to_contain_text("exceeds the model's max_sequence_length")
    expect(page.locator("#run-btn")).to_be_disabled()
    _shot(page, f"limit-{size[0]}x{size[1]}.png", tmp_path, "#settings-msg")
    length.fill("64")
    length.press("Enter")
    expect(page.locator("#settings-msg")).to_contain_text("settings ok")
    expect(page.locator("#run-btn")).to_be_enabled()
    page.fill("#prompt textarea", "Q: 48+57=? A:" * 40)  # a longer prompt leaves less room: the same 64 no longer fits
    expect(page.locator("#run-btn")).to_be_disabled()
    expect(page.locator("#settings-msg")).to_contain_text("shorten the prompt or the generation length")
    page.fill("#prompt textarea", "Q: 48+57=? A:")
    expect(page.locator("#run-btn")).to_be_enabled()

    option = page.locator("[id='cfg-decoder_options.edit_threshold']")
    expect(option).to_be_hidden()
    choose_option(page, "#cfg-decoder", "edit")
    expect(option).to_be_visible()  # in the open Decoder section, no other section to open
    # the plug-in section holds plug-ins' settings only (there is one when a test registered a plug-in)
    assert page.get_by_text(PLUGIN_SECTION).count() == (1 if any(s == PLUGIN_SECTION for s, _ in sections()) else 0)
    _shot(page, f"edit-options-{size[0]}x{size[1]}.png", tmp_path, "[id='cfg-decoder_options.edit_threshold']")

    page.get_by_role("tab", name="Compare").click()
    b_option = page.locator("[id='compare-b-decoder_options.edit_threshold']")
    expect(b_option).to_be_hidden()
    choose_option(page, "#compare-b-decoder", "edit")
    expect(b_option).to_be_visible()
    expect(page.locator("[id='compare-b-decoder_options.max_post_edit_steps']")).to_be_visible()
    _shot(page, f"compare-edit-options-{size[0]}x{size[1]}.png", tmp_path, "[id='compare-b-decoder_options.edit_threshold']")


def test_a_trace_with_markup_in_its_model_prompt_and_tokens_shows_it_as_text(session, tmp_path):
    from playwright.sync_api import expect

    page = session.page
    page.set_viewport_size({"width": 1400, "height": 1000})
    open_app(page, session.url)
    trace = handmade_trace()
    trace.model = MARKUP
    trace.tokens.update({"10": "**A**", "11": f"[B](http://{TRAP}/t)", "12": "<img src=x>"})  # the prompt's tokens
    file = tmp_path / "markup.json"
    file.write_text(trace.to_json())
    with page.expect_file_chooser() as chooser:
        page.click("#upload")
    chooser.value.set_files(str(file))
    expect(page.locator("#message")).to_contain_text("loaded a trace: **bold** _em_ [link](")
    for where in ("#message", "#model-status", "#stats"):
        box = page.locator(where)
        expect(box).to_contain_text(f"![img](http://{TRAP}/i.png)")
        expect(box).to_contain_text("<form><input name=pw></form>")
        assert box.locator("a, img, form, input, em, del").count() == 0, (where, box.inner_html())
        assert box.locator("strong", has_text="bold").count() == 0  # the readout bolds its own figures only
    expect(page.locator("#prompt textarea")).to_have_value(f"**A**[B](http://{TRAP}/t)<img src=x>")
    _shot(page, "markup-trace-1400x1000.png", tmp_path, "#message")
    assert not [u for u in session.requests if TRAP in u]
