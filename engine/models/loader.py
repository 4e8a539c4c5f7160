"""Hugging Face checkpoint folders: config.json + safetensors (single file or sharded), both ways.

No pickle anywhere: weights are read and written with safetensors only. Every failure names the
file or the tensor at fault, because a user with a 16 GB download needs to know which piece is bad.
"""

from __future__ import annotations

import json
import math
import os
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Collection

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ..errors import EngineError
from .base import DerivedTensor, DiffusionLM

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

# (family name, does this config belong to it?, class). Families register themselves on import.
_FAMILIES: list[tuple[str, Callable[[dict[str, Any]], bool], type[DiffusionLM]]] = []


def register_family(name: str, matches: Callable[[dict[str, Any]], bool], cls: type[DiffusionLM]) -> None:
    _FAMILIES.append((name, matches, cls))


def family_names() -> list[str]:
    return [name for name, _, _ in _FAMILIES]


# The models shipped with the project (assets/<name>/config.json): named by their folder's name,
# or as `assets/<name>`, from any directory, by the CLI, the Python API, the server and the app.
EMBEDDED_ROOT = Path(__file__).resolve().parents[2] / "assets"


def embedded_models(root: Path = EMBEDDED_ROOT) -> dict[str, str]:
    """The models shipped under `root`, name (the folder's) -> folder: every folder holding a config.json."""
    if not root.is_dir():
        return {}
    return {p.name: str(p) for p in sorted(root.iterdir()) if (p / "config.json").is_file()}


def embedded_folder(text: str) -> Path | None:
    """The shipped model `text` names (`tiny-llada` or `assets/tiny-llada`), else None. Checked
    after the working directory, so a folder of that name there still wins."""
    parts = Path(text).parts
    if len(parts) == 2 and parts[0] == EMBEDDED_ROOT.name:
        parts = parts[1:]
    folder = embedded_models().get(parts[0]) if len(parts) == 1 else None
    return Path(folder) if folder else None


def resolve_model_path(path: str | os.PathLike) -> Path:
    """A local folder as is; an embedded model's name; an `org/name` hub id through
    huggingface_hub (needs a network; HF_HUB_OFFLINE=1 answers from the local cache at once)."""
    text = str(path)
    shown = f"{text[:200]}{'...' if len(text) > 200 else ''}"
    try:
        local = Path(path).expanduser()
        if local.is_dir():
            return local
        exists = local.exists()
        embedded = None if exists else embedded_folder(text)
    except (OSError, ValueError) as exc:  # a name too long for the file system, a NUL byte
        raise EngineError(f"model folder not found: {shown} ({getattr(exc, 'strerror', None) or exc})") from None
    if embedded is not None:
        return embedded
    names = ", ".join(embedded_models()) or "none shipped"
    looks_like_hub_id = text.count("/") == 1 and not text.startswith((".", "/", "~")) and not exists
    if not looks_like_hub_id:
        raise EngineError(f"model folder not found: {shown} is no folder here, no embedded model ({names}) and no hub id (org/name)")
    try:
        from huggingface_hub import snapshot_download

        return Path(
            snapshot_download(text, allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "*.py"])
        )
    except Exception as exc:  # network, auth or unknown repo: one message either way
        # the hub's messages run over several lines; the caller's error is one
        raise EngineError(
            f"model folder not found: {shown} is no folder here nor an embedded model ({names}), "
            f"and hub download of '{text}' failed: {' '.join(str(exc).split())}"
        ) from exc


def read_config(folder: Path) -> dict[str, Any]:
    file = folder / "config.json"
    if not file.is_file():
        raise EngineError(f"missing file: {file}")
    config = _read_json(file)
    if not isinstance(config, dict):
        raise EngineError(f"{file} must hold a JSON object, not {type(config).__name__}")
    check_config_bounds(config, file)
    return config


# The sizes a config.json may give (every family's names; a DiffusionGemma's nested text_config
# too), each far above any real checkpoint's, so a file cannot make the loader build a million
# layers or allocate a 2**40-row embedding before it says anything (#43 item 5).
SIZE_BOUNDS = {
    "n_layers": 1_024, "num_hidden_layers": 1_024,
    "d_model": 65_536, "hidden_size": 65_536, "head_dim": 4_096,
    "n_heads": 1_024, "num_attention_heads": 1_024, "n_kv_heads": 1_024, "num_key_value_heads": 1_024,
    "mlp_hidden_size": 1 << 20, "intermediate_size": 1 << 20, "moe_intermediate_size": 1 << 20, "expert_intermediate_size": 1 << 20,
    "vocab_size": 1 << 22, "embedding_size": 1 << 22,
    "max_sequence_length": 1 << 22, "max_position_embeddings": 1 << 22, "canvas_length": 1 << 16,
    "num_experts": 4_096, "num_experts_per_tok": 4_096,
}
# settings that must be finite numbers when given (a string there failed inside the first forward)
NUMBER_FIELDS = ("rope_theta", "rms_norm_eps", "layer_norm_eps", "routed_scaling_factor", "partial_rotary_factor")


def check_config_bounds(config: dict[str, Any], file: Path) -> None:
    """Every size within SIZE_BOUNDS and every NUMBER_FIELDS entry a finite number, in one line
    naming the field (the families check what they need of the rest)."""
    for scope in (config, config.get("text_config")):
        if not isinstance(scope, dict):
            continue
        for name, most in SIZE_BOUNDS.items():
            value = scope.get(name)
            if isinstance(value, int) and not isinstance(value, bool) and value > most:
                raise EngineError(f"{file}: {name} {str(value)[:24]} is beyond any checkpoint this engine loads (at most {most:,})")
        for name in NUMBER_FIELDS:
            value = scope.get(name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)):
                raise EngineError(f"{file}: {name} must be a finite number, got {str(value)[:40]!r}")


def _read_json(file: Path) -> Any:
    try:
        return json.loads(file.read_text(encoding="utf-8"), parse_constant=_no_constant)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise EngineError(f"{file} is not valid JSON: {exc}") from exc
    except ValueError as exc:  # NaN, Infinity (which Python's parser takes) or a number too long
        raise EngineError(f"{file} is not valid JSON: {exc}") from exc
    except OSError as exc:
        raise EngineError(f"cannot read {file}: {exc.strerror or exc}") from exc


def _no_constant(name: str) -> Any:
    """json's NaN / Infinity literals are not JSON; a config holding one would load and decode
    nothing (a NaN threshold or scale), so it is refused by name."""
    raise ValueError(f"it holds {name}, which is not a JSON number")


def check_special_ids(model: DiffusionLM, file: Path) -> None:
    """The mask (masked kind) and end-of-text ids name rows of the embedding; an id outside it
    would fail inside the loop's first forward, so it is refused at load."""
    vocab = model.embedding_weight().shape[0]
    try:
        named = model.special_ids
    except (KeyError, TypeError, ValueError) as exc:
        raise EngineError(f"{file} lacks a usable special token id: {type(exc).__name__}: {exc}") from None
    for name, ids in named.items():
        bad = [i for i in ids if not 0 <= i < vocab]
        if bad:
            raise EngineError(f"{file}: {name} {bad[0]} is outside the vocabulary (0..{vocab - 1})")


def _open_safetensors(file: Path):
    """safe_open, with a broken file (truncated, garbage, a renamed pickle) as one EngineError."""
    try:
        return safe_open(file, framework="pt", device="cpu")
    except Exception as exc:  # SafetensorError, OSError: the file is not what its name says
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise EngineError(f"{file} is not a readable safetensors file ({first}); only safetensors are loaded, never pickle") from exc


def model_class(config: dict[str, Any]) -> type[DiffusionLM]:
    for _, matches, cls in _FAMILIES:
        if matches(config):
            return cls
    raise EngineError(
        f"unsupported model: model_type={config.get('model_type')!r}, "
        f"architectures={config.get('architectures')}; supported families: {', '.join(family_names())}"
    )


def _weight_files(folder: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file that holds it."""
    index = folder / INDEX_FILE
    if index.is_file():
        content = _read_json(index)
        weight_map = content.get("weight_map") if isinstance(content, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise EngineError(f"{index} has no weight_map")
        files = {name: folder / shard for name, shard in weight_map.items()}
        for shard in sorted(set(files.values())):
            if not shard.is_file():
                raise EngineError(f"missing file: {shard} (listed in {index})")
        return files
    single = folder / SINGLE_FILE
    if not single.is_file():
        raise EngineError(f"missing file: {single} (and no {INDEX_FILE})")
    with _open_safetensors(single) as f:
        return {name: single for name in f.keys()}


def _more(names: list[str]) -> str:
    return f" (and {len(names) - 1} more)" if len(names) > 1 else ""


@dataclass(frozen=True)
class Cut:
    """The part of a tensor one rank keeps: the index ranges `spans` along `dim`, joined in order
    (one span for a column or row split; q, k and v one each for a fused projection). Which cut a
    rank keeps is engine/runtime/parallel.py's rule (`shard_cuts`); this is how a cut is taken."""

    dim: int
    spans: tuple[tuple[int, int], ...]

    def of(self, t: torch.Tensor) -> torch.Tensor:
        """The cut of a tensor already in memory (a new, contiguous tensor)."""
        if t.is_meta:  # only a shape: torch's meta cat would import torch._dynamo (a second in each rank)
            shape = list(t.shape)
            shape[self.dim] = sum(b - a for a, b in self.spans)
            return t.new_empty(shape)
        return torch.cat([t.narrow(self.dim, a, b - a) for a, b in self.spans], dim=self.dim)

    def index(self, span: tuple[int, int]) -> tuple[slice, ...]:
        """One span as the index of a safetensors slice read (`get_slice(name)[index]`)."""
        return (slice(None),) * self.dim + (slice(*span),)


class _Stored:
    """A checkpoint tensor not yet read: its shape from the file's header, and `read(cut)`, which
    reads only the cut's bytes (safetensors' `get_slice`). A DerivedTensor's build, given these,
    joins them lazily (`_Joined`), so a rank reads only the pieces its cut of the built tensor needs."""

    def __init__(self, handle: Any, name: str, file: Path) -> None:
        self.name, self.file = name, file
        self.slice = self._reading(lambda: handle.get_slice(name))
        self.shape = tuple(self.slice.get_shape())

    def _reading(self, read: Callable[[], Any]) -> Any:
        try:
            return read()
        except Exception as exc:  # a truncated file lists the tensor but cannot deliver it
            raise EngineError(f"cannot read tensor {self.name} from {self.file}: {str(exc).strip()[:200]}") from exc

    def read(self, cut: Cut | None) -> torch.Tensor:
        """The tensor, or its cut. A slice is a view of the mmap'd file (safetensors >= 0.6) whose
        pages are read as they are touched: a whole tensor or a block of leading rows stays such a
        view; any other cut (columns, several spans) is copied contiguous through a mapping of its
        own, closed once copied, so that the pages the copy touched leave this process's memory."""
        if cut is None:
            return self._reading(lambda: self.slice[...])
        if len(cut.spans) == 1 and all(n == 1 for n in self.shape[: cut.dim]):
            return self._reading(lambda: self.slice[cut.index(cut.spans[0])])

        def copy() -> torch.Tensor:
            with _open_safetensors(self.file) as own:
                piece = own.get_slice(self.name)
                return torch.cat([piece[cut.index(span)] for span in cut.spans], dim=cut.dim)

        return self._reading(copy)

    @classmethod
    def __torch_function__(cls, func: Callable, types: Any, args: tuple = (), kwargs: dict | None = None) -> "_Joined":
        return _Joined.of(func, *args, **(kwargs or {}))


class _Joined:
    """`torch.cat` or `torch.stack` of lazy parts (a DerivedTensor's build, run on `_Stored`
    tensors): cutting it cuts its parts, so only the parts and rows the cut covers are read."""

    def __init__(self, parts: list[Any], dim: int, stacked: bool) -> None:
        shapes = [p.shape for p in parts]
        self.parts, self.dim, self.stacked = parts, dim % (len(shapes[0]) + stacked), stacked
        rest = [tuple(s[:self.dim]) + tuple(s[self.dim + (not stacked):]) for s in shapes]
        if any(r != rest[0] for r in rest):  # what torch.cat/stack would refuse
            raise RuntimeError(f"the parts' shapes {shapes[0]} ... {next(s for s, r in zip(shapes, rest) if r != rest[0])} do not fit together")
        length = len(parts) if stacked else sum(s[self.dim] for s in shapes)
        self.shape = rest[0][:self.dim] + (length,) + rest[0][self.dim:]

    @classmethod
    def of(cls, func: Callable, tensors: Any, dim: int = 0) -> "_Joined":
        if func not in (torch.cat, torch.stack):
            raise TypeError(f"{func.__name__} is not a lazy join")
        return cls(list(tensors), dim, func is torch.stack)

    def read(self, cut: Cut | None) -> torch.Tensor:
        join = torch.stack if self.stacked else torch.cat
        if cut is None or cut.dim != self.dim:  # every part, each cut alike (a stacked part lacks the stacking dim)
            inner = None if cut is None else Cut(cut.dim - 1 if self.stacked and cut.dim > self.dim else cut.dim, cut.spans)
            return join([p.read(inner) for p in self.parts], dim=self.dim)
        if self.stacked:  # the cut picks whole parts
            return join([self.parts[i].read(None) for a, b in cut.spans for i in range(a, b)], dim=self.dim)
        pieces, starts = [], [0]
        for p in self.parts:
            starts.append(starts[-1] + p.shape[self.dim])
        for a, b in cut.spans:  # each span takes the overlapping rows of the parts it crosses
            for p, start, stop in zip(self.parts, starts, starts[1:]):
                if max(a, start) < min(b, stop):
                    pieces.append(p.read(Cut(self.dim, ((max(a, start) - start, min(b, stop) - start),))))
        return join(pieces, dim=self.dim)

    @classmethod
    def __torch_function__(cls, func: Callable, types: Any, args: tuple = (), kwargs: dict | None = None) -> "_Joined":
        return cls.of(func, *args, **(kwargs or {}))


class _Built:
    """A DerivedTensor whose build does more than stack and concatenate: built from its sources
    read whole, then cut."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor, self.shape = tensor, tuple(tensor.shape)

    def read(self, cut: Cut | None) -> torch.Tensor:
        return self.tensor if cut is None else cut.of(self.tensor)


def _build(recipe: DerivedTensor, parts: list[_Stored]) -> "_Joined | _Stored | _Built":
    """The recipe's build on lazy parts (joins of them, read as cut), else on the parts read whole."""
    try:
        built = recipe.build(parts)
    except (TypeError, AttributeError):  # an operation other than torch.cat/torch.stack
        built = None
    return built if isinstance(built, (_Joined, _Stored)) else _Built(recipe.build([p.read(None) for p in parts]))


def load_state_dict(
    folder: Path,
    expected: dict[str, torch.Tensor],
    dtype: torch.dtype,
    device: str | torch.device,
    fp32_suffixes: tuple[str, ...] = (),
    derive: Callable[[Collection[str]], dict[str, DerivedTensor]] | None = None,
    cuts: dict[str, Cut] | None = None,
) -> dict[str, torch.Tensor]:
    """Read every tensor `expected` names, checking names and shapes against it.

    `derive` (the model's `checkpoint_sources`) names the tensors the checkpoint stores in another
    layout and how to build them; their source tensors count as used, and every other checkpoint
    tensor must be expected. Tensors whose names end with one of `fp32_suffixes` (MoE routers) stay
    in fp32. `cuts`: for a tensor named there, only that part of it is read and returned (its
    shape is still checked whole, from the files' headers); a built tensor reads only the parts of
    its sources the cut covers, so a rank never holds a whole split tensor.
    """
    cuts = cuts or {}
    files = _weight_files(folder)
    derived = {k: d for k, d in (derive(list(files)) if derive else {}).items() if k not in files}
    sources = {s for d in derived.values() for s in d.sources}
    missing = sorted((set(expected) - set(files) - set(derived)) | (sources - set(files)))
    extra = sorted(set(files) - set(expected) - sources)
    if missing:
        raise EngineError(f"checkpoint lacks tensor {missing[0]}" + _more(missing))
    if extra:
        raise EngineError(f"checkpoint has unexpected tensor {extra[0]} in {files[extra[0]].name}" + _more(extra))
    state: dict[str, torch.Tensor] = {}
    with ExitStack() as stack:
        handles = {f: stack.enter_context(_open_safetensors(f)) for f in sorted(set(files.values()))}

        for name, want in expected.items():
            if name in derived:
                recipe = derived[name]
                origin = f"built from {recipe.sources[0]} and {len(recipe.sources) - 1} more"
                try:
                    lazy = _build(recipe, [_Stored(handles[files[s]], s, files[s]) for s in recipe.sources])
                except RuntimeError as exc:  # the sources' shapes do not fit together
                    raise EngineError(f"tensor {name} cannot be {origin}: {exc}") from exc
            else:
                lazy, origin = _Stored(handles[files[name]], name, files[name]), f"in {files[name].name}"
            if lazy.shape != tuple(want.shape):
                raise EngineError(f"tensor {name} {origin} has shape {lazy.shape}, config.json implies {tuple(want.shape)}")
            target = torch.float32 if name.endswith(fp32_suffixes) else dtype
            stored = lazy.read(cuts.get(name))
            if want.is_floating_point() and not stored.is_floating_point():
                raise EngineError(f"tensor {name} {origin} is {str(stored.dtype).removeprefix('torch.')}, not floating point: the checkpoint is not a model's weights")
            state[name] = stored.to(device=device, dtype=target)
            # a NaN or inf weight (or one past the dtype's range) makes every logit NaN: nothing decodes
            if state[name].is_floating_point() and not bool(torch.isfinite(state[name]).all()):
                raise EngineError(f"tensor {name} {origin} holds values that are not finite in {str(target).removeprefix('torch.')}")
    return state


def default_dtype(device: str | torch.device) -> torch.dtype:
    """float32 on CPU (bf16 matmuls are slow there), bfloat16 on accelerators."""
    return torch.float32 if torch.device(device).type == "cpu" else torch.bfloat16


def _skeleton(path: str | os.PathLike) -> tuple[Path, DiffusionLM]:
    """The folder, and the family config.json names built on the meta device (no memory)."""
    folder = resolve_model_path(path)
    config = read_config(folder)
    cls = model_class(config)
    try:
        with torch.device("meta"):
            model = cls(config)
    except EngineError:
        raise
    except Exception as exc:  # a field of the wrong type or value that the family's checks missed
        raise EngineError(f"{folder / 'config.json'} does not describe a {cls.__name__}: {type(exc).__name__}: {exc}") from exc
    check_special_ids(model, folder / "config.json")
    model.name_or_path = str(path)
    return folder, model.eval().requires_grad_(False)


def model_skeleton(path: str | os.PathLike) -> DiffusionLM:
    """The model config.json describes, on the meta device: its modules and shapes, special ids,
    limits and parameter count, without reading a weight. What an Engine whose weights live in
    worker processes keeps (engine/runtime/workers.py); it cannot run a forward."""
    return _skeleton(path)[1]


def load_model(
    path: str | os.PathLike,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    shard: Callable[[DiffusionLM], dict[str, Cut]] | None = None,
) -> DiffusionLM:
    """Build the model family named by config.json and fill it from the folder's safetensors.

    `shard` (engine/runtime/parallel.py: `load_shard`): reshapes the model, still on the meta
    device, to one rank's shard and returns the cut of each tensor it splits; only those cuts are
    read from the files."""
    folder, model = _skeleton(path)
    dtype = dtype or default_dtype(device)
    expected = {name: t for name, t in model.state_dict().items()}
    cuts = shard(model) if shard is not None else {}
    state = load_state_dict(folder, expected, dtype, device, type(model).fp32_suffixes, model.checkpoint_sources, cuts)
    model.load_state_dict(state, strict=True, assign=True)
    return model


def save_model(model: DiffusionLM, folder: str | os.PathLike, max_shard_bytes: int | None = None) -> Path:
    """Write `model` as a Hugging Face folder: config.json plus one or several safetensors files."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(model.config, indent=2, sort_keys=True) + "\n")
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    if max_shard_bytes is None:
        save_file(state, folder / SINGLE_FILE, metadata={"format": "pt"})
        return folder
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in state.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    weight_map = {}
    for i, shard in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, folder / file, metadata={"format": "pt"})
        weight_map.update({name: file for name in shard})
    total = sum(t.numel() * t.element_size() for t in state.values())
    (folder / INDEX_FILE).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n")
    return folder
