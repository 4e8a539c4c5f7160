"""Text in, text out: a model folder's model and tokenizer, with its special ids and chat template."""

from __future__ import annotations

import os
import dataclasses
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import Any

import torch

from .arguments import check_device, check_dtype, check_engine_arguments, check_expected, check_ids, check_instance, check_prompts, check_token_prompts, need, shown
from .config import GenerationConfig
from .constraints import TokenAutomaton, TokenVocabulary, spec_of
from .errors import EngineError
from .generation import check_fitted, fit_request, run_fitted
from .hooks import NO_HOOKS, RunHooks
from .infill import Layout
from .kinds import check_system_options, run_kind
from .models import DiffusionLM, load_model, model_skeleton
from .models.card import answer_length
from .models.loader import resolve_model_path
from .runtime.compiled import check_options, static_shape_model
from .runtime.launch import Job
from .runtime.parallel import check_degrees, load_shard
from .run import GenerationOutput, row_constraints
from .runtime.workers import RankGenerate, WorkerGroup
from .system_options import SYSTEM_OPTIONS

# Token strings that end a turn in the supported families' tokenizers (LLaDA-8B's EoT, Ling's role end).
_END_OF_TURN_TOKENS = ("<|eot_id|>", "<|role_end|>")
# Any of these makes a folder's tokenizer loadable by AutoTokenizer.
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def load_tokenizer(path: str | os.PathLike):
    """The folder's tokenizer through transformers.AutoTokenizer (tokenizer.json and friends)."""
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    folder = resolve_model_path(path)
    if not any((folder / name).is_file() for name in _TOKENIZER_FILES):
        raise EngineError(f"missing file: {folder / 'tokenizer.json'} (the model folder has no tokenizer files)")
    # AutoTokenizer reads config.json and warns that `llada` is not a transformers model type;
    # true but irrelevant (only the tokenizer is loaded through it), so keep it off the console.
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        return AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False)
    except Exception as exc:  # transformers raises many types for a missing or broken tokenizer
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise EngineError(f"cannot load the tokenizer from {folder}: {first_line}") from exc
    finally:
        hf_logging.set_verbosity(verbosity)


def encode_prompt(tokenizer, prompt: str, use_chat_template: bool = True) -> list[int]:
    """`prompt` as the model reads it: the tokenizer's chat template around it when asked and the
    tokenizer has one, else the bare text; EngineError for an empty or unwritable prompt."""
    need(isinstance(prompt, str), f"the prompt must be a text, got {shown(prompt)}")  # not a TypeError inside the tokenizer
    if not prompt.strip():
        raise EngineError("empty prompt")
    check_text(prompt)
    if use_chat_template and getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True)
        ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
        return list(ids)
    return tokenizer(prompt, add_special_tokens=False)["input_ids"]


def check_request(model: DiffusionLM, tokenizer, prompt: str, config: GenerationConfig, max_tokens: int | None = None) -> GenerationConfig:
    """`config` fitted to `model` for `prompt`, after the checks generate makes before any forward
    (engine/generation.py: `fit_request`: the kind's settings, the canvas within the model's
    max_sequence_length and `max_tokens`, pinned text counted). A model skeleton (model_skeleton: no
    weights) answers it, so a model not loaded yet is checked from its config.json and tokenizer."""
    return fit_request(model, [encode_prompt(tokenizer, prompt, config.use_chat_template)], config, max_tokens, layouts=(layout_for(tokenizer, config),))


def layout_for(tokenizer, config: GenerationConfig) -> Layout | None:
    """The answer area `config`'s suffix or template asks for, its pinned text tokenised without
    special tokens (engine/infill.py; None: neither)."""
    for text in (config.suffix, config.template):
        if text is not None:
            check_text(text)
    return Layout.of(config.suffix, config.template, config.gen_length, lambda text: tokenizer(text, add_special_tokens=False)["input_ids"])


def stop_ids_for(model: DiffusionLM, tokenizer) -> list[int]:
    """EOS first (it pads finished rows), then the checkpoint's other end ids (Gemma lists several),
    EoT and the tokenizer's own EOS when they differ."""
    ids = [model.eos_token_id]
    candidates = model.eos_token_ids[1:] + [tokenizer.eos_token_id] + [tokenizer.convert_tokens_to_ids(t) for t in _END_OF_TURN_TOKENS if t in tokenizer.get_vocab()]
    for i in candidates:
        if i is not None and i not in ids and i != model.mask_token_id:
            ids.append(int(i))
    return ids


@dataclass
class TextResult:
    """`texts`: per row, what the model wrote (pinned text left out); `holes`: per row, each hole's
    text in order (a request with a suffix or a template; a row of plain masks has one, its text)."""

    texts: list[str]
    output: GenerationOutput
    holes: list[list[str]] = dataclasses.field(default_factory=list)

    @property
    def text(self) -> str:
        return self.texts[0]


def _load_shard(path: str, dtype: torch.dtype | None, max_tokens: int | None, tp_size: int, ep_size: int, compile: bool, device: str) -> RankGenerate:
    """In a worker process (engine/runtime/workers.py), whose environment names its rank as
    torchrun's would: this rank's Engine, which joins the group and reads only its shard, and its
    generate in this process (the caller coordinates the ranks' requests and stops), which runs the
    caller's fitted config without fitting it again. (A compiled engine compiles on its first
    forward, so it compiles the shard.)"""
    return Engine(path, device=device, dtype=dtype, max_tokens=max_tokens, tp_size=tp_size, ep_size=ep_size, compile=compile)._run_fitted_here


def check_text(text: str) -> None:
    """Text every tokenizer can take: a lone surrogate (JSON's "\\ud800", or a command-line
    argument's bytes that are not UTF-8) is a Python string no tokenizer or UTF-8 writer can encode."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise EngineError(f"the prompt is not valid text: character {exc.start} is {text[exc.start]!r}, a lone surrogate (bytes that are not UTF-8?)") from None


def _checked_call(config: Any, hooks: Any) -> GenerationConfig:
    """A call's config (None: the defaults) and hooks, of their types (engine/arguments.py)."""
    config = GenerationConfig() if config is None else config
    check_instance("config", config, GenerationConfig, " (GenerationConfig.from_dict reads a dict)")
    check_instance("hooks", hooks, RunHooks)
    # the kind and the decoder choose the run, and so what validates the config (`fit`): read
    # before `validate` checks every field's type, so checked here
    for name in ("kind", "decoder"):
        value = getattr(config, name)
        need(value is None or isinstance(value, str), f"{name} must be a string, got {shown(value)}")
    return config


class Engine:
    """A loaded model with its tokenizer: `Engine(path).generate("Q: 48+57=? A:", config)`."""

    def __init__(
        self,
        path: str | os.PathLike,
        device: str = "cpu",
        dtype: torch.dtype | None = None,
        max_tokens: int | None = None,
        tp_size: int = 1,
        ep_size: int = 1,
        compile: bool = False,
        cuda_graphs: bool = False,
    ) -> None:
        """`max_tokens`: refuse canvases (prompt + gen_length) longer than this, besides the model's own limit.

        `tp_size`/`ep_size` > 1: tensor/expert parallelism over max(tp_size, ep_size) worker
        processes (each 1 or that number; ep_size only for MoE models), one per CUDA device on
        CUDA, on the CPU otherwise (docs/algorithms.md §6.4). The weights live in the workers
        until `close()`; this process keeps the tokenizer and `model` as a skeleton on the meta
        device (config, special ids, limits, parameter count), and `generate` works as with one
        process. In a process a launcher started as one rank of a job (torchrun: RANK, WORLD_SIZE
        and the rest in the environment; engine/runtime/launch.py, docs/scaling.md), the degree
        must be the job's size: the engine joins the job's process group, reads only its shard and
        generates in this process, every rank on rank 0's request; `rank` is its rank (0 otherwise).

        `compile`: the model forward runs through torch.compile, `cuda_graphs` (CUDA, one process)
        through CUDA graphs, both over bucketed static shapes (engine/runtime/compiled.py, docs/algorithms.md
        §6.5); the first generate at new shapes compiles or captures, and `GenerationStats` and
        each record's `cost` count it.
        """
        check_engine_arguments(path, max_tokens)
        device, dtype = check_device(device), check_dtype(dtype)
        self.path = str(path)
        self.max_tokens = max_tokens
        self._closed = False
        skeleton = model_skeleton(path)
        requested = {"tp_size": tp_size, "ep_size": ep_size, "compile": compile, "cuda_graphs": cuda_graphs}
        # the options set on; the model's own kind must run with them, a request's kind too (generate_ids)
        self._system_options = {name: SYSTEM_OPTIONS[name].is_set(value) for name, value in requested.items()}
        check_system_options(skeleton.diffusion_kind, self._system_options)
        job = Job.from_environment()  # a launcher's rank: its job's size is the number of processes
        check_degrees(skeleton, tp_size, ep_size, None if job is None else job.world)  # before any weight is read, process started or group joined
        world = job.world if job is not None else max(tp_size, ep_size)
        check_options(device, compile, cuda_graphs, world)
        self._job = job if job is not None and world > 1 else None
        self.rank = self._job.rank if self._job is not None else 0
        if self._job is not None:
            self.model = load_shard(self.path, self._job.join(device), dtype, tp_size, ep_size, self.rank, world)
        else:
            self.model = skeleton if world > 1 else load_model(path, device=device, dtype=dtype)
        here = world == 1 or self._job is not None  # the weights are in this process
        # what generate runs: the model, or the model behind static-shape forwards
        self._forward_model = static_shape_model(self.model, compile, cuda_graphs) if here and (compile or cuda_graphs) else self.model
        self.tokenizer = load_tokenizer(path)
        self.stop_ids = stop_ids_for(self.model, self.tokenizer)
        # the length its card says it answers in (engine/models/card.py): the server's least canvas
        self.answer_length = answer_length(resolve_model_path(path))
        self._vocabulary: TokenVocabulary | None = None
        self._workers = None if here else WorkerGroup(world, device, partial(_load_shard, self.path, dtype, max_tokens, tp_size, ep_size, compile))

    def close(self) -> None:
        """End the worker processes (a parallel engine), or leave the launched job's process group;
        the engine generates no more."""
        self._closed = True
        if self._workers is not None:
            self._workers.close()
        if self._job is not None:
            self._job.leave()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    @property
    def static_shapes(self) -> bool:
        """Whether its forwards run through compiled or captured static-shape forwards (`compile`,
        `cuda_graphs`), which keep buffers of their own across calls."""
        return self._forward_model is not self.model

    @property
    def name(self) -> str:
        return Path(self.path).name or self.path

    def encode(self, prompt: str, use_chat_template: bool = True) -> list[int]:
        return encode_prompt(self.tokenizer, prompt, use_chat_template)

    def unencodable(self, prompt: str, use_chat_template: bool = True) -> list[str]:
        """The pieces of `prompt` the tokenizer can only write as its unknown token (in order)."""
        unk = getattr(self.tokenizer, "unk_token_id", None)
        if unk is None or not prompt:
            return []
        check_text(prompt)
        try:
            encoded = self.tokenizer(prompt, add_special_tokens=False, return_offsets_mapping=True)
        except (NotImplementedError, ValueError):  # slow tokenizers have no offsets
            return []
        return [prompt[a:b] for i, (a, b) in zip(encoded["input_ids"], encoded["offset_mapping"]) if i == unk]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(check_ids(ids, self.model.embedding_weight().shape[0]), skip_special_tokens=True)

    def token_strings(self, ids: set[int]) -> dict[str, str]:
        """id -> displayable string, for the trace's `tokens` (the engine asks as ids appear)."""
        return {str(i): self.tokenizer.convert_ids_to_tokens(i) or "" for i in sorted(ids)}

    @property
    def vocabulary(self) -> TokenVocabulary:
        """The tokenizer's tokens as outlines-core reads them, with the constraints compiled over
        them (engine/constraints/); built at the first constrained request."""
        if self._vocabulary is None:
            self._vocabulary = TokenVocabulary.of(self.tokenizer, self.stop_ids, after=(self.model.mask_token_id,))
        return self._vocabulary

    def answer_ids(self, answer: str) -> list[int]:
        """The ids a generation holds from the prompt's end when it gives `answer`: the answer
        (no chat template), then the first stop id."""
        return list(self.encode(answer, use_chat_template=False)) + [self.stop_ids[0]]

    def generate(
        self, prompts: str | list[str], config: GenerationConfig | None = None, hooks: RunHooks = NO_HOOKS, *, expected: str | list[str] | None = None,
        fitted: bool = False,
    ) -> TextResult:
        """Encode (once), generate (which fits and validates `config`, unless `fitted`: see
        generate_ids), decode. No `config`: the engine's defaults, as the model's own kind runs
        them. `expected`: an answer per prompt (one string for all) that the trace header carries as
        ids (`Trace.expected`, its strings in `tokens`) for a viewer; see engine.run_diffusion for
        `hooks`."""
        batch = check_prompts(prompts)
        config = _checked_call(config, hooks)
        encoded = [self.encode(p, config.use_chat_template) for p in batch]
        if expected is not None:
            answers = check_expected(expected, len(batch))
            hooks = hooks.but(expected_ids=[self.answer_ids(a) if a else [] for a in answers])
        out = self.generate_ids(encoded, config, hooks, fitted=fitted)
        texts = [self.decode(ids) for ids in out.token_ids]
        layout = self.layout(config)
        holes = [[self.decode(out.canvas[row, length + a : length + b].tolist()) for a, b in layout.holes] if layout is not None else [texts[row]]
                 for row, length in enumerate(out.prompt_lengths)]
        return TextResult(texts, out, holes)

    def generate_ids(self, prompts: list[list[int]], config: GenerationConfig | None = None, hooks: RunHooks = NO_HOOKS, *, fitted: bool = False) -> GenerationOutput:
        """engine.run_diffusion on token ids, with this engine's stop ids, limit, name and token
        strings; on a parallel engine, in its workers (the output's canvas then on the CPU); on a
        launched job's rank, on rank 0's request, stopped as one (engine/runtime/launch.py).
        The config is fitted and validated here, once (engine/generation.py: `fit_request`); the
        workers and the loop run the fitted config. `fitted`: `config` is already `fit`'s answer
        for this model (the CLI's, on the model's skeleton; the app's): only the prompt's checks."""
        if self._closed:
            raise EngineError("this engine was closed; load the model again")
        config = _checked_call(config, hooks)
        check_token_prompts(prompts, self.model.embedding_weight().shape[0])  # the rows an id may name
        hooks = self._pinned(config, hooks, len(prompts))
        check_system_options(run_kind(config, self.model).name, self._system_options)  # a request's kind may run with fewer
        # a parallel engine checks the constraint's room here too (in one process the run does)
        room = self._workers is not None and (any(hooks.constraints or ()) or spec_of(config) is not None)
        config = (check_fitted if fitted else fit_request)(self.model, prompts, config, self._limit(hooks), self.vocabulary if room else None, hooks.layouts)
        if self._workers is not None:  # each rank's engine adds its limit, name and strings
            # the constraints the room check built here: the ranks adopt them, building none
            built = {s.regex(): self.vocabulary.automaton(s.regex()) for s in row_constraints(config, hooks, len(prompts)) if s is not None} if room else {}
            return self._workers.run_request(prompts, config, hooks, built)
        if self._job is not None:
            return self._job.run(prompts, config, hooks, self._run_fitted_here)
        return self._run_fitted_here(prompts, config, hooks)

    def layout(self, config: GenerationConfig) -> Layout | None:
        """`layout_for` this engine's tokenizer."""
        return layout_for(self.tokenizer, config)

    def _pinned(self, config: GenerationConfig, hooks: RunHooks, rows: int) -> RunHooks:
        """`hooks` with every row's layout from the config's suffix or template, unless the caller gave its own."""
        if hooks.layouts is not None or not config.pins():
            return hooks
        return hooks.but(layouts=(self.layout(config),) * rows)

    def _limit(self, hooks: RunHooks) -> int | None:
        """A call's bound on the canvas: the engine's `max_tokens` or the call's
        `RunHooks.max_tokens`, whichever is smaller (None: neither is set)."""
        limits = [limit for limit in (self.max_tokens, hooks.max_tokens) if limit is not None]
        return min(limits) if limits else None

    def _run_fitted_here(self, prompts: list[list[int]], config: GenerationConfig, hooks: RunHooks, built: dict[str, TokenAutomaton] | None = None) -> GenerationOutput:
        """The loop in this process on a fitted config (generate_ids's, or a parallel engine's
        caller's), with this engine's stop ids, limit, name and token strings. `built`: constraint
        automata its caller built over the same vocabulary (a worker rank's request), adopted."""
        hooks = hooks.but(max_tokens=self._limit(hooks), model_name=self.name, token_strings=self.token_strings)
        constrained = any(hooks.constraints or ()) or spec_of(config) is not None
        if built:
            self.vocabulary.adopt(built)
        return run_fitted(self._forward_model, prompts, config, stop_ids=self.stop_ids, hooks=hooks, vocabulary=self.vocabulary if constrained else None)
