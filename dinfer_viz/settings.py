"""The generation controls and their mapping to `engine.GenerationConfig`.

Choices come from the engine's declarations (`decoder_names()`, engine/cache_modes.py...),
never from lists kept here, and every GenerationConfig field without a hand-made control gets an
automatic one under "Other engine settings", so a setting added to the engine is in the app at
once. A run's settings travel as one JSON object, which is also the API's input:

    {"model": {"path": ..., "device": "cpu", "dtype": "auto"}, "config": {<GenerationConfig fields>}}

Any part may be left out: missing config fields take the engine's defaults, a missing model is
the app's default model.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import typing
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from engine import Decoder, EngineError, GenerationConfig
from engine.constraints import CONSTRAINT_FIELDS, spec_of
from engine.config import MOVED_KIND_SETTINGS, MOVED_SETTINGS, setting_choices, setting_help
from engine.decoders.filling import CreditDecoder, FixedStepDecoder, HierarchicalDecoder
from engine.decoders.factor import FactorDecoder
from engine.kinds import KINDS, kind_options, kinds_described
from engine.settings_read import settings_read, switch_settings
from engine.registry import KIND_OPTION_PREFIX, OPTION_SETTING_PREFIX, DecoderOption, decoder_class, decoder_options, is_builtin
from engine.decoders.revising import apply_preset

from engine.cli import checked_device

from .live.host import DTYPES, ModelSpec
from .live.system import offered_options


@dataclass(frozen=True)
class Control:
    field: str
    label: str
    kind: str  # "choice" | "slider" | "int" | "float" | "bool" | "text" | "lines" (a text of several lines)
    info: str = ""
    choices: Callable[[], Sequence[str]] | None = None
    minimum: float | None = None
    maximum: float | None = None
    step: float | None = None
    none_as_zero: bool = False  # an optional int: 0 in the control means "off" (None)


def _c(field: str, label: str, kind: str, **kw: Any) -> Control:
    """A control with the field's help from its declaration (engine/config.py) as its info text, and
    a choice control's choices from there too (the decoder list includes registered plug-ins)."""
    if kind == "choice":
        kw.setdefault("choices", lambda: setting_choices(field))
    return Control(field, label, kind, setting_help(field), **kw)


def _o(decoder: type[Decoder], name: str, label: str, kind: str, **kw: Any) -> Control:
    """A hand-made control for a built-in decoder's declared option (`decoder_options.<name>`), its
    help and a choice's choices from the declaration (engine/decoders/)."""
    option = decoder.options[name]
    if kind == "choice":
        kw.setdefault("choices", lambda: option.choices)
    return Control(OPTION_SETTING_PREFIX + name, label, kind, option.help, **kw)


KIND_SECTION = "Diffusion kind"
# The kind control's choice for GenerationConfig.kind None: (what the menu shows, the value it sends)
OWN_KIND = ("the model's own kind", "")
SECTIONS: list[tuple[str, tuple[Control, ...]]] = [
    (
        KIND_SECTION,
        (
            # OWN_KIND first: the model's own kind, a choice of its own so that a kind once picked can
            # be unpicked (engine/kinds/: the kinds discovered from their files, each with its
            # summary); each kind's own options join this section (`sections`)
            Control("kind", "kind", "choice", f"{setting_help('kind')}. {kinds_described()}", choices=lambda: [OWN_KIND, *KINDS]),
        ),
    ),
    (
        "Decoder",
        (
            _c("decoder", "decoder", "choice"),
            _c("threshold", "threshold τ", "slider", minimum=0.05, maximum=1.0, step=0.01),
            _o(HierarchicalDecoder, "low_threshold", "low threshold", "slider", minimum=0.0, maximum=1.0, step=0.01),
            _o(HierarchicalDecoder, "anchor", "anchor rule", "choice"),
            _o(CreditDecoder, "credit_alpha", "credit α", "slider", minimum=0.0, maximum=2.0, step=0.05),
            _o(CreditDecoder, "credit_beta", "credit β (decay)", "slider", minimum=0.05, maximum=1.0, step=0.05),
            _o(CreditDecoder, "credit_gamma", "credit γ (boost)", "slider", minimum=0.0, maximum=1.0, step=0.05),
            _o(FactorDecoder, "factor", "factor", "slider", minimum=0.1, maximum=4.0, step=0.1),
            _c("steps", "steps (0 = one token per step)", "int", minimum=0, none_as_zero=True),
            _o(FixedStepDecoder, "remasking", "remasking", "choice"),
        ),
    ),
    (
        "Blocks and length",
        (
            _c("gen_length", "generation length", "int", minimum=1),
            _c("block_length", "block length", "int", minimum=1),
            _c("align_blocks", "align blocks to multiples of the block length", "bool"),
            _c("early_stop", "early stop", "bool"),
            _c("use_chat_template", "use the chat template", "bool"),
        ),
    ),
    (
        "KV cache",
        (
            _c("cache", "cache mode", "choice"),
            _c("prefix_look", "prefix look", "int", minimum=0),
            _c("after_look", "after look", "int", minimum=0),
            _c("warmup", "warm-up iterations", "int", minimum=0),
            _c("refresh_every", "refresh every N iterations (0 = off)", "int", minimum=0, none_as_zero=True),
            _c("persist_window", "persist the window's K/V", "bool"),
            _c("measure_staleness", "measure staleness", "bool"),
        ),
    ),
    (
        "Iteration smoothing",
        (
            _c("smoothing", "smoothing", "bool"),
            _c("cont_weight", "continuation weight (max)", "slider", minimum=0.0, maximum=1.0, step=0.01),
            _c("cont_weight_init", "weight at start", "slider", minimum=0.0, maximum=1.0, step=0.01),
            _c("cont_weight_growth", "weight growth per iteration", "float", minimum=0.0, step=0.005),
            _c("threshold_decay", "threshold decay per iteration", "float", minimum=0.0, step=0.005),
        ),
    ),
    (
        "Loop unrolling",
        (
            _c("unroll", "unroll", "bool"),
            _c("expected_tpf", "expected TPF", "int", minimum=1),
            _c("max_unroll", "max unroll", "int", minimum=1),
        ),
    ),
    (
        "Sampling",
        (
            _c("temperature", "temperature", "slider", minimum=0.0, maximum=2.0, step=0.05),
            _c("seed", "seed", "int", minimum=0),
        ),
    ),
]

# The answer's constraint (docs/constraints.md) on the page: one mode and one text box, which stand
# for GenerationConfig's regex, json_schema and choice (at most one of which may be set). The run's
# settings carry them as `constraint` and `constraint_text`; build_config turns them into the field.
CONSTRAINT, CONSTRAINT_TEXT, NO_CONSTRAINT = "constraint", "constraint_text", "none"
CONSTRAINT_MODES = ((NO_CONSTRAINT, NO_CONSTRAINT), ("regex", "regex"), ("JSON schema", "json_schema"), ("choice (one per line)", "choice"))
CONSTRAINT_WHAT = {"regex": "a regex", "json_schema": "a JSON Schema", "choice": "the choices, one per line"}
SECTIONS.append(
    (
        "Structured output",
        (
            Control(CONSTRAINT, "constraint", "choice", "hold the answer (the text before the first end-of-text) to a regex, JSON that a schema accepts, or one of several texts: every decoder obeys it", choices=lambda: CONSTRAINT_MODES),
            Control(CONSTRAINT_TEXT, "constraint text", "lines", "the regex (outlines-core's syntax, e.g. ` [0-9]+ \\+ [0-9]+`), the JSON Schema as JSON, or the choices one per line; ignored with constraint none"),
        ),
    )
)
# Text pinned in the answer (engine/infill.py): the model fills the holes, both sides in view. Which
# models can is the engine's rule (docs/algorithms.md §11); the boxes say it before anyone tries.
WHO_FILLS = (
    "Masked-diffusion models with full attention fill holes (tiny-llada, tiny-llada-edit, tiny-llada-td; tiny-llada-infill "
    "was trained to, and fills most); "
    "a block-causal model (tiny-llada2, LLaDA2) sees no text after its block and refuses text pinned after a hole, "
    "as do the uniform-state and speculative kinds: the reason shows under Run. The grid draws pinned cells in their own colour."
)
SECTIONS.append(
    (
        "Fill in the middle",
        (
            Control("suffix", "suffix (pinned after the answer)", "text", f"{setting_help('suffix')}. {WHO_FILLS}"),
            Control("template", "template (holes marked {{hole:N}})", "lines", f"{setting_help('template')}. {WHO_FILLS}"),
        ),
    )
)
PAGE_FIELDS = (CONSTRAINT, CONSTRAINT_TEXT)  # controls that stand for GenerationConfig fields of other names

# A plug-in decoder's own setting is the control `decoder_options.<name>`; the run's config
# carries it inside `decoder_options` (engine/registry.py).
OPTION_PREFIX = OPTION_SETTING_PREFIX
PLUGIN_SECTION = "Plug-in decoder settings"


def _option_control(prefix: str, name: str, owner: str, option: DecoderOption) -> Control:
    """The control of a declared option (a decoder's, `prefix` OPTION_PREFIX, or a kind's,
    KIND_OPTION_PREFIX): a number with both bounds declared is a slider over them."""
    kind = {bool: "bool", int: "int", float: "float"}.get(type(option.default), "choice" if option.choices else "text")
    choices = (lambda: option.choices) if option.choices else None
    if kind == "float" and option.least is not None and option.most is not None:
        return Control(prefix + name, f"{name.replace('_', ' ')} ({owner})", "slider", option.help, minimum=option.least, maximum=option.most, step=(option.most - option.least) / 100)
    return Control(prefix + name, f"{name.replace('_', ' ')} ({owner})", kind, option.help, choices=choices)


def _option(field: str) -> DecoderOption | None:
    """The declaration behind a decoder's or a kind's option's control, None for a GenerationConfig field."""
    for prefix, declared, what in ((OPTION_PREFIX, decoder_options, "decoder"), (KIND_OPTION_PREFIX, kind_options, "kind")):
        if field.startswith(prefix):
            found = declared().get(field[len(prefix):])
            if found is None:
                raise EngineError(f"unknown {what} setting: {field[len(prefix):]}")
            return found[1]
    return None


def sweep_setting(decoder: str) -> str:
    """The setting a sweep of this decoder varies, as the decoder declares it (an unknown one: the
    base class's)."""
    try:
        return decoder_class(decoder).sweep_setting
    except EngineError:
        return Decoder.sweep_setting


def decoder_presets(decoder: str) -> dict[str, dict[str, Any]]:
    """A decoder's named published default sets (setting -> value, e.g. the edit decoder's
    SGLang, Hugging Face / dllm and diffusers sets: engine/decoders/revising.py); {} for most decoders."""
    try:
        return dict(getattr(decoder_class(decoder), "presets", {}))
    except EngineError:
        return {}


def preset_controls(decoder: str, preset: str) -> dict[str, Any]:
    """Control field -> value for `decoder`'s preset `preset`, as the engine applies it
    (engine.decoders.revising.apply_preset: config fields by name, the decoder's own options inside
    `decoder_options`); EngineError (one line) for a preset the decoder lacks."""
    config = apply_preset(GenerationConfig(decoder=decoder), preset)
    options = decoder_class(decoder).options
    fields = {OPTION_PREFIX + name if name in options else name for name in decoder_presets(decoder)[preset]}
    return {c.field: control_value(c, config) for c in all_controls() if c.field in fields}


def numeric_fields() -> list[str]:
    """Settings a sweep can vary: the numeric ones, decoders' and kinds' own options included
    (`decoder_options.edit_threshold`, `kind_options.verify_threshold`)."""
    hints = _hints()
    options = [prefix + name for prefix, declared in ((KIND_OPTION_PREFIX, kind_options()), (OPTION_PREFIX, decoder_options())) for name, (_, option) in declared.items() if type(option.default) in (int, float)]
    return [f.name for f in dataclasses.fields(GenerationConfig) if _base_type(hints[f.name]) in (int, float)] + options


def decoder_fields(decoder: str) -> set[str]:
    """The settings a decoder reads, as it declares them (engine/decoders/), its own options
    included; all for an unknown one."""
    try:
        cls = decoder_class(decoder)
        return set(cls.settings) | {OPTION_PREFIX + name for name in cls.options}
    except EngineError:
        return {c.field for c in dict(SECTIONS)["Decoder"]}


def decoder_settings() -> tuple[str, ...]:
    """The page's settings that belong to a decoder (each shown only with a decoder that reads
    it): the Decoder section's, built-in decoders' own options included, then the plug-ins'."""
    return tuple(c.field for title, ctrls in sections() if title in ("Decoder", PLUGIN_SECTION) for c in ctrls if c.field != "decoder")


OTHER_SECTION = "Other engine settings"


@functools.cache  # the fields are fixed; resolving their hints costs about 0.4 ms, and every setting a check coerces asked again
def _hints() -> dict[str, Any]:
    return typing.get_type_hints(GenerationConfig)


def _base_type(hint: Any) -> type:
    """`int | None` -> int; plain and generic types as they are."""
    if type(None) not in typing.get_args(hint):
        return hint
    return next(t for t in typing.get_args(hint) if t is not type(None))


def sections() -> list[tuple[str, tuple[Control, ...]]]:
    """The hand-made sections (fields and options the engine no longer has dropped), then one
    automatic control per GenerationConfig field and per decoder option that has none."""
    hints = _hints()
    declared = decoder_options()
    known = {f.name for f in dataclasses.fields(GenerationConfig)} | set(PAGE_FIELDS) | {OPTION_PREFIX + name for name in declared}
    out = [(title, tuple(c for c in ctrls if c.field in known)) for title, ctrls in SECTIONS]
    # each kind's own options with the kind (shown for the kind that declares them)
    kinds = tuple(_option_control(KIND_OPTION_PREFIX, name, kind, option) for name, (kind, option) in kind_options().items())
    out = [(title, ctrls + kinds if title == KIND_SECTION else ctrls) for title, ctrls in out]
    covered = {f for _, ctrls in out for c in ctrls for f in config_fields(c)}
    other = []
    for f in dataclasses.fields(GenerationConfig):
        if f.name in covered or f.name in ("decoder_options", "kind_options"):  # options: one control each
            continue
        base = _base_type(hints[f.name])
        kind = {bool: "bool", int: "int", float: "float"}.get(base, "text")
        optional = base is not hints[f.name]
        other.append(Control(f.name, f.name.replace("_", " ") + (" (0 = off)" if optional and kind == "int" else ""), kind, setting_help(f.name), none_as_zero=optional and kind == "int"))
    if other:
        out.append((OTHER_SECTION, tuple(other)))
    # a built-in decoder's own options sit with the decoder (shown when it is chosen); the
    # plug-ins' in a section of their own
    made = {c.field for _, ctrls in out for c in ctrls}
    options = [(is_builtin(decoder), _option_control(OPTION_PREFIX, name, decoder, option)) for name, (decoder, option) in declared.items() if OPTION_PREFIX + name not in made]
    out = [(title, ctrls + tuple(c for builtin, c in options if builtin) if title == "Decoder" else ctrls) for title, ctrls in out]
    plugins = tuple(c for builtin, c in options if not builtin)
    if plugins:
        out.append((PLUGIN_SECTION, plugins))
    return out


def all_controls() -> list[Control]:
    return [c for _, ctrls in sections() for c in ctrls]


def config_fields(control: Control) -> set[str]:
    """The GenerationConfig fields a control sets (a decoder's option's: `decoder_options`; a kind's: `kind_options`)."""
    return set(CONSTRAINT_FIELDS) if control.field in PAGE_FIELDS else {control.field.split(".", 1)[0]}


def control_value(control: Control, config: GenerationConfig) -> Any:
    """The control's initial value from a config (None shown as 0 for optional ints)."""
    if control.field in PAGE_FIELDS:
        spec = spec_of(config)
        if control.field == CONSTRAINT:
            return spec.kind if spec is not None else NO_CONSTRAINT
        if spec is None:
            return ""
        return {"regex": lambda v: v, "json_schema": lambda v: json.dumps(v, indent=1), "choice": "\n".join}[spec.kind](spec.value)
    option = _option(control.field)
    if option is not None:
        field, name = control.field.split(".", 1)
        return getattr(config, field).get(name, option.default)
    value = getattr(config, control.field)
    if control.field == "kind":
        return value or OWN_KIND[1]
    return 0 if value is None and control.none_as_zero else value


def coerce(field: str, value: Any, none_as_zero: bool = False) -> Any:
    """A control's or a JSON value as the type GenerationConfig declares for `field`."""
    option = _option(field)
    hints = _hints()
    if option is None and field not in hints:
        raise EngineError(f"unknown generation setting: {field}")
    hint = type(option.default) if option is not None else hints[field]
    base = _base_type(hint)
    optional = base is not hint
    # the kind control's OWN_KIND sends "": no kind chosen, as a settings JSON without one
    if value is None or (optional and none_as_zero and value == 0) or (field == "kind" and value == OWN_KIND[1]):
        if optional:
            return None
        raise EngineError(f"{field} needs a value")
    try:
        if base is bool:
            if isinstance(value, str):
                if value.lower() not in ("true", "false", "1", "0"):
                    raise ValueError(value)
                return value.lower() in ("true", "1")
            return bool(value)
        if base is int:
            number = float(value)
            if not math.isfinite(number) or number != int(number):
                raise ValueError(value)
            return int(number)
        if base is float:
            number = float(value)
            if not math.isfinite(number):
                raise ValueError(value)
            return number
        if (typing.get_origin(base) or base) in (list, dict):  # a constraint's choices or schema: the engine checks them
            return value
        return str(value)
    except (TypeError, ValueError, OverflowError):
        raise EngineError(f"{field}: expected a finite {base.__name__}, got {str(value)[:40]!r}") from None


def build_config(config: dict[str, Any] | None, validate: bool = True) -> GenerationConfig:
    """A GenerationConfig from a (partial) settings dict, each value of its field's type, validated
    unless the caller fits it next (engine.kinds.fit validates); EngineError if anything is off."""
    if config is None:
        config = {}
    if not isinstance(config, dict):
        raise EngineError(f"settings 'config' must be an object, got {type(config).__name__}")
    config = constraint_setting(config)
    known = {f.name for f in dataclasses.fields(GenerationConfig)}
    unknown = sorted(k for k in set(config) - known - set(MOVED_SETTINGS) - set(MOVED_KIND_SETTINGS) if not k.startswith((OPTION_PREFIX, KIND_OPTION_PREFIX)))
    if unknown:
        raise EngineError(f"unknown generation setting(s): {', '.join(unknown)}")
    typed = {k: coerce(k, v) for k, v in config.items() if k in known and k not in ("decoder_options", "kind_options")}
    # a settings JSON of before the move names a decoder's or a kind's option as a field: the engine lifts it
    typed |= {k: v for k, v in config.items() if k in MOVED_SETTINGS or k in MOVED_KIND_SETTINGS}
    options, kinds = config.get("decoder_options") or {}, config.get("kind_options") or {}
    for name, given in (("decoder_options", options), ("kind_options", kinds)):
        if not isinstance(given, dict):
            raise EngineError(f"{name} must be an object, got {type(given).__name__}")
    # The page sends every plug-in's and every kind's controls; the run keeps those its decoder and
    # its kind declare (all the kinds' for the model's own kind: fit keeps that kind's).
    mine = decoder_fields(str(typed.get("decoder", GenerationConfig.decoder)))
    options = {**options, **{k[len(OPTION_PREFIX):]: coerce(k, v) for k, v in config.items() if k.startswith(OPTION_PREFIX) and k in mine}}
    kind = KINDS.get(str(typed.get("kind")))
    kinds = {**kinds, **{k[len(KIND_OPTION_PREFIX):]: coerce(k, v) for k, v in config.items() if k.startswith(KIND_OPTION_PREFIX) and (kind is None or k[len(KIND_OPTION_PREFIX):] in kind.settings.options)}}
    return GenerationConfig.from_dict({**typed, "decoder_options": options, "kind_options": kinds}, validate)


def constraint_setting(config: dict[str, Any]) -> dict[str, Any]:
    """`config` with the page's constraint (`constraint`: a mode of CONSTRAINT_MODES, and
    `constraint_text`) as the GenerationConfig field it names; the engine checks the rest. A mode
    chosen with an empty box is refused: the user meant a constraint, and an empty field is none."""
    mode, text = config.get(CONSTRAINT, NO_CONSTRAINT) or NO_CONSTRAINT, config.get(CONSTRAINT_TEXT) or ""
    rest = {k: v for k, v in config.items() if k not in PAGE_FIELDS}
    if mode == NO_CONSTRAINT:
        return rest
    if mode not in CONSTRAINT_WHAT:
        raise EngineError(f"constraint: unknown mode {str(mode)[:40]!r}; choose {', '.join(value for _, value in CONSTRAINT_MODES)}")
    if not isinstance(text, str):
        raise EngineError(f"constraint_text must be a text, got {type(text).__name__}")
    if not text.strip():
        raise EngineError(f"constraint {mode} chosen and its box is empty: type {CONSTRAINT_WHAT[mode]}, or choose none")
    if rest.get(mode) not in (None, "", []):
        raise EngineError(f"the constraint is given twice: by 'constraint' and by '{mode}'")
    rest[mode] = [line for line in text.splitlines() if line] if mode == "choice" else text
    return rest


def build_spec(model: dict[str, Any] | None, default: ModelSpec, resolve: Callable[[str], tuple[str, str]] | None = None) -> ModelSpec:
    """The model a run asks for; fields left out are the app's default."""
    model = model or {}
    if not isinstance(model, dict):
        raise EngineError(f"settings 'model' must be an object, got {type(model).__name__}")
    path, label = (resolve or (lambda p: (p, "")))(str(model.get("path") or default.path).strip())
    device = str(model.get("device") or default.device)
    dtype = str(model.get("dtype") or default.dtype)
    if dtype not in DTYPES:
        raise EngineError(f"unknown dtype '{dtype}'; choose from {', '.join(DTYPES)}")
    try:
        checked_device(device)
    except argparse.ArgumentTypeError as exc:
        raise EngineError(f"device {exc}") from None
    offered = {o.name: o for o in offered_options(device)}
    options = []
    for key, value in sorted((k, v) for k, v in model.items() if k not in ("path", "device", "dtype")):
        if key not in offered:
            raise EngineError(f"unknown model setting '{key}'; known: path, device, dtype, {', '.join(offered)}")
        offered[key].declared.check(value)  # tp_size -1 is refused, not taken for "off"
        if offered[key].declared.is_set(value):
            if not offered[key].available:
                raise EngineError(f"{offered[key].label} is unavailable: {offered[key].reason}")
            options.append((key, value))
    return ModelSpec(path, device, dtype, tuple(options), label=label)


def parse_settings(
    settings: dict[str, Any] | None, default: ModelSpec, resolve: Callable[[str], tuple[str, str]] | None = None, validate: bool = True
) -> tuple[ModelSpec, GenerationConfig]:
    """Both halves of a run's settings JSON, checked (the config `validate`d unless the caller fits
    it next: build_config); `resolve` (EngineHost.resolve) maps and checks the model path."""
    settings = settings or {}
    if not isinstance(settings, dict):
        raise EngineError("settings must be a JSON object with 'model' and 'config'")
    unknown = sorted(set(settings) - {"model", "config"})
    if unknown:
        raise EngineError(f"unknown settings key(s): {', '.join(unknown)} (expected 'model' and 'config')")
    return build_spec(settings.get("model"), default, resolve), build_config(settings.get("config"), validate)


def without_hidden(config: GenerationConfig) -> GenerationConfig:
    """`config` with every setting whose control the page hides for its decoder, cache mode and
    features (`visible_fields`) back at the engine's default: a hidden control's value never
    reaches the engine (measure staleness ticked under cache dual, then cache none chosen: every
    later run would otherwise still probe staleness and draw its heatmaps). The decoder's and the
    kind's own options whose controls are hidden go too."""
    shown = visible_fields(config.decoder, config.cache, config.smoothing, config.unroll, config.kind)
    controlled = {c.field for c in all_controls()}  # once: all_controls builds every section
    defaults = GenerationConfig()
    reset = {f.name: getattr(defaults, f.name) for f in dataclasses.fields(GenerationConfig) if f.name in controlled and f.name not in shown}
    options = {k: v for k, v in config.decoder_options.items() if OPTION_PREFIX + k in shown or OPTION_PREFIX + k not in controlled}
    kinds = {k: v for k, v in config.kind_options.items() if KIND_OPTION_PREFIX + k in shown or KIND_OPTION_PREFIX + k not in controlled}
    changed = reset or options != config.decoder_options or kinds != config.kind_options
    return dataclasses.replace(config, **reset, decoder_options=options, kind_options=kinds) if changed else config


def visible_fields(decoder: str, cache: str, smoothing: bool, unroll: bool, kind: str | None = None) -> set[str]:
    """The fields whose controls matter for this combination (the others are hidden): the settings
    a run of it reads, as the engine says (engine/settings_read.py), and the switches that choose
    them (kind, decoder, cache, smoothing, unroll) always, but the decoder for a kind that takes
    none. An unknown decoder shows every decoder's."""
    read = settings_read(GenerationConfig(kind=kind, decoder=decoder, cache=cache, smoothing=smoothing, unroll=unroll))
    shown = read | (set(switch_settings()) - ({"decoder"} - read))
    return {c.field for c in all_controls() if (config_fields(c) if c.field in PAGE_FIELDS else {c.field}) <= shown}
