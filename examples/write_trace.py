"""A trace writer another engine can copy (no dinfer-viz import): give it the prompt, what each
step wrote and believed, and the final canvas; it writes a version-3 trace that
`engine.trace.Trace.from_json` loads and docs/trace.schema.json accepts, so `python -m engine
analyze | diff` and the app read your engine's runs. Fields your engine does not have stay null.

    python examples/write_trace.py demo.json      # a two-step demo run
"""

from __future__ import annotations

import json
import sys


def step_record(index: int, block: int, block_range: tuple[int, int], committed: dict[int, int], top1: list[int], confidence: list[float],
                *, seconds: float = 0.0, candidates: list[list[list[float]]] | None = None, final_until: int | None = None) -> dict:
    """One masked-diffusion step of one row: `committed` maps canvas position -> token written
    this step (its token must equal top1 there); `top1`/`confidence` one value per block position
    (the most probable token and its probability); `candidates` per block position [[id, p], ...]."""
    s, e = block_range
    return {
        "iteration": index, "block": block, "block_range": [s, e], "forward": "full", "recomputed": [[s, e]], "threshold": None,
        "committed": [sorted(committed)], "forced": [[]], "top1": [list(top1)], "confidence": [[round(c, 4) for c in confidence]],
        "seconds": seconds, "extras": {}, "cost": None, "candidates": [candidates] if candidates is not None else None,
        "revisions": None, "uniform": None, "active": [True], "final_until": [final_until if final_until is not None else s],
    }


def trace_dict(prompt: list[int], gen_length: int, block_length: int, mask_id: int, eos_ids: list[int], steps: list[dict], final: list[int],
               *, model: str = "my-engine", tokens: dict[int, str] | None = None, config: dict | None = None) -> dict:
    """The whole trace (one row): `steps` from `step_record`, `final` the canvas at the end."""
    n = len(prompt) + gen_length
    return {
        "version": 3, "model": model, "kind": "masked", "capabilities": {"revises": False, "shadow_block": False},
        "mask_id": mask_id, "eos_ids": list(eos_ids), "prompt_lengths": [len(prompt)], "canvas_length": n, "block_length": block_length,
        "config": dict(config or {}), "initial": [list(prompt) + [mask_id] * gen_length], "tokens": {str(k): v for k, v in (tokens or {}).items()},
        "expected": None, "iterations": steps, "final": [list(final)], "stats": {"nfe": len(steps)}, "trace_seconds": 0.0,
    }


def demo() -> dict:
    """Prompt [1, 2], two positions generated in one block: 7 first (p 0.9), then 3 (p 0.6)."""
    steps = [
        step_record(0, 0, (2, 4), {2: 7}, [7, 3], [0.9, 0.4], candidates=[[[7, 0.9], [5, 0.05]], [[3, 0.4], [4, 0.3]]], final_until=3),
        step_record(1, 0, (2, 4), {3: 3}, [7, 3], [0.95, 0.6], candidates=[[], [[3, 0.6], [4, 0.2]]], final_until=4),
    ]
    return trace_dict([1, 2], 2, 2, 0, [9], steps, [1, 2, 7, 3], tokens={0: "[MASK]", 1: "a", 2: "b", 3: "c", 7: "d", 9: "<eos>"})


if __name__ == "__main__":
    with open(sys.argv[1] if len(sys.argv) > 1 else "trace.json", "w") as f:
        json.dump(demo(), f)
