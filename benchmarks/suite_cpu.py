"""Where the test suite's time goes (issue 54): each part of the README's test command run alone,
one after another, with its wall time and the CPU seconds the whole machine was busy meanwhile
(from /proc/stat, so chromium's processes and every process a test starts count too: run it on an
otherwise idle machine). On two cores a part that keeps the machine busy for N CPU seconds takes
at least N/2 s of wall, whatever the tests wait for.

    python -m benchmarks.suite_cpu                 # the three parts, with the README's workers
    python -m benchmarks.suite_cpu -n 0            # extra pytest arguments: here one process

Linux only (/proc/stat).
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

# The suite in three parts that together are `python -m pytest -q` (tests/conftest.py LANES): the
# engine and app unit tests, the browser lane, and every other slow lane (processes, workers,
# torchrun, compile, training, evaluation, fuzz).
PARTS = {"not slow": "not slow", "browser": "browser", "other slow lanes": "slow and not browser"}


def busy_and_total() -> tuple[float, float]:
    """(busy, all) CPU seconds of every core since boot, from /proc/stat's first line (iowait
    counts as idle)."""
    with open("/proc/stat") as stat:
        ticks = [int(field) for field in stat.readline().split()[1:]]
    idle = ticks[3] + ticks[4]
    return (sum(ticks) - idle) / 100, sum(ticks) / 100


def run_part(marker: str, extra: list[str]) -> tuple[str, float, float, float]:
    """(pytest's summary line, wall s, busy CPU s, busy share of the machine) of the tests
    `-m marker` selects."""
    busy0, all0 = busy_and_total()
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", marker, *extra], capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
    wall = time.perf_counter() - start
    busy1, all1 = busy_and_total()
    summary = next((line.strip("= ") for line in reversed(done.stdout.splitlines()) if re.search(r"\d+ (passed|failed)", line)), f"exit {done.returncode}")
    return summary, wall, busy1 - busy0, (busy1 - busy0) / max(all1 - all0, 1e-9)


def main() -> None:
    extra = sys.argv[1:]
    print("| part | pytest's summary | wall | busy CPU | busy share of the machine |")
    print("|---|---|---|---|---|")
    walls, busy = 0.0, 0.0
    for name, marker in PARTS.items():
        summary, wall, cpu, share = run_part(marker, extra)
        walls, busy = walls + wall, busy + cpu
        print(f"| {name} | {summary} | {wall:.0f} s | {cpu:.0f} s | {100 * share:.0f}% |", flush=True)
    print(f"| all three | | {walls:.0f} s | {busy:.0f} s | |")


if __name__ == "__main__":
    main()
