"""Weights into another patch size or channel count: FlexiViT's resize and timm's input adaptation,
proved against timm's own functions and against the function the model computed."""

import warnings

import pytest
import torch
import torch.nn.functional as F

import vitkit
from conftest import max_diff, randomize
from vitkit.models.layers import adapt_input_channels, resample_patch_embed
from vitkit.weights.io import WeightsError
from vitkit.weights.load import AdaptNote

timm_layers = pytest.importorskip("timm.layers")
timm_manipulate = pytest.importorskip("timm.models._manipulate")


@pytest.mark.parametrize("new", [(8, 8), (32, 32), (14, 14), (16, 8), (7, 7)])
@pytest.mark.parametrize("mode,antialias", [("bicubic", True), ("bicubic", False), ("bilinear", False),
                                            ("bilinear", True)])
def test_resample_patch_embed_is_timms(new, mode, antialias):
    torch.manual_seed(0)
    weight = torch.randn(24, 3, 16, 16) * 0.02
    ours = resample_patch_embed(weight, new, mode, antialias)
    theirs = timm_layers.resample_patch_embed(weight, list(new), mode, antialias)
    assert ours.shape == (24, 3, *new) and max_diff(ours, theirs) < 1e-6


@pytest.mark.parametrize("have,want", [(3, 1), (3, 2), (3, 4), (3, 5), (3, 7), (1, 3), (4, 1)])
def test_adapt_input_channels_is_timms(have, want):
    torch.manual_seed(0)
    weight = torch.randn(16, have, 4, 4)
    theirs = timm_manipulate.adapt_input_conv(want, weight, base_chans=have)
    assert max_diff(adapt_input_channels(weight, want), theirs) == 0
    with pytest.raises(ValueError, match="in_chans must be at least 1"):
        adapt_input_channels(weight, 0)


def _vit(**kw):
    base = dict(img_size=28, patch_size=4, in_chans=1, num_classes=5, embed_dim=32, depth=2, num_heads=2,
                mlp_dim=64, pos_embed="learned", class_token=True, global_pool="token")
    return randomize(vitkit.create_model("vit_fmnist", **{**base, **kw})).eval()


def _per_patch_resize(x, old, new):
    """Each old x old patch resized to new x new on its own (what FlexiViT's filter inverts)."""
    b, c, h, w = x.shape
    gh, gw = h // old, w // old
    patches = x.reshape(b, c, gh, old, gw, old).permute(0, 2, 4, 1, 3, 5).reshape(-1, c, old, old)
    patches = F.interpolate(patches, size=(new, new), mode="bicubic", antialias=True, align_corners=False)
    return patches.reshape(b, gh, gw, c, new, new).permute(0, 3, 1, 4, 2, 5).reshape(b, c, gh * new, gw * new)


def test_larger_patches_compute_the_same_function_on_resized_patches(tmp_path, images):
    """Upsampling loses nothing, so the pseudo-inverse is exact: a model loaded at 8 px patches
    (56 px images, the same 7x7 grid) gives on each patch resized 4 -> 8 px the logits the 4 px
    model gave on the original."""
    small = _vit()
    vitkit.export_weights(small, tmp_path / "m", "vitkit")
    with pytest.warns(AdaptNote, match=r"patch_embed.proj.weight 4x4 -> 8x8 px patches \(FlexiViT"):
        large = vitkit.from_pretrained(tmp_path / "m", patch_size=8, img_size=56)
    x = images(3, 28, 28, c=1)
    assert large.patch_embed.proj.weight.shape[-2:] == (8, 8)
    assert max_diff(large(_per_patch_resize(x, 4, 8)), small(x)) < 1e-4
    expected = timm_layers.resample_patch_embed(small.patch_embed.proj.weight.detach(), [8, 8])
    assert max_diff(large.patch_embed.proj.weight, expected) < 1e-6


def test_smaller_patches_resample_filter_and_grid(tmp_path):
    small = _vit()
    vitkit.export_weights(small, tmp_path / "m", "vitkit")
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        fine = vitkit.from_pretrained(tmp_path / "m", patch_size=2)
    notes = [str(w.message) for w in said if issubclass(w.category, AdaptNote)]
    assert notes == ["adapted the weights: patch_embed.proj.weight 4x4 -> 2x2 px patches (FlexiViT's "
                     "pseudo-inverse resize, bicubic, antialiased)"]
    assert fine.patch_embed.grid_size == (14, 14) and fine.pos_embed.shape == (1, 1 + 14 * 14, 32)
    expected = timm_layers.resample_patch_embed(small.patch_embed.proj.weight.detach(), [2, 2])
    assert max_diff(fine.patch_embed.proj.weight, expected) < 1e-6


def test_channel_adaptation_keeps_the_function_on_repeated_channels(tmp_path, images):
    grey = _vit()
    vitkit.export_weights(grey, tmp_path / "m", "vitkit")
    x = images(2, 28, 28, c=1)
    with pytest.warns(AdaptNote, match=r"1 -> 3 input channels \(repeated and scaled by 1/3"):
        rgb = vitkit.from_pretrained(tmp_path / "m", in_chans=3)
    assert max_diff(rgb(x.repeat(1, 3, 1, 1)), grey(x)) < 1e-5
    vitkit.export_weights(rgb, tmp_path / "rgb", "vitkit")
    with pytest.warns(AdaptNote, match=r"3 -> 1 input channels \(summed"):
        back = vitkit.from_pretrained(tmp_path / "rgb", in_chans=1)
    assert max_diff(back(x), grey(x)) < 1e-5
    with pytest.warns(AdaptNote, match=r"3 -> 4 input channels \(repeated and scaled by 3/4"):
        four = vitkit.from_pretrained(tmp_path / "rgb", in_chans=4)
    expected = timm_manipulate.adapt_input_conv(4, rgb.patch_embed.proj.weight.detach())
    assert max_diff(four.patch_embed.proj.weight, expected) == 0 and len(four.config.mean) == 4


def test_no_note_when_nothing_is_adapted(tmp_path):
    model = _vit()
    vitkit.export_weights(model, tmp_path / "m", "vitkit")
    with warnings.catch_warnings():
        warnings.simplefilter("error", AdaptNote)
        vitkit.from_pretrained(tmp_path / "m", img_size=56)  # a new grid alone: positions, the expected case


def test_a_patch_size_the_image_does_not_divide_is_one_error(tmp_path):
    model = _vit()
    vitkit.export_weights(model, tmp_path / "m", "vitkit")
    with pytest.raises(ValueError, match=r"img_size \(28, 28\) is not divisible by patch_size \(5, 5\)"):
        vitkit.from_pretrained(tmp_path / "m", patch_size=5)


def test_a_model_name_where_weights_belong_says_how_to_get_them(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(vitkit.WeightsError, match=r"fetches nothing by name: .*'hf-hub:timm/"
                       r"vit_base_patch16_224\.<tag>'.*create_model\('vit_base_patch16_224'\)"):
        vitkit.from_pretrained("vit_base_patch16_224")
    with pytest.raises(vitkit.WeightsError, match=r"read as 'hf-hub:google/vit-base-patch16-224'"):
        vitkit.from_pretrained("google/vit-base-patch16-224")
    (tmp_path / "runs").mkdir()
    with pytest.raises(vitkit.WeightsError, match=r"not found: runs/x \(no such file or folder\)$"):
        vitkit.from_pretrained("runs/x")


@pytest.mark.parametrize("name,src_size,kw,words", [
    ("flexivit_small", 240, dict(img_size=160), "(bilinear)"),
    ("flexivit_small", 240, dict(img_size=160, patch_size=8), "(bilinear)"),
    ("vit_base_patch16_radio_v3", 128, dict(img_size=96), "(bilinear, corners aligned)"),
    ("vit_large_patch16_radio_v3", 128, dict(img_size=96), "(bilinear)")])
def test_weights_at_another_size_are_resampled_as_timm_loads_them(name, src_size, kw, words, images):
    """timm resamples FlexiViT's and RADIO's tables (and FlexiViT's patch filters) bilinearly without
    antialiasing, RADIO v3 base and huge with the corners aligned (its loader's filter for ``flexi*`` and
    ``*radio*``), every other ViT's bicubic with it: vitkit loading their state dicts gives timm's model (the
    bicubic default was 4e-4 to 0.13 off timm's FlexiViT, 0.2 off its RADIO)."""
    vit_module = pytest.importorskip("timm.models.vision_transformer")
    import timm

    align = "corners aligned" in words
    sd = randomize(timm.create_model(name, depth=1, img_size=src_size)).state_dict()
    ref = timm.create_model(name, depth=1, **kw).eval()
    ref.load_state_dict(vit_module.checkpoint_filter_fn(sd, ref, interpolation="bilinear", antialias=False,
                                                        align_corners=align))
    ours = vitkit.create_model(name, depth=1, **kw).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AdaptNote)
        report = vitkit.load_weights(ours, sd)
    assert report.resampled[0].endswith(words)
    x = images(2, kw["img_size"], kw["img_size"])
    with torch.no_grad():
        a = ref(x)
        assert a.std() > 1e-2 and max_diff(a, ours(x)) <= 1e-5 * max(1.0, a.abs().max().item())


def test_load_weights_refuses_what_it_would_load_nothing_into_or_misread():
    """A model on the meta device was reported loaded with nothing copied; a module passed as the source, a
    string for strict and an interpolation nothing resamples with ended in deep errors or were taken."""
    import timm

    ref = timm.create_model("vit_tiny_patch16_224", img_size=32, depth=1)
    meta = vitkit.create_model("vit_tiny_patch16_224", img_size=32, depth=1).to("meta")
    with pytest.raises(ValueError, match=r"the model is on the meta device: .*model.to_empty\(device='cpu'\)"):
        vitkit.load_weights(meta, ref.state_dict())
    assert str(vitkit.load_weights(meta, ref.state_dict(), copy=False)) == "format: timm"  # checks only: as said
    model = vitkit.create_model("vit_tiny_patch16_224", img_size=32, depth=1)
    with pytest.raises(TypeError, match=r"source is a model \(VisionTransformer\): pass its state_dict\(\)"):
        vitkit.load_weights(model, ref)
    with pytest.raises(ValueError, match=r"load_weights: strict='yes': it must be True or False"):
        vitkit.load_weights(model, ref.state_dict(), strict="yes")
    with pytest.raises(ValueError, match=r"must be one of bicubic, bilinear, bilinear-aligned, not 'nearest'"):
        vitkit.load_weights(model, ref.state_dict(), interpolation="nearest")


@pytest.mark.parametrize("saved, named, words", [
    ("vit_small_patch14_dinov2", "vit_small_patch14_reg4_dinov2",
     r"the weights hold no reg_token where the model \(vit_small_patch14_reg4_dinov2, reg_tokens=4\) has register "
     r"tokens: load them into a model with the tokens they hold"),
    ("vit_small_patch14_reg4_dinov2", "vit_small_patch14_dinov2",
     r"the weights hold reg_token \(register tokens\) where the model \(vit_small_patch14_dinov2, reg_tokens=0\) "
     r"has none"),
    ("deit_tiny_distilled_patch16_224", "deit_tiny_patch16_224", r"the weights hold dist_token"),
])
def test_weights_of_other_prefix_tokens_than_the_named_model_are_refused_naming_the_tokens(tmp_path, saved, named,
                                                                                           words):
    """A DINOv2 without registers loaded by a registers name was refused as 'pos_embed has 17 slots: not a square
    grid' (its class slot, which the named model's table has none of): the tokens are the cause, and are named."""
    timm = pytest.importorskip("timm")
    from safetensors.torch import save_file

    size = 56 if "patch14" in saved else 64
    ref = timm.create_model(saved, depth=1, img_size=size, num_classes=0)
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, tmp_path / "w.safetensors")
    for kw in ({}, {"img_size": size}):
        with pytest.raises(WeightsError, match=words):
            vitkit.from_pretrained(tmp_path / "w.safetensors", model_name=named, num_classes=0, **kw)


def test_weights_loaded_into_a_model_built_without_their_class_token_name_the_field_it_was_built_with(tmp_path):
    """A model of the weights' own name built with class_token=False was told the weights are "another
    architecture's: load them by their own architecture's name", which it had."""
    weights = vitkit.create_model("vit_tiny_patch16_224", img_size=32, depth=1)
    model = vitkit.create_model("vit_tiny_patch16_224", class_token=False, global_pool="avg", img_size=32, depth=1)
    with pytest.raises(WeightsError, match=r"the weights hold cls_token \(a class token\) where the model "
                                           r"\(vit_tiny_patch16_224, class_token=false\) has none: load them into a "
                                           r"model with the tokens they hold"):
        vitkit.load_weights(model, weights.state_dict())
