"""`python -m engine serve` under load: N clients at once, batched (`--max-batch N`) against one at
a time (`--max-batch 1`), on the embedded model on this machine's CPU.

    python -m benchmarks.serve --clients 16 --repeats 3

Each server is its own process (`python -m engine serve`, as a user starts it), the clients threads
of this one. For each server: the wall time for N streamed completions sent together, the completion tokens per
second over that time, and each client's time to first token (from sending the request to the first
chunk with text) and to its last chunk. Every client's text is checked against the engine's solo
run (batching must not change tokens). Medians over `--repeats` (time to first token: the median
over all clients of all repeats); the ratios are against one at a time in the same run.
"""

from __future__ import annotations

import json
import socket
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import httpx
import torch

from engine import Engine, GenerationConfig
from engine.cli import DEFAULT_MODEL, OneLineParser, checked_device

from .machine import describe, one_line

# held-out and training prompts: pair sums of one length (they batch together) and arithmetic of another
PROMPTS = [f"Q: ?+?={n} A:" for n in (57, 12, 83, 40, 61, 25, 94, 78)] + [f"Q: {a}+{b}=? A:" for a, b in ((14, 5), (23, 4), (52, 7), (61, 3), (30, 9), (45, 1), (18, 6), (77, 2))]
SETTINGS = {"gen_length": 64, "block_length": 32, "threshold": 0.9, "max_tokens": 64}


def stream_one(url: str, prompt: str, start: threading.Barrier) -> dict[str, object]:
    """One client: its text, completion tokens, seconds to first text and to the end (from its send)."""
    with httpx.Client(timeout=600) as client:
        start.wait()
        t0 = time.perf_counter()
        first, text, tokens = None, "", 0
        body = {"prompt": prompt, "stream": True, "stream_options": {"include_usage": True}, **SETTINGS}
        with client.stream("POST", url + "/completions", json=body) as reply:
            for line in reply.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line.removeprefix("data: "))
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
                for choice in chunk["choices"]:
                    if choice.get("text") and first is None:
                        first = time.perf_counter() - t0
                    text += choice.get("text", "")
        return {"text": text, "tokens": tokens, "ttft": first if first is not None else float("nan"), "seconds": time.perf_counter() - t0}


def load(url: str, prompts: list[str]) -> tuple[float, list[dict[str, object]]]:
    """(wall seconds, each client's result) for every prompt sent at once."""
    start = threading.Barrier(len(prompts) + 1)
    with ThreadPoolExecutor(len(prompts)) as pool:
        futures = [pool.submit(stream_one, url, p, start) for p in prompts]
        start.wait()
        t0 = time.perf_counter()
        results = [f.result() for f in futures]
        return time.perf_counter() - t0, results


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (from /proc: no psutil)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # it ended while we looked
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


@contextmanager
def server(max_batch: int | None, threads: int, device: str, *flags: str) -> Iterator[tuple[str, subprocess.Popen]]:
    """`python -m engine serve` on a free loopback port (`max_batch` None: its default; more
    `flags` of its own); its base URL once it answers, and its process. A server still running at the end is stopped (SIGTERM)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    rows = ("--max-batch", str(max_batch)) if max_batch is not None else ()
    command = [sys.executable, "-m", "engine", "serve", "--port", str(port), *rows, "--threads", str(threads), "--device", device, *flags]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 300
        while True:  # until it has loaded the model and listens
            try:
                httpx.get(url + "/models", timeout=5).raise_for_status()
                break
            except httpx.HTTPError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"error: the server did not start ({' '.join(command)})") from None
                time.sleep(0.2)
        yield url, process
    finally:
        if process.poll() is None:
            process.terminate()
            process.wait(timeout=60)


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m benchmarks.serve", description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (the embedded model's default)")
    parser.add_argument("--device", type=checked_device, default="cpu", help="where the server runs the model (cpu, cuda, ...)")
    args = parser.parse_args(argv)
    if not 1 <= args.clients <= len(PROMPTS) or args.repeats < 1 or args.threads < 1:
        parser.error(f"--clients must be in 1..{len(PROMPTS)}, --repeats and --threads >= 1")
    torch.set_num_threads(args.threads)
    engine = Engine(DEFAULT_MODEL, device=args.device)
    prompts = PROMPTS[: args.clients]
    config = GenerationConfig(**{k: v for k, v in SETTINGS.items() if k != "max_tokens"}, use_chat_template=False)
    solo = [engine.generate(p, config).text for p in prompts]
    rows = []
    for max_batch in (args.clients, 1):
        with server(max_batch, args.threads, args.device) as (url, _):
            load(url, prompts[:1])  # warm-up: the first request's allocations
            runs = [load(url, prompts) for _ in range(args.repeats)]
        wall = statistics.median(w for w, _ in runs)
        tokens = statistics.median(sum(r["tokens"] for r in results) for _, results in runs)  # type: ignore[misc]
        rows.append({
            "max_batch": max_batch, "wall": wall, "tps": tokens / wall,
            "ttft": statistics.median(r["ttft"] for _, results in runs for r in results),  # type: ignore[misc]
            "last": statistics.median(r["seconds"] for _, results in runs for r in results),  # type: ignore[misc]
            "same": all([r["text"] for r in results] == solo for _, results in runs),
        })
    base = rows[-1]
    print(f"embedded model, {args.clients} streamed clients at once, threshold 0.9, gen 64 block 32, medians of {args.repeats}; {one_line(describe(args.device))}")
    print("| server | all clients (s) | tokens/s | x one at a time | time to first token (s) | x one at a time | to last chunk (s) | texts as alone |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        name = f"batched (--max-batch {row['max_batch']})" if row["max_batch"] > 1 else "one at a time (--max-batch 1)"
        print(
            f"| {name} | {row['wall']:.2f} | {row['tps']:.0f} | {row['tps'] / base['tps']:.2f} | {row['ttft']:.3f} | {row['ttft'] / base['ttft']:.2f} "
            f"| {row['last']:.2f} | {'yes' if row['same'] else 'NO'} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
