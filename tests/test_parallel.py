"""Tensor and expert parallelism on two CPU processes (gloo): the same logits and the same
generated tokens as one process, for dense LLaDA, LLaDA-MoE and LLaDA2 (the `workers` lane,
tests/conftest.py); clear errors when a degree does not divide the model, before any process starts."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import load_file, save_file

from engine import Engine, GenerationConfig, run_diffusion
from engine.errors import EngineError
from engine.runtime.parallel import check_degrees, shard_model

from .conftest import tiny_llada
from .moe_models import tiny_llada2, tiny_llada_moe

# name -> (model family, tp, ep, generation config)
CASES = {
    "llada tp2": ("llada", 2, 1, dict(cache="dual")),
    "llada_moe tp2": ("llada_moe", 2, 1, dict(cache="dual")),
    "llada_moe ep2": ("llada_moe", 1, 2, dict(cache="vicinity", smoothing=True)),
    "llada2 tp2 ep2": ("llada2", 2, 2, dict(cache="prefix")),
    "llada2 ep2": ("llada2", 1, 2, dict(cache="prefix")),
}
BUILDERS = {"llada": tiny_llada, "llada_moe": tiny_llada_moe, "llada2": tiny_llada2}
EMBEDDED_MODEL = Path(__file__).resolve().parent.parent / "assets" / "tiny-llada"  # tests/app_support.py's (not imported by the spawned ranks)
INPUT = torch.arange(3, 27).view(2, 12) % 40
PROMPTS = [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11, 12]]


def _config(extra: dict) -> GenerationConfig:
    return GenerationConfig(gen_length=8, block_length=4, early_stop=False, **extra)


def _run(model, extra: dict) -> tuple[torch.Tensor, list[list[int]]]:
    with torch.inference_mode():
        logits = model(INPUT.clone()).logits
    return logits, run_diffusion(model, PROMPTS, _config(extra)).token_ids


def _worker(rank: int, port: int, folder: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        for name, (family, tp, ep, extra) in CASES.items():
            model = shard_model(BUILDERS[family](), tp, ep)  # seeded: the parent's weights
            logits, tokens = _run(model, extra)
            if rank == 0:
                save_file({"logits": logits.contiguous()}, Path(folder) / f"{name}.safetensors")
                (Path(folder) / f"{name}.json").write_text(json.dumps(tokens))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, tuple[torch.Tensor, list, torch.Tensor, list]]:
    """name -> (logits, tokens) of one process, then of two: all cases in one spawn."""
    folder = tmp_path_factory.mktemp("parallel")
    single = {name: _run(BUILDERS[family](), extra) for name, (family, _, _, extra) in CASES.items()}
    mp.spawn(_worker, args=(_free_port(), str(folder)), nprocs=2, join=True)
    return {
        name: (*single[name], load_file(folder / f"{name}.safetensors")["logits"], json.loads((folder / f"{name}.json").read_text()))
        for name in CASES
    }


@pytest.mark.parametrize("name", CASES)
def test_two_processes_give_the_logits_and_tokens_of_one(results, name):
    logits, tokens, parallel_logits, parallel_tokens = results[name]
    torch.testing.assert_close(parallel_logits, logits, rtol=1e-5, atol=1e-5)
    assert parallel_tokens == tokens


@pytest.mark.parametrize(
    "build, tp, ep, world, message",
    [
        (lambda: tiny_llada(), 3, 1, 3, "does not divide the 4 attention heads"),
        (lambda: tiny_llada(), 1, 2, 2, "expert parallelism needs an MoE model"),
        (lambda: tiny_llada_moe(), 1, 3, 3, "does not divide the 8 experts"),
        (lambda: tiny_llada2(), 4, 1, 4, "does not divide the 2 KV heads"),
        (lambda: tiny_llada_moe(expert_intermediate_size=18), 4, 1, 4, "expert hidden size 18"),
        (lambda: tiny_llada(), 2, 1, 4, "number of processes"),
    ],
)
def test_degrees_that_do_not_divide_the_model_are_refused(build, tp, ep, world, message):
    with pytest.raises(EngineError, match=message):
        check_degrees(build(), tp, ep, world)


def _children() -> set[int]:
    return {p.pid for p in mp.active_children()}


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(ep_size=2), "expert parallelism needs an MoE model; LLaDAModelLM is dense"),
        (dict(tp_size=4), "tp=4 does not divide the 6 attention heads"),
        (dict(tp_size=2, ep_size=3), "each must be 1 or the number of processes"),
        (dict(tp_size=0), "tp and ep must be >= 1"),
        (dict(tp_size="2"), "tp and ep must be whole numbers, got tp='2'"),
    ],
)
def test_degrees_the_model_cannot_take_are_refused_before_any_process_starts(options, message):
    before = _children()
    with pytest.raises(EngineError, match=message):
        Engine(EMBEDDED_MODEL, **options)
    assert _children() == before
