"""The per-iteration trace: the contract between the engine and everything that shows it.

`Trace` (header, `IterationRecord`s, footer; JSON-serialisable, versioned, validated on load),
`Revision` (a committed position a decoder changed) and `TraceRecorder`, the only writer: a loop
builds the header once per run (`RunHooks.begin_trace`), hands a copy to `on_start`, appends the
records and writes the footer. The format, field by field: docs/trace.md.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Iterator

import torch

from .config import GenerationConfig
from .errors import EngineError
from .step_state import step_state
from .trace_upgrade import DRAFT_VERIFY, EDIT, MASKED, REFRESH_FORWARD, REMASK, TRACE_VERSION, UNIFORM, upgrade, upgrade_config


# version 1: no revisions, no uniform steps, no expected answer; version 2: no kind, capabilities,
# `active` or `final_until`, and a uniform record's `top1` was its sampled proposal; version 3: no
# constraint; version 4: a uniform step's state under `uniform`, not `state`; version 5: no
# per-record `forwards`; version 6: no `pinned` (nothing was). All are upgraded on load
# (engine/trace_upgrade.py), so every reader sees version 7.
READABLE_VERSIONS = (1, 2, 3, 4, 5, 6, 7)
# the largest trace file read (the largest the app writes, 1,024 positions of the fixed decoder in
# one block, is 12.5 MB)
MAX_TRACE_BYTES = 64 << 20
MAX_CONFIG_NUMBER = 2**53  # the largest a JSON number keeps exactly, and the page's writer takes

# ids -> {str(id): token string}, the pipeline's tokenizer (engine.pipeline.Engine.token_strings)
TokenStrings = Callable[[set[int]], dict[str, str]]


@dataclass
class IterationRecord:
    iteration: int
    block: int
    block_range: list[int]
    forward: str
    recomputed: list[list[int]]
    threshold: float | None
    committed: list[list[int]]
    forced: list[list[int]]
    top1: list[list[int]]
    confidence: list[list[float]]
    seconds: float
    extras: dict[str, Any] = field(default_factory=dict)
    cost: dict[str, Any] | None = None  # absent from traces written before it existed
    candidates: list[list[list[list[float]]]] | None = None  # likewise; None for long blocks
    # per row, the committed positions this iteration changed (an edit or a remask), as `Revision`
    # dicts (docs/trace.md §3.1); None for a decoder that never revises and in version-1 traces
    revisions: list[list[dict[str, Any]]] | None = None
    # the kind's own step state (docs/trace.md §3.2), by the rules its kind file registers
    # (engine/step_state.py); None for a kind that keeps none (masked diffusion)
    state: dict[str, Any] | None = None
    # per row: whether the row took part in this step (its solo run makes this record), and the
    # canvas position before which its tokens are final (no later record changes them): the loop's
    # own per-row state, which the batcher, streaming, the app and the evaluator read (§3)
    active: list[bool] | None = None
    final_until: list[int] | None = None
    # what the answer's constraint removed this step (docs/trace.md §3.3); None for a run without one
    constraint: dict[str, Any] | None = None
    # the model forwards this step ran, with those the run made since its previous record (a
    # uniform canvas's encoder forward): counted by the run skeleton where each forward happens
    # (engine/run.py), so a run's records sum to its `stats.nfe` and a batched row's to its solo run's
    forwards: int = 1


# the fields a record may lack (older traces, decoders that never revise, masked diffusion, free answers)
OPTIONAL_RECORD_FIELDS = ("extras", "cost", "candidates", "revisions", "state", "active", "final_until", "constraint", "forwards")
# a record's `constraint`: per-row lists of one value per block position (null at positions it did
# not restrict), and per row the canvas positions whose writes it dropped
CONSTRAINT_PER_POSITION = ("allowed", "removed", "model_top1", "model_probability", "top1_removed")
REVISION_FIELDS = ("position", "old", "new", "kind", "rule", "score", "bound")


def _fields(instance: Any) -> dict[str, Any]:
    """A dataclass instance's fields by name, their values as they are."""
    return {f.name: getattr(instance, f.name) for f in dataclasses.fields(instance)}


@dataclass(frozen=True)
class Revision:
    """A committed position changed: `kind` EDIT (`old` -> `new`) or REMASK (`new` is [MASK]),
    because `score` compared against `bound` as `rule` says (e.g. "p(new) > edit threshold")."""

    position: int
    old: int
    new: int
    kind: str
    rule: str
    score: float
    bound: float

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "score": round(self.score, 4)}


TOP_CANDIDATES = 3
CANDIDATES_MAX_BLOCK = 128


# cost: the per-rank lists (rank 0 first) and the rank-0 scalars, with their types (docs/trace.md §3)
COST_PER_RANK = ("compute_seconds", "comm_seconds")
COST_SCALARS = {"compile_seconds": "number", "compiles": "count", "captures": "count", "graph_replay": "bool"}


@dataclass
class Trace:
    version: int = TRACE_VERSION
    model: str = ""
    # the diffusion kind that ran (MASKED or UNIFORM: the strategy in engine/kinds/) and what its
    # decoder declares of itself (`revises`, `shadow_block`; None where an upgraded trace cannot know)
    kind: str = MASKED
    capabilities: dict[str, bool | None] = field(default_factory=dict)
    mask_id: int = 0
    eos_ids: list[int] = field(default_factory=list)
    prompt_lengths: list[int] = field(default_factory=list)
    canvas_length: int = 0
    block_length: int = 0
    config: dict[str, Any] = field(default_factory=dict)
    initial: list[list[int]] = field(default_factory=list)
    tokens: dict[str, str] = field(default_factory=dict)
    # per row, the ids of an answer the caller expects (a viewer marks where the run departs from
    # it; their strings are in `tokens`); None when none was given, and in version-1 traces
    expected: list[list[int]] | None = None
    # per row, the positions the request pinned (engine/infill.py: a suffix, a template's text),
    # which no step writes; None when nothing was pinned, and before version 7
    pinned: list[list[int]] | None = None
    iterations: list[IterationRecord] = field(default_factory=list)
    final: list[list[int]] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)
    trace_seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON's values, a copy the caller may change."""
        return asdict(self)

    def to_json(self) -> str:
        """The trace as JSON, written from its own values (they hold no dataclass): `to_dict`'s deep
        copy took 10x as long, Python-bound time that holds the interpreter lock while a server
        decodes other rows (tests/test_trace_schema.py checks both write the same)."""
        return json.dumps({**_fields(self), "iterations": [_fields(record) for record in self.iterations]})

    @classmethod
    def from_dict(cls, data: Any) -> "Trace":
        """A trace from its JSON form, every field checked (a trace file may come from anyone):
        EngineError naming the first field that is missing, of the wrong type or inconsistent."""
        _need(isinstance(data, dict), f"a trace is a JSON object, not {type(data).__name__}")
        _need(data.get("version") in READABLE_VERSIONS, f"version {data.get('version')!r} is not one of {', '.join(map(str, READABLE_VERSIONS))}")
        upgraded = data.get("version") != TRACE_VERSION
        header = {f: data.get(f) for f in cls.__dataclass_fields__ if f != "iterations"}
        unknown = sorted(set(data) - set(cls.__dataclass_fields__))
        _need(not unknown, f"unknown field(s): {', '.join(map(str, unknown))[:200]}")
        records = data.get("iterations", [])
        _need(isinstance(records, list), "iterations must be a list")
        names = set(IterationRecord.__dataclass_fields__)
        if data.get("version") in (1, 2, 3, 4):  # the kind's state was the uniform kind's `uniform`
            records = [{("state" if k == "uniform" else k): v for k, v in r.items()} if isinstance(r, dict) else r for r in records]
        for i, r in enumerate(records):
            _need(isinstance(r, dict) and names - set(OPTIONAL_RECORD_FIELDS) <= set(r) <= names, f"iterations[{i}] must be an object with the fields {', '.join(sorted(names))}")
        trace = cls(**{k: v for k, v in header.items() if v is not None}, iterations=[IterationRecord(**r) for r in records])
        _need(isinstance(trace.config, dict), "config must be an object")
        trace.config = upgrade_config(trace.config)
        if upgraded:
            trace.check(before_upgrade=True)
            upgrade(trace)
        trace.check()
        return trace

    @classmethod
    def from_json(cls, text: str) -> "Trace":
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as exc:
            raise EngineError(f"trace: not valid JSON ({exc})") from None
        except ValueError as exc:  # an integer of more digits than Python converts (4,300)
            raise EngineError(f"trace: {str(exc)[:120]}") from None
        return cls.from_dict(data)

    def check(self, before_upgrade: bool = False) -> None:
        """Types, sizes and positions consistent enough to replay; EngineError otherwise.
        `before_upgrade`: an older version's fields only (the upgrade adds the rest)."""
        _need(_is_int(self.canvas_length, 1) and _is_int(self.block_length, 1), "canvas_length and block_length must be positive integers")
        _need(_is_int(self.mask_id) and _int_list(self.eos_ids), "mask_id must be an integer and eos_ids a list of integers")
        rows = len(self.initial) if isinstance(self.initial, list) else 0
        _need(rows >= 1 and _int_list(self.prompt_lengths) and len(self.prompt_lengths) == rows, "initial and prompt_lengths need one entry per row")
        for row in range(rows):
            _need(_int_list(self.initial[row]) and len(self.initial[row]) == self.canvas_length, f"initial[{row}] must be canvas_length integers")
            _need(0 <= self.prompt_lengths[row] <= self.canvas_length, f"prompt_lengths[{row}] is outside the canvas")
        _need(isinstance(self.final, list) and all(_int_list(r) for r in self.final), "final must be a list of rows of integers")
        _need(isinstance(self.tokens, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in self.tokens.items()), "tokens must map id strings to strings")
        _need(isinstance(self.config, dict) and isinstance(self.stats, dict) and isinstance(self.model, str), "config and stats must be objects and model a string")
        _check_config(self.config, self.canvas_length)
        # the views do arithmetic on every stat (a string there broke them with a TypeError)
        _need(all(isinstance(k, str) and (v is None or _is_number(v)) for k, v in self.stats.items()), "stats must map names to numbers")
        _need(_is_number(self.trace_seconds), "trace_seconds must be a number")
        _need(self.expected is None or (isinstance(self.expected, list) and len(self.expected) == rows and all(map(_int_list, self.expected))), "expected must be one list of integers per row")
        _need(self.pinned is None or (isinstance(self.pinned, list) and len(self.pinned) == rows and all(_int_list(r) and all(self.prompt_lengths[k] <= p < self.canvas_length for p in r) for k, r in enumerate(self.pinned))),
              "pinned must be one list of positions per row, each after its prompt and inside the canvas")
        for i, rec in enumerate(self.iterations):
            where = f"iterations[{i}]"
            _need(_int_list(rec.block_range) and len(rec.block_range) == 2, f"{where}.block_range must be [start, end]")
            s, e = rec.block_range
            _need(0 <= s < e <= self.canvas_length, f"{where}.block_range is outside the canvas")
            _need(_is_int(rec.iteration) and _is_int(rec.block) and isinstance(rec.forward, str), f"{where}: iteration and block must be integers, forward a string")
            _need(_is_int(rec.forwards, 0), f"{where}.forwards must be a count of model forwards")
            _need(isinstance(rec.recomputed, list) and all(_int_list(r) and len(r) == 2 for r in rec.recomputed), f"{where}.recomputed must be [a, b] ranges")
            _need(rec.threshold is None or _is_number(rec.threshold), f"{where}.threshold must be a number or null")
            _need(_is_number(rec.seconds) and isinstance(rec.extras, dict), f"{where}: seconds must be a number and extras an object")
            _need(rec.cost is None or _valid_cost(rec.cost), f"{where}.cost must hold {', '.join(COST_PER_RANK)} (one number per rank) and {', '.join(COST_SCALARS)}")
            _need(rec.candidates is None or (isinstance(rec.candidates, list) and len(rec.candidates) == rows), f"{where}.candidates needs one list per row")
            per_row = (rec.committed, rec.forced, rec.top1, rec.confidence)
            _need(all(isinstance(v, list) and len(v) == rows for v in per_row), f"{where}: committed, forced, top1 and confidence need one list per row")
            for row in range(rows):
                _need(_int_list(rec.top1[row]) and len(rec.top1[row]) == e - s, f"{where}.top1[{row}] must be one integer per block position")
                _need(isinstance(rec.confidence[row], list) and len(rec.confidence[row]) == e - s and all(map(_is_number, rec.confidence[row])), f"{where}.confidence[{row}] must be one number per block position")
                _need(rec.candidates is None or _valid_candidates(rec.candidates, row, e - s), f"{where}.candidates[{row}] must be one list of [id, probability] pairs per block position")
                for name, positions in (("committed", rec.committed[row]), ("forced", rec.forced[row])):
                    _need(_int_list(positions) and all(s <= p < e for p in positions), f"{where}.{name}[{row}] must be positions inside the block")
                _need(rec.revisions is None or _valid_revisions(rec.revisions, row, s, e), f"{where}.revisions[{row}] must be revisions ({', '.join(REVISION_FIELDS)}) of positions inside the block")
            _need(rec.revisions is None or len(rec.revisions) == rows, f"{where}.revisions needs one list per row")
            _need(rec.state is None or isinstance(rec.state, dict), f"{where}.state must be an object")
            if before_upgrade:
                continue
            _need(isinstance(rec.active, list) and len(rec.active) == rows and all(isinstance(a, bool) for a in rec.active), f"{where}.active must be one true/false per row")
            _need(_int_list(rec.final_until) and len(rec.final_until) == rows and all(0 <= f <= self.canvas_length for f in rec.final_until), f"{where}.final_until must be one canvas position per row")
            if rec.state is not None:
                step_state(self.kind).check(rec.state, rows, s, e, lambda ok, message: _need(ok, f"{where}.{message}"))
            _need(rec.constraint is None or _valid_constraint(rec.constraint, rows, s, e), f"{where}.constraint must hold {', '.join(CONSTRAINT_PER_POSITION)} (per row null, or one value or null per block position) and dropped (positions inside the block per row)")
        if not before_upgrade:
            _need(isinstance(self.kind, str) and self.kind != "", "kind must name a diffusion kind")
            _need(isinstance(self.capabilities, dict) and all(v is None or isinstance(v, bool) for v in self.capabilities.values()), "capabilities must map names to true, false or null")

    def canvas_at(self, iteration: int) -> list[list[int]]:
        """Canvas per row after record `iteration` (-1: before the first), rebuilt from each
        record's writes in the order `record_writes` gives them."""
        canvas = [list(row) for row in self.initial]
        for rec in self.iterations[: iteration + 1]:
            for row in range(len(canvas)):
                for p, token in record_writes(rec, row, self.kind):
                    canvas[row][p] = token
        return canvas


def record_writes(rec: IterationRecord, row: int, kind: str = MASKED) -> list[tuple[int, int]]:
    """(position, token) that record `rec` of a run of `kind` wrote into row `row`'s canvas, in
    the order they apply, by the kind's rules (engine/step_state.py: masked diffusion's commits,
    then its revisions; each other kind's in its own file)."""
    return step_state(kind).writes(rec, row)


class TraceRecorder:
    """Builds IterationRecords from device tensors; times itself so its cost can be reported.

    With `token_strings`, `trace.tokens` covers every id seen so far: the header's (canvas, stop
    ids, [MASK]) from the start, a record's before the record is returned, the final canvas's at
    the end. The dict is updated in place, so a header copy (`header`) sees the new strings too."""

    def __init__(self, trace: Trace, token_strings: TokenStrings | None = None) -> None:
        self.trace, self.token_strings = trace, token_strings
        self._add_tokens({i for row in trace.initial for i in row} | set(trace.eos_ids) | {trace.mask_id} | {i for row in trace.expected or [] for i in row})

    def _add_tokens(self, ids: set[int]) -> None:
        new = {i for i in ids if str(i) not in self.trace.tokens} if self.token_strings is not None else None
        if new:
            self.trace.tokens.update(self.token_strings(new))

    def header(self) -> Trace:
        """The header alone (no records): what a live view starts from; shares `tokens`."""
        return replace(self.trace, iterations=[])

    def finish(self, final: list[list[int]], stats: dict[str, Any], trace_seconds: float) -> None:
        """The footer; `tokens` ends in id order."""
        self._add_tokens({i for row in final for i in row})
        self.trace.tokens = dict(sorted(self.trace.tokens.items(), key=lambda item: int(item[0])))
        self.trace.final, self.trace.stats, self.trace.trace_seconds = final, stats, trace_seconds

    def append(self, rec: IterationRecord) -> IterationRecord:
        """Add a kind's record (engine/kinds/) to the trace, with the strings of every id it
        names, and return it; the time spent here counts as the trace's."""
        t0 = time.perf_counter()
        self._add_tokens(record_ids(rec, self.trace.kind))
        self.trace.iterations.append(rec)
        self.trace.trace_seconds += time.perf_counter() - t0
        return rec


def record_ids(rec: IterationRecord, kind: str = MASKED) -> set[int]:
    """Every token id a record names (its candidates, revisions and its kind's step state)."""
    ids = {i for row in rec.top1 for i in row} | {pair[0] for row in rec.candidates or [] for pairs in row for pair in pairs}
    ids |= {r[k] for row in rec.revisions or [] for r in row for k in ("old", "new")}
    ids |= step_state(kind).ids(rec.state) if rec.state is not None else set()
    ids |= {i for row in (rec.constraint or {}).get("model_top1") or [] for i in row or [] if i is not None}  # the model's own top-1 the constraint removed
    return ids


def positions(mask: torch.Tensor, offset: int) -> list[list[int]]:
    """Per row, the canvas positions where `mask` `[B, W]` (a block's, starting at `offset`) is set."""
    return [(row.nonzero().flatten() + offset).tolist() for row in mask.cpu()]


def rounded(t: torch.Tensor) -> list:
    """A float tensor (`[B]` or `[B, W]`) as JSON lists, 4 decimals: how a trace keeps numbers."""
    return _four_places(t).tolist()


def candidate_lists(candidates: tuple[torch.Tensor, torch.Tensor], masked: torch.Tensor) -> list[list[list[list[float]]]]:
    ids, probs = candidates[0].cpu().tolist(), _four_places(candidates[1]).tolist()
    return [
        [[[i, p] for i, p in zip(row_ids[w], row_probs[w])] if was_masked else [] for w, was_masked in enumerate(row_masked)]
        for row_ids, row_probs, row_masked in zip(ids, probs, masked.cpu().tolist())
    ]


def _four_places(t: torch.Tensor) -> torch.Tensor:
    """`round(v, 4)` of each value as a float32, in one tensor op rather than one Python call per
    value (a served row's records rounded thousands a step): a float32 times 10**4 is exact in
    float64 (24 + 14 bits), so its half-to-even rounding is the correctly rounded integer n, and
    n / 10**4 the double nearest that decimal, which is what `round` returns."""
    return torch.round(t.detach().float().cpu().double() * 1e4) / 1e4


def _numbers(value: Any, path: str) -> Iterator[tuple[str, int | float]]:
    """Every number inside `value` (objects and lists walked), with its path."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _numbers(item, f"{path}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _numbers(item, f"{path}[{i}]")
    elif _is_number(value):
        yield path, value


def _check_config(config: dict[str, Any], canvas: int) -> None:
    """The recorded config as a run could have held it (the app fills its boxes from it, a replay
    reads it): every number finite and at most MAX_CONFIG_NUMBER in size, each declared setting at
    least its declared least (engine/config.py `_setting`), the generation inside the canvas; the
    first that is not is named."""
    for path, value in _numbers(config, "config"):
        _need(math.isfinite(value) and abs(value) <= MAX_CONFIG_NUMBER, f"{path[:120]} must be a finite number of at most 2**53 in size, got {str(value)[:40]}")
    for f in dataclasses.fields(GenerationConfig):
        value, least = config.get(f.name), f.metadata.get("least")
        _need(least is None or not _is_number(value) or value >= least, f"config.{f.name} must be at least {least}, got {value}")
    gen_length = config.get("gen_length")
    _need(gen_length is None or (_is_int(gen_length, 1) and gen_length <= canvas), f"config.gen_length must be an integer from 1 to canvas_length ({canvas}), got {str(gen_length)[:40]}")


def _need(ok: bool, message: str) -> None:
    if not ok:
        raise EngineError(f"trace: {message}")


def _is_int(value: Any, minimum: int | None = None) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and (minimum is None or value >= minimum)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _int_list(value: Any) -> bool:
    return isinstance(value, list) and all(_is_int(v) for v in value)


def _valid_constraint(constraint: Any, rows: int, s: int, e: int) -> bool:
    if not isinstance(constraint, dict) or set(constraint) != {*CONSTRAINT_PER_POSITION, "dropped"}:
        return False
    kinds = {"allowed": lambda v: _is_int(v, 0), "removed": _is_number, "model_top1": _is_int, "model_probability": _is_number, "top1_removed": lambda v: isinstance(v, bool)}
    for name, ok in kinds.items():
        lists = constraint[name]
        if not isinstance(lists, list) or len(lists) != rows:
            return False
        if not all(row is None or (isinstance(row, list) and len(row) == e - s and all(v is None or ok(v) for v in row)) for row in lists):
            return False
    dropped = constraint["dropped"]
    return isinstance(dropped, list) and len(dropped) == rows and all(_int_list(row) and all(s <= p < e for p in row) for row in dropped)


def _valid_revisions(revisions: list, row: int, s: int, e: int) -> bool:
    entries = revisions[row]
    return isinstance(entries, list) and all(
        isinstance(r, dict) and set(r) == set(REVISION_FIELDS) and all(_is_int(r[k]) for k in ("position", "old", "new"))
        and s <= r["position"] < e and r["kind"] in (EDIT, REMASK) and isinstance(r["rule"], str) and _is_number(r["score"]) and _is_number(r["bound"])
        for r in entries
    )


def _valid_cost(cost: Any) -> bool:
    if not isinstance(cost, dict) or set(cost) != set(COST_PER_RANK) | set(COST_SCALARS):
        return False
    lists = [cost[k] for k in COST_PER_RANK]
    if not all(isinstance(v, list) and v and len(v) == len(lists[0]) and all(map(_is_number, v)) for v in lists):
        return False
    kinds = {"number": _is_number, "count": lambda v: _is_int(v, 0), "bool": lambda v: isinstance(v, bool)}
    return all(kinds[kind](cost[k]) for k, kind in COST_SCALARS.items())


def _valid_candidates(candidates: list, row: int, width: int) -> bool:
    lists = candidates[row]
    return isinstance(lists, list) and len(lists) == width and all(
        isinstance(pairs, list) and all(isinstance(pair, list) and len(pair) == 2 and _is_int(pair[0]) and _is_number(pair[1]) for pair in pairs)
        for pairs in lists
    )


def jsonable(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        if value.is_floating_point():
            return _four_places(value).tolist() if value.dim() == 2 else value.tolist()
        return value.tolist()
    return value
