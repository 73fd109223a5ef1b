"""timm models saved through transformers (``TimmWrapperModel`` / ``TimmWrapperForImageClassification``: a
timm hub config.json with ``model_type: timm_wrapper``, every tensor under ``timm_model.``) load as the timm
architecture they name, with transformers' outputs (fp32, 1e-5); one vitkit does not know is refused by name."""

import pytest
import torch

import vitkit
from conftest import max_diff, randomize
from vitkit.weights.io import WeightsError
from vitkit.weights.pretrained import describe_source

T = pytest.importorskip("transformers")
pytest.importorskip("timm")


@pytest.mark.parametrize("arch, args", [
    ("vit_small_patch16_224", dict(depth=2, img_size=32, patch_size=8)),
    ("deit_tiny_distilled_patch16_224", dict(depth=2, img_size=32, patch_size=8)),
    ("eva02_tiny_patch14_224", dict(depth=2, img_size=28)),
])
def test_a_timm_model_saved_by_transformers_loads_with_its_outputs(arch, args, tmp_path, images):
    x = images(2, args["img_size"], args["img_size"])
    classifier = randomize(T.TimmWrapperForImageClassification(
        T.TimmWrapperConfig(architecture=arch, num_labels=3, model_args=args)))
    classifier.save_pretrained(tmp_path / "classifier")
    features = randomize(T.TimmWrapperModel(T.TimmWrapperConfig(architecture=arch, model_args=args)), seed=1)
    features.save_pretrained(tmp_path / "features")
    ours, headless = vitkit.from_pretrained(tmp_path / "classifier"), vitkit.from_pretrained(tmp_path / "features")
    assert ours.config.label_names == ["LABEL_0", "LABEL_1", "LABEL_2"] and headless.config.num_classes == 0
    with torch.no_grad():
        assert max_diff(classifier(pixel_values=x).logits, ours(x)) <= 1e-5
        assert max_diff(features(pixel_values=x).pooler_output, headless(x)) <= 1e-5
    assert "TimmWrapperForImageClassification" in describe_source(tmp_path / "classifier")["source_name"]
    import warnings

    T.TimmWrapperModel(T.TimmWrapperConfig(architecture=arch, num_labels=3, model_args=args)).save_pretrained(
        tmp_path / "named")  # a classifier's config saved headless: its names are not said to be dropped
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*label_names")
        assert vitkit.from_pretrained(tmp_path / "named").config.num_classes == 0


def test_a_timm_architecture_vitkit_does_not_know_is_refused_by_name(tmp_path):
    T.TimmWrapperModel(T.TimmWrapperConfig(architecture="resnet18")).save_pretrained(tmp_path)
    with pytest.raises(WeightsError, match="timm architecture 'resnet18' is not one vitkit knows"):
        vitkit.from_pretrained(tmp_path)
