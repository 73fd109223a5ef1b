"""DeiT: the plain ViT with ImageNet preprocessing, and the distilled models (distillation token,
second head) - counts, names and logits equal to timm's, the official .pth layout."""

import pytest
import torch

import vitkit
from conftest import max_diff, randomize
from vitkit.models import VisionTransformer, ViTConfig, count_parameters
from vitkit.models.complexity import complexity

timm = pytest.importorskip("timm")

#: timm 1.0.31, num_classes 1000 (the seeds quote 5.91M / 22.44M / 87.34M for the distilled ones).
TIMM_COUNTS = {
    "deit_tiny_patch16_224": 5_717_416,
    "deit_small_patch16_224": 22_050_664,
    "deit_base_patch16_224": 86_567_656,
    "deit_base_patch16_384": 86_859_496,
    "deit_tiny_distilled_patch16_224": 5_910_800,
    "deit_small_distilled_patch16_224": 22_436_432,
    "deit_base_distilled_patch16_224": 87_338_192,
    "deit_base_distilled_patch16_384": 87_630_032,
}


@pytest.mark.parametrize("name", sorted(TIMM_COUNTS))
def test_counts_equal_timm(name):
    with torch.device("meta"):
        ours = vitkit.create_model(name)
    assert count_parameters(ours) == TIMM_COUNTS[name]
    assert ours.config.mean == (0.485, 0.456, 0.406)


def tiny_pair(distilled=True):
    kw = dict(img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=3, num_classes=7)
    ref = timm.models.vision_transformer.VisionTransformer(mlp_ratio=4, **kw) if not distilled else \
        timm.models.deit.VisionTransformerDistilled(mlp_ratio=4, **kw)
    randomize(ref).eval()
    ours = VisionTransformer(ViTConfig(mlp_dim=192, distill_token=distilled, **kw)).eval()
    return ref, ours


def test_distilled_parity_with_timm_both_ways(images, tmp_path):
    ref, ours = tiny_pair()
    x = images(3, 32, 32)
    report = vitkit.load_weights(ours, ref.state_dict(), strict=True)
    assert not report.missing and not report.unexpected
    assert max_diff(ours(x), ref(x)) <= 1e-5
    assert set(ours.state_dict()) == set(ref.state_dict())  # dist_token, head_dist: timm's names
    # and back: vitkit's export is timm's state dict
    vitkit.export_weights(ours, tmp_path / "w.safetensors", format="timm")
    from safetensors.torch import load_file

    again = timm.models.deit.VisionTransformerDistilled(img_size=32, patch_size=8, embed_dim=48, depth=2,
                                                        num_heads=3, num_classes=7).eval()
    again.load_state_dict(load_file(tmp_path / "w.safetensors"))
    assert max_diff(again(x), ours(x)) <= 1e-5


def test_official_pth_layout_rebuilds_the_distilled_model(images, tmp_path):
    ref, _ = tiny_pair()
    path = tmp_path / "deit_distilled.pth"
    torch.save({"model": ref.state_dict()}, path)  # how the DeiT repository ships its weights
    model = vitkit.from_pretrained(path, num_heads=3).eval()
    assert model.config.distill_token and model.num_prefix_tokens == 2
    x = images(2, 32, 32)
    assert max_diff(model(x), ref(x)) <= 1e-5


def test_distilled_training_returns_both_heads_and_inference_averages(images):
    _, model = tiny_pair()
    randomize(model)
    x = images(2, 32, 32)
    model.train()
    assert torch.is_tensor(model(x))  # not asked for: one averaged output, as timm
    model.set_distilled_training(True)
    cls, dist = model(x)
    model.eval()
    assert max_diff(model(x), (cls + dist) / 2) < 1e-6  # no dropout here: same tokens
    with pytest.raises(ValueError, match="distillation token"):
        VisionTransformer(ViTConfig(img_size=32, patch_size=8, embed_dim=48, depth=1, num_heads=3,
                                    mlp_dim=96)).set_distilled_training(True)


def test_distill_token_needs_the_class_token_layout():
    with pytest.raises(ValueError, match="DeiT's layout"):
        ViTConfig(distill_token=True, global_pool="avg", class_token=False)
    with pytest.raises(ValueError, match="DeiT's layout"):
        ViTConfig(distill_token=True, representation_size=768)


def test_reset_classifier_resets_both_heads_and_costs_count_them():
    model = vitkit.create_model("deit_tiny_distilled_patch16_224", img_size=32, num_classes=5)
    randomize(model)
    model.reset_classifier(3)
    assert model.head.weight.shape == model.head_dist.weight.shape == (3, 192)
    assert model.head_dist.weight.abs().sum() == 0
    c = complexity(vitkit.models.get_model_config("deit_tiny_distilled_patch16_224"))
    plain = complexity(vitkit.models.get_model_config("deit_tiny_patch16_224"))
    assert c.tokens == plain.tokens + 1 == 198 and c.macs > plain.macs
