"""`python -m engine serve` under a long mixed load: N clients at once, each sending request after
request from a mix (streamed and not, completions and chat, several decoders and cache modes, a
regex constraint, generation lengths 16 to 64), until R requests have been answered.

    python -m benchmarks.load --clients 32 --requests 500

The server is its own process (`python -m engine serve`, as a user starts it; benchmarks/serve.py),
the clients threads of this one. Every answer is checked against its solo run, the engine in this
process on the same request's settings (greedy, temperature 0: batching and concurrency must not
change a token), and every answer that is not a 200 with its text, or a stream that ends with an
error event, counts as an error. The server's resident memory (VmRSS from /proc) is read after a
warm-up (each request of the mix once, then `--warmup` requests under the full load, which also
fills the server's trace store: `--max-traces` is set to the warm-up's size, so a store filling up
is not read as a leak), then after each round of ROUND requests, each round's clients all done
(memory read mid-load would count the batches in flight). Latency: from sending a request to its whole
answer (a stream's [DONE]), median and 95th percentile over the measured requests. Last, the
server gets SIGINT and the time to its exit is read, with the processes it left (its children).
"""

from __future__ import annotations

import itertools
import json
import signal
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import torch

from engine import Engine
from engine.cli import DEFAULT_MODEL, OneLineParser, checked_device
from engine.hooks import RunHooks
from engine.serving.limits import RequestLimits
from engine.serving.schema import parse_request
from engine.serving.streaming import RowText

from .machine import describe, one_line
from .serve import children, server

PAIR_SUM = "( [1-9][0-9]|  [0-9]) \\+( [1-9][0-9]|  [0-9])"  # the pair-sum verifier's shape (docs/constraints.md)
# The mix: each is one request body (max_tokens is the canvas, so the text is the solo run's whole text)
MIX: list[dict[str, Any]] = [
    {"prompt": "Q: 14+5=? A:", "gen_length": 32, "block_length": 8, "threshold": 0.9, "stream": True},
    {"prompt": "Q: ?+?=57 A:", "gen_length": 16, "block_length": 8, "decoder": "fixed"},
    {"prompt": "Q: 123+45=? A:", "gen_length": 32, "block_length": 16, "decoder": "hierarchical", "cache": "prefix", "stream": True},
    {"prompt": "Q: 300-12=? A:", "gen_length": 32, "block_length": 8, "decoder": "credit", "cache": "dual"},
    {"prompt": "Q: ?+?=38 A:", "gen_length": 32, "block_length": 8, "threshold": 0.1, "regex": PAIR_SUM, "stream": True},
    {"prompt": "Q: rhymes with cat? A:", "gen_length": 64, "block_length": 32, "threshold": 0.9},
    {"messages": [{"role": "user", "content": "Q: 52+48=? A:"}], "gen_length": 32, "block_length": 8, "stream": True},
    {"prompt": "Q: 7-65=? A:", "gen_length": 64, "block_length": 16, "cache": "dual", "stream": True},
    {"prompt": "Q: ?+?=83 A:", "gen_length": 16, "block_length": 16, "threshold": 0.7, "cache": "prefix"},
    {"messages": [{"role": "user", "content": "Q: 999+1=? A:"}], "gen_length": 16, "block_length": 8, "decoder": "fixed", "stream": True},
    {"prompt": "Q: 61-7=? A:", "gen_length": 32, "block_length": 8, "decoder": "hierarchical"},
    {"prompt": "Q: ?+?=12 A:", "gen_length": 32, "block_length": 8, "threshold": 0.1, "regex": PAIR_SUM},
]
MIX = [{**body, "max_tokens": body["gen_length"]} for body in MIX]
ROUND = 50  # requests between two readings of the server's memory


def endpoint(body: dict[str, Any]) -> str:
    return "/chat/completions" if "messages" in body else "/completions"


def solo_text(engine: Engine, body: dict[str, Any]) -> str:
    """The request's answer as one process alone gives it: its settings as the server reads them
    (engine/serving/schema.py), through `Engine.generate`, the text cut as the server cuts a row's
    (engine/serving/streaming.py: at the first end-of-text id, max_tokens, a stop string; a model
    that writes tokens after an end-of-text id has them in `Engine.generate`'s text, not in the answer)."""
    chat = "messages" in body
    parsed = parse_request(body, chat, RequestLimits())
    prompt = body["messages"][0]["content"] if chat else body["prompt"]
    out = engine.generate(prompt, parsed.config, hooks=RunHooks(trace=True)).output
    text, _, _ = RowText(out.trace, engine.decode, parsed.max_tokens, parsed.stop).finish(out.canvas[0].tolist())
    return text


@dataclass
class Answer:
    text: str
    seconds: float
    error: str | None = None  # a status other than 200, an error event, or the client's exception


def ask(client: httpx.Client, body: dict[str, Any]) -> Answer:
    """One request and its whole answer (a stream's chunks joined, as a client reads them)."""
    t0 = time.perf_counter()
    try:
        if not body.get("stream"):
            reply = client.post(endpoint(body), json=body)
            if reply.status_code != 200:
                return Answer("", time.perf_counter() - t0, f"{reply.status_code}: {reply.text[:200]}")
            choice = reply.json()["choices"][0]
            return Answer(choice["message"]["content"] if "message" in choice else choice["text"], time.perf_counter() - t0)
        text, error = "", None
        with client.stream("POST", endpoint(body), json=body) as reply:
            if reply.status_code != 200:
                return Answer("", time.perf_counter() - t0, f"{reply.status_code}: {reply.read()[:200]!r}")
            for line in reply.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line.removeprefix("data: "))
                if "error" in chunk:
                    error = chunk["error"]["message"]
                for choice in chunk.get("choices", []):
                    text += choice.get("text") or (choice.get("delta") or {}).get("content") or ""
        return Answer(text, time.perf_counter() - t0, error)
    except httpx.HTTPError as exc:
        return Answer("", time.perf_counter() - t0, f"{type(exc).__name__}: {exc}")


def load(url: str, clients: int, requests: int, first: int = 0) -> list[tuple[int, Answer]]:
    """`clients` threads sending MIX's requests in turn (the i-th request overall is MIX[i mod len],
    from `first` on) until `requests` are answered; (mix index, answer) each."""
    numbers = itertools.count(first)
    lock = threading.Lock()
    answers: list[tuple[int, Answer]] = []

    def client_loop() -> None:
        with httpx.Client(base_url=url, timeout=600) as client:
            while True:
                with lock:
                    n = next(numbers)
                if n >= first + requests:
                    return
                index = n % len(MIX)
                answer = ask(client, MIX[index])
                with lock:
                    answers.append((index, answer))

    with ThreadPoolExecutor(clients) as pool:
        for future in [pool.submit(client_loop) for _ in range(clients)]:
            future.result()
    return answers


def percentile(values: list[float], q: int) -> float:
    """The `q`-th percentile of `values` (statistics.quantiles' exclusive method; one value: itself)."""
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else values[0]


def rss_mib(pid: int) -> float:
    """The process's resident memory (VmRSS), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise SystemExit(f"error: no VmRSS for process {pid}")


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m benchmarks.load", description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--requests", type=int, default=500, help="requests measured, after the warm-up")
    parser.add_argument("--warmup", type=int, default=64, help="requests under the full load before memory is first read")
    parser.add_argument("--max-batch", type=int, default=8, help="the server's --max-batch")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (the embedded model's default)")
    parser.add_argument("--device", type=checked_device, default="cpu", help="where the server runs the model (cpu, cuda, ...)")
    args = parser.parse_args(argv)
    if min(args.clients, args.requests, args.warmup, args.max_batch, args.threads) < 1:
        parser.error("--clients, --requests, --warmup, --max-batch and --threads must be >= 1")
    torch.set_num_threads(args.threads)
    engine = Engine(DEFAULT_MODEL, device=args.device)
    solo = [solo_text(engine, body) for body in MIX]
    flags = ("--max-traces", str(args.warmup), "--max-pending", str(max(64, args.clients)))
    with server(args.max_batch, args.threads, args.device, *flags) as (url, process):
        warm = load(url, 1, len(MIX)) + load(url, args.clients, args.warmup)  # each alone, then the full load
        memory, answers = [rss_mib(process.pid)], []
        for start in range(0, args.requests, ROUND):  # memory read between rounds, with no request in flight
            answers += load(url, args.clients, min(ROUND, args.requests - start), first=args.warmup + start)
            memory.append(rss_mib(process.pid))
        workers = children(process.pid)
        signalled = time.perf_counter()
        process.send_signal(signal.SIGINT)
        code = process.wait(timeout=600)
        exit_seconds = time.perf_counter() - signalled
    left = [pid for pid in workers if Path(f"/proc/{pid}").exists()]
    same = sum(a.error is None and a.text == solo[i] for i, a in answers)
    errors = sum(a.error is not None for _, a in answers)
    warm_errors = sum(a.error is not None or a.text != solo[i] for i, a in warm)
    latencies = sorted(a.seconds for _, a in answers)
    before, after = memory[0], memory[-1]
    half = memory[len(memory) // 2]
    print(f"embedded model, {len(MIX)} kinds of request (streamed and not, completions and chat, fixed/threshold/hierarchical/credit, "
          f"cache none/prefix/dual, a regex, gen 16-64), server --max-batch {args.max_batch}; {one_line(describe(args.device))}")
    print("| clients | requests | identical to solo | RSS after warm-up (MiB) | halfway | after | growth | second half's growth | p50 latency (s) | p95 latency (s) | errors |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    print(f"| {args.clients} | {len(answers)} | {same}/{len(answers)} | {before:.0f} | {half:.0f} | {after:.0f} | {after - before:+.1f} MiB ({(after - before) / before:+.1%}) "
          f"| {after - half:+.1f} MiB | {statistics.median(latencies):.2f} | {percentile(latencies, 95):.2f} | {errors} |")
    print(f"RSS after warm-up and after each round of {ROUND} requests (MiB): {', '.join(f'{m:.0f}' for m in memory)}")
    print(f"warm-up: {len(warm)} requests, {warm_errors} not identical to solo or failed; SIGINT to exit: {exit_seconds:.2f} s (exit status {code}), processes left: {len(left)}")
    if errors or warm_errors or same != len(answers):
        for index, answer in answers + warm:
            if answer.error is not None or answer.text != solo[index]:
                print(f"first mismatch: request {index} ({json.dumps(MIX[index])[:120]}): {answer.error or repr(answer.text)} != {solo[index]!r}")
                break
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
