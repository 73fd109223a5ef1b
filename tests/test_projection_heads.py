"""An image-text tower's head is a projection into the joint space (CLIP's 512-wide image embedding), not
classes: read from open_clip, transformers' ...WithProjection and timm's pre-trained CLIP tags as
``head_kind='projection'``, and refused by every verb that scores classes (it answered "class 434")."""

import json

import numpy as np
import pytest
from PIL import Image

import vitkit
from conftest import randomize
from vitkit.cli import main as cli
from vitkit.weights.io import WeightsError


def _open_clip_folder(folder):
    open_clip = pytest.importorskip("open_clip")
    from safetensors.torch import save_file

    cfg = open_clip.get_model_config("ViT-B-32")
    cfg["vision_cfg"].update(layers=1, image_size=64)
    cfg["text_cfg"].update(layers=1)
    model = randomize(open_clip.CLIP(**cfg))
    folder.mkdir()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(folder / "open_clip_model.safetensors"))
    (folder / "open_clip_config.json").write_text(json.dumps({"model_cfg": cfg}))
    return folder


@pytest.fixture
def photo(tmp_path):
    path = tmp_path / "photo.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(path)
    return path


def test_an_open_clip_tower_is_a_projection_every_class_verb_refuses(tmp_path, photo, capsys):
    folder = _open_clip_folder(tmp_path / "clip")
    model = vitkit.from_pretrained(folder)
    assert model.config.head_kind == "projection" and model.config.num_classes == 512
    for argv in (["predict", "--weights", str(folder), str(photo)],
                 ["eval", "--weights", str(folder), "--data-dir", str(tmp_path)]):
        assert cli(argv) == 2
        err = capsys.readouterr().err
        assert "projection into an image-text space" in err and "512 wide" in err and "Traceback" not in err
    from vitkit.serve.model import ServedModel

    with pytest.raises(ValueError, match="image-text space"):
        ServedModel(model)
    assert cli(["inspect", "--weights", str(folder), "--image", str(photo), "--out", str(tmp_path / "i")]) == 0
    page = (tmp_path / "i" / "report.html").read_text()
    assert "<h2>predictions</h2>" not in page and "an image-text embedding" in page
    assert cli(["info", str(folder)]) == 0
    assert "an image-text projection, 512 wide (no classes)" in capsys.readouterr().out
    pytest.importorskip("onnxruntime")
    assert cli(["convert", str(folder), str(tmp_path / "clip.onnx"), "--to", "onnx"]) == 0  # the graph keeps it
    capsys.readouterr()
    assert cli(["eval", "--weights", str(tmp_path / "clip.onnx"), "--data-dir", str(tmp_path)]) == 2
    assert "an exported graph scores no classes" in capsys.readouterr().err


def test_the_projection_travels_with_the_weights_and_a_new_head_is_a_classifier(tmp_path):
    model = vitkit.from_pretrained(_open_clip_folder(tmp_path / "clip"))
    model.save_pretrained(tmp_path / "saved")
    assert vitkit.from_pretrained(tmp_path / "saved").config.head_kind == "projection"
    assert model.config.replace(num_classes=10).head_kind == "classes"  # another head: classes again
    assert model.config.replace(img_size=(32, 32)).head_kind == "projection"
    with pytest.raises(ValueError, match="head_kind must be one of"):
        model.config.replace(head_kind="embedding")
    from vitkit.train.init import model_from_init

    data = dict(img_size=(64, 64), in_chans=3, num_classes=512, label_names=None)
    fresh = model_from_init(str(tmp_path / "saved"), data, {}, head="new", log=lambda _: None)
    assert fresh.config.head_kind == "classes" and fresh.config.num_classes == 512
    with pytest.raises(WeightsError, match="keeps a classifier.*image-text space"):
        model_from_init(str(tmp_path / "saved"), data, {}, head="keep", log=lambda _: None)


def test_transformers_clip_with_projection_is_a_projection(tmp_path):
    T = pytest.importorskip("transformers")
    cfg = T.CLIPVisionConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                             image_size=32, patch_size=8, projection_dim=16)
    randomize(T.CLIPVisionModelWithProjection(cfg)).save_pretrained(tmp_path / "hf")
    model = vitkit.from_pretrained(tmp_path / "hf")
    assert model.config.head_kind == "projection" and model.config.num_classes == 16


@pytest.mark.parametrize("tag, kind", [("openai", "projection"), ("laion2b_ft_in1k", "classes"), (None, "classes")])
def test_timms_pretrained_clip_tags_are_projections_its_fine_tuned_ones_classes(tag, kind, tmp_path):
    timm = pytest.importorskip("timm")
    from safetensors.torch import save_file

    ref = timm.create_model("vit_base_patch16_clip_224", depth=1, img_size=32, num_classes=16)
    save_file(ref.state_dict(), str(tmp_path / "model.safetensors"))
    pretrained = {"input_size": [3, 32, 32], **({"tag": tag} if tag else {})}
    (tmp_path / "config.json").write_text(json.dumps({"architecture": "vit_base_patch16_clip_224", "num_classes": 16,
                                                      "model_args": {"depth": 1, "img_size": 32},
                                                      "pretrained_cfg": pretrained}))
    assert vitkit.from_pretrained(tmp_path).config.head_kind == kind


def test_a_pushed_projection_tower_is_not_carded_as_a_classifier(tmp_path):
    """Its model card said "an image classifier", tagged image-classification, 512 classes, and advised
    vitkit predict (which refuses it)."""
    from vitkit.models.serialize import native_config_dict
    from vitkit.weights.hub import model_card

    model = vitkit.from_pretrained(_open_clip_folder(tmp_path / "clip"))
    card = model_card(native_config_dict(model.config), 1000, "org/clip")
    assert "image-classification" not in card and "vitkit predict" not in card
    assert "an image-text tower's image encoder" in card and "none: an image-text projection, 512 wide" in card
