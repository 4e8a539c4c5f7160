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
