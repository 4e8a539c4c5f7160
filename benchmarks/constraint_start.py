"""How long a constraint's build takes to start (issue 54, docs/constraints.md §1): a trivial
regex's byte-level DFA (`a`: outlines-core builds it in well under a millisecond) through
engine/constraints/bounded.py's run_bounded, so what is timed is the child's start, the arguments'
and the answer's crossing, and its end. The first build includes starting the process the
children come from (an interpreter importing the constraint code, never torch); the later ones are the cost
every build pays. Nothing is read from the disk store: run_bounded builds every time.

    python -m benchmarks.constraint_start --repeats 20     # one row: this checkout's code

To compare code, run it from each checkout, one after the other.
"""

from __future__ import annotations

import argparse
import statistics
import time

from engine.constraints.bounded import run_bounded
from engine.constraints.spec import byte_states


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    repeats = parser.parse_args().repeats
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        assert run_bounded("regex 'a'", byte_states, "a") == 2
        times.append(time.perf_counter() - start)
    print("| first build (process start included) | later builds, median | later builds, min-max |")
    print("|---|---|---|")
    later = times[1:]
    print(f"| {times[0] * 1000:.0f} ms | {statistics.median(later) * 1000:.1f} ms | {min(later) * 1000:.1f}-{max(later) * 1000:.1f} ms |")


if __name__ == "__main__":
    main()
