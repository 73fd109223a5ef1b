"""big_vision's SigLIP image towers (``MAPHead_0``, ``params/img/`` of a two-tower checkpoint) both ways:
vitkit's npz export is read by timm's own big_vision reader with the same outputs, and read back."""

import numpy as np
import pytest
import torch

import vitkit
from conftest import max_diff, randomize

timm = pytest.importorskip("timm")
from timm.models.vision_transformer import _load_weights  # noqa: E402  (timm's reader of Google's npz)


@pytest.mark.parametrize("scan", [False, True])
def test_siglip_npz_written_by_vitkit_is_what_timm_reads(scan, tmp_path, images):
    model = randomize(vitkit.create_model("vit_base_patch16_siglip_224", depth=2, img_size=64, gelu="tanh"))
    path = vitkit.export_weights(model, tmp_path / "siglip.npz", "big_vision", scan=scan)
    assert any(k.startswith("params/MAPHead_0/") for k in np.load(path).files)
    ref = timm.create_model("vit_base_patch16_siglip_224", depth=2, img_size=64, act_layer="gelu_tanh").eval()
    _load_weights(ref, str(path))
    back = vitkit.from_pretrained(path)
    assert back.config.global_pool == "map" and not back.config.class_token and back.config.gelu == "tanh"
    x = images(2, 64, 64)
    with torch.no_grad():
        expected = model(x)
        assert max_diff(ref(x), expected) <= 1e-5 * max(1.0, expected.abs().max().item())
        assert max_diff(back(x), expected) == 0


def test_a_class_token_models_npz_is_what_timm_reads_into_a_model_without_a_class_slot(tmp_path, images):
    """big_vision's table has no class slot (vitkit folds the model's into cls): timm's reader fails on its
    class-slot model, and reads the file exactly into one built with no_embed_class=True, as the Weights page says
    (it said timm's reader reads vitkit's files, which held for pooled models only)."""
    model = randomize(vitkit.create_model("vit_tiny_patch16_224", depth=2, img_size=64, num_classes=7))
    path = vitkit.export_weights(model, tmp_path / "token.npz", "big_vision")
    with pytest.raises(RuntimeError):  # the class-slot model cannot take the table
        _load_weights(timm.create_model("vit_tiny_patch16_224", depth=2, img_size=64, num_classes=7), str(path))
    ref = timm.create_model("vit_tiny_patch16_224", depth=2, img_size=64, num_classes=7, no_embed_class=True).eval()
    _load_weights(ref, str(path))
    x = images(2, 64, 64)
    with torch.no_grad():
        expected = model.eval()(x)
        assert max_diff(ref(x), expected) <= 1e-5 * max(1.0, expected.abs().max().item())


def test_the_image_tower_of_a_two_tower_checkpoint(tmp_path, images):
    """SigLIP's released npz holds both towers: params/img/ is read, params/txt/ left out."""
    model = randomize(vitkit.create_model("vit_base_patch16_siglip_224", depth=1, img_size=32, gelu="tanh"))
    arrays = dict(np.load(vitkit.export_weights(model, tmp_path / "img.npz", "big_vision")))
    both = {k.replace("params/", "params/img/", 1): v for k, v in arrays.items()}
    both["params/txt/Embed_0/embedding"] = np.zeros((10, 4), np.float32)
    both["params/b"] = np.zeros((1,), np.float32)
    np.savez(tmp_path / "siglip.npz", **both)
    back = vitkit.from_pretrained(tmp_path / "siglip.npz")
    x = images(1, 32, 32)
    with torch.no_grad():
        assert max_diff(back(x), model(x)) == 0


def test_layouts_the_official_vit_cannot_hold_are_refused(tmp_path):
    model = vitkit.create_model("vit_small_patch14_reg4_dinov2", depth=1, img_size=28)
    with pytest.raises(vitkit.weights.io.WeightsError, match="reg_tokens"):
        vitkit.export_weights(model, tmp_path / "x.npz", "big_vision")
    with pytest.raises(vitkit.weights.io.WeightsError, match="the MAP head is big_vision's"):
        vitkit.export_weights(vitkit.create_model("vit_base_patch16_siglip_224", depth=1, img_size=32),
                              tmp_path / "y.npz", "npz")
