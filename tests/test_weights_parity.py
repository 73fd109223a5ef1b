"""fp32 parity (<= 1e-5) with timm, Hugging Face transformers and timm's official-npz loader."""

import json

import pytest
import torch

import vitkit
from conftest import max_diff, randomize
from vitkit.weights import WeightsError

timm = pytest.importorskip("timm")
TOL = 1e-5


def timm_pair(name, **kw):
    ref = randomize(timm.create_model(name, pretrained=False, **kw))
    ours = vitkit.create_model(name, **kw).eval()
    report = vitkit.load_weights(ours, ref.state_dict())
    assert report.format == "timm" and not report.missing and not report.unexpected
    return ref, ours


def assert_close(ref, ours, x):
    with torch.no_grad():
        a, b = ref(x), ours(x)
    assert a.std() > 1e-2, "degenerate outputs would hide mapping errors"
    assert max_diff(a, b) <= TOL


@pytest.mark.parametrize("name", ["vit_tiny_patch16_224", "vit_small_patch16_224"])
def test_timm_standard_models(name, images):
    ref, ours = timm_pair(name, num_classes=11)
    assert_close(ref, ours, images(2))


def test_timm_non_square_avg_pool_without_class_token(images):
    kw = dict(img_size=(96, 160), class_token=False, global_pool="avg", num_classes=7)
    ref, ours = timm_pair("vit_small_patch16_224", **kw)
    assert ours.fc_norm.weight is not None and isinstance(ours.norm, torch.nn.Identity)
    assert_close(ref, ours, images(2, 96, 160))


def test_timm_layerscale_model(images):
    ref, ours = timm_pair("vit_tiny_patch16_224", init_values=1e-5, num_classes=3, img_size=64)
    assert_close(ref, ours, images(2, 64, 64))


def test_timm_dynamic_img_size(images):
    ref, ours = timm_pair("vit_tiny_patch16_224", dynamic_img_size=True, num_classes=4, img_size=64)
    assert_close(ref, ours, images(2, 80, 48))


def test_timm_forward_intermediates_match(images):
    ref, ours = timm_pair("vit_tiny_patch16_224", num_classes=4, img_size=64)
    x = images(1, 64, 64)
    with torch.no_grad():
        _, a = ref.forward_intermediates(x, indices=[1, 5], norm=True)
        _, b = ours.forward_intermediates(x, indices=[1, 5], norm=True)
    assert all(max_diff(p, q) <= TOL for p, q in zip(a, b))


def test_pos_embed_resampling_matches_timm():
    from timm.layers import resample_abs_pos_embed

    from vitkit.models import resample_pos_embed

    pos = torch.randn(1, 1 + 14 * 14, 64, generator=torch.Generator().manual_seed(0))
    ref = resample_abs_pos_embed(pos, new_size=(24, 24), num_prefix_tokens=1)
    ours = resample_pos_embed(pos, (24, 24), num_prefix_tokens=1)
    assert ours.shape == (1, 1 + 24 * 24, 64)
    assert max_diff(ref, ours) <= 1e-6
    # the whole model: 224 weights loaded into a 384 model resample the same way timm's does
    ref_model = randomize(timm.create_model("vit_tiny_patch16_224", num_classes=2))
    ours_384 = vitkit.create_model("vit_tiny_patch16_384", num_classes=2)
    report = vitkit.load_weights(ours_384, ref_model.state_dict())
    assert report.resampled == ["pos_embed 14x14 -> 24x24 (bicubic, antialiased)"]  # timm's, and said so
    expected = resample_abs_pos_embed(ref_model.pos_embed.detach(), new_size=(24, 24), num_prefix_tokens=1)
    assert max_diff(ours_384.pos_embed.detach(), expected) <= 1e-6


def test_convert_says_what_it_resampled_and_refuses_an_interpolation_that_resamples_nothing(tmp_path, capsys):
    """`vitkit convert --interpolation` took the flag and wrote the model at its stored size without a word (the
    flag did nothing), and a resampled table was never said. The table written is timm's resampling of it."""
    from safetensors.torch import load_file
    from timm.layers import resample_abs_pos_embed
    from timm.models import save_for_hf

    from vitkit.cli import main

    args = {"num_classes": 2, "img_size": 64, "depth": 1}
    ref = randomize(timm.create_model("vit_tiny_patch16_224", **args)).eval()
    src = tmp_path / "hub"  # timm's hub layout: its config says 64 px
    save_for_hf(ref, src, model_args=args, safe_serialization=True)
    for size in ([], ["--img-size", "64"]):
        assert main(["convert", str(src), str(tmp_path / "same"), "--to", "vitkit", "--interpolation", "bilinear",
                     "--threads", "1", *size]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--interpolation bilinear resamples" in err and "need none" in err
        assert not (tmp_path / "same").exists()
    assert main(["convert", str(src), str(tmp_path / "big"), "--to", "vitkit", "--interpolation", "bilinear",
                 "--img-size", "96", "--threads", "1"]) == 0
    assert "note: resampled pos_embed 4x4 -> 6x6 (bilinear, antialiased)" in capsys.readouterr().err
    written = load_file(tmp_path / "big" / "model.safetensors")["pos_embed"]
    expected = resample_abs_pos_embed(ref.pos_embed.detach(), new_size=(6, 6), num_prefix_tokens=1,
                                      interpolation="bilinear", antialias=True)
    assert max_diff(written, expected) <= 1e-6
    model, report = vitkit.from_pretrained(src, img_size=96, output_loading_info=True)  # transformers' keyword
    assert report.format == "timm" and report.resampled == ["pos_embed 4x4 -> 6x6 (bicubic, antialiased)"]
    assert isinstance(vitkit.from_pretrained(src), torch.nn.Module)


def test_weights_of_another_architecture_by_a_name_are_said_to_be_that_not_a_size(tmp_path):
    """A DeiT III name over DINOv2's tensors (a class slot before its 4x4 grid; DeiT III's table has none) was
    told to "build the model at the size it was trained at": every size was refused as well."""
    from safetensors.torch import save_file

    ref = timm.create_model("vit_small_patch14_dinov2", img_size=56, depth=1, embed_dim=64, num_heads=2)
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, tmp_path / "dinov2.safetensors")
    with pytest.raises(WeightsError, match=r"17 slots: .* it reads as 1 prefix slot\(s\) before a 4x4 grid, which the "
                                           r"model \(deit3_small_patch16_224\) has no slots for: weights of another "
                                           r"architecture"):
        vitkit.from_pretrained(tmp_path / "dinov2.safetensors", model_name="deit3_small_patch16_224")


def test_timm_api_classifier_and_intermediates_of_a_model_without_prefix_tokens(images):
    """get_classifier() (timm's: missing) and forward_intermediates(return_prefix_tokens=True) on a model without
    prefix tokens: timm returns the maps alone, vitkit returned (map, empty) pairs."""
    kw = dict(img_size=(32, 48), patch_size=16, class_token=False, global_pool="avg", num_classes=7, depth=2)
    ref, ours = timm_pair("vit_small_patch16_224", **kw)
    x = images(2, 32, 48)
    with torch.no_grad():
        a = ref.forward_intermediates(x, indices=[0, 1], return_prefix_tokens=True, intermediates_only=True)
        b = ours.forward_intermediates(x, indices=[0, 1], return_prefix_tokens=True, intermediates_only=True)
    assert all(isinstance(t, torch.Tensor) for t in a + b) and all(max_diff(p, q) <= TOL for p, q in zip(a, b))
    assert ours.get_classifier() is ours.head and torch.equal(ref.get_classifier().weight, ours.head.weight)
    ref, ours = timm_pair("deit_tiny_distilled_patch16_224", img_size=32, depth=1, num_classes=3)
    theirs, mine = ref.get_classifier(), ours.get_classifier()  # a distilled DeiT's two heads, in timm's order
    assert len(theirs) == len(mine) == 2 and all(torch.equal(p.weight, q.weight) for p, q in zip(theirs, mine))


def test_timm_no_embed_class_pos_table_loads_exactly(images):
    """timm's no_embed_class / big_vision tables (no class slot) become a zero class slot."""
    ref = randomize(timm.create_model("vit_tiny_patch16_224", no_embed_class=True, num_classes=3, img_size=64))
    ours = vitkit.create_model("vit_tiny_patch16_224", num_classes=3, img_size=64).eval()
    vitkit.load_weights(ours, ref.state_dict())
    assert torch.count_nonzero(ours.pos_embed[:, 0]) == 0
    assert_close(ref, ours, images(2, 64, 64))


def test_a_class_slot_before_a_non_square_grid_is_never_read_as_a_square_table(tmp_path, images):
    """25 slots are a 5x5 table over the patches only, or a class slot before the 4x6 patches of 64x96 px: the
    tensors cannot tell. Into a model of another size it is refused (it was read as 5x5: 2.7 off); with the size
    asked for it is the 4x6 grid, exactly timm's model."""
    from safetensors.torch import save_file

    ref = randomize(timm.create_model("vit_tiny_patch16_224", img_size=(64, 96), num_classes=3))
    ours = vitkit.create_model("vit_tiny_patch16_224", num_classes=3).eval()
    with pytest.raises(WeightsError, match=r"25 slots: a 5x5 grid without a class slot, or 24 patches"):
        vitkit.load_weights(ours, ref.state_dict())
    path = tmp_path / "m.safetensors"
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, str(path))
    with pytest.warns(UserWarning, match=r"a class slot before 24 patches of a non-square grid reads the same"):
        guessed = vitkit.from_pretrained(path)  # without a size: the square table, and a warning saying so
    assert tuple(guessed.patch_embed.grid_size) == (5, 5)
    with pytest.warns(UserWarning, match=r"reads the same: img_size= \(--img-size\) the size it was saved at"):
        vitkit.from_pretrained(path, img_size=224)  # another size resamples the 5x5 reading (it said nothing)
    with pytest.warns(UserWarning):  # (the normalisation is a guess)
        at_size = vitkit.from_pretrained(path, img_size=(64, 96)).eval()
    assert tuple(at_size.patch_embed.grid_size) == (4, 6) and at_size.pos_embed.shape[1] == 25
    assert_close(ref, at_size, images(2, 64, 96))


# ------------------------------------------------------------------ Hugging Face


transformers = pytest.importorskip("transformers")


def hf_config(**kw):
    base = dict(hidden_size=192, num_hidden_layers=3, num_attention_heads=3, intermediate_size=768,
                image_size=64, patch_size=16, num_labels=4,
                id2label={0: "cat", 1: "dog", 2: "fox", 3: "owl"}, label2id={"cat": 0, "dog": 1, "fox": 2, "owl": 3})
    base.update(kw)
    return transformers.ViTConfig(**base)


def test_hf_image_classification_to_vitkit(tmp_path, images):
    ref = randomize(transformers.ViTForImageClassification(hf_config()))
    ref.save_pretrained(tmp_path)
    ours = vitkit.from_pretrained(tmp_path)
    assert ours.config.norm_eps == 1e-12  # read from the HF config, not assumed
    assert ours.config.label_names == ["cat", "dog", "fox", "owl"]
    x = images(2, 64, 64)
    with torch.no_grad():
        a = ref(x).logits
    assert a.std() > 1e-2 and max_diff(a, ours(x)) <= TOL


def test_an_id2label_list_is_one_line_naming_the_file(tmp_path):
    """transformers writes {"0": "cat", ...}; a list (hand-edited) ended in an 'unexpected AttributeError'."""
    randomize(transformers.ViTForImageClassification(hf_config())).save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["id2label"] = ["cat", "dog", "fox", "owl"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(WeightsError, match=r"config\.json: id2label must map class numbers to names .* not a list"):
        vitkit.from_pretrained(tmp_path)


def test_hf_vitmodel_pooler_is_pre_logits(tmp_path, images):
    ref = randomize(transformers.ViTModel(hf_config()))
    ref.save_pretrained(tmp_path)
    ours = vitkit.from_pretrained(tmp_path)
    assert ours.config.representation_size == 192 and ours.config.num_classes == 0
    x = images(2, 64, 64)
    with torch.no_grad():
        out = ref(x)
        feats = ours.forward_features(x)
    assert max_diff(out.last_hidden_state, feats) <= TOL
    assert max_diff(out.pooler_output, ours(x)) <= TOL


def test_vitkit_to_hf_loads_in_transformers(tmp_path, images):
    ours = randomize(vitkit.create_model("vit_tiny_patch16_224", img_size=64, num_classes=3,
                                         label_names=["a", "b", "c"]))
    vitkit.export_weights(ours, tmp_path / "hf", "hf")
    ref = transformers.ViTForImageClassification.from_pretrained(tmp_path / "hf").eval()
    assert ref.config.id2label[2] == "c"
    x = images(2, 64, 64)
    with torch.no_grad():
        assert max_diff(ref(x).logits, ours(x)) <= TOL


# ------------------------------------------------------------------ official npz


def test_vitkit_npz_read_by_timm_official_loader(tmp_path, images):
    ours = randomize(vitkit.create_model("vit_small_patch16_224", img_size=64, num_classes=5))
    path = vitkit.export_weights(ours, tmp_path / "vit.npz", "npz")
    ref = timm.create_model("vit_small_patch16_224", img_size=64, num_classes=5).eval()
    ref.load_pretrained(str(path))  # timm's own reader of the official layout
    assert_close(ref, ours, images(2, 64, 64))
    back = vitkit.create_model("vit_small_patch16_224", img_size=64, num_classes=5).eval()
    assert vitkit.load_weights(back, path).format == "npz"
    for (k, v), (k2, v2) in zip(ours.state_dict().items(), back.state_dict().items()):
        assert k == k2 and torch.equal(v, v2), k


def test_big_vision_scan_npz_read_by_timm(tmp_path, images):
    kw = dict(img_size=64, class_token=False, global_pool="avg", fc_norm=False, num_classes=5)
    ours = randomize(vitkit.create_model("vit_tiny_patch16_224", **kw))
    path = vitkit.export_weights(ours, tmp_path / "bv.npz", "big_vision", scan=True)
    ref = timm.create_model("vit_tiny_patch16_224", **kw).eval()
    ref.load_pretrained(str(path))
    assert_close(ref, ours, images(2, 64, 64))


def test_timm_hub_folder_from_save_for_hf(tmp_path, images):
    """A folder as timm pushes to the Hub: config.json (architecture, model_args) + weights."""
    from timm.models import save_for_hf

    ref = randomize(timm.create_model("vit_tiny_patch16_224", img_size=64, num_classes=3))
    save_for_hf(ref, str(tmp_path), model_config={"label_names": ["a", "b", "c"]}, safe_serialization=True)
    ours = vitkit.from_pretrained(tmp_path)
    assert ours.config.img_size == (64, 64) and ours.config.label_names == ["a", "b", "c"]
    assert_close(ref, ours, images(2, 64, 64))
