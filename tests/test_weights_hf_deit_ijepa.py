"""The classes that share transformers' ViT layers, both ways: DeiT (its distillation token; the teacher class
averages two heads, the others read the class token), I-JEPA (no class token, the mean of the normalised
tokens) and MSN (a ViT) folders give transformers' outputs (fp32, 1e-5); timm's distilled DeiT and its
class-token-free ViT exported as 'hf' give timm's logits through transformers' own classes."""

import json

import pytest
import torch
from safetensors.torch import save_file

import vitkit
from conftest import max_diff, randomize
from vitkit.weights.io import WeightsError

T = pytest.importorskip("transformers")
timm = pytest.importorskip("timm")

SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, patch_size=8)


def _close(a, b):
    return a.shape == b.shape and max_diff(a, b) <= 1e-5 * max(1.0, a.abs().max().item())


CASES = {  # class, config, image size, what to compare ("logits", "pooler", "tokens")
    "deit_teacher": ("DeiTForImageClassificationWithTeacher", lambda: T.DeiTConfig(
        **SMALL, image_size=[32, 48], num_labels=5), (32, 48), "logits"),
    "deit_classifier": ("DeiTForImageClassification", lambda: T.DeiTConfig(**SMALL, image_size=32, num_labels=3),
                        (32, 32), "logits"),
    "deit_model_pooler": ("DeiTModel", lambda: T.DeiTConfig(**SMALL, image_size=32), (32, 32), "pooler"),
    "ijepa_classifier": ("IJepaForImageClassification", lambda: T.IJepaConfig(**SMALL, image_size=32, num_labels=4),
                         (32, 32), "logits"),
    "ijepa_model": ("IJepaModel", lambda: T.IJepaConfig(**SMALL, image_size=32), (32, 32), "tokens"),
    "msn_classifier": ("ViTMSNForImageClassification", lambda: T.ViTMSNConfig(**SMALL, image_size=32, num_labels=3),
                       (32, 32), "logits"),
    "msn_model": ("ViTMSNModel", lambda: T.ViTMSNConfig(**SMALL, image_size=32), (32, 32), "tokens"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_hugging_face_folder_loads_with_parity(case, tmp_path, images):
    cls, config, (h, w), output = CASES[case]
    ref = randomize(getattr(T, cls)(config())).eval()
    ref.save_pretrained(tmp_path)
    ours = vitkit.from_pretrained(tmp_path)
    x = images(2, h, w)
    with torch.no_grad():
        out = ref(pixel_values=x)
        expected = {"logits": getattr(out, "logits", None), "pooler": getattr(out, "pooler_output", None),
                    "tokens": out[0]}[output]
        assert _close(expected, ours.forward_features(x) if output == "tokens" else ours(x))
    if "ForImageClassification" in cls:
        assert ref.config.id2label[0] == "LABEL_0" and ours.config.label_names is None  # placeholders: none
    if cls.startswith("DeiT"):  # the teacher class alone averages the distillation head in
        assert ours.config.distill_token and ours.config.distill_head == cls.endswith("WithTeacher")


def test_a_deit_read_from_its_classifier_fine_tunes_on_the_class_token(tmp_path):
    """DeiTForImageClassification's model gets new classes on its one head (no distillation head appears), and
    its tensors alone (no config) are read the same way: a head and no ``head_dist``."""
    ref = randomize(T.DeiTForImageClassification(T.DeiTConfig(**SMALL, image_size=32, num_labels=3)))
    ref.save_pretrained(tmp_path / "hf")
    model = vitkit.from_pretrained(tmp_path / "hf", num_classes=6)
    assert model.head.out_features == 6 and model.head_dist is None and model.head_names() == ("head",)
    with pytest.raises(ValueError, match="distill_head=True"):
        model.set_distilled_training(True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp_path / "bare.safetensors"))
    with pytest.warns(UserWarning):  # a bare file notes what it assumed (its normalisation)
        bare = vitkit.from_pretrained(tmp_path / "bare.safetensors", num_heads=4)
    assert bare.config.distill_token and not bare.config.distill_head


@pytest.mark.parametrize("name, args, cls", [
    ("deit_tiny_distilled_patch16_224", {}, "DeiTForImageClassificationWithTeacher"),
    ("vit_small_patch16_224", dict(class_token=False, global_pool="avg", fc_norm=False), "IJepaForImageClassification"),
])
def test_timm_models_exported_as_hf_give_timms_logits_in_transformers(name, args, cls, tmp_path, images):
    ref = randomize(timm.create_model(name, depth=2, img_size=32, patch_size=8, num_classes=5, **args)).eval()
    ours = vitkit.create_model(name, depth=2, img_size=32, patch_size=8, num_classes=5, **args)
    ours.load_state_dict(ref.state_dict())
    vitkit.export_weights(ours, tmp_path / "hf", "hf")
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["architectures"] == [cls]
    theirs = getattr(T, cls).from_pretrained(tmp_path / "hf").eval()
    x = images(2, 32, 32)
    with torch.no_grad():
        expected = ref(x)
        assert _close(theirs(pixel_values=x).logits, expected)
        assert _close(vitkit.from_pretrained(tmp_path / "hf")(x), expected)


def test_a_deit_reading_its_class_token_exports_as_deit_for_image_classification(tmp_path, images):
    model = randomize(vitkit.create_model("deit_tiny_distilled_patch16_224", depth=2, img_size=32, patch_size=8,
                                          num_classes=5, distill_head=False))
    vitkit.export_weights(model, tmp_path / "hf", "hf")
    theirs = T.DeiTForImageClassification.from_pretrained(tmp_path / "hf").eval()
    x = images(2, 32, 32)
    with torch.no_grad():
        assert _close(theirs(pixel_values=x).logits, model(x))
    with pytest.raises(WeightsError, match="two heads, where this model reads its class token alone"):
        vitkit.export_weights(model, tmp_path / "timm.safetensors", "timm")


def test_what_no_class_holds_is_one_line(tmp_path):
    cases = [
        (dict(name="deit_tiny_distilled_patch16_224", num_classes=0), "DeiTModel reads the class token"),
        (dict(name="vit_small_patch16_224", class_token=False, global_pool="avg"), "without a class token is I-JEPA"),
    ]
    for i, (kw, message) in enumerate(cases):
        model = vitkit.create_model(kw.pop("name"), depth=1, img_size=32, patch_size=8, **kw)
        with pytest.raises(WeightsError, match=message) as e:
            vitkit.export_weights(model, tmp_path / f"hf{i}", "hf")
        assert "\n" not in str(e.value) and not (tmp_path / f"hf{i}").exists()
    T.IJepaModel(T.IJepaConfig(**SMALL, image_size=32), add_pooling_layer=True).save_pretrained(tmp_path / "pooler")
    with pytest.raises(WeightsError, match="I-JEPA pooler"):
        vitkit.from_pretrained(tmp_path / "pooler")
    config = json.loads((tmp_path / "pooler" / "config.json").read_text())
    (tmp_path / "pooler" / "config.json").write_text(json.dumps({**config, "model_type": "swin"}))
    with pytest.raises(WeightsError, match="model_type 'swin' is not one vitkit reads \\(vit, .*deit, ijepa.*beit"):
        vitkit.from_pretrained(tmp_path / "pooler")


def test_an_mae_saved_for_feature_extraction_loads_its_encoder(tmp_path, images):
    """transformers' MAE with mask_ratio 0 (its setting for features: every patch kept) cannot be vitkit's MAE
    pre-training model: one line saying so, and its encoder loads with transformers' tokens (in order under
    increasing noise)."""
    ref = randomize(T.ViTMAEForPreTraining(T.ViTMAEConfig(**SMALL, image_size=32, mask_ratio=0.0))).eval()
    ref.save_pretrained(tmp_path)
    with pytest.raises(WeightsError, match="mask_ratio must be in .*its encoder loads \\(encoder_only=True") as e:
        vitkit.from_pretrained(tmp_path)
    assert "\n" not in str(e.value)
    encoder = vitkit.from_pretrained(tmp_path, encoder_only=True)
    x = images(2, 32, 32)
    with torch.no_grad():
        tokens = ref.vit(pixel_values=x, noise=torch.arange(16.0).expand(2, -1)).last_hidden_state
        assert _close(tokens, encoder.forward_features(x))


def test_a_simmim_whose_decoder_predicts_other_blocks_than_its_patches_says_which_field(tmp_path):
    """transformers' ViTForMaskedImageModeling keeps encoder_stride 16 whatever the patch: with 8 px patches its
    decoder predicts 16 x 16 pixels a patch, which vitkit's SimMIM does not; the line names the field, the encoder
    still loads."""
    T.ViTForMaskedImageModeling(T.ViTConfig(**SMALL, image_size=32)).save_pretrained(tmp_path)
    with pytest.raises(WeightsError, match="encoder_stride 16 with 8 px patches") as e:
        vitkit.from_pretrained(tmp_path)
    assert "\n" not in str(e.value)
    assert vitkit.from_pretrained(tmp_path, encoder_only=True).config.patch_size == (8, 8)


def test_deits_masked_image_modelling_class_reads_as_its_encoder(tmp_path, images):
    """DeiTForMaskedImageModeling: the DeiT under it (distillation token kept, read as DeiTModel reads it), the
    pixel decoder and mask token left out: vitkit's SimMIM has no distillation token."""
    ref = randomize(T.DeiTForMaskedImageModeling(T.DeiTConfig(**SMALL, image_size=32, encoder_stride=8))).eval()
    ref.save_pretrained(tmp_path)
    ours = vitkit.from_pretrained(tmp_path)
    x = images(2, 32, 32)
    with torch.no_grad():
        assert _close(ref.deit(pixel_values=x).last_hidden_state, ours.forward_features(x))
    assert ours.config.distill_token and not ours.config.distill_head and ours.config.num_classes == 0
