"""How long a fresh process takes to answer (issue 54): the CLI's `generate` on the embedded model
(import, load, a 32-token answer, exit) and a script's two-rank tensor-parallel Engine to its first
answer (two worker processes spawned, each importing torch, loading its shard and all-reducing in
every layer). Every repeat is a new interpreter, as a user's command or the app's parallel engine
is; the medians are printed with the min-max.

    python -m benchmarks.process_start --repeats 5     # one row per case: this checkout's code

To compare code, run it from each checkout, one after the other.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

TP_SCRIPT = (
    "from engine import Engine, GenerationConfig\n"
    "with Engine('tiny-llada', tp_size=2) as engine:\n"
    "    engine.generate('Q: 2+3=? A:', GenerationConfig(gen_length=32))\n"
)
CASES = {
    "CLI generate, 32 tokens": [sys.executable, "-m", "engine", "generate", "--model", "tiny-llada", "--prompt", "Q: 2+3=? A:", "--gen-length", "32"],
    "tp=2 Engine, first answer": [sys.executable, "-c", TP_SCRIPT],
}


def seconds(command: list[str]) -> float:
    """Wall seconds of one run of `command` from the repository's root (it must succeed)."""
    start = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True, cwd=Path(__file__).resolve().parents[1])
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    repeats = parser.parse_args().repeats
    print("| process | median | min-max |")
    print("|---|---|---|")
    for name, command in CASES.items():
        times = [seconds(command) for _ in range(repeats)]
        print(f"| {name} | {statistics.median(times):.2f} s | {min(times):.2f}-{max(times):.2f} s |", flush=True)


if __name__ == "__main__":
    main()
