"""A plain request's latency while structured-output requests run and build (issue 60), on
`python -m engine serve` (its own process, the code of the current directory; benchmarks/serve.py).

    python -m benchmarks.constraint_load                           # one row: this checkout's server
    python -m benchmarks.constraint_load --batching short-first    # short rows' forwards first
    python -m benchmarks.constraint_load --parts                   # each half of the load alone too
    python -m benchmarks.constraint_load --forward-positions 0     # no position budget (a CPU server's default: 256)
    python -m benchmarks.constraint_load --forward-lanes 1         # one round at a time (a 2-core CPU server's default: 2)
    python -m benchmarks.constraint_load --keep-alive              # the plain requests on one kept connection
    python -m benchmarks.constraint_load --max-batch 8             # 8 rows decoding at once (a CPU server's default: 16)
    python -m benchmarks.constraint_load --prebuilt                # the regex requests' automata built first: their rows, no builds

First a json_object request (max_tokens 256) warms the server (its automaton read from the store
or built: set DINFER_VIZ_CACHE to a folder that keeps it), then `--repeats` plain requests one
after another give the solo latency (median). Then, in flight at once: a client sending json_object
requests (max_tokens 256) back to back, and eight clients each sending a regex slow to build
(`(a|b)*a(a|b){9}` behind a literal of its own, so none is kept: a byte-level DFA of about 1,000
states, within every bound); meanwhile `--repeats` plain requests one after another give the loaded
latency (median, and the mean, where a wait for a row slot shows), and the row their ratios to the
solo one; the same with a plain max_tokens-256 loop and no builds is the control (what padding
beside a longer row costs a plain request anyway). The loop's requests wait for the builds'
clients to end. To compare code, run it from each checkout.
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import sys
import threading
import time

import httpx

from .serve import server

PLAIN = {"prompt": "Q: 14+5=? A:", "max_tokens": 64}
JSON_OBJECT = {"prompt": "A city record:", "max_tokens": 256, "response_format": {"type": "json_object"}}
SLOW = r"(a|b)*a(a|b){9}"
BUILDS = 8


def seconds(url: str, body: dict, client: httpx.Client | None = None) -> float:
    """One request's latency, from its send to its whole answer (a 200): on `client`'s kept
    connection, else on a client of its own (a new connection; making the client, about 20 ms of
    this machine's CPU, counted in the latency)."""
    start = time.perf_counter()
    reply = (client or httpx).post(url + "/completions", json=body, timeout=900)
    reply.raise_for_status()
    return time.perf_counter() - start


def regex_request() -> dict:
    """A plain request constrained by SLOW behind a literal of its own: an automaton no one built."""
    return {**PLAIN, "regex": f"n{secrets.token_hex(4)}:{SLOW}"}


def under_load(url: str, loop_body: dict, builds: int, repeats: int, plain: httpx.Client | None = None,
               prebuilt: bool = False) -> tuple[list[float], list[float], int]:
    """The plain latencies (on `plain`'s connection, if given) while one client sends
    `loop_body` back to back and `builds` clients each send a regex request (`regex_request`);
    `prebuilt`: each regex's automaton built by a request of its own first (the same rows, no
    builds). With the loop's latencies and the regex requests still in flight after the plain ones."""
    regex_bodies = [regex_request() for _ in range(builds)]
    if prebuilt:
        for body in regex_bodies:
            seconds(url, body)
    stop, looped, built = threading.Event(), [], []

    def loop_client() -> None:
        while not stop.is_set():
            looped.append(seconds(url, loop_body))

    def build_client(body: dict) -> None:
        try:
            httpx.post(url + "/completions", json=body, timeout=900)
        finally:
            built.append(1)

    clients = [threading.Thread(target=loop_client, daemon=True)] + [threading.Thread(target=build_client, args=(b,), daemon=True) for b in regex_bodies]
    for c in clients:
        c.start()
    time.sleep(1.0)  # the loop's first request runs and the builds' requests are being checked
    loaded = [seconds(url, PLAIN, plain) for _ in range(repeats)]
    in_flight = builds - len(built)
    stop.set()
    for c in clients:
        c.join()
    return loaded, looped, in_flight


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.constraint_load", description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=7, help="plain requests per median")
    ap.add_argument("--label", default="this checkout", help="the rows' name")
    ap.add_argument("--batching", default="continuous", help="the server's --batching")
    ap.add_argument("--forward-positions", type=int, help="the server's --forward-positions (a round's position budget; 0: none)")
    ap.add_argument("--forward-lanes", type=int, help="the server's --forward-lanes (rounds run at once; a CPU server's default: 2 on 2 cores)")
    ap.add_argument("--parts", action="store_true", help="also the json_object loop without the builds, and the builds beside the plain loop")
    ap.add_argument("--prebuilt", action="store_true", help="each regex request's automaton built before its load (the same rows, no builds)")
    ap.add_argument("--max-batch", type=int, help="the server's --max-batch (rows decoding at once; default: the server's, 16 under its budget)")
    ap.add_argument("--keep-alive", action="store_true", help="the plain requests on one kept connection (as the openai client sends them), not a new client each")
    args = ap.parse_args(argv)
    plain_loop = {k: v for k, v in JSON_OBJECT.items() if k != "response_format"}
    # the control first: the same load without constraints (a plain request beside a longer one)
    loads = [("a plain max_tokens-256 loop", plain_loop, 0)]
    if args.parts:
        loads += [("a json_object max_tokens-256 loop", JSON_OBJECT, 0), ("a plain max_tokens-256 loop + 8 builds", plain_loop, BUILDS)]
    loads.append(("a json_object max_tokens-256 loop + 8 builds", JSON_OBJECT, BUILDS))
    rows = []
    budget = ("--forward-positions", str(args.forward_positions)) if args.forward_positions is not None else ()
    budget += ("--forward-lanes", str(args.forward_lanes)) if args.forward_lanes is not None else ()
    with server(args.max_batch, 1, "cpu", "--batching", args.batching, *budget) as (url, _), httpx.Client() as kept:
        plain = kept if args.keep_alive else None
        seconds(url, JSON_OBJECT)  # warm: json_object's automaton in memory
        solo = statistics.median(seconds(url, PLAIN, plain) for _ in range(args.repeats))
        for name, body, builds in loads:
            latencies, looped, in_flight = under_load(url, body, builds, args.repeats, plain, args.prebuilt)
            loaded = statistics.median(latencies)
            rows.append([args.label, name, f"{1000 * solo:.0f}", f"{1000 * loaded:.0f}", f"{loaded / solo:.2f}x", f"{statistics.mean(latencies) / solo:.2f}x",
                         f"{len(looped)} ({1000 * statistics.median(looped):.0f})" if looped else "0", f"{in_flight} of {builds}" if builds else "-"])
            print(" | ".join(rows[-1]), file=sys.stderr, flush=True)
    header = ["server", "in flight", "plain solo ms (median)", "plain meanwhile ms (median)", "meanwhile / solo", "mean meanwhile / solo", "loop requests (median ms)", "builds in flight after"]
    print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
