"""The example kind kept outside the engine (examples/margin_kind.py: any-order decoding by a margin
rule, no decoder, one option of its own) loaded by path, through the paths a kind runs on: the
Python API with a constraint and early stop, the CLI (a real process with $DINFER_VIZ_KINDS), the
trace and its replay in the app's view, the app's batcher and Run tab readouts, the server, the
sweep's configs and the tuner's space. Everything but its rule is the skeleton's (docs/algorithms.md
§10.2), so these pass with no line for them in the kind's file."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dinfer_viz.studies.sweep_study import sweep_configs
from dinfer_viz.reading.timeline import Timeline
from dinfer_viz.views import view_for
from dinfer_viz.views.masked import MaskedView
from engine import EngineError, GenerationConfig, RunHooks, Trace
from engine.kinds import ModelTraits, fit
from engine.tuning.space import build_space

from .test_forward_count import check_every_path, check_server_usage, engine_of

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "margin_kind.py"
PROMPT = "Q: ?+?=38 A:"
_MODULE: list = []


def load_example() -> type:
    """The example's kind class (its module imported once per process, by path, as $DINFER_VIZ_KINDS
    loads it; its `@register_kind` lands in whatever registry the caller restores after)."""
    if not _MODULE:
        spec = importlib.util.spec_from_file_location("example_margin_kind", EXAMPLE)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        _MODULE.append(module)
    return _MODULE[0].MarginKind


@pytest.fixture
def margin(own_kinds) -> type:
    """The example's kind in the test's own registry."""
    kind = load_example()
    own_kinds[kind.name] = kind
    return kind


def run(config: GenerationConfig):
    return engine_of("tiny-llada").generate(PROMPT, config, RunHooks(trace=True))


def test_it_fills_by_its_rule_in_any_order_with_its_own_option(margin):
    sure = run(GenerationConfig(kind="margin", kind_options={"margin": 0.9}, gen_length=16, block_length=16, use_chat_template=False))
    bold = run(GenerationConfig(kind="margin", kind_options={"margin": 0.1}, gen_length=16, block_length=16, use_chat_template=False))
    assert sure.texts[0] and bold.output.stats.nfe < sure.output.stats.nfe  # a lower margin fills more per forward
    for result, bound in ((sure, 0.9), (bold, 0.1)):
        trace = result.output.trace
        assert trace.kind == "margin" and trace.config["kind_options"] == {"margin": bound}
        assert trace.canvas_at(len(trace.iterations) - 1) == trace.final  # every write is in a record
        for rec in trace.iterations:
            assert rec.committed[0] and rec.forwards == 1
    # not left to right: some step fills a position right of one it leaves masked
    orders = [p for rec in bold.output.trace.iterations for p in rec.committed[0]]
    assert orders != sorted(orders)


def test_the_skeleton_gives_it_constraints_and_early_stop(margin):
    constrained = run(GenerationConfig(kind="margin", regex="[a-z]+", gen_length=16, block_length=8, use_chat_template=False))
    assert re.fullmatch("[a-z]+", constrained.texts[0]), constrained.texts[0]
    assert all(rec.constraint is not None for rec in constrained.output.trace.iterations)
    stopped = run(GenerationConfig(kind="margin", gen_length=32, block_length=8, use_chat_template=False))
    full = run(GenerationConfig(kind="margin", gen_length=32, block_length=8, early_stop=False, use_chat_template=False))
    assert stopped.texts == full.texts and stopped.output.stats.nfe < full.output.stats.nfe  # the answer ends in the first block


def test_what_it_does_not_take_is_refused_in_one_line(margin):
    refusals = {
        "margin diffusion takes no decoder": GenerationConfig(kind="margin", decoder="wino"),
        "margin kind setting margin must be in": GenerationConfig(kind="margin", kind_options={"margin": 2.0}),
        "masked diffusion does not read margin": GenerationConfig(kind_options={"margin": 0.3}),
    }
    for message, config in refusals.items():
        with pytest.raises(EngineError, match=message) as caught:
            fit(config, ModelTraits("masked"))
        assert "\n" not in str(caught.value)
    with pytest.raises(EngineError, match="kind 'margin' cannot run on this model: it needs a full-attention"):
        fit(GenerationConfig(kind="margin"), ModelTraits("masked", block_causal=True))


def test_every_path_counts_its_forwards_and_the_app_draws_it_with_the_masked_view(margin):
    config = GenerationConfig(kind="margin", kind_options={"margin": 0.3}, gen_length=16, block_length=8, use_chat_template=False)
    check_every_path("margin", config)  # API, trace, lockstep batcher, the app's batcher and Run tab readouts
    answer = check_server_usage("margin", "continuous", kind_options={"margin": 0.3})
    assert answer["choices"][0]["text"] == run(config).texts[0]
    timeline = Timeline(Trace.from_json(run(config).output.trace.to_json()))
    assert isinstance(view_for(timeline), MaskedView)
    cells = view_for(timeline).grid_value(timeline, timeline.iterations - 1, None)["cells"]
    assert [c["t"] for c in cells if c["k"] != "prompt"] and all(c["k"] != "masked" for c in cells)


def test_the_sweep_and_the_tuner_read_its_declaration(margin):
    configs = sweep_configs(GenerationConfig(kind="margin"), "kind_options.margin", [0.2, 0.6])
    assert [c.kind_options["margin"] for c in configs] == [0.2, 0.6]
    space = build_space(ModelTraits("masked"))  # the margin kind is among the kinds a dense model runs
    assert "margin" in next(d for d in space.dimensions if d.name == "kind").choices
    import optuna

    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    suggested = 0
    for _ in range(40):
        trial = study.ask()
        config = fit(space.suggest(trial), ModelTraits("masked"))
        if config.kind == "margin":  # its option searched, no decoder
            suggested += 1
            assert "margin" in trial.params and "decoder" not in trial.params and not any(p.startswith("decoder_options") for p in trial.params)
        study.tell(trial, 0.0)
    assert suggested


def test_the_cli_loads_it_by_path_and_runs_it():
    """A real process, as a user runs it (processes lane): $DINFER_VIZ_KINDS names the file."""
    env = {**__import__("os").environ, "DINFER_VIZ_KINDS": str(EXAMPLE)}
    done = subprocess.run(
        [sys.executable, "-m", "engine", "generate", "--model", "tiny-llada", "--kind", "margin", "--margin", "0.3", "--gen-length", "16",
         "--block-length", "8", "--prompt", PROMPT, "--json"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    assert out["token_ids"] and out["tpf"] == pytest.approx(out["tokens"] / out["nfe"])
    refused = subprocess.run([sys.executable, "-m", "engine", "generate", "--model", "tiny-llada", "--kind", "margin", "--decoder", "wino", "--prompt", PROMPT],
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert refused.returncode != 0 and len(refused.stderr.strip().splitlines()) == 1 and "takes no decoder" in refused.stderr


def test_compare_runs_it_beside_the_masked_kind_and_reads_each_sides_forwards(margin):
    """Compare (its handlers, as the page calls them): A the example kind, B the threshold decoder,
    on one model; each side's readout shows its own engine NFE and TPF."""
    from dinfer_viz.live.host import EngineHost, ModelSpec
    from dinfer_viz.tabs.compare import COMPARE_VIEW
    from dinfer_viz.ui import Handlers

    handlers = Handlers(EngineHost(ModelSpec("tiny-llada")))
    small = {"gen_length": 16, "block_length": 8, "use_chat_template": False}
    frames = [dict(zip(COMPARE_VIEW, out)) for out in handlers.compare(PROMPT, {"config": {**small, "kind": "margin", "kind_options": {"margin": 0.3}}}, {"config": small}, "", 1)]
    done = frames[-1]
    state = done["state"]
    assert state.a.trace.kind == "margin" and state.b.trace.kind == "masked", done["message"]
    for side, timeline in (("a", state.a), ("b", state.b)):
        nfe, tokens = timeline.trace.stats["nfe"], timeline.trace.stats["tokens"]
        assert nfe == timeline.forwards(timeline.iterations)
        assert f"| {tokens / nfe:.2f} | {nfe} |" in done[f"readout_{side}"]


def test_a_sweep_over_its_option_and_a_tuning_study_of_it_run(margin, tmp_path):
    """The Threshold sweep's engine loop over `kind_options.margin` on two pair-sum prompts, and a
    two-trial study with the kind fixed: each point and trial ran the example kind, counted its
    forwards, and searched its option, never a decoder."""
    from optuna.trial import TrialState

    from dinfer_viz.live.host import EngineHost, ModelSpec
    from dinfer_viz.studies.sweep_study import run_sweep
    from engine.models import model_skeleton
    from engine.tuning.study import HELD_OUT_SPLIT, TUNING_SPLIT, open_study, run_trials, trial_config
    from tinymodel.tasks import split_examples
    from tinymodel.tune_prompts import evaluator, tune_examples

    host, spec = EngineHost(ModelSpec("tiny-llada")), ModelSpec("tiny-llada")
    examples = split_examples(["pairsum"], "held_out", 2)
    base = GenerationConfig(kind="margin", gen_length=16, block_length=8)
    last = list(run_sweep(host, spec, base, "kind_options.margin", [0.2, 0.8], examples, interval=0.0))[-1]
    points = last.points()
    assert [p["value"] for p in points] == [0.2, 0.8] and all(p["nfe"] >= 1 and p["examples"] == 2 for p in points)
    assert points[0]["nfe"] <= points[1]["nfe"]  # a lower margin fills at least as much per forward

    skeleton = model_skeleton("tiny-llada")
    space = build_space(skeleton, fix={"kind": "margin", "gen_length": "16"})
    assert "kind_options.margin" in {d.name for d in space.dimensions} and "decoder" not in {d.name for d in space.dimensions}
    evaluate = evaluator(engine_of("tiny-llada"), {s: tune_examples(["pairsum"], s, 2) for s in (TUNING_SPLIT, HELD_OUT_SPLIT)})
    study = open_study(f"sqlite:///{tmp_path}/margin.db", "margin", space, ("accuracy", "tpf"))
    run_trials(study, space, skeleton, evaluate, 2)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE, TrialState.COMPLETE]
    for trial in study.trials:
        assert trial_config(trial).kind == "margin" and "margin" in trial.params and "decoder" not in trial.params
