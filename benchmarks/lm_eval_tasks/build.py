"""Write tiny_families.jsonl: held-out prompts of the embedded model's five families, for lm-eval.

    python -m benchmarks.lm_eval_tasks.build            # 20 per family (100 documents)

Each line: the prompt, the family, and one valid response (lm-eval's target; the metric is the
family's own verifier, tinymodel/tasks.py, through utils.py). The split is the families' stable
held-out split, so the file is the same on every machine.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tinymodel.tasks import TASKS, split_examples

DATA = Path(__file__).resolve().parent / "tiny_families.jsonl"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-family", type=int, default=20)
    args = parser.parse_args()
    examples = split_examples(list(TASKS), "held_out", limit=args.per_family)
    DATA.write_text("".join(json.dumps({"prompt": e.prompt, "task": e.task, "response": e.response}) + "\n" for e in examples))
    print(f"wrote {len(examples)} documents to {DATA}")


if __name__ == "__main__":
    main()
