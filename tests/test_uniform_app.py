"""The app with a uniform-state model: its kind read without loading, a masked decoder choice
fitted to it by the engine's own function (engine.kinds.fit, carrying over the page's settings:
the canvas it was trained with, what the kind does not read back at its defaults), and a run
through the Run tab's handler whose trace is the uniform sampler's."""

from __future__ import annotations

import dataclasses

from engine import GenerationConfig
from dinfer_viz.live.host import EngineHost, ModelSpec
from engine.kinds import ModelTraits, fit


def fit_to_model(config, kind, canvas_length):
    """What the page calls (TabHandlers.fit_to): the engine's fit, carrying over."""
    return fit(config, ModelTraits(kind, canvas_length=canvas_length), carry_over=True)

from .app_support import app_model
from .gemma_models import CANVAS
from .test_app_teaching import final


def test_model_kind_is_read_from_the_folder_then_from_the_engine(tmp_path_factory, tiny_gemma_folder):
    host = EngineHost(ModelSpec(app_model(tmp_path_factory)))
    gemma = ModelSpec(str(tiny_gemma_folder))
    assert host.model_kind(gemma) == ModelTraits("uniform", canvas_length=CANVAS)  # config.json only: nothing loaded
    assert not host.is_loaded(gemma)
    assert host.model_kind(host.default) == ModelTraits("masked", takes_shadow_block=True)  # LLaDA: WINO runs on it
    assert host.model_kind(ModelSpec("some/hub-id")) == ModelTraits("masked")  # unknown until loaded
    with host.lock:
        host.get(gemma)
    assert host.model_kind(gemma) == ModelTraits("uniform", canvas_length=CANVAS)


def test_a_masked_decoder_on_a_uniform_model_becomes_its_sampler():
    chosen = GenerationConfig(decoder="threshold", threshold=0.7, gen_length=20, block_length=32)
    fitted = fit_to_model(chosen, "uniform", 8)
    assert (fitted.decoder, fitted.block_length, fitted.gen_length, fitted.decoder_options) == ("uniform", 8, 24, {})
    own = GenerationConfig(decoder="uniform", gen_length=16, block_length=32, decoder_options={"entropy_bound": 0.5})
    assert fit_to_model(own, "uniform", 8).decoder_options == {"entropy_bound": 0.5}  # its own settings stay
    masked = GenerationConfig(decoder="threshold", threshold=0.7, gen_length=32, block_length=32)
    assert fit_to_model(masked, "masked", None) == masked  # a masked model runs the page's settings as they are
    # what the uniform kind does not read, chosen on the page for a masked model, goes back to its default
    dual = fit_to_model(GenerationConfig(cache="dual", smoothing=True, temperature=0.7, threshold=0.5), "uniform", 8)
    assert (dual.cache, dual.smoothing, dual.temperature, dual.threshold) == ("none", False, GenerationConfig.temperature, GenerationConfig.threshold)
    eb = GenerationConfig(decoder="entropy_bound", decoder_options={"entropy_bound": 0.7})
    assert fit_to_model(eb, "uniform", 8).decoder_options == {"entropy_bound": 0.7}  # the option both declare is kept
    back = fit_to_model(dataclasses.replace(own, block_length=16), "masked", None)  # the uniform sampler left on the page, a masked model chosen
    assert back.decoder == GenerationConfig.decoder and back.decoder_options == {}


def test_the_run_handler_runs_the_uniform_sampler(tmp_path_factory, tiny_gemma_folder):
    from dinfer_viz.ui import Handlers

    host = EngineHost(ModelSpec(app_model(tmp_path_factory)))
    handlers = Handlers(host)
    settings = {"model": {"path": str(tiny_gemma_folder)}, "config": {"decoder": "threshold", "gen_length": 32, "block_length": 32}}
    _, config = handlers.parse(settings)
    assert config.decoder == "uniform" and config.block_length == CANVAS
    view = final(handlers.run("Q: 7+5=? A:", settings))
    assert "uniform-state model" in view["readout"] and "entropy bound" in view["grid"]["caption"]
    state = view["state"]
    assert state.timeline.kind == "uniform" and state.timeline.trace.config["decoder"] == "uniform"
    assert state.timeline.trace.block_length == CANVAS


def test_the_page_sends_no_hidden_setting_and_fits_with_the_engine(tmp_path_factory, tiny_gemma_folder):
    """A control the page hides leaves the settings (measure staleness ticked under cache dual,
    then cache none), and a uniform model's run is the engine's fit of what the page chose."""
    from dinfer_viz.ui import Handlers

    handlers = Handlers(EngineHost(ModelSpec(app_model(tmp_path_factory))))
    _, config = handlers.parse({"config": {"cache": "none", "measure_staleness": True}})
    assert config.measure_staleness is False
    _, kept = handlers.parse({"config": {"cache": "dual", "measure_staleness": True}})
    assert kept.measure_staleness is True and kept.cache == "dual"
    settings = {"model": {"path": str(tiny_gemma_folder)}, "config": {"cache": "dual", "temperature": 0.7}}
    _, fitted = handlers.parse(settings)
    assert fitted == fit(GenerationConfig(), ModelTraits("uniform", canvas_length=CANVAS), carry_over=True)
