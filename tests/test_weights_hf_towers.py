"""Hugging Face's vision towers both ways: ``save_pretrained`` folders of CLIP, SigLIP, DINOv2 (with
registers) and DINOv3 (one-tower and two-tower classes) read by ``vitkit.from_pretrained`` give
transformers' pooled outputs (fp32, 1e-5); vitkit's models exported as 'hf' are read by transformers'
own classes with the same outputs, and back."""

import json
import re
import warnings

import pytest
import torch

import vitkit
from conftest import max_diff, randomize
from vitkit.weights.export import ExportWarning
from vitkit.weights.io import WeightsError

T = pytest.importorskip("transformers")

SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, image_size=32,
             patch_size=8)
TEXT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, vocab_size=64,
            max_position_embeddings=16, bos_token_id=0, eos_token_id=1, pad_token_id=1)


def _pooled(model, x):
    if isinstance(model, (T.CLIPModel, T.SiglipModel)):
        out = model.get_image_features(pixel_values=x)
        return out if isinstance(out, torch.Tensor) else out.pooler_output
    out = model(pixel_values=x)
    return out.image_embeds if hasattr(out, "image_embeds") else out.pooler_output


def _close(a, b):
    return a.shape == b.shape and max_diff(a, b) <= 1e-5 * max(1.0, a.abs().max().item())


CASES = {
    "clip_quickgelu": ("CLIPVisionModel", lambda: T.CLIPVisionConfig(**SMALL, hidden_act="quick_gelu")),
    "clip_projection": ("CLIPVisionModelWithProjection", lambda: T.CLIPVisionConfig(**SMALL, projection_dim=16)),
    "clip_two_towers": ("CLIPModel", lambda: T.CLIPConfig(text_config=TEXT, vision_config=SMALL, projection_dim=16)),
    "siglip": ("SiglipVisionModel", lambda: T.SiglipVisionConfig(**SMALL)),
    "siglip_two_towers": ("SiglipModel", lambda: T.SiglipConfig(text_config=TEXT, vision_config=SMALL)),
    "dinov2": ("Dinov2Model", lambda: T.Dinov2Config(**SMALL)),
    "dinov2_swiglu": ("Dinov2Model", lambda: T.Dinov2Config(**SMALL, use_swiglu_ffn=True)),
    "dinov2_registers": ("Dinov2WithRegistersModel", lambda: T.Dinov2WithRegistersConfig(**SMALL)),
    "dinov3": ("DINOv3ViTModel", lambda: T.DINOv3ViTConfig(**SMALL, num_register_tokens=4)),
    "dinov3_gated": ("DINOv3ViTModel", lambda: T.DINOv3ViTConfig(**SMALL, num_register_tokens=2, use_gated_mlp=True,
                                                                 hidden_act="silu")),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_hugging_face_tower_folder_loads_with_parity(case, tmp_path, images):
    cls, config = CASES[case]
    ref = randomize(getattr(T, cls)(config())).eval()
    ref.save_pretrained(tmp_path)
    ours = vitkit.from_pretrained(tmp_path)
    x = images(2, 32, 32)
    with torch.no_grad():
        assert _close(_pooled(ref, x), ours(x))


CLASSIFIERS = {  # transformers' ...ForImageClassification of the towers: what AutoModelForImageClassification makes
    "clip": ("CLIPForImageClassification", lambda: T.CLIPConfig(text_config=TEXT, vision_config=SMALL, num_labels=3)),
    "siglip": ("SiglipForImageClassification", lambda: T.SiglipConfig(text_config=TEXT, vision_config=SMALL,
                                                                       num_labels=3)),
    "dinov2": ("Dinov2ForImageClassification", lambda: T.Dinov2Config(**SMALL, num_labels=3)),
    "dinov2_swiglu": ("Dinov2ForImageClassification", lambda: T.Dinov2Config(**SMALL, num_labels=3,
                                                                              use_swiglu_ffn=True)),
    "dinov2_registers": ("Dinov2WithRegistersForImageClassification",
                         lambda: T.Dinov2WithRegistersConfig(**SMALL, num_labels=3)),
}


@pytest.mark.parametrize("case", sorted(CLASSIFIERS))
def test_hugging_face_tower_classifiers_load_with_their_logits(case, tmp_path, images):
    """CLIP's classifier reads the mean of the un-normalised patch tokens, SigLIP's the mean of the normalised
    tokens (its MAP head is computed and not read), DINOv2's the class token beside the patches' mean; each is
    written back as its class (transformers finds every tensor it expects and no other)."""
    cls, config = CLASSIFIERS[case]
    ref = randomize(getattr(T, cls)(config())).eval()
    ref.save_pretrained(tmp_path)
    ours = vitkit.from_pretrained(tmp_path)
    x = images(2, 32, 32)
    with torch.no_grad():
        assert _close(ref(pixel_values=x).logits, ours(x))
    assert ours.config.label_names is None  # transformers' LABEL_i placeholders are no names (written back so)
    pool = {"clip": "avg", "siglip": "avg"}.get(case, "token_avg")
    assert ours.config.global_pool == pool
    vitkit.export_weights(ours, tmp_path / "back", "hf")  # and written as the same class, every tensor its own
    back, report = getattr(T, cls).from_pretrained(tmp_path / "back", output_loading_info=True)
    assert not any(report.values())
    with torch.no_grad():
        assert _close(back.eval()(pixel_values=x).logits, ours(x))
    ours.reset_classifier(5)  # a new head on the same pooling (DINOv2's: twice the width)
    assert ours.head.in_features == (128 if pool == "token_avg" else 64) and ours(x).shape == (2, 5)


def test_dinov3_at_a_non_square_size_as_transformers(tmp_path, images):
    """DINOv3 takes any size (its rotary angles follow the grid): a 48x80 image against transformers'. Built at its
    processor's size, it was said to have its position table resampled (it has none)."""
    ref = randomize(T.DINOv3ViTModel(T.DINOv3ViTConfig(**SMALL, num_register_tokens=4))).eval()
    ref.save_pretrained(tmp_path)
    ours = vitkit.from_pretrained(tmp_path)
    x = images(2, 48, 80)
    with torch.no_grad():
        assert _close(_pooled(ref, x), ours(x))
    from vitkit.weights.pretrained import describe_source

    T.BitImageProcessor(crop_size={"height": 24, "width": 24}).save_pretrained(tmp_path)  # a table it has none of
    said = describe_source(tmp_path)["assumed"][-1]
    assert "built at 24x24" in said and "its rotary positions following the grid" in said and "table" not in said


@pytest.mark.parametrize("name, cls", [
    ("vit_base_patch16_clip_224", "CLIPVisionModelWithProjection"),
    ("vit_base_patch16_siglip_224", "SiglipVisionModel"),
    ("vit_small_patch14_dinov2", "Dinov2Model"), ("vit_small_patch14_reg4_dinov2", "Dinov2WithRegistersModel"),
])
def test_vitkit_towers_export_to_their_hugging_face_class(name, cls, tmp_path, images):
    size = 70 if "patch14" in name else 64
    kind = dict(head_kind="projection") if "clip" in name else {}  # a tower's head is its projection
    if "siglip" in name:
        kind["gelu"] = "tanh"  # big_vision's and transformers' SigLIP (timm's is exact)
    model = randomize(vitkit.create_model(name, depth=2, img_size=size, **kind))
    if model.config.num_classes:
        torch.nn.init.zeros_(model.head.bias)  # CLIP's projection has no bias
    vitkit.export_weights(model, tmp_path / "hf", "hf")
    ref = getattr(T, cls).from_pretrained(tmp_path / "hf").eval()
    if model.config.gelu == "tanh":  # torch's tanh GELU, as vitkit's; gelu_fast's own formula was written, 6e-7 off
        assert ref.config.hidden_act == "gelu_pytorch_tanh"
    processor = T.AutoImageProcessor.from_pretrained(tmp_path / "hf")
    assert list(processor.image_mean) == pytest.approx(list(model.config.mean))
    x = images(2, size, size)
    back = vitkit.from_pretrained(tmp_path / "hf")
    with torch.no_grad():
        expected = model(x)
        assert _close(_pooled(ref, x), expected)
        assert _close(back(x), expected)


def test_dinov3_exports_to_its_hugging_face_class(tmp_path, images):
    model = randomize(vitkit.create_model("vit_small_patch16_dinov3_qkvb", depth=2, img_size=64))
    model.reset_classifier(0, "token")  # transformers' pooled output is the class token
    vitkit.export_weights(model, tmp_path / "hf", "hf")
    ref = T.DINOv3ViTModel.from_pretrained(tmp_path / "hf").eval()
    x = images(2, 64, 64)
    with torch.no_grad():
        assert _close(_pooled(ref, x), model(x))


@pytest.mark.parametrize("name, dtype", [("vit_small_patch14_dinov2", torch.float16),
                                         ("vit_small_patch16_dinov3_qkvb", torch.bfloat16),
                                         ("vit_tiny_patch16_224", torch.bfloat16), ("vit_tiny_patch16_224", None)])
def test_a_hugging_face_folder_says_its_dtype_as_transformers_writes_it(name, dtype, tmp_path):
    model = vitkit.create_model(name, depth=1, img_size=28 if "patch14" in name else 32,
                                **(dict(num_classes=0, global_pool="token") if "dinov3" in name else {}))
    if dtype is not None:
        model = model.to(dtype)
    vitkit.export_weights(model, tmp_path / "hf", "hf")
    ours = json.loads((tmp_path / "hf" / "config.json").read_text())
    ref = T.AutoModel.from_pretrained(tmp_path / "hf", dtype="auto")
    ref.save_pretrained(tmp_path / "again")
    assert ours["dtype"] == json.loads((tmp_path / "again" / "config.json").read_text())["dtype"] \
        == str(dtype or torch.float32).replace("torch.", "")


def test_a_model_no_tower_holds_is_refused_naming_the_nearest(tmp_path):
    model = vitkit.create_model("vit_base_patch16_clip_224", depth=1, img_size=32, reg_tokens=2)
    with pytest.raises(WeightsError, match="nearest, clip_vision_model, cannot hold reg_tokens=2"):
        vitkit.export_weights(model, tmp_path / "hf", "hf")
    assert not (tmp_path / "hf").exists()
    # a DINOv2 tower fine-tuned on its class token alone: "cannot export to Hugging Face ViT: HF ViT has no
    # LayerScale" named neither the nearest class nor what keeps it out
    dino = vitkit.create_model("vit_small_patch14_dinov2", depth=1, img_size=28, num_classes=3, global_pool="token")
    with pytest.raises(WeightsError, match=r"no Hugging Face class expresses this model: the nearest, "
                                           r"Dinov2ForImageClassification, cannot hold global_pool='token' \(it reads "
                                           r"'token_avg'\)"):
        vitkit.export_weights(dino, tmp_path / "hf", "hf")
    # a classifier without a class token (timm's reg/gap ViTs): CLIP's pooling was tried on it and its config's
    # own check leaked out ("global_pool='token' needs class_token=True (or use global_pool='avg')")
    gap = vitkit.create_model("vit_medium_patch16_reg4_gap_256", depth=1, img_size=32, num_classes=3)
    with pytest.raises(WeightsError, match=r"no Hugging Face class expresses this model: the nearest, "
                                           r"Dinov2ForImageClassification, cannot hold global_pool='avg' \(it reads "
                                           r"'token_avg'\) \(export as 'timm' or 'vitkit'\)$"):
        vitkit.export_weights(gap, tmp_path / "hf", "hf")
    model = vitkit.create_model("vit_base_patch16_clip_224", depth=1, img_size=32)
    with torch.no_grad():
        model.head.bias.fill_(1.0)  # a classifier trained on the tower: not CLIP's projection any more
    with pytest.raises(WeightsError, match="a head of classes"):
        vitkit.export_weights(model, tmp_path / "hf2", "hf")
    projection = vitkit.create_model("vit_base_patch16_clip_224", depth=1, img_size=32, head_kind="projection")
    with torch.no_grad():
        projection.head.bias.fill_(1.0)
    with pytest.raises(WeightsError, match="visual_projection has no bias"):
        vitkit.export_weights(projection, tmp_path / "hf2", "hf")


def test_a_head_of_classes_on_a_clip_tower_is_not_written_as_its_projection(tmp_path, images):
    """A classifier put on a CLIP tower (zero bias: a new head) was written as CLIPVisionModelWithProjection,
    and read back by transformers and vitkit as a projection into the image-text space (predict refused it)."""
    tower = vitkit.create_model("vit_base_patch16_clip_224", depth=1, img_size=32, num_classes=5)
    assert tower.config.head_kind == "classes" and not tower.head.bias.any()
    with pytest.raises(WeightsError, match="cannot hold a head of classes") as info:
        vitkit.export_weights(tower, tmp_path / "hf", "hf")
    assert "\n" not in str(info.value) and not (tmp_path / "hf").exists()
    pooled = randomize(vitkit.create_model("vit_base_patch16_clip_224", depth=1, img_size=32, num_classes=5,
                                           global_pool="avg", final_norm=False, fc_norm=False))
    vitkit.export_weights(pooled, tmp_path / "hf", "hf")  # transformers' own classifier on the tower
    ref = T.CLIPForImageClassification.from_pretrained(tmp_path / "hf").eval()
    x = images(2, 32, 32)
    with torch.no_grad():
        assert _close(ref(pixel_values=x).logits, pooled(x))


@pytest.mark.parametrize("name", ["vit_base_patch16_clip_224", "vit_base_patch16_siglip_224",
                                  "vit_small_patch14_dinov2", "vit_small_patch14_reg4_dinov2"])
def test_a_non_square_tower_is_refused_not_written_as_its_height(name, tmp_path):
    """A tower's config holds one image side: a 48x80 model was written as 48 with a table of 15 slots, a
    folder transformers refused (and vitkit's info called edited), exit 0."""
    patch = 14 if "dinov2" in name else 16
    model = vitkit.create_model(name, depth=1, img_size=(3 * patch, 5 * patch), num_classes=0)
    # (DINOv2 without registers is then refused by transformers' ViT, which has no LayerScale)
    with pytest.raises(WeightsError, match=rf"a {3 * patch}x{5 * patch} image in {patch}x{patch} patches|"
                                           rf"HF ViT has no LayerScale") as e:
        vitkit.export_weights(model, tmp_path / "hf", "hf")
    assert "\n" not in str(e.value) and not (tmp_path / "hf").exists()


def test_hugging_face_configs_vitkit_cannot_build_are_one_line(tmp_path):
    ref = T.DINOv3ViTModel(T.DINOv3ViTConfig(**SMALL, use_gated_mlp=True, hidden_act="gelu"))
    ref.save_pretrained(tmp_path)
    with pytest.raises(WeightsError, match="gated MLP with hidden_act 'gelu'") as e:
        vitkit.from_pretrained(tmp_path)
    assert "\n" not in str(e.value)


def _naflex(x, patch):
    """transformers' Siglip2 inputs of a batch of one size: patches flattened (row, column, channel), every one
    valid."""
    b, c, h, w = x.shape
    flat = x.reshape(b, c, h // patch, patch, w // patch, patch).permute(0, 2, 4, 3, 5, 1).reshape(
        b, (h // patch) * (w // patch), -1)
    return dict(pixel_values=flat, spatial_shapes=torch.tensor([[h // patch, w // patch]] * b),
                pixel_attention_mask=torch.ones(b, flat.shape[1], dtype=torch.long))


@pytest.mark.parametrize("cls", ["Siglip2VisionModel", "Siglip2Model", "Siglip2ForImageClassification"])
def test_siglip2_naflex_folders_give_transformers_outputs_at_any_grid(cls, tmp_path, images):
    """SigLIP 2's NaFlex tower resamples its base table (here 4 x 4) to each image's grid, bilinear and
    antialiased: vitkit does the same at every input size (square, wide, tall), built at any size."""
    vision = dict(SMALL, num_patches=16)
    vision.pop("image_size")
    config = T.Siglip2VisionConfig(**vision) if cls == "Siglip2VisionModel" else T.Siglip2Config(
        vision_config=vision, text_config=TEXT, **(dict(num_labels=3) if "Classification" in cls else {}))
    ref = randomize(getattr(T, cls)(config)).eval()
    ref.save_pretrained(tmp_path)
    ours = vitkit.from_pretrained(tmp_path)
    asked = vitkit.from_pretrained(tmp_path, img_size=48)  # built at another size: the 4x4 table held as stored
    if cls == "Siglip2VisionModel":  # its NaFlex processor keeps each image's aspect: vitkit's pipeline does not
        T.Siglip2ImageProcessor(patch_size=8, max_num_patches=16).save_pretrained(tmp_path)
        from vitkit.weights.pretrained import GuessWarning

        with pytest.warns(GuessWarning, match=r"its image processor \(SigLIP 2.s NaFlex\) resizes each image to a "
                                              r"grid of at most 16 patches keeping its aspect"):
            vitkit.from_pretrained(tmp_path)
    assert asked.config.pos_embed_size == (32, 32)  # (it was resampled once at loading, bicubic: 1.7e-4 off at 48)
    for h, w in [(32, 32), (32, 48), (56, 24), (48, 48)]:
        x = images(2, h, w)
        with torch.no_grad():
            if cls == "Siglip2Model":
                out = ref.get_image_features(**_naflex(x, 8))
                want = out if isinstance(out, torch.Tensor) else out.pooler_output
            else:
                out = ref(**_naflex(x, 8))
                want = out.logits if hasattr(out, "logits") else out.pooler_output
            assert _close(want, ours(x)) and _close(want, asked(x)), (h, w)


def test_aimv2_pre_trained_towers_load_and_its_lit_head_is_refused(tmp_path, images):
    """AIMv2 (RMSNorm on the patches and in every block, SwiGLU saved as ``ffn``): the pre-trained tower and the
    two-tower model's give transformers' tokens; the LiT models' attention-pooling head and the native-resolution
    models are one line each."""
    vision = dict(SMALL, use_head=False)
    x = images(2, 32, 32)
    for i, ref in enumerate([T.Aimv2VisionModel(T.Aimv2VisionConfig(**vision)),
                             T.Aimv2Model(T.Aimv2Config(vision_config=vision, text_config=TEXT))]):
        randomize(ref).save_pretrained(tmp_path / str(i))
        tower = getattr(ref, "vision_model", ref).eval()
        with torch.no_grad():
            assert _close(tower(pixel_values=x).last_hidden_state, vitkit.from_pretrained(tmp_path / str(i))
                          .forward_features(x))
    for name, extra, message in [("lit", {}, "attention-pooling head"),
                                 ("native", dict(use_head=False, is_native=True), "native-resolution")]:
        T.Aimv2VisionModel(T.Aimv2VisionConfig(**{**SMALL, **extra})).save_pretrained(tmp_path / name)
        with pytest.raises(WeightsError, match=message) as e:
            vitkit.from_pretrained(tmp_path / name)
        assert "\n" not in str(e.value)


@pytest.mark.parametrize("cls", ["Dinov2Model", "Dinov2WithRegistersModel"])
def test_a_dinov2_folder_runs_at_the_size_its_processor_makes_as_transformers_runs_it(cls, tmp_path, capsys):
    """facebook/dinov2-* folders say image_size 518 and their processor crops 224: vitkit built them at 518 and
    fed them 518 px images, other features than transformers' pipeline gives (0.4 off on a small tower). Read at
    the processor's size, the table resampled as transformers resamples it on every call; a weights layout
    written from it keeps the table as stored."""
    skimage_data = pytest.importorskip("skimage.data")
    from PIL import Image

    ref = randomize(getattr(T, cls)(getattr(T, cls.replace("Model", "Config"))(**{**SMALL, "image_size": 56}))).eval()
    ref.save_pretrained(tmp_path / "hf")
    T.BitImageProcessor(size={"shortest_edge": 48}, crop_size={"height": 40, "width": 40}).save_pretrained(
        tmp_path / "hf")
    processor = T.AutoImageProcessor.from_pretrained(tmp_path / "hf", backend="pil")
    ours = vitkit.from_pretrained(tmp_path / "hf")
    assert ours.config.img_size == (40, 40)
    for photo in (skimage_data.chelsea(), skimage_data.rocket()):
        photo = Image.fromarray(photo)
        x = processor(images=photo, return_tensors="pt").pixel_values
        with torch.no_grad():
            assert torch.allclose(vitkit.preprocess(ours, photo), x, atol=1e-5)
            assert _close(_pooled(ref, x), ours(x))
    assert vitkit.from_pretrained(tmp_path / "hf", at_processor_size=False).config.img_size == (56, 56)
    from vitkit.cli import main

    # the table held as stored, resampled to each input as transformers resamples it: equal at every size (another
    # size was refused, and one asked for had the table resampled from the processor's size: 3e-3 off)
    asked = vitkit.from_pretrained(tmp_path / "hf", img_size=48)
    for size in (40, 48, 56, 64):
        x = torch.randn(2, 3, size, size)
        with torch.no_grad():
            assert _close(_pooled(ref, x), ours(x)) and _close(_pooled(ref, x), asked(x)), size
    assert main(["info", str(tmp_path / "hf")]) == 0
    assert "its position table held as stored and resampled to each input's grid" in capsys.readouterr().out
    assert main(["convert", str(tmp_path / "hf"), str(tmp_path / "timm.safetensors"), "--to", "timm"]) == 0
    said = capsys.readouterr().err  # timm resamples a dynamic model's table antialiased: said where DINOv2's is not
    assert ("timm resamples a dynamic model's position table bicubic and antialiased" in said) == (
        cls == "Dinov2Model"), said  # (0.018 off in timm at 32x48; with registers transformers antialiases too)
    timm_file = vitkit.from_pretrained(tmp_path / "timm.safetensors").config  # the table as stored, served at 40
    assert (timm_file.img_size, timm_file.pos_embed_size) == ((40, 40), (56, 56))
    # written back as transformers' DINOv2: its processor and its table as they were (the processor made 56 px crops)
    assert main(["convert", str(tmp_path / "hf"), str(tmp_path / "back"), "--to", "hf"]) == 0
    again = getattr(T, cls).from_pretrained(tmp_path / "back").eval()
    processed = T.AutoImageProcessor.from_pretrained(tmp_path / "back", backend="pil")(
        images=photo, return_tensors="pt").pixel_values
    assert torch.equal(processed, x := processor(images=photo, return_tensors="pt").pixel_values)
    for x in (x, torch.randn(2, 3, 56, 56)):
        with torch.no_grad():
            assert _close(_pooled(ref, x), _pooled(again, x))


def test_a_folder_whose_config_is_another_models_says_what_disagrees(tmp_path):
    """DINOv3's config saying 16 px patches over 8 px filters had its filters resampled (transformers refuses
    the folder); a CLIP folder relabelled SigLIP was blamed on its image size (17 slots: its 4x4 grid and a class
    slot SigLIP lacks): now on the head SigLIP's class holds, or, the head said off, on the class slot."""
    import json

    T.DINOv3ViTModel(T.DINOv3ViTConfig(**SMALL)).save_pretrained(tmp_path / "d3")
    T.CLIPVisionModel(T.CLIPVisionConfig(**SMALL)).save_pretrained(tmp_path / "clip")
    for folder, change, said in (
            ("d3", {"patch_size": 16}, "patch_size 16x16 where its weights hold 8 px patch filters"),
            ("clip", {"model_type": "siglip_vision_model", "architectures": ["SiglipVisionModel"]},
             "its config names SiglipVisionModel, which holds its attention-pool head, where its weights hold no "
             "head.* tensor"),
            ("clip", {"vision_use_head": False},  # (its class's head said off: the position table says it)
             "17 position slots: its 4x4 grid's and 1 for prefix tokens where the config's model has 0")):
        config = json.loads((tmp_path / folder / "config.json").read_text())
        (tmp_path / folder / "config.json").write_text(json.dumps({**config, **change}))
        with pytest.raises(WeightsError, match=re.escape(said)):
            vitkit.from_pretrained(tmp_path / folder)


@pytest.mark.parametrize("cls, config, said, name, keywords, trap", [
    ("DINOv3ViTModel", lambda: T.DINOv3ViTConfig(hidden_size=384, intermediate_size=1536, num_hidden_layers=2,
                                                  num_attention_heads=6, num_register_tokens=4, image_size=32,
                                                  patch_size=16),
     r"timm builds this model as vit_small_patch16_lingbot: timm.create_model\('vit_small_patch16_lingbot', depth=2\) "
     r"\(rope_rescale_coords 2.0 \(not null\): only training reads it\)",
     "vit_small_patch16_lingbot", {}, "vit_small_patch16_dinov3_qkvb"),
    ("SiglipVisionModel", lambda: T.SiglipVisionConfig(hidden_size=768, intermediate_size=3072, num_hidden_layers=1,
                                                       num_attention_heads=12, image_size=32, patch_size=16),
     r"timm's nearest architecture, vit_base_patch16_siglip_224, loads these tensors and computes another function: "
     r"it differs in depth 1 \(not 12\); gelu \"tanh\" \(not \"exact\"\)\. Build it .*act_layer for gelu",
     "vit_base_patch16_siglip_224", dict(act_layer="gelu_tanh"), "vit_base_patch16_siglip_224"),
])
def test_a_timm_file_from_transformers_says_how_timm_computes_it(cls, config, said, name, keywords, trap, tmp_path,
                                                                 images):
    """The file loads strictly into a timm architecture that computes another function, in silence: DINOv3 pools
    the class token in transformers, timm's dinov3 names average; SigLIP's GELU is the tanh form there."""
    from safetensors.torch import load_file

    timm = pytest.importorskip("timm")
    ref = randomize(getattr(T, cls)(config())).eval()
    ref.save_pretrained(tmp_path / "hf")
    with pytest.warns(ExportWarning, match=said):
        vitkit.export_weights(vitkit.from_pretrained(tmp_path / "hf"), tmp_path / "m.safetensors", "timm")
    x = images(2, 32, 32)
    sd = load_file(tmp_path / "m.safetensors")
    with torch.no_grad():
        expected = _pooled(ref, x)
        told, untold = (timm.create_model(n, depth=config().num_hidden_layers, img_size=32, **kw).eval()
                        for n, kw in ((name, keywords), (trap, {})))
        told.load_state_dict(sd)
        untold.load_state_dict(sd)  # strict: nothing in the tensors says it is another model
        assert _close(told(x), expected) and max_diff(untold(x), expected) > 1e-4


@pytest.mark.parametrize("name", ["vit_small_patch16_dinov3", "vit_base_patch16_siglip_224", "eva02_tiny_patch14_224",
                                  "vit_small_patch14_reg4_dinov2", "vit_fmnist_hybrid"])
def test_a_model_timm_builds_under_its_own_name_exports_to_timm_without_a_note(name, tmp_path):
    import warnings

    model = vitkit.create_model(name, depth=1, img_size=28 if "14" in name else 32)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ExportWarning)  # vit_fmnist_hybrid: no timm name, and timm refuses its shapes
        vitkit.export_weights(model, tmp_path / "m.safetensors", "timm")


def test_a_siglip_file_without_its_probe_names_the_one_tensor_it_lacks(tmp_path):
    """Without head.probe the tower was read as headless, and the head's 12 other tensors were said as "not in the
    model": the head is known by any of its tensors, and the one missing is named (as the file names it)."""
    from safetensors.torch import load_file, save_file

    T.SiglipVisionModel(T.SiglipVisionConfig(**SMALL)).save_pretrained(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    save_file({k: v for k, v in tensors.items() if k != "head.probe"}, tmp_path / "model.safetensors",
              metadata={"format": "pt"})
    with pytest.raises(WeightsError, match=r"missing from the checkpoint: head\.probe \(vitkit's attn_pool\.latent\) "
                                           r"\(in Python"):
        vitkit.from_pretrained(tmp_path)


@pytest.mark.parametrize("cls, config, dropped", [
    ("CLIPVisionModelWithProjection", lambda: T.CLIPVisionConfig(**SMALL, projection_dim=16), "visual_projection."),
    ("CLIPModel", lambda: T.CLIPConfig(text_config=TEXT, vision_config=SMALL, projection_dim=16), "visual_projection."),
    ("SiglipVisionModel", lambda: T.SiglipVisionConfig(**SMALL), "head."),
    ("SiglipModel", lambda: T.SiglipConfig(text_config=TEXT, vision_config=SMALL), "vision_model.head."),
    ("Siglip2VisionModel", lambda: T.Siglip2VisionConfig(**{**SMALL, "num_patches": 16}), "head.")])
def test_a_file_without_the_part_its_class_always_holds_is_refused(cls, config, dropped, tmp_path, images):
    """A CLIP ...WithProjection file without visual_projection loaded as the plain tower (the 64-wide pooled output
    where transformers' image embeds are 16 wide), a SigLIP file without its head as the tokens' mean: other
    features, in silence. Refused by the class its config names; a SigLIP classifier (whose head is not read) and
    a tower its config says has no head still load."""
    from safetensors.torch import load_file, save_file

    getattr(T, cls)(config()).save_pretrained(tmp_path / "whole")
    tensors = load_file(tmp_path / "whole" / "model.safetensors")
    getattr(T, cls)(config()).save_pretrained(tmp_path / "cut")
    save_file({k: v for k, v in tensors.items() if not k.startswith(dropped)}, tmp_path / "cut" / "model.safetensors",
              metadata={"format": "pt"})
    vitkit.from_pretrained(tmp_path / "whole")
    with pytest.raises(WeightsError, match=rf"its config names {cls}, which holds its .*, where its weights hold no "
                                           rf"{re.escape(dropped.split('.')[-2])}\.\* tensor"):
        vitkit.from_pretrained(tmp_path / "cut")


def test_a_siglip_without_a_head_by_its_config_or_a_classifier_loads(tmp_path, images):
    """A SigLIP tower without its head (PaliGemma's: vision_use_head false) was written back as an IJepaModel (the
    same function, another class and layout): it is written as it came, and transformers reads the same tokens."""
    hf = T.SiglipVisionModel(T.SiglipVisionConfig(**SMALL, vision_use_head=False)).eval()
    hf.save_pretrained(tmp_path / "plain")
    plain = vitkit.from_pretrained(tmp_path / "plain")
    assert plain.config.global_pool == "avg"
    vitkit.export_weights(plain, tmp_path / "back", "hf")
    back = T.AutoModel.from_pretrained(tmp_path / "back").eval()
    assert type(back).__name__ == "SiglipVisionModel" and back.config.vision_use_head is False
    with torch.no_grad():
        tokens = hf(pixel_values=images(2, 32, 32)).last_hidden_state
        assert _close(back(pixel_values=images(2, 32, 32)).last_hidden_state, tokens)
        assert _close(plain(images(2, 32, 32)), tokens.mean(1))
    timm = pytest.importorskip("timm")  # timm's SigLIP without its head, the same way
    kw = dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=2, num_classes=0)
    ref = randomize(timm.create_model("vit_base_patch16_siglip_gap_224", **kw)).eval()
    ours = vitkit.create_model("vit_base_patch16_siglip_gap_224", **kw)
    ours.load_state_dict(ref.state_dict())
    vitkit.export_weights(ours, tmp_path / "timm_gap", "hf")
    theirs = T.SiglipVisionModel.from_pretrained(tmp_path / "timm_gap").eval()
    with torch.no_grad():
        assert _close(theirs(pixel_values=images(2, 32, 32)).last_hidden_state, ref.forward_features(images(2, 32, 32)))
    hf = T.SiglipForImageClassification(T.SiglipConfig(text_config=TEXT, vision_config=SMALL, num_labels=3)).eval()
    hf.save_pretrained(tmp_path / "classes")
    model = vitkit.from_pretrained(tmp_path / "classes").eval()
    with torch.no_grad():
        assert _close(model(images(2, 32, 32)), hf(pixel_values=images(2, 32, 32)).logits)


def test_a_dinov2_file_whose_registers_disagree_with_its_config_is_refused_by_them(tmp_path):
    """A with-registers folder without its register_tokens was blamed on its image size ("17 position slots: its 4x4
    grid's and 1 for prefix tokens where the config's model has 0"): the registers are said."""
    from safetensors.torch import load_file, save_file

    T.Dinov2WithRegistersModel(T.Dinov2WithRegistersConfig(**SMALL)).save_pretrained(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    save_file({k: v for k, v in tensors.items() if "register" not in k}, tmp_path / "model.safetensors",
              metadata={"format": "pt"})
    with pytest.raises(WeightsError, match=r"its config says 4 register tokens \(dinov2_with_registers\) where its "
                                           r"weights hold no embeddings\.register_tokens"):
        vitkit.from_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config.update(model_type="dinov2", architectures=["Dinov2Model"])
    (tmp_path / "config.json").write_text(json.dumps(config))
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(WeightsError, match=r"its weights hold embeddings\.register_tokens where its config "
                                           r"\(model_type 'dinov2'\) has no registers"):
        vitkit.from_pretrained(tmp_path)


def test_a_file_missing_a_query_says_which_part(tmp_path):
    from safetensors.torch import load_file, save_file

    T.CLIPVisionModel(T.CLIPVisionConfig(**SMALL)).save_pretrained(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    save_file({k: v for k, v in tensors.items() if not k.endswith("layers.1.self_attn.q_proj.weight")},
              tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(WeightsError, match=r"layer 1's attention lacks its query weight \(the file holds its key and "
                                           r"value weight\)"):
        vitkit.from_pretrained(tmp_path)


def test_a_folder_that_mixes_one_library_s_config_with_the_other_s_tensors_is_refused(tmp_path):
    """A Hugging Face config.json beside timm's tensor names was read as that config over tensors it does not
    describe (an edited head count trained a 4-head model from 2-head tensors, 0.41 off timm's); timm's config.json
    beside transformers' names was said to lack a config."""
    timm = pytest.importorskip("timm")
    from safetensors.torch import save_file

    vit = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2, image_size=32,
               patch_size=8)
    for folder in ("hf_config", "timm_config"):
        T.ViTModel(T.ViTConfig(**vit), add_pooling_layer=False).save_pretrained(tmp_path / folder)
    ref = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, embed_dim=64, depth=1, num_heads=2,
                            num_classes=0)
    save_file(ref.state_dict(), tmp_path / "hf_config" / "model.safetensors")
    (tmp_path / "timm_config" / "config.json").write_text(json.dumps(
        {"architecture": "vit_tiny_patch16_224", "num_classes": 0, "model_args": dict(
            img_size=32, patch_size=8, embed_dim=64, depth=1, num_heads=2)}))
    for folder, said in (("hf_config", "is a Hugging Face config (model_type 'vit') where model.safetensors holds "
                                       "timm's tensor names: the two were mixed"),
                         ("timm_config", "is timm's (architecture 'vit_tiny_patch16_224') where model.safetensors "
                                         "holds Hugging Face's tensor names: the two were mixed")):
        with pytest.raises(WeightsError, match=re.escape(said)):
            vitkit.from_pretrained(tmp_path / folder)
    (tmp_path / "hf_config" / "model.safetensors").rename(tmp_path / "alone.safetensors")
    assert vitkit.from_pretrained(tmp_path / "alone.safetensors").config.embed_dim == 64  # alone: a bare timm file


def test_a_dinov2_folder_with_a_non_square_crop_is_written_back_as_it_was(tmp_path):
    """A DINOv2 whose processor crops 32x48 (transformers runs it) was refused by convert --to hf: "a 32x48 image in
    8x8 patches (DINOv2's config holds one side of each: a square)". Its config holds the table's side; the crop
    stays the processor's."""
    from vitkit.cli import main

    ref = randomize(T.Dinov2Model(T.Dinov2Config(**{**SMALL, "image_size": 32}))).eval()
    ref.save_pretrained(tmp_path / "hf")
    processor = T.BitImageProcessor(size={"shortest_edge": 36}, crop_size={"height": 32, "width": 48})
    processor.save_pretrained(tmp_path / "hf")
    assert main(["convert", str(tmp_path / "hf"), str(tmp_path / "back"), "--to", "hf"]) == 0
    back = T.Dinov2Model.from_pretrained(tmp_path / "back").eval()
    assert json.loads((tmp_path / "back" / "preprocessor_config.json").read_text())["crop_size"] == {"height": 32,
                                                                                                    "width": 48}
    for h, w in ((32, 48), (40, 40)):
        x = torch.randn(2, 3, h, w)
        with torch.no_grad():
            assert _close(_pooled(ref, x), _pooled(back, x))


def test_fine_tuning_a_dinov2_folder_trains_at_its_processor_s_size(tmp_path, capsys):
    """train --init of a transformers DINOv2 trained at its config's image_size (facebook/dinov2-*: 518 px, 5x the
    tokens of the 224 its processor makes, and other sizes than predict and eval of the same folder use)."""
    import numpy as np
    from PIL import Image

    from vitkit.cli import main

    randomize(T.Dinov2Model(T.Dinov2Config(**{**SMALL, "image_size": 64}))).save_pretrained(tmp_path / "hf")
    T.BitImageProcessor(size={"shortest_edge": 36}, crop_size={"height": 32, "width": 32}).save_pretrained(
        tmp_path / "hf")
    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        for name in ("a", "b"):
            (tmp_path / "d" / split / name).mkdir(parents=True)
            for i in range(4):
                Image.fromarray(rng.integers(0, 255, (40, 44, 3), dtype=np.uint8)).save(
                    tmp_path / "d" / split / name / f"{i}.png")
    assert main(["train", "--init", str(tmp_path / "hf"), "--finetune", "head", "--dataset", "folder", "--data-dir",
                 str(tmp_path / "d"), "--batch-size", "2", "--val-size", "1", "--max-steps", "1", "--no-progress",
                 "--threads", "1", "--runs-dir", str(tmp_path / "runs"), "--name", "r"]) == 0
    said = capsys.readouterr()
    assert "resized to 32x32, the model's size" in said.out + said.err
    trained = vitkit.from_pretrained(tmp_path / "runs" / "r").config
    assert (trained.img_size, trained.pos_embed_size) == ((32, 32), (64, 64))  # as from_pretrained builds the folder


ALT_TEXT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, vocab_size=64)
SAM = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, image_size=64, patch_size=16, mlp_dim=64,
           output_channels=16, global_attn_indexes=[1], window_size=2)
#: other releases' towers in CLIP's or SAM's layout: (class, config, its output for images x)
RELEASES = {
    "MetaClip2VisionModel": lambda: T.MetaClip2VisionConfig(**SMALL),
    "MetaClip2VisionModelWithProjection": lambda: T.MetaClip2VisionConfig(**SMALL, projection_dim=16),
    "MetaClip2Model": lambda: T.MetaClip2Config(vision_config=SMALL, text_config=TEXT, projection_dim=16),
    "MetaClip2ForImageClassification": lambda: T.MetaClip2Config(vision_config=SMALL, text_config=TEXT, num_labels=3),
    "ChineseCLIPVisionModel": lambda: T.ChineseCLIPVisionConfig(**SMALL),
    "ChineseCLIPModel": lambda: T.ChineseCLIPConfig(vision_config=SMALL, text_config=ALT_TEXT, projection_dim=16),
    "AltCLIPVisionModel": lambda: T.AltCLIPVisionConfig(**SMALL),
    "AltCLIPModel": lambda: T.AltCLIPConfig(vision_config=SMALL, text_config=dict(ALT_TEXT, project_dim=16),
                                            projection_dim=16),
    "OwlViTVisionModel": lambda: T.OwlViTVisionConfig(**SMALL),
    "OwlViTModel": lambda: T.OwlViTConfig(vision_config=SMALL, text_config=TEXT, projection_dim=16),
    "SamHQVisionModel": lambda: T.SamHQVisionConfig(**SAM),
    "SamHQModel": lambda: T.SamHQConfig(vision_config=SAM),
}


def _release_output(ref, x):
    """What the class gives an image: the image embedding of a two-tower model, a classifier's logits, SAM's
    neck map as tokens (vitkit's forward_features), else the pooled or projected output."""
    with torch.no_grad():
        if isinstance(ref, T.SamHQModel):
            out = ref.get_image_embeddings(pixel_values=x)
            return (out[0] if isinstance(out, (tuple, list)) else out).flatten(2).transpose(1, 2)
        if isinstance(ref, T.SamHQVisionModel):
            return ref(pixel_values=x).last_hidden_state.flatten(2).transpose(1, 2)
        if hasattr(ref, "get_image_features") and "Vision" not in type(ref).__name__:
            out = ref.get_image_features(pixel_values=x)
            return out if isinstance(out, torch.Tensor) else out.pooler_output
        out = ref(pixel_values=x)
        return next(getattr(out, f) for f in ("logits", "image_embeds", "pooler_output") if hasattr(out, f))


@pytest.mark.parametrize("cls", sorted(RELEASES))
def test_other_releases_towers_in_clips_or_sams_layout_load_with_parity(cls, tmp_path, images):
    """MetaCLIP 2's, Chinese-CLIP's, AltCLIP's and OWL-ViT's image towers are CLIP's names and function, SAM-HQ's
    encoder SAM's (before, their model_types were refused): transformers' outputs, and at a non-square size where
    transformers resamples the table (interpolate_pos_encoding); written back as CLIP's or SAM's class."""
    ref = randomize(getattr(T, cls)(RELEASES[cls]())).eval()
    ref.save_pretrained(tmp_path / "hf")
    ours = vitkit.from_pretrained(tmp_path / "hf")
    side = 64 if cls.startswith("Sam") else 32
    x = images(2, side, side)
    sam = cls.startswith("Sam")
    with torch.no_grad():
        assert _close(_release_output(ref, x), ours.forward_features(x) if sam else ours(x))
    if cls.endswith("VisionModel") and not sam:
        wide = images(2, 32, 48)
        stretched = vitkit.from_pretrained(tmp_path / "hf", dynamic_img_size=True)
        with torch.no_grad():
            want = ref(pixel_values=wide, interpolate_pos_encoding=True).pooler_output
            assert _close(want, stretched(wide))
    if cls.endswith(("VisionModel", "WithProjection")):
        with warnings.catch_warnings():
            warnings.simplefilter("error", ExportWarning)  # (the same function and preprocessing: nothing to say)
            vitkit.export_weights(ours, tmp_path / "back", "hf")
        written = "SamVisionModel" if sam else re.sub(r"^(MetaClip2|ChineseCLIP|AltCLIP|OwlViT)", "CLIP", cls)
        again = getattr(T, written).from_pretrained(tmp_path / "back").eval()
        with torch.no_grad():
            want = again(pixel_values=x).last_hidden_state.flatten(2).transpose(1, 2) if sam else \
                _release_output(again, x)
            assert _close(_release_output(ref, x), want)


def test_an_owlvit_detector_is_refused_naming_the_class_that_holds_its_tower(tmp_path, capsys):
    """Its model_type is the two-tower model's (owlvit): its class and box heads read every image token."""
    from conftest import in_process

    T.OwlViTForObjectDetection(T.OwlViTConfig(vision_config=SMALL, text_config=TEXT)).save_pretrained(tmp_path)
    with pytest.raises(WeightsError, match="OwlViTForObjectDetection is an object detector .* OwlViTModel's") as e:
        vitkit.from_pretrained(tmp_path)
    assert "\n" not in str(e.value)
    said = in_process(capsys, "info", str(tmp_path))
    assert said.returncode == 2 and "OwlViTModel.from_pretrained loads it" in said.stdout


@pytest.mark.parametrize("vlm", ["SmolVLM", "Idefics3"])
def test_a_smolvlm_or_idefics3_folder_reads_its_siglip_tower_alone(vlm, tmp_path, images, capsys):
    """Their tower is SigLIP's without its head, beside the language model under model.vision_model.: its tokens are
    transformers' at every size (at another grid transformers buckets the positions: the table's nearest slots, where
    vitkit's default bicubic resampling was 0.26-0.56 off); a shard of the language model alone
    is not read (here it is not even a weights file). Their processor gives the whole image squashed to the tower's
    size and tiles: vitkit's view is the whole image (0.7% of the range apart on average from the processor's with
    its filter bicubic, which resizes three times in a row), and the tiles are said (before, each model_type was
    refused)."""
    from PIL import Image

    from conftest import in_process
    from vitkit.weights.pretrained import GuessWarning

    text = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                num_key_value_heads=2, vocab_size=128)
    config = getattr(T, f"{vlm}Config")(vision_config=SMALL, text_config=text, scale_factor=2)
    ref = randomize(getattr(T, f"{vlm}ForConditionalGeneration")(config)).eval()
    ref.save_pretrained(tmp_path, max_shard_size="40KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())["weight_map"]
    text_only = sorted(set(index.values()) - {f for k, f in index.items() if k.startswith("model.vision_model.")})
    assert text_only
    for shard in text_only:
        (tmp_path / shard).write_bytes(b"not read")
    ours = vitkit.from_pretrained(tmp_path)
    x = images(2, 32, 32)
    with torch.no_grad():
        want = ref.model.vision_model(pixel_values=x).last_hidden_state
        assert _close(want, ours.forward_features(x)) and _close(want.mean(dim=1), ours(x))
    # at other grids its positions are the table's nearest slots (bucketed): so at any size, and built at one
    anywhere, at_48 = vitkit.from_pretrained(tmp_path, dynamic_img_size=True), vitkit.from_pretrained(tmp_path,
                                                                                                      img_size=48)
    for h, w in [(32, 48), (56, 24), (48, 48)]:
        x = images(1, h, w)
        with torch.no_grad():
            want = ref.model.vision_model(pixel_values=x).last_hidden_state
            assert _close(want, anywhere.forward_features(x)), (h, w)
            assert (h, w) != (48, 48) or _close(want, at_48.forward_features(x))
    said = in_process(capsys, "info", str(tmp_path))
    assert said.returncode == 0 and "tensors of its language model and projector left out" in said.stdout
    getattr(T, f"{vlm}ImageProcessorPil")(max_image_size={"longest_edge": 32}, size={"longest_edge": 64},
                                          resample=3).save_pretrained(tmp_path)
    with pytest.warns(GuessWarning, match=r"\(SmolVLM's or Idefics3's\) gives the whole image squashed to 32 px"):
        ours = vitkit.from_pretrained(tmp_path)
    processor = T.AutoImageProcessor.from_pretrained(tmp_path, use_fast=False)
    photo = Image.fromarray(pytest.importorskip("skimage.data").chelsea())
    views = processor(images=[photo], return_tensors="pt")["pixel_values"][0]
    diff = (views[-1] - vitkit.preprocess(ours, photo)[0]).abs()  # (it resizes three times in a row, vitkit once)
    assert views.shape[0] > 1 and diff.max() < 0.15 and diff.mean() < 0.01  # (here 0.094 and 0.0068 of a 2 range)


LLAMA = dict(model_type="llama", hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
             num_key_value_heads=2, vocab_size=128)
#: VLMs of other model_types around a tower vitkit reads: (class prefix, config, the tower's model_type)
VLM_TOWERS = {
    "Llava": (lambda: T.LlavaConfig(vision_config=dict(SMALL, model_type="clip_vision_model"), text_config=LLAMA)),
    "LlavaNext": (lambda: T.LlavaNextConfig(vision_config=dict(SMALL, model_type="clip_vision_model"),
                                            text_config=LLAMA)),
    "PaliGemma": (lambda: T.PaliGemmaConfig(vision_config=dict(SMALL, model_type="siglip_vision_model"),
                                            text_config=dict(LLAMA, model_type="gemma"))),
    "AyaVision": (lambda: T.AyaVisionConfig(vision_config=dict(SMALL, model_type="siglip_vision_model"),
                                            text_config=dict(LLAMA, model_type="cohere2"))),
    "Gemma3": (lambda: T.Gemma3Config(vision_config=dict(SMALL, model_type="siglip_vision_model"), text_config=dict(
        LLAMA, model_type="gemma3_text", head_dim=16), mm_tokens_per_image=4)),
}


@pytest.mark.parametrize("legacy", [False, True], ids=["as-saved", "hub-names"])
@pytest.mark.parametrize("vlm", sorted(VLM_TOWERS))
def test_a_vlm_of_another_model_type_reads_its_tower_alone(vlm, legacy, tmp_path, images, capsys):
    """LLaVA's CLIP, PaliGemma's, Gemma 3's and Aya Vision's SigLIP: a vision_config of a tower vitkit reads, under
    vision_tower. (the hub's older files: vision_tower.vision_model.) beside the language model and projector,
    which are not read: the tower's pooled output (before, each model_type was refused by name). LLaVA's language
    model is fed one block's tokens: said, with the call that gives them, and it does give them."""
    from safetensors.torch import load_file, save_file

    from conftest import in_process
    from vitkit.weights.pretrained import GuessWarning

    ref = randomize(getattr(T, f"{vlm}ForConditionalGeneration")(VLM_TOWERS[vlm]())).eval()
    ref.save_pretrained(tmp_path)
    if legacy:  # as the hub's llava-hf and google/paligemma files name them
        sd = load_file(tmp_path / "model.safetensors")
        save_file({re.sub(r"^vision_tower\.", "vision_tower.vision_model.", k): v for k, v in sd.items()},
                  tmp_path / "model.safetensors")
    llava = vlm.startswith("Llava")
    with pytest.warns(GuessWarning, match=r"fed the tower's tokens after block -2 \(its patches") if llava else \
            warnings.catch_warnings():
        ours = vitkit.from_pretrained(tmp_path)
    x = images(2, 32, 32)
    tower = ref.model.vision_tower
    with torch.no_grad():
        out = tower(pixel_values=x, output_hidden_states=True)
        assert _close(out.pooler_output, ours(x))
        if llava:  # what LLaVA feeds its language model: block -2's patches
            fed = ours.forward_intermediates(x, indices=[-2], output_fmt="NLC", intermediates_only=True)[0]
            assert _close(out.hidden_states[-2][:, 1:], fed)
    said = in_process(capsys, "info", str(tmp_path))
    assert said.returncode == 0 and "tensors of its language model and projector left out" in said.stdout


def test_llava_nexts_processor_is_read_and_its_tiles_said(tmp_path):
    """Its processor (CLIP's fields and grid pinpoints for tiles) loads; the tiles are said."""
    from vitkit.weights.pretrained import GuessWarning

    T.LlavaNextForConditionalGeneration(VLM_TOWERS["LlavaNext"]()).save_pretrained(tmp_path)
    T.LlavaNextImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32},
                              image_grid_pinpoints=[[32, 64], [64, 32]]).save_pretrained(tmp_path)
    with pytest.warns(GuessWarning, match=r"\(LLaVA-NeXT's\) gives the whole image and tiles of it resized to the "
                                          r"nearest of its 2 grid pinpoints"):
        ours = vitkit.from_pretrained(tmp_path)
    assert (ours.config.img_size, ours.config.crop_mode) == ((32, 32), "center")


def test_a_vlm_whose_tower_vitkit_does_not_read_is_one_line_naming_the_tower(tmp_path):
    vision = dict(model_type="pixtral", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                  num_attention_heads=2, image_size=32, patch_size=8, head_dim=16)
    T.Mistral3ForConditionalGeneration(T.Mistral3Config(vision_config=vision, text_config=dict(
        LLAMA, model_type="mistral"))).save_pretrained(tmp_path)
    with pytest.raises(WeightsError, match=r"model_type 'mistral3' is a VLM whose vision tower \('pixtral'\) is not "
                                           r"one vitkit reads") as info:
        vitkit.from_pretrained(tmp_path)
    assert "\n" not in str(info.value)


INTERNVIT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=[32, 32],
                 patch_size=[8, 8])


@pytest.mark.parametrize("options", [{}, dict(attention_bias=True), dict(use_mean_pooling=False)],
                         ids=["released", "qkv-bias", "final-norm"])
def test_internvit_and_internvl_folders_load_with_parity(options, tmp_path, images):
    """InternViT (InternVL's tower: a class token, LayerScale as lambda_1 / lambda_2, q / k / v apart): transformers'
    last_hidden_state, from its own folder and from InternVL's beside its language model; InternVL's tiles are said
    (before, both model_types were refused)."""
    from vitkit.weights.pretrained import GuessWarning

    ref = randomize(T.InternVLVisionModel(T.InternVLVisionConfig(**INTERNVIT, **options))).eval()
    ref.save_pretrained(tmp_path / "tower")
    vlm = randomize(T.InternVLForConditionalGeneration(T.InternVLConfig(
        vision_config=dict(INTERNVIT, **options), text_config=dict(LLAMA, model_type="qwen2")))).eval()
    vlm.save_pretrained(tmp_path / "vlm")
    T.GotOcr2ImageProcessor(size={"height": 32, "width": 32}, crop_to_patches=True).save_pretrained(tmp_path / "vlm")
    with pytest.warns(GuessWarning, match=r"\(InternVL's or Cohere's tiling\) gives tiles of the image on a grid of 1 "
                                          r"to 12 of them"):
        from_vlm = vitkit.from_pretrained(tmp_path / "vlm")
    x = images(2, 32, 32)
    with torch.no_grad():
        for tower, ours in ((ref, vitkit.from_pretrained(tmp_path / "tower")), (vlm.model.vision_tower, from_vlm)):
            want = tower(pixel_values=x).last_hidden_state
            assert _close(want, ours.forward_features(x))
    assert from_vlm.config.crop_mode == "squash" and from_vlm.config.img_size == (32, 32)
    # at another grid transformers resamples the stored table on every call, bicubic without antialiasing
    anywhere = vitkit.from_pretrained(tmp_path / "tower", dynamic_img_size=True)
    x = images(1, 32, 48)
    with torch.no_grad():
        assert _close(ref(pixel_values=x).last_hidden_state, anywhere.forward_features(x))


@pytest.mark.parametrize("options", [dict(norm_type="rms_norm"), dict(use_qk_norm=True)])
def test_internvits_6b_tower_is_one_line(options, tmp_path):
    T.InternVLVisionModel(T.InternVLVisionConfig(**INTERNVIT, **options)).save_pretrained(tmp_path)
    with pytest.raises(WeightsError, match="InternViT's 6B tower .* is not read; its 300M tower") as info:
        vitkit.from_pretrained(tmp_path)
    assert "\n" not in str(info.value)


BLIP_TEXT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, vocab_size=128,
                 encoder_hidden_size=32)
#: BLIP's, BLIP-2's and InstructBLIP's encoders alone and inside their models
BLIPS = {
    "BlipVisionModel": lambda: T.BlipVisionConfig(**SMALL),
    "Blip2VisionModel": lambda: T.Blip2VisionConfig(**SMALL),
    "InstructBlipVisionModel": lambda: T.InstructBlipVisionConfig(**SMALL),
    "BlipForConditionalGeneration": lambda: T.BlipConfig(vision_config=SMALL, text_config=BLIP_TEXT),
    "BlipModel": lambda: T.BlipConfig(vision_config=SMALL, text_config=BLIP_TEXT, projection_dim=16),
    "Blip2ForConditionalGeneration": lambda: T.Blip2Config(
        vision_config=SMALL, num_query_tokens=4, qformer_config=dict(
            hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, encoder_hidden_size=64),
        text_config=dict(model_type="opt", hidden_size=32, ffn_dim=64, num_hidden_layers=1, num_attention_heads=2,
                         vocab_size=128, word_embed_proj_dim=32)),
}


@pytest.mark.parametrize("cls", sorted(BLIPS))
def test_blip_encoders_load_with_parity_alone_and_inside_their_models(cls, tmp_path, images):
    """A fused qkv (BLIP-2's without the key's bias), ``projection``, ``post_layernorm`` over every token: vitkit's
    forward_features is transformers' last_hidden_state (what their Q-Formers and text decoders read), at the model's
    size and at another (its table resampled bicubic without antialiasing); the rest of a model is not read (before,
    each model_type was refused)."""
    ref = randomize(getattr(T, cls)(BLIPS[cls]())).eval()
    ref.save_pretrained(tmp_path)
    tower = ref if "Vision" in cls else ref.vision_model
    ours, anywhere = vitkit.from_pretrained(tmp_path), vitkit.from_pretrained(tmp_path, dynamic_img_size=True)
    with torch.no_grad():
        x, wide = images(2, 32, 32), images(1, 32, 48)
        assert _close(tower(pixel_values=x).last_hidden_state, ours.forward_features(x))
        assert _close(tower(pixel_values=wide, interpolate_pos_encoding=True).last_hidden_state,
                      anywhere.forward_features(wide))


def test_a_vlm_on_the_hub_downloads_only_its_towers_shards(tmp_path, monkeypatch, images):
    """hf-hub: of a sharded VLM fetched every shard (its language model fills most of them); now the index first,
    then the shards that hold its tower, and the tower loads with transformers' outputs."""
    import sys
    import types

    from conftest import fake_snapshot_download

    ref = randomize(T.LlavaForConditionalGeneration(VLM_TOWERS["Llava"]())).eval()
    ref.save_pretrained(tmp_path / "repo", max_shard_size="40KB")
    weight_map = json.loads((tmp_path / "repo" / "model.safetensors.index.json").read_text())["weight_map"]
    towers = {f for k, f in weight_map.items() if k.startswith("vision_tower.")}
    assert set(weight_map.values()) - towers
    calls = []
    monkeypatch.setitem(sys.modules, "huggingface_hub", types.SimpleNamespace(
        snapshot_download=fake_snapshot_download(tmp_path / "repo", calls)))
    with pytest.warns(UserWarning):  # (LLaVA's vision_feature_layer, said)
        ours = vitkit.from_pretrained("hf-hub:org/llava")
    folder = vitkit.weights.download_from_hub("org/llava")
    assert {p.name for p in folder.glob("model-*")} == towers
    x = images(2, 32, 32)
    with torch.no_grad():
        assert _close(ref.model.vision_tower(pixel_values=x).pooler_output, ours(x))


def test_a_vlm_checkpoint_without_its_tower_says_so(tmp_path):
    """Its language model's tensors alone: said as that, where it was "unrecognised weight layout"."""
    from safetensors.torch import load_file, save_file

    T.LlavaForConditionalGeneration(VLM_TOWERS["Llava"]()).save_pretrained(tmp_path)
    sd = load_file(tmp_path / "model.safetensors")
    save_file({k: v for k, v in sd.items() if not k.startswith("vision_tower.")}, tmp_path / "model.safetensors")
    with pytest.raises(WeightsError, match="is a llava VLM's, with a clip_vision_model tower, where its weights hold "
                                           "none of the tower's tensors") as info:
        vitkit.from_pretrained(tmp_path)
    assert "\n" not in str(info.value)
