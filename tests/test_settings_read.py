"""Who reads which setting (engine/settings_read.py), and a request's config validated once."""

from __future__ import annotations

import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import pytest

from engine import Engine, EngineError, GenerationConfig, pipeline
from engine.__main__ import main
from engine.kinds import ModelTraits, fit, ignored_settings, kind_reads
from engine.registry import KIND_OPTION_PREFIX as KOPT
from engine.registry import OPTION_SETTING_PREFIX as OPT
from engine.settings_read import readers_note, settings_read, switch_settings

from .app_support import EMBEDDED_MODEL

MASKED = ModelTraits("masked")


def test_a_run_reads_its_kinds_settings_its_decoders_its_cache_modes_and_the_switched_on_features():
    read = settings_read(GenerationConfig())
    assert {"gen_length", "threshold", "temperature", "smoothing", "unroll", "cache"} <= read
    assert not read & {"steps", "prefix_look", "refresh_every", "cont_weight", "max_unroll", KOPT + "verify", OPT + "remasking"}
    read = settings_read(GenerationConfig(decoder="fixed", cache="vicinity", smoothing=True, unroll=True))
    assert {"steps", OPT + "remasking", "prefix_look", "warmup", "cont_weight", "threshold_decay", "expected_tpf", "max_unroll"} <= read
    assert "threshold" not in read and OPT + "factor" not in read
    # the kind: the request's, else its decoder's
    spec = {KOPT + "verify", KOPT + "verify_threshold", "threshold"}
    assert settings_read(GenerationConfig(kind="speculative")) & spec == spec
    assert not settings_read(GenerationConfig(kind="speculative", cache="vicinity")) & {"prefix_look", "temperature", "smoothing"}
    uniform = settings_read(GenerationConfig(decoder="uniform"))
    assert OPT + "t_min" in uniform and not uniform & {"threshold", "temperature", KOPT + "verify"}
    # a decoder the registry does not know: every decoder's settings
    assert {"threshold", "steps", OPT + "credit_alpha", OPT + "remasking"} <= settings_read(GenerationConfig(decoder="no_such_decoder"))
    assert {"kind", "decoder", "cache", "smoothing", "unroll"} == set(switch_settings())


def test_fit_refuses_at_the_kind_level_only():
    """A setting the chosen decoder does not read is accepted, as before; one the kind does not read is not."""
    assert fit(GenerationConfig(decoder="fixed", threshold=0.5), MASKED).threshold == 0.5
    assert ignored_settings(GenerationConfig(temperature=0.5), "speculative") == ["temperature"] and "temperature" not in kind_reads("speculative")
    with pytest.raises(EngineError, match="speculative diffusion does not read temperature"):
        fit(GenerationConfig(kind="speculative", temperature=0.5), ModelTraits("masked", block_causal=True))


def test_the_cli_help_says_who_reads_each_setting():
    assert readers_note(KOPT + "verify") == "[speculative kind]"
    assert readers_note("cont_weight") == "[masked kind] [with smoothing on]"
    assert readers_note("prefix_look") == "[masked kind] [read by: cache vicinity]"
    assert "fixed" in readers_note("steps") and readers_note("gen_length") == ""
    assert readers_note(OPT + "remasking").startswith("[read by: fixed")  # and any plug-in that inherits it


@pytest.fixture
def validations(monkeypatch) -> list[GenerationConfig]:
    """Every GenerationConfig.validate call of the test, in order."""
    calls: list[GenerationConfig] = []
    real = GenerationConfig.validate

    def counted(self: GenerationConfig) -> GenerationConfig:
        calls.append(self)
        return real(self)

    monkeypatch.setattr(GenerationConfig, "validate", counted)
    return calls


def test_a_cli_generate_validates_its_config_once(validations, capsys):
    assert main(["generate", "--model", str(EMBEDDED_MODEL), "--prompt", "Q: 1+2=? A:", "--gen-length", "8", "--block-length", "8"]) == 0
    assert len(validations) == 1
    assert main(["generate", "--model", str(EMBEDDED_MODEL), "--prompt", "Q: 1+2=? A:", "--threshold", "1.5"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == "error: threshold must be in (0, 1], got 1.5"


def test_an_engine_generate_validates_once_and_a_fitted_config_runs_as_given(validations):
    engine = Engine(str(EMBEDDED_MODEL))
    engine.generate("Q: 1+2=? A:", GenerationConfig(gen_length=8, block_length=8))
    assert len(validations) == 1
    fitted = fit(GenerationConfig(gen_length=8, block_length=8), engine.model)
    engine.generate("Q: 1+2=? A:", fitted, fitted=True)  # the CLI's and the app's path: fitted before
    assert len(validations) == 2


def test_a_parallel_engines_workers_run_the_parents_fitted_config(monkeypatch, validations):
    """The generate a worker builds (pipeline._load_shard) is the engine's fitted entry, which
    fits and validates nothing: the parent's generate_ids fitted the config, once."""
    made = []
    monkeypatch.setattr(pipeline, "Engine", lambda *a, **kw: made.append(kw) or Engine(str(EMBEDDED_MODEL)))
    generate = pipeline._load_shard(str(EMBEDDED_MODEL), None, None, 2, 1, False, "cpu")
    assert generate.__func__ is Engine._run_fitted_here and made[0]["tp_size"] == 2
    fitted = fit(GenerationConfig(gen_length=8, block_length=8), generate.__self__.model)
    validations.clear()
    generate([generate.__self__.encode("Q: 1+2=? A:", False)], fitted, pipeline.NO_HOOKS)
    assert validations == []


def test_an_app_run_validates_its_config_once(validations, tmp_path):
    from dinfer_viz.live.host import EngineHost, ModelSpec
    from dinfer_viz.ui import Handlers

    handlers = Handlers(EngineHost(ModelSpec(str(EMBEDDED_MODEL))))
    frames = list(handlers.run("Q: 1+2=? A:", {"config": {"gen_length": 8, "block_length": 8}}))
    assert frames and len(validations) == 1
    validations.clear()
    frames = list(handlers.run("Q: 1+2=? A:", {"config": {"gen_length": 8, "block_length": 3}}))
    assert len(validations) == 1 and len(frames) == 1  # refused in one line, before any run
