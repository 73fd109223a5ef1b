"""Every timm name vitkit registers builds timm's model under that name: the same parameter names and
shapes (so the same count), the class count of timm's default weights; and the later ViTs' building
blocks compute timm's function on the same random weights (fp32, 1e-5), at their own size and another."""

import pytest
import torch
from torch.overrides import TorchFunctionMode

import vitkit
from conftest import max_diff, randomize
from vitkit.models import family_of

timm = pytest.importorskip("timm")
TOL = 1e-5
TIMM_NAMES = set(timm.list_models())
#: the paper's Table 1 sizes keep the 1000-class heads of DESIGN's counts where timm's default weights
#: (ImageNet-21k or CLIP) have none
PAPER_HEADS = {"vit_base_r50_s16_224", "vit_huge_patch14_224", "vit_large_patch32_224"}


def test_every_later_name_is_timms():
    from vitkit.models import eva, vit_names

    unknown = sorted(n for n in list(vit_names.NAMES) + list(eva.NAMES) if n not in TIMM_NAMES)
    assert not unknown
    assert len(vit_names.NAMES) + len(eva.NAMES) > 180


#: where a name's preprocessing is not that of timm's default weights, on purpose: DeiT's official evaluation
#: crops 224 of 256 (timm's 0.9); CLIP-L/14's is the OpenAI tower's (timm's default is a fine-tune at 0.5)
PREPROCESSING_NOT_TIMMS = {
    **{f"deit_{s}_{d}patch16_224": {"crop_pct"} for s in ("tiny", "small", "base") for d in ("", "distilled_")},
    "vit_large_patch14_clip_224": {"mean", "std"}, "vit_large_patch14_clip_336": {"mean", "std"},
}


def test_every_name_preprocesses_as_timms_default_weights_do():
    """What a bare state dict loaded by name is fed: timm's default pretrained_cfg (mean, std, crop_pct, the
    resize filter, crop_mode: its CLIP fine-tunes at 336-448 px, EVA-02 at 448, Sapiens 2 and LingBot squash)."""
    from timm.models import get_pretrained_cfg

    from vitkit.models import get_model_config

    names = [n for n in vitkit.list_models() if n in TIMM_NAMES and get_pretrained_cfg(n) is not None]
    wrong = []
    for name in names:
        theirs, ours = get_pretrained_cfg(name), get_model_config(name)
        for field in ("mean", "std", "crop_pct", "interpolation", "crop_mode"):
            a, b = getattr(theirs, field), getattr(ours, field)
            same = a == b if isinstance(a, str) else torch.allclose(torch.tensor(a, dtype=torch.float64),
                                                                     torch.tensor(b, dtype=torch.float64))
            if not same and field not in PREPROCESSING_NOT_TIMMS.get(name, ()):
                wrong.append((name, field, a, b))
    assert not wrong, "\n".join(map(str, wrong))
    assert len(names) > 200
    assert sum(get_model_config(n).crop_mode == "squash" for n in names) >= 15


class ShapesOnly(TorchFunctionMode):
    """On the meta device, the in-place operations initialisers use give their tensor back untouched: none
    changes a shape, and torch's meta kernels for them, written in Python, took 70% of building timm's models
    (0.8 of ViT-L's 1.1 s; this test builds ~300 of them). (Every in-place operation the builds call, listed.)"""

    FILLS = {"add_", "clamp_", "copy_", "div_", "erfinv_", "fill_", "mul_", "normal_", "uniform_", "zero_"}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in self.FILLS and args and getattr(args[0], "is_meta", False):
            return args[0]
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("name", sorted(n for n in vitkit.list_models() if n in TIMM_NAMES))
def test_name_builds_timms_architecture(name):
    with torch.device("meta"), ShapesOnly():
        ours = vitkit.create_model(name)
        ref = timm.create_model(name, **({"num_classes": ours.num_classes} if name in PAPER_HEADS else {}))
    theirs = ref.state_dict()
    if family_of(ours.config).from_timm is not None:  # timm's names that are not vitkit's, read as the loader does
        theirs = family_of(ours.config).from_timm(theirs)  # (VLM towers' encoder., NaFlexViT's embeds.)
    theirs = {k: tuple(v.shape) for k, v in theirs.items()}
    mine = {k: tuple(v.shape) for k, v in ours.state_dict().items()}
    assert mine == theirs
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in ref.parameters())


#: (timm name, the size both are built at for the test: depth 2 (unless the depth is part of the
#: architecture), a few patches); each family of blocks once
CASES = {
    "clip": ("vit_base_patch16_clip_224", dict(depth=2, img_size=64)),
    "clip_quickgelu": ("vit_base_patch32_clip_quickgelu_224", dict(depth=2, img_size=96)),
    "siglip_map": ("vit_base_patch16_siglip_224", dict(depth=2, img_size=64)),
    "siglip2_tanh": ("vit_base_patch32_siglip_256", dict(depth=2, img_size=96)),
    "siglip_so400m_crop": ("vit_so400m_patch14_siglip_384", dict(depth=1, img_size=60)),
    "dinov2_reg4": ("vit_small_patch14_reg4_dinov2", dict(depth=2, img_size=70)),
    "dinov2_giant_swiglu": ("vit_giant_patch14_dinov2", dict(depth=1, img_size=42)),
    "deit3": ("deit3_small_patch16_224", dict(depth=2, img_size=64)),
    "reg_gap": ("vit_little_patch16_reg4_gap_256", dict(depth=2, img_size=64)),
    "rpn": ("vit_base_patch16_rpn_224", dict(depth=2, img_size=64)),
    "aimv2_rmsnorm": ("aimv2_large_patch14_224", dict(depth=2, img_size=56)),
    "beit3_subln": ("beit3_base_patch16_224", dict(depth=2, img_size=64)),
    "radio": ("vit_base_patch16_radio_v3", dict(depth=2, img_size=64)),
    "map_with_prefix": ("test_vit3", dict(img_size=64)),
    "eva02_packed": ("eva02_tiny_patch14_224", dict(depth=2, img_size=56)),
    "eva02_subln": ("eva02_base_patch14_224", dict(depth=2, img_size=56)),
    "eva02_clip": ("eva02_base_patch16_clip_224", dict(depth=2, img_size=64)),
    "rope_reg": ("vit_medium_patch16_rope_reg1_gap_256", dict(depth=2, img_size=64)),
    "rope_axial": ("vit_small_patch16_rope_224", dict(depth=2, img_size=64)),
    "rope_axial_ape": ("vit_small_patch16_rope_ape_224", dict(depth=2, img_size=64)),
    "rope_mixed": ("vit_small_patch16_rope_mixed_224", dict(depth=2, img_size=64)),
    "pe_core": ("vit_pe_core_tiny_patch16_384", dict(depth=2, img_size=64)),
    "pe_spatial": ("vit_pe_spatial_tiny_patch16_512", dict(depth=2, img_size=64)),
    "dinov3": ("vit_small_patch16_dinov3", dict(depth=2, img_size=64)),
    # timm's Eva attention-pools every token, the class token and registers too (the ViT's pools the patches)
    "dinov3_map": ("vit_small_patch16_dinov3", dict(depth=2, img_size=64, global_pool="map")),
    "eva02_map": ("eva02_tiny_patch14_224", dict(depth=2, img_size=56, global_pool="map")),
    # PE core asked for the mean: timm's Eva then norms after pooling (fc_norm), as for every avg pool
    "pe_core_avg": ("vit_pe_core_tiny_patch16_384", dict(depth=2, img_size=64, global_pool="avg")),
    "dinov3_plus": ("vit_small_plus_patch16_dinov3_qkvb", dict(depth=2, img_size=64)),
    # the large model's pattern (full attention, then grouped-query, then full) in 3 blocks, not 24
    "sapiens_gqa": ("vit_large_patch16_sapiens2", dict(depth=3, kv_heads=[16, 8, 16], img_size=(48, 32))),
    "beit": ("beit_base_patch16_224", dict(depth=2, img_size=64)),
    "beitv2": ("beitv2_base_patch16_224", dict(depth=2, img_size=64)),
    "relpos_mlp_cls": ("vit_relpos_medium_patch16_cls_224", dict(depth=2, img_size=64)),
    "relpos_mlp_shared": ("vit_srelpos_small_patch16_224", dict(depth=2, img_size=64)),
    "relpos_mlp_rpn": ("vit_relpos_medium_patch16_rpn_224", dict(depth=2, img_size=64)),
    "diff_attn": ("vit_dwee_patch16_reg1_gap_256", dict(depth=3, img_size=64)),
    "diff_attn_little": ("vit_dlittle_patch16_reg1_gap_256", dict(depth=2, img_size=64)),
    "parallel": ("vit_pwee_patch16_reg1_gap_256", dict(depth=2, img_size=64)),
    "parallel_diff": ("vit_dpwee_patch16_reg1_gap_256", dict(depth=3, img_size=64)),
    "mobileclip_stem": ("vit_base_mci_224", dict(depth=2, img_size=64)),
}


def _pair(name, kw):
    """timm's model and vitkit's, built alike (vitkit's ``kv_heads`` is timm's ``num_kv_heads``)."""
    theirs = {("num_kv_heads" if k == "kv_heads" else k): (tuple(v) if k == "kv_heads" else v) for k, v in kw.items()}
    ref = randomize(timm.create_model(name, **theirs))
    ours = vitkit.create_model(name, **kw).eval()
    report = vitkit.load_weights(ours, ref.state_dict())
    assert report.format == "timm" and not report.missing and not report.unexpected
    return ref, ours


def _assert_close(ref, ours, x):
    with torch.no_grad():
        a, b = ref(x), ours(x)
    assert a.std() > 1e-2, "degenerate outputs would hide mapping errors"
    assert a.shape == b.shape and max_diff(a, b) <= TOL * max(1.0, a.abs().max().item())


@pytest.mark.parametrize("case", sorted(CASES))
def test_later_vits_equal_timm(case, images):
    name, kw = CASES[case]
    ref, ours = _pair(name, kw)
    h, w = ours.config.img_size
    _assert_close(ref, ours, images(2, h, w))
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in ref.parameters())


@pytest.mark.parametrize("case", ["clip", "siglip_map", "dinov2_reg4", "eva02_subln", "rope_mixed", "pe_core",
                                  "dinov3", "beitv2", "relpos_mlp_cls", "diff_attn", "parallel_diff"])
def test_later_vits_equal_timm_at_a_non_square_size(case, images):
    """Built at another, non-square size (positions resampled, rotary angles for the new grid): still timm's."""
    name, kw = CASES[case]
    patch = vitkit.models.get_model_config(name).patch_size[0]
    kw = {**kw, "img_size": (3 * patch, 5 * patch)}
    ref, ours = _pair(name, kw)
    _assert_close(ref, ours, images(2, 3 * patch, 5 * patch))


def test_dynamic_size_models_take_other_sizes_as_timm_does(images):
    """DINOv3 is built for any input size (timm's dynamic_img_size): a 96x48 image after a 64x64 build."""
    ref, ours = _pair("vit_small_patch16_dinov3", dict(depth=2, img_size=64))
    _assert_close(ref, ours, images(2, 96, 48))


def test_rope_mixed_frequencies_train_and_dinov3_rescale_matches_timm_in_training(images):
    """RoPE-Mixed's frequencies are parameters that receive gradients; DINOv3's coordinate rescaling in
    training draws what timm draws from the same seed."""
    _, ours = _pair("vit_small_patch16_rope_mixed_224", dict(depth=2, img_size=64))
    ours.train()
    ours(images(2, 64, 64)).sum().backward()
    assert ours.rope.freqs.grad is not None and ours.rope.freqs.grad.abs().sum() > 0
    assert "rope.freqs" in ours.no_weight_decay()
    ref, ours = _pair("vit_base_patch16_sapiens2", dict(depth=2, kv_heads=[12, 12], img_size=(48, 32)))
    ref.train(), ours.train()
    x = images(2, 48, 32)
    with torch.no_grad():
        torch.manual_seed(3)
        a = ref(x)
        torch.manual_seed(3)
        b = ours(x)
        assert max_diff(a, b) <= TOL * max(1.0, a.abs().max().item())
        ours.eval()
        assert max_diff(ours(x), b) > 1e-3  # the augmentation acts in training only


def test_registers_are_prefix_tokens_that_no_output_reads(images):
    model = vitkit.create_model("vit_small_patch14_reg4_dinov2", depth=1, img_size=70, num_classes=3)
    assert model.num_prefix_tokens == 5 and model.pos_embed.shape[1] == 25  # patches only (no_embed_class)
    tokens = model.forward_features(images(1, 70, 70))
    assert tokens.shape[1] == 5 + 25
    _, inter = model.forward_intermediates(images(1, 70, 70), indices=[0], return_prefix_tokens=True)
    assert inter[0][1].shape[1] == 5  # class + 4 registers


def test_new_blocks_are_checked_in_the_config():
    from vitkit.models import EvaConfig, ViTConfig

    for bad, word in ((dict(reg_tokens=-1), "reg_tokens"), (dict(norm="batchnorm"), "norm"),
                      (dict(mlp="geglu"), "mlp"), (dict(block="sequential"), "block"), (dict(gelu="relu"), "gelu"),
                      (dict(global_pool="map", map_heads=5), "attention pool"),
                      (dict(reg_tokens=2, distill_token=True), "registers")):
        with pytest.raises(ValueError, match=word):
            ViTConfig(**bad)
    for bad, word in ((dict(rope="spiral"), "rope"), (dict(num_heads=12, embed_dim=72), "divisible by 4"),
                      (dict(kv_heads=[5] * 12, qkv_fused=False), "kv_heads"), (dict(kv_heads=[6] * 12), "qkv_fused"),
                      (dict(rope_temperature=-1.0), "rope_temperature"), (dict(rope_rescale_coords=0.5), "rescale")):
        with pytest.raises(ValueError, match=word):
            EvaConfig(**bad)


@pytest.mark.parametrize("name", ["vit_small_patch14_reg4_dinov2", "vit_base_patch16_rope_reg1_gap_256",
                                  "vit_base_patch16_224", "deit_tiny_distilled_patch16_224"])
def test_the_tensors_exempt_from_weight_decay_are_timms(name):
    """Register tokens were decayed (a (1, n, D) tensor, not 1-D) where timm's ViT and EVA exempt them."""
    ref, ours = _pair(name, dict(depth=1, img_size=28 if "patch14" in name else 32))
    present = {n for n, _ in ours.named_parameters()}
    assert ours.no_weight_decay() & present == set(ref.no_weight_decay()) & present
