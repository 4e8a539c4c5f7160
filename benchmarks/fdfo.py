"""Continuous batching with first-done-first-out against the lockstep batcher, same workload, same
run: short and long requests of many prompt lengths from several clients at once.

    python -m benchmarks.fdfo --clients 8 --requests 48 --repeats 3
    python -m benchmarks.fdfo --prefix --clients 8 --requests 48 --repeats 3

Both servers are processes of their own (`python -m engine serve --batching continuous|lockstep`,
benchmarks/serve.py), started together and sent the workload in turns, round after round (so a
change in the machine's load falls on both); the clients are threads of this one, each sending
request after request from one shared list (every fourth a long one: a 96-token canvas at one
token per forward; the others short: 16 tokens, threshold 0.9), so short requests keep arriving
while long ones decode. Per server and round: the p50/p95 latency (sending to whole answer) of the
short requests, the long ones' p50, the round's wall time, throughput (answer tokens per second of
wall time), and the model forwards the server ran and their mean rows (its /metrics); the table
gives each figure's median over the rounds and the ratio of the medians against lockstep. Every
answer is checked against the engine's solo answer in this process.

`--forward-positions N`: a third server beside the two, continuous batching with rounds of at most
N positions computed, the rows with the fewest forwards first (`serve --forward-positions`;
0: every row asking, as continuous batching ran before it budgeted a CPU server's rounds).
`--forward-lanes N` likewise: one with N rounds run at once (`serve --forward-lanes`; 1: one at a
time, as before a CPU server ran one lane per core its `--threads` leave).

`--kind uniform|speculative` (issue 58 item 2): requests of a kind that ran alone before, all of
one shape (tiny-gemma's uniform-state runs, two canvases of 16 each request with its own seed; or
tiny-llada2's speculative runs, 32 tokens), continuous batching against lockstep, which still
runs each such request alone (docs/serving.md §3: as continuous batching did before): the p50/p95
latency, the round's wall time, throughput, forwards and their mean rows.

    python -m benchmarks.fdfo --kind uniform --clients 8 --requests 32 --repeats 3

`--prefix`: the prefix cache across requests instead (docs/serving.md §3), on the block-causal
tiny-llada2: every request a question behind one shared system prompt, `cache: prefix`, against a
server with `--prefix-cache-mb 0`; the cache's hits and the prompt tokens whose K/V it supplied
(never computed), the forwards (the cache saves prompt positions inside a row's forwards, not
forwards), the requests' p50 latency. A warm-up request (another question) fills the cache first:
the rounds measure a server whose cache already holds the system prompt.
"""

from __future__ import annotations

import contextlib
import random
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import httpx
import torch
from prometheus_client.parser import text_string_to_metric_families

from engine import Engine
from engine.cli import DEFAULT_MODEL, OneLineParser, checked_device

from .load import Answer, ask, percentile, solo_text
from .machine import describe, one_line
from .serve import server

LONG = {"gen_length": 96, "max_tokens": 96, "block_length": 32, "decoder": "fixed", "steps": 96, "early_stop": False}
SHORT = {"gen_length": 16, "max_tokens": 16, "block_length": 8, "threshold": 0.9}
LLADA2 = "assets/tiny-llada2"
GEMMA = "assets/tiny-gemma"
# a request of each kind that ran alone before issue 58 item 2: its model and its settings
ALONE_KINDS = {
    "uniform": (GEMMA, {"gen_length": 32, "max_tokens": 32}),
    "speculative": (LLADA2, {"kind": "speculative", "gen_length": 32, "max_tokens": 32, "block_length": 8, "threshold": 0.9}),
}
SYSTEM = "You are a careful assistant. You answer sums and rhymes. Think, then answer briefly and exactly. " * 2
PREFIX_CACHE_MB = 256  # the cached server's --prefix-cache-mb (its default)

Round = tuple[list[Answer], float, dict[str, float]]  # a server's answers, the wall time, its counters' growth


def workload(count: int, seed: int = 0) -> list[dict[str, Any]]:
    """`count` request bodies: every fourth long (LONG), the others short (SHORT), prompts of many lengths."""
    rng = random.Random(seed)
    bodies = []
    for i in range(count):
        a, b = rng.randint(0, 10 ** rng.randint(1, 4)), rng.randint(0, 10 ** rng.randint(1, 3))
        prompt = rng.choice([f"Q: {a}+{b}=? A:", f"Q: ?+?={a % 200} A:", f"Q: {a}-{b}=? A:", f"Q: rhymes with {rng.choice(['cat', 'dog', 'sun', 'moon'])}? A:"])
        bodies.append({"prompt": prompt, **(LONG if i % 4 == 0 else SHORT)})
    return bodies


def kind_workload(kind: str, count: int, seed: int = 0) -> list[dict[str, Any]]:
    """`count` requests of `kind` (ALONE_KINDS), prompts of many lengths, each with its own seed."""
    settings = ALONE_KINDS[kind][1]
    return [{"prompt": body["prompt"], **settings, **({"seed": i} if kind == "uniform" else {})} for i, body in enumerate(workload(count, seed))]


def shared_prefix_workload(count: int, seed: int = 0) -> list[dict[str, Any]]:
    """`count` questions behind one system prompt, LLaDA2's exact prefix cache on."""
    rng = random.Random(seed)
    return [{"prompt": SYSTEM + f"Q: {rng.randint(0, 999)}+{rng.randint(0, 99)}=? A:", "gen_length": 32, "max_tokens": 32, "block_length": 8, "cache": "prefix"}
            for _ in range(count)]


def send(url: str, bodies: list[dict[str, Any]], clients: int) -> tuple[list[Answer], float]:
    """Every body sent by `clients` threads taking the next one in turn; the answers in body order, and the wall time."""
    answers: list[Answer | None] = [None] * len(bodies)
    lock, order = threading.Lock(), iter(range(len(bodies)))

    def client_loop() -> None:
        with httpx.Client(base_url=url, timeout=600) as client:
            while True:
                with lock:
                    i = next(order, None)
                if i is None:
                    return
                answers[i] = ask(client, bodies[i])

    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        for future in [pool.submit(client_loop) for _ in range(clients)]:
            future.result()
    return answers, time.perf_counter() - start  # type: ignore[return-value]


def samples(text: str) -> dict[str, float]:
    """A Prometheus text's unlabelled samples by name (counters' _total, histograms' _sum and _count)."""
    return {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples if not s.labels}


def measure(servers: dict[str, tuple[str, ...]], args: Any, bodies: list[dict[str, Any]], warmup: list[dict[str, Any]]) -> dict[str, list[Round]]:
    """Every server (label: its `serve` flags) started at once, sent `warmup`, then `bodies` in
    turns for `args.repeats` rounds; each server's rounds."""
    rounds: dict[str, list[Round]] = {label: [] for label in servers}
    with contextlib.ExitStack() as stack:
        urls = {label: stack.enter_context(server(args.max_batch, args.threads, args.device, *flags))[0] for label, flags in servers.items()}
        for url in urls.values():
            send(url, warmup, args.clients)
        for _ in range(args.repeats):
            for label, url in urls.items():
                before = samples(httpx.get(url.removesuffix("/v1") + "/metrics", timeout=60).text)
                answers, wall = send(url, bodies, args.clients)
                after = samples(httpx.get(url.removesuffix("/v1") + "/metrics", timeout=60).text)
                rounds[label].append((answers, wall, {name: after[name] - before.get(name, 0.0) for name in after}))
    return rounds


def load_figures(bodies: list[dict[str, Any]]) -> Callable[[Round], dict[str, float]]:
    """A round's figures on `workload`'s bodies (the table's columns)."""
    def figures(round_: Round) -> dict[str, float]:
        answers, wall, grew = round_
        short = [a.seconds for a, b in zip(answers, bodies) if b["gen_length"] != LONG["gen_length"]]
        long = [a.seconds for a, b in zip(answers, bodies) if b["gen_length"] == LONG["gen_length"]]
        return {
            "short p50 (s)": statistics.median(short), "short p95 (s)": percentile(short, 95), "long p50 (s)": statistics.median(long), "wall (s)": wall,
            "tokens/s": grew["dinfer_generated_tokens_total"] / wall, "forwards": grew["dinfer_forwards_total"],
            "rows per forward": grew["dinfer_rows_per_forward_sum"] / grew["dinfer_forwards_total"],
        }
    return figures


def kind_figures(round_: Round) -> dict[str, float]:
    """A round's figures on `kind_workload`'s bodies."""
    answers, wall, grew = round_
    seconds = [a.seconds for a in answers]
    return {
        "p50 (s)": statistics.median(seconds), "p95 (s)": percentile(seconds, 95), "wall (s)": wall, "tokens/s": grew["dinfer_generated_tokens_total"] / wall,
        "forwards": grew["dinfer_forwards_total"], "rows per forward": grew["dinfer_rows_per_forward_sum"] / grew["dinfer_forwards_total"],
    }


def prefix_figures(prompt_tokens: int) -> Callable[[Round], dict[str, float]]:
    """A round's figures on `shared_prefix_workload`'s bodies, of `prompt_tokens` in all."""
    def figures(round_: Round) -> dict[str, float]:
        answers, wall, grew = round_
        supplied = grew["dinfer_prefix_cache_saved_tokens_total"]
        return {
            "p50 latency (s)": statistics.median(a.seconds for a in answers), "wall (s)": wall, "hits": grew["dinfer_prefix_cache_hits_total"],
            "prompt tokens computed": prompt_tokens - supplied, "prompt tokens from the cache": supplied, "forwards": grew["dinfer_forwards_total"],
        }
    return figures


def number(value: float) -> str:
    return f"{value:.2f}" if abs(value) < 100 else f"{value:.0f}"


def table(first: str, figures: dict[str, list[dict[str, float]]], baseline: str) -> list[str]:
    """Markdown lines: a row per label with each figure's median over its rounds, then a row per
    other label with the ratio of its medians to `baseline`'s ("-" where the baseline's is 0)."""
    medians = {label: {name: statistics.median(r[name] for r in rounds) for name in rounds[0]} for label, rounds in figures.items()}
    names = list(medians[baseline])
    lines = [f"| {first} | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    lines += [f"| {label} | " + " | ".join(number(m[name]) for name in names) + " |" for label, m in medians.items()]
    base = medians[baseline]
    for label, m in medians.items():
        if label != baseline:
            lines.append(f"| {label} / {baseline} | " + " | ".join(f"{m[name] / base[name]:.2f}x" if base[name] else "-" for name in names) + " |")
    return lines


def identity(rounds: dict[str, list[Round]], solo: list[str]) -> str:
    """How many answers equal their solo answer, per server over all its rounds, and whether the servers' texts agree."""
    same = {label: sum(a.error is None and a.text == s for answers, _, _ in rs for a, s in zip(answers, solo)) for label, rs in rounds.items()}
    texts = [[[a.text for a in answers] for answers, _, _ in rs] for rs in rounds.values()]  # per server, per round
    agree = all(t == texts[0] for t in texts)
    counts = ", ".join(f"{label} {n}/{len(solo) * len(rounds[label])}" for label, n in same.items())
    return f"identical to solo: {counts}; the servers' texts identical in every round: {agree}"


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m benchmarks.fdfo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=48, help="requests a round")
    parser.add_argument("--repeats", type=int, default=3, help="rounds per server, in turns")
    parser.add_argument("--max-batch", type=int, default=8, help="the servers' --max-batch")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--device", type=checked_device, default="cpu", help="where the servers run the model (cpu, cuda, ...)")
    parser.add_argument("--prefix", action="store_true", help="measure the prefix cache across requests instead (module docstring)")
    parser.add_argument("--kind", choices=tuple(ALONE_KINDS), help="measure requests of a kind that ran alone before instead (module docstring)")
    parser.add_argument("--forward-positions", type=int, help="also a continuous server with this --forward-positions (module docstring)")
    parser.add_argument("--forward-lanes", type=int, help="also a continuous server with this --forward-lanes (module docstring)")
    args = parser.parse_args(argv)
    if min(args.clients, args.requests, args.repeats, args.max_batch, args.threads) < 1:
        parser.error("--clients, --requests, --repeats, --max-batch and --threads must be >= 1")
    if args.prefix and args.kind:
        parser.error("--prefix and --kind measure different things: give one")
    if args.forward_positions is not None and (args.prefix or args.kind or args.forward_positions < 0):
        parser.error("--forward-positions: at least 0, and only with the mixed workload (neither --prefix nor --kind)")
    if args.forward_lanes is not None and (args.prefix or args.kind or args.forward_lanes < 1):
        parser.error("--forward-lanes: at least 1, and only with the mixed workload (neither --prefix nor --kind)")
    torch.set_num_threads(args.threads)
    pending = ("--max-pending", str(max(64, args.clients)))
    machine = one_line(describe(args.device))
    if args.prefix:
        bodies = shared_prefix_workload(args.requests)
        engine = Engine(LLADA2, device=args.device)
        servers = {f"{PREFIX_CACHE_MB} MB": ("--model", LLADA2, "--prefix-cache-mb", str(PREFIX_CACHE_MB), *pending), "off": ("--model", LLADA2, "--prefix-cache-mb", "0", *pending)}
        warmup = shared_prefix_workload(1, seed=args.requests + 1)
        prompt_tokens = sum(len(engine.encode(b["prompt"], False)) for b in bodies)
        print(f"tiny-llada2, {len(bodies)} requests a round ({prompt_tokens} prompt tokens) behind one {len(SYSTEM)}-character system prompt, cache prefix, "
              f"{args.clients} clients, --max-batch {args.max_batch}, {args.repeats} rounds; {machine}")
        first, baseline, figures = "prefix cache", "off", prefix_figures(prompt_tokens)
    elif args.kind:
        model = ALONE_KINDS[args.kind][0]
        bodies, engine = kind_workload(args.kind, args.requests), Engine(model, device=args.device)
        servers = {batching: ("--model", model, "--batching", batching, *pending) for batching in ("continuous", "lockstep")}
        warmup = kind_workload(args.kind, args.clients, seed=args.requests + 1)
        lengths = len({len(engine.encode(b["prompt"], False)) for b in bodies})
        print(f"{model}, {len(bodies)} {args.kind} requests a round ({', '.join(f'{k} {v}' for k, v in ALONE_KINDS[args.kind][1].items())}), {lengths} prompt lengths, "
              f"{args.clients} clients, --max-batch {args.max_batch}, {args.repeats} rounds; {machine}")
        first, baseline, figures = f"{args.kind} requests", "lockstep", kind_figures
    else:
        bodies = workload(args.requests)
        engine = Engine(DEFAULT_MODEL, device=args.device)
        servers = {batching: ("--batching", batching, *pending) for batching in ("continuous", "lockstep")}
        if args.forward_positions is not None:
            servers[f"continuous, --forward-positions {args.forward_positions}"] = ("--forward-positions", str(args.forward_positions), *pending)
        if args.forward_lanes is not None:
            servers[f"continuous, --forward-lanes {args.forward_lanes}"] = ("--forward-lanes", str(args.forward_lanes), *pending)
        warmup = bodies[: args.clients]  # the first forwards of each shape
        lengths = len({len(engine.encode(b["prompt"], False)) for b in bodies})
        print(f"embedded model, {len(bodies)} requests a round ({sum(b['gen_length'] == LONG['gen_length'] for b in bodies)} long: "
              f"96 tokens, 96 forwards; the rest 16 tokens, threshold 0.9), {lengths} prompt lengths, {args.clients} clients, --max-batch {args.max_batch}, "
              f"{args.repeats} rounds; {machine}")
        first, baseline, figures = "batching", "lockstep", load_figures(bodies)
    solo = [solo_text(engine, body) for body in bodies]
    rounds = measure(servers, args, bodies, warmup)
    print("\n".join(table(first, {label: [figures(r) for r in rs] for label, rs in rounds.items()}, baseline)))
    print(identity(rounds, solo))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
