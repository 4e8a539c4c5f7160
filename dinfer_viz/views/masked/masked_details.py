"""The details panel of a masked-diffusion run: everything the trace knows about one canvas position at one iteration, as
HTML large enough for a projector (what it shows: docs/app.md §2, "Details panel"), all from the
trace (docs/trace.md), each commit rule stated as engine/decoders/ applies it.

Every string that reaches the HTML goes through `cells.inert` (html.escape plus the characters a
template step could evaluate): token strings come from tokenizers and trace files, i.e. anyone.
`iteration` is a record index as everywhere in Timeline (-1: before the first forward); the page's
numbers are `iteration_number`'s (1..N, 0 before the first forward).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from engine import IterationRecord
from engine.decoders.filling import CreditDecoder, FixedStepDecoder, HierarchicalDecoder
from engine.decoders.entropy_bound import EntropyBoundDecoder
from engine.decoders.factor import FactorDecoder
from engine.trace import CANDIDATES_MAX_BLOCK

from ...drawing.cache_figure import STATES, cache_states, state_explanation
from ...drawing.cells import PINNED_WORDS, inert, revision_line
from ...drawing.constraint import dropped_at, history_cell, restricted_at, restriction_words, run_constraint, run_line
from ...drawing.panel import PanelRows, history_table, number, panel, run_option, token_name
from ...reading.timeline import Timeline, iteration_number

REVISION_ROWS = 12  # a position edited back and forth lists its latest revisions


def _tau(value: float) -> str:
    return f"{value:.2f}" if round(value, 2) == value else f"{value:.4g}"


def _masked_before(timeline: Timeline, position: int, index: int) -> bool:
    """Whether `position` held [MASK] when record `index` started (its decoder chose among these)."""
    return timeline.token_before(position, index) == timeline.mask_id


def _config(timeline: Timeline, name: str, default: Any = None) -> Any:
    return timeline.trace.config.get(name, default)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _block_masks(timeline: Timeline, rec: IterationRecord, index: int) -> list[int]:
    s, e = rec.block_range
    return [q for q in range(s, e) if _masked_before(timeline, q, index)]


@dataclass(frozen=True)
class _Decision:
    """What record `index`'s decoder saw and decided at `position` (masked when the record started
    and inside its block): the inputs of a decoder's rule in words."""

    timeline: Timeline
    rec: IterationRecord
    index: int
    position: int
    c: float  # the position's confidence
    committed: bool
    forced: bool
    extras: dict[str, Any]

    @property
    def tau(self) -> float | None:
        return self.rec.threshold


# decoder name -> its rule in words (None when the record lacks what the rule compared); each rule
# registers under the name of the decoder it explains (engine/decoders/)
_RULES: dict[str, Callable[[_Decision], str | None]] = {}


def _explains(decoder: str) -> Callable[[Callable[[_Decision], str | None]], Callable[[_Decision], str | None]]:
    def register(rule: Callable[[_Decision], str | None]) -> Callable[[_Decision], str | None]:
        _RULES[decoder] = rule
        return rule

    return register


def rule_text(timeline: Timeline, index: int, position: int) -> str:
    """What record `index`'s decoder decided for `position` (masked when the record started and
    inside its block), with the numbers it compared, as engine/decoders/ applies each rule."""
    rec = timeline.records[index]
    row, s = timeline.row, rec.block_range[0]
    extras = {name: values[position - s] for name, values in timeline.extras_at(index).items() if len(values) > position - s}
    decision = _Decision(timeline, rec, index, position, float(rec.confidence[row][position - s]), position in rec.committed[row], position in rec.forced[row], extras)
    decoder = _config(timeline, "decoder", "?")
    rule = _RULES.get(decoder)
    text = rule(decision) if rule is not None else None
    if text is None:
        verdict = "committed" + (" (forced by the at-least-one rule)" if decision.forced else "") if decision.committed else "not committed"
        text = f"{verdict} by decoder {decoder!r} (confidence {number(decision.c)}); no rule for it is written here"
    return text


def _tau_in_force(d: _Decision, text: str) -> str:
    """A threshold rule's text, plus why τ differs from the configured one when smoothing moved it."""
    configured = _config(d.timeline, "threshold")
    if d.tau is not None and _is_number(configured) and d.tau != configured:
        text += f"; τ {_tau(d.tau)} is the threshold in force this iteration (smoothing decays it from 1.0 to the configured {_tau(float(configured))})"
    return text


@_explains("threshold")
def _threshold_decision(d: _Decision) -> str | None:
    return None if d.tau is None else _tau_in_force(d, _threshold_rule(d.c, d.tau, d.committed, d.forced))


@_explains("credit")
def _credit_decision(d: _Decision) -> str | None:
    if d.tau is None:
        return None
    text = _threshold_rule(d.c, d.tau, d.committed, d.forced)
    if _is_number(d.extras.get("raw_confidence")) and _is_number(d.extras.get("credit")):  # a trace file's extras are untrusted
        text += (
            f" (the credit decoder's fused confidence: raw probability {number(float(d.extras['raw_confidence']))}, "
            f"credit {float(d.extras['credit']):.3f}, logits + α·log(1 + credit) with α = {run_option(d.timeline, CreditDecoder, 'credit_alpha')})"
        )
    return _tau_in_force(d, text)


@_explains("hierarchical")
def _hierarchical_decision(d: _Decision) -> str | None:
    return None if d.tau is None else _tau_in_force(d, _hierarchical_rule(d.timeline, d.c, d.tau, d.committed, d.forced, d.extras))


@_explains("factor")
def _factor_decision(d: _Decision) -> str | None:
    return _factor_rule(d.timeline, d.rec, d.index, d.position, d.c, d.committed, d.forced) if "rank" in d.extras else None


def _strictly_above(d: _Decision, name: str, committed: str = "committed", beyond: str | None = None) -> str | None:
    """A rule that fills the masks strictly above a threshold (`name`: τ, τ_in), at least the row's
    most confident one; `beyond`: why a mask above it may still wait (a cap)."""
    if d.tau is None:
        return None
    c, t = number(d.c, d.tau), _tau(d.tau)
    if d.forced:
        return f"forced: confidence {c} ≤ {name} {t}, but every iteration fills at least the row's most confident mask"
    if d.committed:
        return f"{committed}: confidence {c} > {name} {t} (strictly above)"
    if beyond is not None and d.c > d.tau:
        return f"not committed: confidence {c} > {name} {t}, but {beyond}"
    return f"not committed: confidence {c} ≤ {name} {t}"


@_explains("edit")
def _edit_decision(d: _Decision) -> str | None:
    """LLaDA2.1's mask-to-token half (engine/decoders/revising.py); its token-to-token half is a revision,
    stated by `Timeline.describe_revision`."""
    return _strictly_above(d, "τ")


@_explains("wino")
def _wino_decision(d: _Decision) -> str | None:
    """WINO's wide-in half (engine/decoders/remasking.py), the most confident first up to the step's cap;
    its narrow-out half is a remask, stated by the revision."""
    return _strictly_above(d, "τ_in", "committed (wide-in)", "beyond this step's cap on wide-in commits (70% of the masks, 5 to 20)")


@_explains("entropy_bound")
def _entropy_bound_decision(d: _Decision) -> str | None:
    """EB-Sampler (engine/decoders/entropy_bound.py): the block's masks by entropy, lowest first,
    commit while the entropies summed before each stay within the bound; its extras carry both."""
    entropy, before, bound = d.extras.get("entropy"), d.extras.get("entropy_sum"), run_option(d.timeline, EntropyBoundDecoder, "entropy_bound")
    if not (_is_number(entropy) and _is_number(before) and _is_number(bound)):  # a trace file's extras are untrusted
        return None
    sums = f"entropy {float(entropy):.3f}; the lower-entropy masks' entropies sum to {float(before):.3f}"
    if d.committed:
        return f"committed: {sums} ≤ bound γ {float(bound):g}"
    return f"not committed: {sums} > bound γ {float(bound):g}"


@_explains("fixed")
@_explains("remdm")  # ReMDM fills the schedule's count of masks, the most confident first, as fixed does
def _fixed_decision(d: _Decision) -> str | None:
    return _fixed_rule(d.timeline, d.rec, d.index, d.position, d.c, d.committed)


def _threshold_rule(c: float, tau: float, committed: bool, forced: bool) -> str:
    if forced:
        return (
            f"forced: confidence {number(c, tau)} < τ {_tau(tau)}, but no masked position of the block reached τ, and every "
            "iteration commits at least one token per row: this was the most confident one"
        )
    if committed:
        return f"committed: confidence {number(c, tau)} ≥ τ {_tau(tau)}"
    return f"not committed: confidence {number(c, tau)} < τ {_tau(tau)}"


def _hierarchical_rule(timeline: Timeline, c: float, tau: float, committed: bool, forced: bool, extras: dict[str, Any]) -> str:
    low = run_option(timeline, HierarchicalDecoder, "low_threshold")
    anchor = bool(extras.get("anchors"))
    run = extras.get("runs")
    how = "its run's most confident position" if run_option(timeline, HierarchicalDecoder, "anchor") == "confidence" else "the eligible position nearest its run's centre"
    run_name = f"run {run + 1} of consecutive masks" if isinstance(run, int) and run >= 0 else "its run of consecutive masks"
    # the engine's flags pick the branch: the recorded confidences are rounded to 4 decimals
    if forced:
        return (
            f"forced: confidence {number(c, tau)} ≤ τ {_tau(tau)} and not an anchor, but the row's most confident masked "
            "position is always committed"
        )
    if committed and anchor and not c > tau:
        return f"committed as the anchor of {run_name}: confidence {number(c)} > low threshold {low}, and {how} (τ {_tau(tau)} not reached)"
    if committed:
        return f"committed: confidence {number(c, tau)} > τ {_tau(tau)} (strictly above)" + (f", and the anchor of {run_name}" if anchor else "")
    why = f"not above the low threshold {low}" if _is_number(low) and c <= low else f"not {how}"
    return f"not committed: confidence {number(c, tau)} ≤ τ {_tau(tau)}, and not the anchor of {run_name} ({why})"


def _factor_rule(timeline: Timeline, rec: IterationRecord, index: int, position: int, c: float, committed: bool, forced: bool) -> str:
    """Fast-dLLM's factor rule, recomputed from the block's recorded confidences: ranks sorted by
    confidence, rank n passes when c_(n) ≥ 1 - factor/(n + 1) (rank 1 always), the leading run of
    passing ranks commits, all K when that run reaches K - 1."""
    factor = run_option(timeline, FactorDecoder, "factor")
    factor = float(factor) if _is_number(factor) else 1.0  # the engine's default, for a trace file without one
    row, s = timeline.row, rec.block_range[0]
    masks = _block_masks(timeline, rec, index)
    conf = {q: float(rec.confidence[row][q - s]) for q in masks}
    order = sorted(masks, key=lambda q: (-conf[q], q))  # the engine's stable descending sort
    passes = [n == 1 or conf[q] >= 1.0 - factor / (n + 1) for n, q in enumerate(order, start=1)]
    leading = next((n for n, ok in enumerate(passes) if not ok), len(passes))
    k = len(order)
    n = order.index(position) + 1 if position in order else 0
    t = 1.0 - factor / (n + 1)
    rule = f"rank {n} of the {k} masks by confidence, threshold 1 − factor/(n + 1) = 1 − {factor:g}/{n + 1} = {t:.3f}"
    if committed and not forced:  # the engine's flag: the recorded confidences are rounded
        return f"committed: {rule}, confidence {number(c, t)} ≥ {t:.3f}"
    if committed and n == 1:
        return f"forced: rank 1 always commits ({rule}; confidence {number(c, t)} < {t:.3f})"
    if committed:
        return (
            f"forced: {rule}, confidence {number(c, t)} < {t:.3f}, but the leading run of passing ranks covers {leading} of the {k} "
            "masks (at least K − 1), so all K are taken (the reference implementation's quirk)"
        )
    if c < t:
        return f"not committed: {rule}, confidence {number(c, t)} < {t:.3f}"
    return f"not committed: {rule}, confidence {number(c, t)} ≥ {t:.3f}, but only the leading run of passing ranks commits and it stops at rank {leading}"


def _fixed_rule(timeline: Timeline, rec: IterationRecord, index: int, position: int, c: float, committed: bool) -> str:
    """LLaDA's schedule: this step commits k masks, k fixed by the steps per block; k is what the
    record committed (the schedule's share, or every mask left)."""
    row, s = timeline.row, rec.block_range[0]
    k = len(rec.committed[row])
    masks = _block_masks(timeline, rec, index)
    if run_option(timeline, FixedStepDecoder, "remasking") == "random":
        verdict = "committed" if committed else "not committed"
        return f"{verdict}: the schedule commits {k} of the block's {len(masks)} masks this step, chosen at random (remasking = random); confidence {number(c)} plays no part"
    conf = {q: float(rec.confidence[row][q - s]) for q in masks}
    rank = sorted(masks, key=lambda q: (-conf[q], q)).index(position) + 1
    if committed:
        return (
            f"forced by the schedule: the block had to commit {k} token(s) this iteration (steps per block fixed in advance), "
            f"and this was among the top {k} by confidence (rank {rank} of {len(masks)} masks, confidence {number(c)}); no threshold"
        )
    return f"not committed: the schedule commits {k} token(s) this iteration, the top {k} by confidence, and this ranked {rank} of {len(masks)} (confidence {number(c)})"


def _extras_text(timeline: Timeline, index: int, position: int) -> list[tuple[str, str]]:
    """(name, value) of every per-position extra record `index` holds for `position`."""
    rec = timeline.records[index]
    offset = position - rec.block_range[0]
    names = {
        "credit": "credit of the candidate",
        "raw_confidence": "probability before the credit boost",
        "runs": "run of masks (0-based; −1: not masked)",
        "anchors": "anchor of its run",
        "rank": "confidence rank (0-based; −1: not masked)",
        "factor_threshold": "its rank's threshold",
        "staleness_kl": "staleness: KL(exact ‖ cached)",
        "staleness_agree": "top-1 agrees with an exact forward",
    }
    out = []
    for name, values in timeline.extras_at(index).items():
        if offset < len(values):
            value = values[offset]
            shown = f"{value:.4g}" if isinstance(value, float) else ("yes" if value is True else "no" if value is False else str(value))
            out.append((names.get(name, name), shown))
    return out


def _candidates_text(timeline: Timeline, rec: IterationRecord, position: int) -> str:
    """The alternatives the decoder weighed at `position` in `rec`, or why the trace has none."""
    if rec.candidates is None:
        return f"not recorded: the trace keeps them for blocks of at most {CANDIDATES_MAX_BLOCK} positions (and not in traces written before it did)"
    pairs = rec.candidates[timeline.row][position - rec.block_range[0]]
    if not pairs:
        return "none: the position was already committed, so the decoder weighed nothing here"
    return " · ".join(f"{token_name(timeline, int(token))} {number(float(p))}" for token, p in pairs)


def _history(timeline: Timeline, position: int, shown: int) -> str:
    """The top-1 candidate and confidence at every record whose block held `position`; for a
    constrained run, what the constraint did there."""
    constrained = run_constraint(timeline) is not None
    rows = []
    for i, rec in enumerate(timeline.records):
        s, e = rec.block_range
        if not s <= position < e:
            continue
        token = rec.top1[timeline.row][position - s]
        conf = float(rec.confidence[timeline.row][position - s])
        state = "pinned by the request" if position in timeline.pinned else "masked" if _masked_before(timeline, position, i) else "already committed"
        if position in rec.committed[timeline.row]:
            state = "committed here" + (" (forced)" if position in rec.forced[timeline.row] else "")
        revision = timeline.revision_at(position, i)
        if revision is not None:
            state = timeline.describe_revision(revision)
        cells = (str(iteration_number(i)), rec.forward, token_name(timeline, token), number(conf), "—" if rec.threshold is None else _tau(rec.threshold), state)
        rows.append((cells + ((history_cell(timeline, i, position),) if constrained else ()), i == shown))
    if not rows:
        return ""
    head = ("iteration", "forward", "top-1 candidate", "confidence", "τ", "position was")
    return history_table(head + (("constraint",) if constrained else ()), rows)


def position_details(timeline: Timeline, position: int, iteration: int, expected: list[int] | None = None) -> str:
    """HTML panel for canvas `position` after record `iteration` (-1: before the first forward) of
    a masked-diffusion `timeline` (dinfer_viz/panes/details.py has checked both are in the run);
    `expected`: token ids the generation should produce, from the prompt's end."""
    rows = PanelRows()
    add = rows.add
    token = timeline.canvas_at(iteration)[position]
    commit = timeline.commits.get(position)
    in_prompt = position < timeline.prompt_length
    rows.add_position(timeline, position, "block", "in no block this run decoded (early stop ended it first)")
    constraint = run_line(timeline)
    if constraint is not None and not in_prompt:
        add("constraint", constraint)
    if token == timeline.mask_id:
        add("token", "masked: [MASK], not yet committed")
    elif position in timeline.pinned:
        add("token", f"{token_name(timeline, token)}, {PINNED_WORDS}")
    elif commit is None and not in_prompt:
        add("token", f"{token_name(timeline, token)}, filled with end-of-text by early stop (no decoder chose it)")
    else:
        add("token", token_name(timeline, token) + (" (prompt)" if in_prompt and commit is None else ""))
    if commit is not None:
        when = " (this iteration)" if commit.iteration == iteration else " (later than the iteration shown)" if commit.iteration > iteration else ""
        add("committed", f"at iteration {iteration_number(commit.iteration)}{when} as {token_name(timeline, commit.token)}")
        add("why", rule_text(timeline, commit.iteration, position))
        at_commit = restricted_at(timeline, commit.iteration, position)
        if at_commit is not None and commit.iteration != iteration:  # the iteration shown has its own row below
            add("constraint at its commit", restriction_words(timeline, at_commit))
    elif not in_prompt and token == timeline.mask_id:
        add("committed", "not by the end of the run" if timeline.finished else "not yet")
    # the revisions up to the iteration shown (the latest REVISION_ROWS), then how many come later
    revisions = timeline.revisions.get(position, [])
    done = [r for r in revisions if r.iteration <= iteration]
    if len(done) > REVISION_ROWS:
        add("revised", f"{len(done) - REVISION_ROWS} earlier revisions not shown")
    for revision in done[-REVISION_ROWS:]:
        add("revised", revision_line(timeline, revision) + (" (this iteration)" if revision.iteration == iteration else ""))
    if len(done) < len(revisions):
        add("revised later", f"{len(revisions) - len(done)} more revision(s) after the iteration shown, the next at iteration {iteration_number(revisions[len(done)].iteration)}")
    rows.add_expected(timeline, expected, position, token, "not committed yet" if token == timeline.mask_id else None)
    rec = rows.record_holding(
        timeline, iteration, position, "before the first forward: nothing computed, nothing in the cache",
        "not in this iteration's block [{s}, {e}): the decoder did not consider it",
    )
    if rec is not None:
        s = rec.block_range[0]
        candidate = rec.top1[timeline.row][position - s]
        conf = float(rec.confidence[timeline.row][position - s])
        restricted = restricted_at(timeline, iteration, position)
        after = " (what the decoder saw: the constraint's allowed tokens only)" if restricted is not None else ""
        add("top-1 now", f"{token_name(timeline, candidate)} with probability {number(conf)}{after}")
        if restricted is not None:
            add("constraint now", restriction_words(timeline, restricted))
        if position in dropped_at(timeline, iteration):
            add("dropped", "the decoder chose to write here, and the constraint's joint check dropped the write: with the writes kept before it the answer could not be completed")
        add("top candidates", _candidates_text(timeline, rec, position))
        if commit is not None and commit.iteration == iteration or timeline.revision_at(position, iteration) is not None:
            pass  # the decision is the commit or the revision above, with its rule
        elif _masked_before(timeline, position, iteration):
            add("decision now", rule_text(timeline, iteration, position))
        elif position in timeline.pinned:
            add("decision now", "pinned by the request: no decoder may write it; the model only reports what it would predict here")
        else:
            add("decision now", (
                "already committed before this iteration: the decoder could have edited or remasked it here, and its rule did not"
                if timeline.revises else "already committed before this iteration: the decoder only reports what it would predict here"
            ))
        for label, text in _extras_text(timeline, iteration, position):
            add(label, text)
    if iteration >= 0:
        code, sentence = state_explanation(cache_states(timeline, iteration), timeline, iteration, position)
        chip = f'<span style="display:inline-block;width:0.9em;height:0.9em;border-radius:3px;margin-right:8px;vertical-align:-0.1em;background:{STATES[code][0]}"></span>'
        rows.append(("K/V cache", chip + inert(sentence)))
    title = f"Position {position} · " + (f"iteration {iteration_number(iteration)} of {timeline.iterations}" if iteration >= 0 else "before the first forward (iteration 0)")
    return panel(title, rows, "Its block, iteration by iteration", _history(timeline, position, iteration))
