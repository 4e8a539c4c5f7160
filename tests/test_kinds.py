"""The kind seam: every model runs its own kind with the default settings, a setting its kind does
not read is refused in one line wherever a request comes from, the trace names its kind, and the
per-row state the loop records (`active`, `final_until`) is what older traces are upgraded to."""

from __future__ import annotations

import dataclasses
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

from engine import Engine, EngineError, GenerationConfig, RunHooks, Trace, fit, run_diffusion
import engine.kinds
from engine.kinds import KINDS, ModelTraits, kind_decoders
from engine.kinds.uniform import UniformSampler
from engine.trace import MASKED, TRACE_VERSION, UNIFORM

from .conftest import tiny_llada

ROOT = Path(__file__).resolve().parent.parent
GEMMA, LLADA = ROOT / "assets" / "tiny-gemma", ROOT / "assets" / "tiny-llada"


@pytest.fixture(scope="module")
def gemma() -> Engine:
    return Engine(GEMMA)


def test_each_kind_file_registers_its_kind_and_declares_its_settings_and_decoders():
    files = {m.name for m in pkgutil.iter_modules(engine.kinds.__path__)} - {"base"}
    assert {cls.__module__.rsplit(".", 1)[-1] for cls in KINDS.values()} == files and {MASKED, UNIFORM} <= set(KINDS)
    assert kind_decoders(UNIFORM) == [UniformSampler.name]
    assert "threshold" in kind_decoders(MASKED) and UniformSampler.name not in kind_decoders(MASKED)
    assert KINDS[UNIFORM].settings.reads == frozenset() and "cache" in KINDS[MASKED].settings.reads


def test_the_default_settings_run_a_uniform_model_on_its_canvas(gemma):
    result = gemma.generate("Q: 7+58=? A:", GenerationConfig(), RunHooks(trace=True))
    trace = result.output.trace
    assert result.texts[0].strip() and trace.kind == UNIFORM and trace.version == TRACE_VERSION
    assert trace.config["decoder"] == UniformSampler.name and trace.block_length == gemma.model.canvas_length
    assert trace.capabilities == {"revises": False, "shadow_block": False}
    # its options without naming its decoder: the kind's own decoder takes them
    bound = gemma.generate("Q: 7+58=? A:", GenerationConfig(decoder_options={"entropy_bound": 0.5}), RunHooks(trace=True))
    assert bound.output.trace.config["decoder_options"] == {"entropy_bound": 0.5}


@pytest.mark.parametrize(
    "changes, named",
    [
        (dict(cache="dual"), "cache"),
        (dict(smoothing=True, unroll=True), "smoothing"),
        (dict(temperature=0.7), "temperature"),
        (dict(threshold=0.5), "threshold"),
        (dict(decoder="fixed"), "decoder 'fixed' runs masked diffusion"),
        (dict(block_length=8, gen_length=64), "block_length 8"),
    ],
)
def test_a_uniform_run_refuses_what_its_kind_does_not_read(gemma, changes, named):
    with pytest.raises(EngineError, match=named) as err:
        gemma.generate("Q: 7+58=? A:", GenerationConfig(**changes))
    assert "\n" not in str(err.value)


def test_a_masked_model_refuses_the_uniform_sampler_and_its_options():
    with pytest.raises(EngineError, match="decoder 'uniform' runs uniform diffusion and this model is masked diffusion"):
        run_diffusion(tiny_llada(), [[1, 2]], GenerationConfig(decoder=UniformSampler.name, gen_length=32))
    with pytest.raises(EngineError, match="decoder 'threshold' has no setting 't_min'"):
        run_diffusion(tiny_llada(), [[1, 2]], GenerationConfig(gen_length=32, decoder_options={"t_min": 0.1}))


def test_carry_over_fits_a_page_chosen_for_another_model():
    """The app's Compare and lessons: settings chosen for a masked model go to their defaults on a
    uniform one (and a uniform page's decoder becomes the masked default), instead of refusing."""
    page = GenerationConfig(cache="dual", threshold=0.5, block_length=8, gen_length=32, decoder_options={})
    fitted = fit(page, ModelTraits(UNIFORM, canvas_length=16), carry_over=True)
    assert (fitted.decoder, fitted.cache, fitted.threshold, fitted.block_length, fitted.gen_length) == ("uniform", "none", 0.9, 16, 32)
    back = fit(fitted, ModelTraits(MASKED), carry_over=True)
    assert back.decoder == GenerationConfig.decoder and back.decoder_options == {}
    assert fit(GenerationConfig(), ModelTraits(MASKED)) == GenerationConfig()


def test_the_cli_refuses_in_one_line_with_exit_2():
    done = subprocess.run(
        [sys.executable, "-m", "engine", "generate", "--model", str(GEMMA), "--cache", "dual", "--prompt", "Q: 7+58=? A:"],
        capture_output=True, text=True, cwd=ROOT, timeout=600,
    )
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "uniform diffusion does not read cache" in lines[0]


def test_system_options_the_kind_does_not_support_are_refused_before_loading():
    with pytest.raises(EngineError, match="uniform diffusion does not run with tp_size"):
        Engine(GEMMA, tp_size=2)


def _as_version_2(trace: Trace) -> dict:
    """A current trace written the way version 2 wrote it (no kind, capabilities, active or
    final_until; a uniform record's proposal in top1/confidence, `active` inside `uniform`)."""
    data = trace.to_dict()
    data["version"] = 2
    for key in ("kind", "capabilities"):
        del data[key]
    for rec in data["iterations"]:
        active = rec.pop("active")
        del rec["final_until"]
        u = rec["uniform"] = rec.pop("state")
        if u is not None:
            rec["top1"], rec["confidence"] = u.pop("proposal"), u.pop("proposal_probability")
            u["active"] = active
    return data


@pytest.mark.parametrize(
    "config",
    [
        GenerationConfig(gen_length=24, block_length=8, threshold=0.6, cache="dual"),  # refreshes: the forward after one
        GenerationConfig(gen_length=24, block_length=8, decoder="edit", threshold=0.5, decoder_options={"edit_threshold": 0.3, "max_post_edit_steps": 3}),
        GenerationConfig(gen_length=24, block_length=8, decoder="wino", threshold=0.3),
    ],
    ids=["threshold-dual", "edit", "wino"],
)
def test_an_older_trace_is_upgraded_to_what_the_loop_records(config):
    """The upgrade replays the rules of the loop that wrote version 2; the loop records them
    itself now and both give the same `active` and `final_until`: on two rows of unequal progress
    for a decoder that never revises, on one row (what the app and the server's per-row traces
    hold) for a revising one, whose multi-row rule version 2 only approximated."""
    prompts = [[3, 4, 5, 6]] if config.decoder in ("edit", "wino") else [[3, 4, 5, 6], [7, 8, 9, 10]]
    out = run_diffusion(tiny_llada(), prompts, config, hooks=RunHooks(trace=True))
    upgraded = Trace.from_dict(_as_version_2(out.trace))
    assert upgraded.kind == MASKED and upgraded.version == TRACE_VERSION
    assert [r.active for r in upgraded.iterations] == [r.active for r in out.trace.iterations]
    assert [r.final_until for r in upgraded.iterations] == [r.final_until for r in out.trace.iterations]
    assert len(prompts) == 1 or not all(all(r.active) for r in out.trace.iterations)  # a row sat some records out


def test_an_older_uniform_trace_is_upgraded(gemma):
    out = gemma.generate_ids([gemma.encode("Q: 7+58=? A:", False)] * 2, GenerationConfig(seed=3), RunHooks(trace=True))
    upgraded = Trace.from_dict(_as_version_2(out.trace))
    assert upgraded.kind == UNIFORM
    for ours, theirs in zip(out.trace.iterations, upgraded.iterations):
        assert (theirs.active, theirs.final_until, theirs.top1, theirs.state["proposal"]) == (ours.active, ours.final_until, ours.top1, ours.state["proposal"])
    assert upgraded.canvas_at(len(upgraded.iterations) - 1) == out.trace.final


def test_every_shipped_sample_trace_loads_as_version_3():
    files = sorted((ROOT / "assets" / "traces").glob("*-*.json"))
    assert files
    for path in files:
        trace = Trace.from_json(path.read_text())
        assert trace.version == TRACE_VERSION and trace.kind == MASKED, path.name
        assert all(r.active is not None and r.final_until is not None for r in trace.iterations), path.name
        assert trace.canvas_at(len(trace.iterations) - 1)[0][: trace.prompt_lengths[0]] == trace.initial[0][: trace.prompt_lengths[0]]


def test_a_trace_naming_an_unknown_field_or_a_bad_active_is_one_line():
    out = run_diffusion(tiny_llada(), [[3, 4, 5]], GenerationConfig(gen_length=8, block_length=8), hooks=RunHooks(trace=True))
    data = out.trace.to_dict()
    data["iterations"][0]["active"] = ["yes"]
    with pytest.raises(EngineError, match=r"iterations\[0\].active must be one true/false per row"):
        Trace.from_dict(json.loads(json.dumps(data)))
    assert dataclasses.replace(out.trace).kind == MASKED


@pytest.mark.parametrize(
    "config",
    [
        GenerationConfig(gen_length=24, block_length=8, decoder="edit", threshold=0.5, decoder_options={"edit_threshold": 0.3, "max_post_edit_steps": 3}),
        GenerationConfig(gen_length=24, block_length=8, decoder="wino", threshold=0.3),
        GenerationConfig(gen_length=24, block_length=8, threshold=0.6, cache="dual"),
    ],
    ids=["edit", "wino", "threshold-dual"],
)
def test_a_batched_row_sees_its_solo_run_by_the_loops_active_flags(config):
    """The batcher keeps a row's records where the loop marks it active: each row's kept records
    are its solo run's, one for one (the edit decoder's post-edit limit and WINO's mask-free rows
    included, which version 2's re-derived rule counted wrong)."""
    from engine.serving.batcher import RowView

    model, prompts = tiny_llada(), [[3, 4, 5, 6], [7, 8, 9, 10]]
    views: list[RowView] = []
    hooks = RunHooks(trace=True, on_start=lambda h: views.extend(RowView(h, r) for r in range(2)), on_iteration=lambda rec: [v.record(rec) for v in views])
    batched = run_diffusion(model, prompts, config, hooks=hooks)
    for row, prompt in enumerate(prompts):
        solo = run_diffusion(model, [prompt], config, hooks=RunHooks(trace=True))
        assert batched.token_ids[row] == solo.token_ids[0]
        mine = views[row].trace.iterations
        assert len(mine) == solo.stats.nfe == len(solo.trace.iterations)
        assert [(r.committed, r.revisions, r.final_until) for r in mine] == [(r.committed, r.revisions, r.final_until) for r in solo.trace.iterations]


def test_an_engine_runs_its_models_own_kind_with_no_config(gemma):
    """`Engine(name).generate(prompt)`: the engine's defaults, fitted to the model's own kind (a
    uniform-state model: its sampler on its canvas), as the CLI runs them with no flags."""
    res = gemma.generate("Q: 7+58=? A:")
    assert res.output.trace is None and res.texts[0].strip()
    assert res.texts == gemma.generate("Q: 7+58=? A:", GenerationConfig()).texts


def test_the_cli_takes_a_setting_the_models_own_kind_reads_without_naming_its_decoder(capsys):
    """#44 item 3: `--entropy-bound` on tiny-gemma was refused ("decoder 'threshold' has no setting
    'entropy_bound'"): the CLI's default decoder is now the model's own kind's, which reads it."""
    from engine.__main__ import main

    assert main(["generate", "--model", "tiny-gemma", "--entropy-bound", "0.1", "--prompt", "Q: 7+58=? A:", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["text"].strip() and out["nfe"] >= 1
