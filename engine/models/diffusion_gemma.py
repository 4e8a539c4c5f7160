"""DiffusionGemma (uniform-state block diffusion) through transformers' own classes.

The network is `transformers.DiffusionGemmaForBlockDiffusion`, built from config.json and called
as its `generate` calls it; nothing of its modeling code is repeated here. This class adapts it to
the engine: the `DiffusionLM` interface (device, dtype, special ids, limits, layers for cancel),
checkpoint names that match what `save_pretrained` writes, and the three calls the uniform loop
(engine/kinds/uniform.py) makes: `new_cache`, `encode` (a prompt or a finished canvas into the K/V
cache, once) and `denoise` (one decoder forward over a canvas that reads the cache).

Text only: the vision tower is built so that a real checkpoint's tensors load strictly, but a
prompt holding an image/audio/video token is refused. Attention runs transformers' eager kernels.
docs/algorithms.md §9 lists the config fields read.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
from torch import nn

from ..errors import EngineError
from .base import DiffusionLM

MODEL_TYPE = "diffusion_gemma"
# Top-level config ids of tokens that stand for non-text inputs (Gemma 4's names).
_MEDIA_TOKEN_FIELDS = ("image_token_id", "boi_token_id", "eoi_token_id", "audio_token_id", "boa_token_id", "eoa_token_id", "video_token_id")


def _hf_config(raw: Mapping[str, Any]):
    """transformers' DiffusionGemmaConfig from config.json, with eager attention."""
    from transformers import DiffusionGemmaConfig

    if not isinstance(raw.get("text_config"), dict):
        raise EngineError("DiffusionGemma config.json needs a text_config object")
    if raw.get("vision_config") is not None and not isinstance(raw.get("vision_config"), dict):
        raise EngineError("DiffusionGemma config.json: vision_config must be an object")
    text = raw["text_config"]
    for key in ("num_experts", "top_k_experts", "moe_intermediate_size"):
        if not isinstance(text.get(key), int) or isinstance(text.get(key), bool) or text[key] < 1:
            raise EngineError(f"DiffusionGemma config.json: text_config.{key} must be a positive integer (its layers are always MoE)")
    config = DiffusionGemmaConfig.from_dict(dict(raw))
    config._attn_implementation = "eager"
    return config


class DiffusionGemmaLM(DiffusionLM):
    """A DiffusionGemma checkpoint; `config` is config.json as read (what save_model writes back)."""

    diffusion_kind = "uniform"

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__()
        from transformers import DiffusionGemmaForBlockDiffusion

        self.config = dict(config)
        hf = DiffusionGemmaForBlockDiffusion(_hf_config(self.config)).eval()
        # Registered under transformers' own names, so state_dict names are the checkpoint's; the
        # wrapper itself is kept out of the module tree (one owner per parameter).
        self.model, self.lm_head = hf.model, hf.lm_head
        object.__setattr__(self, "hf", hf)
        text = hf.config.text_config
        self.text_config = text
        eos = text.eos_token_id
        self._eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
        if not self._eos_ids or text.pad_token_id is None:
            raise EngineError("DiffusionGemma config.json: text_config needs eos_token_id and pad_token_id")
        self._media_ids = {int(v) for k in _MEDIA_TOKEN_FIELDS if isinstance(v := self.config.get(k), int)}

    # ---- the DiffusionLM interface ----------------------------------------------------------
    @property
    def mask_token_id(self) -> int:
        """A uniform-state model has no [MASK]. The pad id stands in: it fills a row after its EOS
        and the positions not generated yet, so the counting rules that skip [MASK] skip those."""
        return int(self.text_config.pad_token_id)

    @property
    def eos_token_id(self) -> int:
        return int(self._eos_ids[0])

    @property
    def eos_token_ids(self) -> list[int]:
        """Every id text_config lists as ending a row (Gemma lists several)."""
        return [int(i) for i in self._eos_ids]

    @property
    def special_ids(self) -> dict[str, list[int]]:
        """No [MASK]: the pad id (which stands in for it) and the end-of-text ids."""
        return {"eos_token_id": self.eos_token_ids, "pad_token_id": [self.mask_token_id]}

    @property
    def canvas_length(self) -> int:
        """The canvas (block) length the checkpoint was trained with and transformers decodes with."""
        return int(self.hf.config.canvas_length)

    @property
    def vocab_size(self) -> int:
        return int(self.text_config.vocab_size)

    @property
    def max_positions(self) -> int | None:
        return int(self.text_config.max_position_embeddings)

    def embedding_weight(self) -> torch.Tensor:
        return self.model.decoder.embed_tokens.weight

    def layer_modules(self) -> nn.ModuleList:
        """Encoder layers then decoder layers: every layer a forward of either kind runs."""
        return nn.ModuleList([*self.model.encoder.language_model.layers, *self.model.decoder.layers])

    # ---- checkpoints: the names save_pretrained writes ---------------------------------------
    def _ties(self) -> dict[str, str]:
        """Tied parameter name -> the name that owns it (transformers' tie map)."""
        return dict(self.hf.all_tied_weights_keys)

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, torch.Tensor]:
        """Each tensor once, under its owner's name, as save_pretrained writes it (tied copies are
        not stored; safetensors refuses two names for one memory)."""
        state = super().state_dict(*args, **kwargs)
        prefix = kwargs.get("prefix", "")
        for tied in self._ties():
            state.pop(prefix + tied, None)
        return state

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False):
        """Fill the tied names from their owners, load, and tie them again (assigning replaces
        parameters one name at a time)."""
        full = dict(state_dict)
        for tied, owner in self._ties().items():
            if owner in full:
                full.setdefault(tied, full[owner])
        if full:
            self._materialize_buffers(next(iter(full.values())).device)
        result = super().load_state_dict(full, strict=strict, assign=assign)
        self.hf.tie_weights()
        return result

    def _materialize_buffers(self, device: torch.device) -> None:
        """A skeleton built on the meta device (engine/models/loader.py) has no values for the
        buffers a checkpoint does not store (RoPE frequencies, embedding scales): allocate them on
        `device` and let transformers' own initialiser compute them, as its from_pretrained does.
        Runs before the weights load, so the initialiser only touches meta parameters."""
        owners = set()
        for name, buffer in self.hf.named_non_persistent_buffers():
            if buffer.device.type == "meta":
                owner_name, _, attr = name.rpartition(".")
                owner = self.hf.get_submodule(owner_name)
                owner.register_buffer(attr, torch.empty_like(buffer, device=device), persistent=False)
                owners.add(owner)
        from transformers import PreTrainedModel

        with torch.no_grad():
            for owner in owners:
                if owner.__class__.__name__.endswith("VisionRotaryEmbedding"):
                    # DiffusionGemma's initialiser looks the vision tower's "axial" RoPE up in a
                    # table that lacks it (transformers 5.24); the generic initialiser has it.
                    PreTrainedModel._init_weights(self.hf, owner)
                else:
                    self.hf._init_weights(owner)

    def forward(
        self,
        input_ids: torch.Tensor,
        decoder_input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        self_conditioning_logits: torch.Tensor | None = None,
        self_conditioning_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Training's forward: encode `input_ids` into a fresh cache and denoise the canvas
        `decoder_input_ids` after it (transformers' own full forward); logits `[B, L, V]`.
        `attention_mask` `[B, P]` marks the prefix's real tokens (left padding is False)."""
        decoder_mask = None
        if attention_mask is not None:
            decoder_mask = torch.nn.functional.pad(attention_mask.bool(), (0, decoder_input_ids.shape[1]), value=True)
        conditioning = {"self_conditioning_logits": self_conditioning_logits, "self_conditioning_mask": self_conditioning_mask}
        return self.hf(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids, decoder_attention_mask=decoder_mask, **conditioning).logits

    # ---- the calls the uniform loop makes -----------------------------------------------------
    def check_text_only(self, prompts: list[list[int]]) -> None:
        """EngineError for a prompt holding an image/audio/video token: this engine feeds text only."""
        for row, prompt in enumerate(prompts):
            found = self._media_ids.intersection(prompt)
            if found:
                raise EngineError(f"prompt {row} holds media token id {min(found)}: DiffusionGemma runs text-only here (no image, audio or video inputs)")

    def new_cache(self):
        """An empty K/V cache for the encoder to fill (transformers' DynamicCache)."""
        from transformers import DynamicCache

        return DynamicCache(config=self.hf.config.get_text_config(decoder=True))

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, cache) -> None:
        """Append `input_ids`' K/V to `cache` (the prompt, or a finished canvas), as generate's
        encoder step does. `attention_mask` `[B, cached + q]` (bool) covers the cache and these ids."""
        encoder = self.model.encoder
        ids = input_ids.clone(memory_format=torch.contiguous_format)
        shape_only = torch.empty((ids.shape[0], ids.shape[1], 0), dtype=self.dtype, device=ids.device)
        masks = encoder.create_masks_for_generate(
            config=self.hf.config, inputs_embeds=shape_only, attention_mask=attention_mask, cache=cache, position_ids=position_ids
        )
        encoder(input_ids=ids, attention_mask=masks, cache=cache, position_ids=position_ids)

    def decoder_masks(self, canvas: torch.Tensor, cache, attention_mask: torch.Tensor) -> dict:
        """The decoder's attention masks for a canvas over `cache` (once per canvas). The shape
        stand-in is float in the model's dtype: transformers 5.24's generate passes the token ids,
        whose integer dtype the eager additive mask cannot take (its padded batches fail there)."""
        shape_only = torch.empty((*canvas.shape, 0), dtype=self.dtype, device=canvas.device)
        return self.model.decoder.create_diffusion_decoder_attention_mask(
            config=self.hf.config, inputs_embeds=shape_only, cache=cache, decoder_attention_mask=attention_mask
        )

    def denoise(self, canvas: torch.Tensor, cache, masks: dict, position_ids: torch.Tensor, self_conditioning: torch.Tensor | None) -> torch.Tensor:
        """Logits `[B, L, V]` (fp32, soft-capped) for every canvas position; the cache is only read."""
        return self.hf(decoder_input_ids=canvas, self_conditioning_logits=self_conditioning, decoder_attention_mask=masks, cache=cache, decoder_position_ids=position_ids).logits

    # ---- several runs' calls as one (engine/serving/packed.py) ---------------------------------
    routed_calls = ("encode", "denoise")

    def pack_key(self, method: str, inputs: dict[str, Any]) -> Any:
        """Denoising forwards of one unpadded row each (a run of one prompt: its masks are none)
        over a cache of transformers' dynamic kind pack together, whatever their prompt lengths,
        canvases and steps; an encoder forward writes its run's cache, so it runs alone."""
        if method != "denoise" or inputs["canvas"].shape[0] != 1 or inputs["cache"].is_compileable:
            return None
        return None if any(mask is not None for mask in inputs["masks"].values()) else inputs["canvas"].shape[1]

    def run_packed(self, method: str, calls: list[dict[str, Any]]) -> list[torch.Tensor]:
        """Each denoising call's logits, from one decoder forward over their canvases (`pack_key`).

        Each row keeps its own positions and self-conditioning (a row on its first step has none:
        zeroed by transformers' per-row `self_conditioning_mask`, as none is). The rows' caches, of
        different lengths, are stacked left-padded per layer, and the pad is masked out (an
        additive mask of the dtype's least value, which the softmax turns into exact zeros), so a
        row attends to its own keys only: its logits are its solo call's up to floating-point
        summation order (a longer key axis, matrix products over more rows)."""
        if method != "denoise":
            return super().run_packed(method, calls)
        from transformers import DynamicCache

        rows, width = len(calls), calls[0]["canvas"].shape[1]
        device, least = calls[0]["canvas"].device, torch.finfo(self.dtype).min
        stacked, masks = [], {}
        for index, kind in enumerate(self.text_config.layer_types):
            keys = [call["cache"].layers[index].keys for call in calls]
            longest = max(k.shape[2] for k in keys)
            pads = [longest - k.shape[2] for k in keys]
            stacked.append(tuple(
                torch.cat([nn.functional.pad(getattr(call["cache"].layers[index], part), (0, 0, pad, 0)) for call, pad in zip(calls, pads)])
                for part in ("keys", "values")
            ))
            if kind not in masks:  # every layer of a kind holds as many keys (transformers' masks are per kind too)
                blocked = torch.arange(longest + width, device=device).unsqueeze(0) < torch.tensor(pads, device=device).unsqueeze(1)
                masks[kind] = torch.zeros(rows, 1, width, longest + width, dtype=self.dtype, device=device).masked_fill(blocked[:, None, None, :], least)
        conditioned = [call["self_conditioning"] is not None for call in calls]
        conditioning, conditioning_mask = None, None
        if any(conditioned):
            present = calls[conditioned.index(True)]["self_conditioning"]
            conditioning = torch.cat([c["self_conditioning"] if c["self_conditioning"] is not None else torch.zeros_like(present) for c in calls])
            conditioning_mask = None if all(conditioned) else torch.tensor(conditioned, device=device)
        logits = self.hf(
            decoder_input_ids=torch.cat([c["canvas"] for c in calls]), self_conditioning_logits=conditioning, self_conditioning_mask=conditioning_mask,
            decoder_attention_mask=masks, cache=DynamicCache(ddp_cache_data=stacked, config=self.hf.config), decoder_position_ids=torch.cat([c["position_ids"] for c in calls]),
        ).logits
        return list(logits.split(1))


def is_diffusion_gemma(config: Mapping[str, Any]) -> bool:
    return config.get("model_type") == MODEL_TYPE or "DiffusionGemmaForBlockDiffusion" in (config.get("architectures") or [])
