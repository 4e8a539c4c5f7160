"""The Run tab's settings column: the check of the settings and the prompt before Run (Run is
refused, with the reason, before the engine would refuse it), the controls shown for a decoder and
cache mode with their explanation, the expected answer suggested for a prompt, the lessons' steps
filling the controls, and the forward-cost chart measured on the tab's model.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import gradio as gr

from engine import EngineError, GenerationConfig
from engine.constraints import ConstraintSpec, spec_of
from engine.pipeline import check_request, encode_prompt

from ..studies import answers
from ..drawing.cache_figure import forward_cost_figure, measure_forward_costs
from ..drawing.cells import inert_markdown
from ..panes.explain import explain
from ..panes.grid import inert
from ..studies.lessons import Lesson, lesson_named
from ..panes.readouts import plural
from ..settings import CONSTRAINT, CONSTRAINT_TEXT, all_controls, constraint_setting, control_value, sections, sweep_setting, visible_fields
from .common import TabHandlers, error_text, sent_value

# Canvas lengths of the forward-cost chart (those above the model's limit are left out)
COST_LENGTHS = (32, 64, 128, 256, 512, 1024)
# The expected box takes the suggested response only while it is empty or still holds the page's
# last suggestion: an answer the user typed stays when the prompt changes. Decided in the browser
# when the suggestion arrives, on the box's value at that moment, so that an answer typed while the
# suggestion was on its way stays too (the server saw the box as it was when the prompt changed).
# A box that holds the new suggestion already (a tab that opened a run here filled it: opened_answer)
# holds the page's value, and the next prompt change replaces it.
KEEP_TYPED_JS = (
    "(suggestion, current, last) => (current === '' || current === last || current === suggestion) ? [suggestion, suggestion] : [current, last]"
)


def _step_note(lesson: Lesson, index: int) -> str:
    """The sentence above the grid for step `index`: its title and what to look at after Run."""
    last = " (the last step)" if index == len(lesson.steps) - 1 else ""
    return f"**Step {index + 1} of {len(lesson.steps)}{last}: {inert(lesson.steps[index].title)}.** Press Run, then: {inert(lesson.steps[index].look)}"


def _same(page: Any, step: Any) -> bool:
    """A control's value on the page against the step's: numbers by value (a slider sends 0.9 as
    0.9 or an int as 64.0), anything else as it is."""
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (page, step))
    return math.isclose(page, step, rel_tol=1e-9, abs_tol=1e-12) if numbers else page == step


def held_words(spec: ConstraintSpec) -> str:
    """The settings line's Markdown for the constraint: its `describe()`, escaped; a regex quoted,
    its leading, trailing and doubled spaces as no-break spaces (Markdown dropped them: the
    regex ` [0-9]+` read as `[0-9]+`)."""
    kind, _, text = spec.describe().partition(" ")
    text = inert_markdown(text)
    if kind == "regex":
        text = "“" + re.sub(r"^ +| +$| {2,}", lambda m: "\u00a0" * len(m.group()), text) + "”"
    return f"{kind} {text}"


def suggested_answer(prompt: str | None, mode: str | None, text: str | None) -> str:
    """What the page fills the expected box with: the prompt's one right answer
    (answers.expected_response), unless the constraint (`mode`, `text`: the Structured output
    controls) cannot write it; else ''. Suggested on a prompt change, and given by the tabs that
    open a run here (a Tune trial, a sweep's wrong answer), so the box holds the same either way."""
    response = answers.expected_response(prompt or "")
    return response if response and constraint_admits(mode, text, response) else ""


def opened_answer(prompt: str, config: GenerationConfig) -> str:
    """suggested_answer for a run opened with `config`'s settings (its constraint included)."""
    controls = {c.field: control_value(c, config) for c in all_controls() if c.field in (CONSTRAINT, CONSTRAINT_TEXT)}
    return suggested_answer(prompt, controls.get(CONSTRAINT), controls.get(CONSTRAINT_TEXT))


def constraint_admits(mode: str | None, text: str | None, answer: str) -> bool:
    """Whether the page's constraint (a mode of settings.CONSTRAINT_MODES and its box) can write
    `answer`: no constraint or an unfinished one (the settings check says what is wrong); a choice
    listed; a regex that matches it whole (Python's `re` standing in for outlines-core's syntax,
    run on a suggested answer of a few characters); JSON that parses (its schema not checked)."""
    try:
        field = constraint_setting({CONSTRAINT: mode, CONSTRAINT_TEXT: text})
    except EngineError:
        return True
    if "choice" in field:
        return answer in field["choice"]
    if "regex" in field:
        try:
            return re.fullmatch(field["regex"], answer) is not None
        except (re.error, RecursionError, OverflowError):
            return False
    if "json_schema" in field:
        try:
            json.loads(answer)
        except ValueError:
            return False
    return True


class RunSettingsHandlers(TabHandlers):
    """The Run tab's events on its settings: checks, the controls shown, suggestions, lessons, costs."""

    def check(self, *values: Any) -> tuple[str, Any]:
        """(message next to the controls, Run button update): Run is refused while invalid (a
        constraint by the engine's own check, before any run). The message may quote what the
        user typed (a regex), so it is escaped."""
        try:
            _, config = self.parse(self.settings(*values))
        except EngineError as exc:
            return error_text(inert_markdown(str(exc))), gr.update(interactive=False)
        held = spec_of(config)
        return "settings ok" + (f" · the answer is held to {held_words(held)}" if held is not None else ""), gr.update(interactive=True)

    def check_with_prompt(self, prompt: str, *values: Any) -> tuple[str, Any, Any]:
        """`check`, then this server's bounds and the engine's checks of this prompt on this model
        (its max_sequence_length, prompt included: engine/pipeline.py check_request), with the
        prompt box's length hint; the page redoes it as the prompt, the settings or the model
        change, so Run is refused, with the reason, before the engine would refuse it."""
        message, button = self.check(*values)
        hint = self.limits_text()
        if not button["interactive"]:
            return message, button, gr.update(info=hint)
        try:
            model, config = self.parse(self.settings(*values))
            reader = self.host.reader(model) if prompt and prompt.strip() else None
            if reader is not None:
                hint = self.limits_text(len(encode_prompt(reader[1], prompt, config.use_chat_template)), reader[0].max_positions, model.label or self.host.label_of(model.path), config.block_length)
                check_request(*reader, prompt, config)
            self.check_request(prompt, config)
        except EngineError as exc:
            return error_text(inert_markdown(str(exc))), gr.update(interactive=False), gr.update(info=hint)
        return message, button, gr.update(info=hint)

    def fitted_decoder(self, *values: Any) -> Any:
        """The decoder box's update as the model or the kind changes (`values`: TabHandlers.settings'
        order): the decoder the run will use (`parse` fits it to the model's kind), when the box
        holds another: a uniform-state model runs its sampler, `uniform`, whatever masked decoder
        the box held (it showed `threshold`), and a masked model after it the masked default.
        Unchanged while the settings are invalid (the settings check says why)."""
        try:
            settings = self.settings(*values)
            _, config = self.parse(settings)
        except EngineError:
            return gr.skip()
        return gr.update(value=config.decoder) if config.decoder != settings["config"].get("decoder") else gr.skip()

    def structure(self, decoder: str, cache: str, smoothing: bool, unroll: bool, kind: str | None, *system: Any) -> tuple:
        """Show only the controls that matter for this kind / decoder / cache mode / feature set,
        the explanation of the choice, the setting a sweep of this decoder varies, and only the
        sections with a control shown (a kind that takes no decoder: no Decoder section)."""
        shown = visible_fields(decoder, cache, bool(smoothing), bool(unroll), kind or None)
        return (
            *(gr.update(visible=c.field in shown) for c in all_controls()),
            self.explanation(decoder, cache, smoothing, unroll, kind, *system),
            gr.update(value=sweep_setting(decoder)),
            *(gr.update(visible=any(c.field in shown for c in ctrls)) for _, ctrls in sections()),
        )

    def explanation(self, decoder: str, cache: str, smoothing: bool, unroll: bool, kind: str | None, *system: Any) -> str:
        """The explanation panel: the kind (when the page chooses one), the decoder, cache mode and
        features, and the system options that are on (`system`: the Model and system controls'
        values, in `option_names` order)."""
        return explain(decoder, cache, bool(smoothing), bool(unroll), dict(zip(self.option_names, system)), kind or None)

    def suggest_expected(self, prompt: str, constraint: str | None = None, constraint_text: str | None = None) -> tuple[str, str]:
        """(the known right response of an arithmetic prompt, "" for other families and where the
        page's constraint (`constraint`, `constraint_text`: the Structured output controls) cannot
        write it; the note on the prompt's family). Whether the expected box takes the response is
        the page's decision (KEEP_TYPED_JS): an emptied suggestion empties a box that held the last
        one, so a JSON answer is not struck out against `   7+ 58=  65`."""
        return suggested_answer(prompt, constraint, constraint_text), answers.prompt_note(prompt or "")

    def lesson_step(self, name: str | None, step: Any) -> tuple:
        """Step `step` (0-based; past the last: the last) of the lesson `name`: (the step menu, the
        prompt, the sentence of what to look at, every Run control's value in all_controls' order,
        the model box: the step's model, or unchanged when the lesson names none).
        An unknown lesson or step changes nothing but the sentence, which says why."""
        try:
            lesson = lesson_named(name)
            index = min(max(int(step or 0), 0), len(lesson.steps) - 1)
            config = lesson.config(index)
        except (EngineError, TypeError, ValueError) as exc:
            return (gr.skip(), gr.skip(), error_text(inert_markdown(str(exc))), *(gr.skip() for _ in all_controls()), gr.skip())
        choices = [(f"{i + 1}. {s.title}", i) for i, s in enumerate(lesson.steps)]
        return (gr.update(choices=choices, value=index), lesson.prompt, _step_note(lesson, index), *(control_value(c, config) for c in all_controls()), lesson.model(index) or gr.skip())

    def page_changed(self, name: str | None, step: Any, prompt: str, *values: Any) -> tuple:
        """As the prompt or a setting changes: `check_with_prompt`'s three slots, then `lesson_left`'s
        sentence (one event for both: common.LATEST)."""
        return (*self.check_with_prompt(prompt, *values), self.lesson_left(name, step, prompt, *values))

    def lesson_left(self, name: str | None, step: Any, prompt: str, *values: Any) -> Any:
        """The lesson sentence as the page's prompt and settings (`values`: TabHandlers.settings'
        order) now stand: the step's, or, once any of them is no longer what the step set, the
        sentence under a line naming what changed (it read as describing the run about to start);
        no lesson chosen: unchanged."""
        try:
            lesson = lesson_named(name)
            index = min(max(int(step), 0), len(lesson.steps) - 1)
            config = lesson.config(index)
        except (EngineError, TypeError, ValueError):
            return gr.skip()
        page = self.settings(*values)
        changed = [c.label for c in all_controls() if not _same(page["config"][c.field], sent_value(c, control_value(c, config)))]
        if (prompt or "").strip() != lesson.prompt.strip():
            changed.insert(0, "prompt")
        wanted = lesson.model(index)
        if wanted is not None and not self._same_model(page["model"]["path"], wanted):
            changed.insert(0, "model")
        if not changed:
            return _step_note(lesson, index)
        return f"⚠ *no longer this step's settings (changed: {inert(', '.join(changed))}); choose the step again to restore them.*\n\n{_step_note(lesson, index)}"

    def _same_model(self, box: str, name: str) -> bool:
        try:
            return self.host.resolve(box or "")[0] == self.host.resolve(name)[0]
        except EngineError:
            return False

    def forward_costs(self, *values: Any) -> tuple[Any, str]:
        """Measure each forward kind's cost against canvas length on the Run tab's model (its
        settings' values, TabHandlers.settings' order): (figure, one-line message)."""
        try:
            spec, _ = self.parse(self.settings(*values))
            with self.host.lock:
                engine = self.host.get(spec)
                limit = engine.model.max_positions
                lengths = [n for n in COST_LENGTHS if not limit or n <= limit]
                rows = measure_forward_costs(engine, lengths)
        except EngineError as exc:
            return gr.skip(), error_text(inert_markdown(str(exc)))
        return forward_cost_figure(rows), f"measured on {inert_markdown(spec.describe())}: median of {plural(rows[0]['repeats'] if rows else 0, 'forward')} per kind and length"
