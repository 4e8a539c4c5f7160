"""What a kind declares beyond its run (engine/kinds/base.py `KindSettings`, docs/algorithms.md
§10.1): its own settings, once, in its kind file (`options`: the CLI's flags, the page's controls,
the tuner's space and `fit`'s checks come from there), and whether it takes a decoder at all
(`decoders=None`: `decoder` is refused in one line on every path, the page hides the decoder's
controls, the tuner searches none). The test kind without a decoder is tests/decoderless_kind.py."""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import pytest

from engine import Engine, EngineError, GenerationConfig, RunHooks
from engine.__main__ import add_config_flags, config_from_args, main
from engine.kinds import KINDS, ModelTraits, fit
from engine.serving.limits import RequestLimits
from engine.serving.schema import parse_request
from engine.tuning.space import build_space

from .app_support import EMBEDDED_MODEL

MASKED = ModelTraits("masked")
BLOCK_CAUSAL = ModelTraits("masked", block_causal=True)
PROMPT = "Q: 1+2=? A:"


def _one_line_refusal(config: GenerationConfig, traits: ModelTraits = MASKED) -> str:
    with pytest.raises(EngineError) as caught:
        fit(config, traits)
    assert "\n" not in str(caught.value)
    return str(caught.value)


def test_a_kind_without_a_decoder_refuses_one_in_one_line_on_the_python_path(decoderless_kind):
    assert _one_line_refusal(GenerationConfig(kind="fill", decoder="wino")) == "fill diffusion takes no decoder: leave decoder ('wino') and decoder_options out"
    assert "takes no decoder" in _one_line_refusal(GenerationConfig(kind="fill", decoder_options={"low_threshold": 0.5}))
    fitted = fit(GenerationConfig(kind="fill"), MASKED)  # the neutral defaults, which its run never reads
    assert (fitted.decoder, fitted.decoder_options) == (GenerationConfig.decoder, {})
    assert fit(GenerationConfig(kind="fill", decoder="wino"), MASKED, carry_over=True).decoder == GenerationConfig.decoder  # a page's other model's choice
    engine = Engine(str(EMBEDDED_MODEL))
    with pytest.raises(EngineError, match="fill diffusion takes no decoder"):
        engine.generate(PROMPT, GenerationConfig(kind="fill", decoder="wino", gen_length=8, block_length=8))
    # its run builds no decoder: its trace's capabilities are empty, its forwards its own option's count
    result = engine.generate(PROMPT, GenerationConfig(kind="fill", gen_length=8, block_length=8, kind_options={"rounds": 3}), RunHooks(trace=True))
    assert result.output.trace.kind == "fill" and result.output.trace.capabilities == {}
    assert result.output.stats.nfe == 3 and len(result.output.token_ids[0]) == 8


def test_a_kind_without_a_decoder_refuses_one_on_the_cli_and_the_server(decoderless_kind, capsys):
    import httpx

    from engine.serving.app import create_app
    from engine.serving.traces import TraceStore

    from .test_serve import running

    assert main(["generate", "--model", str(EMBEDDED_MODEL), "--prompt", PROMPT, "--kind", "fill", "--decoder", "wino"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == ["error: fill diffusion takes no decoder: leave decoder ('wino') and decoder_options out"]
    app = create_app(Engine(str(EMBEDDED_MODEL)), RequestLimits(max_prompt_chars=200, max_gen_length=64, max_body_bytes=4096, max_prompts=2), max_batch=1, max_pending=4, traces=TraceStore(max_traces=2))
    with running(app) as url, httpx.Client(base_url=url, timeout=120) as http:
        refused = http.post("/completions", json={"prompt": PROMPT, "max_tokens": 8, "kind": "fill", "decoder": "wino"})
        answered = http.post("/completions", json={"prompt": PROMPT, "max_tokens": 8, "kind": "fill", "gen_length": 8, "block_length": 8})
    assert refused.status_code == 400 and refused.json()["error"]["message"].startswith("fill diffusion takes no decoder")
    assert answered.status_code == 200 and answered.json()["usage"]["completion_tokens"] >= 0


def test_the_page_hides_the_decoder_for_a_kind_without_one_and_shows_each_kinds_options_with_it(decoderless_kind, monkeypatch, tmp_path):
    from dinfer_viz.live.host import EngineHost, ModelSpec
    from dinfer_viz.settings import all_controls, build_config, sections, visible_fields, without_hidden
    from dinfer_viz.ui import Handlers
    from dinfer_viz.views.base import VIEWS
    from dinfer_viz.views.masked import MaskedView

    class FillView(MaskedView):
        kind = "fill"

    monkeypatch.setitem(VIEWS, "fill", FillView())  # the page's explanation is its kind's view's
    handlers = Handlers(EngineHost(ModelSpec(str(tmp_path / "never-loaded"))))
    for kind, hidden in (("fill", ["Decoder", "Fill in the middle"]), ("speculative", ["Fill in the middle"]), ("", [])):
        updates = handlers.structure("wino", "none", False, False, kind)[len(all_controls()) + 2:]
        assert [title for (title, _), update in zip(sections(), updates, strict=True) if not update["visible"]] == hidden

    controls = {c.field: c for c in all_controls()}
    fill = visible_fields("wino", "none", False, False, "fill")
    assert "kind_options.rounds" in fill and not fill & {"decoder", "threshold", "steps", "decoder_options.wino_threshold_out", "kind_options.verify"}
    assert {"decoder", "threshold", "kind_options.verify", "kind_options.verify_threshold"} <= visible_fields("threshold", "none", False, False, "speculative")
    assert not visible_fields("threshold", "none", False, False, None) & {"kind_options.verify", "kind_options.rounds"}
    # the control comes from the declaration: a number with a declared range is a slider over it
    slider = controls["kind_options.verify_threshold"]
    assert (slider.kind, slider.minimum, slider.maximum) == ("slider", 0.0, 1.0) and controls["kind_options.verify"].kind == "choice"
    # the page sends every kind's controls; the run keeps its own kind's, and a hidden one goes
    page = {"kind": "speculative", "kind_options.verify": "auto", "kind_options.rounds": 3}
    assert build_config(page).kind_options == {"verify": "auto"}
    assert without_hidden(build_config({**page, "kind": None})).kind_options == {}


def test_the_tuner_searches_no_decoder_for_a_kind_without_one(decoderless_kind):
    space = build_space(ModelTraits("fill"))  # a model whose one kind takes no decoder
    names = {d.name for d in space.dimensions}
    assert "kind_options.rounds" in names and not {n for n in names if n in ("decoder", "threshold") or n.startswith("decoder_options.")}
    assert not any("decoder" in line for line in space.describe())
    both = build_space(MASKED)  # masked diffusion searches decoders; a trial of the fill kind suggests none
    import optuna

    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(30):
        trial = study.ask()
        config = fit(both.suggest(trial), MASKED)
        if config.kind == "fill":
            assert "decoder" not in trial.params and not any("." in p for p in trial.params) and "rounds" in trial.params
        study.tell(trial, 0.0)


def test_a_kinds_option_is_checked_as_declared_before_any_forward_and_refused_by_other_kinds(decoderless_kind, capsys):
    engine = Engine(str(EMBEDDED_MODEL))
    forwards: list[int] = []
    engine.model.register_forward_hook(lambda *_: forwards.append(1))
    with pytest.raises(EngineError, match=r"^fill kind setting rounds must be in \[1, 4\], got 9$"):
        engine.generate(PROMPT, GenerationConfig(kind="fill", kind_options={"rounds": 9}, gen_length=8, block_length=8))
    assert forwards == []
    assert main(["generate", "--model", str(EMBEDDED_MODEL), "--prompt", PROMPT, "--kind", "fill", "--rounds", "0"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == ["error: fill kind setting rounds must be in [1, 4], got 0"]
    assert _one_line_refusal(GenerationConfig(kind_options={"rounds": 3})) == "masked diffusion does not read rounds (3; a setting of the fill kind): leave it out"
    assert _one_line_refusal(GenerationConfig(verify_threshold=0.5)) == "masked diffusion does not read verify_threshold (0.5; a setting of the speculative kind): leave it out"
    assert "does not read verify" in _one_line_refusal(GenerationConfig(kind="fill", verify="auto"))


def test_the_old_names_of_the_speculative_kinds_settings_still_work_everywhere():
    assert GenerationConfig(verify="auto").kind_options == {"verify": "auto"}
    assert GenerationConfig(verify="auto", kind_options={"verify": "always"}).kind_options == {"verify": "auto"}  # the old name wins, as for decoders
    fitted = fit(GenerationConfig.from_dict({"kind": "speculative", "verify": "auto", "verify_threshold": 0.5}, validate=False), BLOCK_CAUSAL)
    assert fitted.kind_options == {"verify": "auto", "verify_threshold": 0.5} and KINDS["speculative"].option(fitted, "verify_threshold") == 0.5
    assert KINDS["speculative"].option(GenerationConfig(), "verify") == "always"  # the declared default
    # a recorded masked run's config listed every field, verify at its default: it still fits
    old_dump = {**{k: v for k, v in GenerationConfig().to_dict().items() if k != "kind_options"}, "verify": "always", "verify_threshold": 0.9}
    assert fit(GenerationConfig.from_dict(old_dump), MASKED).kind_options == {}
    parser = argparse.ArgumentParser()
    add_config_flags(parser)
    args = parser.parse_args(["--kind", "speculative", "--verify", "auto", "--verify-threshold", "0.5"])
    assert config_from_args(args).kind_options == {"verify": "auto", "verify_threshold": 0.5}
    limits = RequestLimits(max_prompt_chars=200, max_gen_length=64, max_body_bytes=4096, max_prompts=2)
    parsed = parse_request({"prompt": "abc", "kind": "speculative", "verify": "auto", "verify_threshold": 0.5}, False, limits)
    assert parsed.config.kind_options == {"verify": "auto", "verify_threshold": 0.5}
    assert parse_request({"prompt": "abc", "kind_options": {"verify": "auto"}}, False, limits).config.kind_options == {"verify": "auto"}
    from benchmarks.presets import parse_configs  # benchmarks/RESULTS.md's --configs

    assert parse_configs("spec_auto=kind:speculative,verify:auto,verify_threshold:0.9", GenerationConfig())[0].config.kind_options == {"verify": "auto", "verify_threshold": 0.9}


def test_the_cli_help_lists_the_discovered_kinds_with_their_summaries(decoderless_kind, capsys):
    with pytest.raises(SystemExit) as done:
        main(["generate", "--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    from engine.kinds import KINDS

    assert "--kind {" + ",".join(KINDS) + "}" in text and "fill" in KINDS  # every discovered kind, the test's own too
    for name, kind in KINDS.items():
        assert kind.summary and f"{name}: {kind.summary}" in text
    assert "--rounds ROUNDS forwards per run" in text and "--verify {always,auto,router}" in text
