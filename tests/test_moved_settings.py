"""Issue 32 item 5: the seven settings only one decoder reads (`remasking`, `low_threshold`,
`anchor`, `credit_alpha`, `credit_beta`, `credit_gamma`, `factor`) are that decoder's declared
options, validated with the config; every edge that took them by their old names still does
(engine/config.py `lift_moved`): the constructor, `from_dict`/JSON, `replace`, the CLI's flags,
the server's fields, the app's settings JSON and controls, presets, sweeps and old traces."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from benchmarks.presets import parse_configs
from benchmarks.sweep import sweep_points
from dinfer_viz.live.host import EngineHost, ModelSpec
from dinfer_viz.settings import OPTION_PREFIX, all_controls, build_config, sections, sweep_setting, visible_fields
from dinfer_viz.ui import Handlers
from engine import EngineError, GenerationConfig, RunHooks
from engine.__main__ import add_config_flags, config_from_args
from engine.cli import OneLineParser
from engine.config import MOVED_SETTINGS
from engine.generation import run_diffusion
from engine.registry import decoder_class
from engine.serving.batcher import batch_key
from engine.serving.limits import RequestLimits
from engine.serving.schema import parse_request
from engine.trace import Trace

from .app_support import app_model
from .conftest import tiny_llada

# a value away from each setting's default, inside its range
AWAY = {"remasking": "random", "low_threshold": 0.45, "anchor": "centre", "credit_alpha": 1.5, "credit_beta": 0.5, "credit_gamma": 0.4, "factor": 2.5}
# a value outside each one's declared range or choices
OUTSIDE = {"remasking": "sideways", "low_threshold": 1.5, "anchor": "edge", "credit_alpha": -0.1, "credit_beta": 0.0, "credit_gamma": -1.0, "factor": 0.0}
OLD_FIELDS = {name: decoder_class(owner).options[name].default for name, owner in MOVED_SETTINGS.items()}


def test_each_moved_setting_is_its_decoders_declared_option_and_no_config_field():
    fields = set(GenerationConfig.__dataclass_fields__)
    for name, owner in MOVED_SETTINGS.items():
        assert name not in fields and name in decoder_class(owner).options
        assert not any(name in decoder_class(other).options for other in ("threshold", "uniform", "remdm"))


@pytest.mark.parametrize("name", sorted(MOVED_SETTINGS))
def test_the_old_name_lands_in_decoder_options_through_every_constructor(name):
    owner, value = MOVED_SETTINGS[name], AWAY[name]
    wanted = GenerationConfig(decoder=owner, decoder_options={name: value}).validate()
    assert GenerationConfig(decoder=owner, **{name: value}).validate() == wanted
    assert GenerationConfig.from_dict(json.loads(json.dumps({"decoder": owner, name: value}))) == wanted
    assert GenerationConfig(decoder=owner).replace(**{name: value}) == wanted
    old_dump = {**GenerationConfig(decoder=owner).to_dict(), **OLD_FIELDS, name: value}  # a pre-move to_dict lists all seven
    assert GenerationConfig.from_dict(old_dump).decoder_options[name] == value


@pytest.mark.parametrize("name", sorted(MOVED_SETTINGS))
def test_an_old_name_with_another_decoder_is_refused_naming_its_owner_unless_at_its_default(name):
    other = "threshold" if MOVED_SETTINGS[name] != "threshold" else "fixed"
    with pytest.raises(EngineError) as refused:
        GenerationConfig(decoder=other, **{name: AWAY[name]})
    assert f"decoder '{MOVED_SETTINGS[name]}'" in str(refused.value) and "\n" not in str(refused.value)
    assert GenerationConfig(decoder=other, **{name: OLD_FIELDS[name]}).validate().decoder_options == {}
    with pytest.raises(EngineError, match=f"decoder '{MOVED_SETTINGS[name]}' has"):  # the new spelling, the same owner named
        GenerationConfig(decoder=other, decoder_options={name: AWAY[name]}).validate()


@pytest.mark.parametrize("name", sorted(MOVED_SETTINGS))
def test_a_value_outside_the_declared_range_is_refused_by_validate(name):
    with pytest.raises(EngineError, match=f"decoder setting {name}"):
        GenerationConfig(decoder=MOVED_SETTINGS[name], **{name: OUTSIDE[name]}).validate()


@pytest.mark.parametrize(
    "settings",
    [
        dict(decoder="fixed", steps=16, remasking="random", temperature=0.0),
        dict(decoder="hierarchical", low_threshold=0.3, anchor="centre", threshold=0.95),
        dict(decoder="credit", credit_alpha=3.0, credit_beta=0.9, credit_gamma=0.2, threshold=0.9),
        dict(decoder="factor", factor=2.5),
    ],
)
def test_tokens_follow_the_option_whichever_way_it_is_spelled(settings):
    """The old spelling and `decoder_options` run the same rule; the option's value matters."""
    model = tiny_llada()
    prompts = [[5, 6, 7, 8], [9, 10, 11, 12]]
    base = dict(gen_length=16, block_length=8, seed=3)
    options = {k: v for k, v in settings.items() if k in MOVED_SETTINGS}
    rest = {k: v for k, v in settings.items() if k not in MOVED_SETTINGS}
    old = run_diffusion(model, prompts, GenerationConfig(**base, **settings)).canvas
    new = run_diffusion(model, prompts, GenerationConfig(**base, **rest, decoder_options=options)).canvas
    default = run_diffusion(model, prompts, GenerationConfig(**base, **rest)).canvas
    assert torch.equal(old, new)
    assert not torch.equal(new, default)  # the setting reaches the rule


def test_the_cli_flags_keep_their_names_and_refuse_another_decoders_setting():
    parser = OneLineParser()
    add_config_flags(parser)
    args = parser.parse_args(["--decoder", "credit", "--credit-alpha", "1.5", "--credit-beta", "0.5"])
    assert config_from_args(args).decoder_options == {"credit_alpha": 1.5, "credit_beta": 0.5}
    args = parser.parse_args(["--decoder", "fixed", "--remasking", "random", "--steps", "64"])
    assert config_from_args(args).decoder_options == {"remasking": "random"}
    with pytest.raises(EngineError, match="decoder 'hierarchical' has"):
        config_from_args(parser.parse_args(["--low-threshold", "0.5"])).validate()  # the command's fit validates it


def test_the_servers_request_fields_keep_the_old_names():
    request = parse_request({"prompt": "Q: 1+2=? A:", "decoder": "hierarchical", "low_threshold": 0.45, "anchor": "centre"}, False, RequestLimits())
    assert request.config.decoder_options == {"low_threshold": 0.45, "anchor": "centre"}
    with pytest.raises(EngineError, match="decoder 'factor'"):
        parse_request({"prompt": "Q: 1+2=? A:", "factor": 3.0}, False, RequestLimits())
    with pytest.raises(EngineError, match="decoder setting credit_beta"):
        parse_request({"prompt": "x", "decoder": "credit", "decoder_options": {"credit_beta": 2.0}}, False, RequestLimits())


def test_the_batch_key_still_parts_requests_whose_decoder_options_differ():
    one, two = (GenerationConfig(decoder="factor", factor=f).validate() for f in (1.5, 2.5))
    assert batch_key(one, "m") is not None and batch_key(one, "m") != batch_key(two, "m")
    assert batch_key(GenerationConfig(decoder="fixed", remasking="random").validate(), "m") is None  # one random stream


def test_the_app_offers_each_option_beside_its_decoder_and_reads_old_settings_json():
    decoder_section = dict(sections())["Decoder"]
    fields = [c.field for c in decoder_section]
    for name in MOVED_SETTINGS:
        assert OPTION_PREFIX + name in fields and name not in {c.field for c in all_controls()}
    by_field = {c.field: c for c in decoder_section}
    assert by_field[OPTION_PREFIX + "low_threshold"].kind == "slider" and list(by_field[OPTION_PREFIX + "anchor"].choices()) == ["confidence", "centre"]
    shown = visible_fields("hierarchical", "none", False, False)
    assert {OPTION_PREFIX + "low_threshold", OPTION_PREFIX + "anchor"} <= shown and OPTION_PREFIX + "factor" not in shown
    assert build_config({"decoder": "credit", "credit_alpha": 1.5}).decoder_options == {"credit_alpha": 1.5}  # a settings JSON of before
    assert build_config({"decoder": "credit", OPTION_PREFIX + "credit_alpha": 1.5, OPTION_PREFIX + "factor": 3}).decoder_options == {"credit_alpha": 1.5}
    assert sweep_setting("factor") == OPTION_PREFIX + "factor"


def test_presets_and_the_cli_sweep_set_the_options():
    named = {n.name: n.config for n in parse_configs("llada,h=decoder:hierarchical,low_threshold:0.45,anchor:centre", GenerationConfig())}
    assert named["llada"].decoder_options == {"remasking": "low_confidence"}
    assert named["h"].decoder_options == {"low_threshold": 0.45, "anchor": "centre"}
    with pytest.raises(EngineError, match="decoder 'factor'"):
        parse_configs("x=decoder:threshold,factor:2", GenerationConfig())
    points = sweep_points("factor", GenerationConfig(), factors=(0.5, 2.0))
    assert [(knob, value, config.decoder_options) for knob, value, config in points] == [("factor", 0.5, {"factor": 0.5}), ("factor", 2.0, {"factor": 2.0})]


def _old_style(trace: Trace, **fields) -> dict:
    """`trace` as a trace written before the move: every old field in the config, the options not."""
    data = trace.to_dict()
    data["config"] = {**{k: v for k, v in data["config"].items() if k != "decoder_options"}, **OLD_FIELDS, **fields}
    return data


def test_an_old_trace_loads_with_its_settings_moved_and_fills_the_apps_boxes(tmp_path_factory):
    handlers = Handlers(EngineHost(ModelSpec(app_model(tmp_path_factory))), fps=1000, plot_hz=1000)
    config = GenerationConfig(decoder="hierarchical", gen_length=8, block_length=8, low_threshold=0.45, anchor="centre")
    trace = run_diffusion(tiny_llada(), [[5, 6, 7, 8]], config, hooks=RunHooks(trace=True)).trace
    loaded = Trace.from_dict(_old_style(trace, low_threshold=0.45, anchor="centre"))
    assert loaded.config["decoder_options"] == {"low_threshold": 0.45, "anchor": "centre"} and "low_threshold" not in loaded.config
    # a run of another decoder that set them (the old code ignored them): they are left out
    foreign = Trace.from_dict(_old_style(trace, decoder="threshold", low_threshold=0.45))
    assert foreign.config["decoder_options"] == {} and not set(MOVED_SETTINGS) & set(foreign.config)
    path = tmp_path_factory.mktemp("old-trace") / "old.json"
    path.write_text(json.dumps(_old_style(trace, low_threshold=0.45, anchor="centre")))
    boxes = dict(zip(handlers.loaded_slots, handlers.load_trace(str(path))))
    assert boxes[f"cfg:{OPTION_PREFIX}low_threshold"] == 0.45 and boxes[f"cfg:{OPTION_PREFIX}anchor"] == "centre"
    assert boxes["cfg:decoder"] == "hierarchical"


@pytest.mark.parametrize("stem, options", [("hierarchical-none", {"low_threshold": 0.6, "anchor": "confidence"}), ("fixed-none", {"remasking": "low_confidence"}), ("threshold-none", {})])
def test_a_shipped_version_2_trace_reads_its_decoders_settings_as_options(stem, options):
    path = Path(__file__).resolve().parents[1] / "assets" / "traces" / f"{stem}.json"
    data = json.loads(path.read_text())
    assert data["version"] == 2 and set(MOVED_SETTINGS) <= set(data["config"])  # written with the seven fields
    trace = Trace.from_dict(data)
    assert trace.config["decoder_options"] == options and not set(MOVED_SETTINGS) & set(trace.config)
    assert GenerationConfig.from_dict(trace.config).decoder_options == options


def test_a_setting_given_as_null_is_its_default_for_every_setting():
    """#55: `verify: null` was a 400 while `kind: null` meant the default; null is the default for
    every setting field alike (docs/serving.md)."""
    from engine.serving.schema import SETTING_FIELDS

    plain = parse_request({"prompt": "Q: 1+2=? A:"}, False, RequestLimits()).config
    for name in SETTING_FIELDS:
        assert parse_request({"prompt": "Q: 1+2=? A:", name: None}, False, RequestLimits()).config == plain, name
