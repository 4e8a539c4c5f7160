"""What a diffusion kind declares, and the one function that fits a request's config to a model.

A kind (SGLang's `DllmAlgorithm`, one file each under engine/kinds/, discovered) is a run class
(engine/run.py's `DiffusionRun`) plus a settings declaration: the GenerationConfig fields it reads
beyond those every run reads, its own settings (`options`, carried in `kind_options`), its default
decoder, the decoders it takes (or none), the system options it supports, and the models it runs
on (`DiffusionKind.refuses`). The request chooses the kind (`GenerationConfig.kind`; none: the
model's own). Decoders say which kind they decode for (`Decoder.kind`). `fit` is what the CLI, the
Python API, the server and the app all call before a run: it resolves the run's kind, refuses a
kind the model cannot run in one line, checks the kind's own settings, and refuses a setting the
kind does not read, set away from its default, in one line naming it. Every reader of "which kind
runs" reads the fitted config's `kind` (`run_kind`), never the model's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

from ..config import GenerationConfig
from ..constraints import CONSTRAINT_FIELDS
from ..errors import EngineError
from ..registry import KIND_OPTION_PREFIX, DecoderOption, decoder_class, decoder_names

# What every kind reads: the canvas, the decoder and its own options (but a kind that takes no
# decoder: DECODER_SETTINGS), its own options, the seed, stopping, the prompt's wrapping, the
# answer's constraint (the run skeleton applies it: engine/constraints/).
DECODER_SETTINGS = frozenset({"decoder", "decoder_options"})
SHARED_SETTINGS = frozenset({"kind", "gen_length", "block_length", *DECODER_SETTINGS, "kind_options", "seed", "early_stop", "use_chat_template", *CONSTRAINT_FIELDS})
_DEFAULTS = GenerationConfig()


@dataclass(frozen=True)
class KindSettings:
    """A kind's settings declaration.

    `reads`: GenerationConfig fields it reads besides SHARED_SETTINGS; `options`: its own
    settings, declared here once (name -> `DecoderOption`: default, help, choices, range), carried
    in `GenerationConfig.kind_options` and read with `DiffusionKind.option`: the CLI's flags, the
    page's controls, the tuner's space and `fit`'s checks come from them; `default_decoder`: the
    decoder a model of this kind runs when the request names the engine's default decoder;
    `system_options`: the Engine options (engine/system_options.py) it runs with; `shares_batches`:
    whether the server may decode requests of equal prompt length as rows of one batch (each row's
    records are then its solo run's: engine/serving/batcher.py; continuous batching runs each
    request as its own run, whatever its kind: engine/serving/scheduler.py); `fit_canvas`: the config for a
    checkpoint trained on canvases of one length (None: any block length); `decoders`: the kind
    whose decoders it runs ("": its own; the speculative kind drafts with masked decoders; None: it
    takes no decoder, so `decoder` and `decoder_options` are refused away from their defaults and
    its run builds none)."""

    reads: frozenset[str] = frozenset()
    default_decoder: str = GenerationConfig.decoder
    system_options: frozenset[str] = frozenset()
    shares_batches: bool = True
    fit_canvas: Callable[[GenerationConfig, int, bool], GenerationConfig] | None = None
    decoders: str | None = ""
    options: dict[str, DecoderOption] = dataclasses.field(default_factory=dict)


@dataclass(frozen=True)
class ModelTraits:
    """What `fit` reads of a model: its own kind, whether its attention is block-causal, and the
    canvas a uniform-state checkpoint was trained on; and what the attention's checks read
    (engine/cache.py `check_attention`): whether its forward takes WINO's shadow block, and its
    family's name. A loaded model, a skeleton or a model class read from a folder's config.json all
    give them (`of`)."""

    diffusion_kind: str
    block_causal: bool = False
    canvas_length: int | None = None
    takes_shadow_block: bool = False
    family: str = dataclasses.field(default="", compare=False)  # for messages only

    @classmethod
    def of(cls, model: Any) -> "ModelTraits":
        if isinstance(model, ModelTraits):
            return model
        canvas = getattr(model, "canvas_length", None)
        return cls(
            model.diffusion_kind, bool(model.block_causal), canvas if isinstance(canvas, int) and not isinstance(canvas, bool) else None,
            bool(getattr(model, "takes_shadow_block", False)), type(model).__name__,
        )


class DiffusionKind:
    """A kind: its name, its run class (a `DiffusionRun`), its settings declaration, and the
    models it runs on."""

    name: ClassVar[str] = ""
    settings: ClassVar[KindSettings]
    run: ClassVar[type]
    # one line for the page and the CLI's help: what the kind does
    summary: ClassVar[str] = ""

    @classmethod
    def refuses(cls, model: ModelTraits) -> str | None:
        """Why a run of this kind cannot run on `model`, in words (None: it can). By default a kind
        runs on the models whose own kind it is."""
        return None if model.diffusion_kind == cls.name else f"this model is {model.diffusion_kind} diffusion"

    @classmethod
    def decoder_kind(cls) -> str | None:
        """The kind whose decoders a run of this kind takes (None: it takes no decoder)."""
        return None if cls.settings.decoders is None else cls.settings.decoders or cls.name

    @classmethod
    def option(cls, config: GenerationConfig, name: str) -> Any:
        """The value of this kind's own setting `name` in `config`: the one given, else its declared default."""
        return config.kind_options.get(name, cls.settings.options[name].default)

    @classmethod
    def check(cls, config: GenerationConfig) -> None:
        """Refuse, in one line, a fitted config this kind cannot run (beyond its settings)."""


KINDS: dict[str, type[DiffusionKind]] = {}


def register_kind(cls: type[DiffusionKind]) -> type[DiffusionKind]:
    """Class decorator: a request whose kind is `cls.name` (or a model whose own kind it is) runs
    through `cls.run`."""
    KINDS[cls.name] = cls
    return cls


def kind_named(name: str) -> type[DiffusionKind]:
    if name not in KINDS:
        raise EngineError(f"no diffusion kind {name!r}; known: {', '.join(KINDS)}")
    return KINDS[name]


def run_kind(config: GenerationConfig, model: Any) -> type[DiffusionKind]:
    """The kind a run of `config` on `model` runs: the request's, else the model's own; EngineError
    in one line when the model cannot run it."""
    traits = ModelTraits.of(model)
    kind = kind_named(config.kind or traits.diffusion_kind)
    why = kind.refuses(traits)
    if why is not None:
        raise EngineError(f"kind '{kind.name}' cannot run on this model: {why}")
    return kind


def kind_options() -> dict[str, tuple[str, DecoderOption]]:
    """Every kind's own settings: option name -> (the first kind that declares it, the declaration)."""
    found: dict[str, tuple[str, DecoderOption]] = {}
    for name, kind in KINDS.items():
        for option, spec in kind.settings.options.items():
            found.setdefault(option, (name, spec))
    return found


def kinds_described() -> str:
    """The discovered kinds with their summaries, in words (the CLI's help of --kind)."""
    return "; ".join(f"{name}: {kind.summary}" if kind.summary else name for name, kind in KINDS.items())


def decoder_kind(decoder: str) -> str:
    """The kind a registered decoder decodes for ("masked" unless it declares another)."""
    return getattr(decoder_class(decoder), "kind", "masked")


def kind_decoders(kind: str | None) -> list[str]:
    """The registered decoders (plug-ins included) that run on models of `kind` (None: none)."""
    return [name for name in decoder_names() if decoder_kind(name) == kind]


def kind_reads(kind: str) -> frozenset[str]:
    """The settings a run of `kind` may read: SHARED_SETTINGS (but the decoder's where it takes
    none), its `reads`, and `kind_options.<name>` for each of its options (the kind level of
    engine/settings_read.py, which `fit` checks)."""
    cls = kind_named(kind)
    shared = SHARED_SETTINGS - (DECODER_SETTINGS if cls.decoder_kind() is None else frozenset())
    return shared | cls.settings.reads | {KIND_OPTION_PREFIX + name for name in cls.settings.options}


def ignored_settings(config: GenerationConfig, kind: str) -> list[str]:
    """The settings `config` sets away from their defaults that a run of `kind` would not read
    (the kind level only: a setting the chosen decoder does not read is accepted)."""
    reads = kind_reads(kind)
    return [f.name for f in dataclasses.fields(GenerationConfig) if f.name not in reads and getattr(config, f.name) != getattr(_DEFAULTS, f.name)]


def fit(config: GenerationConfig, model: Any, *, carry_over: bool = False) -> GenerationConfig:
    """`config` as `model` (a model, a skeleton or its `ModelTraits`) runs it, its `kind` resolved
    (`run_kind`: the request's, else the model's own).

    The engine's default decoder becomes the kind's own; the kind's canvas rule applies (a
    uniform-state checkpoint denoises canvases of the length it was trained with); the kind's own
    options are checked as declared (`_fit_kind_options`). Strict (the default: the CLI, the API,
    the server): a decoder of another kind (any decoder, for a kind that takes none), another
    kind's option, or a setting the kind does not read set away from its default, is refused in one
    line naming it. `carry_over` (a page
    whose settings were chosen for another model, as Compare's two sides or a lesson step): those
    go back to their defaults instead, and any decoder of another kind becomes the kind's own
    (keeping the options both declare). A kind the request names is never carried over: the model
    runs it or refuses it in one line."""
    traits = ModelTraits.of(model)
    kind_cls = run_kind(config, traits)
    kind, spec, runs = kind_cls.name, kind_cls.settings, "run" if config.kind else "model"
    config = _fit_kind_options(config, kind_cls, carry_over)
    if kind_cls.decoder_kind() is None:  # it takes none: the defaults stand, which its run never reads
        if not carry_over and (config.decoder != _DEFAULTS.decoder or config.decoder_options):
            raise EngineError(f"{kind} diffusion takes no decoder: leave decoder ({config.decoder!r}) and decoder_options out")
        config = dataclasses.replace(config, decoder=_DEFAULTS.decoder, decoder_options={})
    elif decoder_kind(config.decoder) != kind_cls.decoder_kind():
        if not carry_over and config.decoder != _DEFAULTS.decoder:
            raise EngineError(
                f"decoder '{config.decoder}' runs {decoder_kind(config.decoder)} diffusion and this {runs} is {kind} diffusion; "
                f"its decoders: {', '.join(kind_decoders(kind_cls.decoder_kind()))}"
            )
        declared = decoder_class(spec.default_decoder).options
        shared = {k: v for k, v in config.decoder_options.items() if k in declared}
        config = dataclasses.replace(config, decoder=spec.default_decoder, decoder_options=shared)
    ignored = ignored_settings(config, kind)
    if {"suffix", "template"} & set(ignored) and not carry_over:  # say why, and which kinds do
        fillers = ", ".join(k for k in KINDS if "suffix" in kind_reads(k))
        raise EngineError(f"{kind} diffusion fills no holes: text pinned in the answer (suffix, template) needs a kind that writes only masked positions and keeps the rest ({fillers})")
    if ignored and not carry_over:
        names = ", ".join(f"{name} ({getattr(config, name)!r}; default {getattr(_DEFAULTS, name)!r})" for name in ignored)
        raise EngineError(f"{kind} diffusion does not read {names}: leave {'it' if len(ignored) == 1 else 'them'} at the default")
    config = dataclasses.replace(config, **{name: getattr(_DEFAULTS, name) for name in ignored})
    if spec.fit_canvas is not None and traits.canvas_length:
        config = spec.fit_canvas(config, traits.canvas_length, carry_over)
    kind_cls.check(config)
    config = config.validate()
    why = decoder_class(config.decoder).refuses(config)  # a rule between settings (wino's cache, uniform's temperatures)
    if why is not None:
        raise EngineError(why)
    return config


def _fit_kind_options(config: GenerationConfig, kind_cls: type[DiffusionKind], carry_over: bool) -> GenerationConfig:
    """`config` with its `kind_options` checked against the run's kind's declarations (type, choices,
    range: EngineError in one line). An option the kind does not declare is refused in one line
    naming the kind that has it, unless it is at that kind's default (an old config's dump listed
    `verify` for every run) or the settings are carried over: then it is dropped."""
    declared, owners = kind_cls.settings.options, kind_options()
    foreign = {name: value for name, value in config.kind_options.items() if name not in declared}
    refused = [name for name, value in foreign.items() if name not in owners or value != owners[name][1].default]
    if refused and not carry_over:
        name = refused[0]
        where = f"a setting of the {owners[name][0]} kind" if name in owners else "no kind has it"
        theirs = f"; its settings: {', '.join(declared)}" if declared else ""
        raise EngineError(f"{kind_cls.name} diffusion does not read {name} ({config.kind_options[name]!r}; {where}){theirs}: leave it out")
    for name, value in config.kind_options.items():
        if name in declared:
            declared[name].check(name, value, f"{kind_cls.name} kind")
    return dataclasses.replace(config, kind_options={k: v for k, v in config.kind_options.items() if k in declared}) if foreign else config


def check_system_options(kind: str, options: dict[str, object]) -> None:
    """Refuse, in one line, an Engine option set on (not off) that the kind does not run with."""
    supported = kind_named(kind).settings.system_options
    unsupported = sorted(name for name, on in options.items() if on and name not in supported)
    if unsupported:
        raise EngineError(f"{kind} diffusion does not run with {', '.join(unsupported)}; it supports {', '.join(sorted(supported)) or 'none'}")
