"""Simultaneous visitors: N sessions press Run at once, batched into one engine call or queued.

    python -m benchmarks.sessions --sessions 8 --repeats 3

Starts the app on the embedded model twice, with batching (`--max-batch 8`, the default) and
without (`--max-batch 1`: one run at a time, the queue before batching), and for each: the wall
time of one run alone, and of N gradio_client sessions submitting /run together (the last one's
end). Every session's text is checked against the solo run's (batching must not change tokens).
Medians over `--repeats`; the ratio is against one run in the same app.
"""

from __future__ import annotations

import statistics
import threading
import time

from gradio_client import Client

from dinfer_viz.live.host import EngineHost, ModelSpec
from dinfer_viz.tabs.run import RUN_VIEW
from dinfer_viz.ui import Handlers, build_demo, launch_kwargs
from engine.cli import DEFAULT_MODEL, OneLineParser

# same-length pair-sum prompts (held-out and training sums), each its own visitor
PROMPTS = [f"Q: ?+?={n} A:" for n in (57, 12, 83, 40, 61, 25, 94, 78, 33, 16, 70, 49)]
# one token per forward (64 forwards a run), so the engine, not the page traffic, dominates a run
CONFIG = {"config": {"gen_length": 64, "block_length": 32, "decoder": "fixed"}}


def run_text(client: Client, prompt: str) -> str:
    result = client.predict(prompt, CONFIG, "", 0, api_name="/run")
    return result[RUN_VIEW.index("text")]


def measure(url: str, sessions: int) -> tuple[float, float, bool]:
    """(seconds for one run alone, seconds for `sessions` together, every text as when alone)."""
    clients = [Client(url, verbose=False) for _ in range(sessions)]
    t0 = time.perf_counter()
    alone = [run_text(clients[0], PROMPTS[0])]
    one = time.perf_counter() - t0
    solo = [run_text(clients[0], p) for p in PROMPTS[:sessions]]
    texts: list[str | None] = [None] * sessions
    start = threading.Barrier(sessions + 1)

    def visit(i: int) -> None:
        start.wait()
        texts[i] = run_text(clients[i], PROMPTS[i])

    threads = [threading.Thread(target=visit, args=(i,)) for i in range(sessions)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    return one, time.perf_counter() - t0, texts == solo and alone[0] == solo[0]


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m benchmarks.sessions", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    if not 1 <= args.sessions <= len(PROMPTS):
        parser.error(f"--sessions must be in 1..{len(PROMPTS)}")
    rows = []
    for max_batch in (8, 1):
        host = EngineHost(ModelSpec(DEFAULT_MODEL))
        host.preload()
        demo = build_demo(Handlers(host, max_batch=max_batch))
        _, url, _ = demo.launch(server_name="127.0.0.1", prevent_thread_lock=True, quiet=True, **launch_kwargs())
        try:
            results = [measure(url, args.sessions) for _ in range(args.repeats)]
        finally:
            demo.close()
        one = statistics.median(r[0] for r in results)
        together = statistics.median(r[1] for r in results)
        rows.append((max_batch, one, together, all(r[2] for r in results)))
    print(f"embedded model, {args.sessions} sessions at once, fixed decoder, gen 64 block 32, medians of {args.repeats}")
    print("| app | one run (s) | all sessions (s) | x one run | texts as when alone |")
    print("|---|---|---|---|---|")
    for max_batch, one, together, same in rows:
        name = f"batched (--max-batch {max_batch})" if max_batch > 1 else "one at a time (--max-batch 1)"
        print(f"| {name} | {one:.2f} | {together:.2f} | {together / one:.1f} | {'yes' if same else 'NO'} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
