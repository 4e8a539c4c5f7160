"""The app's live view in a real browser: first-frame latency and painted frame rate.

    python -m benchmarks.app_frames [--model assets/tiny-llada] [--fps 20] [--repeats 3]

Launches the app in-process, opens it in Debian's chromium (Playwright), and watches the grid's
caption with a MutationObserver: every streamed frame changes it. First-frame latency is the time
from the Run button's click event to the first caption of the run (the masked canvas), and to the
first caption of a decoding iteration; the frame rate is distinct captions painted per second
while the engine runs. Prints medians over the repeats.
"""

from __future__ import annotations

import argparse
import os
import statistics
from engine.cli import DEFAULT_MODEL, add_runtime_args

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

BROWSER_ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run"]
# One block of 256 positions, one commit per iteration: a run long enough to measure a rate.
SETTINGS = {"gen_length": "256", "block_length": "256", "decoder": "fixed", "align_blocks": False}

OBSERVE = """() => {
  window.__frames = [];
  if (window.__observer) window.__observer.disconnect();
  const target = document.querySelector('#grid');
  window.__observer = new MutationObserver(() => {
    const c = document.querySelector('#grid .caption');
    if (c) window.__frames.push([performance.now(), c.textContent]);
  });
  window.__observer.observe(target, {subtree: true, childList: true, characterData: true});
  // the click as the page sees it (Playwright's own click overhead is not the app's latency)
  document.querySelector('#run-btn').addEventListener('click', () => { window.__click = performance.now(); }, {capture: true, once: true});
}"""


def measure(url: str, repeats: int) -> list[dict]:
    from playwright.sync_api import sync_playwright

    rows = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=BROWSER_ARGS)
        page = browser.new_page(viewport={"width": 1500, "height": 1000})
        page.goto(url)
        page.locator("#cfg-decoder input").fill(SETTINGS["decoder"])
        page.keyboard.press("Enter")
        for field in ("gen_length", "block_length"):
            page.fill(f"#cfg-{field} input", SETTINGS[field])
        page.locator("#cfg-align_blocks input").uncheck()
        page.wait_for_timeout(500)
        for _ in range(repeats):
            page.evaluate(OBSERVE)
            page.click("#run-btn")
            n = int(SETTINGS["gen_length"])
            # this run's frames start at its canvas frame ("before the first forward")
            page.wait_for_function(
                f"(() => {{ const i = window.__frames.findIndex(f => f[1].startsWith('before')); return i >= 0 && window.__frames.slice(i).some(f => f[1].startsWith('iteration {n}/{n}')); }})()",
                timeout=300_000,
            )
            frames, click = page.evaluate("[window.__frames, window.__click]")
            frames = frames[next(k for k, f in enumerate(frames) if f[1].startswith("before")) :]
            iterations = [(t, text) for t, text in frames if text.startswith("iteration")]
            before = [t for t, text in frames if text.startswith("before the first")]
            painted = {text: t for t, text in iterations}  # one entry per distinct frame
            times = sorted(painted.values())
            span = times[-1] - times[0] if len(times) > 1 else float("nan")
            rows.append(
                {
                    "canvas_ms": (before[0] - click) if before else float("nan"),
                    "first_iteration_ms": times[0] - click,
                    "frames": len(times),
                    "fps": (len(times) - 1) / span * 1000 if span == span and span > 0 else float("nan"),
                    "run_s": (times[-1] - click) / 1000,
                }
            )
        browser.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--fps", type=float, default=20.0)
    parser.add_argument("--plot-hz", type=float, default=3.0)
    parser.add_argument("--repeats", type=int, default=3)
    add_runtime_args(parser)
    args = parser.parse_args()
    from dinfer_viz.host import EngineHost, ModelSpec
    from dinfer_viz.ui import Handlers, build_demo, launch_kwargs

    host = EngineHost(ModelSpec(args.model, args.device, args.dtype), threads=args.threads)
    host.preload()
    if host.default_error:
        raise SystemExit(f"error: {host.default_error}")
    demo = build_demo(Handlers(host, fps=args.fps, plot_hz=args.plot_hz))
    _, url, _ = demo.launch(server_name="127.0.0.1", prevent_thread_lock=True, quiet=True, **launch_kwargs())
    try:
        rows = measure(url, args.repeats)
    finally:
        demo.close()
    print(f"model {args.model} · server fps cap {args.fps:g} · plots {args.plot_hz:g} Hz · {SETTINGS}")
    print("| run | canvas frame ms | first iteration ms | frames painted | painted fps | run s |")
    print("|---|---|---|---|---|---|")
    for i, r in enumerate(rows):
        print(f"| {i} | {r['canvas_ms']:.0f} | {r['first_iteration_ms']:.0f} | {r['frames']} | {r['fps']:.1f} | {r['run_s']:.2f} |")
    med = lambda k: statistics.median(r[k] for r in rows)  # noqa: E731
    print(f"| median | {med('canvas_ms'):.0f} | {med('first_iteration_ms'):.0f} | {med('frames'):.0f} | {med('fps'):.1f} | {med('run_s'):.2f} |")


if __name__ == "__main__":
    main()
