"""torchvision training/evaluation pipelines: shapes, normalisation, flip, crop, parity with EvalTransform."""

import sys

import numpy as np
import pytest
import torch
from PIL import Image

from vitkit.data import pipelines
from vitkit.data.transforms import EvalTransform
from vitkit.models.vit import ViTConfig

pytest.importorskip("torchvision")

MEAN, STD = (0.2, 0.4, 0.6), (0.5, 0.25, 0.125)


def noise_image(w, h, seed=0, mode="RGB"):
    shape = (h, w, 3) if mode == "RGB" else (h, w)
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8), mode)


def astronaut():
    skimage_data = pytest.importorskip("skimage.data")
    return Image.fromarray(skimage_data.astronaut())


def normalised(im, mean=MEAN, std=STD):
    arr = np.asarray(im, dtype=np.float32) / 255.0
    arr = arr[None] if arr.ndim == 2 else arr.transpose(2, 0, 1)
    return (torch.from_numpy(arr) - torch.tensor(mean).view(-1, 1, 1)) / torch.tensor(std).view(-1, 1, 1)


def test_shapes_and_dtype():
    im = noise_image(50, 40)
    for transform in (pipelines.train_transform(32, MEAN, STD), pipelines.eval_transform(32, MEAN, STD)):
        x = transform(im)
        assert isinstance(x, torch.Tensor) and x.dtype == torch.float32 and x.shape == (3, 32, 32)
    assert pipelines.train_transform((24, 40), MEAN, STD)(im).shape == (3, 24, 40)
    assert pipelines.eval_transform((24, 40), MEAN, STD)(im).shape == (3, 24, 40)


def test_an_image_equal_to_the_mean_comes_out_zero():
    im = Image.new("RGB", (45, 37), tuple(round(m * 255) for m in MEAN))
    for transform in (pipelines.train_transform(16, MEAN, STD), pipelines.eval_transform(16, MEAN, STD)):
        assert transform(im).abs().max() < 1e-5


def test_eval_matches_eval_transform_on_a_natural_image():
    config = ViTConfig(img_size=224, patch_size=16, embed_dim=64, depth=1, num_heads=2, mlp_dim=64,
                       crop_pct=0.875, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
    im = astronaut()
    ours, reference = pipelines.from_model_config(config, train=False)(im), EvalTransform.from_config(config)(im)
    assert ours.shape == reference.shape == (3, 224, 224)
    assert torch.equal(ours, reference)  # one evaluation path


def test_flip_flips():
    im = noise_image(20, 20, seed=1)
    kwargs = {"scale": (1.0, 1.0), "ratio": (1.0, 1.0)}
    kept = pipelines.train_transform(20, MEAN, STD, hflip=0.0, **kwargs)(im)
    flipped = pipelines.train_transform(20, MEAN, STD, hflip=1.0, **kwargs)(im)
    assert torch.allclose(kept, normalised(im), atol=1e-6)
    assert torch.allclose(flipped, kept.flip(-1), atol=1e-6) and not torch.allclose(flipped, kept)


def test_full_area_square_crop_is_a_resize():
    im = noise_image(48, 48, seed=2)
    out = pipelines.train_transform(32, MEAN, STD, scale=(1.0, 1.0), ratio=(1.0, 1.0), hflip=0.0)(im)
    assert torch.allclose(out, normalised(im.resize((32, 32), Image.Resampling.BICUBIC)), atol=1e-6)


def test_random_crops_differ():
    im = noise_image(64, 64, seed=3)
    transform = pipelines.train_transform(16, MEAN, STD)
    torch.manual_seed(0)
    assert not torch.allclose(transform(im), transform(im))


def test_one_channel_config_on_grey_images():
    config = ViTConfig(img_size=(32, 48), patch_size=16, in_chans=1, embed_dim=64, depth=1, num_heads=2,
                       mlp_dim=64, mean=(0.5,), std=(0.5,), interpolation="bilinear")
    im = noise_image(60, 50, mode="L")
    for train in (True, False):
        x = pipelines.from_model_config(config, train=train)(im)
        assert x.shape == (1, 32, 48) and x.dtype == torch.float32 and -1.0 <= x.min() and x.max() <= 1.0


def test_bad_arguments_and_missing_torchvision(monkeypatch):
    with pytest.raises(ValueError, match="interpolation must be one of"):
        pipelines.eval_transform(32, MEAN, STD, interpolation="lanczos5")
    with pytest.raises(ValueError, match="crop_pct"):
        pipelines.eval_transform(32, MEAN, STD, crop_pct=1.5)
    monkeypatch.setitem(sys.modules, "torchvision.transforms", None)
    with pytest.raises(ImportError, match=r"pip install 'vitkit\[train\]'"):
        pipelines.train_transform(32, MEAN, STD)
