"""Lessons: short sequences of runs, each step changing one setting of the one before, with one
sentence of what to look at (#16 item 3). The Run tab's Lessons box sets its prompt and controls
to a step's settings; the user presses Run.

A step's settings are the engine's defaults (GenerationConfig()), then the lesson's `base`, then
every step's `change` up to and including it: so a step differs from the one before in exactly the
settings its `change` names (one, by construction; `check_lessons` verifies it and that every step
builds a valid GenerationConfig against the registries). The model counts as a setting; a step
moving between a masked and a uniform-state model changes the decoder with it (`uniform` is the only
sampler a uniform-state model runs, and no masked model runs it), and that pair counts as one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine import EngineError, GenerationConfig
from engine.trace import UNIFORM

from ..panes.explain import decoder_kind
from ..settings import build_config
from .answers import NO_SUM_PROMPT


MODEL = "model"  # a step may change the model (by its name under assets/) instead of a setting


@dataclass(frozen=True)
class Step:
    """One run of a lesson: the one setting it changes (`change`: field -> value), its title, and
    one sentence of what to look at once it ran."""

    title: str
    change: dict[str, Any]
    look: str


@dataclass(frozen=True)
class Lesson:
    """A prompt, the settings every step shares (`base`, on top of GenerationConfig's defaults) and
    the steps, in order."""

    name: str
    prompt: str
    base: dict[str, Any]
    steps: tuple[Step, ...]

    def _merged(self, index: int) -> dict[str, Any]:
        """Step `index`'s settings and its model (under MODEL), when the lesson names one."""
        if not 0 <= index < len(self.steps):
            raise EngineError(f"lesson {self.name!r} has steps 1 to {len(self.steps)}, not {index + 1}")
        out = {**GenerationConfig().to_dict(), **self.base}
        for step in self.steps[: index + 1]:
            out.update(step.change)
        return out

    def settings(self, index: int) -> dict[str, Any]:
        """Step `index`'s full generation settings (GenerationConfig.to_dict's form)."""
        return {k: v for k, v in self._merged(index).items() if k != MODEL}

    def model(self, index: int) -> str | None:
        """The embedded model step `index` runs on, by the name the model box takes (every built-in
        lesson names one, so its first step never runs on the previous lesson's model; None: a
        lesson that names none leaves the model box as it is)."""
        return self._merged(index).get(MODEL)

    def config(self, index: int) -> GenerationConfig:
        """Step `index`'s settings, validated as a run's settings are (registries included)."""
        return build_config(self.settings(index))


BASE_MODEL, EDIT_MODEL = "tiny-llada", "tiny-llada-edit"  # embedded models, by the names the model box takes
# held out; at τ 0.3 the base answers ` 20 + 31` (51, not 41), the edit model with threshold
# `  0 + 31`, and with `edit` it edits the first number's blank into ` 10 + 31` (final checkpoint)
EDIT_LESSON_PROMPT = "Q: ?+?=41 A:"
UNIFORM_MODEL = "tiny-gemma"  # the embedded uniform-state model (DiffusionGemma): canvases of 16, the char tokenizer
# Pair-sum: the sum leaves the digits open (any split of 41 is right), so their proposals stay
# uncertain for a few steps and the uniform sampler re-noises them while the rest is accepted; an
# arithmetic answer has one right digit each, which a trained model proposes at once
UNIFORM_LESSON_PROMPT = EDIT_LESSON_PROMPT
LARGER_BOUND = 2.0  # the uniform sampler's entropy bound in lesson 6's last step (its default: 0.1)
# Lesson 7: a pair-sum prompt that names no sum, so the model is unsure of the answer's shape; at
# τ 0.1 one forward writes ` 43gg   1  ` unconstrained and ` 43 +  1` under the pair-sum regex
# (tests/test_constraint_app.py holds it to both). On the held-out pair-sum prompts the model's
# answers are well-formed without the regex at every threshold (benchmarks/RESULTS.md), so the
# regex would change nothing there.
STRUCTURE_LESSON_PROMPT = NO_SUM_PROMPT
PAIR_SUM_REGEX = r"(  [0-9]| [1-9][0-9]) \+(  [0-9]| [1-9][0-9])"  # benchmarks/constraints.py's
# Lesson 8: the embedded block-diffusion model (LLaDA2 layout, block-causal), whose blocks of one
# token decode autoregressively. A held-out pair-sum the autoregressive decode answers right
# (` 49 + 61`, 9 forwards); threshold decoding in blocks of 8 answers another right sum (` 45 + 65`),
# which nothing checks against step 1's; the speculative kind writes step 1's again in 4, one verify
# correcting the draft (tests/test_speculative_browser.py holds step 3's tokens to step 1's), and
# `verify=router` in 3, skipping the second block's verify (tests/test_speculative_router.py)
SPECULATIVE_MODEL = "tiny-llada2"
SPECULATIVE_LESSON_PROMPT = "Q: ?+?=110 A:"
# Lesson 9: the same pair-sum answered freely, then with its end pinned after a hole (docs/algorithms.md
# §11). The model's answers put each operand right-aligned in 3 characters (` 23 + 34`), so ` + 34`
# pinned after a hole of 3 leaves the hole one right answer, ` 23`. The fixed decoder commits one
# position a forward, so the order the cells are written in is the order the page shows.
INFILL_LESSON_PROMPT = "Q: ?+?=57 A:"
INFILL_TEMPLATE = "{{hole:3}} + 34"
# tiny-llada continued with span masking (its card): on the same hole it writes ` 23`, every hole
# cell's first prediction already its final token; the base writes ` 3` (tests/test_infill_page.py)
INFILL_MODEL = "tiny-llada-infill"
# Two blocks of 32: the second block's refresh (and its extra forward) shows in the cache lesson,
# and the fixed decoder's 64 iterations stay short enough to watch.
_SHORT = {"gen_length": 64, "block_length": 32}
LESSONS: tuple[Lesson, ...] = (
    Lesson(
        "1 · fixed → threshold → lower τ → credit",
        # a grammar prompt with a long answer, so each step's iteration count differs visibly; on
        # the shipped model, fixed and τ = 0.9 answer it right and the later steps break a word
        "the slow",
        {**_SHORT, "cache": "none", "decoder": "fixed", MODEL: BASE_MODEL},
        (
            Step(
                "fixed: one token per iteration",
                {"decoder": "fixed"},
                "Count the iterations: the fixed decoder commits one token per forward, so NFE is the number of positions it decodes "
                "(the early-stop fill after the answer is not counted as tokens, hence the low TPF).",
            ),
            Step(
                "threshold τ = 0.9",
                {"decoder": "threshold"},
                "Green cells commit above τ, orange ones are forced (the best below τ): several tokens per forward once the model is sure, "
                "so far fewer iterations for the same answer.",
            ),
            Step(
                "threshold τ = 0.7",
                {"threshold": 0.7},
                "A lower τ commits more per forward (TPF up, iterations down): click a cell committed early and compare its confidence "
                "with τ, then check whether the answer still reads right: letters of different words committed in one forward make "
                "a non-word, and the message gives the verifier's verdict.",
            ),
            Step(
                "credit decoding",
                {"decoder": "credit"},
                "Credit adds evidence a position built up over earlier iterations to its logits: look at the extras chart's credit and at "
                "positions that commit an iteration earlier than with plain threshold.",
            ),
        ),
    ),
    Lesson(
        "2 · cache none → prefix → dual → vicinity",
        "Q: ?+?=38 A:",
        {**_SHORT, "decoder": "threshold", "cache": "none", MODEL: BASE_MODEL},
        (
            Step(
                "no cache",
                {"cache": "none"},
                "Every iteration is one full forward over the whole canvas: NFE equals the iterations, and no K/V is ever stale.",
            ),
            Step(
                "prefix cache",
                {"cache": "prefix"},
                "Each block starts with a refresh; the K/V-state chart shows the prompt and earlier blocks cached (and stale) while the "
                "block and everything after it are recomputed.",
            ),
            Step(
                "dual cache",
                {"cache": "dual"},
                "Only the block is recomputed now, against a staler store: compare the answer and the verifier's verdict with the "
                "runs before, and open \"What a forward costs\" to see why a short canvas saves little time.",
            ),
            Step(
                "vicinity",
                {"cache": "vicinity"},
                "The first forwards are full (warmup), then a window around the block is recomputed: the dashed cells in the grid and "
                "the K/V-state chart show which neighbours stay fresh.",
            ),
        ),
    ),
    Lesson(
        "3 · smoothing off → on",
        "Q: ?+?=57 A:",
        {**_SHORT, "decoder": "threshold", "cache": "none", "smoothing": False, MODEL: BASE_MODEL},
        (
            Step(
                "smoothing off",
                {"smoothing": False},
                "Still-masked positions see only [MASK]: note the iterations and the confidence raster's colours before the first commits.",
            ),
            Step(
                "smoothing on",
                {"smoothing": True},
                "Masked positions now see a mix of [MASK] and their last prediction, and the threshold starts at 1 and falls: compare the "
                "per-iteration chart's threshold line and the iterations with the run before.",
            ),
        ),
    ),
    Lesson(
        "4 · one block → blocks of 32",
        # a grammar prompt the shipped model answers right in blocks of 32 and cuts to one word in a
        # single block (tests/test_embedded_model.py holds it to both)
        "his dirty",
        {"gen_length": 64, "decoder": "threshold", "cache": "none", "block_length": 64, MODEL: BASE_MODEL},
        (
            Step(
                "one block of 64",
                {"block_length": 64},
                "When nothing clears τ the decoder forces the most confident position, and that is the EOS beside the last one committed: "
                "watch the orange cells march in from the end, one an iteration, until no room is left for a sentence.",
            ),
            Step(
                "blocks of 32",
                {"block_length": 32},
                "The first block now ends inside the answer's room, so EOS can only march in from there and the words are committed first: "
                "compare the answer and the verifier's verdict (this is why LLaDA decodes block by block, semi-autoregressively).",
            ),
        ),
    ),
    Lesson(
        "5 · threshold 0.3 errs → the edit model repairs it with edit",
        # a held-out pair-sum prompt the base model answers wrongly at τ 0.3 and the edit model
        # answers right with the edit decoder (tests/test_lessons.py holds both to the run's trace)
        EDIT_LESSON_PROMPT,
        {**_SHORT, "decoder": "threshold", "threshold": 0.3, "cache": "none", MODEL: BASE_MODEL},
        (
            Step(
                "threshold τ = 0.3 on the base model",
                {"decoder": "threshold"},
                "A low τ commits both numbers' digits in the first forwards, each chosen without seeing the others: the sum breaks, "
                "and once committed a digit is final, so nothing can repair it.",
            ),
            Step(
                "the edit model, same decoder",
                {MODEL: EDIT_MODEL},
                "The edit model was also trained to correct visible tokens, but the threshold decoder never asks it to: "
                "compare its answer with the base model's before giving it the decoder that can.",
            ),
            Step(
                "the edit decoder (τ 0.3, edit threshold 0.5)",
                {"decoder": "edit"},
                "Pink cells are edits, the old token struck through beside the new: scrub iteration by iteration and click one to read "
                "the rule's numbers (p(new) above the edit threshold) that let the decoder take a committed digit back.",
            ),
        ),
    ),
    Lesson(
        "6 · masked → uniform-state diffusion → a larger entropy bound",
        # blocks of tiny-gemma's canvas, 16: its first canvas holds the answer and its EOS. Two of
        # them, since the masked model in one block of 16 breaks the format at τ 0.9 (`   7++58=  65`)
        UNIFORM_LESSON_PROMPT,
        {"gen_length": 32, "block_length": 16, "decoder": "threshold", "threshold": 0.9, "cache": "none", MODEL: BASE_MODEL},
        (
            Step(
                "masked diffusion: threshold τ 0.9 on tiny-llada",
                {"decoder": "threshold"},
                "Every answer cell starts as [MASK] and a committed token is final: count the iterations, and note that no cell, once "
                "filled, ever changes.",
            ),
            Step(
                "uniform-state diffusion: tiny-gemma and its sampler",
                {MODEL: UNIFORM_MODEL, "decoder": UNIFORM},
                "No cell is ever empty or final: the canvas starts as random tokens, each step accepts the lowest-entropy proposals and "
                "re-noises the rest (here the digits the sum leaves open); scrub the steps to watch them settle, and hover a cell for its entropy.",
            ),
            Step(
                f"entropy bound 0.1 → {LARGER_BOUND}",
                {"decoder_options": {"entropy_bound": LARGER_BOUND}},
                "A larger bound lets more of the open digits in per step, so fewer are re-noised and the canvas settles in fewer "
                "denoising steps: compare the steps and TPF with step 2, and check that the sum is still right.",
            ),
        ),
    ),
    Lesson(
        "7 · structure for free: τ 0.1 → the pair-sum regex → τ 0.9 with it",
        STRUCTURE_LESSON_PROMPT,
        {**_SHORT, "decoder": "threshold", "threshold": 0.1, "cache": "none", MODEL: BASE_MODEL},
        (
            Step(
                "threshold τ = 0.1, no constraint",
                {"threshold": 0.1},
                "One forward commits the whole answer, each position its own guess: the prompt names no sum, the model is unsure of "
                "the shape, and the answer is not two numbers and a plus.",
            ),
            Step(
                "the pair-sum regex (Structured output)",
                {"regex": PAIR_SUM_REGEX},
                "Still one forward, and now the answer is a + b: a teal dot marks a cell where the constraint removed the model's "
                "top-1; click one to read what the model wanted, how likely, and the mass the constraint removed.",
            ),
            Step(
                "threshold τ = 0.9, the regex kept",
                {"threshold": 0.9},
                "The careful threshold spends more forwards on the same shape: the structure came from the constraint at no extra "
                "forward, not from caution; compare the iterations and TPF with step 2.",
            ),
        ),
    ),
    Lesson(
        "8 · the model checks its own draft: block length 1 → blocks of 8 → speculative → router",
        SPECULATIVE_LESSON_PROMPT,
        {"gen_length": 32, "block_length": 1, "decoder": "threshold", "threshold": 0.9, "cache": "none", MODEL: SPECULATIVE_MODEL},
        (
            Step(
                "block length 1: the model as an autoregressive decoder",
                {"block_length": 1},
                "A block-diffusion model with blocks of one token is an autoregressive model: one forward per token, left to right. "
                "Note the answer and count the iterations.",
            ),
            Step(
                "blocks of 8, threshold τ 0.9",
                {"block_length": 8},
                "Diffusion inside each block of 8: confident positions commit together, so fewer forwards than tokens; nothing checks "
                "them against what the autoregressive decoder would have written.",
            ),
            Step(
                "the speculative kind: draft the block, verify it autoregressively",
                {"kind": "speculative"},
                "Each step drafts the open positions in one forward and checks the draft in a second, keeping the agreeing prefix "
                "(green) and taking the verifier's token at the first disagreement: the answer is step 1's, token for token, and the "
                "chart counts the drafted tokens each verify kept.",
            ),
            Step(
                "verify router: verify only when the router expects it to pay",
                {"kind_options": {"verify": "router"}},
                "The router estimates from the draft's entropies how many drafted tokens a verify would keep and skips the verify "
                "when the draft's confident run is worth more (the lane under the chart marks each decision): step 3's answer in fewer forwards.",
            ),
        ),
    ),
    Lesson(
        "9 · fill in the middle: the answer free → a hole before a pinned “ + 34”",
        INFILL_LESSON_PROMPT,
        {"gen_length": 8, "block_length": 8, "decoder": "fixed", "cache": "none", MODEL: BASE_MODEL},
        (
            Step(
                "nothing pinned: the model writes the whole answer",
                {"template": None},
                "One position a forward, so the order of the commits is the model's own: scrub the iterations and note which cells it "
                "writes first (the spaces and the plus that frame the numbers, or the digits), and which split of 57 it picks.",
            ),
            Step(
                "a hole of 3 before the pinned “ + 34” (a template)",
                {"template": INFILL_TEMPLATE},
                "The tan cells are pinned by the request: the model reads them and never writes them, so the hole must hold 23. "
                "Scrub the hole's three commits against step 1's first number, then open Diff & analysis: its order ρ counts the hole "
                "only (1: left to right, −1: the last digit first).",
            ),
            Step(
                "the same hole on tiny-llada-infill, trained to fill",
                {MODEL: INFILL_MODEL},
                "The model continued with span masking (a span of each answer masked, the text after it in view): compare its "
                "hole with step 2's; in the first iteration every hole cell already predicts its final token, so Diff & analysis "
                "finds no order to correlate (ρ n/a).",
            ),
        ),
    ),
)


def lesson_named(name: str | None) -> Lesson:
    """The lesson called `name`; EngineError (one line) for any other name."""
    if not name:
        raise EngineError("choose a lesson first")
    for lesson in LESSONS:
        if lesson.name == name:
            return lesson
    raise EngineError(f"no lesson named {name!r}")


def check_lessons(lessons: tuple[Lesson, ...] = LESSONS) -> None:
    """EngineError unless every step builds a valid GenerationConfig and changes exactly one
    setting (or the model) from the step before (the first step: from the lesson's base); a model
    change that moves to a decoder of another diffusion kind counts as one (the module's docstring)."""
    for lesson in lessons:
        before = {**GenerationConfig().to_dict(), **lesson.base}
        for i, step in enumerate(lesson.steps):
            lesson.config(i)
            now = lesson._merged(i)  # the model counts as a setting
            changed = sorted(k for k in now if now[k] != before.get(k))
            if changed == sorted([MODEL, "decoder"]) and decoder_kind(now["decoder"]) != decoder_kind(str(before.get("decoder"))):
                changed = [MODEL]  # the kind of diffusion changed, and the model decides the sampler
            if i > 0 and len(changed) != 1:
                raise EngineError(f"lesson {lesson.name!r} step {i + 1} changes {changed or 'nothing'}, not one setting")
            before = now
