"""The tuner's space offers only what the engine runs (docs/tuning.md §2, issue #58 item 3): every
config its define-by-run tree can suggest, walked branch by branch, passes the checks a request
gets (`fit_request`) and builds its decoder, on every embedded model family and kind; the rules
between two settings (WINO's cache modes, the uniform sampler's temperatures) narrow the later one."""

from __future__ import annotations

from typing import Any, Iterator

import pytest

from engine import GenerationConfig
from engine.errors import EngineError
from engine.generation import check_settings, fit_request
from engine.kinds.base import KINDS, ModelTraits, run_kind
from engine.models import model_skeleton
from engine.registry import decoder_class
from engine.tuning.space import SearchSpace, build_space

PROMPT = [[5, 6, 7]]


class Walk:
    """A trial that takes the choices `path` names (past its end, each first one), recording how
    many each choice had; a number is its least or its greatest, alternating (from the greatest
    when `high_first`), so two walks give every number both ends and each pair of numbers both
    mixed corners (where two ordered options meet: the greater at its least after the lesser at
    its greatest)."""

    def __init__(self, path: tuple[int, ...], high_first: bool) -> None:
        self.path, self.taken, self.widths, self.high = path, [], [], high_first

    def suggest_categorical(self, name: str, choices: list[Any]) -> Any:
        index = self.path[len(self.taken)] if len(self.taken) < len(self.path) else 0
        self.taken.append(index)
        self.widths.append(len(choices))
        return choices[index]

    def _number(self, low: float, high: float) -> float:
        self.high = not self.high
        return low if self.high else high

    def suggest_int(self, name: str, low: int, high: int, log: bool = False) -> int:
        return int(self._number(low, high))

    def suggest_float(self, name: str, low: float, high: float, log: bool = False) -> float:
        return self._number(low, high)


def every_suggestion(space: SearchSpace, high_first: bool) -> Iterator[GenerationConfig]:
    """Each leaf of the space's tree of choices (depth first), once."""
    paths: list[tuple[int, ...]] = [()]
    while paths:
        path = paths.pop()
        walk = Walk(path, high_first)
        yield space.suggest(walk)
        for depth in range(len(path), len(walk.widths)):
            paths += [(*walk.taken[:depth], other) for other in range(1, walk.widths[depth])]


def refused(config: GenerationConfig, model: Any) -> str | None:
    try:
        check_settings(config, model)
    except EngineError as exc:
        return str(exc)
    return None


# one model of each family the assets hold (tiny-llada-edit, tiny-llada-infill and tiny-llada-td are tiny-llada's)
@pytest.mark.parametrize("model, added", [
    ("tiny-llada", {}),
    ("tiny-llada2", {"align_blocks": ""}),  # a switch its attention refuses off: offered on only
    ("tiny-gemma", {}),
])
def test_every_config_the_space_can_suggest_is_one_the_engine_runs(model, added):
    skeleton = model_skeleton(model)
    traits = ModelTraits.of(skeleton)
    space = build_space(skeleton, fix={"gen_length": "4"}, space=added)  # block lengths 1, 2, 4
    kinds, decoders, count = set(), set(), 0
    for high_first in (False, True):
        for config in every_suggestion(space, high_first):
            fitted = fit_request(skeleton, PROMPT, config)  # every check a request gets before any forward
            decoder_class(fitted.decoder)(fitted, skeleton.mask_token_id)  # and the decoder's own, as its run starts
            kinds.add(run_kind(fitted, traits).name)
            decoders.add(fitted.decoder)
            count += 1
    runnable = {k for k in KINDS if KINDS[k].refuses(traits) is None}
    assert kinds == runnable and count >= 2
    # every decoder the model runs is offered; what it refuses is not
    offered = {d for d in space.dimensions if d.name == "decoder"}
    for dim in offered:
        assert decoders == {d for d in dim.choices if any(refused(GenerationConfig(kind=k, decoder=d, gen_length=4, block_length=4), traits) is None for k in runnable)}


def test_a_rule_between_two_settings_narrows_the_later_one_and_the_checks_refuse_it():
    llada, llada2, gemma = (ModelTraits.of(model_skeleton(m)) for m in ("tiny-llada", "tiny-llada2", "tiny-gemma"))
    # the rules the space keeps to are the engine's: each refused as it stands (the test can fail)
    assert "cache 'vicinity' is not supported" in refused(GenerationConfig(decoder="wino", cache="vicinity"), llada)
    assert "does not support the LLaDA2MoeModelLM family" in refused(GenerationConfig(decoder="wino"), llada2)
    assert "needs t_min < t_max" in refused(GenerationConfig(decoder="uniform", decoder_options={"t_min": 0.9, "t_max": 0.5}), gemma)
    space = build_space(model_skeleton("tiny-llada"), fix={"gen_length": "8", "kind": "masked"})
    caches = {c.cache for c in every_suggestion(space, False) if c.decoder == "wino"}
    assert caches == {"none"}  # WINO is offered, with the one cache mode it runs with, and no cache choice asked
    assert not any(c.decoder == "wino" for c in every_suggestion(build_space(model_skeleton("tiny-llada2"), fix={"gen_length": "8"}), False))
    temperatures = [(c.decoder_options["t_min"], c.decoder_options["t_max"]) for high in (False, True) for c in every_suggestion(build_space(model_skeleton("tiny-gemma")), high)]
    assert temperatures and all(low < high for low, high in temperatures)
    assert any(low > 1 for low, _ in temperatures)  # the lesser at its greatest, the greater still above it
