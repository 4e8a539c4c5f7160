"""The documentation's pictures of the app, taken from the running app: the README's
(assets/screenshot.png: the Run tab after the default run, 1400x1000) and docs/app.md §4's
(docs/lesson-1.png: lesson 1's first step at a projector's 1024x768, position 15 pinned).

    python -m benchmarks.screenshots            # both, over the files in the repository
    python -m benchmarks.screenshots --out DIR  # both, into DIR (to look before replacing)

It starts the app on the embedded model (assets/tiny-llada, CPU) on a free local port and drives
Debian's chromium (/usr/bin/chromium) through Playwright, never a browser Playwright downloads.
Each picture waits for the page's own state (the run's "done" message, the details panel's
position), never for a time.
"""

from __future__ import annotations

import argparse
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"  # Debian's
BROWSER_ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run"]
WAIT_MS = 180_000  # a run on a loaded 2-core machine, and the app's first page
README_SHOT = ROOT / "assets" / "screenshot.png"
LESSON_SHOT = ROOT / "docs" / "lesson-1.png"
PINNED_POSITION = 15  # docs/app.md §4: the `a` of *painted*, forced by the schedule at iteration 14


@contextmanager
def running_app() -> Iterator[str]:
    """The app on the embedded model, served on a free local port: its address."""
    from dinfer_viz.live.host import EngineHost, ModelSpec
    from dinfer_viz.ui import Handlers, build_demo, launch_kwargs

    host = EngineHost(ModelSpec(str(ROOT / "assets" / "tiny-llada")))
    host.preload()
    if host.default_error is not None:
        raise SystemExit(f"the embedded model did not load: {host.default_error}")
    demo = build_demo(Handlers(host))
    _, url, _ = demo.launch(server_name="127.0.0.1", server_port=None, prevent_thread_lock=True, quiet=True, **launch_kwargs())
    try:
        yield url
    finally:
        demo.close()


def _open(browser, url: str, width: int, height: int):
    """A page of `width` x `height` on the app, its load events applied (the default decoder's
    controls shown), the Lessons and samples closed as the app opens them."""
    page = browser.new_page(viewport={"width": width, "height": height})
    page.set_default_timeout(WAIT_MS)
    page.goto(url)
    page.wait_for_selector("#run-btn")
    page.wait_for_selector("#cfg-steps", state="hidden")
    return page


def _run(page) -> None:
    """Run, and wait for the finished run's message."""
    from playwright.sync_api import expect

    page.click("#run-btn")
    expect(page.locator("#message")).to_contain_text("done", timeout=WAIT_MS)
    expect(page.locator("#grid .cells .cell.masked")).to_have_count(0)


def readme_shot(browser, url: str, out: Path) -> None:
    """The Run tab after the default run (the pair-sum prompt, the threshold decoder), its top."""
    page = _open(browser, url, 1400, 1000)
    _run(page)
    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=str(out))
    page.close()


def lesson_shot(browser, url: str, out: Path) -> None:
    """Lesson 1's first step (the fixed decoder on `the slow`) after Run at 1024x768, position
    PINNED_POSITION pinned in the details panel, the grid at the top of the screen."""
    from playwright.sync_api import expect

    from dinfer_viz.studies.lessons import LESSONS

    page = _open(browser, url, 1024, 768)
    page.click("#lessons-box button")  # the accordion's header opens it
    name = LESSONS[0].name
    page.locator("#lesson input").fill(name)
    page.get_by_role("option", name=name, exact=True).dispatch_event("mousedown")
    expect(page.locator("#prompt textarea")).to_have_value(LESSONS[0].prompt)
    _run(page)
    page.locator(f"#grid .cells .cell[title^='pos {PINNED_POSITION} ·']").click()
    expect(page.locator("#details")).to_contain_text(f"{PINNED_POSITION} (generated token")
    page.locator("#message").scroll_into_view_if_needed()
    page.evaluate("document.querySelector('#message').scrollIntoView({block: 'start'})")
    page.screenshot(path=str(out))
    page.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None, help="a folder for the pictures (default: over the repository's own)")
    args = parser.parse_args(argv)
    if not Path(CHROMIUM).exists():
        print(f"{CHROMIUM} is missing (apt-get install chromium)", file=sys.stderr)
        return 2
    from playwright.sync_api import sync_playwright

    targets = {"readme": README_SHOT, "lesson": LESSON_SHOT}
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        targets = {k: args.out / v.name for k, v in targets.items()}
    with running_app() as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
        try:
            readme_shot(browser, url, targets["readme"])
            lesson_shot(browser, url, targets["lesson"])
        finally:
            browser.close()
    for path in targets.values():
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
