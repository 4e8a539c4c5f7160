"""Shard-only loading: a rank's shard read from the checkpoint (`load_shard`) is, tensor for tensor,
what `shard_model` keeps of the whole model, for dense LLaDA, LLaDA-MoE and LLaDA2 under TP and EP;
and the loader reads no byte of a split tensor beyond the rank's slices (counted at the
safetensors slice reads, the only way the loader reads a tensor: benchmarks/shard_memory.py's
counter, which the benchmark reports too)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest
import torch
from safetensors.torch import save_file

from benchmarks.shard_memory import counting_reads
from engine import save_model
from engine.models.base import DerivedTensor
from engine.models.loader import Cut, load_state_dict
from engine.runtime.parallel import RowParallelLinear, load_shard, shard_model

from .conftest import tiny_llada
from .moe_models import save_per_expert, tiny_llada2, tiny_llada_moe

BUILDERS = {"llada": tiny_llada, "llada_moe": tiny_llada_moe, "llada2": tiny_llada2}
# name -> (family, tp, ep, checkpoint layout): "fused" as save_model writes it (several files for
# the dense model), "per expert" as the Hugging Face MoE checkpoints store their experts
CASES = {
    "llada tp2": ("llada", 2, 1, "sharded files"),
    "llada_moe tp2": ("llada_moe", 2, 1, "per expert"),
    "llada_moe ep2": ("llada_moe", 1, 2, "per expert"),
    "llada_moe ep2 fused": ("llada_moe", 1, 2, "fused"),
    "llada2 tp2": ("llada2", 2, 1, "fused"),
    "llada2 ep2": ("llada2", 1, 2, "per expert"),
    "llada2 tp2 ep2": ("llada2", 2, 2, "per expert"),
}


@pytest.fixture
def bytes_read() -> Iterator[dict[str, int]]:
    with counting_reads() as counter:
        yield counter


def _checkpoint(family: str, layout: str, folder: Path) -> Path:
    model = BUILDERS[family]()
    if layout == "per expert":
        return save_per_expert(model, folder)
    return save_model(model, folder, max_shard_bytes=20_000 if layout == "sharded files" else None)


def _nbytes(model: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in model.state_dict().values())


@pytest.mark.parametrize("rank", [0, 1])
@pytest.mark.parametrize("name", CASES)
def test_a_loaded_shard_is_what_shard_model_keeps_and_only_its_bytes_are_read(tmp_path, bytes_read, name, rank):
    family, tp, ep, layout = CASES[name]
    folder = _checkpoint(family, layout, tmp_path)
    loaded = load_shard(str(folder), "cpu", None, tp, ep, rank, 2)
    kept = shard_model(BUILDERS[family](), tp, ep, rank=rank, world=2)
    mine, theirs = loaded.state_dict(), kept.state_dict()
    assert list(mine) == list(theirs)
    for key in theirs:
        assert mine[key].shape == theirs[key].shape and torch.equal(mine[key], theirs[key]), key
    # the modules around the tensors agree too: split linears, head counts, experts' offset
    assert [type(m) for m in loaded.modules()] == [type(m) for m in kept.modules()]
    assert any(isinstance(m, RowParallelLinear) for m in loaded.modules()) == (tp > 1)
    for a, b in zip(loaded.modules(), kept.modules()):
        assert (getattr(a, "n_heads", None), getattr(a, "n_kv_heads", None), getattr(a, "first_expert", None)) == (
            getattr(b, "n_heads", None), getattr(b, "n_kv_heads", None), getattr(b, "first_expert", None))
    # every byte read is a byte kept (fp32 checkpoint, fp32 model): nothing whole was read
    assert bytes_read["bytes"] == _nbytes(loaded) < _nbytes(BUILDERS[family]())


def test_an_unsharded_load_reads_every_byte_once(tmp_path, bytes_read):
    """The counter's own check: a whole load reads exactly the whole model."""
    folder = save_per_expert(tiny_llada2(), tmp_path)
    assert bytes_read["bytes"] == 0
    whole = load_shard(str(folder), "cpu", None, 1, 1, 0, 1)
    assert bytes_read["bytes"] == _nbytes(whole) == _nbytes(tiny_llada2())


def test_a_layout_built_by_more_than_joins_is_read_whole_then_cut(tmp_path):
    """A build the loader cannot cut lazily (here a transpose) still loads, correctly cut."""
    stored = torch.arange(24.0).view(6, 4)
    save_file({"w_t": stored}, tmp_path / "model.safetensors")
    derive = lambda names: {"w": DerivedTensor(("w_t",), lambda ts: ts[0].t().contiguous())}  # noqa: E731
    expected = {"w": torch.empty(4, 6, device="meta")}
    state = load_state_dict(tmp_path, expected, torch.float32, "cpu", derive=derive, cuts={"w": Cut(1, ((0, 2), (4, 6)))})
    assert torch.equal(state["w"], torch.cat([stored.t()[:, 0:2], stored.t()[:, 4:6]], dim=1))
