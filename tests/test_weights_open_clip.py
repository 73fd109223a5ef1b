"""open_clip's image towers (``visual.*``): a checkpoint as open_clip saves it, with the hub folder's
``open_clip_config.json`` or alone, read by ``vitkit.from_pretrained``: ``encode_image``'s outputs (fp32,
1e-5 of their scale); the activation the tensors do not hold is said, not guessed in silence."""

import json
import re
import warnings
from pathlib import Path

import pytest
import torch

import vitkit
from conftest import max_diff, randomize
from vitkit.weights.io import WeightsError
from vitkit.weights.pretrained import GuessWarning

open_clip = pytest.importorskip("open_clip")


def _tower(tmp_path, name, layers=2, size=64, **vision):
    from safetensors.torch import save_file

    cfg = open_clip.get_model_config(name)
    cfg["vision_cfg"].update(layers=layers, image_size=size, **vision)
    cfg["text_cfg"].update(layers=1)
    model = randomize(open_clip.CLIP(**cfg))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp_path / "open_clip_model.safetensors"))
    (tmp_path / "open_clip_config.json").write_text(json.dumps(
        {"model_cfg": cfg, "preprocess_cfg": {"mean": [0.1, 0.2, 0.3], "std": [0.4, 0.5, 0.6]}}))
    return model


def _alone(folder):
    """The folder's open_clip file copied where no config is beside it (beside its configs it reads as its
    folder)."""
    import shutil

    (folder / "alone").mkdir(exist_ok=True)
    return Path(shutil.copy(folder / "open_clip_model.safetensors", folder / "alone"))


@pytest.mark.parametrize("name", ["ViT-B-32", "ViT-B-16-quickgelu"])
def test_open_clip_folder_loads_with_parity(name, tmp_path, images):
    ref = _tower(tmp_path, name)
    ours = vitkit.from_pretrained(tmp_path)
    assert ours.config.gelu == ("quick" if "quickgelu" in name else "exact")
    assert ours.config.mean == (0.1, 0.2, 0.3) and ours.config.num_classes == 512  # the projection
    x = images(2, 64, 64)
    with torch.no_grad():
        a, b = ref.encode_image(x), ours(x)
    assert max_diff(a, b) <= 1e-5 * max(1.0, a.abs().max().item())


def test_open_clip_layer_scale_tower(tmp_path, images):
    ref = _tower(tmp_path, "ViT-B-32", ls_init_value=0.1)
    ours = vitkit.from_pretrained(tmp_path)
    x = images(2, 64, 64)
    with torch.no_grad():
        a, b = ref.encode_image(x), ours(x)
    assert ours.config.init_values and max_diff(a, b) <= 1e-5 * max(1.0, a.abs().max().item())


def test_a_bare_open_clip_file_says_what_it_assumed(tmp_path, images):
    ref = _tower(tmp_path, "ViT-B-16-quickgelu")
    with pytest.warns(GuessWarning, match="gelu='quick'"):
        guessed = vitkit.from_pretrained(_alone(tmp_path))
    assert guessed.config.gelu == "exact"
    with warnings.catch_warnings():
        warnings.simplefilter("error", GuessWarning)  # told: nothing to say
        told = vitkit.from_pretrained(_alone(tmp_path), gelu="quick")
    x = images(2, 64, 64)
    with torch.no_grad():
        a = ref.encode_image(x)
        assert max_diff(a, told(x)) <= 1e-5 * max(1.0, a.abs().max().item())
        assert max_diff(a, guessed(x)) > 1e-3  # the wrong activation is another function


def test_a_bare_file_of_a_wide_tower_has_open_clips_head_count(tmp_path, images):
    """ViT-H/g/bigG set head_width 80-104 in open_clip's configs: a bare file was read at 64 per head
    (ViT-H-14: 20 heads for 16), a function 1.1 away from encode_image's, without a word."""
    ref = _tower(tmp_path, "ViT-H-14", layers=1, size=28)
    with pytest.warns(GuessWarning, match="gelu") as said:
        bare = vitkit.from_pretrained(_alone(tmp_path))
    assert bare.config.num_heads == 16 and not any("number of heads" in str(w.message) for w in said)
    x = images(2, 28, 28)
    with torch.no_grad():
        a = ref.encode_image(x)
        assert max_diff(a, bare(x)) <= 1e-5 * max(1.0, a.abs().max().item())
    (tmp_path / "odd").mkdir()
    _tower(tmp_path / "odd", "ViT-B-32", layers=1, size=64, width=192)  # no open_clip config is this wide
    with pytest.warns(GuessWarning, match="number of heads is not stored and was read as 3 .width 192 / 64"):
        vitkit.from_pretrained(_alone(tmp_path / "odd"))
    (tmp_path / "narrow").mkdir()  # 128 is a ResNet tower's width in open_clip's configs, no ViT's: it was
    _tower(tmp_path / "narrow", "ViT-B-32", layers=1, size=64, width=128)  # read as 2 heads without a word
    with pytest.warns(GuessWarning, match="number of heads is not stored and was read as 2 .width 128 / 64"):
        vitkit.from_pretrained(_alone(tmp_path / "narrow"))


def test_a_file_mixing_the_tower_with_another_layout_is_refused_by_name(tmp_path):
    """timm ViT tensors beside open_clip's visual.* were dropped without a word (the file read as the tower)."""
    from safetensors.torch import load_file, save_file

    _tower(tmp_path, "ViT-B-32")
    tensors = load_file(str(tmp_path / "open_clip_model.safetensors"))  # the text tower stays: it is open_clip's
    timm_vit = vitkit.create_model("vit_tiny_patch16_224", depth=1, img_size=32).state_dict()
    save_file({**tensors, **{k: v.contiguous() for k, v in timm_vit.items()}}, str(tmp_path / "mixed.safetensors"))
    with pytest.raises(WeightsError, match=r"mixes two layouts: open_clip's names \(e.g. visual.transformer.resblocks.0"
                                           r".*\) beside 12 tensors of timm's layers \(e.g. blocks.0"):
        vitkit.from_pretrained(tmp_path / "mixed.safetensors")
    assert vitkit.from_pretrained(tmp_path / "open_clip_model.safetensors", gelu="exact").config.num_classes == 512


def test_open_clip_attention_pool_tower_is_refused(tmp_path):
    cfg = open_clip.get_model_config("ViT-B-32")
    cfg["vision_cfg"].update(layers=1, image_size=64, attentional_pool=True)
    (tmp_path / "open_clip_config.json").write_text(json.dumps({"model_cfg": cfg}))
    _tower(tmp_path, "ViT-B-32", layers=1)
    (tmp_path / "open_clip_config.json").write_text(json.dumps({"model_cfg": cfg}))
    with pytest.raises(WeightsError, match="attentional_pool"):
        vitkit.from_pretrained(tmp_path)


@pytest.mark.parametrize("option", ["qk_norm", "scale_fc", "scale_heads"])
def test_a_block_option_vitkit_does_not_read_is_refused_by_its_name(option, tmp_path):
    """open_clip's qk_norm, scale_fc, scale_attn and scale_heads add tensors: they were "not in the model" with an
    advice to load the rest with strict=False (another function)."""
    _tower(tmp_path, "ViT-B-32", layers=1, **{option: True})
    for source in (tmp_path, tmp_path / "open_clip_model.safetensors"):
        with pytest.raises(WeightsError, match=f"built with {option} .*is not one vitkit reads") as refused:
            vitkit.from_pretrained(source)
        assert "strict=False" not in str(refused.value)


@pytest.mark.parametrize("readout", [dict(no_ln_pre=True, pool_type="avg", final_ln_after_pool=True),
                                     dict(pool_type="avg"), dict(final_ln_after_pool=True)])
def test_clipa_towers_and_the_other_readouts_load_with_parity(readout, tmp_path, images):
    """CLIPA's towers (ViT-H-14-CLIPA, ViT-bigG-14-CLIPA: no ln_pre, the patch tokens' mean, ln_post after it)
    were refused ("another readout than the class token"; a bare file: "missing norm_pre"). The folder reads as
    its vision_cfg pools; a bare file without ln_pre as CLIPA's, said."""
    ref = _tower(tmp_path, "ViT-B-32", layers=1, **readout)
    ours = vitkit.from_pretrained(tmp_path)
    x = images(2, 64, 64)
    with torch.no_grad():
        a = ref.encode_image(x)
        assert max_diff(a, ours(x)) <= 1e-5 * max(1.0, a.abs().max().item())
        if readout.get("no_ln_pre"):
            with pytest.warns(GuessWarning, match="a tower without ln_pre was read as CLIPA's"):
                bare = vitkit.from_pretrained(_alone(tmp_path), gelu="exact")
            assert max_diff(a, bare(x)) <= 1e-5 * max(1.0, a.abs().max().item())


def test_a_clipa_tower_exports_to_timm_which_builds_it_with_a_zero_patch_bias(tmp_path, images):
    """timm's ViT has a patch bias unless pre-norm: CLIPA's tower (neither) was written without one, and timm's
    model missed patch_embed.proj.bias. A zero bias is the same function: timm and vitkit read it back exactly."""
    timm = pytest.importorskip("timm")
    from safetensors.torch import load_file

    ref = _tower(tmp_path, "ViT-B-32", layers=1, no_ln_pre=True, pool_type="avg", final_ln_after_pool=True)
    vitkit.export_weights(vitkit.from_pretrained(tmp_path), tmp_path / "timm.safetensors", "timm")
    theirs = timm.create_model("vit_base_patch32_clip_224", depth=1, img_size=64, num_classes=512, pre_norm=False,
                               global_pool="avg", fc_norm=True)
    theirs.load_state_dict(load_file(str(tmp_path / "timm.safetensors")))
    x = images(2, 64, 64)
    with torch.no_grad():
        a = ref.encode_image(x)
        for model in (theirs.eval(), vitkit.from_pretrained(tmp_path / "timm.safetensors")):
            assert max_diff(a, model(x)) <= 1e-5 * max(1.0, a.abs().max().item())


def test_a_tower_of_tokens_without_a_pooled_output_is_refused(tmp_path):
    _tower(tmp_path, "ViT-B-32", layers=1, pool_type="none")
    with pytest.raises(WeightsError, match="pool_type 'none'"):
        vitkit.from_pretrained(tmp_path)


@pytest.mark.parametrize("resize_mode, interpolation", [("shortest", "bicubic"), ("squash", "bicubic"),
                                                        ("squash", "bilinear")])
def test_the_folder_preprocesses_as_open_clips_transform(resize_mode, interpolation, tmp_path):
    """preprocess_cfg's resize_mode (DFN's and other open_clip towers squash) and interpolation: vitkit feeds the
    pixels open_clip's own eval transform makes, on landscape and portrait photos."""
    skimage_data = pytest.importorskip("skimage.data")
    from PIL import Image

    _tower(tmp_path, "ViT-B-32", layers=1)
    pre = {"mean": [0.1, 0.2, 0.3], "std": [0.4, 0.5, 0.6], "resize_mode": resize_mode, "interpolation": interpolation}
    config = json.loads((tmp_path / "open_clip_config.json").read_text())
    (tmp_path / "open_clip_config.json").write_text(json.dumps(dict(config, preprocess_cfg=pre)))
    ours = vitkit.from_pretrained(tmp_path)
    theirs = open_clip.image_transform(64, is_train=False, **pre)
    for photo in (skimage_data.chelsea(), skimage_data.rocket()):
        photo = Image.fromarray(photo)
        assert torch.allclose(vitkit.preprocess(ours, photo), theirs(photo).unsqueeze(0), atol=1e-5), resize_mode


def test_a_resize_mode_vitkit_does_not_do_is_said_unless_chosen(tmp_path):
    """open_clip's "longest" pads the image to a square, which vitkit does not: read as the centre crop, said."""
    _tower(tmp_path, "ViT-B-32", layers=1)
    config = json.loads((tmp_path / "open_clip_config.json").read_text())
    (tmp_path / "open_clip_config.json").write_text(json.dumps(dict(config, preprocess_cfg={"resize_mode": "longest"})))
    with pytest.warns(GuessWarning, match="resize_mode 'longest'"):
        assert vitkit.from_pretrained(tmp_path).config.crop_mode == "center"
    with warnings.catch_warnings():
        warnings.simplefilter("error", GuessWarning)  # chosen: nothing to say
        assert vitkit.from_pretrained(tmp_path, crop_mode="squash").config.crop_mode == "squash"


@pytest.mark.parametrize("mean", ["abc", [0.5, None, 0.5]])
def test_a_preprocess_mean_that_is_no_numbers_is_one_line_naming_the_file(mean, tmp_path):
    """Before: Python's "could not convert string to float" without a file."""
    _tower(tmp_path, "ViT-B-32", layers=1)
    config = json.loads((tmp_path / "open_clip_config.json").read_text())
    (tmp_path / "open_clip_config.json").write_text(json.dumps(dict(config, preprocess_cfg={"mean": mean})))
    with pytest.raises(vitkit.weights.WeightsError, match="open_clip_config.json: preprocess_cfg's mean must be"):
        vitkit.from_pretrained(tmp_path)


def test_one_preprocess_mean_and_std_number_is_every_channels_as_open_clip_spreads_it(tmp_path):
    """open_clip's transform spreads a single mean or std to the three channels (this was refused, a TypeError
    before that): vitkit's pixels are its transform's."""
    skimage_data = pytest.importorskip("skimage.data")
    from PIL import Image

    _tower(tmp_path, "ViT-B-32", layers=1)
    config = json.loads((tmp_path / "open_clip_config.json").read_text())
    pre = {"mean": 0.25, "std": 0.75}
    (tmp_path / "open_clip_config.json").write_text(json.dumps(dict(config, preprocess_cfg=pre)))
    ours = vitkit.from_pretrained(tmp_path)
    assert ours.config.mean == (0.25,) * 3 and ours.config.std == (0.75,) * 3
    transform = open_clip.image_transform(64, is_train=False, **pre)
    photo = Image.fromarray(skimage_data.chelsea())
    assert torch.allclose(vitkit.preprocess(ours, photo), transform(photo).unsqueeze(0), atol=1e-5)


def _timm_tower(folder, vision, pre=None):
    """An open_clip model whose image tower timm builds (``visual.trunk.*``), saved as its hub repositories hold it."""
    from safetensors.torch import save_file

    folder.mkdir(exist_ok=True)
    cfg = {"embed_dim": 64, "vision_cfg": vision,
           "text_cfg": {"context_length": 8, "vocab_size": 100, "width": 32, "heads": 2, "layers": 1}}
    model = randomize(open_clip.CLIP(**cfg)).eval()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(folder / "open_clip_model.safetensors"))
    (folder / "open_clip_config.json").write_text(json.dumps({"model_cfg": cfg, "preprocess_cfg": pre or {}}))
    return model


#: open_clip's ways of putting timm's model in a tower: SigLIP (a MAP pool, no projection: 28 configs), EVA-02 and
#: Perception Encoder (timm's head is the projection), a linear projection beside the model's own pooling
#: (vit_medium_patch16_gap_256), or beside a pooling asked for (its norms stay as built), with a bias
TIMM_TOWERS = {
    "map-none": dict(timm_model_name="vit_tiny_patch16_224", timm_pool="map", timm_proj="none"),
    "eva02-head": dict(timm_model_name="eva02_tiny_patch14_224", timm_pool="token", timm_proj=None),
    "gap-linear": dict(timm_model_name="vit_medium_patch16_gap_256", timm_pool="", timm_proj="linear"),
    "avg-linear": dict(timm_model_name="vit_tiny_patch16_224", timm_pool="avg", timm_proj="linear"),
    "token-linear-bias": dict(timm_model_name="vit_tiny_patch16_224", timm_pool="token", timm_proj="linear",
                              timm_proj_bias=True),
    # an EVA model's norms under a linear projection (refused: "timm Eva model_args fc_norm are not read")
    "eva02-token-linear": dict(timm_model_name="eva02_tiny_patch14_224", timm_pool="token", timm_proj="linear"),
    "eva02-avg-linear": dict(timm_model_name="eva02_tiny_patch14_224", timm_pool="avg", timm_proj="linear"),
}


@pytest.mark.parametrize("kind", TIMM_TOWERS)
def test_a_tower_timm_builds_loads_with_parity(kind, tmp_path):
    """open_clip's SigLIP, EVA-02 and PE towers are timm models under visual.trunk.: they were refused as an
    unrecognised layout. Read as the timm architecture their open_clip_config.json names, with its pooling,
    projection and preprocessing: encode_image's outputs, parameter for parameter."""
    name = TIMM_TOWERS[kind]["timm_model_name"]
    size = 256 if "256" in name else 224
    ref = _timm_tower(tmp_path, dict(TIMM_TOWERS[kind], image_size=size),
                      {"mean": [0.1, 0.2, 0.3], "std": [0.4, 0.5, 0.6], "resize_mode": "squash"})
    ours = vitkit.from_pretrained(tmp_path).eval()
    assert ours.config.name == name and ours.config.mean == (0.1, 0.2, 0.3) and ours.config.crop_mode == "squash"
    assert ours.config.head_kind == ("projection" if ours.config.num_classes else "classes")  # open_clip's embedding
    proj = getattr(ref.visual.head, "proj", None)
    bias = 64 if proj is not None and proj.bias is None else 0  # vitkit's head has one (zero) where open_clip's not
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in ref.visual.parameters()) + bias
    x = torch.randn(2, 3, size, size)
    with torch.no_grad():
        a, b = ref.encode_image(x), ours(x)
    assert a.shape == b.shape and max_diff(a, b) <= 1e-5 * max(1.0, a.abs().max().item())


@pytest.mark.parametrize("kind", ["avg-linear", "gap-linear"])
def test_a_bare_tower_timm_builds_is_read_with_open_clips_defaults(kind, tmp_path, capsys):
    """Without its open_clip_config.json, a tower with open_clip's default linear projection was read as a
    classifier of its class token: `vitkit predict` ranked 24 "classes" of the embedding, 1.4 off encode_image.
    It is open_clip's embedding, pooled as open_clip's default timm_pool ('avg'), and the guess is said."""
    import numpy as np
    from PIL import Image

    from vitkit.cli import main

    name = TIMM_TOWERS[kind]["timm_model_name"]
    size = 256 if "256" in name else 224
    ref = _timm_tower(tmp_path, dict(TIMM_TOWERS[kind], image_size=size))
    with pytest.warns(GuessWarning, match="an open_clip tower built by timm, without its open_clip_config.json: "
                                          "read with open_clip's defaults"):
        bare = vitkit.from_pretrained(_alone(tmp_path)).eval()
    assert bare.config.head_kind == "projection" and bare.config.global_pool == "avg"
    x = torch.randn(2, 3, size, size)
    with torch.no_grad():
        a = ref.encode_image(x)
        assert max_diff(a, bare(x)) <= 1e-5 * max(1.0, a.abs().max().item()), name
    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(tmp_path / "a.png")
    assert main(["predict", str(tmp_path / "a.png"), "--weights",
                 str(tmp_path / "alone" / "open_clip_model.safetensors")]) == 2
    assert "its head is a projection into an image-text space" in capsys.readouterr().err


@pytest.mark.slow
def test_open_clips_siglip_tower_from_its_folder_and_alone(tmp_path):
    """ViT-B-16-SigLIP as open_clip builds it (its text tower made small): the folder reads as timm's
    vit_base_patch16_siglip_224, the file alone off its tensors (what they do not hold said), both encode_image's."""
    cfg = open_clip.get_model_config("ViT-B-16-SigLIP")
    ref = _timm_tower(tmp_path, cfg["vision_cfg"], {"mean": [0.5] * 3, "std": [0.5] * 3, "resize_mode": "squash"})
    ours = vitkit.from_pretrained(tmp_path).eval()
    with pytest.warns(GuessWarning, match="holds tensors only"):
        bare = vitkit.from_pretrained(_alone(tmp_path)).eval()
    info = vitkit.weights.pretrained.describe_source(tmp_path)
    assert info["format"] == "timm" and "open_clip image tower built by timm" in info["source_name"]
    assert ours.config.name == "vit_base_patch16_siglip_224" and ours.config.global_pool == "map"
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        a = ref.encode_image(x)
        assert max_diff(a, ours(x)) <= 1e-5 * max(1.0, a.abs().max().item())
        assert max_diff(a, bare(x)) <= 1e-5 * max(1.0, a.abs().max().item())


def test_a_timm_tower_with_an_mlp_projection_is_refused_by_name(tmp_path):
    _timm_tower(tmp_path, dict(timm_model_name="vit_tiny_patch16_224", timm_pool="token", timm_proj="mlp",
                               image_size=224))
    with pytest.raises(WeightsError, match=r"another head beside it \(visual.head.mlp.*MLP projection"):
        vitkit.from_pretrained(tmp_path)


def test_an_open_clip_repository_loads_from_the_hub(tmp_path, monkeypatch):
    """timm/ViT-B-16-SigLIP and the other open_clip repositories hold open_clip_config.json and open_clip's weights,
    no config.json: 'hf-hub:' refused them ("has no config.json"). Fetched: the config and one weight file."""
    import sys
    import types

    from conftest import fake_snapshot_download

    remote = tmp_path / "remote"
    ref = _timm_tower(remote, dict(TIMM_TOWERS["map-none"], image_size=224))
    (remote / "open_clip_pytorch_model.bin").write_bytes(b"not fetched")  # beside the safetensors file, as there
    calls = []
    fake = fake_snapshot_download(remote, calls)
    monkeypatch.setitem(sys.modules, "huggingface_hub", types.SimpleNamespace(snapshot_download=fake))
    ours = vitkit.from_pretrained("hf-hub:timm/tiny-siglip").eval()
    assert calls[-1][1] == ("open_clip_config.json", "open_clip_model.safetensors")
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        a = ref.encode_image(x)
        assert max_diff(a, ours(x)) <= 1e-5 * max(1.0, a.abs().max().item())


def test_the_folder_config_s_size_eps_and_activation_are_read(tmp_path):
    """open_clip_config.json's non-square image_size was read as the nearest square grid (another function),
    its norm_kwargs eps and act_kwargs tanh were dropped (1e-5 and exact GELU: 4e-4 off), and a config without
    model_cfg was read as if it said the activation (a QuickGELU tower as exact GELU, unsaid)."""
    x = torch.randn(2, 3, 128, 32)
    (tmp_path / "a").mkdir()
    ref = _tower(tmp_path / "a", "ViT-B-32", layers=1, size=[128, 32], norm_kwargs={"eps": 1e-6},
                 act_kwargs={"approximate": "tanh"})
    ours = vitkit.from_pretrained(tmp_path / "a")
    assert ours.config.img_size == (128, 32) and ours.config.norm_eps == 1e-6 and ours.config.gelu == "tanh"
    with torch.no_grad():
        a = ref.encode_image(x)
        assert max_diff(a, ours(x)) <= 1e-5 * max(1.0, a.abs().max().item())
    (tmp_path / "b").mkdir()
    _tower(tmp_path / "b", "ViT-B-16-quickgelu", layers=1)
    (tmp_path / "b" / "open_clip_config.json").write_text(json.dumps({"preprocess_cfg": {}}))
    with pytest.warns(GuessWarning, match="gelu='quick'"):
        vitkit.from_pretrained(tmp_path / "b")


def test_a_config_of_another_tower_is_refused_and_a_config_json_beside_is_not_read(tmp_path, images):
    """open_clip_config.json was read for its activation and head width without a look at its layers, width or
    patch: another tower's config gave these weights another function. A timm config.json beside open_clip's
    files (a repository's other file) replaced open_clip's config: 0.05 off, unsaid."""
    ref = _tower(tmp_path, "ViT-B-16-quickgelu", layers=1)
    config = json.loads((tmp_path / "open_clip_config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({"architecture": "vit_base_patch16_clip_224", "num_classes": 512,
                                                      "model_args": {"depth": 1, "img_size": 64}}))
    ours = vitkit.from_pretrained(tmp_path)
    x = images(2, 64, 64)
    with torch.no_grad():
        a = ref.encode_image(x)
        assert ours.config.gelu == "quick" and max_diff(a, ours(x)) <= 1e-5 * max(1.0, a.abs().max().item())
    for change, said in ((dict(layers=12), "layers 12 (the tensors: 1)"), (dict(width=1024), "width 1024"),
                         (dict(patch_size=32), "patch_size 32 (the tensors: 16)"), (dict(mlp_ratio=2.0), "mlp_ratio"),
                         (dict(head_width=0), "head_width must be a positive integer")):
        vision = {**config["model_cfg"]["vision_cfg"], **change}
        (tmp_path / "open_clip_config.json").write_text(json.dumps({"model_cfg": {**config["model_cfg"],
                                                                                  "vision_cfg": vision}}))
        with pytest.raises(WeightsError, match=re.escape(said)):
            vitkit.from_pretrained(tmp_path)
    (tmp_path / "open_clip_config.json").write_text(json.dumps({"model_cfg": [1, 2]}))
    with pytest.raises(WeightsError, match="model_cfg must be an object of fields"):
        vitkit.from_pretrained(tmp_path)


def _coca(tmp_path, name, size, **vision):
    from safetensors.torch import save_file

    cfg = open_clip.get_model_config(name)
    cfg.pop("custom_text", None)
    cfg["vision_cfg"].update(layers=2, image_size=size, **vision)
    cfg["text_cfg"].update(layers=1)
    cfg["multimodal_cfg"].update(layers=1)
    model = randomize(open_clip.CoCa(**cfg)).eval()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp_path / "open_clip_model.safetensors"))
    (tmp_path / "open_clip_config.json").write_text(json.dumps({"model_cfg": cfg, "preprocess_cfg": {}}))
    return model


@pytest.mark.parametrize("name,size", [("coca_ViT-B-32", 64), ("coca_ViT-L-14", 56)])
def test_a_coca_tower_reads_its_image_embedding_through_the_attentional_pooler(name, size, tmp_path, images):
    """CoCa's tower pools every token with 256 queries of the joint width (768 -> 512 for B/32, 1024 -> 768 for
    L/14: separate q/k/v weights), normalises them and projects the first: encode_image (unnormalised). It was
    refused; its decoder beside the tower (text_decoder.*) is left out as the text tower is."""
    from safetensors.torch import save_file

    ref = _coca(tmp_path, name, size)
    ours = vitkit.from_pretrained(tmp_path)
    assert type(ours).__name__ == "CoCa" and ours.config.coca_queries == 256 and ours.config.head_kind == "projection"
    x = images(2, size, size)
    with torch.no_grad():
        a = ref.encode_image(x, normalize=False)
        assert a.std() > 1e-2 and max_diff(a, ours(x)) <= 1e-5 * max(1.0, a.abs().max().item())
    # the tower's parameters are open_clip's, and the projection's zero bias
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in ref.visual.parameters()) + a.shape[1]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GuessWarning)
        bare = vitkit.from_pretrained(_alone(tmp_path))
    ours.save_pretrained(tmp_path / "vitkit")
    back = vitkit.from_pretrained(tmp_path / "vitkit")
    save_file({k: v.contiguous() for k, v in ours.state_dict().items()}, str(tmp_path / "vitkit_names.safetensors"))
    with pytest.warns(GuessWarning, match="assumed as open_clip builds CoCa: LayerNorm eps 1e-5"):
        named = vitkit.from_pretrained(tmp_path / "vitkit_names.safetensors")  # vitkit's names, no config
    assert named.config.head_kind == "projection"
    with torch.no_grad():
        assert max_diff(bare(x), a) <= 1e-5 * max(1.0, a.abs().max().item()) and torch.equal(back(x), ours(x))
        assert torch.equal(named(x), ours(x))
    with pytest.raises(WeightsError, match=r"CoCa models \(architecture 'coca'\) have no timm layout"):
        vitkit.export_weights(ours, tmp_path / "t.safetensors", "timm")
    with pytest.raises(ValueError, match="CoCa's readout is its attentional pooler"):
        ours.reset_classifier(3, global_pool="avg")


def test_coca_poolers_vitkit_does_not_compute_are_refused_by_name(tmp_path):
    _coca(tmp_path, "coca_ViT-B-32", 64)
    cfg = json.loads((tmp_path / "open_clip_config.json").read_text())
    for vision, words in (({"attentional_pool": "parallel"}, "attentional_pool 'parallel'"),
                          ({"pool_type": "avg"}, "CoCa tower with pool_type 'avg'")):
        (tmp_path / "open_clip_config.json").write_text(json.dumps(
            {**cfg, "model_cfg": {**cfg["model_cfg"], "vision_cfg": {**cfg["model_cfg"]["vision_cfg"], **vision}}}))
        with pytest.raises(WeightsError, match=re.escape(words)):
            vitkit.from_pretrained(tmp_path)


def test_overrides_against_an_open_clip_config_that_states_them_are_refused(tmp_path):
    """gelu= or num_heads= against an open_clip_config.json that states them loaded the tensors into another
    function without a word (the check read only a config.json); a bare file's activation is still told so."""
    _tower(tmp_path, "ViT-B-16-quickgelu", layers=1, size=32)
    for override in (dict(gelu="exact"), dict(num_heads=4)):
        with pytest.raises(WeightsError, match="would compute another function of the same tensors"):
            vitkit.from_pretrained(tmp_path, **override)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert vitkit.from_pretrained(_alone(tmp_path), gelu="quick").config.gelu == "quick"
