"""Helpers for the app's tests: the model they run, a launched app, a hand-made trace.

The model is the embedded one (assets/tiny-llada) when it is there, else a small random LLaDA
with the embedded model's character tokenizer, written by the test into a temp folder.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Iterator

import pytest
import torch

from engine import IterationRecord, Trace, save_model
from engine.models import LLaDAModelLM
from tinymodel.tokenizer import build_tokenizer, save_tokenizer, special_ids

from .conftest import assert_in_lane

EMBEDDED_MODEL = Path(__file__).resolve().parent.parent / "assets" / "tiny-llada"
CHROMIUM = "/usr/bin/chromium"  # Debian's; never a browser downloaded by playwright
BROWSER_WAIT_MS = 120_000
SHOTS = os.environ.get("DINFER_VIZ_SHOTS")  # a folder to keep the screenshots in (to look at them)
BROWSER_ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run"]


def require_browser() -> None:
    """Skip a browser test where chromium or playwright is missing; in CI, fail instead (CI
    installs both, so a missing one is a broken setup, not a reason to pass). A test that drives
    chromium outside the browser lane fails: it would slow `pytest -m "not slow"`."""
    assert_in_lane("browser", "drives chromium")
    reason = ""
    if not shutil.which(CHROMIUM):
        reason = f"{CHROMIUM} is missing (apt-get install chromium)"
    elif importlib.util.find_spec("playwright") is None:
        reason = "playwright is not installed (pip install playwright)"
    if reason and os.environ.get("CI"):
        pytest.fail(f"browser test cannot run in CI: {reason}")
    if reason:
        pytest.skip(reason)
    from playwright.sync_api import expect

    # Every expect waits for a condition the page reaches; on a loaded 2-core CI machine an answer
    # can take longer than Playwright's 5 s default, so the default bounds a hang, never paces a test
    expect.set_options(timeout=BROWSER_WAIT_MS)


def screenshot(page, tmp_path: Path, name: str, full: bool = False) -> str:
    """`page` saved as `name` in $DINFER_VIZ_SHOTS when set (to look at it), else in the test's
    temp folder (the viewport, or the whole page with `full`); its path. A drawn page is more than
    20 kB of PNG: a blank one is not."""
    path = os.path.join(SHOTS, name) if SHOTS else str(tmp_path / name)
    page.screenshot(path=path, full_page=full)
    assert os.path.getsize(path) > 20_000
    return path


def open_app(page, url: str) -> None:
    """`page` at the app's `url`, its load events applied (the controls the default decoder does not
    read are hidden): a control typed into before then can be re-rendered under the typing and lose
    it (a prompt box read empty at Run once, under load). The page's actions wait as long as
    every expect does (Playwright's default is 30 s: a click on Run waited that long for the settings
    check to enable it, on the loaded machine, and failed). The page is brought to the front: in
    headless chromium a page behind a later-opened one gets its frames late, and every action
    waits for them (three clicks took 6 s instead of 0.3 s; a test module whose page stayed behind
    a left-open page ran 122 s instead of 75 s)."""
    page.set_default_timeout(BROWSER_WAIT_MS)
    page.bring_to_front()
    page.goto(url)
    page.wait_for_selector("#run-btn", timeout=BROWSER_WAIT_MS)
    page.wait_for_selector("#cfg-steps", state="hidden", timeout=BROWSER_WAIT_MS)


# Counts the clicks the Run button itself receives (a listener in the page, installed once).
RUN_CLICKS_JS = """() => {
  if (window.__runClicks === undefined) {
    window.__runClicks = 0;
    document.addEventListener('click', e => { if (e.target.closest && e.target.closest('#run-btn')) window.__runClicks++; }, true);
  }
  return window.__runClicks;
}"""


def click_run(page, tries: int = 3) -> None:
    """Click Run until the button receives the click, `tries` times at most. A settings check's
    verdict on settings half changed (gen_length set, block_length not yet) can disable Run in the
    moment between Playwright finding it enabled and its click: the browser drops a click on a
    disabled button (no click event), as a user's, and the run never started (its message stayed
    blank for 300 s in CI runs). The user clicks again; so does this, each click waiting for the
    button to be enabled. Decided by the button's click events, never by a wait."""
    for _ in range(tries):
        before = page.evaluate(RUN_CLICKS_JS)
        page.click("#run-btn")
        if page.evaluate(RUN_CLICKS_JS) > before:
            return
    raise AssertionError(f"Run never received a click in {tries} tries")


def fill_model(page, name: str, tries: int = 3) -> None:
    """Type `name` into the model box (its accordion open) until the settings check has read it:
    the prompt's hint names the model's positions ("of <name>'s"), so Run sends it. Gradio can
    write the box's old value back just after the page loads: logged once in ~40 runs of
    test_run_on_display_browser's header test, the same textarea went back to the default model
    94 ms after the fill with no input event, the hint and then the run named the default model
    (fresh-clone CI, once). The wait ends on either outcome; a reset box is typed into again."""
    box = page.locator("#model-path textarea, #model-path input").first
    for _ in range(tries):
        box.fill(name)
        box.press("Tab")
        page.wait_for_function(
            "([name]) => { const box = document.querySelector('#model-path textarea, #model-path input');"
            " return !box || box.value !== name || (document.querySelector('#prompt')?.textContent || '').includes(`of ${name}'s`); }",
            arg=[name], timeout=BROWSER_WAIT_MS,
        )
        if box.input_value() == name:
            return
    raise AssertionError(f"the model box went back from {name!r} {tries} times")


def choose_lesson(page, number: int):
    """Open lesson `number` from the page's lesson list (the page already open); returns the lesson,
    its first step's note shown."""
    from playwright.sync_api import expect

    from dinfer_viz.studies.lessons import LESSONS

    lesson = next(l for l in LESSONS if l.name.startswith(f"{number} "))
    page.locator("#lessons-box").get_by_text("Lessons").click()
    page.locator("#lesson input").fill(lesson.name)
    page.keyboard.press("Enter")
    expect(page.locator("#lesson-note")).to_contain_text(f"Step 1 of {len(lesson.steps)}")
    return lesson


def choose_option(page, selector: str, value: str) -> None:
    """Pick `value` from the dropdown at `selector` by its exact name ("edit" also filters in
    "credit"). The option gets the mousedown the dropdown listens to, not a click at a point: the
    list is placed where the box was when it opened, so on a loaded machine whose page is still
    laying out a click can wait on an option Playwright finds outside the viewport."""
    from playwright.sync_api import expect

    page.locator(f"{selector} input").fill(value)
    page.get_by_role("option", name=value, exact=True).dispatch_event("mousedown")
    expect(page.locator(f"{selector} input")).to_have_value(value)


def random_char_model(folder: Path) -> Path:
    """A random 2-layer LLaDA with the character tokenizer, as a Hugging Face folder."""
    torch.manual_seed(0)
    config = dict(model_type="llada", d_model=64, n_heads=4, n_layers=2, mlp_hidden_size=96, vocab_size=build_tokenizer().get_vocab_size(), rope_theta=10000.0, **special_ids())
    model = LLaDAModelLM(config)
    with torch.no_grad():  # default init gives near-uniform logits; widen them so confidences vary
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3)
    save_model(model, folder)
    save_tokenizer(folder)
    return folder


def app_model(tmp_factory) -> str:
    """The embedded model if trained and present, else a random one built now."""
    if (EMBEDDED_MODEL / "config.json").is_file():
        return str(EMBEDDED_MODEL)
    return str(random_char_model(tmp_factory.mktemp("char-llada")))


def edit_model() -> Path | None:
    """The embedded model that can edit: shipped under assets/, else its trainer's latest
    checkpoint (runs/tiny-llada-edit/model); None when neither is there."""
    root = Path(__file__).resolve().parents[1]
    for folder in (root / "assets" / "tiny-llada-edit", root / "runs" / "tiny-llada-edit" / "model"):
        if (folder / "config.json").exists() and any(folder.glob("*.safetensors")):
            return folder
    return None


def launch_app(tmp_factory, fps: float = 100.0, plot_hz: float = 10.0, embedded: dict[str, str] | None = None, model: str | None = None):
    """(demo, url, host): the app on the test model (`model`: another folder), served on a free
    local port. `embedded`: the models the app offers by name (EngineHost's; None: those under assets/)."""
    from dinfer_viz.live.host import EngineHost, ModelSpec
    from dinfer_viz.ui import Handlers, build_demo, launch_kwargs

    host = EngineHost(ModelSpec(model or app_model(tmp_factory)), embedded=embedded)
    host.preload()
    assert host.default_error is None, host.default_error
    demo = build_demo(Handlers(host, fps=fps, plot_hz=plot_hz))
    # server_port=None: Gradio binds the first free port from 7860 and, if a server there fails to
    # start within its 5 s (a loaded machine), tries the next; a port picked here beforehand could be
    # taken in between or time out with no second chance
    _, url, _ = demo.launch(server_name="127.0.0.1", server_port=None, prevent_thread_lock=True, quiet=True, **launch_kwargs())
    return demo, url, host


def handmade_trace() -> Trace:
    """Prompt [A B C] (ids 10-12), 8 positions to generate in blocks [3, 7) and [7, 11); mask 1,
    EOS 0. Four records: a refresh and a window forward per block; positions 4 and 7 are forced,
    the last record commits three EOS; credit and cont_weight extras on every record."""
    mask = 1
    FINAL_UNTIL = (4, 7, 8, 11)  # the first mask after the prompt after each record (trace v3)
    tokens = {"0": "<|endoftext|>", "1": "<|mdm_mask|>", "10": "A", "11": "B", "12": "C", "20": "x", "21": "Ġy", "22": "z"}

    def rec(i, block, rng, forward, recomputed, committed, forced, top1, conf, credit):
        return IterationRecord(
            iteration=i, block=block, block_range=list(rng), forward=forward, recomputed=recomputed,
            threshold=0.9, committed=[committed], forced=[forced], top1=[top1], confidence=[conf],
            seconds=0.01 * (i + 1), extras={"credit": [credit], "cont_weight": 0.1 * i},
            active=[True], final_until=[FINAL_UNTIL[i]],
        )

    records = [
        rec(0, 0, (3, 7), "refresh", [[0, 11]], [3, 5], [], [20, 21, 22, 20], [0.95, 0.4, 0.92, 0.3], [1.0, 0.2, 0.9, 0.1]),
        rec(1, 0, (3, 7), "window", [[2, 9]], [4, 6], [4], [20, 21, 22, 22], [0.99, 0.6, 0.98, 0.91], [1.5, 0.6, 1.2, 0.8]),
        rec(2, 1, (7, 11), "refresh", [[0, 11]], [7], [7], [20, 0, 0, 0], [0.7, 0.5, 0.5, 0.5], [0.3, 0.2, 0.2, 0.2]),
        rec(3, 1, (7, 11), "window", [[6, 11]], [8, 9, 10], [], [20, 0, 0, 0], [0.99, 0.95, 0.95, 0.95], [0.5, 0.9, 0.9, 0.9]),
    ]
    initial = [10, 11, 12] + [mask] * 8
    final = [10, 11, 12, 20, 21, 22, 22, 20, 0, 0, 0]
    return Trace(
        model="handmade", mask_id=mask, eos_ids=[0], prompt_lengths=[3], canvas_length=11, block_length=4,
        config={"decoder": "threshold", "cache": "vicinity", "threshold": 0.9}, initial=[initial], tokens=tokens,
        iterations=records, final=[final],
        stats={"nfe": 4, "tokens": 5, "seconds": 0.1, "batch": 1, "trace_seconds": 0.002, "tps": 50.0, "tpf": 1.25, "forwards_per_second": 40.0},
        trace_seconds=0.002,
    )


class SharedCache:
    """A chromium whose pages open in one browser context, so they share its HTTP cache: the
    page's 107 scripts and stylesheets are fetched and compiled once per module, not once per
    page (a page opened in 4.9 s, 4.0 s from the shared cache, on the 2-core machine). Each page
    still loads the app afresh and gets a Gradio session of its own (the app keeps no cookies or
    storage); downloads are accepted, as the app's exports need."""

    def __init__(self, browser) -> None:
        self.context = browser.new_context(accept_downloads=True)

    def new_page(self, viewport: dict[str, int] | None = None):
        """A page in the shared context, at `viewport` (Playwright's default size without one)."""
        page = self.context.new_page()
        if viewport:
            page.set_viewport_size(viewport)
        return page


@contextmanager
def chromium() -> Iterator[SharedCache]:
    """Debian's chromium under Playwright, closed after. Playwright's sync API holds an event loop
    on this thread while it runs, so a browser lives no longer than its module: the asyncio tests a
    worker runs next must find no loop of its own."""
    require_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
        try:
            yield SharedCache(browser)
        finally:
            browser.close()


@contextmanager
def app_in_chromium(tmp_factory, model: str | None = None) -> Iterator[SimpleNamespace]:
    """The app (on `model`, else the test model; launch_app) and a chromium (host, url, browser,
    and the app's `demo`); both closed after."""
    demo, url, host = launch_app(tmp_factory, fps=20, plot_hz=3, model=model)
    try:
        with chromium() as browser:
            yield SimpleNamespace(host=host, url=url, browser=browser, demo=demo)
    finally:
        demo.close()
