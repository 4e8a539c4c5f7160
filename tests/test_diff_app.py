"""The Diff & analysis tab's handlers (issue #36, dinfer_viz/tabs/diff.py): a planted divergence
found at its step and position with both sides' candidates; the strip, card and summary escape
trace strings; the analysis panel of a run whose answer is known; a reference recorded in the
app (transformers on the embedded tiny-gemma, diffusers on a tiny LLaDA2) equal to the engine's
run; refusals in one line."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from dinfer_viz.live.host import EngineHost, ModelSpec
from dinfer_viz.tabs.diff import ANALYSIS_VIEW, DIFF_VIEW, STEP_VIEW
from dinfer_viz.tabs.shown import FINISHED, LIVE, RunState
from dinfer_viz.reading.timeline import Timeline
from dinfer_viz.ui import Handlers
from engine import RunHooks, Trace

from .app_support import handmade_trace

ROOT = Path(__file__).resolve().parent.parent
GEMMA = ROOT / "assets" / "tiny-gemma"
HOSTILE = "<script>alert(1)</script>${x}"


def slots(names, values) -> dict:
    return dict(zip(names, values))


def planted(tmp_path: Path) -> tuple[Path, Path]:
    """The hand-made trace (A) and a copy (B) whose record 1 writes token 21 (hostile string) at
    position 6 where A writes 22: the canvases part at aligned step 2 (record 1), position 6."""
    a = handmade_trace()
    b = copy.deepcopy(a)
    b.iterations[1].top1[0][3] = 21
    b.iterations[1].candidates = [[[], [], [], [[21, 0.6], [22, 0.3], [20, 0.05]]]]
    b.final[0][6] = 21
    b.tokens["21"] = HOSTILE
    paths = tmp_path / "a.json", tmp_path / "b.json"
    for trace, path in zip((a, b), paths):
        path.write_text(trace.to_json())
    return paths


@pytest.fixture(scope="module")
def handlers() -> Handlers:
    return Handlers(EngineHost(ModelSpec(str(GEMMA))))


def shown_run(h: Handlers, prompt: str = "Q: ?+?=38 A:", config: dict | None = None) -> RunState:
    """The engine's run of `prompt` on the host's model with the app's settings, as the Run tab shows it."""
    spec, cfg = h.parse({"config": config or {}})
    with h.host.lock:
        res = h.host.get(spec).generate(prompt, cfg, RunHooks(trace=True))
    return RunState(Timeline(res.output.trace), None, FINISHED, spec.path, prompt, res.text)


def test_a_planted_divergence_is_found_at_its_step_and_position(handlers, tmp_path):
    a, b = planted(tmp_path)
    out = slots(DIFF_VIEW, handlers.diff(str(a), str(b), None, None))
    state = out["diff_state"]
    first = state.diff.first
    assert (first.step, first.position, first.block) == (1, 6, 0)
    assert (first.a.token, first.b.token) == (22, 21)
    assert first.b.candidates == [[21, 0.6], [22, 0.3], [20, 0.05]] and first.a.candidates is None
    assert not state.diff.final_equal and state.diff.steps_equal
    assert "aligned step 2 at position 6" in out["summary"] and "**differ** (first at position 6)" in out["summary"]
    assert out["scrub"]["value"] == 2 and out["scrub"]["maximum"] == 4
    # the strip at the divergence: position 6 differs and is outlined; before it, nothing differs
    assert re.search(r'class="col differs first"[^>]*data-pos="6"', out["strip"])
    before = slots(STEP_VIEW, handlers.diff_step(1, state))["strip"]
    assert "differs" not in before.split("</style>")[1] and "0 positions differ" in before
    # both sides' candidates and probabilities at the divergence, every trace string escaped
    card = out["first"]
    assert "0.6000" in card and "0.3000" in card and "not recorded" in card
    for html in (card, out["strip"]):
        assert "<script>" not in html and "${" not in html
    assert handlers.diff(str(a), str(a), None, None)[DIFF_VIEW.index("diff_state")].diff.first is None


def test_diff_refusals_are_one_line(handlers, tmp_path):
    a, _ = planted(tmp_path)
    other = handmade_trace()
    other.initial[0][0] = 11  # another prompt
    (tmp_path / "other.json").write_text(other.to_json())
    (tmp_path / "bad.json").write_text("{not json")
    cases = [
        ((str(a), str(tmp_path / "other.json"), None, None), "not of one prompt"),
        ((str(a), str(tmp_path / "bad.json"), None, None), "cannot load trace B (bad.json)"),
        ((str(a), None, None, None), "no trace B"),
        ((None, None, None, None), "no run on display"),
    ]
    for args, words in cases:
        message = slots(DIFF_VIEW, handlers.diff(*args))["message"]
        assert words in message and "\n" not in message, message
    record = slots(DIFF_VIEW, handlers.record(None, ""))["message"]
    assert "no run on display" in record
    live = RunState(Timeline(handmade_trace()), None, LIVE)
    assert "still running" in slots(DIFF_VIEW, handlers.record(live, ""))["message"]


def test_the_analysis_panel_of_a_known_run(handlers):
    """The hand-made run finalises left to right within its blocks; its last finalized fraction is 1."""
    shown = RunState(Timeline(handmade_trace()), None, FINISHED, "handmade")
    out = slots(ANALYSIS_VIEW, handlers.analyse(shown))
    steps = out["analysis_steps"]
    fractions = next(t for t in steps.data if t.uid == "finalized_fraction").y
    assert fractions[-1] == 1.0 and len(fractions) == 4
    assert {t.uid for t in steps.data} == {"finalized_fraction", "gate_confidence", "mean_confidence", "kl_to_final"}
    assert "order correlation" in out["analysis_text"] and "Approximated" in out["analysis_text"]
    assert "ρ = " in out["analysis_order"].layout.title.text
    hostile = handmade_trace()
    hostile.model = HOSTILE
    text = handlers.analyse(RunState(Timeline(hostile), None, FINISHED))[0]
    assert "<script>" not in text
    assert "no run on display" in handlers.analyse(None)[0]


def test_a_transformers_reference_recorded_in_the_app_equals_the_engines_run(handlers):
    shown = shown_run(handlers)
    out = slots(DIFF_VIEW, handlers.record(shown, ""))
    assert "recorded transformers" in out["message"], out["message"]
    state = out["diff_state"]
    assert state.diff.first is None and state.diff.final_equal and state.diff.steps_equal
    assert "**equal**" in out["summary"] and state.count == shown.timeline.iterations
    reference = out["reference"]
    assert reference.config["reference"]["library"] == "transformers"
    assert Trace.from_json(Path(out["reference_file"]).read_text()).final == reference.final
    # the Diff button then diffs the run on display against the reference kept in the session
    again = slots(DIFF_VIEW, handlers.diff(None, None, shown, reference))["diff_state"]
    assert again.diff.final_equal


def test_a_reference_the_library_cannot_run_is_refused_in_one_line(handlers, tmp_path):
    shown = shown_run(handlers)
    cases = [
        (RunState(Timeline(handmade_trace()), None, FINISHED), "", "--cache"),  # a masked model: diffusers has no vicinity cache
        (shown, str(tmp_path / "missing"), "not found"),  # the run's kind names the library (transformers), the folder is missing
    ]
    for run, model, words in cases:
        message = slots(DIFF_VIEW, handlers.record(run, model))["message"]
        assert words in message and "\n" not in message, message


def test_a_diffusers_reference_recorded_in_the_app_equals_the_engines_run(tmp_path):
    """An LLaDA2 folder (the parity tests' tiny network with the embedded character tokenizer):
    diffusers' LLaDA2Pipeline with editing on runs the engine's `edit` decoder step for step."""
    from .moe_models import save_llada2_folder

    folder = save_llada2_folder(tmp_path / "tiny-llada2")
    h = Handlers(EngineHost(ModelSpec(str(folder))))
    config = {"decoder": "edit", "threshold": 0.7, "gen_length": 8, "block_length": 4, "early_stop": False, "use_chat_template": False, "decoder_options": {"edit_threshold": 0.5}}
    shown = shown_run(h, "abcd", config)
    out = slots(DIFF_VIEW, h.record(shown, str(folder)))
    assert "recorded diffusers" in out["message"], out["message"]
    assert out["diff_state"].diff.final_equal and out["diff_state"].diff.first is None
    assert json.loads(Path(out["reference_file"]).read_text())["config"]["reference"]["library"] == "diffusers"
