"""#34 items 1 and 4 through the handlers: the Run tab knows the model's max_sequence_length
(prompt included) before Run, the check the engine applies; the built-in decoders' own options sit
with the decoder, Compare's sides offer them, and the Compare CSV names both models and every
setting that differs. The page itself: tests/test_page_limits_browser.py."""

from __future__ import annotations

import csv
import io

import pytest

from dinfer_viz.panes.export import compare_csv
from dinfer_viz.live.host import EngineHost, ModelSpec
from dinfer_viz.sample_traces import TRACES
from dinfer_viz.settings import PLUGIN_SECTION, all_controls, control_value, sections
from dinfer_viz.live.system import offered_options
from dinfer_viz.tabs.compare import side_fields
from dinfer_viz.reading.timeline import Timeline
from dinfer_viz.ui import Handlers
from engine import GenerationConfig, Trace
from engine.models.loader import EMBEDDED_ROOT

PROMPT = "Q: 48+57=? A:"
EDIT_OPTIONS = {"decoder_options.edit_threshold", "decoder_options.max_post_edit_steps", "decoder_options.repetition_penalty"}


@pytest.fixture(scope="module")
def handlers():
    host = EngineHost(ModelSpec(str(EMBEDDED_ROOT / "tiny-llada")))
    host.preload()
    return Handlers(host)


def values(model: str | None = None, **changes) -> list:
    """The Run tab's control values as the page sends them (model path, device, dtype, system options, settings)."""
    config = {c.field: control_value(c, GenerationConfig()) for c in all_controls()} | changes
    return [model, None, None, *((1 if o.kind is int else False) for o in offered_options()), *(config[c.field] for c in all_controls())]


def test_the_hint_says_the_room_this_prompt_leaves_and_run_is_refused_past_it(handlers):
    message, button, hint = handlers.check_with_prompt(PROMPT, *values())
    tokens = len(handlers.host.peek(handlers.host.default).encode(PROMPT))
    assert message == "settings ok" and button["interactive"] is True
    room = (512 - tokens) // 32 * 32  # a multiple of the block length (32), as a run's must be (#44 item 10: 504 read, 480 ran)
    assert f"generation length at most {room} for this prompt ({tokens} tokens of tiny-llada's 512 positions" in hint["info"]
    # within the app's own bound (1024) but past the model's: refused before Run, in the engine's words
    message, button, hint = handlers.check_with_prompt(PROMPT, *values(gen_length=1024))
    assert button["interactive"] is False and "exceeds the model" in message and "max" in message and f"{room} for this prompt" in hint["info"]
    # a longer prompt leaves less room: the same settings are refused
    long_prompt = PROMPT * 40
    message, button, _ = handlers.check_with_prompt(long_prompt, *values(gen_length=64 * 7, block_length=64))
    assert button["interactive"] is False and "shorten the prompt or the generation length" in message
    message, button, _ = handlers.check_with_prompt("", *values())
    assert button["interactive"] is False and "empty prompt" in message


def test_the_hint_follows_the_model_chosen_before_it_is_loaded(handlers):
    assert not handlers.host.is_loaded(ModelSpec(str(EMBEDDED_ROOT / "tiny-gemma")))
    _, button, hint = handlers.check_with_prompt(PROMPT, *values("tiny-gemma"))
    assert button["interactive"] is True and "tiny-gemma's" in hint["info"]


def test_the_built_in_decoders_options_sit_with_the_decoder_and_compare_offers_them():
    by_section = {title: {c.field for c in ctrls} for title, ctrls in sections()}
    assert EDIT_OPTIONS <= by_section["Decoder"]
    assert not EDIT_OPTIONS & by_section.get(PLUGIN_SECTION, set())  # that section is the plug-ins'
    assert EDIT_OPTIONS <= side_fields("edit") and not EDIT_OPTIONS & side_fields("threshold")


def test_the_compare_csv_names_both_models_and_every_setting_that_differs():
    a, b = (Trace.from_json((TRACES / f"{stem}.json").read_text(encoding="utf-8")) for stem in ("threshold-none", "edit-none"))
    b.config = {**b.config, "decoder_options": {"edit_threshold": 0.7, "max_post_edit_steps": 4}, "seed": 3}
    rows = list(csv.DictReader(io.StringIO(compare_csv([Timeline(a), Timeline(b)], ["A", "B"]))))
    assert [r["model"] for r in rows] == ["tiny-llada", "tiny-llada-edit"]
    assert (rows[0]["decoder_options.edit_threshold"], rows[1]["decoder_options.edit_threshold"]) == ("", "0.7")
    assert rows[1]["decoder_options.max_post_edit_steps"] == "4" and (rows[0]["seed"], rows[1]["seed"]) == (str(a.config["seed"]), "3")
    assert (rows[0]["threshold"], rows[1]["threshold"]) == ("0.9", "0.3")
    assert "gen_length" not in rows[0]  # the same on both sides: no column


def test_every_listener_that_redraws_on_change_runs_the_latest_change_last(handlers):
    """A listener fired by a control's change (the settings check, which controls show, the
    presets, the expected answer) must be queued: Gradio runs a trigger that comes while one is in
    flight after it (always_last) only for queued events; unqueued, overlapping requests land in
    any order, and a slow earlier check left the verdict of settings the user had already changed."""
    from dinfer_viz.ui import build_demo

    demo = build_demo(handlers)
    comps = {c["id"]: c.get("props", {}).get("elem_id") or c.get("props", {}).get("label") or c["type"] for c in demo.config["components"]}
    redraws = [d for d in demo.config["dependencies"] if d["backend_fn"] and any(event in ("change", "input", "load") for _, event in d["targets"]) and d["trigger_mode"] == "always_last"]
    assert len(redraws) >= 8  # the settings check, the controls shown, the explanation, presets, suggestion, ...
    unqueued = [[comps.get(t) for t, _ in d["targets"]][:3] for d in redraws if d["queue"] is False]
    assert not unqueued, f"unqueued listeners that redraw on change: {unqueued}"


def test_no_trigger_starts_two_events_that_wait_for_the_last_change(handlers):
    """Gradio's page, when an always_last event deferred by a trigger ends, triggers the whole
    trigger again: with two such events on one trigger each end re-ran the other while it was in
    flight, and a trace loaded into the Run tab left the page sending the settings check, the lesson
    sentence and the controls shown about six times a second for as long as it was open
    (dinfer_viz/tabs/common.py LATEST). So every trigger but the page's load (which starts each of
    its events on its own) starts at most one; the others on it run for every trigger (ALONGSIDE)."""
    from collections import defaultdict

    from dinfer_viz.ui import build_demo

    demo = build_demo(handlers)
    comps = {c["id"]: c.get("props", {}).get("elem_id") or c.get("props", {}).get("label") or c["type"] for c in demo.config["components"]}
    waiting = defaultdict(list)
    for d in demo.config["dependencies"]:
        if d["trigger_mode"] == "always_last":
            for target, event in d["targets"]:
                if event != "load":
                    waiting[(comps.get(target), event)].append(d["id"])
    assert len(waiting) >= 60  # the settings check alone listens to every control of the Run tab
    shared = {trigger: ids for trigger, ids in waiting.items() if len(ids) > 1}
    assert not shared, f"triggers that start more than one always_last event: {sorted(shared)[:5]}"


def test_every_event_that_redraws_on_change_writes_only_its_newest_answer(handlers):
    """Neither LATEST nor ALONGSIDE orders a visitor's calls: two changes close together both run
    side by side and the first can end last, and two calls sent close together can reach the
    server either way round; so every such event goes through common.redraw_on: its handler drops
    an overtaken answer, ordered by the number the page gives each call as it sends it (the call's
    last input, one hidden slot per page)."""
    from dinfer_viz.tabs.common import CALL_NUMBER_JS
    from dinfer_viz.ui import build_demo

    demo = build_demo(handlers)
    redraws = [f for f in demo.fns.values() if f.fn is not None and f.trigger_mode in ("always_last", "multiple") and f.api_visibility == "private"]
    assert len(redraws) >= 12  # the settings check, the controls shown, the explanation, presets, suggestion, ...
    unordered = [f.fn.__name__ for f in redraws if not getattr(f.fn, "answers_newest", False) or f.js != CALL_NUMBER_JS]
    assert not unordered, f"events that can end on an overtaken answer: {unordered}"
    slots = {id(f.inputs[-1]) for f in redraws}
    slot = redraws[0].inputs[-1]
    assert slots == {id(slot)} and slot.elem_id == "call-number" and not slot.visible  # one per page
    # their status goes to that slot: a component hidden by an event while it showed the event
    # pending kept its status tracker running on every animation frame (Gradio 6.31)
    assert all(f.show_progress_on == [slot] for f in redraws), [f.fn.__name__ for f in redraws if f.show_progress_on != [slot]]


def _redrawn(check):
    """`check` wired by redraw_on to a box's change, writing two boxes: the handler Gradio calls."""
    import gradio as gr

    from dinfer_viz.tabs.common import LATEST, redraw_on

    with gr.Blocks() as demo:
        box = gr.Textbox()
        redraw_on([box.change], check, box, [gr.Textbox(), gr.Textbox()], **LATEST)
    (wired,) = demo.fns.values()
    return wired.fn


def test_an_overtaken_call_writes_nothing_and_other_visitors_are_apart():
    """The first of two calls from one visitor, ending after the second, answers gr.skip() in every
    slot; the second's answer stands; a call from another visitor meanwhile is not overtaken."""
    import asyncio
    import threading
    from types import SimpleNamespace

    import gradio as gr

    old_started, old_may_end = threading.Event(), threading.Event()

    def check(value: str) -> tuple:
        if value == "old":
            old_started.set()
            old_may_end.wait(timeout=30)
        return (f"verdict on {value}", value)

    answer = _redrawn(check)
    ann, bob = SimpleNamespace(session_hash="ann"), SimpleNamespace(session_hash="bob")

    async def calls() -> None:
        old = asyncio.create_task(answer(ann, "old", 1))
        assert await asyncio.to_thread(old_started.wait, 30)
        assert await answer(ann, "new", 2) == ("verdict on new", "new")
        assert await answer(bob, "other", 1) == ("verdict on other", "other")
        old_may_end.set()
        assert await old == (gr.skip(), gr.skip())
        assert await answer(ann, "again", 3) == ("verdict on again", "again")  # the newest again

    asyncio.run(calls())


def test_a_call_the_page_sent_first_that_arrives_last_is_not_run():
    """Calls reach the server in any order: one numbered before a call already started answers
    gr.skip() in every slot without running; the page's order, not the server's, decides."""
    import asyncio
    from types import SimpleNamespace

    import gradio as gr

    ran = []
    answer = _redrawn(lambda value: ran.append(value) or (value, value))
    ann = SimpleNamespace(session_hash="ann")

    async def calls() -> None:
        assert await answer(ann, "new", 7) == ("new", "new")
        assert await answer(ann, "old", 6) == (gr.skip(), gr.skip())

    asyncio.run(calls())
    assert ran == ["new"]
