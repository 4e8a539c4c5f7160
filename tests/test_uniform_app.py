"""The app with a uniform-state model: its kind read without loading, a masked decoder choice
fitted to it (the canvas it was trained with), and a run through the Run tab's handler whose trace
is the uniform sampler's."""

from __future__ import annotations

from engine import GenerationConfig
from dinfer_viz.host import EngineHost, ModelSpec
from dinfer_viz.settings import fit_to_model

from .app_support import app_model
from .gemma_models import CANVAS
from .test_app_teaching import final


def test_model_kind_is_read_from_the_folder_then_from_the_engine(tmp_path_factory, tiny_gemma_folder):
    host = EngineHost(ModelSpec(app_model(tmp_path_factory)))
    gemma = ModelSpec(str(tiny_gemma_folder))
    assert host.model_kind(gemma) == ("uniform", CANVAS)  # config.json only: nothing loaded
    assert not host.is_loaded(gemma)
    assert host.model_kind(host.default) == ("masked", None)
    assert host.model_kind(ModelSpec("some/hub-id")) == ("masked", None)  # unknown until loaded
    with host.lock:
        host.get(gemma)
    assert host.model_kind(gemma) == ("uniform", CANVAS)


def test_a_masked_decoder_on_a_uniform_model_becomes_its_sampler():
    chosen = GenerationConfig(decoder="threshold", threshold=0.7, gen_length=20, block_length=32)
    fitted = fit_to_model(chosen, "uniform", 8)
    assert (fitted.decoder, fitted.block_length, fitted.gen_length, fitted.decoder_options) == ("uniform", 8, 24, {})
    own = GenerationConfig(decoder="uniform", gen_length=16, block_length=32, decoder_options={"entropy_bound": 0.5})
    assert fit_to_model(own, "uniform", 8).decoder_options == {"entropy_bound": 0.5}  # its own settings stay
    assert fit_to_model(chosen, "masked", None) is chosen
    eb = GenerationConfig(decoder="entropy_bound", decoder_options={"entropy_bound": 0.7})
    assert fit_to_model(eb, "uniform", 8).decoder_options == {"entropy_bound": 0.7}  # the option both declare is kept
    back = fit_to_model(own, "masked", None)  # the uniform sampler left on the page, a masked model chosen
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
    assert state.timeline.uniform and state.timeline.trace.config["decoder"] == "uniform"
    assert state.timeline.trace.block_length == CANVAS
