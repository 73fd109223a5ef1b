"""The official DINOv2 and DINOv3 checkpoints (facebookresearch's ``.pth`` names: registers as
``register_tokens`` / ``storage_tokens``, DINOv3's masked ``qkv.bias``, ``ls1.gamma``, ``mlp.w1/w2/w3``, the
rotary ``periods``), read by vitkit as timm's own converters read them: the same outputs (fp32)."""

import re

import pytest
import torch

import vitkit
from conftest import max_diff, randomize
from vitkit.weights.io import WeightsError

timm = pytest.importorskip("timm")
import timm.models.eva as timm_eva  # noqa: E402
import timm.models.vision_transformer as timm_vit  # noqa: E402


def _official_dinov2(ref, giant=False):
    """timm's DINOv2 state dict in the official release's names (timm's converter undone)."""
    out = {}
    for k, v in ref.state_dict().items():
        k = k.replace("reg_token", "register_tokens")
        if giant:
            k = k.replace("mlp.fc1.", "mlp.w12.").replace("mlp.fc2.", "mlp.w3.")
        out[k] = v.clone()
    if "register_tokens" in out:  # the release's table has a class slot; its class token lacks that position
        slot = torch.randn(1, 1, out["pos_embed"].shape[-1], generator=torch.Generator().manual_seed(5))
        out["pos_embed"] = torch.cat([slot, out["pos_embed"]], dim=1)
        out["cls_token"] = out["cls_token"] - slot
    out["mask_token"] = torch.zeros(1, out["cls_token"].shape[-1])
    return out


def _official_dinov3(ref, swiglu=False):
    sd, out = ref.state_dict(), {}
    for k, v in sd.items():
        if k.endswith("attn.q_bias"):
            v_bias = sd[k.replace("q_bias", "v_bias")]
            out[k.replace("q_bias", "qkv.bias")] = torch.cat([v, torch.zeros_like(v), v_bias])
            out[k.replace("q_bias", "qkv.bias_mask")] = torch.cat([torch.ones_like(v), torch.zeros_like(v),
                                                                   torch.ones_like(v)])
            continue
        if k.endswith("attn.v_bias"):
            continue
        k = re.sub(r"\.gamma_(1|2)$", r".ls\1.gamma", k.replace("reg_token", "storage_tokens"))
        if swiglu:
            k = k.replace("mlp.fc1_g.", "mlp.w1.").replace("mlp.fc1_x.", "mlp.w2.").replace("mlp.fc2.", "mlp.w3.")
        out[k] = v.clone()
    head = ref.embed_dim // ref.blocks[0].attn.num_heads
    out["rope_embed.periods"] = 100.0 ** (2 * torch.arange(head // 4, dtype=torch.float32) / (head // 2))
    out["mask_token"] = torch.zeros(1, 1, ref.embed_dim)
    return out


@pytest.mark.parametrize("name, kw", [("vit_small_patch14_reg4_dinov2", dict(depth=2, img_size=70)),
                                      ("vit_small_patch14_dinov2", dict(depth=2, img_size=70)),
                                      ("vit_giant_patch14_dinov2", dict(depth=1, img_size=42))])
def test_official_dinov2_checkpoints(name, kw, tmp_path, images):
    official = _official_dinov2(randomize(timm.create_model(name, **kw)), giant="giant" in name)
    torch.save(official, tmp_path / "dinov2.pth")
    ref = timm.create_model(name, **kw).eval()
    ref.load_state_dict(timm_vit.checkpoint_filter_fn(dict(official), ref))
    ours = vitkit.from_pretrained(tmp_path / "dinov2.pth")
    assert ours.config.reg_tokens == ref.num_reg_tokens and ours.config.img_size == (kw["img_size"],) * 2
    x = images(2, *ours.config.img_size)
    with torch.no_grad():
        assert max_diff(ref(x), ours(x)) <= 1e-5


@pytest.mark.parametrize("name", ["vit_small_patch16_dinov3_qkvb", "vit_small_patch16_dinov3",
                                  "vit_small_plus_patch16_dinov3"])
def test_official_dinov3_checkpoints(name, tmp_path, images):
    official = _official_dinov3(randomize(timm.create_model(name, depth=2, img_size=64)), swiglu="plus" in name)
    torch.save(official, tmp_path / "dinov3.pth")
    ref = timm.create_model(name, depth=2, img_size=64).eval()
    ref.load_state_dict(timm_eva.checkpoint_filter_fn(dict(official), ref))
    ours = vitkit.from_pretrained(tmp_path / "dinov3.pth", img_size=64)
    assert ours.config.architecture == "eva" and ours.config.rope == "dinov3" and ours.config.reg_tokens == 4
    assert ours.config.global_pool == "token"  # DINOv3's x_norm_clstoken; timm's model averages the patches
    ours.reset_classifier(0, "avg")
    x = images(2, 48, 80)  # any size, as the release
    with torch.no_grad():
        assert max_diff(ref(x), ours(x)) <= 1e-5


def test_a_dinov3_checkpoint_with_other_rotary_periods_is_refused(tmp_path):
    official = _official_dinov3(timm.create_model("vit_small_patch16_dinov3", depth=1, img_size=32))
    official["rope_embed.periods"] = official["rope_embed.periods"] ** 0.5  # temperature 10
    torch.save(official, tmp_path / "odd.pth")
    with pytest.raises(WeightsError, match="temperature 10, not DINOv3's 100"):
        vitkit.from_pretrained(tmp_path / "odd.pth")
