"""The app's live view in a real browser: frames, page response during a run, and Stop.

    python -m benchmarks.app_frames [--model assets/tiny-llada] [--threads 1] [--repeats 3]

Launches the app in-process, opens it in Debian's chromium (Playwright, 1400x1000), and per repeat:

- a whole run (fixed decoder, one block of `--gen-length` positions: one commit per iteration),
  watched with a MutationObserver on the grid's caption: the first frame (the masked canvas) and
  the first decoding iteration, timed from the click on Run; frames sent by the server against
  frames the page painted (distinct captions); the painted frame rate; the run's wall time and
  the main thread's share spent in long tasks (over 50 ms) during it.
- a run of `--stop-length` iterations, interrupted: once it shows iteration 20, five round trips
  of a trivial page script (how long the page takes to answer anything), a click on the Compare
  tab and one back on the Run tab (time from the click to the first animation frame that shows the
  other tab), then a click on Stop: time to the "stopped" message in the page, and to the engine's
  lock being free, and the iteration the page showed when Stop was clicked.

Clicks are real input events (`page.mouse`), so a busy main thread delays them as it would delay a
user's, and every time runs from just before the click is sent (the wall clock, which the page
shares: `performance.timeOrigin + performance.now()`), so it includes the wait for the page to take
the input. Prints one table per measurement and the medians.
"""

from __future__ import annotations

import functools
import os
import statistics
import threading
import time
from typing import Any, Callable

from engine.cli import DEFAULT_MODEL, OneLineParser, add_runtime_args

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

BROWSER_ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run"]
VIEWPORT = {"width": 1400, "height": 1000}

# What the page records, in wall-clock milliseconds: painted captions of #grid, long tasks, the
# "stopped" message, and a probe that notes when an element first shows in an animation frame.
INSTRUMENT = """() => {
  const now = () => performance.timeOrigin + performance.now();
  const m = window.__m = {frames: [], longtasks: [], shown: {}, stopped: null};
  let last = '';
  new MutationObserver(() => {
    const c = document.querySelector('#grid .caption');
    const t = c ? c.textContent : '';
    if (t && t !== last) { last = t; m.frames.push([now(), t]); }
  }).observe(document.querySelector('#grid'), {subtree: true, childList: true, characterData: true});
  new MutationObserver(() => {
    if (m.stopped === null && /stopped/.test(document.querySelector('#message').textContent)) m.stopped = now();
  }).observe(document.querySelector('#message'), {subtree: true, childList: true, characterData: true});
  new PerformanceObserver(list => {
    for (const e of list.getEntries()) m.longtasks.push([performance.timeOrigin + e.startTime, e.duration]);
  }).observe({type: 'longtask'});
  window.__probe = (name, selector) => {
    const tick = () => {
      const el = document.querySelector(selector);
      if (el && el.checkVisibility()) m.shown[name] = now(); else requestAnimationFrame(tick);
    };
    requestAnimationFrame(tick);
  };
}"""


def count_frames(handlers: Any, grid_slot: int) -> list[float]:
    """Wraps `handlers.run` (before the page is built) to note the server time of every yielded
    frame that carries the grid; returns the list it appends to."""
    sent: list[float] = []
    run = handlers.run

    @functools.wraps(run)
    def counted(*args: Any, **kwargs: Any):
        for out in run(*args, **kwargs):
            value = out[grid_slot]
            if not (isinstance(value, dict) and value.get("__type__") == "update" and len(value) == 1):  # not gr.skip()
                sent.append(time.perf_counter())
            yield out

    handlers.run = counted
    return sent


def set_up(page: Any, url: str, length: int) -> None:
    page.goto(url)
    page.locator("#cfg-decoder input").fill("fixed")
    page.keyboard.press("Enter")
    for field in ("gen_length", "block_length"):
        page.fill(f"#cfg-{field} input", str(length))
    page.locator("#cfg-align_blocks input").uncheck()
    page.wait_for_timeout(500)
    page.evaluate("window.scrollTo(0, 0)")
    page.evaluate(INSTRUMENT)


def click(page: Any, selector: str) -> float:
    """A real mouse click at the element's centre; returns the wall-clock milliseconds just before it."""
    target = page.locator(selector)
    target.scroll_into_view_if_needed()
    box = target.bounding_box()
    t0 = time.time() * 1000
    page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    return t0


def wait_for_iteration(page: Any, at_least: int, timeout_ms: int = 300_000) -> None:
    try:
        page.wait_for_function(
            f"window.__m.frames.some(f => {{ const m = /^iteration (\\d+)\\//.exec(f[1]); return m && +m[1] >= {at_least}; }})", timeout=timeout_ms
        )
    except Exception as exc:  # say what the page showed instead: the captions it painted and its message
        seen = page.evaluate("[window.__m.frames.slice(-3).map(f => f[1]), document.querySelector('#message')?.innerText]")
        raise AssertionError(f"no live frame reached iteration {at_least}; last captions {seen[0]}, message {seen[1]!r}") from exc


def whole_run(page: Any, url: str, length: int, sent: list[float]) -> dict[str, float]:
    set_up(page, url, length)
    sent.clear()
    t_click = click(page, "#run-btn")
    page.wait_for_function(f"window.__m.frames.some(f => f[1].startsWith('iteration {length}/{length}'))", timeout=600_000)
    m = page.evaluate("window.__m")
    frames = m["frames"]
    canvas = next(t for t, text in frames if text.startswith("iteration 0/"))  # before the first forward
    iterations = [t for t, text in frames if text.startswith("iteration") and not text.startswith("iteration 0/")]
    span = iterations[-1] - iterations[0]
    busy = sum(d for s, d in m["longtasks"] if t_click <= s <= iterations[-1])
    return {
        "canvas_ms": canvas - t_click,
        "first_iteration_ms": iterations[0] - t_click,
        "sent": len(sent),
        "painted": len(iterations) + 1,
        "fps": (len(iterations) - 1) / span * 1000 if span > 0 else float("nan"),
        "run_s": (iterations[-1] - t_click) / 1000,
        "busy": busy / (iterations[-1] - t_click),
    }


def stopped_run(page: Any, url: str, length: int, lock: threading.Lock) -> dict[str, Any]:
    set_up(page, url, length)
    click(page, "#run-btn")
    wait_for_iteration(page, 20)
    calls = []  # round trips of a trivial script: how long the page takes to answer anything
    for _ in range(5):
        t0 = time.time()
        page.evaluate("0")
        calls.append((time.time() - t0) * 1000)
    page.evaluate("window.__probe('compare', '#compare-btn')")
    to_compare = click(page, "button[role=tab]:has-text('Compare')")
    page.wait_for_function("'compare' in window.__m.shown", timeout=120_000)
    page.evaluate("window.__probe('run', '#run-btn')")
    to_run = click(page, "button[role=tab]:has-text('Run')")
    page.wait_for_function("'run' in window.__m.shown", timeout=120_000)
    stop = click(page, "#stop-btn")
    lock.acquire(timeout=600)  # the engine's worker holds it until the engine returns
    freed = time.time() * 1000 - stop
    lock.release()
    page.wait_for_function("window.__m.stopped !== null || /done/.test(document.querySelector('#message').textContent)", timeout=600_000)
    m = page.evaluate("window.__m")
    before = [text for t, text in m["frames"] if t <= stop]
    return {
        "call_ms": statistics.median(calls),
        "call_max_ms": max(calls),
        "compare_ms": m["shown"]["compare"] - to_compare,
        "run_ms": m["shown"]["run"] - to_run,
        "stop_message_s": (m["stopped"] - stop) / 1000 if m["stopped"] is not None else float("nan"),
        "stop_free_s": freed / 1000,
        "at": before[-1].split(" · ")[0] if before else "",
        "completed": m["frames"][-1][1].startswith(f"iteration {length}/{length}"),
    }


def table(title: str, columns: dict[str, tuple[str, Callable[[Any], str]]], rows: list[dict[str, Any]]) -> None:
    print(f"\n{title}\n| repeat | " + " | ".join(h for h, _ in columns.values()) + " |")
    print("|---|" + "---|" * len(columns))
    for i, row in enumerate(rows):
        print(f"| {i} | " + " | ".join(fmt(row[k]) for k, (_, fmt) in columns.items()) + " |")
    medians = {k: statistics.median(r[k] for r in rows) if isinstance(rows[0][k], (int, float)) and not isinstance(rows[0][k], bool) else "" for k in columns}
    print("| median | " + " | ".join(fmt(medians[k]) if medians[k] != "" else "" for k, (_, fmt) in columns.items()) + " |")


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m benchmarks.app_frames", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--fps", type=float, default=20.0)
    parser.add_argument("--plot-hz", type=float, default=3.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--gen-length", type=int, default=256, help="iterations of the whole run")
    parser.add_argument("--stop-length", type=int, default=384, help="iterations of the run that is stopped")
    add_runtime_args(parser)
    args = parser.parse_args(argv)
    from playwright.sync_api import sync_playwright

    from dinfer_viz.live.host import EngineHost, ModelSpec
    from dinfer_viz.tabs.run import RUN_VIEW
    from dinfer_viz.ui import Handlers, build_demo, launch_kwargs

    host = EngineHost(ModelSpec(args.model, args.device, args.dtype), threads=args.threads)
    host.preload()
    if host.default_error:
        raise SystemExit(f"error: {host.default_error}")
    handlers = Handlers(host, fps=args.fps, plot_hz=args.plot_hz)
    sent = count_frames(handlers, RUN_VIEW.index("grid"))
    demo = build_demo(handlers)
    _, url, _ = demo.launch(server_name="127.0.0.1", prevent_thread_lock=True, quiet=True, **launch_kwargs())
    whole, stopped = [], []
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=BROWSER_ARGS)
            page = browser.new_page(viewport=VIEWPORT)
            for _ in range(args.repeats):
                whole.append(whole_run(page, url, args.gen_length, sent))
                stopped.append(stopped_run(page, url, args.stop_length, host.lock))
            browser.close()
    finally:
        demo.close()
    ms, s1, s2 = (lambda v: f"{v:.0f}"), (lambda v: f"{v:.1f}"), (lambda v: f"{v:.2f}")
    print(f"model {args.model} · server fps cap {args.fps:g} · plots {args.plot_hz:g} Hz · fixed decoder, one block")
    table(
        f"Whole run of {args.gen_length} iterations",
        {"canvas_ms": ("canvas frame ms", ms), "first_iteration_ms": ("first iteration ms", ms), "sent": ("frames sent", ms),
         "painted": ("frames painted", ms), "fps": ("painted fps", s1), "run_s": ("run s", s2), "busy": ("main thread in long tasks", lambda v: f"{v:.0%}")},
        whole,
    )
    table(
        f"Run of {args.stop_length} iterations: page calls and tab switches from iteration 20, then Stop",
        {"call_ms": ("page call ms", ms), "call_max_ms": ("slowest of 5", ms), "compare_ms": ("to Compare tab ms", ms), "run_ms": ("back to Run tab ms", ms), "stop_message_s": ("Stop to message s", s2),
         "stop_free_s": ("Stop to engine free s", s2), "at": ("painted when Stop was clicked", str), "completed": ("ran to the end", str)},
        stopped,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
