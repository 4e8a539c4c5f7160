"""The engines the app has loaded, and the one lock that every use of them takes (the
concurrency rule: docs/app.md §10). Every run, compare, sweep and model load holds
`EngineHost.lock` for its whole duration; each session names its own model, so one session loading
another model never changes what another session's next run uses.

Embedded models: every folder under assets/ with a config.json (tiny-llada, and its continuations
tiny-llada-td, tiny-llada-edit and tiny-llada-infill) can be named by its folder name, in public
mode too; Compare and the threshold sweep set one against another (`second_model`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import torch

from engine import Engine, EngineError
from engine.cli import DEFAULT_MODEL
from engine.cli import DTYPES as CLI_DTYPES
from engine.cli import set_cpu_threads
from engine.kinds import ModelTraits
from engine.models import DiffusionLM, model_skeleton
from engine.models.loader import embedded_models, model_class, read_config
from engine.pipeline import load_tokenizer

# "auto": the engine's default (float32 on CPU, bfloat16 on accelerators), then the CLI's dtypes
DTYPES: dict[str, torch.dtype | None] = {"auto": None, **CLI_DTYPES}

DISTILLED = "tiny-llada-td"
MAX_MODEL_NAME = 1_024  # characters in a model box: a folder path, a hub id or an embedded model's name
EDITING = "tiny-llada-edit"  # trained with LLaDA2.1's mixed objective for the edit decoder (tinymodel/edit.py)
UNIFORM_STATE = "tiny-gemma"  # a DiffusionGemma: uniform-state diffusion (tinymodel/uniform.py)
INFILLING = "tiny-llada-infill"  # tiny-llada continued with span masking: fills holes before pinned text (tinymodel/span.py)
# What a shipped model's folder name does not say, shown beside it wherever a visitor picks a model
EMBEDDED_NOTES = {
    DISTILLED: "trajectory-distilled", EDITING: "trained to edit", INFILLING: "trained to fill holes", UNIFORM_STATE: "uniform-state, DiffusionGemma",
}


def model_title(name: str) -> str:
    """A model's name with its note, e.g. 'tiny-llada-td (trajectory-distilled)'."""
    note = EMBEDDED_NOTES.get(name)
    return f"{name} ({note})" if note else name


@dataclass(frozen=True)
class ModelSpec:
    """What to load: a folder or hub id, a device, a dtype name, and extra Engine options."""

    path: str
    device: str = "cpu"
    dtype: str = "auto"
    options: tuple[tuple[str, object], ...] = field(default_factory=tuple)
    label: str = field(default="", compare=False)  # what the page shows instead of the path (public mode)

    def describe(self) -> str:
        extra = "".join(f", {k}={v}" for k, v in self.options)
        return f"{self.label or self.path} on {self.device} ({self.dtype}{extra})"


def load_engine(spec: ModelSpec) -> Engine:
    if spec.dtype not in DTYPES:
        raise EngineError(f"unknown dtype '{spec.dtype}'; choose from {', '.join(DTYPES)}")
    return Engine(spec.path, device=spec.device, dtype=DTYPES[spec.dtype], **dict(spec.options))


class EngineHost:
    """Loaded engines by spec: the default one stays, plus at most `keep_others` more (LRU), so a
    session trying an 8B model does not evict the embedded one, and two 8B models never coexist."""

    def __init__(
        self,
        default: ModelSpec,
        load: Callable[[ModelSpec], Engine] = load_engine,
        keep_others: int = 1,
        allowed: dict[str, str] | None = None,
        threads: int | None = None,
        embedded: dict[str, str] | None = None,
    ) -> None:
        """`allowed` (public mode): the only models a visitor may load, name -> folder; visitors see
        and type the names, never a path. None: any folder or hub id (a private, local app).
        `threads`: torch CPU threads for every run (--threads); None: by model size, per run
        (engine/cli.py: cpu_threads_for), so the embedded model and an 8B one each get theirs.
        `embedded`: models a visitor may name in either mode, name -> folder; None: those shipped
        under assets/ (`embedded_models`). Public mode allows them too: they are small and part of
        the app; an allow-list name or folder given explicitly keeps its name."""
        self.embedded = embedded_models() if embedded is None else embedded
        if allowed is not None:
            allowed = {**allowed, **{n: f for n, f in self.embedded.items() if n not in allowed and f not in allowed.values()}}
        self.allowed = allowed
        self.threads = threads
        if allowed is not None:
            default = replace(default, label=self.label_of(default.path))
        self.default = default
        self.lock = threading.Lock()
        self._load = load
        self._keep_others = keep_others
        self._engines: OrderedDict[ModelSpec, Engine] = OrderedDict()
        self.default_error: str | None = None  # why the default model could not be loaded
        self._readers: dict[str, tuple[DiffusionLM, Any]] = {}  # reader's (skeleton, tokenizer) of a model not loaded

    @property
    def public(self) -> bool:
        return self.allowed is not None

    def label_of(self, path: str) -> str:
        """The name a visitor sees for a model folder: its allow-list name in public mode; else an
        embedded model's name, or the path itself."""
        if self.allowed is None:
            return next((name for name, folder in self.embedded.items() if folder == path), path)
        return next((name for name, folder in self.allowed.items() if folder == path), Path(path).name)

    def name_of(self, spec: ModelSpec) -> str:
        """A model's name and note as labels show it: 'tiny-llada-td (trajectory-distilled)'."""
        return model_title(spec.label or self.label_of(spec.path))

    def model_choices(self) -> list[tuple[str, str]]:
        """(title, name) of each model a visitor can pick by name: the allow-list in public mode,
        else the embedded models and the default model."""
        names = list(self.allowed) if self.allowed is not None else list(dict.fromkeys([*self.embedded, self.label_of(self.default.path)]))
        return [(model_title(name), name) for name in names]

    def resolve(self, path: str) -> tuple[str, str]:
        """(folder or hub id to load, label to show) for what a visitor typed; EngineError for a
        model outside the allow-list (public mode), before anything is read or downloaded. An
        embedded model's name is its folder in either mode (it wins over a hub id of that name).
        A name no file system takes (longer than MAX_MODEL_NAME, or a part over 255 bytes) is
        refused here: every later look at it was an OSError."""
        if len(path) > MAX_MODEL_NAME or any(len(part.encode()) > 255 for part in path.split("/")):
            raise EngineError(f"the model name is {len(path):,} characters long (a folder, a hub id or an embedded model's name; at most {MAX_MODEL_NAME:,}, each part of a path at most 255 bytes)")
        if self.allowed is None:
            return (self.embedded[path], path) if path in self.embedded else (path, "")
        if path in self.allowed:
            return self.allowed[path], path
        if path in self.allowed.values():
            return path, self.label_of(path)
        raise EngineError(f"this server loads only these models: {', '.join(self.allowed)}")

    def second_model(self, spec: ModelSpec, name: str | None) -> ModelSpec | None:
        """`spec` (device, dtype, options) on the model `name` names, to set against `spec`'s own
        (Compare's model B, the sweep's second model); None when no name is given. EngineError for a
        model outside the allow-list, or for `spec`'s own model: that comparison would show nothing."""
        name = (name or "").strip()
        if not name:
            return None
        path, label = self.resolve(name)
        if path == spec.path:
            raise EngineError(f"{self.name_of(spec)} is already the run's model: choose a different second model")
        return replace(spec, path=path, label=label)

    def model_kind(self, spec: ModelSpec) -> ModelTraits:
        """What the engine's `fit` reads of `spec`'s model (its own kind, block-causal attention,
        canvas length): a loaded engine's, else read from a local folder's config.json (no weights
        loaded); masked diffusion for a hub id not loaded (the engine refuses a wrong decoder or
        kind in one line when it loads)."""
        engine = self._engines.get(spec)
        if engine is not None:
            return ModelTraits.of(engine.model)
        if not Path(spec.path).is_dir():
            return ModelTraits("masked")
        try:
            config = read_config(Path(spec.path))
            cls = model_class(config)
        except EngineError:
            return ModelTraits("masked")  # loading will say what is wrong with the folder
        canvas = config.get("canvas_length")
        return ModelTraits(cls.diffusion_kind, bool(cls.block_causal), canvas if isinstance(canvas, int) and not isinstance(canvas, bool) else None, cls.takes_shadow_block, cls.__name__)

    def reader(self, spec: ModelSpec) -> tuple[DiffusionLM, Any] | None:
        """(model, tokenizer) that answer the engine's checks of a request before Run
        (engine/pipeline.py: check_request, encode_prompt), so the page refuses what the engine
        would: a loaded engine's (no lock: the checks read the config and the tokenizer only),
        else a local folder's skeleton (config.json, no weights) and tokenizer, kept for the next
        keystroke; None for a hub id not loaded (Run checks it)."""
        engine = self._engines.get(spec)
        if engine is not None:
            return engine.model, engine.tokenizer
        if not Path(spec.path).is_dir():
            return None
        if spec.path not in self._readers:
            self._readers = {spec.path: (model_skeleton(spec.path), load_tokenizer(spec.path))}  # one: the model being typed
        return self._readers[spec.path]

    def is_loaded(self, spec: ModelSpec) -> bool:
        return spec in self._engines

    def peek(self, spec: ModelSpec) -> Engine | None:
        """The engine for `spec` if loaded (no loading, no lock needed: for the tokenizer)."""
        return self._engines.get(spec)

    def get(self, spec: ModelSpec) -> Engine:
        """The engine for `spec`, loading it if needed, with the CPU threads set for it. Call with
        `lock` held."""
        if spec in self._engines:
            self._engines.move_to_end(spec)
        else:
            others = [s for s in self._engines if s != self.default]
            while len(others) >= self._keep_others and others:
                self._engines.pop(others.pop(0)).close()  # a parallel engine's worker processes end here
            self._engines[spec] = self._load(spec)
        engine = self._engines[spec]
        if spec.device == "cpu":
            set_cpu_threads(engine.model, self.threads)
        return engine

    def preload(self) -> None:
        """Load the default model now (first run starts at once); remember why if it fails."""
        with self.lock:
            try:
                self.get(self.default)
                self.default_error = None
            except EngineError as exc:
                self.default_error = str(exc)
