"""The tuner's search space, derived from the settings' declarations (docs/tuning.md §2).

What is searched by default: the settings that choose what else a run reads (the kind, the
decoder, the cache mode, the switches smoothing and unroll: engine/settings_read.py's
`switch_settings`), the block length (among the divisors of the generation length), the fields the
decoders declare they read (`Decoder.settings`: the threshold, the fixed decoder's steps), the
kinds' own options (`KindSettings.options`: the speculative kind's verify and verify_threshold),
and the chosen decoder's own options (`Decoder.options`, each within its declared range). Each is
suggested only when the run being built reads it (`settings_read`), so a kind's or a decoder's
options appear only in the trials that chose it; the kinds and cache modes the model cannot run
are left out (`DiffusionKind.refuses`, `CacheMode.block_causal`), and so is every setting none of
the kinds it can run reads (no decoder for a model whose kinds take none). Anything else (temperature, a cache mode's
windows, smoothing's weights, unroll's counts) joins with `--space NAME`. `--fix NAME=VALUE` takes
a setting out of the search; `--decoders` narrows the decoder (by default the engine's own
decoders; a plug-in decoder is searched when `--decoders` names it).

A number declared without an upper bound (a decoder option "> 0") is searched on a log scale from
a tenth to ten times its default; the few fields whose range `GenerationConfig.validate` checks
in prose rather than declares (`UNDECLARED_RANGES`) are searched over that range.
"""

from __future__ import annotations

import dataclasses
import json
import math
import typing
from dataclasses import dataclass
from typing import Any

from ..cache_modes import cache_modes
from ..config import GenerationConfig, relative_bound
from ..errors import EngineError
from ..generation import check_settings
from ..kinds.base import KINDS, ModelTraits, kind_decoders, kind_options, kind_reads
from ..registry import KIND_OPTION_PREFIX, OPTION_SETTING_PREFIX, DecoderOption, decoder_class, is_builtin
from ..settings_read import decoder_declared, settings_read, switch_settings

# The ranges `GenerationConfig.validate` states in its checks instead of the field's declaration:
# the threshold in (0, 1] (searched from 0.05, the app's slider's least: below it nearly every
# position commits at once), smoothing's weights in [0, 1].
UNDECLARED_RANGES = {"threshold": (0.05, 1.0), "cont_weight": (0.0, 1.0), "cont_weight_init": (0.0, 1.0), "cont_weight_growth": (0.0, 1.0), "threshold_decay": (0.0, 1.0)}
# the fixed-step decoders' `steps` is searched as steps per block (any count from 1 to the block
# length is valid for every block length; `steps` itself must be a multiple of the block count)
STEPS_PER_BLOCK = "steps_per_block"


@dataclass(frozen=True)
class Dimension:
    """One searched setting: a field name or `decoder_options.<name>`; categorical `choices`, or a
    number in [low, high] (`integer`, `log` scale)."""

    name: str
    choices: tuple[Any, ...] = ()
    low: float = 0.0
    high: float = 0.0
    integer: bool = False
    log: bool = False

    def describe(self) -> str:
        if self.choices:
            return f"{self.name} in {{{', '.join(map(str, self.choices))}}}"
        scale = " (log)" if self.log else ""
        return f"{self.name} in [{self.low:g}, {self.high:g}]{scale}"

    def suggest(self, trial: Any, param: str) -> Any:
        if self.choices:
            return trial.suggest_categorical(param, list(self.choices))
        if self.integer:
            return trial.suggest_int(param, int(self.low), int(self.high), log=self.log)
        return trial.suggest_float(param, self.low, self.high, log=self.log)


def _field(name: str) -> dataclasses.Field:
    fields = {f.name: f for f in dataclasses.fields(GenerationConfig)}
    if name not in fields:
        raise EngineError(f"no setting '{name}' to search or fix (a GenerationConfig field or a decoder's option)")
    return fields[name]


def _number(name: str, kind: type, default: Any, least: float | None, most: float | None, above: bool) -> Dimension:
    """A number's dimension from its declared range (module docstring: the unbounded rule)."""
    integer = kind is int
    if most is None:  # no upper bound declared: a decade either side of the default, log scale
        if not isinstance(default, (int, float)) or default <= 0:
            raise EngineError(f"{name} declares no upper bound and no positive default: give its range with --space {name}=LOW:HIGH")
        low, high = default / 10, default * 10
        if least is not None:
            low = max(low, least + (1 if integer else 0) * above)
        return Dimension(name, low=max(1, round(low)) if integer else low, high=round(high) if integer else high, integer=integer, log=True)
    low = least if least is not None else 0.0
    if above:  # an excluded least: the search starts just inside it
        low = low + 1 if integer else low + (most - low) * 1e-3
    return Dimension(name, low=low, high=most, integer=integer)


def _is_field(name: str) -> bool:
    return any(f.name == name for f in dataclasses.fields(GenerationConfig))


def _kind_option(name: str) -> DecoderOption | None:
    """The declaration of a kind's option named `name` (`kind_options.<option>` or bare), else None."""
    found = kind_options().get(name.removeprefix(KIND_OPTION_PREFIX))
    return found[1] if found is not None and (name.startswith(KIND_OPTION_PREFIX) or not _is_field(name)) else None


def _is_option(name: str) -> bool:
    """Whether `name` is a decoder's option (`decoder_options.<option>` or a bare option name)."""
    return name.startswith(OPTION_SETTING_PREFIX) or not (_is_field(name) or _kind_option(name))


def setting_key(name: str) -> str:
    """The setting `name` names: a field, `kind_options.<option>` or `decoder_options.<option>`."""
    if _is_field(name):
        return name
    return KIND_OPTION_PREFIX + name.removeprefix(KIND_OPTION_PREFIX) if _kind_option(name) else OPTION_SETTING_PREFIX + name.removeprefix(OPTION_SETTING_PREFIX)


def _option_dimension(key: str, option: DecoderOption) -> Dimension:
    """A declared option's dimension (a decoder's or a kind's): its choices, or its range."""
    if option.choices or isinstance(option.default, bool):
        return Dimension(key, choices=option.choices or (False, True))
    return _number(key, type(option.default), option.default, option.least, option.most, option.above)


def declared_dimension(name: str, base: GenerationConfig) -> Dimension:
    """The dimension of setting `name` (a field, `kind_options.<option>`, `decoder_options.<option>`
    or a bare option name) from its declaration; EngineError for a setting that cannot be searched."""
    kind_option = _kind_option(name)
    if kind_option is not None:
        return _option_dimension(setting_key(name), kind_option)
    if _is_option(name):
        option_name = name.removeprefix(OPTION_SETTING_PREFIX)
        owner = _option_owner(option_name, base.decoder)
        return _option_dimension(OPTION_SETTING_PREFIX + option_name, decoder_class(owner).options[option_name])
    field = _field(name)
    hint = typing.get_type_hints(GenerationConfig)[name]
    base_type = next((t for t in typing.get_args(hint) if t is not type(None)), hint)
    if name == "block_length":
        return Dimension(name, choices=_divisors(base.gen_length))
    if name == "steps":
        return Dimension(STEPS_PER_BLOCK, low=1, high=base.block_length, integer=True)
    if name == "kind":
        return Dimension(name, choices=tuple(KINDS))
    if name == "decoder":
        return Dimension(name, choices=tuple(n for k in KINDS for n in kind_decoders(KINDS[k].decoder_kind())))
    if name == "cache":
        return Dimension(name, choices=tuple(m.name for m in cache_modes()))
    if base_type is bool:
        return Dimension(name, choices=(False, True))
    if field.metadata.get("choices"):
        return Dimension(name, choices=tuple(field.metadata["choices"]))
    if base_type not in (int, float):
        raise EngineError(f"{name} is not a number, a switch or a choice: it cannot be searched")
    if name in UNDECLARED_RANGES:
        low, high = UNDECLARED_RANGES[name]
        return Dimension(name, low=low, high=high)
    least, most = field.metadata.get("least"), field.metadata.get("most")
    if isinstance(most, str):  # a count bounded by another length ("canvas": the prompt's too)
        if most == "canvas":
            raise EngineError(f"{name} is bounded by the canvas (the prompt's length too): give its range with --space {name}=LOW:HIGH")
        most = relative_bound(name, getattr(base, most))
    return _number(name, base_type, field.default, least, most, False)


def _option_owner(option: str, preferred: str) -> str:
    """The decoder that declares option `option` (the preferred one when it does)."""
    if option in decoder_class(preferred).options:
        return preferred
    owners = [n for k in KINDS for n in kind_decoders(KINDS[k].decoder_kind()) if option in decoder_class(n).options]
    if not owners:
        raise EngineError(f"no setting '{option}' to search or fix (a GenerationConfig field or a decoder's option)")
    return owners[0]


def parse_value(name: str, text: str, base: GenerationConfig) -> Any:
    """`text` as the value of setting `name` (its declared type); EngineError in one line."""
    if _kind_option(name) or _is_option(name):  # by its declaration: an option with no range to search can still be fixed
        option_name = setting_key(name).split(".", 1)[1]
        if _kind_option(name):
            kind, option = kind_options()[option_name]
            owner = f"{kind} kind"
        else:
            option, owner = decoder_class(_option_owner(option_name, base.decoder)).options[option_name], "decoder"
        value = _typed(name, text, type(option.default), option.choices)
        option.check(option_name, value, owner)
        return value
    dim = declared_dimension(name, base)
    if dim.name == STEPS_PER_BLOCK or name in ("steps",):
        kind: type = int
    elif dim.choices:
        return _typed(name, text, type(dim.choices[0]), dim.choices)
    else:
        kind = int if dim.integer else float
    return _typed(name, text, kind, dim.choices)


def _typed(name: str, text: str, kind: type, choices: tuple = ()) -> Any:
    """`text` as a `kind` (one of `choices` where given); EngineError in one line."""
    if choices or kind is bool:
        choices = choices or (False, True)
        matches = [c for c in choices if str(c).lower() == text.strip().lower()]
        if not matches:
            raise EngineError(f"{name} must be one of {', '.join(map(str, choices))}, got {text[:40]!r}")
        return matches[0]
    if kind is str:
        return text
    try:
        return kind(text)
    except ValueError:
        raise EngineError(f"{name} must be {'an integer' if kind is int else 'a number'}, got {text[:40]!r}") from None


def _narrowed(dim: Dimension, spec: str, base: GenerationConfig) -> Dimension:
    """`--space NAME=LOW:HIGH` (a number's range) or `NAME=A,B,C` (values) applied to `dim`."""
    if ":" in spec and not dim.choices:
        low_text, _, high_text = spec.partition(":")
        low, high = (parse_value(dim.name.removeprefix(OPTION_SETTING_PREFIX), t, base) for t in (low_text, high_text))
        if not dim.low <= low <= high <= dim.high:
            raise EngineError(f"{dim.name}: the range {spec} is not inside the declared {dim.describe().split(' in ', 1)[1]}")
        return dataclasses.replace(dim, low=low, high=high, log=dim.log and low > 0)
    values = tuple(dict.fromkeys(parse_value(dim.name.removeprefix(OPTION_SETTING_PREFIX), t, base) for t in spec.split(",") if t.strip()))
    if not values:
        raise EngineError(f"--space {dim.name}= names no value")
    if dim.choices:
        outside = [v for v in values if v not in dim.choices]
        if outside:
            raise EngineError(f"{dim.name}: {outside[0]!r} is not among its values ({', '.join(map(str, dim.choices))})")
    return Dimension(dim.name, choices=values)


def default_names() -> list[str]:
    """The settings searched by default (module docstring), in the order a trial suggests them."""
    return ["kind", "decoder", "block_length", *[s for s in switch_settings() if s not in ("kind", "decoder")], *decoder_declared(), *(KIND_OPTION_PREFIX + name for name in kind_options())]


@dataclass(frozen=True)
class SearchSpace:
    """What a study searches: the `base` config (the defaults with the fixed settings), the
    dimensions of the settings (in suggestion order) and whether each decoder's own options are
    searched (`options`: all of the chosen decoder's, unless fixed), on a model of `traits`.
    `suggest` builds one trial's config, which the engine runs: a choice the engine refuses with
    the settings chosen before it is never offered (`_choose`)."""

    base: GenerationConfig
    dimensions: tuple[Dimension, ...]
    fixed_options: frozenset[str] = frozenset()
    traits: ModelTraits = ModelTraits("masked")  # the model's own kind: a trial that picks it leaves `kind` unset
    takes_decoder: bool = True  # whether any kind the model runs takes a decoder (and its options)
    _refusals: dict[str, str | None] = dataclasses.field(default_factory=dict, compare=False, repr=False)

    def read(self, config: GenerationConfig) -> frozenset[str]:
        """What a run of `config` reads on this model (kind None: the model's own, not the kind
        its decoder decodes for)."""
        return settings_read(dataclasses.replace(config, kind=config.kind or self.traits.diffusion_kind))

    def suggest(self, trial: Any) -> GenerationConfig:
        """One trial's config: each dimension the run being built reads, suggested by `trial`."""
        config = self.base
        one_block = dataclasses.replace(config, block_length=config.gen_length)
        searched = any(d.name == "block_length" for d in self.dimensions)
        if searched and self.refusal(config) is not None and self.refusal(one_block) is None:
            config = one_block  # a searched block length (a divisor of the generation's): one block until it is chosen
        for dim in self.dimensions:
            read = self.read(config)
            if dim.name == STEPS_PER_BLOCK:
                if "steps" in read:  # at most the chosen block's length per block
                    per_block = dataclasses.replace(dim, high=min(dim.high, config.block_length)).suggest(trial, dim.name)
                    config = dataclasses.replace(config, steps=per_block * config.num_blocks())
            elif dim.name.startswith(OPTION_SETTING_PREFIX):
                continue  # with the decoder's other options, below
            elif dim.name in ("kind", "block_length") or dim.name in read:  # a kind's option by its bare name
                config = self._choose(trial, config, dim, dim.name.removeprefix(KIND_OPTION_PREFIX))
        return self._options(trial, config) if "decoder_options" in self.read(config) else config

    def refusal(self, config: GenerationConfig) -> str | None:
        """Why the engine refuses `config` on this model (`check_settings`), None if it runs it;
        remembered (a study asks the same prefixes of a config again and again)."""
        key = repr(config)
        if key not in self._refusals:
            try:
                check_settings(config, self.traits)
                self._refusals[key] = None
            except EngineError as exc:
                self._refusals[key] = str(exc)
        return self._refusals[key]

    def _set(self, config: GenerationConfig, name: str, value: Any) -> GenerationConfig:
        if name == "kind":  # the model's own kind is kind None
            return dataclasses.replace(config, kind=None if value == self.traits.diffusion_kind else value)
        return _with(config, name, value)

    def _choose(self, trial: Any, config: GenerationConfig, dim: Dimension, param: str) -> GenerationConfig:
        """`config` with `dim`'s value suggested by `trial` as `param`. A choice is offered only
        among the values the engine runs with the settings chosen before it (`check_settings`, the
        rest at their base values: the dimensions come in the order that decides what else is
        read, so a rule between two settings, such as WINO's cache modes, narrows the later one);
        a choice so narrowed is its own parameter, named by its values (Optuna keeps one set of
        values per name), and one value left is no suggestion at all."""
        if not dim.choices:
            return self._set(config, dim.name, dim.suggest(trial, param))
        refusals = {value: self.refusal(_own_options(self._set(config, dim.name, value))) for value in dim.choices}
        runs = [value for value, why in refusals.items() if why is None]
        why = next((why for why in refusals.values() if why is not None), "")
        if not runs:  # none: the base value, where that runs (a uniform-state model's block length is its canvas's)
            if self.refusal(config) is None:
                return config
            raise EngineError(f"{why} (whatever {param})")
        if len(runs) < len(dim.choices):
            dim, param = dataclasses.replace(dim, choices=tuple(runs)), f"{param} in {{{', '.join(map(str, runs))}}}"
        return self._set(config, dim.name, runs[0] if len(runs) == 1 else dim.suggest(trial, param))

    def _options(self, trial: Any, config: GenerationConfig) -> GenerationConfig:
        """The chosen decoder's options: narrowed ones by their `--space`, the rest as declared
        (each named `<decoder>.<option>` in the study: two decoders' same-named options keep
        their own ranges), two `increasing` ones searched in their order."""
        given = {d.name: d for d in self.dimensions if d.name.startswith(OPTION_SETTING_PREFIX)}
        decoder = decoder_class(config.decoder)
        config = _own_options(config)  # a fixed option applies to the decoders that declare it
        searched = {
            option: given.get(OPTION_SETTING_PREFIX + option) or declared_dimension(OPTION_SETTING_PREFIX + option, dataclasses.replace(config, decoder_options={}))
            for option in decoder.options if option not in self.fixed_options
        }
        for option, dim in searched.items():
            dim = _in_order(dim, option, decoder, config, searched)
            config = self._choose(trial, config, dim, f"{config.decoder}.{option}")
        return config

    def describe(self) -> list[str]:
        """One line per dimension (the table's header and the study's record of its space)."""
        fixed = {k: v for k, v in changed_settings(self.base).items()}
        lines = [d.describe() for d in self.dimensions]
        if self.takes_decoder:
            lines.append("each chosen decoder's own options as declared" + (f" (but {', '.join(sorted(self.fixed_options))})" if self.fixed_options else ""))
        return lines + [f"fixed: {json.dumps(fixed, sort_keys=True)}"] if fixed else lines

    def fingerprint(self) -> str:
        """What two workers must agree on to share a study (the study keeps it)."""
        return json.dumps(self.describe())


def changed_settings(config: GenerationConfig) -> dict[str, Any]:
    """The settings of `config` away from the defaults (a trial's settings, as the study stores
    them and `GenerationConfig.from_dict` takes them back)."""
    defaults = GenerationConfig().to_dict()
    return {k: v for k, v in config.to_dict().items() if v != defaults[k]}


def build_space(
    model: Any, base: GenerationConfig | None = None, decoders: list[str] | None = None, fix: dict[str, str] | None = None, space: dict[str, str] | None = None,
) -> SearchSpace:
    """The search space for `model` (a model, skeleton or ModelTraits): the declared dimensions
    (module docstring) the model can run, narrowed by `decoders`, `fix` (name -> value text) and
    `space` (name -> "" to add a setting with its declared range, "LOW:HIGH" or "A,B,C")."""
    traits = ModelTraits.of(model)
    base = base or GenerationConfig()
    fix, space = dict(fix or {}), dict(space or {})
    changes: dict[str, Any] = {}
    options: dict[str, Any] = {}
    kind_fixed: dict[str, Any] = {}
    for name, text in fix.items():  # the block length first: it bounds steps per block
        key, value = setting_key(name), parse_value(name, text, base)
        if key.startswith(KIND_OPTION_PREFIX):
            kind_fixed[key.removeprefix(KIND_OPTION_PREFIX)] = value
        elif key.startswith(OPTION_SETTING_PREFIX):
            options[key.removeprefix(OPTION_SETTING_PREFIX)] = value
        else:
            changes["steps" if key == STEPS_PER_BLOCK else key] = value
    base = dataclasses.replace(base, **changes, decoder_options={**base.decoder_options, **options}, kind_options={**base.kind_options, **kind_fixed})
    _check_fixed(base, changes, model)
    runnable = tuple(k for k in KINDS if KINDS[k].refuses(traits) is None)
    if base.kind in runnable:  # a kind fixed: only what it reads is searched (a kind without a decoder: no decoder)
        runnable = (base.kind,)
    readable = frozenset().union(*(kind_reads(k) for k in runnable))
    dims: dict[str, Dimension] = {}
    for name in [*default_names(), *[n for n in space if n not in default_names()]]:
        key = setting_key(name)
        if key in changes or key.split(".", 1)[-1] in {**options, **kind_fixed} or (key == "steps" and "steps" in changes):
            continue
        if key not in readable and not key.startswith(OPTION_SETTING_PREFIX):  # no kind this model runs reads it
            continue
        dim = declared_dimension(key, base)
        if dim.name == "kind":
            dim = Dimension("kind", choices=runnable)
        elif dim.name == "decoder":
            own = list(dict.fromkeys(n for k in runnable for n in kind_decoders(KINDS[k].decoder_kind())))
            # by default the engine's own decoders: a plug-in's options may declare no range to
            # search (a path, an unbounded count), so a plug-in joins when --decoders names it
            chosen = decoders or [n for n in own if is_builtin(n)]
            unknown = [d for d in chosen if d not in own]
            if unknown:
                raise EngineError(f"--decoders: no decoder '{unknown[0]}' for this model; its decoders: {', '.join(own)}")
            dim = Dimension("decoder", choices=tuple(chosen))
        elif dim.name == "cache":
            dim = Dimension("cache", choices=tuple(m.name for m in cache_modes() if m.block_causal or not traits.block_causal))
        if name in space and space[name]:
            dim = _narrowed(dim, space[name], base)
        if len(dim.choices) == 1:  # one value left: a fixed setting, not a search
            if dim.name.startswith(OPTION_SETTING_PREFIX):
                options[dim.name.removeprefix(OPTION_SETTING_PREFIX)] = dim.choices[0]
            if dim.name != "kind":  # the model's only kind is its own (kind None)
                base = _with(base, dim.name, dim.choices[0])
            continue
        dims[dim.name] = dim
    searched = SearchSpace(base, tuple(dims.values()), frozenset(options), traits, "decoder_options" in readable)
    try:  # one config the space can suggest: fixed settings the model refuses whatever the rest are end here, before any trial
        check_settings(searched.suggest(_FirstChoices()), traits)
    except EngineError as exc:
        raise EngineError(f"the fixed settings leave this model nothing to run: {exc}") from None
    return searched


def _check_fixed(base: GenerationConfig, changes: dict[str, Any], model: Any) -> None:
    """Refuse fixed settings out of their ranges before any trial, as a run's config is checked
    (`validate`), the block length, when searched, taken as one block (any divisor is searched),
    and the generation within the model's positions. The decoder options are left out: each was
    checked against its own declaration (`parse_value`), and a fixed option applies to the decoders
    that declare it, not necessarily the base's."""
    limit = getattr(model, "max_positions", None)
    if isinstance(limit, int) and base.gen_length >= limit:
        raise EngineError(f"gen_length must be below the model's max_sequence_length ({limit}), got {base.gen_length}")
    probe = base if "block_length" in changes else dataclasses.replace(base, block_length=base.gen_length)
    dataclasses.replace(probe, decoder_options={}).validate()


class _FirstChoices:
    """A trial that takes each dimension's first value (a choice's first, a number's least)."""

    def suggest_categorical(self, name: str, choices: list[Any]) -> Any:
        return choices[0]

    def suggest_int(self, name: str, low: int, high: int, log: bool = False) -> int:
        return low

    def suggest_float(self, name: str, low: float, high: float, log: bool = False) -> float:
        return low


def _own_options(config: GenerationConfig) -> GenerationConfig:
    """`config` with only the decoder options its decoder declares (a fixed option applies to the
    decoders that declare it)."""
    declared = decoder_class(config.decoder).options
    return dataclasses.replace(config, decoder_options={k: v for k, v in config.decoder_options.items() if k in declared})


def _in_order(dim: Dimension, option: str, decoder: type, config: GenerationConfig, searched: dict[str, Dimension]) -> Dimension:
    """`dim` (of the decoder's option `option`) within what its `increasing` pairs leave it: above
    the lesser option's value, below the greater's (a value chosen or fixed; a bound still to be
    searched: the other's range), so the pair is never suggested out of order."""
    if dim.choices:
        return dim
    low, high = dim.low, dim.high
    for lesser, greater in decoder.increasing:
        if option not in (lesser, greater):
            continue
        other = greater if option == lesser else lesser
        if other in config.decoder_options or other not in searched:  # chosen, fixed, or at its default
            bound = decoder.option_in(config, other)
        else:  # searched after this one: leave it room within its range
            bound = searched[other].high if option == lesser else searched[other].low
        if option == lesser:
            high = min(high, bound - 1 if dim.integer else math.nextafter(bound, -math.inf))
        else:
            low = max(low, bound + 1 if dim.integer else math.nextafter(bound, math.inf))
    if low > high:
        raise EngineError(f"{decoder.name}.{option}: its range [{dim.low:g}, {dim.high:g}] leaves no value in order with {', '.join(f'{a} < {b}' for a, b in decoder.increasing)}")
    return dataclasses.replace(dim, low=low, high=high) if (low, high) != (dim.low, dim.high) else dim


def _divisors(n: int) -> tuple[int, ...]:
    """The divisors of `n`, ascending (pairs up to its square root: a long generation costs no more)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return tuple(sorted({*small, *(n // d for d in small)}))


def _with(config: GenerationConfig, name: str, value: Any) -> GenerationConfig:
    """`config` with setting `name` (a field, `kind_options.<option>` or `decoder_options.<option>`) set to `value`."""
    if name.startswith(OPTION_SETTING_PREFIX):
        return dataclasses.replace(config, decoder_options={**config.decoder_options, name.removeprefix(OPTION_SETTING_PREFIX): value})
    if name.startswith(KIND_OPTION_PREFIX):
        return dataclasses.replace(config, kind_options={**config.kind_options, name.removeprefix(KIND_OPTION_PREFIX): value})
    return dataclasses.replace(config, **{name: value})
