"""Hugging Face folders away from their own image size, and transformers' backbones.

transformers resamples a position table bicubic without antialiasing (``interpolate_pos_encoding``; DINOv2
always), where timm antialiases: a folder read by vitkit computes transformers' function at a non-square size,
resampled at load (``img_size=``) or in every forward pass (``dynamic_img_size``). A ``...Backbone`` folder
read with ``features_only=True`` returns the maps its config names (``out_indices``, ``apply_layernorm``), as
transformers' ``feature_maps``; what vitkit's feature model cannot return is refused in one line."""

import pytest
import torch

import vitkit
from conftest import max_diff, randomize
from vitkit.weights.io import WeightsError

T = pytest.importorskip("transformers")

SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4, image_size=32,
             patch_size=8)
TEXT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, vocab_size=64,
            max_position_embeddings=16, bos_token_id=0, eos_token_id=1, pad_token_id=1)

ANTIALIASED = dict(pos_embed_antialias=True)  # timm's resampling of a learned table
KEPT = dict(rel_pos_resize="keep")  # vitkit's of a relative-bias table (each offset keeps its bias)
#: class, config, whether its forward takes interpolate_pos_encoding (DINOv2's always resamples), the
#: override that resamples the other way (None: it resamples as timm does)
SIZED = {
    "vit": ("ViTForImageClassification", lambda: T.ViTConfig(**SMALL, num_labels=3), True, ANTIALIASED),
    "deit_teacher": ("DeiTForImageClassificationWithTeacher", lambda: T.DeiTConfig(**SMALL, num_labels=3), True,
                     ANTIALIASED),
    "ijepa": ("IJepaModel", lambda: T.IJepaConfig(**SMALL), True, ANTIALIASED),
    "msn": ("ViTMSNModel", lambda: T.ViTMSNConfig(**SMALL), True, ANTIALIASED),
    "clip": ("CLIPVisionModelWithProjection", lambda: T.CLIPVisionConfig(**SMALL, projection_dim=16), True,
             ANTIALIASED),
    "siglip": ("SiglipVisionModel", lambda: T.SiglipVisionConfig(**SMALL), True, ANTIALIASED),
    "beit_absolute": ("BeitModel", lambda: T.BeitConfig(**SMALL, use_absolute_position_embeddings=True,
                                                        use_relative_position_bias=False), True, ANTIALIASED),
    "beit_relative": ("BeitForImageClassification", lambda: T.BeitConfig(**SMALL, use_relative_position_bias=True,
                                                                         num_labels=3), True, KEPT),
    "beit_shared": ("BeitModel", lambda: T.BeitConfig(**SMALL, use_shared_relative_position_bias=True), True, KEPT),
    "dinov2": ("Dinov2ForImageClassification", lambda: T.Dinov2Config(**SMALL, num_labels=3), False, ANTIALIASED),
    "dinov2_registers": ("Dinov2WithRegistersModel", lambda: T.Dinov2WithRegistersConfig(**SMALL), False, None),
}


def _outputs(ref, ours, x, interpolate):
    """(transformers', vitkit's) pooled output, or the tokens where the class pools none (I-JEPA, MSN)."""
    out = ref(pixel_values=x, **({"interpolate_pos_encoding": True} if interpolate else {}))
    for field in ("logits", "image_embeds", "pooler_output"):
        if isinstance(getattr(out, field, None), torch.Tensor):
            return getattr(out, field), ours(x)
    return out.last_hidden_state, ours.forward_features(x)


@pytest.mark.parametrize("how", ["img_size", "dynamic_img_size"])
@pytest.mark.parametrize("case", sorted(SIZED))
def test_a_folder_at_a_non_square_size_computes_what_transformers_computes(case, how, tmp_path, images):
    cls, config, interpolate, other_way = SIZED[case]
    ref = randomize(getattr(T, cls)(config())).eval()
    ref.save_pretrained(tmp_path)
    ours = vitkit.from_pretrained(tmp_path, **({"img_size": (32, 48)} if how == "img_size" else
                                               {"dynamic_img_size": True}))
    x = images(2, 32, 48)
    with torch.no_grad():
        want, got = _outputs(ref, ours, x, interpolate)
        if other_way:
            _, other = _outputs(ref, vitkit.from_pretrained(tmp_path, img_size=(32, 48), **other_way), x, interpolate)
    assert max_diff(want, got) <= 1e-5 * max(1.0, want.abs().max().item())
    if other_way:  # the check can fail: the other resampling is another function of the same table
        assert max_diff(want, other) > 1e-4


BACKBONES = {
    "dinov2": ("Dinov2Backbone", lambda **kw: T.Dinov2Config(**SMALL, **kw)),
    "dinov2_registers": ("Dinov2WithRegistersBackbone", lambda **kw: T.Dinov2WithRegistersConfig(**SMALL, **kw)),
    "dinov3": ("DINOv3ViTBackbone", lambda **kw: T.DINOv3ViTConfig(**SMALL, num_register_tokens=2, **kw)),
    "beit": ("BeitBackbone", lambda **kw: T.BeitConfig(**{**SMALL, **kw}, use_relative_position_bias=True)),
}


@pytest.mark.parametrize("options", [dict(out_indices=[1, 3]), dict(out_features=["stage2"]), {},
                                     dict(out_indices=[1, 2], apply_layernorm=False)],
                         ids=["two-blocks", "out-features", "default-last", "no-norm"])
@pytest.mark.parametrize("case", sorted(BACKBONES))
def test_a_backbone_folder_gives_transformers_feature_maps(case, options, tmp_path, images):
    cls, config = BACKBONES[case]
    if case == "dinov3" and options.get("apply_layernorm") is False:
        options = dict(options, out_indices=[1, 2])  # its last map is normalised anyway: refused (below)
    ref = randomize(getattr(T, cls)(config(**options))).eval()
    ref.save_pretrained(tmp_path)
    ours = vitkit.from_pretrained(tmp_path, features_only=True, dynamic_img_size=True)
    encoder = vitkit.from_pretrained(tmp_path)  # without features_only: the encoder, as before
    assert not isinstance(encoder, type(ours))
    for h, w in ((32, 32), (32, 48)):
        if case == "beit" and h != w:
            continue  # transformers' BEiT reads a non-square grid's offsets transposed (see test_weights_hf_beit)
        x = images(2, h, w)
        with torch.no_grad():
            want, got = ref(pixel_values=x).feature_maps, ours(x)
        assert len(want) == len(got) == len(ours.feature_info) >= 1
        for a, b in zip(want, got):
            assert a.shape == b.shape and max_diff(a, b) <= 1e-5 * max(1.0, a.abs().max().item())
    # the maps' norm is the config's: the same blocks without it are other maps
    if ours.norm:
        ours.norm = False
        with torch.no_grad():
            assert max_diff(ref(pixel_values=x).feature_maps[-1], ours(x)[-1]) > 1e-3


def test_out_indices_given_by_the_caller_win_over_the_folders(tmp_path, images):
    ref = randomize(T.Dinov2Backbone(T.Dinov2Config(**SMALL, out_indices=[1, 2, 3]))).eval()
    ref.save_pretrained(tmp_path)
    ours = vitkit.from_pretrained(tmp_path, features_only=True, out_indices=[0])
    assert ours.out_indices == [0] and not ours.norm
    with torch.no_grad():
        first = ref(pixel_values=images(1, 32, 32), output_hidden_states=True).hidden_states[1]  # after block 0
        assert max_diff(first[:, 1:].transpose(1, 2).reshape(1, 64, 4, 4), ours(images(1, 32, 32))[0]) <= 1e-5


@pytest.mark.parametrize("case, options, words", [
    ("dinov2", dict(out_features=["stem", "stage3"]), "'stem' map"),
    ("beit", dict(add_fpn=True, out_indices=[1, 2, 3, 4], num_hidden_layers=4), "add_fpn pyramid"),
    ("dinov3", dict(apply_layernorm=False), "normalises its last map anyway"),
])
def test_maps_vitkit_cannot_return_are_refused_in_one_line(case, options, words, tmp_path):
    cls, config = BACKBONES[case]
    randomize(getattr(T, cls)(config(**options))).save_pretrained(tmp_path)
    with pytest.raises(WeightsError, match=words) as info:
        vitkit.from_pretrained(tmp_path, features_only=True)
    assert "\n" not in str(info.value)
    if case != "beit":  # the encoder still loads (BEiT's pyramid tensors are not the encoder's: refused too)
        vitkit.from_pretrained(tmp_path)


def test_edited_out_indices_are_one_line(tmp_path):
    import json

    randomize(T.Dinov2Backbone(T.Dinov2Config(**SMALL))).save_pretrained(tmp_path)
    for bad, words in (([7], "not stages of its 3 blocks"), (["x"], "not stages")):
        cfg = json.loads((tmp_path / "config.json").read_text())
        cfg.update(out_indices=bad, out_features=None)
        (tmp_path / "config.json").write_text(json.dumps(cfg))
        with pytest.raises(WeightsError, match=words):
            vitkit.from_pretrained(tmp_path, features_only=True)
    cfg.update(out_features=["stage9"])
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(WeightsError, match="'stage9', not a stage"):
        vitkit.from_pretrained(tmp_path, features_only=True)


def test_a_backbone_saved_by_vitkit_returns_the_same_maps_when_loaded_again(tmp_path, images):
    import json

    ref = randomize(T.Dinov2Backbone(T.Dinov2Config(**SMALL, out_indices=[1, 3]))).eval()
    ref.save_pretrained(tmp_path / "hf")
    vitkit.from_pretrained(tmp_path / "hf", features_only=True).save_pretrained(tmp_path / "ours")
    # the blocks and their norm were dropped: the reload returned the last 3 blocks' maps, unnormalised
    again = vitkit.from_pretrained(tmp_path / "ours", features_only=True)
    assert (again.out_indices, again.norm) == ([0, 2], True)
    x = images(2, 32, 32)
    with torch.no_grad():
        want, got = ref(pixel_values=x).feature_maps, again(x)
    assert len(want) == len(got) == 2 and all(max_diff(a, b) <= 1e-5 for a, b in zip(want, got))
    assert vitkit.from_pretrained(tmp_path / "ours", features_only=True, out_indices=[1]).out_indices == [1]
    assert not hasattr(vitkit.from_pretrained(tmp_path / "ours"), "out_indices")  # the encoder, as before
    cfg = json.loads((tmp_path / "ours" / "config.json").read_text())
    for bad in ({"out_indices": "last"}, {"out_indices": [0], "norm": "yes"}, [0, 2]):
        (tmp_path / "ours" / "config.json").write_text(json.dumps({**cfg, "features": bad}))
        with pytest.raises(WeightsError, match='its "features" .* is not a backbone') as info:
            vitkit.from_pretrained(tmp_path / "ours", features_only=True)
        assert "\n" not in str(info.value)
    # vitkit info says what it holds, and the edited plan in one line too
    from vitkit.weights.pretrained import describe_source

    info = describe_source(tmp_path / "ours")
    assert "is not a backbone's plan" in info["refused"]
    (tmp_path / "ours" / "config.json").write_text(json.dumps(cfg))
    assert describe_source(tmp_path / "ours")["features"] == {"out_indices": [0, 2], "norm": True}
