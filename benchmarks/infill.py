"""Fill in the middle on the embedded model's held-out families: each hole with the text after it
pinned (`suffix`) against the same hole without it (docs/algorithms.md §11).

    python -m benchmarks.infill                                  # tiny-llada, threshold 0.9
    python -m benchmarks.infill --model tiny-llada-infill --limit 24   # the model trained to fill holes

Per family (tinymodel/infill.py: pair-sum with the second operand pinned, the hole holding the
first; addition and subtraction with the answer pinned after the first operand's hole; grammar with
the sentence's last two words pinned) and per request form: the valid rate (the family's verifier
on the hole's text followed by the suffix, which a hole filled without the suffix never saw) and
tokens per forward (the hole's non-end-of-text tokens over the forwards), one request a case,
`gen_length` and `block_length` the hole's. Only full-attention models fill: tiny-llada2 refuses.
"""

from __future__ import annotations

import torch

from engine import Engine, GenerationConfig
from engine.cli import DEFAULT_MODEL, OneLineParser
from tinymodel.infill import INFILL_TASKS, infill_cases, score_infill


def table(model: str, limit: int, threshold: float, seed: int) -> str:
    """The infill table: one line per family and request form."""
    engine = Engine(model)
    config = GenerationConfig(decoder="threshold", threshold=threshold)
    lines = [f"{'family':<10}{'request':<12}{'n':>4}{'valid %':>9}{'TPF':>7}", "-" * 42]
    for task in INFILL_TASKS:
        cases = infill_cases(task, limit, seed)
        for pinned in (True, False):
            s = score_infill(engine, cases, config, pinned)
            lines.append(f"{task:<10}{'suffix' if pinned else 'no suffix':<12}{s.n:>4}{100 * s.accuracy:>9.1f}{s.tpf:>7.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m benchmarks.infill", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--limit", type=int, default=34, help="cases a family (pair-sum holds out 34 sums)")
    parser.add_argument("--threshold", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(table(args.model, args.limit, args.threshold, args.seed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
