"""A trace's numbers are `round(v, 4)` of each float32 value, as they were when each was rounded by
a Python call: `rounded`, `candidate_lists` and `jsonable` now round a step's values in one tensor
op (engine/trace.py `_four_places`), and must give the same doubles, ties at the fifth decimal
included, so traces written before and after compare equal."""

from __future__ import annotations

import math

import torch

from engine.trace import candidate_lists, jsonable, rounded


def python_round(t: torch.Tensor) -> list:
    return [round(v, 4) for v in t.float().flatten().tolist()]


def same(a: list, b: list) -> bool:
    """Equal doubles, signs of zero and NaNs included (repr tells -0.0 from 0.0, and nan == nan)."""
    return len(a) == len(b) and all(repr(x) == repr(y) for x, y in zip(a, b))


def values() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    grid = torch.arange(2**17, dtype=torch.float64).float() / 2**17  # every k / 2**17: exact ties at the fifth decimal among them
    scaled = torch.cat([torch.randn(5_000, generator=g) * 10.0**e for e in range(-6, 7, 2)])
    special = torch.tensor([0.0, -0.0, -0.00004, -0.00005, 0.00005, 0.00015, 1.0, -1.0, 3.4e38, 1e-45, math.inf, -math.inf, math.nan])
    return torch.cat([grid, -grid, scaled, special])


def test_rounded_and_jsonable_equal_pythons_round_of_each_float32():
    v = values()
    square = v[: v.numel() // 1000 * 1000].reshape(1000, -1)
    assert same(rounded(v), python_round(v))
    assert same([x for row in rounded(square) for x in row], python_round(square))
    assert same([x for row in jsonable(square) for x in row], python_round(square))
    assert same(rounded(v.to(torch.bfloat16)), python_round(v.to(torch.bfloat16)))


def test_candidate_lists_keep_masked_positions_pairs_with_each_probability_rounded():
    g = torch.Generator().manual_seed(1)
    probs = torch.softmax(torch.randn(4, 16, 50, generator=g) * 3, dim=-1).topk(3, dim=-1)
    masked = torch.rand(4, 16, generator=g) < 0.6
    lists = candidate_lists((probs.indices, probs.values), masked)
    for b in range(4):
        for w in range(16):
            want = [[int(i), round(p, 4)] for i, p in zip(probs.indices[b, w].tolist(), probs.values[b, w].tolist())] if masked[b, w] else []
            assert lists[b][w] == want
            assert all(type(i) is int and type(p) is float for i, p in lists[b][w])
