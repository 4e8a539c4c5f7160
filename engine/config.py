"""GenerationConfig: every setting a run shares (a decoder's own are its declared options, in
`decoder_options`; a kind's own its kind's, in `kind_options`), validated in one place; the old
names of the settings that moved there."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import typing
from dataclasses import dataclass
from typing import Any

from .errors import EngineError
from .cache_modes import cache_mode_names
from .registry import TYPE_NAMES, decoder_class, decoder_names
from .constraints.spec import check_config as check_constraint
from .infill import HOLE_EXAMPLE, template_holes, template_pieces

# Settings that were GenerationConfig fields until each became the declared option of the one
# decoder that reads it (engine/decoders/: `options`): old name -> that decoder. `lift_moved` is
# the one place an old name is read; the constructor calls it, so `from_dict`, `replace`, JSON
# configs, the server's fields and the CLI's flags all keep taking the old names.
MOVED_SETTINGS = {
    "remasking": "fixed", "low_threshold": "hierarchical", "anchor": "hierarchical",
    "credit_alpha": "credit", "credit_beta": "credit", "credit_gamma": "credit", "factor": "factor",
}
# Settings that were GenerationConfig fields until each became the declared option of the one kind
# that reads it (engine/kinds/: `KindSettings.options`). `lift_moved` puts them in `kind_options`
# whatever the kind: a request's kind may be the model's own, known to `fit` alone, which refuses
# one that the run's kind does not declare (and drops one at its owner's default: an old config's
# dump lists every field).
MOVED_KIND_SETTINGS = ("verify", "verify_threshold")


def lift_moved(settings: dict[str, Any], strict: bool = True) -> dict[str, Any]:
    """GenerationConfig keywords with each old name of MOVED_SETTINGS inside `decoder_options` when
    the run's decoder owns it (the old name wins over an option of the same name, as
    `replace(factor=2.0)` means). With another decoder the setting is dropped at its declared
    default (an old config's dump lists every field) or when not `strict` (a recorded trace: its
    run ignored it); set away from it, EngineError naming the decoder that owns it. Each old name
    of MOVED_KIND_SETTINGS goes inside `kind_options` (winning over an option of the same name)."""
    settings = _lift_kind_settings(settings)
    old = [name for name in settings if name in MOVED_SETTINGS]
    if not old or not isinstance(settings.get("decoder_options") or {}, dict):  # validate names a bad options value
        return settings
    lifted = {k: v for k, v in settings.items() if k not in MOVED_SETTINGS}
    decoder = lifted.get("decoder", _DEFAULT_DECODER)
    options = dict(lifted.get("decoder_options") or {})
    for name in old:
        owner, value = MOVED_SETTINGS[name], settings[name]
        if decoder == owner:
            options[name] = value
        elif strict and value != decoder_class(owner).options[name].default:
            raise EngineError(f"{name} is a setting of decoder '{owner}' (decoder_options['{name}']), not of '{decoder}': choose decoder {owner} or leave it out")
    lifted["decoder_options"] = options
    return lifted


def _lift_kind_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """`settings` with the old names of MOVED_KIND_SETTINGS inside `kind_options` (MOVED_KIND_SETTINGS)."""
    old = {name: settings[name] for name in MOVED_KIND_SETTINGS if name in settings}
    if not old or not isinstance(settings.get("kind_options") or {}, dict):  # validate names a bad options value
        return settings
    lifted = {k: v for k, v in settings.items() if k not in MOVED_KIND_SETTINGS}
    lifted["kind_options"] = {**(lifted.get("kind_options") or {}), **old}
    return lifted


def _setting(
    default: Any, help: str, least: float | None = None, most: float | str | None = None, choices: tuple[str, ...] = (), needs: str | None = None,
) -> Any:
    """A GenerationConfig field with its one-line help: the CLI's --help and the app's controls read it.
    `least`/`most`: its declared range (inclusive), checked by `validate`; `most` may name another
    field ("gen_length") or "canvas" (the prompt plus gen_length, checked by `run.check_canvas`):
    past the canvas a count can change nothing, and a request's work stays bounded by its size.
    `choices`: a text setting's allowed values. `needs`: the switch (a bool field) without which no
    run reads it (engine/settings_read.py: who reads which setting). A setting one kind alone reads
    is no field: its kind file declares it (`KindSettings.options`, carried in `kind_options`)."""
    return dataclasses.field(default=default, metadata={"help": help, "least": least, "most": most, "choices": choices, "needs": needs})


def relative_bound(name: str, reference: int) -> int:
    """A count bounded by another length (`most` names it): at most that length, or the field's
    default where the default is larger (a default is always valid, also on a tiny canvas)."""
    default = next(f.default for f in dataclasses.fields(GenerationConfig) if f.name == name)
    return max(reference, default if isinstance(default, int) else 0)


def parse_schema(text: str) -> Any:
    """A JSON Schema given as JSON text; EngineError in one line when it is not JSON."""
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise EngineError(f"json_schema is not valid JSON ({exc})") from None


def setting_help(name: str) -> str:
    return next(f.metadata.get("help", "") for f in dataclasses.fields(GenerationConfig) if f.name == name)


def setting_choices(name: str) -> tuple[str, ...] | None:
    """The allowed values of a text setting (decoders include registered plug-ins), else None (the
    kinds: engine/kinds/, a floor above this one)."""
    declared = next((f.metadata.get("choices") for f in dataclasses.fields(GenerationConfig) if f.name == name), None)
    return {"decoder": tuple(decoder_names()), "cache": cache_mode_names()}.get(name) or declared or None


@dataclass
class GenerationConfig:
    """Settings of one generate call. Defaults follow dInfer's scripts where they apply.

    `steps` is LLaDA's total step count over the generation (fixed decoder only); None means one
    token per step (`steps = gen_length`).
    """

    kind: str | None = _setting(None, "the diffusion kind to run (none: the model's own)")
    gen_length: int = _setting(64, "positions to generate; a multiple of the block length")
    block_length: int = _setting(32, "blocks are decoded left to right; parallel decoding happens inside a block")
    decoder: str = _setting("threshold", "which masked positions to commit each iteration")
    threshold: float = _setting(0.9, "commit every masked position with confidence >= it (and always the most confident one)")
    steps: int | None = _setting(None, "fixed decoder: total steps over the generation, a multiple of the number of blocks (none: one token per step)", most="gen_length")
    temperature: float = _setting(0.0, "0 = greedy (argmax); > 0 samples with Gumbel noise", least=0.0, most=100.0)
    seed: int = _setting(0, "seeds sampling and random remasking")
    cache: str = _setting("none", "which K/V each forward recomputes and which it reuses")
    prefix_look: int = _setting(16, "vicinity: the window starts this many positions before the block", least=0, most="canvas")
    after_look: int = _setting(16, "vicinity: the window ends this many positions after the block", least=0, most="canvas")
    warmup: int = _setting(4, "vicinity: uncached full forwards at the start of a request", least=0, most="gen_length")
    refresh_every: int | None = _setting(None, "cached modes: an extra full refresh every N iterations (none: off)", least=1, most="gen_length")
    persist_window: bool = _setting(False, "vicinity: write the recomputed window back into the cache (dInfer discards it)")
    measure_staleness: bool = _setting(False, "cached modes: compare every cached forward with an exact one (KL, top-1 agreement); slower, excluded from timings")
    smoothing: bool = _setting(False, "feed still-masked positions a mix of [MASK] and the expected embedding of the last prediction")
    cont_weight: float = _setting(0.3, "smoothing: ceiling of the mixing weight", needs="smoothing")
    cont_weight_init: float = _setting(0.15, "smoothing: mixing weight at iteration 0", needs="smoothing")
    cont_weight_growth: float = _setting(0.02, "smoothing: mixing weight added per iteration", needs="smoothing")
    threshold_decay: float = _setting(0.02, "smoothing: the threshold starts at 1 and falls to the decoder's by this much per iteration", needs="smoothing")
    unroll: bool = _setting(False, "queue several iterations per host check (fewer device syncs)")
    expected_tpf: int = _setting(4, "unroll: iterations queued = masks left / expected TPF", least=1, most="gen_length", needs="unroll")
    max_unroll: int = _setting(8, "unroll: at most this many iterations per host check", least=1, most="gen_length", needs="unroll")
    align_blocks: bool = _setting(True, "dInfer's block alignment: the first block may start inside the prompt")
    early_stop: bool = _setting(True, "after a block that holds an end-of-text token, fill the rest with it and stop")
    use_chat_template: bool = _setting(True, "wrap the prompt in the tokenizer's chat template (ignored when it has none)")
    regex: str | None = _setting(None, "constrain the answer (the text before the first end-of-text) to this regex, outlines-core's syntax (docs/constraints.md)")
    json_schema: dict[str, Any] | None = _setting(None, "constrain the answer to JSON that this JSON Schema (an object, or its JSON text) accepts")
    choice: list[str] | None = _setting(None, "constrain the answer to one of these texts")
    suffix: str | None = _setting(None, "text pinned right after the generated span: the model fills the gen_length positions between the prompt and it (docs/algorithms.md §11)")
    template: str | None = _setting(None, f"the answer as text with holes, each marked with its length ({HOLE_EXAMPLE}): the model fills the holes, the text between and after them stays; sets gen_length to the holes' total")
    decoder_options: dict[str, Any] = dataclasses.field(
        default_factory=dict, metadata={"help": "a plug-in decoder's own settings by name (the decoder declares them)"}
    )
    kind_options: dict[str, Any] = dataclasses.field(
        default_factory=dict, metadata={"help": "the diffusion kind's own settings by name (its kind file declares them)"}
    )

    def __post_init__(self) -> None:
        # an empty box of a form (the app, a JSON client) means no constraint; a schema may come as its JSON text
        if self.regex == "":
            self.regex = None
        if self.choice in ("", []):
            self.choice = None
        if isinstance(self.json_schema, str):
            self.json_schema = parse_schema(self.json_schema) if self.json_schema.strip() else None
        if self.suffix == "":
            self.suffix = None
        if self.template == "":
            self.template = None
        if isinstance(self.template, str):  # the holes are the generated positions
            self.gen_length = sum(template_holes(self.template))

    def holes(self) -> list[int]:
        """The lengths of the holes the model fills: a template's, else the one of gen_length."""
        return template_holes(self.template) if self.template else [self.gen_length]

    def pins(self) -> bool:
        """Whether the request pins text in its answer (a suffix or a template)."""
        return self.suffix is not None or self.template is not None

    def pins_after_a_hole(self) -> bool:
        """Whether text is pinned after a hole (what a block-causal model cannot see)."""
        if self.template is None:
            return self.suffix is not None
        pieces = template_pieces(self.template)
        first = next(i for i, piece in enumerate(pieces) if isinstance(piece, int))
        return any(isinstance(piece, str) for piece in pieces[first:])

    def num_blocks(self) -> int:
        """Blocks over the generated positions: gen_length / block_length, or with pinned text each
        hole's share, rounded up (a hole's last block may be shorter)."""
        return sum(-(-hole // self.block_length) for hole in self.holes())

    def total_steps(self) -> int:
        return self.steps if self.steps is not None else self.gen_length

    def steps_per_block(self) -> int:
        """The fixed-step decoders' steps in each block: one per position (steps none), else steps / blocks."""
        return self.block_length if self.steps is None else self.steps // self.num_blocks()

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], validate: bool = True) -> "GenerationConfig":
        """The config of these settings (unknown names refused); not `validate`d when the caller's
        `fit` validates it next (engine/kinds/base.py: a request is validated once)."""
        known = {f.name for f in dataclasses.fields(cls)} | set(MOVED_SETTINGS) | set(MOVED_KIND_SETTINGS)
        unknown = sorted(set(data) - known)
        if unknown:
            raise EngineError(f"unknown generation setting(s): {', '.join(unknown)}")
        config = cls(**data)
        return config.validate() if validate else config

    def replace(self, **changes: Any) -> "GenerationConfig":
        return dataclasses.replace(self, **changes).validate()

    def validate(self) -> "GenerationConfig":
        """Check every rule; raise EngineError with a message naming the setting."""
        def need(ok: bool, message: str) -> None:
            if not ok:
                raise EngineError(message)

        self._check_types()
        need(0 <= self.seed <= 2**63 - 1, f"seed must be in 0..2**63-1, got {self.seed}")
        need(self.gen_length >= 1, f"gen_length must be positive, got {self.gen_length}")
        need(self.block_length >= 1, f"block_length must be positive, got {self.block_length}")
        need(
            self.gen_length % self.block_length == 0 or self.pins(),  # a hole is as long as it is: its last block may be shorter
            f"gen_length ({self.gen_length}) must be a multiple of block_length ({self.block_length})",
        )
        need(self.suffix is None or self.template is None, "give either suffix or template: a template's text after its last hole is its suffix")
        need(not self.pins() or (self.regex is None and self.json_schema is None and self.choice is None),
             "a constraint holds the answer to the canvas's end, so it cannot be combined with suffix or template yet: give one or the other")
        need(self.decoder in decoder_names(), f"unknown decoder '{self.decoder}'; choose from {', '.join(decoder_names())}")
        declared = decoder_class(self.decoder).options
        for name, value in self.decoder_options.items():
            if name not in declared:
                owner = next((d for d in decoder_names() if name in decoder_class(d).options), None)
                raise EngineError(f"decoder '{self.decoder}' has no setting '{name}'" + (f" (decoder '{owner}' has)" if owner else "") + (f"; its settings: {', '.join(declared)}" if declared else ""))
            declared[name].check(name, value)
        need(0.0 < self.threshold <= 1.0, f"threshold must be in (0, 1], got {self.threshold}")
        need(self.temperature >= 0.0, f"temperature must be >= 0, got {self.temperature}")
        if self.steps is not None:  # none: one step per position, whatever the blocks
            need(
                self.steps >= self.num_blocks() and self.steps % self.num_blocks() == 0,
                f"steps ({self.steps}) must be a positive multiple of the number of blocks ({self.num_blocks()})",
            )
        need(self.cache in cache_mode_names(), f"unknown cache mode '{self.cache}'; choose from {', '.join(cache_mode_names())}")
        for f in dataclasses.fields(self):  # the text settings with declared values
            allowed = f.metadata.get("choices")
            need(not allowed or getattr(self, f.name) in allowed, f"{f.name} must be one of {', '.join(allowed or ())}, got {str(getattr(self, f.name))[:40]!r}")
        self._check_ranges()
        need(0.0 <= self.cont_weight <= 1.0, f"cont_weight must be in [0, 1], got {self.cont_weight}")
        need(
            0.0 <= self.cont_weight_init <= 1.0 and 0.0 <= self.cont_weight_growth <= 1.0,
            "cont_weight_init and cont_weight_growth must be in [0, 1]",
        )
        need(0.0 <= self.threshold_decay <= 1.0, f"threshold_decay must be in [0, 1], got {self.threshold_decay}")
        check_constraint(self)
        return self

    def _check_ranges(self) -> None:
        """The declared ranges (`_setting`'s least/most). A count past the generation length can
        change nothing (more fixed steps than positions commit nothing; more warm-up, refresh or
        unroll iterations than the run has never happen), so it is refused, not silently kept."""
        for f in dataclasses.fields(self):
            value, least, most = getattr(self, f.name), f.metadata.get("least"), f.metadata.get("most")
            if value is None:
                continue
            if least is not None and value < least:
                raise EngineError(f"{f.name} must be >= {least}, got {value}")
            if isinstance(most, str) and most != "canvas":
                bound = relative_bound(f.name, getattr(self, most))
                if value > bound:
                    raise EngineError(f"{f.name} must be at most {bound} ({most} {getattr(self, most)}): more can change nothing, got {value}")
            elif isinstance(most, (int, float)) and value > most:
                raise EngineError(f"{f.name} must be <= {most}, got {str(value)[:40]}")

    def _check_types(self) -> None:
        """Every field of its declared type (int for float is fine), floats finite: a JSON or
        Python caller gets an EngineError naming the field, never a TypeError from deep inside."""
        hints = _field_types()
        for f in dataclasses.fields(self):
            value, hint = getattr(self, f.name), hints[f.name]
            optional = type(None) in typing.get_args(hint)  # `int | None`
            if value is None and optional:
                continue
            base = next(t for t in typing.get_args(hint) if t is not type(None)) if optional else hint
            base = typing.get_origin(base) or base  # dict[str, Any] -> dict
            ok = (
                isinstance(value, bool) if base is bool
                else isinstance(value, int) and not isinstance(value, bool) if base is int
                else isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) if base is float
                else isinstance(value, base)
            )
            if not ok:
                raise EngineError(f"{f.name} must be {TYPE_NAMES.get(base, base.__name__)}, got {str(value)[:40]!r}")


@functools.cache
def _field_types() -> dict[str, Any]:
    """GenerationConfig's resolved field annotations, once: resolving them evaluates every
    annotation string again (4% of a DiffusionGemma run on tiny-gemma, which validates twice)."""
    return typing.get_type_hints(GenerationConfig)


_DEFAULT_DECODER = GenerationConfig.decoder
_dataclass_init = GenerationConfig.__init__


@functools.wraps(_dataclass_init)
def _init_taking_moved_names(self: GenerationConfig, *fields: Any, **settings: Any) -> None:
    """The dataclass's __init__, the moved settings' old names lifted into their options first; a
    name it does not know is an EngineError naming those it does (not the dataclass's TypeError)."""
    known = [f.name for f in dataclasses.fields(GenerationConfig)]
    unknown = sorted(set(settings) - set(known) - set(MOVED_SETTINGS) - set(MOVED_KIND_SETTINGS))
    if unknown or len(fields) > len(known):
        raise EngineError(f"unknown generation setting(s): {', '.join(unknown) or 'too many positional values'}; the settings: {', '.join(known)}")
    _dataclass_init(self, *fields, **lift_moved(settings))


GenerationConfig.__init__ = _init_taking_moved_names  # type: ignore[method-assign]

# the fields whose declared bound is the canvas (prompt + gen_length), known only with the prompt
CANVAS_BOUNDED = tuple(f.name for f in dataclasses.fields(GenerationConfig) if f.metadata.get("most") == "canvas")
