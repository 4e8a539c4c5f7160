"""Hugging Face folders: single and sharded safetensors round-trip; every failure names its culprit."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine import load_model, save_model
from engine.errors import EngineError

from .conftest import tiny_llada


@pytest.mark.parametrize("shard_bytes", [None, 20_000])
def test_saved_checkpoint_loads_with_identical_logits(tmp_path, model, shard_bytes):
    save_model(model, tmp_path, max_shard_bytes=shard_bytes)
    if shard_bytes:
        index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
        assert len(set(index["weight_map"].values())) > 1
        assert not (tmp_path / "model.safetensors").exists()
    loaded = load_model(tmp_path)
    x = torch.randint(0, 48, (2, 12))
    torch.testing.assert_close(loaded(x).logits, model(x).logits, rtol=0, atol=0)
    assert loaded.config["mask_token_id"] == 49


def test_dtype_is_applied(tmp_path, model):
    save_model(model, tmp_path)
    assert load_model(tmp_path, dtype=torch.bfloat16).embedding_weight().dtype == torch.bfloat16
    assert load_model(tmp_path).embedding_weight().dtype == torch.float32  # CPU default


def test_missing_folder(tmp_path):
    with pytest.raises(EngineError, match="model folder not found"):
        load_model(tmp_path / "nope")


def test_missing_config(tmp_path, model):
    save_model(model, tmp_path)
    (tmp_path / "config.json").unlink()
    with pytest.raises(EngineError, match="config.json"):
        load_model(tmp_path)


def test_missing_weights_file(tmp_path, model):
    save_model(model, tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(EngineError, match="model.safetensors"):
        load_model(tmp_path)


def test_missing_shard_is_named(tmp_path, model):
    save_model(model, tmp_path, max_shard_bytes=20_000)
    shard = sorted(tmp_path.glob("model-*.safetensors"))[-1]
    shard.unlink()
    with pytest.raises(EngineError, match=shard.name):
        load_model(tmp_path)


def _rewrite(tmp_path, edit):
    file = tmp_path / "model.safetensors"
    state = load_file(file)
    edit(state)
    save_file(state, file)


def test_missing_tensor_is_named(tmp_path, model):
    save_model(model, tmp_path)
    _rewrite(tmp_path, lambda s: s.pop("model.transformer.blocks.1.up_proj.weight"))
    with pytest.raises(EngineError, match=r"lacks tensor model\.transformer\.blocks\.1\.up_proj\.weight"):
        load_model(tmp_path)


def test_extra_tensor_is_named(tmp_path, model):
    save_model(model, tmp_path)
    _rewrite(tmp_path, lambda s: s.update({"model.transformer.blocks.0.bogus.weight": torch.zeros(2)}))
    with pytest.raises(EngineError, match=r"unexpected tensor model\.transformer\.blocks\.0\.bogus\.weight"):
        load_model(tmp_path)


def test_shape_mismatch_is_named(tmp_path, model):
    save_model(model, tmp_path)
    _rewrite(tmp_path, lambda s: s.update({"model.transformer.ln_f.weight": torch.ones(63)}))
    with pytest.raises(EngineError, match=r"model\.transformer\.ln_f\.weight.*\(63,\).*\(64,\)"):
        load_model(tmp_path)


def test_unknown_model_type(tmp_path, model):
    save_model(model, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["model_type"] = "gpt2"
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(EngineError, match="unsupported model.*gpt2"):
        load_model(tmp_path)


def test_no_pickle_files_written(tmp_path):
    save_model(tiny_llada(), tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]


def test_a_token_embedding_draws_what_torchs_embedding_draws_and_nothing_on_the_meta_device():
    from torch import nn

    from engine.models.layers import token_embedding

    torch.manual_seed(3)
    theirs, after_theirs = nn.Embedding(50, 8), torch.rand(4)
    torch.manual_seed(3)
    ours, after_ours = token_embedding(50, 8), torch.rand(4)
    torch.testing.assert_close(ours.weight, theirs.weight, rtol=0, atol=0)
    torch.testing.assert_close(after_ours, after_theirs, rtol=0, atol=0)  # the same draws, no more
    assert isinstance(ours.weight, nn.Parameter) and ours.weight.requires_grad
    with torch.device("meta"):
        assert token_embedding(50, 8).weight.is_meta


@pytest.mark.processes
def test_loading_a_model_or_a_shard_and_reducing_in_a_fresh_process_leave_torch_dynamo_unimported(tmp_path):
    """Each process that loads a model (the CLI, the app, every worker rank) builds its skeleton on
    the meta device, a rank cuts it there to its shard and all-reduces in every layer; torch's meta
    embedding init, its meta cat and a custom op's first call each imported torch._dynamo, a second
    of CPU per process that never compiles. tiny-gemma is not asked: transformers' DiffusionGemma
    modules import it themselves."""
    import subprocess
    import sys
    from pathlib import Path

    probe = (
        "import sys, torch, torch.distributed as dist\n"
        "from engine.models.loader import load_model\n"
        "from engine.runtime.parallel import all_reduce, load_shard\n"
        "for name in ('tiny-llada', 'tiny-llada2'):\n"
        "    load_model(name)\n"
        "    load_shard(name, 'cpu', None, 2, 1, 1, 2)\n"
        f"dist.init_process_group('gloo', init_method='file://{tmp_path}/rendezvous', rank=0, world_size=1)\n"
        "assert all_reduce(torch.ones(3)).tolist() == [1.0, 1.0, 1.0]\n"
        "print('torch._dynamo' in sys.modules)\n"
        # a group left for the interpreter's exit can abort it (torch's race; launch.Job.leave)
        "dist.destroy_process_group()\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1], timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "False"
