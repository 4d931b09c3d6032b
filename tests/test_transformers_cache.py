"""NVFP4Cache (python/nvfp4kv/transformers_cache.py) against a dense cache quantized by the reference.

A tiny random Llama generates greedily with both caches: the same tokens and the same logits, bit for
bit, since both attend over the same dequantized values; and logits that differ from an unquantized
cache, so the quantization is really there.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from transformers.cache_utils import Cache, DynamicLayer  # noqa: E402

from nvfp4kv import reference  # noqa: E402


class ReferenceLayer(DynamicLayer):
    """A dense [B, H, S, D] cache whose rows are the reference's NVFP4 round trip of bf16 K/V."""

    def __init__(self, k_scale, v_scale, scale_search):
        super().__init__()
        self.scales, self.scale_search = [k_scale, v_scale], scale_search

    def update(self, key_states, value_states, *args, **kwargs):
        def round_trip(x, which):
            x = x.to(torch.bfloat16)
            if self.scales[which] is None:  # calibrated on the first update: amax / (6 * 448)
                self.scales[which] = float(x.abs().max().float()) / (6 * 448)
            scale = self.scales[which]
            packed, sf = reference.quantize(x, scale, self.scale_search)
            return reference.dequantize(packed, sf, scale).to(key_states.dtype)

        return super().update(round_trip(key_states, 0), round_trip(value_states, 1))


def reference_cache(config, k_scales, v_scales, scale_search):
    layers = config.num_hidden_layers
    k_scales, v_scales = k_scales or [None] * layers, v_scales or [None] * layers
    return Cache(layers=[ReferenceLayer(k, v, scale_search) for k, v in zip(k_scales, v_scales)])


def tiny_llama():
    config = transformers.LlamaConfig(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def generate(model, prompt, cache):
    from nvfp4kv.transformers_cache import cache_keyword

    with torch.inference_mode():
        out = model.generate(
            prompt,
            **{cache_keyword(model): cache},
            max_new_tokens=12,
            do_sample=False,
            output_scores=True,
            return_dict_in_generate=True,
            pad_token_id=0,
        )
    return out.sequences, torch.stack(out.scores)


@pytest.mark.parametrize("scale_search", ["none", "4over6"])
@pytest.mark.parametrize("scales", ["calibrated", "given"])
def test_generation_matches_the_reference_quantization(scales, scale_search):
    from nvfp4kv.transformers_cache import NVFP4Cache

    model = tiny_llama()
    prompt = torch.randint(1, 97, (2, 7), generator=torch.Generator().manual_seed(1))
    k_scales = [0.003, 0.005] if scales == "given" else None
    v_scales = [0.004, 0.002] if scales == "given" else None
    ours = generate(model, prompt, NVFP4Cache(model.config, k_scales, v_scales, page_size=4, scale_search=scale_search))
    theirs = generate(model, prompt, reference_cache(model.config, k_scales, v_scales, scale_search))
    unquantized = generate(model, prompt, None)
    assert torch.equal(ours[0], theirs[0])
    assert torch.equal(ours[1], theirs[1])
    assert not torch.equal(ours[1], unquantized[1])
