"""One decoder and one evaluation transform: timm's evaluation pixels, the same for every reader."""

import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import vitkit
from vitkit.data import pipelines
from vitkit.data.folder import ImageFolder
from vitkit.data.images import BadImageError, Skipped, decode_image, load_image
from vitkit.data.transforms import MAX_RESIZED_PIXELS, EvalTransform, preprocess
from vitkit.evaluate import predict_images

MEAN, STD = (0.2, 0.4, 0.6), (0.5, 0.25, 0.125)


def noise_image(w, h, seed=0):
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8), "RGB")


@pytest.mark.parametrize("crop_mode", ["center", "squash", "border"])
@pytest.mark.parametrize("img_size", [32, (24, 40), (40, 24)])
@pytest.mark.parametrize("crop_pct", [0.875, 0.9, 1.0])
@pytest.mark.parametrize("interpolation", ["bicubic", "bilinear"])
def test_eval_transform_is_timms_pixel_for_pixel(img_size, crop_pct, interpolation, crop_mode):
    timm_data = pytest.importorskip("timm.data")
    pair = (img_size, img_size) if isinstance(img_size, int) else img_size
    ref = timm_data.create_transform(input_size=(3, *pair), is_training=False, interpolation=interpolation,
                                     mean=MEAN, std=STD, crop_pct=crop_pct, crop_mode=crop_mode)
    ours = EvalTransform(pair, MEAN, STD, crop_pct, interpolation, crop_mode)
    for seed, (w, h) in enumerate([(50, 40), (40, 50), (333, 500), (97, 64), (71, 71), (35, 99)]):
        im = noise_image(w, h, seed)
        expected = ref(im)
        assert expected.shape == ours(im).shape == (3, *pair)
        assert torch.allclose(ours(im), expected, atol=1e-6), (w, h)


def test_a_squashed_or_bordered_image_keeps_all_of_it_and_a_bad_crop_mode_is_one_line():
    im = Image.new("RGB", (60, 20), (255, 0, 0))
    im.paste((0, 0, 255), (50, 0, 60, 20))  # a blue band on the right, outside a centre crop of the short side
    squashed = EvalTransform((16, 16), (0, 0, 0), (1, 1, 1), 1.0, "bilinear", "squash")(im)
    centred = EvalTransform((16, 16), (0, 0, 0), (1, 1, 1), 1.0, "bilinear")(im)
    assert squashed[2, :, -1].min() > 0.9 and centred[2].max() < 0.1
    # border: the long side to 16 (60 x 20 -> 16 x 5), rows above and below in the mean's colour (0.2 -> 51 / 255)
    bordered = EvalTransform((16, 16), (0.2, 0.2, 0.2), (1, 1, 1), 1.0, "bilinear", "border")(im) + 0.2
    assert bordered[2, 8, -1] > 0.9 and torch.allclose(bordered[:, :5], torch.tensor(51 / 255))
    with pytest.raises(ValueError, match="crop_mode must be one of"):
        EvalTransform((16, 16), MEAN, STD, 1.0, "bilinear", "crop")
    with pytest.raises(ValueError, match="crop_mode must be one of"):
        vitkit.create_model("vit_fmnist", crop_mode="crop")


def test_validation_of_files_uses_the_prediction_transform():
    transform = pipelines.eval_transform((24, 40), MEAN, STD, crop_pct=0.9, interpolation="bilinear")
    assert isinstance(transform, EvalTransform)
    im = noise_image(61, 47)
    assert torch.equal(transform(im), EvalTransform((24, 40), MEAN, STD, 0.9, "bilinear")(im))


def write_png_16bit(path, value):
    Image.fromarray(np.full((20, 30), value, dtype=np.uint16)).save(path)


def test_one_decoder_scales_16_bit_and_composites_alpha(tmp_path):
    write_png_16bit(tmp_path / "deep.png", 32768)
    grey = np.asarray(load_image(tmp_path / "deep.png", channels=1))
    assert grey.dtype == np.uint8 and abs(int(grey.mean()) - 128) <= 1  # scaled, not clipped to 255
    rgba = np.zeros((8, 8, 4), dtype=np.uint8)
    rgba[..., 0], rgba[..., 3] = 200, 0  # fully transparent red: white
    Image.fromarray(rgba, "RGBA").save(tmp_path / "clear.png")
    assert np.asarray(load_image(tmp_path / "clear.png")).min() == 255
    for name in ("deep.png", "clear.png"):
        assert np.array_equal(np.asarray(load_image(tmp_path / name)), np.asarray(decode_image(tmp_path / name)))
    with pytest.raises(FileNotFoundError):
        load_image(tmp_path / "missing.png")


def test_integer_grey_levels_are_scaled_by_the_depth_the_file_says_not_by_their_values(tmp_path):
    """A dark 16-bit PGM (every level under 256 of 65,535) was read as 8-bit levels, 257 times too bright. The
    depth is read before the EXIF rotation (the upright copy knows no format), which still turns a 16-bit PNG; an
    opened file's copy (exif_transpose, crop) is read as the file is."""
    import io

    from PIL import ImageOps

    levels = np.arange(16).reshape(4, 4) * 10  # 0..150 of 65,535: near black
    (tmp_path / "dark.pgm").write_bytes(b"P5\n4 4\n65535\n" + levels.astype(">u2").tobytes())
    assert np.asarray(decode_image(tmp_path / "dark.pgm", channels=1)).max() == 1
    assert np.asarray(load_image(tmp_path / "dark.pgm", channels=1)).max() == 1
    Image.fromarray(levels.astype(np.uint16)).save(tmp_path / "dark.tif")  # 16 bits per sample, said by the file
    assert np.asarray(decode_image(tmp_path / "dark.tif", channels=1)).max() == 1
    exif = Image.Exif()
    exif[0x0112] = 6  # rotated: 6 wide, 4 high on disk, upright 4 wide, 6 high
    rotated = io.BytesIO()
    Image.fromarray((np.arange(24).reshape(4, 6) * 2000).astype(np.uint16)).save(rotated, "PNG", exif=exif.tobytes())
    assert decode_image(rotated.getvalue(), channels=1).size == (4, 6)
    (tmp_path / "mid.pgm").write_bytes(b"P5 32 32 1023\n" + np.full((32, 32), 512, ">u2").tobytes())  # 10-bit grey
    model = vitkit.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=1)
    from_file = vitkit.preprocess(model, tmp_path / "mid.pgm")
    assert torch.equal(vitkit.preprocess(model, ImageOps.exif_transpose(Image.open(tmp_path / "mid.pgm"))), from_file)


def test_a_transparent_16_bit_grey_level_and_a_lab_image_decode_as_their_8_bit_and_rgb_forms(tmp_path):
    """A 16-bit PNG's transparent grey (tRNS) is composited on white as an 8-bit one is (it was dropped); a LAB
    image reads as grey through RGB (Pillow converts LAB to RGB only: a grey model refused it)."""
    deep = np.full((8, 8), 100 * 257, dtype=np.uint16)
    deep[2:6, 2:6] = 230 * 257
    Image.fromarray(deep).save(tmp_path / "t16.png", transparency=230 * 257)
    assert Image.open(tmp_path / "t16.png").info.get("transparency") == 230 * 257
    Image.fromarray((deep // 257).astype(np.uint8)).save(tmp_path / "t8.png", transparency=230)
    for channels in (1, 3):
        eight = np.asarray(decode_image(tmp_path / "t8.png", channels))
        assert eight[3, 3].min() == 255 and eight[0, 0].max() == 100
        assert np.array_equal(np.asarray(decode_image(tmp_path / "t16.png", channels)), eight)
    rgb = Image.fromarray(np.random.default_rng(0).integers(0, 256, (16, 16, 3), dtype=np.uint8))
    lab = rgb.convert("LAB")
    lab.save(tmp_path / "lab.tif")
    assert np.array_equal(np.asarray(decode_image(tmp_path / "lab.tif", 1)),
                          np.asarray(lab.convert("RGB").convert("L")))


@pytest.mark.parametrize("in_chans", [1, 3])
def test_the_transform_of_a_pil_image_converts_its_mode_as_preprocess_does(in_chans):
    """``transform_for(model)(image)`` took a palette's indices for grey levels, a 16-bit image's raw values, and
    an RGBA image's four channels; it reads every mode as ``preprocess`` (and a decoded file) does."""
    model = vitkit.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=1, in_chans=in_chans)
    transform = vitkit.transform_for(model)
    rng = np.random.default_rng(0)
    rgb = Image.fromarray(rng.integers(0, 256, (40, 36, 3), dtype=np.uint8))
    rgba = np.dstack([np.asarray(rgb), rng.integers(0, 256, (40, 36), dtype=np.uint8)])
    images = {"P": rgb.convert("P"), "I;16": Image.fromarray(rng.integers(0, 65536, (40, 36), dtype=np.uint16)),
              "1": rgb.convert("1"), "RGBA": Image.fromarray(rgba, "RGBA"), "LA": rgb.convert("LA"),
              "L": rgb.convert("L"), "RGB": rgb}
    for mode, im in images.items():
        assert im.mode == mode
        x = transform(im)
        assert x.shape == (in_chans, 32, 32), mode
        assert torch.equal(x, preprocess(model, im)[0]), mode


def test_predict_sees_the_pixels_that_folder_validation_sees(tmp_path):
    """The 16-bit file that `vitkit predict` once clipped to white: the same tensor on both paths."""
    import vitkit

    (tmp_path / "a").mkdir()
    write_png_16bit(tmp_path / "a" / "deep.png", 20000)
    noise_image(37, 23).save(tmp_path / "a" / "wide.png")
    model = vitkit.create_model("vit_fmnist", in_chans=3, mean=MEAN, std=STD, num_classes=2, img_size=28,
                                crop_pct=0.875).eval()
    folder = ImageFolder(tmp_path, channels=3)
    transform = pipelines.from_model_config(model.config, train=False)
    seen = {}
    model.register_forward_pre_hook(lambda m, args: seen.setdefault("x", args[0].clone()))
    for i, (path, _) in enumerate(folder.samples):
        seen.clear()
        predict_images(model, [path], top_k=1)
        assert torch.equal(seen["x"][0], transform(folder[i][0])), path


def test_a_long_thin_image_is_refused_by_name_before_its_resize_takes_gigabytes(tmp_path):
    """1 x 2,000,000 pixels (a 2 kB PNG) would be resized by its shorter side to 28 x 56,000,000 for a
    28 px model (1.6 GB): predict names the file, an image folder skips it, a milder shape still runs."""
    (tmp_path / "a").mkdir()
    Image.new("L", (2_000_000, 1), 128).save(tmp_path / "a" / "thin.png")
    Image.new("L", (1_000, 1), 128).save(tmp_path / "a" / "wide.png")  # 28 x 28,000: resized as ever
    model = vitkit.create_model("vit_fmnist").eval()
    thin, = predict_images(model, [tmp_path / "a" / "thin.png"], top_k=1)  # named, the others still answered
    assert not thin.top and re.match(r"2000000 x 1 pixels would be resized to 56,000,000 x 28", thin.error)
    with pytest.raises(BadImageError, match=r"thin\.png: 2000000 x 1 pixels would be resized to 56,000,000 x 28"):
        preprocess(model, [tmp_path / "a" / "thin.png"])
    assert 28 * 56_000_000 > MAX_RESIZED_PIXELS >= 28 * 28_000
    assert len(predict_images(model, [tmp_path / "a" / "wide.png"], top_k=1)) == 1
    folder = ImageFolder(tmp_path, channels=1, transform=EvalTransform.from_config(model.config))
    samples = {Path(path).name: folder[i] for i, (path, _) in enumerate(folder.samples)}
    assert isinstance(samples["thin.png"], Skipped) and "crop it nearer" in samples["thin.png"].reason
    assert samples["wide.png"][0].shape == (1, 28, 28)


def test_a_tiff_whose_tag_has_the_wrong_type_is_a_bad_image_not_a_crash(tmp_path):
    """Pillow raises a TypeError for a TIFF whose StripOffsets is typed RATIONAL: `vitkit predict` ended on it with
    "unexpected TypeError" and no answer for the other images, and the server answered a plain-text 500."""
    import io
    import struct

    buf = io.BytesIO()
    Image.new("RGB", (40, 30), "red").save(buf, "TIFF")
    data = bytearray(buf.getvalue())
    ifd = struct.unpack("<I", data[4:8])[0]
    for i in range(struct.unpack("<H", data[ifd:ifd + 2])[0]):
        entry = ifd + 2 + 12 * i
        if struct.unpack("<H", data[entry:entry + 2])[0] == 273:  # StripOffsets, typed RATIONAL
            data[entry + 2:entry + 4] = struct.pack("<H", 5)
    (tmp_path / "bad.tiff").write_bytes(bytes(data))
    with pytest.raises(BadImageError, match="bad.tiff"):
        decode_image(tmp_path / "bad.tiff")
    Image.new("RGB", (40, 30), "blue").save(tmp_path / "good.png")
    from vitkit.evaluate import predict_images

    model = vitkit.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=1, num_classes=3)
    out = predict_images(model, [tmp_path / "good.png", tmp_path / "bad.tiff"], progress=False)
    assert out[0].error is None and out[1].error and out[1].top == []
