"""Token models as backbones: ``features_only`` equal to timm's on the same weights (maps and
feature_info), ViTDet's pyramid, and a torchvision detector trained a step on a vitkit backbone."""

import pytest
import torch

import vitkit
from conftest import max_diff, randomize
from vitkit.models.features import FeatureModel

timm = pytest.importorskip("timm")
TOL = 1e-5

#: (registered name, timm's and vitkit's overrides where they agree, timm's own, vitkit's own)
CASES = {
    "vit_non_square": ("vit_tiny_patch16_224", dict(img_size=(64, 48), depth=3), {}, {}),
    "vit_dynamic": ("vit_tiny_patch16_224", dict(img_size=48, depth=2, dynamic_img_size=True), {}, {}),
    "deit_distilled": ("deit_tiny_distilled_patch16_224", dict(img_size=64, depth=2), {}, {}),
    "hybrid": ("vit_tiny_r_s16_p8_224", dict(img_size=64, depth=2), {}, {}),
    "cait": ("cait_xxs24_224", dict(img_size=64, depth=3), dict(depth_token_only=1), dict(cls_depth=1)),
    "convit": ("convit_tiny", dict(img_size=64, depth=3, local_up_to_layer=2), {}, {}),
    # the later ViTs: registers (prefix tokens left out of the maps), rotary positions, MAP, BEiT's tables
    "dinov2_registers": ("vit_small_patch14_reg4_dinov2", dict(img_size=56, depth=3), {}, {}),
    "siglip_map": ("vit_base_patch16_siglip_224", dict(img_size=64, depth=3), {}, {}),
    "eva02_rope": ("eva02_tiny_patch14_224", dict(img_size=56, depth=3), {}, {}),
    "dinov3_rope_registers": ("vit_small_patch16_dinov3", dict(img_size=64, depth=3), {}, {}),
    "beit_relative": ("beitv2_base_patch16_224", dict(img_size=64, depth=3), {}, {}),
    "relpos_mlp": ("vit_relpos_medium_patch16_cls_224", dict(img_size=64, depth=3), {}, {}),
}
INPUT = {"vit_dynamic": (80, 32)}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("out_indices", [(0, -1), 2])
def test_features_only_equals_timm(case, out_indices, images):
    name, both, theirs_kw, ours_kw = CASES[case]
    ref = randomize(timm.create_model(name, pretrained=False, **both, **theirs_kw)).eval()
    ref_features = timm.create_model(name, pretrained=False, features_only=True, out_indices=out_indices,
                                     **both, **theirs_kw).eval()
    ref_features.model.load_state_dict(ref.state_dict(), strict=False)  # timm prunes the head
    ours = vitkit.create_model(name, features_only=True, out_indices=out_indices, **both, **ours_kw).eval()
    vitkit.load_weights(ours, ref.state_dict())
    info, ref_info = ours.feature_info, ref_features.feature_info
    assert info.channels() == ref_info.channels() and info.reduction() == ref_info.reduction()
    assert info.module_name() == ref_info.module_name() and len(info) == 2
    h, w = INPUT.get(case, ours.config.img_size)
    x = images(2, h, w)
    with torch.no_grad():
        a, b = ref_features(x), ours(x)
        inter = ref.forward_intermediates(x, indices=out_indices, intermediates_only=True)
    assert [t.shape for t in a] == [t.shape for t in b] and b[0].shape[1] == info.channels(0)
    assert b[0].shape[-2:] == (h // info.reduction(0), w // info.reduction(0))
    # 1e-5 of the maps' scale: a hybrid's block outputs reach ~14 here, and one thread or two sum
    # its convolutions in another order (1.05e-5 absolute seen with one)
    tol = [TOL * max(1.0, p.abs().max().item()) for p in a]
    assert a[-1].std() > 1e-2 and all(max_diff(p, q) <= t for p, q, t in zip(a, b, tol))
    assert all(max_diff(p, q) <= t for p, q, t in zip(inter, b, tol))


def test_from_pretrained_gives_a_backbone(tmp_path, images):
    model = randomize(vitkit.create_model("vit_fmnist", depth=3)).eval()
    vitkit.export_weights(model, tmp_path / "m", "vitkit")
    backbone = vitkit.from_pretrained(tmp_path / "m", features_only=True, out_indices=[1])
    assert isinstance(backbone, FeatureModel) and not backbone.training
    x = images(2, 28, 28, c=1)
    with torch.no_grad():
        expected = model.forward_intermediates(x, indices=[1], intermediates_only=True)
        assert max_diff(backbone(x)[0], expected[0]) == 0
    assert backbone.feature_info.get_dicts() == [{"module": "blocks.1", "num_chs": 96, "reduction": 4, "index": 1}]


def test_pyramid_strides_and_channels(images):
    backbone = vitkit.create_model("vit_tiny_patch16_224", img_size=64, depth=2, features_only=True, pyramid=True,
                                   pyramid_channels=32)
    maps = backbone(images(1, 64, 64))
    assert backbone.feature_info.reduction() == [4, 8, 16, 32] and backbone.feature_info.channels() == [32] * 4
    assert [tuple(m.shape[-3:]) for m in maps] == [(32, 16, 16), (32, 8, 8), (32, 4, 4), (32, 2, 2)]


@pytest.mark.parametrize("kw,words", [
    (dict(out_indices=[5]), r"block indices \[5\] out of range for depth 2"),
    (dict(out_indices=3), r"indices=3: expected 1..2 last blocks$"),
    (dict(out_indices=-1), r"indices=-1: expected 1..2 last blocks \(a block counted from the end is a list: "
                           r"\(-1,\)\)"),
    # said as given (-4 was said as [-1]); empty was max()'s error; '1', 1.0 and True were read as numbers
    (dict(out_indices=(-4,)), r"block indices \[-4\] out of range for depth 2 \(0..1, or -2..-1 from the end\)"),
    (dict(out_indices=()), r"a non-empty list of block numbers .*got \(\)"),
    (dict(out_indices=("1",)), r"got \('1',\)"), (dict(out_indices=(1.0,)), r"got \(1.0,\)"),
    (dict(out_indices=True), r"got True"),
    (dict(pyramid=True, pyramid_channels=0), "pyramid_channels must be a positive integer"),
])
def test_bad_feature_options_are_one_error(kw, words):
    with pytest.raises(ValueError, match=words):
        vitkit.create_model("vit_tiny_patch16_224", img_size=32, depth=2, features_only=True, **kw)


def test_feature_options_without_features_only_and_other_families_are_refused():
    with pytest.raises(ValueError, match="apply with features_only=True"):
        vitkit.create_model("vit_tiny_patch16_224", pyramid=True)
    with pytest.raises(ValueError, match="features_only takes a token model .* not resnetv2"):
        vitkit.create_model("resnetv2_50_nopreact", features_only=True)
    with pytest.raises(ValueError, match="from_pretrained"):
        vitkit.create_model("vit_base_patch16_224", pretrained=True)


def test_a_torchvision_detector_trains_a_step_on_a_vitkit_backbone():
    """Faster R-CNN on ViTDet's pyramid of a vitkit ViT: the losses are finite and every part learns."""
    torchvision = pytest.importorskip("torchvision")
    from torchvision.models.detection import FasterRCNN
    from torchvision.models.detection.anchor_utils import AnchorGenerator
    from torchvision.ops import MultiScaleRoIAlign

    class Backbone(torch.nn.Module):
        def __init__(self, features):
            super().__init__()
            self.features, self.out_channels = features, features.feature_info.channels(0)

        def forward(self, x):
            return self.features.named_maps(x)

    torch.manual_seed(0)
    features = vitkit.create_model("vit_tiny_patch16_224", img_size=128, depth=2, features_only=True, pyramid=True,
                                   pyramid_channels=32)
    names = [str(i) for i in range(len(features.feature_info))]
    detector = FasterRCNN(Backbone(features), num_classes=3, min_size=128, max_size=128,
                          rpn_anchor_generator=AnchorGenerator(((16,), (32,), (64,), (128,)), ((0.5, 1.0, 2.0),) * 4),
                          box_roi_pool=MultiScaleRoIAlign(names, 7, 2), image_mean=[0.5] * 3, image_std=[0.5] * 3)
    detector.train()
    images = [torch.rand(3, 128, 128) for _ in range(2)]
    targets = [{"boxes": torch.tensor([[10.0, 20.0, 60.0, 90.0]]), "labels": torch.tensor([1])},
               {"boxes": torch.tensor([[30.0, 30.0, 120.0, 100.0], [5.0, 5.0, 40.0, 40.0]]),
                "labels": torch.tensor([2, 1])}]
    losses = detector(images, targets)
    total = sum(losses.values())
    assert set(losses) == {"loss_classifier", "loss_box_reg", "loss_objectness", "loss_rpn_box_reg"}
    assert torch.isfinite(total)
    total.backward()
    assert features.model.blocks[0].attn.qkv.weight.grad.abs().sum() > 0
    assert features.pyramid.project[0][0].weight.grad.abs().sum() > 0
    assert torchvision.__version__


def test_switches_that_are_not_true_or_false_are_refused(tmp_path):
    """A string is truthy: features_only="no" would build a backbone where a classifier was asked
    for, strict="false" would load strictly. Each is refused before any work, naming the keyword."""
    with pytest.raises(ValueError, match=r"^create_model: features_only='no': it must be True or False$"):
        vitkit.create_model("Ti/16", features_only="no")
    with pytest.raises(ValueError, match=r"^from_pretrained: strict='false', at_processor_size=0: each must be"):
        vitkit.from_pretrained(tmp_path / "missing", strict="false", at_processor_size=0)
    assert isinstance(vitkit.create_model("Ti/16", img_size=32, depth=1, features_only=True), FeatureModel)


@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
def test_a_timm_backbones_state_dict_loads_as_the_model_it_holds(suffix, tmp_path, images):
    """timm's features_only model saves its model under 'model.', pruned of its head, final norm and the
    blocks after its last map: it was refused as an unrecognised layout."""
    from safetensors.torch import save_file

    from vitkit.weights.load import BackboneNote

    ref = randomize(timm.create_model("vit_small_patch14_reg4_dinov2", pretrained=False, features_only=True,
                                      out_indices=(1, 3), img_size=56, depth=6)).eval()
    path = tmp_path / f"backbone{suffix}"
    tensors = {k: v.contiguous() for k, v in ref.state_dict().items()}
    save_file(tensors, path) if suffix == ".safetensors" else torch.save(tensors, path)
    with pytest.warns(BackboneNote, match="blocks 0-3, no final norm"):
        ours = vitkit.from_pretrained(path, features_only=True, out_indices=(1, 3))
    assert ours.config.depth == 4 and ours.config.reg_tokens == 4
    x = images(2, 56, 56)
    with torch.no_grad():
        assert all(max_diff(a, b) <= TOL for a, b in zip(ref(x), ours(x)))
    # vitkit's own backbone's state dict (its model under 'model.' too) loads back into a backbone
    again = vitkit.create_model("vit_small_patch14_reg4_dinov2", features_only=True, out_indices=(1, 3), img_size=56,
                                depth=4, final_norm=False, num_classes=0)
    with pytest.warns(BackboneNote):
        vitkit.load_weights(again, ours.state_dict())
    with torch.no_grad():
        assert all(max_diff(a, b) == 0 for a, b in zip(ours(x), again(x)))
    with pytest.raises(vitkit.WeightsError, match="unrecognised weight layout"):  # 'model.' over no ViT: refused
        vitkit.load_weights(again, {"model.foo.weight": torch.zeros(2)})
