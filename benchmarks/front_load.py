"""Decoding that follows the load (docs/serving.md §7) against the default settings and against the
front's fastest point, on a ramp of clients, same run.

    python -m engine tune --model tiny-llada --families pairsum add --prompts 10 --trials 40 \\
        --decoders threshold,fixed,entropy_bound --fix gen_length=32 --fix cache=none --front-out front.json
    python -m benchmarks.front_load --front front.json --clients 1,4,16,32 --per-client 3 --repeats 3

Three servers (`python -m engine serve`, benchmarks/serve.py), started together: `default` (no
front: every request the engine's default settings), `following` (`--front FILE --target-p95-ms`)
and `fastest` (a front of the file's last point alone, so every request runs it). The target is
`--target-ms`, or else `--target-factor` times the default server's p95 at one client, measured
first. Then, for each client count of the ramp in turn, each server gets `--per-client` requests
per client of held-out prompts of the front's families (tinymodel/tasks.py, never tuned on),
the servers in turns so a change in the machine's load falls on all three; the following server's
controller carries its state from one step of the ramp to the next, as a loaded server would.
Per server and step: the p50 and p95 latency (sending to whole answer), the share of requests
answered within the target, the held-out accuracy (each family's verifier), the mean forwards per
request (its /metrics) and how many answers each point of the file ran; the whole ramp runs
`--repeats` times and the table gives each figure's median, and each p95's ratio to the default's.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

import httpx
import torch
from prometheus_client.parser import text_string_to_metric_families

from engine import GenerationConfig
from engine.cli import OneLineParser, checked_device
from tinymodel.eval import check_answer
from tinymodel.tasks import Example, split_examples

from .fdfo import send
from .load import Answer, percentile
from .machine import describe, one_line
from .serve import server

SERVERS = ("default", "following", "fastest")


def metric_samples(url: str) -> dict[tuple[str, tuple], float]:
    """A server's /metrics samples by (name, labels)."""
    text = httpx.get(url.removesuffix("/v1") + "/metrics", timeout=60).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in text_string_to_metric_families(text) for s in f.samples}


def bodies(examples: list[Example], count: int, start: int, gen_length: int | None) -> list[dict[str, Any]]:
    """`count` requests cycling through `examples` from `start`: the prompt as the tuner encoded it
    (its default chat-template setting), the tuner's canvas, no decoding setting (a front's to give)."""
    canvas = {"gen_length": gen_length, "max_tokens": gen_length} if gen_length else {}
    chat = GenerationConfig().use_chat_template
    return [{"prompt": examples[(start + i) % len(examples)].prompt, "use_chat_template": chat, **canvas} for i in range(count)]


def figures(answers: list[Answer], sent: list[dict[str, Any]], examples: dict[str, Example], target_s: float, grew: dict[tuple[str, tuple], float]) -> dict[str, float]:
    seconds = [a.seconds for a in answers]
    right = [a.error is None and check_answer(examples[b["prompt"]], a.text) for a, b in zip(answers, sent)]
    rows = grew.get(("dinfer_forwards_per_row_count", ()), 0.0)
    return {
        "p50 (s)": statistics.median(seconds), "p95 (s)": percentile(seconds, 95), "within target": sum(s <= target_s for s in seconds) / len(seconds),
        "accuracy": sum(right) / len(right), "forwards/request": grew.get(("dinfer_forwards_per_row_sum", ()), 0.0) / rows if rows else 0.0,
        "errors": float(sum(a.error is not None for a in answers)),
    }


def points_run(grew: dict[tuple[str, tuple], float], offset: int) -> dict[str, float]:
    """Answers by the front's point they ran (its index in the file: a server of the last point
    alone numbers it 0, hence `offset`)."""
    counts = {dict(labels)["point"]: v for (name, labels), v in grew.items() if name == "dinfer_front_point_answers_total" and v}
    return {str(int(p) + offset) if p.isdigit() else p: v for p, v in counts.items()}


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m benchmarks.front_load", description=__doc__.split("\n\n")[0])
    parser.add_argument("--front", required=True, help="a tune --front-out file")
    parser.add_argument("--model", default="tiny-llada")
    parser.add_argument("--families", default="pairsum,add", help="the task families the front was tuned on (their held-out prompts)")
    parser.add_argument("--clients", default="1,4,16,32", help="the ramp: client counts, in order")
    parser.add_argument("--per-client", type=int, default=2, help="requests per client at each step")
    parser.add_argument("--repeats", type=int, default=3, help="times the whole ramp runs; the table gives each figure's median")
    parser.add_argument("--target-ms", type=float, help="the following server's --target-p95-ms (default: --target-factor x the default's p95 at one client)")
    parser.add_argument("--target-factor", type=float, default=3.0)
    parser.add_argument("--max-batch", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", type=checked_device, default="cpu")
    args = parser.parse_args(argv)
    ramp = [int(c) for c in args.clients.split(",")]
    if min([*ramp, args.per_client, args.repeats, args.max_batch, args.threads]) < 1:
        parser.error("client counts, --per-client, --repeats, --max-batch and --threads must be >= 1")
    torch.set_num_threads(args.threads)
    front = json.loads(Path(args.front).read_text())["front"]
    gen_length = front[0]["config"].get("gen_length")
    families = args.families.split(",")
    examples = split_examples(families, "held_out", limit=40)
    by_prompt = {e.prompt: e for e in examples}
    pending = ("--max-pending", str(max(64, 2 * max(ramp))))
    common = ("--model", args.model, *pending)
    with contextlib.ExitStack() as stack:
        fastest = stack.enter_context(tempfile.NamedTemporaryFile("w", suffix=".json"))
        json.dump({"front": front[-1:]}, fastest)
        fastest.flush()
        default_url = stack.enter_context(server(args.max_batch, args.threads, args.device, *common))[0]
        send(default_url, bodies(examples, 4, 0, gen_length), 1)  # warm-up
        if args.target_ms is None:
            answers, _ = send(default_url, bodies(examples, 10, 0, gen_length), 1)
            args.target_ms = 1000 * args.target_factor * percentile([a.seconds for a in answers], 95)
        target = ("--target-p95-ms", f"{args.target_ms:.0f}")
        urls = {
            "default": default_url,
            "following": stack.enter_context(server(args.max_batch, args.threads, args.device, *common, "--front", args.front, *target))[0],
            "fastest": stack.enter_context(server(args.max_batch, args.threads, args.device, *common, "--front", fastest.name, *target))[0],
        }
        for label in ("following", "fastest"):
            send(urls[label], bodies(examples, 4, 0, gen_length), 1)
        print(f"{args.model}, front of {len(front)} points ({args.front}), target p95 {args.target_ms:.0f} ms, held-out {'+'.join(families)} prompts, "
              f"{args.per_client} requests per client, ramp run {args.repeats} times (medians), --max-batch {args.max_batch}; {one_line(describe(args.device))}")
        results: dict[tuple[int, str], list[dict[str, float]]] = {}
        used: dict[tuple[int, str], dict[str, float]] = {}
        for _ in range(args.repeats):  # the whole ramp again: the following server starts each from where the last left it
            start = 0
            for clients in ramp:
                sent = bodies(examples, clients * args.per_client, start, gen_length)
                start += len(sent)
                for label in SERVERS:
                    before = metric_samples(urls[label])
                    answers, _ = send(urls[label], sent, clients)
                    grew = {k: v - before.get(k, 0.0) for k, v in metric_samples(urls[label]).items()}
                    results.setdefault((clients, label), []).append(figures(answers, sent, by_prompt, args.target_ms / 1000, grew))
                    for point, n in points_run(grew, len(front) - 1 if label == "fastest" else 0).items():
                        used.setdefault((clients, label), {}).setdefault(point, 0.0)
                        used[(clients, label)][point] += n
    names = list(next(iter(results.values()))[0])
    print("| clients | server | " + " | ".join(names) + " | p95 / default's | points run (all rounds) |")
    print("|---" * (len(names) + 4) + "|")
    for (clients, label), rows in results.items():
        median = {n: statistics.median(r[n] for r in rows) for n in names}
        base = statistics.median(r["p95 (s)"] for r in results[(clients, "default")])
        cells = [f"{median[n]:.3f}" if n.endswith("(s)") else f"{median[n]:.2f}" for n in names]
        points = " ".join(f"{p}:{int(v)}" for p, v in sorted(used.get((clients, label), {}).items())) or "-"
        print(f"| {clients} | {label} | " + " | ".join(cells) + f" | {median['p95 (s)'] / base:.2f}x | {points} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
