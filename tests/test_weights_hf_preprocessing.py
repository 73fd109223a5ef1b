"""A Hugging Face folder's preprocessing as its image processor does it: vitkit feeds the model the pixels
transformers' processor (the PIL one, ``use_fast=False``) feeds it, and writes back a processor that does
what vitkit does.

ViT's, DeiT's, BEiT's and SigLIP's processors resize the whole image to a height and width (its aspect not
kept: ``crop_mode='squash'``; DeiT's then cuts the centre 224 of 256), CLIP's and BiT's (DINOv2's) the
shorter side (``'center'``). Before this was read, every squashing processor's folder was centre-cropped by
vitkit: other pixels (up to 1.5 apart after normalisation) on any non-square photo."""

import json

import numpy as np
import pytest
import torch
from PIL import Image

import vitkit

T = pytest.importorskip("transformers")
skimage_data = pytest.importorskip("skimage.data")

SMALL = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=224,
             patch_size=32)
DINO = dict(size={"shortest_edge": 256}, crop_size={"height": 224, "width": 224}, do_center_crop=True,
            image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225], resample=3)
#: model class and config, image processor (its defaults: what save_pretrained of a hub model writes), crop_mode
CASES = {
    "vit": (T.ViTModel, T.ViTConfig, T.ViTImageProcessor, {}, "squash"),
    "deit": (T.DeiTModel, T.DeiTConfig, T.DeiTImageProcessor, {}, "squash"),
    "beit": (T.BeitModel, T.BeitConfig, T.BeitImageProcessor, {}, "squash"),
    "siglip": (T.SiglipVisionModel, T.SiglipVisionConfig, T.SiglipImageProcessor, {}, "squash"),
    "clip": (T.CLIPVisionModel, T.CLIPVisionConfig, T.CLIPImageProcessor, {}, "center"),
    "chinese_clip": (T.ChineseCLIPVisionModel, T.ChineseCLIPVisionConfig, T.ChineseCLIPImageProcessor, {}, "center"),
    # (its default 768 px with a 224 px model is a folder transformers cannot run either: the sizes as released pair)
    "owlvit": (T.OwlViTVisionModel, T.OwlViTVisionConfig, T.OwlViTImageProcessor,
               dict(size={"height": 224, "width": 224}), "squash"),
    "dinov2": (T.Dinov2Model, T.Dinov2Config, T.BitImageProcessor, DINO, "center"),
    # its crop_pct was left unread: a resize to 224 with no crop where transformers resizes to 256, then crops
    "convnext": (T.ViTModel, T.ViTConfig, T.ConvNextImageProcessor, dict(size={"shortest_edge": 224}, crop_pct=0.875),
                 "center"),
}


def _photos(mode):
    """Landscape, square and portrait photos (the portrait's centre crop has an odd margin, whose half
    transformers floors where timm rounds: ``crop_offset='floor'`` for its folders)."""
    return [Image.fromarray(p) for p in (skimage_data.chelsea(), skimage_data.astronaut(), skimage_data.rocket())]


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_folder_is_fed_the_pixels_its_processor_makes_and_writes_one_back(case, tmp_path):
    model_class, config_class, processor_class, options, mode = CASES[case]
    model_class(config_class(**SMALL)).save_pretrained(tmp_path / "hf")
    processor_class(**options).save_pretrained(tmp_path / "hf")
    ours = vitkit.from_pretrained(tmp_path / "hf")
    assert ours.config.crop_mode == mode
    processor = T.AutoImageProcessor.from_pretrained(tmp_path / "hf", use_fast=False)
    for photo in _photos(mode):
        want = processor(images=photo, return_tensors="pt").pixel_values
        assert torch.allclose(vitkit.preprocess(ours, photo), want, atol=1e-5)
    # written back: transformers' processor makes vitkit's pixels
    vitkit.export_weights(ours, tmp_path / "back", "hf")
    written = json.loads((tmp_path / "back" / "preprocessor_config.json").read_text())
    again = T.AutoImageProcessor.from_pretrained(tmp_path / "back", use_fast=False)
    assert vitkit.from_pretrained(tmp_path / "back").config.crop_mode == mode
    for photo in _photos(mode):
        assert torch.allclose(again(images=photo, return_tensors="pt").pixel_values, vitkit.preprocess(ours, photo),
                              atol=1e-5), written


@pytest.mark.parametrize("crop_mode, crop_pct", [("center", 0.875), ("center", 1.0), ("squash", 0.875),
                                                 ("squash", 1.0)])
def test_a_vitkit_vit_exports_a_processor_that_crops_as_it_does(crop_mode, crop_pct, tmp_path):
    """ViT's own processor cannot crop: a model that crops is written with DeiT's (squash) or BiT's (the
    shorter side), which transformers' AutoImageProcessor builds for any model."""
    model = vitkit.create_model("vit_tiny_patch16_224", depth=1, img_size=64, num_classes=0, crop_mode=crop_mode,
                                crop_pct=crop_pct)
    vitkit.export_weights(model, tmp_path / "hf", "hf")
    processor = T.AutoImageProcessor.from_pretrained(tmp_path / "hf", use_fast=False)
    photo = Image.fromarray(skimage_data.chelsea())
    assert torch.allclose(processor(images=photo, return_tensors="pt").pixel_values,
                          vitkit.preprocess(model, photo), atol=1e-5)
    back = vitkit.from_pretrained(tmp_path / "hf")  # read back: the same pixels (crop_pct 64 / 73 for 0.875)
    assert back.config.crop_mode == crop_mode
    assert torch.equal(vitkit.preprocess(back, photo), vitkit.preprocess(model, photo))


def test_a_timm_hub_folder_that_squashes_is_read_so(tmp_path):
    """timm's pretrained_cfg crop_mode (its CLIP fine-tunes at 336-448 px, EVA-02 at 448 squash): read, and
    the pixels are timm's own transform's."""
    timm = pytest.importorskip("timm")
    from timm.models import save_for_hf

    ref = timm.create_model("vit_base_patch16_clip_384", depth=1, img_size=64, pretrained=False)
    ref.pretrained_cfg = dict(ref.pretrained_cfg, input_size=(3, 64, 64), crop_mode="squash", crop_pct=0.9)
    save_for_hf(ref, str(tmp_path / "timm"), safe_serialization=True)
    ours = vitkit.from_pretrained(tmp_path / "timm")
    assert (ours.config.crop_mode, ours.config.crop_pct) == ("squash", 0.9)
    transform = timm.data.create_transform(**timm.data.resolve_data_config({}, model=ref))
    photo = Image.fromarray(skimage_data.rocket())
    assert torch.allclose(transform(photo).unsqueeze(0), vitkit.preprocess(ours, photo), atol=1e-6)
    assert np.asarray(photo).shape[0] != np.asarray(photo).shape[1]


@pytest.mark.parametrize("options", [dict(do_rescale=False, image_mean=[127.5, 100.0, 50.0], image_std=[60.0] * 3),
                                     dict(do_normalize=False), dict(rescale_factor=1 / 127.5, image_mean=[1.0] * 3,
                                                                     image_std=[1.0] * 3)],
                         ids=["no-rescale", "no-normalise", "rescale-to-2"])
def test_a_processor_that_scales_otherwise_is_read_as_the_same_arithmetic(options, tmp_path):
    T.ViTModel(T.ViTConfig(**SMALL)).save_pretrained(tmp_path)
    T.ViTImageProcessor(**options).save_pretrained(tmp_path)
    ours = vitkit.from_pretrained(tmp_path)
    processor = T.AutoImageProcessor.from_pretrained(tmp_path, use_fast=False)
    photo = Image.fromarray(skimage_data.chelsea())
    want = processor(images=photo, return_tensors="pt").pixel_values
    assert torch.allclose(vitkit.preprocess(ours, photo), want, atol=1e-4 * max(1.0, want.abs().max().item()))


@pytest.mark.parametrize("factor", [0, "abc", -1])
def test_a_broken_rescale_factor_is_one_line(factor, tmp_path):
    T.ViTModel(T.ViTConfig(**SMALL)).save_pretrained(tmp_path)
    T.ViTImageProcessor().save_pretrained(tmp_path)
    config = json.loads((tmp_path / "preprocessor_config.json").read_text())
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(dict(config, rescale_factor=factor)))
    with pytest.raises(ValueError, match="rescale_factor must be a positive number") as info:
        vitkit.from_pretrained(tmp_path)
    assert "\n" not in str(info.value)


#: a field of preprocessor_config.json that holds no such value -> the field the error names
BROKEN = [({"resample": [1]}, "resample"), ({"resample": 7}, "resample"), ({"image_mean": "abc"}, "image_mean"),
          ({"image_std": [0.5, 0.5]}, "image_std"), ({"image_std": [0.5, 0, 0.5]}, "image_std"),
          ({"crop_size": -5}, "crop_size"), ({"crop_size": {"height": 0, "width": 0}}, "crop_size"),
          ({"size": "big"}, "size"), ({"size": {"height": -3, "width": 4}}, "size"),
          ({"size": {"shortest_edge": 1e9}}, "size"), ({"rescale_factor": "abc"}, "rescale_factor")]


@pytest.mark.parametrize("case", ["vit", "clip"])
@pytest.mark.parametrize("broken", BROKEN, ids=[f"{k}={v}" for (d, _) in BROKEN for k, v in d.items()])
def test_a_broken_processor_config_is_one_line_naming_that_file_and_field(case, broken, tmp_path, capsys):
    """Said as the processor file's (before: "config.json: the clip_vision_model config describes no model ...:
    unhashable type: 'list'", or a crop of 0 ended in ZeroDivisionError), by the library and the command line."""
    from vitkit.cli import main

    model_class, config_class, processor_class, options, _ = CASES[case]
    model_class(config_class(**SMALL)).save_pretrained(tmp_path)
    processor_class(**options).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "preprocessor_config.json").read_text())
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(dict(config, **broken[0])))
    with pytest.raises(vitkit.weights.WeightsError, match=f"preprocessor_config.json: .*{broken[1]}") as info:
        vitkit.from_pretrained(tmp_path)
    assert "\n" not in str(info.value) and str(info.value).startswith(str(tmp_path / "preprocessor_config.json"))
    assert main(["info", str(tmp_path)]) == 2
    assert "preprocessor_config.json" in capsys.readouterr().out


#: sizes that bound the longer side: transformers' processors resize by them, vitkit's pipeline cannot
BOUNDED = [{"longest_edge": 224}, {"shortest_edge": 224, "longest_edge": 256}, {"max_height": 224, "max_width": 224}]


@pytest.mark.parametrize("case", ["vit", "clip"])
@pytest.mark.parametrize("size", BOUNDED, ids=["longest-only", "shortest-and-longest", "max-box"])
def test_a_size_that_bounds_the_longer_side_is_refused_not_read_as_another(case, size, tmp_path, capsys):
    """Such a size was left out: the model got other pixels than its processor makes (the cap ignored) or, with
    nothing else in the size, the class's default size, where transformers refuses the size itself."""
    from vitkit.cli import main

    model_class, config_class, processor_class, options, _ = CASES[case]
    model_class(config_class(**SMALL)).save_pretrained(tmp_path)
    processor_class(**options).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "preprocessor_config.json").read_text())
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(dict(config, size=size)))
    processor = T.AutoImageProcessor.from_pretrained(tmp_path, use_fast=False)
    wide = Image.fromarray(skimage_data.rocket()[:200])  # 200 x 600: its longer side is past every bound here
    unbounded = {k: v for k, v in size.items() if k in ("height", "width", "shortest_edge")}
    if unbounded:  # the bound changes the processor's pixels: leaving it out was not harmless
        bounded = processor(images=wide, return_tensors="pt").pixel_values
        plain = processor_class(**dict(config, size=unbounded))(images=wide, return_tensors="pt").pixel_values
        assert bounded.shape != plain.shape or not torch.allclose(bounded, plain)
    elif "longest_edge" in size:  # transformers refuses a size with nothing but a cap
        with pytest.raises(ValueError, match="shortest_edge"):
            processor(images=wide, return_tensors="pt")
    bound = next(k for k in size if k in ("longest_edge", "max_height"))
    with pytest.raises(vitkit.weights.WeightsError, match=f"preprocessor_config.json: size .*{bound}") as info:
        vitkit.from_pretrained(tmp_path)
    assert "\n" not in str(info.value) and ("remove" in str(info.value)) == bool(unbounded)
    assert main(["info", str(tmp_path)]) == 2
    assert bound in capsys.readouterr().out


@pytest.mark.parametrize("resample", [1, 4, 5], ids=["lanczos", "box", "hamming"])
def test_a_filter_vitkit_does_not_resize_with_is_refused_by_name(resample, tmp_path):
    """transformers resizes with it (other pixels than bicubic's); vitkit used the family's default in silence."""
    T.ViTModel(T.ViTConfig(**SMALL)).save_pretrained(tmp_path)
    T.ViTImageProcessor(resample=resample).save_pretrained(tmp_path)
    photo = Image.fromarray(skimage_data.chelsea())
    theirs = T.AutoImageProcessor.from_pretrained(tmp_path, use_fast=False)(images=photo, return_tensors="pt")
    bicubic = T.ViTImageProcessor(resample=3)(images=photo, return_tensors="pt")
    assert not torch.allclose(theirs.pixel_values, bicubic.pixel_values, atol=1e-3)
    with pytest.raises(vitkit.weights.WeightsError, match=f"preprocessor_config.json: resample {resample} "):
        vitkit.from_pretrained(tmp_path)


def test_a_bound_in_an_unused_crop_size_is_not_refused(tmp_path):
    T.CLIPVisionModel(T.CLIPVisionConfig(**SMALL)).save_pretrained(tmp_path)
    T.CLIPImageProcessor(do_center_crop=False, crop_size={"longest_edge": 224}).save_pretrained(tmp_path)
    assert vitkit.from_pretrained(tmp_path).config.crop_pct == 1.0


def test_one_mean_and_std_for_every_channel_is_read_as_transformers_spreads_it(tmp_path):
    T.ViTModel(T.ViTConfig(**SMALL)).save_pretrained(tmp_path)
    T.ViTImageProcessor(image_mean=0.25, image_std=0.75).save_pretrained(tmp_path)
    ours = vitkit.from_pretrained(tmp_path)
    assert ours.config.mean == (0.25,) * 3 and ours.config.std == (0.75,) * 3
    processor = T.AutoImageProcessor.from_pretrained(tmp_path, use_fast=False)
    photo = Image.fromarray(skimage_data.chelsea())
    assert torch.allclose(vitkit.preprocess(ours, photo), processor(images=photo, return_tensors="pt").pixel_values,
                          atol=1e-5)


def test_each_processor_class_fills_what_a_config_leaves_out_as_transformers_does():
    """PROCESSOR_DEFAULTS are the classes' own (a field a config omits or nulls is the class's default), and a
    config naming no class is read as the one transformers picks for its model type."""
    from transformers.models.auto.image_processing_auto import IMAGE_PROCESSOR_MAPPING_NAMES

    from vitkit.weights.hf_tower_parts import MODEL_TYPE_PROCESSORS, PROCESSOR_DEFAULTS, preprocessing

    for name in PROCESSOR_DEFAULTS:
        cls = getattr(T, name + "Pil", None) or getattr(T, name)
        assert preprocessing(cls().to_dict()) == preprocessing({"image_processor_type": name}), name
    for model_type, name in MODEL_TYPE_PROCESSORS.items():
        theirs = IMAGE_PROCESSOR_MAPPING_NAMES.get(model_type)
        if theirs:  # the vision towers alone have none there
            assert name in theirs.values(), model_type


#: (model and config class, the preprocessor_config.json written) as older or hand-made folders have them
LEGACY = {
    # OpenAI's CLIP folders (openai/clip-vit-base-patch32): the class named the old way, sizes as integers; an
    # integer size is CLIP's shorter side (read as a square before: other pixels on any non-square photo)
    "clip-feature-extractor": ((T.CLIPVisionModel, T.CLIPVisionConfig), dict(
        feature_extractor_type="CLIPFeatureExtractor", size=224, crop_size=224, do_center_crop=True, resample=3,
        image_mean=[0.48145466, 0.4578275, 0.40821073], image_std=[0.26862954, 0.26130258, 0.27577711])),
    # no class named: the model type's (DINOv2: BiT's, shorter side and a centre crop by default)
    "dinov2-no-class": ((T.Dinov2Model, T.Dinov2Config), dict(size=256, crop_size=224)),
    # a class named, nothing else: its defaults (ViT's: bilinear, 0.5, the whole image)
    "vit-class-only": ((T.ViTModel, T.ViTConfig), dict(image_processor_type="ViTImageProcessor")),
    "deit-statistics-only": ((T.DeiTModel, T.DeiTConfig), dict(
        image_processor_type="DeiTImageProcessor", image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225])),
}


@pytest.mark.parametrize("case", sorted(LEGACY))
def test_an_older_or_partial_processor_config_is_read_as_transformers_reads_it(case, tmp_path):
    (model_class, config_class), written = LEGACY[case]
    model_class(config_class(**SMALL)).save_pretrained(tmp_path)
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(written))
    ours = vitkit.from_pretrained(tmp_path)
    processor = T.AutoImageProcessor.from_pretrained(tmp_path, use_fast=False)
    for photo in _photos(ours.config.crop_mode):
        assert torch.allclose(vitkit.preprocess(ours, photo), processor(images=photo, return_tensors="pt").pixel_values,
                              atol=1e-5), case


@pytest.mark.parametrize("side, dropped", [(384, ()), (160, ("crop_pct",))])
def test_convnexts_processor_warps_from_384_and_crops_by_its_default_below(side, dropped, tmp_path):
    """ConvNextImageProcessor resizes a shorter side under 384 to side / crop_pct and cuts the centre square
    (crop_pct 224/256 where the file leaves it out), and warps the whole image to the square from 384 up."""
    T.ViTModel(T.ViTConfig(**{**SMALL, "image_size": side})).save_pretrained(tmp_path)
    T.ConvNextImageProcessor(size={"shortest_edge": side}).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "preprocessor_config.json").read_text())
    for key in dropped:
        del config[key]
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(config))
    ours = vitkit.from_pretrained(tmp_path)
    assert ours.config.crop_mode == ("squash" if side >= 384 else "center")
    processor = T.AutoImageProcessor.from_pretrained(tmp_path, use_fast=False)
    for photo in _photos(ours.config.crop_mode):
        assert torch.allclose(vitkit.preprocess(ours, photo), processor(images=photo, return_tensors="pt").pixel_values,
                              atol=1e-5)


def _whole_processor(folder, image_processor, **rest):
    """A whole processor's config as transformers 5's ``ProcessorMixin.save_pretrained`` writes it (CLIP's and
    SigLIP's processors hold a tokenizer too): its image processor's under ``image_processor``."""
    fields = {**image_processor.to_dict(), "image_processor_type": type(image_processor).__name__}
    (folder / "processor_config.json").write_text(json.dumps({"image_processor": fields, **rest}))


@pytest.mark.parametrize("beside", [False, True], ids=["alone", "beside-an-older-preprocessor-config"])
def test_a_whole_processors_config_is_read_first_as_transformers_reads_it(beside, tmp_path):
    """Before, only preprocessor_config.json was read: a folder saved with its whole processor (CLIPProcessor's
    save_pretrained) was fed the class's defaults, 224 px shortest side where its processor resizes to 256 and
    crops, silently; beside an older preprocessor_config.json, transformers takes the whole processor's."""
    T.CLIPVisionModel(T.CLIPVisionConfig(**SMALL)).save_pretrained(tmp_path)
    if beside:
        T.CLIPImageProcessor(size={"shortest_edge": 224}).save_pretrained(tmp_path)
    _whole_processor(tmp_path, T.CLIPImageProcessor(size={"shortest_edge": 256}, resample=2),
                     processor_class="CLIPProcessor")
    ours = vitkit.from_pretrained(tmp_path)
    processor = T.AutoImageProcessor.from_pretrained(tmp_path, use_fast=False)
    assert processor.size["shortest_edge"] == 256
    for photo in _photos("center"):
        assert torch.allclose(vitkit.preprocess(ours, photo), processor(images=photo, return_tensors="pt").pixel_values,
                              atol=1e-5)
    assert ours.config.interpolation == "bilinear"


def test_a_processor_saved_by_transformers_itself_is_read(tmp_path):
    """SAM's processor (no tokenizer) saved by transformers' own ProcessorMixin: processor_config.json alone
    (its statistics here not SAM's ImageNet ones, which vitkit takes where a folder has none)."""
    T.SamVisionModel(T.SamVisionConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=64,
                                       patch_size=16, output_channels=16, global_attn_indexes=[0], mlp_dim=64,
                                       window_size=2)).save_pretrained(tmp_path)
    T.SamProcessor(image_processor=T.SamImageProcessor(size={"longest_edge": 64}, pad_size={"height": 64, "width": 64},
                                                       image_mean=[0.5] * 3, image_std=[0.25] * 3)
                   ).save_pretrained(tmp_path)
    assert not (tmp_path / "preprocessor_config.json").exists()
    ours = vitkit.from_pretrained(tmp_path)
    processor = T.AutoImageProcessor.from_pretrained(tmp_path, use_fast=False)
    for photo in _photos("border"):
        want = processor(images=photo, return_tensors="pt").pixel_values
        assert torch.allclose(vitkit.preprocess(ours, photo), want, atol=1e-5)


def test_an_export_over_a_whole_processors_config_replaces_its_image_processor_and_keeps_the_rest(tmp_path):
    """transformers reads the whole processor's file first: one left from the folder's earlier model (its
    image processor resized to 256) would have given transformers that model's pixels for this one."""
    folder = tmp_path / "hf"
    T.CLIPVisionModel(T.CLIPVisionConfig(**SMALL)).save_pretrained(folder)
    _whole_processor(folder, T.CLIPImageProcessor(size={"shortest_edge": 256}), processor_class="CLIPProcessor",
                     extra_setting=7)
    model = vitkit.create_model("vit_tiny_patch16_224", depth=1, img_size=64, num_classes=0, crop_pct=1.0,
                                crop_mode="squash")
    vitkit.export_weights(model, folder, "hf")
    whole = json.loads((folder / "processor_config.json").read_text())
    assert (whole["processor_class"], whole["extra_setting"]) == ("CLIPProcessor", 7)
    processor = T.AutoImageProcessor.from_pretrained(folder, use_fast=False)
    photo = Image.fromarray(skimage_data.chelsea())
    assert torch.allclose(processor(images=photo, return_tensors="pt").pixel_values, vitkit.preprocess(model, photo),
                          atol=1e-5)


@pytest.mark.parametrize("nested, said", [([1, 2], "\"image_processor\" must be a JSON object"),
                                          ({"image_processor_type": "CLIPImageProcessor", "size": "big"}, "size")])
def test_a_broken_whole_processors_config_is_one_line_naming_that_file(nested, said, tmp_path, capsys):
    from vitkit.cli import main

    T.CLIPVisionModel(T.CLIPVisionConfig(**SMALL)).save_pretrained(tmp_path)
    (tmp_path / "processor_config.json").write_text(json.dumps({"image_processor": nested}))
    with pytest.raises(vitkit.weights.WeightsError, match=said) as info:
        vitkit.from_pretrained(tmp_path)
    assert "\n" not in str(info.value) and str(info.value).startswith(str(tmp_path / "processor_config.json"))
    assert main(["info", str(tmp_path)]) == 2
    said = capsys.readouterr()
    assert "processor_config.json" in said.out + said.err and "Traceback" not in said.err


def test_deepseek_vls_processor_pads_the_resized_image_to_a_square(tmp_path):
    """DeepSeek-VL's processor resizes the longer side and pads the image to a square in its background colour
    (the mean's, rounded to whole grey levels): read as crop_mode='border', every pixel of the image transformers'
    and the padding within 0.02 (before, read as a squash of the whole image: up to 1.5 apart on a long photo)."""
    small = dict(SMALL, image_size=32, patch_size=8)
    T.DeepseekVLForConditionalGeneration(T.DeepseekVLConfig(
        vision_config=dict(small, model_type="siglip_vision_model"), text_config=dict(
            model_type="llama", hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
            num_key_value_heads=2, vocab_size=128))).save_pretrained(tmp_path)
    T.DeepseekVLImageProcessorPil(size={"height": 32, "width": 32}).save_pretrained(tmp_path)
    ours = vitkit.from_pretrained(tmp_path)
    assert ours.config.crop_mode == "border"
    processor = T.AutoImageProcessor.from_pretrained(tmp_path, use_fast=False)
    for photo in _photos("border"):
        want = processor(images=photo, return_tensors="pt").pixel_values
        assert (vitkit.preprocess(ours, photo) - want).abs().max() < 0.02
