"""The decoder registry: decoder names -> classes, built-ins and plug-ins, and how a decoder (or a
diffusion kind: engine/kinds/base.py `KindSettings.options`) declares a setting of its own.

A module of its own so that config.py (which checks a decoder's name and options) and the decoders
of engine/decoders/ (which register themselves and read GenerationConfig) never import each other.

Plug-in API: subclass `engine.Decoder`, set `name`, implement `step(logits, block)`, decorate with
`@register_decoder`; declare settings the config lacks in `options` (a `DecoderOption` per name)
and read them with `self.option(name)`. A decoder's file dropped into engine/decoders/ is imported
with that package; one kept elsewhere is picked up by the CLI and the app when its path (or module
name) is listed in $DINFER_VIZ_DECODERS (several separated by `os.pathsep`); see
examples/entropy_decoder.py.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import EngineError


# How a setting's type reads in an error message (GenerationConfig's fields and decoder options).
TYPE_NAMES = {int: "an integer", float: "a finite number", bool: "true or false", str: "a string"}

# A setting named "decoder_options.<name>" is a decoder's own option (`Decoder.sweep_setting`, the
# app's controls): the run's config carries it inside `decoder_options`.
OPTION_SETTING_PREFIX = "decoder_options."
# ... and one named "kind_options.<name>" a kind's own (engine/kinds/base.py `KindSettings.options`).
KIND_OPTION_PREFIX = "kind_options."


@dataclass(frozen=True)
class DecoderOption:
    """A decoder's own setting (a kind's too: one declaration, one check): its default (whose type
    is the setting's type), one line of help for the CLI and the app, and for a text setting its
    allowed values."""

    default: bool | int | float | str
    help: str
    choices: tuple[str, ...] = ()
    # the range of a number (inclusive; `above`: the least value is excluded), checked with the
    # config, so a request is refused before any weight loads or worker starts
    least: float | None = None
    most: float | None = None
    above: bool = False

    def check(self, name: str, value: Any, owner: str = "decoder") -> None:
        """EngineError in one line, naming `owner` ("decoder", "speculative kind") and the
        setting, unless `value` is of the declared type, among the choices and in the range."""
        kind = type(self.default)
        ok = isinstance(value, kind) and not (isinstance(value, bool) and kind is not bool)
        ok = ok or (kind is float and isinstance(value, int) and not isinstance(value, bool))
        # an integer past 2**53 is no float a run can hold exactly (and past 2**1024 none at all:
        # math.isfinite overflows), nor a tensor element past 2**63: a bound on size, as JSON's
        if ok and kind in (int, float) and not isinstance(value, bool) and isinstance(value, int) and abs(value) > 2**53:
            raise EngineError(f"{owner} setting {name} must be {self.range_text() if self.least is not None or self.most is not None else 'a number'} and at most 2**53 in size, got {str(value)[:40]}")
        if not ok or (kind is float and not math.isfinite(value)):
            raise EngineError(f"{owner} setting {name} must be {TYPE_NAMES[kind]}, got {str(value)[:40]!r}")
        if self.choices and value not in self.choices:
            raise EngineError(f"{owner} setting {name}: '{value}' is not one of {', '.join(self.choices)}")
        low_ok = self.least is None or (value > self.least if self.above else value >= self.least)
        if not low_ok or (self.most is not None and value > self.most):
            raise EngineError(f"{owner} setting {name} must be {self.range_text()}, got {value}")

    def range_text(self) -> str:
        """The declared range in words ("in [0, 1]", "> 0", ">= 1")."""
        if self.least is not None and self.most is not None:
            return f"in {'(' if self.above else '['}{self.least:g}, {self.most:g}]"
        if self.least is not None:
            return f"{'>' if self.above else '>='} {self.least:g}"
        return f"<= {self.most:g}" if self.most is not None else "any value"


# name -> decoder class (engine.decoders.Decoder subclasses; typed loosely to keep this module free
# of the decoders' imports)
_REGISTRY: dict[str, type] = {}


def register_decoder(cls: type) -> type:
    """Class decorator: make a decoder selectable by its `name` (CLI, app, benchmarks)."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name")
    _REGISTRY[cls.name] = cls
    return cls


PLUGIN_ENV = "DINFER_VIZ_DECODERS"
KIND_PLUGIN_ENV = "DINFER_VIZ_KINDS"  # kind files outside engine/kinds/ (engine/kinds/__init__.py loads them)
_loaded_plugins: set[str] = set()


def load_plugins(spec: str | None = None, env: str = PLUGIN_ENV, what: str = "decoder") -> None:
    """Import plug-ins so that their `@register_decoder` (or `@register_kind`) runs: `.py` paths or
    module names, separated by `os.pathsep`; by default those listed in `env` ($DINFER_VIZ_DECODERS).
    Each loads once; `what` names them in the error."""
    spec = os.environ.get(env, "") if spec is None else spec
    for item in (part.strip() for part in spec.split(os.pathsep)):
        if not item or item in _loaded_plugins:
            continue
        try:
            if item.endswith(".py"):
                module_spec = importlib.util.spec_from_file_location(f"dinfer_viz_plugin_{Path(item).stem}", item)
                if module_spec is None or module_spec.loader is None:
                    raise ImportError("not a Python file")
                module = importlib.util.module_from_spec(module_spec)
                sys.modules[module_spec.name] = module  # as `import` would (dataclasses look it up)
                module_spec.loader.exec_module(module)
            else:
                importlib.import_module(item)
        except Exception as exc:  # any failure in user code becomes one readable line
            raise EngineError(f"cannot load {what} plug-in '{item}': {exc}") from exc
        _loaded_plugins.add(item)


# The engine's own decoders register themselves as their files import (engine/decoders/, and the
# kinds' own in engine/kinds/), floors above this one: found here by name at the first question,
# as plug-ins are, since `import engine` imports nothing on its own (engine/lazy_exports.py).
_BUILTIN_PACKAGES = ("decoders", "kinds")


def _load_decoders() -> None:
    """Import the engine's own decoders, then the plug-ins $DINFER_VIZ_DECODERS lists (each once)."""
    for package in _BUILTIN_PACKAGES:
        importlib.import_module(f".{package}", __package__)
    load_plugins()


def _listed(names: list[str]) -> list[str]:
    """`names` as every list of decoders shows them: the engine's own by their `order` (ties by
    name), then plug-ins in the order they loaded, which is the order $DINFER_VIZ_DECODERS gives."""
    own = sorted((n for n in names if is_builtin(n)), key=lambda n: (_REGISTRY[n].order, n))
    return own + [n for n in names if not is_builtin(n)]


def decoder_names() -> list[str]:
    """Every registered decoder, plug-ins loaded first, in listing order (the CLI's choices, the page)."""
    _load_decoders()
    return _listed(list(_REGISTRY))


def builtin_decoder_names(kind: str = "masked") -> list[str]:
    """The decoders the engine ships (engine/decoders/, engine/kinds/), without plug-ins, for models
    of diffusion `kind` (a decoder's `kind`, "masked" unless it declares one: engine/kinds/uniform.py's
    sampler runs uniform-state models only): what the project's own samples and benchmarks cover."""
    return _listed([name for name, cls in _REGISTRY.items() if is_builtin(name) and cls.kind == kind])


def is_builtin(name: str) -> bool:
    """Whether the engine ships decoder `name` (any kind), not a plug-in."""
    return _REGISTRY[name].__module__.split(".")[0] == __name__.split(".")[0]


def decoder_class(name: str) -> type:
    """The registered decoder `name` (plug-ins loaded first); EngineError for an unknown one."""
    _load_decoders()
    if name not in _REGISTRY:
        raise EngineError(f"unknown decoder '{name}'; choose from {', '.join(_listed(list(_REGISTRY)))}")
    return _REGISTRY[name]


def decoder_options() -> dict[str, tuple[str, DecoderOption]]:
    """Every registered decoder's own settings: option name -> (the first decoder that declares it,
    the declaration); a subclass that inherits an option (a plug-in on FixedStepDecoder) does not
    take it from its built-in owner."""
    found: dict[str, tuple[str, DecoderOption]] = {}
    for name in decoder_names():
        for option, spec in decoder_class(name).options.items():
            found.setdefault(option, (name, spec))
    return found
