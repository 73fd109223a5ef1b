"""The analytic cost model agrees with PyTorch's own FLOP counter."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import vitkit
from vitkit.models import get_model_config
from vitkit.models.complexity import complexity


@pytest.mark.parametrize("kw", [{}, {"representation_size": 48, "class_token": False, "global_pool": "avg",
                                     "img_size": (32, 64)}])
def test_macs_match_flop_counter(kw):
    config = get_model_config("Ti/16").replace(img_size=kw.pop("img_size", 64), patch_size=8, depth=3,
                                               num_classes=10, **kw)
    model = vitkit.VisionTransformer(config).eval()
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(torch.randn(1, 3, *config.img_size), return_attention=True)  # explicit matmuls are counted
    c = complexity(config)
    assert counter.get_total_flops() == c.flops
    assert c.params == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name, kw", [
    ("vit_base_patch16_siglip_224", dict(depth=2, img_size=64)),  # the MAP head
    ("eva02_base_patch14_224", dict(depth=2, img_size=56)),  # SwiGLU, rotary positions
    ("vit_large_patch16_sapiens2", dict(img_size=(48, 32))),  # grouped-query attention, registers, packed SwiGLU
    ("vit_small_patch14_reg4_dinov2", dict(depth=2, img_size=70, num_classes=10)),  # registers
    ("vit_relpos_medium_patch16_cls_224", dict(depth=2, img_size=64)),  # a bias MLP in every layer
    ("vit_srelpos_small_patch16_224", dict(depth=2, img_size=64)),  # one bias MLP for all
])
def test_macs_of_the_later_vits_match_flop_counter(name, kw):
    model = vitkit.create_model(name, **kw).eval().requires_grad_(False)
    counter = FlopCounterMode(display=False)
    with counter:
        model(torch.randn(1, 3, *model.config.img_size), return_attention=True)
    c = complexity(model.config)
    assert counter.get_total_flops() == c.flops
    assert c.params == sum(p.numel() for p in model.parameters())


def test_reference_numbers():
    c = complexity(get_model_config("vit_base_patch16_224"))
    assert round(c.macs / 1e9, 1) == 17.6 and c.tokens == 197  # the DeiT paper's "17.6 GFLOPs" are MACs
