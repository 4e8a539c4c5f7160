"""Traces written before version 6 (docs/trace.md §7), brought to version 6 on load, so that every
reader sees one schema: the header's `kind` and `capabilities`, every record's per-row `active`
and `final_until`, and a uniform step's sampled proposal under its own name (versions 1-2); a
version-3 record has no `constraint`, which version 4 reads as a run without one; before version
6 a record did not say how many forwards its step ran (`_forwards`). Every version's config
spells the decoders' own settings one way (`upgrade_config`).

Versions 1 and 2 did not record the loop's per-row state, so it is replayed here from what they
did record, by the rules the loop applied when they were written (the one place those rules are
re-derived; version-3 traces carry them from the engine itself).
"""

from __future__ import annotations

from typing import Any

from .config import lift_moved

# The schema's names, here so that engine/trace.py (which upgrades through this module) and this
# module never import each other.
TRACE_VERSION = 7
MASKED, UNIFORM = "masked", "uniform"  # the diffusion kinds a trace names (engine/kinds/)
REFRESH_FORWARD = "refresh"  # a record's `forward` for a full forward whose K/V become the cache (engine/cache.py)
DRAFT_VERIFY = "draft+verify"  # a speculative record's `forward` when its step drafted and verified (engine/kinds/speculative.py)
EDIT, REMASK = "edit", "remask"


def upgrade_config(config: dict[str, Any]) -> dict[str, Any]:
    """A recorded config (any version) with the settings that became decoder options (engine/config.py
    MOVED_SETTINGS) inside `decoder_options`, where its decoder owns them; others' dropped, since the
    run ignored them; and those that became kind options (MOVED_KIND_SETTINGS) inside
    `kind_options`. Readers (the app's boxes, details, a replay's config) see one spelling."""
    return lift_moved(config, strict=False)


def upgrade(trace: Any) -> None:
    """`trace` (a Trace of version 1 to 6, checked as such) in version 7's form, in place. A
    uniform step's `uniform` became the record's `state` as the trace was read (Trace.from_dict).
    Version 7 added `pinned`, None (nothing pinned) in every older trace."""
    if trace.version not in (3, 4, 5, 6):  # version 4 added the records' optional `constraint` (absent: none), 5 renamed `uniform`
        _kind_and_finality(trace)
    if trace.version != 6:  # version 6 recorded each record's forwards
        _forwards(trace)
    trace.version = TRACE_VERSION


def _forwards(trace: Any) -> None:
    """Each record's forwards, by the rules the kinds followed before they recorded them: a
    speculative step that verified ran two (draft and verify), a uniform canvas's first step
    follows that canvas's encoder forward, every other record is one forward."""
    for rec in trace.iterations:
        encoded = trace.kind == UNIFORM and (rec.state or {}).get("step") == 0
        rec.forwards = 2 if rec.forward == DRAFT_VERIFY or encoded else 1


def _kind_and_finality(trace: Any) -> None:
    """Versions 1-2: the kind, the capabilities and the loop's per-row state, replayed."""
    uniform = trace.config.get("decoder") == UNIFORM or any(rec.state is not None for rec in trace.iterations)
    trace.kind = UNIFORM if uniform else MASKED
    revises = any(rec.revisions is not None for rec in trace.iterations)
    # version 2 did not say whether the decoder asked for a shadow block (WINO)
    trace.capabilities = {"revises": revises if trace.iterations else None, "shadow_block": None}
    if uniform:
        for rec in trace.iterations:
            _upgrade_uniform(rec)
        _uniform_finality(trace)
    else:
        _masked_finality(trace, revises)


def _upgrade_uniform(rec: Any) -> None:
    """Version 2 kept the sampled proposal in `top1` and its probability in `confidence`: they move
    to `state.proposal` / `proposal_probability`, and `top1` becomes the argmax draft. The draft's
    probability was not recorded: where it equals the proposal it is the proposal's, elsewhere 0."""
    u = dict(rec.state or {})
    rec.active = [bool(a) for a in u.pop("active", [True] * len(rec.top1))]
    u["proposal"], u["proposal_probability"] = rec.top1, rec.confidence
    rec.top1 = [list(row) for row in u["draft"]]
    rec.confidence = [[c if d == q else 0.0 for d, q, c in zip(draft, proposal, conf)] for draft, proposal, conf in zip(u["draft"], u["proposal"], u["proposal_probability"])]
    rec.state = u


def _uniform_finality(trace: Any) -> None:
    """A canvas is final once it writes its output; before, the canvases before it are."""
    final = list(trace.prompt_lengths)
    for rec in trace.iterations:
        s, e = rec.block_range
        done = rec.state.get("output") is not None
        final = [max(f, e if done else s) for f in final]
        rec.final_until = list(final)


def _masked_finality(trace: Any, revises: bool) -> None:
    """Per row, replaying the canvas. A one-row run's records are all its row's. With several rows,
    the rule version 2's batcher applied: a row takes part in a record while its block has a mask
    (or the record follows a refresh the row took part in, in the same step), and, for a revising
    decoder, until an iteration of the block changes nothing for it; a row that committed an
    end-of-text stops after its block when the run stops early. For a revising decoder that rule is
    an approximation (it knows no decoder's own limits, and an edit may take an end-of-text back);
    the loop records the exact state since version 3. Finality: a non-revising decoder's
    commits are final at once (the prefix up to the first mask); a revising decoder's when the
    loop leaves their block."""
    rows = len(trace.initial)
    canvas = [list(row) for row in trace.initial]
    stops, mask = set(trace.eos_ids), trace.mask_id
    early_stop = bool(trace.config.get("early_stop", True))
    stop_block: list[int | None] = [None] * rows
    settled_block: list[int | None] = [None] * rows
    after_refresh = [False] * rows
    for rec in trace.iterations:
        s, e = rec.block_range
        active = []
        for r in range(rows):
            finished = early_stop and stop_block[r] is not None and rec.block > stop_block[r]
            if rows == 1:  # every record of a one-row run is its row's (the run goes on only for it)
                took_part = True
            elif revises:  # the batcher's rule of version 2 (it missed a decoder's own limits, as edit's post-edit steps)
                took_part = not finished and settled_block[r] != rec.block
            else:
                took_part = not finished and (after_refresh[r] or any(canvas[r][p] == mask for p in range(s, e)))
            after_refresh[r] = took_part and rec.forward == REFRESH_FORWARD
            active.append(took_part)
            for p in rec.committed[r]:
                canvas[r][p] = rec.top1[r][p - s]
                if canvas[r][p] in stops and p >= trace.prompt_lengths[r] and stop_block[r] is None:
                    stop_block[r] = rec.block
            for revision in (rec.revisions or [[]] * rows)[r]:
                canvas[r][revision["position"]] = mask if revision["kind"] == REMASK else revision["new"]
            if revises and took_part and not rec.committed[r] and not rec.revisions[r]:
                settled_block[r] = rec.block
        rec.active = active
        # a row that early stop ended was filled with end-of-text after its block (no record wrote it)
        ended = [early_stop and stop_block[r] is not None and rec.block > stop_block[r] for r in range(rows)]
        rec.final_until = [s if revises else len(canvas[r]) if ended[r] else _first_mask(canvas[r], trace.prompt_lengths[r], mask) for r in range(rows)]


def _first_mask(row: list[int], start: int, mask: int) -> int:
    return next((p for p in range(start, len(row)) if row[p] == mask), len(row))
