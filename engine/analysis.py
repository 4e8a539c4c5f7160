"""Analyses of any trace (engine, reference, imported), from what the trace holds: per step the
finalized fraction, KL to the final answer, the gate and mean confidence of the open positions
and the commits; per run how left-to-right the finalisation order is and whether it converged;
over many runs (a sweep's value) those per-run figures aggregated.
The formulas and what each approximates: docs/analysis.md §3.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from .step_state import StepState, step_state
from .trace import IterationRecord, Trace
from .trace_diff import canvases

EPS = 1e-4  # a trace keeps probabilities to 4 decimals: no smaller probability is known


def _rules(trace: Trace) -> StepState:
    """How the run's kind reads a step (engine/step_state.py); masked diffusion's for a trace that
    names none."""
    return step_state(getattr(trace, "kind", None) or "masked")


def current_tokens(trace: Trace, row: int = 0) -> list[list[int | None]]:
    """Per step, per canvas position, the token the run held or predicted there after that step
    (None: nothing recorded), as the run's kind reads its records (`StepState.current`; masked:
    the canvas where it is written, the record's top-1 at the block's open positions). After the
    last step: the final canvas (its early-stop fill)."""
    rules = _rules(trace)
    out = [rules.current(rec, row, canvas, trace.mask_id) for rec, canvas in zip(trace.iterations, canvases(trace, row))]
    if out and trace.final:
        out[-1] = list(trace.final[row])
    return out


def _generated(trace: Trace, row: int) -> list[int]:
    """The row's positions after its prompt the run wrote: not the text its request pinned
    (docs/algorithms.md §11), which is final from the start and in no decoder's order."""
    width = len(trace.final[row]) if trace.final else trace.canvas_length
    pinned = set(trace.pinned[row]) if trace.pinned else set()
    return [p for p in range(trace.prompt_lengths[row], width) if p not in pinned]


def _final(trace: Trace, row: int) -> list[int]:
    return list(trace.final[row]) if trace.final else canvases(trace, row)[-1]


def finalization_steps(trace: Trace, row: int = 0) -> dict[int, int]:
    """Per generated position, the first step from which its current token equals the final
    token at every later step."""
    final, cur = _final(trace, row), current_tokens(trace, row)
    steps = {}
    for p in _generated(trace, row):
        i = len(cur)
        while i > 0 and cur[i - 1][p] == final[p]:
            i -= 1
        steps[p] = min(i, len(cur) - 1)
    return steps


def _q_final(rec: IterationRecord, row: int, w: int, token: int) -> float:
    """The step's probability of the final token at block position w, or an upper bound on it
    when the trace does not hold it (not among the candidates; top-1 is another token)."""
    pairs = rec.candidates[row][w] if rec.candidates is not None and rec.candidates[row][w] else None
    if pairs:
        known = {int(i): float(p) for i, p in pairs}
        return known.get(token, max(min(min(known.values()), 1.0 - sum(known.values())), 0.0))
    conf = float(rec.confidence[row][w])
    return conf if rec.top1[row][w] == token else 1.0 - conf


def kl_to_final(trace: Trace, row: int = 0) -> list[float | None]:
    """Per step, the mean over the positions whose state the step holds of KL(final || step) =
    -log q(final token): a written token is a point mass (0 if it is the final token, -log EPS if
    not), an open position of the step's block uses its candidates or top-1/confidence."""
    final, rules, mask = _final(trace, row), _rules(trace), trace.mask_id
    out = []
    for rec, canvas in zip(trace.iterations, canvases(trace, row)):
        s, e = rec.block_range
        terms = []
        for p in _generated(trace, row):
            if rules.written(rec, canvas, p, mask):
                terms.append(0.0 if canvas[p] == final[p] else -math.log(EPS))
            elif s <= p < e:
                terms.append(-math.log(max(_q_final(rec, row, p - s, final[p]), EPS)))
        out.append(round(sum(terms) / len(terms), 4) if terms else None)
    return out


def open_confidences(trace: Trace, row: int = 0) -> list[list[float]]:
    """Per step, the confidences of its open positions (`StepState.open_positions`: masked, the
    block's positions still [MASK] before the step; uniform, every position of the canvas)."""
    rules = _rules(trace)
    before = [list(trace.initial[row])] + canvases(trace, row)
    return [[float(rec.confidence[row][p - rec.block_range[0]]) for p in rules.open_positions(rec, before[i], trace.mask_id)] for i, rec in enumerate(trace.iterations)]


def spearman(xs: list[float], ys: list[float]) -> float | None:
    """Spearman's rank correlation (average ranks for ties); None when either side is constant."""
    if len(xs) < 2:
        return None
    rx, ry = _ranks(xs), _ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sx, sy = math.sqrt(sum((a - mx) ** 2 for a in rx)), math.sqrt(sum((b - my) ** 2 for b in ry))
    return None if sx == 0 or sy == 0 else round(sxy / (sx * sy), 6)


def _ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def decided_steps(trace: Trace, row: int = 0) -> dict[int, int]:
    """`finalization_steps` of the positions some record's block covered: early stop fills the
    canvas after a row's end with end-of-text at no step, and those positions would all count as
    final at the last step, reading as a left-to-right order the decoder never chose."""
    recorded = max((rec.block_range[1] for rec in trace.iterations), default=0)
    return {p: t for p, t in finalization_steps(trace, row).items() if p < recorded}


def order_correlation(trace: Trace, row: int = 0) -> dict[str, Any]:
    """Rank correlation of position against finalisation step: over the generated positions a step
    decided (`decided_steps`: not those early stop filled, counted in `filled`), and within each
    block the run recorded (a block of one position counts 1.0; a block finalised in one step has
    none); `within_blocks` is the mean of the blocks that have one."""
    steps = decided_steps(trace, row)
    overall = spearman(list(steps), list(steps.values()))
    spans = sorted({tuple(rec.block_range) for rec in trace.iterations})
    per_block = []
    for s, e in spans:
        ps = [p for p in range(s, e) if p in steps]
        if ps:
            per_block.append(1.0 if len(ps) == 1 else spearman(ps, [steps[p] for p in ps]))
    known = [c for c in per_block if c is not None]
    filled = len(_generated(trace, row)) - len(steps)
    return {"overall": overall, "within_blocks": round(sum(known) / len(known), 6) if known else None, "per_block": per_block, "filled": filled}


def converged(trace: Trace, row: int = 0) -> bool | None:
    """By the run's kind's rule (`StepState.converged`). Masked: the final canvas holds no [MASK] in
    the generated part and, for a decoder that revises, each block's last step changed nothing.
    Uniform: every canvas's last step stopped by the adaptive rule (not at the step limit); None
    when the trace lacks the stop rule's state."""
    if not trace.iterations:
        return None
    last: dict[int, IterationRecord] = {}
    for rec in trace.iterations:
        last[rec.block] = rec
    final = _final(trace, row)
    open_left = any(final[p] == trace.mask_id for p in _generated(trace, row))
    return _rules(trace).converged(trace.iterations, list(last.values()), row, open_left)


# How `engine analyze` and the app print a figure the trace cannot give (no open position left, no
# order to correlate, an old trace without the stop rule's state): the same words, never Python's None
NOT_KNOWN = "n/a"
CONVERGED_WORDS = {True: "yes", False: "no", None: "unknown (the trace lacks the stop rule's state)"}


def figure_text(value: float | None, digits: int = 3) -> str:
    """One analysis figure as text: `digits` decimals, NOT_KNOWN where there is none."""
    return NOT_KNOWN if value is None else f"{value:.{digits}f}"


def analyze(trace: Trace, row: int = 0) -> dict[str, Any]:
    """Every analysis of row `row`: the per-step lists (one entry per record) and the per-run values."""
    final, cur = _final(trace, row), current_tokens(trace, row)
    generated = _generated(trace, row)
    finalized = [round(sum(c[p] == final[p] for p in generated) / len(generated), 4) if len(generated) else None for c in cur]
    opens = open_confidences(trace, row)
    order = order_correlation(trace, row)
    return {
        "steps": len(trace.iterations),
        "finalized_fraction": finalized,
        "kl_to_final": kl_to_final(trace, row),
        "gate_confidence": [round(min(c), 4) if c else None for c in opens],
        "mean_confidence": [round(sum(c) / len(c), 4) if c else None for c in opens],
        "commits": [len(rec.committed[row]) for rec in trace.iterations],
        "order_correlation": order["overall"],
        "order_correlation_within_blocks": order["within_blocks"],
        "order_correlation_per_block": order["per_block"],
        "order_left_out": order["filled"],  # positions early stop filled: not in the order correlation
        "converged": converged(trace, row),
    }


# ---- over many runs (a sweep's value): a few numbers per run, aggregated -------------------------


@dataclass(frozen=True)
class RunFigures:
    """The per-run analyses a sweep keeps for each run instead of its trace (docs/analysis.md §3.7):
    a few numbers, so thousands of runs hold no more than their outcomes do."""

    order_correlation: float | None
    order_correlation_within_blocks: float | None
    kl_area: float | None
    converged: bool | None


def kl_area(kl: Sequence[float | None]) -> float | None:
    """The area under a run's KL-to-final curve against the fraction of its steps elapsed, each
    step an equal share: the mean of the steps that have a value (None: no step has one). Runs of
    different lengths then compare, and the area of several runs' mean curve is their mean area."""
    known = [v for v in kl if v is not None]
    return round(sum(known) / len(known), 4) if known else None


def run_figures(trace: Trace, row: int = 0) -> RunFigures:
    """Row `row`'s RunFigures: the same order correlation, KL and convergence `analyze` gives."""
    order = order_correlation(trace, row)
    return RunFigures(order["overall"], order["within_blocks"], kl_area(kl_to_final(trace, row)), converged(trace, row))


def quartiles(values: Sequence[float]) -> dict[str, float | int | None]:
    """The median, first and third quartile (linear interpolation between the sorted values, as
    numpy's default) and how many values: every figure None for none."""
    xs = sorted(values)
    if not xs:
        return {"median": None, "q1": None, "q3": None, "runs": 0}

    def at(q: float) -> float:
        k = q * (len(xs) - 1)
        lo = math.floor(k)
        hi = min(lo + 1, len(xs) - 1)
        return round(xs[lo] + (xs[hi] - xs[lo]) * (k - lo), 6)

    return {"median": at(0.5), "q1": at(0.25), "q3": at(0.75), "runs": len(xs)}


def aggregate_runs(runs: Sequence[RunFigures]) -> dict[str, Any]:
    """The analyses over several runs (one swept value's): each order correlation's quartiles over
    the runs that have one, the mean KL area (the area of the runs' mean KL curve), and the share
    of the runs that know whether they converged that did (`converged_runs`: how many know);
    `runs`: how many were aggregated."""
    kl = [r.kl_area for r in runs if r.kl_area is not None]
    known = [r.converged for r in runs if r.converged is not None]
    return {
        "runs": len(runs),
        "order_correlation": quartiles([r.order_correlation for r in runs if r.order_correlation is not None]),
        "order_correlation_within_blocks": quartiles([r.order_correlation_within_blocks for r in runs if r.order_correlation_within_blocks is not None]),
        "kl_area": round(sum(kl) / len(kl), 4) if kl else None,
        "converged_share": round(sum(known) / len(known), 4) if known else None,
        "converged_runs": len(known),
    }
