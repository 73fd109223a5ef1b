"""The ResNet hybrid (paper section 3.1) and the ResNetV2 classifier: counts, timm parity in
both directions, the official npz hybrid layout, config.json round trips, clear errors."""

import json
import re
from functools import partial

import numpy as np
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import vitkit
from conftest import max_diff, randomize
from vitkit.models import ResNetV2, ResNetV2Config, VisionTransformer, ViTConfig, count_parameters
from vitkit.models.complexity import complexity
from vitkit.weights import WeightsError

TOL = 1e-5

#: timm 1.0.31, ``timm.create_model(name, num_classes=1000)``, counted on the meta device.
TIMM_COUNTS = {
    "vit_tiny_r_s16_p8_224": 6_337_704,
    "vit_tiny_r_s16_p8_384": 6_355_944,
    "vit_small_r26_s32_224": 36_431_912,
    "vit_small_r26_s32_384": 36_468_392,
    "vit_base_r26_s32_224": 101_383_976,
    "vit_base_r50_s16_224": 98_659_112,
    "vit_base_r50_s16_384": 98_950_952,
    "vit_large_r50_s32_224": 328_994_856,
    "vit_large_r50_s32_384": 329_092_136,
}
GRIDS = {"vit_tiny_r_s16_p8_224": (7, 7), "vit_base_r50_s16_224": (14, 14), "vit_base_r50_s16_384": (24, 24),
         "vit_large_r50_s32_384": (12, 12)}


def hybrid_config(layers=(1, 1), img_size=(44, 28), patch=1, **kw):
    base = dict(img_size=img_size, patch_size=patch, embed_dim=64, depth=2, num_heads=2, mlp_dim=256,
                num_classes=5, backbone={"type": "resnetv2", "layers": list(layers)})
    base.update(kw)
    return ViTConfig(**base)


# ------------------------------------------------------------------ registry and counts


@pytest.mark.parametrize("name", sorted(TIMM_COUNTS))
def test_registered_hybrid_counts_equal_timm(name):
    with torch.device("meta"):
        model = vitkit.create_model(name)
    assert count_parameters(model) == TIMM_COUNTS[name]
    if name in GRIDS:
        assert model.patch_embed.grid_size == GRIDS[name] == model.config.grid_size
    assert complexity(model.config).params == TIMM_COUNTS[name]


@pytest.mark.parametrize("name", ["vit_tiny_r_s16_p8_224", "vit_small_r26_s32_224", "vit_base_r50_s16_384",
                                  "vit_large_r50_s32_224"])
def test_state_dict_names_and_shapes_equal_timm(name):
    timm = pytest.importorskip("timm")
    with torch.device("meta"):
        ref = timm.create_model(name, pretrained=False, num_classes=1000)
        ours = vitkit.create_model(name)
    a = {k: tuple(v.shape) for k, v in ref.state_dict().items()}
    b = {k: tuple(v.shape) for k, v in ours.state_dict().items()}
    assert a == b
    assert sum(p.numel() for p in ref.parameters()) == TIMM_COUNTS[name]


def test_paper_r50_hybrid_structure():
    with torch.device("meta"):
        model = vitkit.create_model("vit_base_r50_s16_224")
    pe = model.patch_embed
    assert model.config.backbone == {"type": "resnetv2", "layers": [3, 4, 9], "width_factor": 1}
    assert [len(s.blocks) for s in pe.backbone.stages] == [3, 4, 9]
    assert pe.reduction == 16 and pe.proj_patch_size == (1, 1) and pe.patch_size == (16, 16)
    assert pe.proj.weight.shape == (768, 1024, 1, 1) and model.patch_size == (16, 16)
    blk = pe.backbone.stages[1].blocks[0]
    assert blk.conv2.stride == (2, 2) and blk.downsample.conv.stride == (2, 2)
    assert blk.conv1.eps == 1e-8 and blk.norm1.num_groups == 32 and blk.norm1.eps == 1e-5
    assert blk.norm1.act and not blk.norm3.act and not blk.downsample.norm.act
    assert pe.backbone.stages[1].blocks[1].downsample is None


# ------------------------------------------------------------------ timm parity


def timm_hybrid(layers, cfg):
    """timm's own classes with the same configuration (its ViT hybrid helper's backbone)."""
    from timm.layers import HybridEmbed
    from timm.models import VisionTransformer as TimmViT
    from timm.models.vision_transformer_hybrid import _resnetv2

    backbone = _resnetv2(layers=tuple(layers), in_chans=cfg.in_chans)
    return TimmViT(img_size=cfg.img_size, patch_size=cfg.patch_size, in_chans=cfg.in_chans,
                   num_classes=cfg.num_classes, embed_dim=cfg.embed_dim, depth=cfg.depth,
                   num_heads=cfg.num_heads, mlp_ratio=cfg.mlp_dim / cfg.embed_dim,
                   embed_layer=partial(HybridEmbed, backbone=backbone))


@pytest.mark.parametrize("kernel,stride,size", [(7, 2, (23, 16)), (3, 2, (11, 10)), (1, 2, (9, 8)), (3, 1, (7, 6))])
def test_std_conv_same_equals_timm(kernel, stride, size):
    """Weight standardisation (biased variance, eps 1e-8) and SAME padding, layer by layer."""
    pytest.importorskip("timm")
    from timm.layers import StdConv2dSame as TimmStdConv

    from vitkit.models.hybrid import StdConv2dSame

    ref = TimmStdConv(8, 4, kernel, stride=stride, eps=1e-8)
    ours = StdConv2dSame(8, 4, kernel, stride=stride)
    with torch.no_grad():
        w = torch.randn(ref.weight.shape, generator=torch.Generator().manual_seed(0)) * 1e-3 + 1e-3
        ref.weight.copy_(w)
        ours.weight.copy_(w)  # tiny weights: eps and the variance estimator both show
        x = torch.randn(2, 8, *size, generator=torch.Generator().manual_seed(1))
        a, b = ref(x), ours(x)
    assert a.shape == b.shape and max_diff(a, b) <= 1e-4 * a.abs().max().item()


CASES = {
    # the stem-only hybrid (vit_tiny_r_s16_p8): patch 8 on the stride-4 stem
    "stem_p8": dict(layers=(), img_size=64, patch=8),
    # two stages at an odd size: SAME padding is asymmetric on 11 and 7 (ceil at each stride)
    "stages_odd": dict(layers=(1, 2), img_size=(44, 28)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_timm_to_vitkit_parity(case, images):
    pytest.importorskip("timm")
    kw = dict(CASES[case])
    layers = kw.pop("layers")
    cfg = hybrid_config(layers, **kw)
    ref = randomize(timm_hybrid(layers, cfg))
    ours = VisionTransformer(cfg).eval()
    assert ours.patch_embed.grid_size == tuple(ref.patch_embed.grid_size)
    report = vitkit.load_weights(ours, ref.state_dict())
    assert report.format == "timm" and not report.missing and not report.unexpected
    x = images(2, *cfg.img_size)
    with torch.no_grad():
        a, b = ref(x), ours(x)
    assert a.std() > 1e-2 and max_diff(a, b) <= TOL


@pytest.mark.parametrize("case", sorted(CASES))
def test_vitkit_to_timm_export_parity(case, tmp_path, images):
    pytest.importorskip("timm")
    from safetensors.torch import load_file

    kw = dict(CASES[case])
    layers = kw.pop("layers")
    cfg = hybrid_config(layers, **kw)
    ours = randomize(VisionTransformer(cfg), seed=3)
    path = vitkit.export_weights(ours, tmp_path / "hybrid.safetensors", "timm")
    ref = timm_hybrid(layers, cfg).eval()
    ref.load_state_dict(load_file(str(path)), strict=True)
    x = images(2, *cfg.img_size, seed=4)
    with torch.no_grad():
        a, b = ref(x), ours(x)
    assert a.std() > 1e-2 and max_diff(a, b) <= TOL


def test_bare_timm_file_rebuilds_the_hybrid(tmp_path, images):
    """A timm state dict alone: backbone stages, input channels and image size from the shapes."""
    pytest.importorskip("timm")
    from safetensors.torch import save_file

    cfg = hybrid_config((1, 1), img_size=32)
    ref = randomize(timm_hybrid((1, 1), cfg))
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, str(tmp_path / "m.safetensors"))
    ours = vitkit.from_pretrained(tmp_path / "m.safetensors", num_heads=2)
    assert ours.config.backbone["layers"] == [1, 1] and ours.config.img_size == (32, 32)
    assert ours.config.in_chans == 3 and ours.config.patch_size == (1, 1)
    x = images(2, 32, 32)
    with torch.no_grad():
        assert max_diff(ref(x), ours(x)) <= TOL


# ------------------------------------------------------------------ official npz


def official_hybrid_arrays(sd, num_heads, gn_4d=False):
    """timm names -> the official vit_jax hybrid npz naming, written by hand (the spec).

    CNN: conv_root, gn_root, block{s}/unit{u}/{conv1..3, gn1..3, conv_proj, gn_proj} from 1;
    kernels HWIO; GroupNorm parameters (C,), or (1, 1, 1, C) as some checkpoints store them.
    """
    sd = {k: v.detach().numpy() for k, v in sd.items()}
    gn = (lambda a: a.reshape(1, 1, 1, -1)) if gn_4d else (lambda a: a)
    hwio = lambda a: np.transpose(a, (2, 3, 1, 0))  # noqa: E731
    w = {}
    stem = "patch_embed.backbone.stem." if "patch_embed.backbone.stem.conv.weight" in sd else "patch_embed.backbone."
    w["conv_root/kernel"] = hwio(sd[stem + "conv.weight"])
    w["gn_root/scale"], w["gn_root/bias"] = gn(sd[stem + "norm.weight"]), gn(sd[stem + "norm.bias"])
    unit = re.compile(r"^patch_embed\.backbone\.stages\.(\d+)\.blocks\.(\d+)\."
                      r"(downsample\.)?(conv|norm)(\d?)\.(weight|bias)$")
    for k, v in sd.items():
        m = unit.match(k)
        if m:
            s, u, down, kind, i, leaf = m.groups()
            p = f"block{int(s) + 1}/unit{int(u) + 1}/"
            if kind == "conv":
                w[p + ("conv_proj" if down else f"conv{i}") + "/kernel"] = hwio(v)
            else:
                w[p + ("gn_proj" if down else f"gn{i}") + ("/scale" if leaf == "weight" else "/bias")] = gn(v)
    D = sd["cls_token"].shape[-1]
    H = num_heads
    w["embedding/kernel"], w["embedding/bias"] = hwio(sd["patch_embed.proj.weight"]), sd["patch_embed.proj.bias"]
    w["cls"] = sd["cls_token"]
    w["Transformer/posembed_input/pos_embedding"] = sd["pos_embed"]
    depth = len({k.split(".")[1] for k in sd if k.startswith("blocks.")})
    for i in range(depth):
        b, p = f"blocks.{i}.", f"Transformer/encoderblock_{i}/"
        w[p + "LayerNorm_0/scale"], w[p + "LayerNorm_0/bias"] = sd[b + "norm1.weight"], sd[b + "norm1.bias"]
        w[p + "LayerNorm_2/scale"], w[p + "LayerNorm_2/bias"] = sd[b + "norm2.weight"], sd[b + "norm2.bias"]
        mha = p + "MultiHeadDotProductAttention_1/"
        for j, name in enumerate(("query", "key", "value")):
            w[f"{mha}{name}/kernel"] = sd[b + "attn.qkv.weight"][j * D:(j + 1) * D].T.reshape(D, H, D // H)
            w[f"{mha}{name}/bias"] = sd[b + "attn.qkv.bias"][j * D:(j + 1) * D].reshape(H, D // H)
        w[f"{mha}out/kernel"] = sd[b + "attn.proj.weight"].T.reshape(H, D // H, D)
        w[f"{mha}out/bias"] = sd[b + "attn.proj.bias"]
        for j, fc in enumerate(("fc1", "fc2")):
            w[f"{p}MlpBlock_3/Dense_{j}/kernel"] = sd[f"{b}mlp.{fc}.weight"].T
            w[f"{p}MlpBlock_3/Dense_{j}/bias"] = sd[f"{b}mlp.{fc}.bias"]
    w["Transformer/encoder_norm/scale"], w["Transformer/encoder_norm/bias"] = sd["norm.weight"], sd["norm.bias"]
    w["head/kernel"], w["head/bias"] = sd["head.weight"].T, sd["head.bias"]
    return w


@pytest.mark.parametrize("layers,gn_4d", [pytest.param((1, 1), True, marks=pytest.mark.slow), ((), False)])
def test_official_npz_hybrid_loads_with_timm_parity(layers, gn_4d, tmp_path, images):
    pytest.importorskip("timm")
    size = 32 if layers else 64
    cfg = hybrid_config(layers, img_size=size, patch=8 if not layers else 1)
    ref = randomize(timm_hybrid(layers, cfg))
    np.savez(tmp_path / "official.npz", **official_hybrid_arrays(ref.state_dict(), cfg.num_heads, gn_4d))
    # the file is the real official layout: timm's own reader takes it
    check = timm_hybrid(layers, cfg).eval()
    check.load_pretrained(str(tmp_path / "official.npz"))
    x = images(2, size, size)
    with torch.no_grad():
        expected = ref(x)
        assert max_diff(check(x), expected) <= TOL
    # vitkit from the file alone (official weights run tanh GELU; timm uses the exact one)
    ours = vitkit.from_pretrained(tmp_path / "official.npz", gelu="exact")
    assert ours.config.backbone["layers"] == list(layers) and ours.config.img_size == (size, size)
    assert ours.config.num_heads == 2 and ours.config.in_chans == 3
    with torch.no_grad():
        assert expected.std() > 1e-2 and max_diff(ours(x), expected) <= TOL
    # and into an existing model
    model = VisionTransformer(cfg).eval()
    assert vitkit.load_weights(model, tmp_path / "official.npz").format == "npz"
    with torch.no_grad():
        assert max_diff(model(x), expected) <= TOL


def test_vitkit_npz_export_read_by_timm(tmp_path, images):
    pytest.importorskip("timm")
    cfg = hybrid_config((1, 1), img_size=32)
    ours = randomize(VisionTransformer(cfg), seed=5)
    path = vitkit.export_weights(ours, tmp_path / "hybrid.npz", "npz")
    ref = timm_hybrid((1, 1), cfg).eval()
    ref.load_pretrained(str(path))
    x = images(2, 32, 32)
    with torch.no_grad():
        a, b = ref(x), ours(x)
    assert a.std() > 1e-2 and max_diff(a, b) <= TOL
    back = VisionTransformer(cfg).eval()
    vitkit.load_weights(back, path)
    for (k, v), (k2, v2) in zip(ours.state_dict().items(), back.state_dict().items()):
        assert k == k2 and torch.equal(v, v2), k


def test_bad_npz_hybrid_layouts_are_refused_by_name(tmp_path):
    model = randomize(VisionTransformer(hybrid_config((1, 1), img_size=32)))
    arrays = vitkit.weights.npz_format.from_native(model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    broken = {k: v for k, v in arrays.items() if k != "block2/unit1/gn2/scale"}
    np.savez(tmp_path / "missing.npz", **broken)
    with pytest.raises(WeightsError, match=r"block2/unit1.*missing.*gn2/scale"):
        vitkit.load_weights(model, tmp_path / "missing.npz")
    gap = {k.replace("block2/", "block3/"): v for k, v in arrays.items()}
    np.savez(tmp_path / "gap.npz", **gap)
    with pytest.raises(WeightsError, match=r"numbered \[1, 3\]"):
        vitkit.load_weights(model, tmp_path / "gap.npz")
    odd = dict(arrays, **{"block1/unit1/gn1/scale": np.zeros((2, 32), np.float32)})
    np.savez(tmp_path / "odd.npz", **odd)
    with pytest.raises(WeightsError, match=r"gn1/scale has shape \(2, 32\)"):
        vitkit.load_weights(model, tmp_path / "odd.npz")
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k  # nothing half-copied


def test_hybrid_exports_that_cannot_express_it_are_refused(tmp_path):
    model = VisionTransformer(hybrid_config((1,), img_size=32))
    with pytest.raises(WeightsError, match="big_vision has no ResNet hybrid"):
        vitkit.export_weights(model, tmp_path / "bv.npz", "big_vision")
    with pytest.raises(WeightsError, match="ResNet hybrid is not an HF ViT"):
        vitkit.export_weights(model, tmp_path / "hf", "hf")
    assert not (tmp_path / "bv.npz").exists() and not (tmp_path / "hf").exists()
    stem = vitkit.create_model("vit_fmnist_hybrid")  # a conv stem: no layout but vitkit's and timm's holds it
    for layout, path in (("big_vision", "bv.npz"), ("npz", "vj.npz"), ("hf", "hf")):  # (npz was suggested for it)
        with pytest.raises(WeightsError) as refused:
            vitkit.export_weights(stem, tmp_path / path, layout)
        assert "'conv'" in str(refused.value) and "as 'vitkit' or 'timm'" in str(refused.value) and "'npz'" not in \
            str(refused.value), (layout, str(refused.value))


# ------------------------------------------------------------------ config, sizes, errors


def test_config_json_round_trip(tmp_path, images):
    model = randomize(vitkit.create_model("vit_tiny_r_s16_p8_224", img_size=64, depth=1, num_classes=4))
    model.save_pretrained(tmp_path / "m")
    stored = json.loads((tmp_path / "m" / "config.json").read_text())["config"]
    assert stored["backbone"] == {"type": "resnetv2", "layers": [], "width_factor": 1}
    back = vitkit.from_pretrained(tmp_path / "m")
    assert back.config == model.config and isinstance(back.patch_embed, type(model.patch_embed))
    x = images(2, 64, 64)
    with torch.no_grad():
        assert torch.equal(model(x), back(x))


@pytest.mark.parametrize("backbone,match", [
    ({"type": "resnet", "layers": [3]}, "backbone type"),
    ({"type": "resnetv2", "layers": [3, 0]}, "at least one block"),
    ({"type": "resnetv2", "layers": [1, 1, 1, 1, 1]}, "at most 4 stages"),
    ({"type": "resnetv2", "layers": "3,4,9"}, "list of block counts"),
    ({"type": "resnetv2", "layers": [3], "depth": 50}, "unknown field"),
    ({"type": "resnetv2", "layers": [3], "width_factor": 0}, "width_factor"),
    ([3, 4, 9], "must be a dict"),
    ({"type": "conv", "channels": [32, 60], "strides": [1, 2]}, "multiples of 8"),
    ({"type": "conv", "channels": [32, 64], "strides": [1]}, "one per layer"),
    ({"type": "conv", "channels": [32, 64], "strides": [1, 3]}, "strides must be 1 or 2"),
    ({"type": "conv", "channels": [], "strides": []}, "non-empty"),
    ({"type": "conv", "channels": [32], "strides": [1], "layers": [1]}, "unknown field"),
    ({"type": "conv_bn", "channels": [192, 768], "kernels": [4]}, "one per layer"),
    ({"type": "conv_bn", "channels": [192, 768], "kernels": [4, 0]}, "kernels must be integers"),
    ({"type": "conv_bn", "channels": [192, 512], "kernels": [4, 4]}, "makes the tokens itself"),
])
def test_bad_backbone_config_is_a_clear_error(backbone, match):
    with pytest.raises(ValueError, match=match):
        ViTConfig(backbone=backbone)
    with pytest.raises(ValueError, match=match):
        vitkit.create_model("vit_base_r50_s16_224", backbone=backbone)


def test_image_size_that_does_not_tile_is_refused():
    # stem-only: 72 px -> 18 after the stride-4 stem, not a multiple of the 8x8 projection
    with pytest.raises(ValueError, match=r"18x18 backbone feature map.*multiple of 32x32"):
        vitkit.create_model("vit_tiny_r_s16_p8_224", img_size=72)
    model = vitkit.create_model("vit_tiny_r_s16_p8_224", img_size=64, depth=1, dynamic_img_size=True)
    with pytest.raises(ValueError, match="not divisible by the projection patch"):
        model(torch.zeros(1, 3, 72, 64))


def test_odd_sizes_follow_same_padding_and_dynamic_size(images):
    model = randomize(VisionTransformer(hybrid_config((1, 1), img_size=32, dynamic_img_size=True)))
    assert model.patch_embed.grid_for((70, 33)) == (9, 5)  # ceil at every stride-2 layer
    x = images(1, 70, 33)
    with torch.no_grad():
        dynamic = model(x)
        model.set_input_size((70, 33))
        fixed = model(x)
    assert model.pos_embed.shape == (1, 1 + 45, 64) and max_diff(dynamic, fixed) <= 1e-6


def test_grey_input_adapts_the_cnn_stem():
    rgb = randomize(VisionTransformer(hybrid_config((1,), img_size=32)))
    grey = VisionTransformer(hybrid_config((1,), img_size=32, in_chans=1))
    report = vitkit.load_weights(grey, rgb.state_dict())
    assert report.adapted == ["patch_embed.backbone.stem.conv.weight 3 -> 1 input channels (summed, as timm's "
                              "adapt_input_conv)"] and report.resampled == []
    assert torch.allclose(grey.patch_embed.backbone.stem.conv.weight,
                          rgb.patch_embed.backbone.stem.conv.weight.sum(1, keepdim=True))


def test_initialisation_follows_flax_defaults():
    model = VisionTransformer(hybrid_config((1,), img_size=32))
    stem = model.patch_embed.backbone.stem
    assert torch.equal(stem.norm.weight, torch.ones(64)) and torch.equal(stem.norm.bias, torch.zeros(64))
    fan_in = 3 * 7 * 7
    assert abs(stem.conv.weight.std().item() - fan_in ** -0.5) < 0.15 * fan_in ** -0.5


# ------------------------------------------------------------------ cost


@pytest.mark.parametrize("config", [
    hybrid_config((1, 1), img_size=(38, 22)),
    hybrid_config((), img_size=64, patch=8, depth=1),
    ResNetV2Config(layers=(1, 1), img_size=(30, 42), num_classes=3),
    ViTConfig(img_size=(30, 22), patch_size=1, embed_dim=32, depth=1, num_heads=2, mlp_dim=64,
              backbone={"type": "conv", "channels": [8, 16, 24], "strides": [1, 2, 2]}),
], ids=["two_stages_odd", "stem_p8", "resnet", "conv_odd"])
def test_macs_match_flop_counter(config):
    model = vitkit.models.build_from_config(config).eval()
    counter = FlopCounterMode(display=False)
    kw = {"return_attention": True} if isinstance(config, ViTConfig) else {}
    with counter, torch.no_grad():
        model(torch.randn(1, 3, *config.img_size), **kw)
    c = complexity(config)
    assert counter.get_total_flops() == c.flops and 0 < c.backbone_macs < c.macs
    assert c.params == count_parameters(model)


def test_models_table_lists_hybrids(capsys):
    from vitkit.cli import main

    assert main(["models", "--filter", "vit_*_r*"]) == 0
    out = capsys.readouterr().out
    for name in TIMM_COUNTS:
        assert name in out
    assert re.search(r"vit_base_r50_s16_224\s+98\.66M", out)


# ------------------------------------------------------------------ the CNN alone


def timm_resnet(layers, **kw):
    from timm.layers import StdConv2dSame
    from timm.models.resnetv2 import ResNetV2 as TimmResNetV2

    return TimmResNetV2(layers=list(layers), preact=False, stem_type="same",
                        conv_layer=partial(StdConv2dSame, eps=1e-8), **kw)


def test_resnet_classifier_count_and_names_equal_timm_non_preact_resnetv2():
    pytest.importorskip("timm")
    with torch.device("meta"):
        ours = vitkit.create_model("resnetv2_50_nopreact")
        ref = timm_resnet((3, 4, 6, 3), num_classes=1000)
    assert count_parameters(ours) == sum(p.numel() for p in ref.parameters()) == 25_557_032
    assert {k: tuple(v.shape) for k, v in ours.state_dict().items()} == \
           {k: tuple(v.shape) for k, v in ref.state_dict().items()}


@pytest.mark.slow
def test_resnet_classifier_parity_both_ways_and_round_trip(tmp_path, images):
    pytest.importorskip("timm")
    ref = randomize(timm_resnet((1, 1), num_classes=6, in_chans=3))
    ours = ResNetV2(ResNetV2Config(layers=(1, 1), num_classes=6, img_size=(44, 28))).eval()
    report = vitkit.load_weights(ours, ref.state_dict())
    assert report.format == "timm" and not report.missing
    x = images(2, 44, 28)
    with torch.no_grad():
        a = ref(x)
        assert a.std() > 1e-2 and max_diff(a, ours(x)) <= TOL
    # vitkit -> timm
    mine = randomize(ResNetV2(ResNetV2Config(layers=(1, 1), num_classes=6)), seed=7)
    path = vitkit.export_weights(mine, tmp_path / "r.pth", "timm")
    ref.load_state_dict(torch.load(path, weights_only=True))
    with torch.no_grad():
        assert max_diff(ref(x), mine(x)) <= TOL
    # config.json alone rebuilds it; a bare file is read off its shapes
    mine.save_pretrained(tmp_path / "native")
    back = vitkit.from_pretrained(tmp_path / "native")
    assert isinstance(back, ResNetV2) and back.config == mine.config
    bare = vitkit.from_pretrained(path)
    assert bare.config.layers == (1, 1) and bare.config.num_classes == 6
    with torch.no_grad():
        assert torch.equal(back(x), mine(x)) and torch.equal(bare(x), mine(x))
    with pytest.raises(WeightsError, match="no official JAX layout"):
        vitkit.export_weights(mine, tmp_path / "r.npz", "npz")
    fresh = vitkit.from_pretrained(tmp_path / "native", num_classes=3)  # was AttributeError: no head_names
    assert fresh.head.fc.out_channels == 3 and torch.count_nonzero(fresh.head.fc.weight) == 0
    assert torch.equal(fresh.stem.conv.weight, mine.stem.conv.weight)


def test_pre_activation_resnet_is_refused_clearly(tmp_path):
    timm = pytest.importorskip("timm")
    from safetensors.torch import save_file

    with torch.device("meta"):
        preact = timm.create_model("resnetv2_50x1_bit", pretrained=False, num_classes=3)
    sd = {k: torch.zeros(v.shape) for k, v in preact.state_dict().items()}
    save_file(sd, str(tmp_path / "bit.safetensors"))
    with pytest.raises(WeightsError, match="pre-activation"):
        vitkit.from_pretrained(tmp_path / "bit.safetensors")


# ------------------------------------------------------------------ the small conv backbone

CONV = {"type": "conv", "channels": [16, 24, 32], "strides": [1, 2, 2]}


def conv_hybrid(**kw):
    base = dict(img_size=28, patch_size=1, in_chans=1, num_classes=10, embed_dim=32, depth=2,
                num_heads=2, mlp_dim=64, global_pool="avg", class_token=False, pos_embed="sincos2d",
                backbone=CONV)
    base.update(kw)
    return randomize(VisionTransformer(ViTConfig(**base)))


def test_conv_backbone_tokens_cover_four_pixels_like_patch_4():
    model = conv_hybrid()
    assert model.patch_embed.grid_size == (7, 7) and model.patch_embed.patch_size == (4, 4)
    names = [k for k in model.state_dict() if k.startswith("patch_embed.backbone.")]
    assert names == [f"patch_embed.backbone.{i}.{m}.{p}" for i in range(3)
                     for m, p in (("conv", "weight"), ("norm", "weight"), ("norm", "bias"))]
    assert "conv[16/1, 24/2, 32/2]" in repr(model)


def test_conv_backbone_output_does_not_depend_on_the_batch():
    """GroupNorm, not BatchNorm: training steps of one image do not see the others (what makes
    DDP with any process count follow the trajectory of one process)."""
    model = conv_hybrid().train()
    x = torch.randn(6, 1, 28, 28)
    assert max_diff(model(x)[:2], model(x[:2])) < 1e-5


def test_conv_hybrid_round_trips_and_refuses_the_official_layout(tmp_path, images):
    model = conv_hybrid().eval()
    x = images(2, 28, 28, c=1)
    model.save_pretrained(tmp_path / "m")
    again = vitkit.from_pretrained(tmp_path / "m").eval()
    assert again.config.backbone == CONV
    assert max_diff(model(x), again(x)) == 0.0
    with pytest.raises(WeightsError, match="only ResNet hybrids"):
        vitkit.export_weights(model, tmp_path / "m.npz", format="npz")


# ------------------------------------------------------------------ MobileCLIP's stem (the conv_bn kind)


@pytest.mark.parametrize("img_size", [64, 72])  # 72: 18 -> 9 -> 4, the convolutions without padding floor
def test_mobileclip_stem_equals_timm_and_is_read_off_a_bare_file(img_size, tmp_path, images):
    """timm's vit_base_mci_224 (patchify convolutions with BatchNorm + GELU, the last one making the tokens,
    no projection): the same function, in eval and in training (BatchNorm's batch statistics); a bare timm
    state dict rebuilds it from its shapes."""
    timm = pytest.importorskip("timm")
    from safetensors.torch import save_file

    ref = randomize(timm.create_model("vit_base_mci_224", depth=2, img_size=img_size))
    ours = vitkit.create_model("vit_base_mci_224", depth=2, img_size=img_size).eval()
    assert ours.patch_embed.proj is None and ours.patch_embed.grid_size == (img_size // 16,) * 2
    report = vitkit.load_weights(ours, ref.state_dict())
    assert not report.missing and not report.unexpected
    x = images(3, img_size, img_size)
    with torch.no_grad():
        a, b = ref(x), ours(x)
        assert a.std() > 1e-2 and max_diff(a, b) <= 1e-5 * max(1.0, a.abs().max().item())
        ref.train(), ours.train()
        assert max_diff(ref(x), ours(x)) <= 1e-4 * max(1.0, a.abs().max().item())
    ref.eval(), ours.eval()
    if img_size == 64:
        save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, str(tmp_path / "m.safetensors"))
        bare = vitkit.from_pretrained(tmp_path / "m.safetensors")
        assert bare.config.backbone == {"type": "conv_bn", "channels": [192, 192, 768], "kernels": [4, 2, 2]}
        assert bare.config.img_size == (64, 64) and bare.config.patch_size == (1, 1)
        with torch.no_grad():
            a = ref(x)  # the training pass above moved BatchNorm's running statistics
            assert max_diff(a, bare(x)) <= 1e-5 * max(1.0, a.abs().max().item())
    c = complexity(ours.config)
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        ours(x[:1], return_attention=True)
    assert counter.get_total_flops() == c.flops and c.params == count_parameters(ours)


def test_mobileclip_stem_exports_to_onnx_with_parity(tmp_path, images):
    """The BatchNorm stem (folded at export) and the tower without a patch projection, through ONNX Runtime."""
    pytest.importorskip("onnxruntime")
    from vitkit.deploy import OnnxModel, export_onnx

    model = randomize(vitkit.create_model("vit_base_mci_224", depth=2, img_size=64))
    x = images(3, 64, 64)
    with torch.no_grad():
        want, got = model(x), OnnxModel(export_onnx(model, tmp_path / "m.onnx"))(x)
    assert want.std() > 1e-2 and max_diff(want, got) <= 1e-5 * max(1.0, want.abs().max().item())
